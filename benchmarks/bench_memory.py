"""Memory benchmark: a large policy built on the meta device, trained and saved on 1, 2 and 4 gloo ranks.

act_state at a large configuration (16 encoder + 16 decoder blocks of width 1024, feed-forward 4096:
~470 M parameters, each block an FSDP unit), fp32 AdamW, one step and one `--checkpoint_format=safetensors`
save (gathered tensor by tensor under FSDP2), on each layout (N ranks of FSDP2, or RxS: HSDP with R
replicas of S shards), then the same run started from that checkpoint with
`--policy.path` (weights streamed into the shards). memory_worker.py records each rank's VmHWM at the
end of the build (and load), of the first step, and of the run (after the save).

The ideal per rank is 16 bytes per parameter (fp32 weights, gradients, Adam's two moments) / N plus a
tiny run's peak on the same number of ranks (the interpreter, torch, gloo, the dataset); the sum over
ranks adds the ranks' peaks (an upper bound of the peak of their sum). Under HSDP the state is
sharded over S ranks only, so its ideal divides by S. Goals (issue 32): per-rank peak
<= 1.15x the ideal, the sum never N full copies, time to the first step not growing with N.

`--policy smolvla` measures LeRobot's SmolVLA at its default size instead (SmolVLM2-500M's published
sizes, random weights: 100 M parameters trained, 350 M frozen) on the embedded camera task with its
instruction, on 4 ranks; its ideal counts 4 bytes per frozen parameter (weights only) and its baseline
is a tiny SmolVLA's run (transformers is part of the runtime).

`--policy pi0|pi05` measures LeRobot's pi0 / pi0.5 at its default size (gemma_2b + gemma_300m, SigLIP
at 224 x 224; random weights, the tiny fixture's tokenizer) on the embedded camera task, on 4 ranks, one
`--mode`: `expert-bf16` (--policy.train_expert_only=true, --policy.dtype=bfloat16 as LeRobot keeps it),
`expert-fp32`, `lora` (LeRobot's targets over a bfloat16 base) or `full` (everything trains; `--depth N`
cuts both Gemmas to N layer pairs, `--vision-depth N` SigLIP to N layers, the widths and the vocabulary
LeRobot's: a full fine-tune at 1 pair and 1 SigLIP layer holds 684 M float32 parameters, 10.9 GB of
state on one rank). Each tensor counts in its own dtype: the ideal is the weights'
bytes plus 3x each trained parameter's (its gradient and Adam's two moments), over the shard degree,
plus the same command's peak at the fixtures' tiny sizes. Each mode but LoRA (whose checkpoint is an
adapter) then runs again from its own checkpoint (`--policy.path`), the fine-tune a user starts from
`lerobot/pi05_base`. At the default size the expert-only float32
run needs about 5.3 GB per rank on 4 ranks (21 GB in all): run it where that fits (`BENCH_THREADS=4`
gives each rank 4 torch threads on a machine with cores to spare).

`--policy fastwam` measures LeRobot's FastWAM at its widths (video expert hidden 3072, FFN 14336; action
expert 1024 / 4096; 24 heads of 128; text width 4096) cut to `--depth N` MoT layers (default 1), at its
frame window (33 frames every 4), image size (224 x 448) and 32-step chunk, on the embedded camera task
with its instruction, one `--mode`: `freeze-bf16` (--policy.freeze_video_expert=true with
loss.lambda_video=0, bfloat16: the action expert and the proprio encoder train), `freeze-bf16-recompute`
(the same with --policy.use_gradient_checkpointing=true: the frozen video stream's activations, which
the proprio token's gradient crosses, are recomputed instead of kept) or `full` (everything trains,
float32). The frozen VAE is the tiny fixture's (its latents have LeRobot's 48 channels and 16x
reduction), the UMT5 encoder a one-layer random one of LeRobot's width 4096, released before step 1;
the ideal counts each tensor in its own dtype as for pi, plus the same command at the fixture's tiny
sizes. The run is not restarted from its checkpoint (`--policy.path` streams as pi's does).

Usage: python benchmarks/bench_memory.py [--policy act_state|smolvla|pi0|pi05|fastwam] [--layouts 1,2,4,2x2]
       [--blocks 16] [--dim 1024] [--ffn 4096] [--mode expert-bf16|expert-fp32|lora|full] [--depth N]
       [--vision-depth N] [--workdir DIR]   (fastwam: [--mode freeze-bf16|freeze-bf16-recompute|full] [--depth N])
Each large configuration runs once, one at a time (at 470 M parameters a rank of the 1-process run
peaks near 8 GB; check `free -g` first).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench_engine import torchrun

from trainer.config.policy import PolicyConfig

HERE = Path(__file__).parent
sys.path.insert(
    0, str(HERE.parent / "tests")
)  # the suite's SmolVLM2-500M backbone, shared rather than copied
WORKER = HERE / "memory_worker.py"
GB = 1e9
PHASES = ("built", "first_step", "end")


def run(nproc: int, out: Path, flags: list[str]) -> list[dict[str, float]]:
    """One `trainer train` on `nproc` gloo ranks; each rank's record."""
    out.mkdir(parents=True, exist_ok=True)
    torchrun(WORKER, str(out), *flags, nproc=nproc)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def layout_flags(layout: str) -> tuple[int, int, list[str]]:
    """`N` (FSDP2 over N ranks; 1: a single process) or `RxS` (HSDP): the process count, the degree
    the state is sharded over, and the flags."""
    replicas, _, shards = layout.rpartition("x")
    replicate, shard = int(replicas or 1), int(shards)
    flags = [f"--parallelism.dp_shard={shard}"] if shard > 1 else []
    flags += [f"--parallelism.dp_replicate={replicate}"] if replicate > 1 else []
    return replicate * shard, shard, flags


def train_flags(output_dir: Path, cache: Path, layout: str, policy: list[str]) -> list[str]:
    shard = layout_flags(layout)[2]
    return [
        f"--output_dir={output_dir}",
        f"--dataset.cache_dir={cache}",
        "--dataset.episodes=4",
        "--dataset.eval_episodes=0",
        "--steps=1",
        "--save_freq=1",
        "--log_freq=1",
        "--checkpoint_format=safetensors",
        *shard,
        *policy,
    ]


@dataclass
class Subject:
    """A policy measured: the run's flags (batch, data), the policy's at the large size and at a tiny one
    (the baseline: the runtime the policy brings, from the interpreter to its libraries), its trainable
    and frozen parameters, and the bytes of its stored weights and of its trained parameters'
    gradients and Adam moments (in their own dtypes: 12 B per float32 parameter, 6 B per bfloat16 one)."""

    title: str
    run: list[str]
    large: list[str]
    tiny: list[str]
    trainable: int
    frozen: int
    weight_bytes: int
    trained_bytes: int
    reload: bool = True
    """Also run from the fresh run's checkpoint (`--policy.path`)."""

    def ideal(self, shards: int, baseline: float) -> float:
        """The weights, and the trained parameters' gradients and Adam moments, over the shard degree
        (fp32 AdamW: 16 B per trained parameter, 4 B per frozen one)."""
        return (self.weight_bytes + self.trained_bytes) / shards + baseline

    def ideal_terms(self, shards: int, baseline: float) -> str:
        return (
            f"({self.weight_bytes / GB:.2f} weights + {self.trained_bytes / GB:.2f} grads and moments) / "
            f"{shards} + {baseline / GB:.2f}"
        )


def measured(policy: PolicyConfig) -> tuple[int, int, int, int]:
    """Trainable and frozen parameters, the weights' bytes and the trained parameters' gradient and
    Adam moment bytes, from a meta build (no memory)."""
    import torch

    from trainer.policies import build_policy

    with torch.device("meta"):
        params = list(build_policy(policy, 3, 1).parameters())
    trainable = [p for p in params if p.requires_grad]
    count = sum(p.numel() for p in trainable)
    weights = sum(p.numel() * p.element_size() for p in params)
    trained = sum(3 * p.numel() * p.element_size() for p in trainable)
    return count, sum(p.numel() for p in params) - count, weights, trained


def act_state(blocks: int, dim: int, ffn: int) -> Subject:
    from trainer.policies.act.state import ACTStateConfig

    base = ["--policy.type=act_state", "--policy.dropout=0"]
    large = [f"--policy.dim={dim}", "--policy.heads=16", f"--policy.ffn_dim={ffn}"]
    large += [f"--policy.encoder_layers={blocks}", f"--policy.decoder_layers={blocks}"]
    config = ACTStateConfig(dim=dim, heads=16, ffn_dim=ffn, encoder_layers=blocks, decoder_layers=blocks)
    title = f"act_state {blocks}+{blocks} blocks of width {dim}"
    return Subject(title, ["--batch_size=8"], [*base, *large], base, *measured(config))


def smolvla(work: Path) -> Subject:
    """LeRobot's defaults on SmolVLM2-500M's sizes (random weights), on the embedded camera task."""
    from helpers.smolvlm_sizes import TINY_BACKBONE, write_smolvlm2_500m
    from trainer.policies.smolvla import SmolVLAConfig

    backbone = write_smolvlm2_500m(work / "smolvlm2_500m")
    tiny = ["--policy.type=smolvla", f"--policy.vlm_model_name={TINY_BACKBONE}", "--policy.num_vlm_layers=4"]
    tiny += ["--policy.resize_imgs_with_padding=[32,32]"]  # the tiny tower's image size (patch 4)
    features = ["observation.state", "observation.images.top", "task"]
    config = SmolVLAConfig(vlm_model_name=str(backbone), input_features=features)
    large = ["--policy.type=smolvla", f"--policy.vlm_model_name={backbone}"]
    title = "SmolVLA, LeRobot's defaults on SmolVLM2-500M"
    return Subject(title, ["--dataset.camera=true", "--batch_size=2"], large, tiny, *measured(config))


# What a pi run fine-tunes: LeRobot's expert-only in bfloat16 (LeRobot's storage) or float32, LoRA on
# LeRobot's targets over a bfloat16 base, or everything (a reduced depth: --depth).
PI_MODES = {
    "expert-bf16": ["--policy.train_expert_only=true", "--policy.dtype=bfloat16"],
    "expert-fp32": ["--policy.train_expert_only=true"],
    "lora": ["--policy.dtype=bfloat16", "--peft.method_type=LORA", "--peft.r=16"],
    "full": [],
}


def pi(work: Path, kind: str, mode: str, depth: int | None, vision_depth: int | None) -> Subject:
    """LeRobot's pi0 / pi0.5 at its default size (gemma_2b + gemma_300m, SigLIP at 224 x 224; random
    weights), or both Gemmas cut to `depth` layer pairs and SigLIP to `vision_depth` layers (LeRobot's
    widths and vocabulary kept), on the embedded camera task with its
    instruction. The tokenizer is LeRobot's tiny fixture's (no download; its ids fit PaliGemma's
    vocabulary); the baseline is the same run at the fixture's tiny sizes."""
    from trainer.policies.pi import PI0Config, PI05Config

    fixture = HERE.parent / "tests" / "fixtures" / "lerobot_pi05_tiny" / "tiny_paligemma"
    base = [f"--policy.type={kind}", f"--policy.tokenizer_name={fixture}", *PI_MODES[mode]]
    tiny = [
        *base,
        f"--policy.size_overrides={fixture / 'tiny_pi_overrides.json'}",
        "--policy.image_resolution=[32,32]",
    ]
    large, sizes = list(base), {}
    cuts: dict[str, object] = {}
    if depth is not None:
        cuts["gemma_variants"] = _with_sizes({name: {"depth": depth} for name in ("gemma_2b", "gemma_300m")})
    if vision_depth is not None:
        cuts["vision"] = {"num_hidden_layers": vision_depth}  # SigLIP's other sizes stay LeRobot's
    if cuts:
        overrides = work / f"depth{depth}_vision{vision_depth}.json"
        overrides.write_text(json.dumps(cuts))
        large.append(f"--policy.size_overrides={overrides}")
        sizes = {"size_overrides": str(overrides)}
    config_class = PI05Config if kind == "pi05" else PI0Config
    fields = {
        "train_expert_only": "expert" in mode,
        "dtype": "float32" if mode in ("expert-fp32", "full") else "bfloat16",
        "tokenizer_name": str(fixture),
    }
    config = config_class(
        input_features=["observation.state", "observation.images.top", "task"], **fields, **sizes
    )
    trainable, frozen, weights, trained = measured(config)
    if mode == "lora":  # the adapters (float32, rank 16) train; their count from a meta build of the wrapper
        trainable, frozen, trained = _lora(config, frozen + trainable)
        weights += trained // 3
    depth_note = f", {depth} layer pairs" if depth is not None else ""
    depth_note += f", {vision_depth} SigLIP layers" if vision_depth is not None else ""
    title = f"{kind}, LeRobot's default size{depth_note}, {mode}"
    run = ["--dataset.camera=true", "--batch_size=2"]
    return Subject(title, run, large, tiny, trainable, frozen, weights, trained, reload=mode != "lora")


# What a FastWAM run fine-tunes: the action expert alone in bfloat16 (LeRobot's storage), the same with
# every MoT layer recomputed in the backward pass, or everything.
FASTWAM_FROZEN_VIDEO = [
    "--policy.freeze_video_expert=true",
    '--policy.loss={"lambda_video": 0.0, "lambda_action": 1.0}',
    "--policy.torch_dtype=bfloat16",
]
FASTWAM_MODES = {
    "freeze-bf16": FASTWAM_FROZEN_VIDEO,
    "freeze-bf16-recompute": [*FASTWAM_FROZEN_VIDEO, "--policy.use_gradient_checkpointing=true"],
    "full": ["--policy.torch_dtype=float32"],
}


def fastwam(work: Path, mode: str, depth: int) -> Subject:
    """LeRobot's FastWAM at its widths, `depth` MoT layers, on the embedded camera task with its
    instruction; the baseline is the same run at the fixture's tiny sizes (tests/test_fastwam_train.py)."""
    from trainer.policies.fastwam import FastWAMConfig

    fixture = HERE.parent / "tests" / "fixtures" / "lerobot_fastwam_tiny" / "tiny_wan"
    wide = _wide_text_encoder(fixture, work / "wide_wan")
    base = [
        "--policy.type=fastwam", "--policy.base_model_id=null", f"--policy.tokenizer_model_id={fixture / 'tokenizer'}",
        "--policy.tokenizer_max_len=32", *FASTWAM_MODES[mode],
    ]  # fmt: skip
    tiny = [
        *base, f"--policy.text_encoder_model_id={fixture}", "--policy.num_video_frames=9",
        "--policy.action_video_freq_ratio=2", "--policy.action_horizon=8", "--policy.n_action_steps=8",
        "--policy.image_size=[64,96]",
        '--policy.video_dit_config={"hidden_dim": 32, "ffn_dim": 64, "freq_dim": 16, "text_dim": 16, "num_heads": 2, "attn_head_dim": 16, "num_layers": 2}',
        '--policy.action_dit_config={"hidden_dim": 24, "ffn_dim": 48, "num_heads": 2, "attn_head_dim": 16, "num_layers": 2, "text_dim": 16, "freq_dim": 16}',
    ]  # fmt: skip
    layers = {"num_layers": depth}
    large = [
        *base, f"--policy.text_encoder_model_id={wide}",
        f"--policy.video_dit_config={json.dumps(layers)}", f"--policy.action_dit_config={json.dumps(layers)}",
    ]  # fmt: skip
    config = FastWAMConfig(
        base_model_id=None,
        tokenizer_model_id=str(fixture / "tokenizer"),
        text_encoder_model_id=str(wide),
        freeze_video_expert=mode != "full",
        torch_dtype="float32" if mode == "full" else "bfloat16",
        video_dit_config=layers,
        action_dit_config=layers,
        input_features=["observation.state", "observation.images.top", "task"],
    )
    title = f"fastwam, LeRobot's widths, {depth} MoT layer(s), {mode}"
    run = ["--dataset.camera=true", "--batch_size=2"]
    return Subject(title, run, large, tiny, *measured(config), reload=False)


def _wide_text_encoder(fixture: Path, out: Path) -> Path:
    """The tiny fixture's Wan directory with a one-layer random UMT5 encoder of LeRobot's width (4096),
    so the experts' text embeddings keep theirs; the tokenizer and the VAE are the fixture's."""
    import torch
    import transformers

    if not (out / "text_encoder" / "config.json").is_file():
        shutil.copytree(fixture / "vae", out / "vae", dirs_exist_ok=True)
        tiny = json.loads((fixture / "text_encoder" / "config.json").read_text())
        config = transformers.UMT5Config(
            **{**tiny, "d_model": 4096, "num_layers": 1, "num_decoder_layers": 1}
        )
        torch.manual_seed(0)
        transformers.UMT5EncoderModel(config).save_pretrained(out / "text_encoder")
    return out


def _with_sizes(variants: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """LeRobot's two variants with some sizes replaced (an overrides file names every size)."""
    from dataclasses import asdict

    from trainer.policies.pi.config import GEMMA_VARIANTS

    return {name: {**asdict(GEMMA_VARIANTS[name]), **changed} for name, changed in variants.items()}


def _lora(config: PolicyConfig, base_params: int) -> tuple[int, int, int]:
    """(trainable, frozen, trained bytes) of the policy under LoRA rank 16 on its default targets."""
    import torch
    from peft import LoraConfig, get_peft_model

    from trainer.policies import build_policy

    with torch.device("meta"):
        policy = build_policy(config, 3, 1)
        model = get_peft_model(policy, LoraConfig(r=16, target_modules=list(policy.peft_target_modules())))
    adapters = [p for p in model.parameters() if p.requires_grad]
    count = sum(p.numel() for p in adapters)
    return count, base_params, sum(3 * 4 * p.numel() for p in adapters)


def row(layout: str, start: str, records: list[dict[str, float]], subject: Subject, baseline: float) -> str:
    """One table row: the largest rank's peak per phase, its ratio to the ideal, the ranks' sum and its
    ratio to N ideals."""
    nproc, shards, _ = layout_flags(layout)
    ideal = subject.ideal(shards, baseline)
    built, first, end = (max(r[phase] for r in records) / GB for phase in PHASES)
    total = sum(r["end"] for r in records) / GB
    first_step_s = max(r["first_step_s"] for r in records)
    return (
        f"| {layout} | {start} | {built:.2f} / {first:.2f} / {end:.2f} | {ideal / GB:.2f} "
        f"{subject.ideal_terms(shards, baseline)} | {end * GB / ideal:.2f}x "
        f"| {total:.2f} | {total * GB / (nproc * ideal):.2f}x | {first_step_s:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--layouts", default=None, help="N: FSDP2 over N ranks; RxS: HSDP (default 1,2,4,2x2; smolvla: 4)"
    )
    parser.add_argument(
        "--policy", choices=("act_state", "smolvla", "pi0", "pi05", "fastwam"), default="act_state"
    )
    parser.add_argument(
        "--mode",
        choices=(*PI_MODES, *FASTWAM_MODES),
        default=None,
        help="pi0 / pi05: what trains (default expert-bf16); fastwam: freeze-bf16 (default), freeze-bf16-recompute or full",
    )
    parser.add_argument(
        "--depth",
        type=int,
        default=None,
        help="pi0 / pi05: layer pairs (default: LeRobot's 18); fastwam: MoT layers (default 1)",
    )
    parser.add_argument(
        "--vision-depth", type=int, default=None, help="pi0 / pi05: SigLIP layers (default: LeRobot's 27)"
    )
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--ffn", type=int, default=4096)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "cache"
    modes = PI_MODES if args.policy in ("pi0", "pi05") else FASTWAM_MODES if args.policy == "fastwam" else {}
    if modes and args.mode is not None and args.mode not in modes:
        parser.error(f"--mode {args.mode} is not a {args.policy} mode: choose one of {', '.join(modes)}")
    if args.policy in ("pi0", "pi05"):
        subject = pi(work, args.policy, args.mode or "expert-bf16", args.depth, args.vision_depth)
    elif args.policy == "fastwam":
        subject = fastwam(work, args.mode or "freeze-bf16", args.depth or 1)
    else:
        subject = smolvla(work) if args.policy == "smolvla" else act_state(args.blocks, args.dim, args.ffn)
    frozen = f" + {subject.frozen / 1e6:.0f} M frozen" if subject.frozen else ""
    print(f"{subject.title}: {subject.trainable / 1e6:.0f} M parameters trained{frozen}")
    print(
        "\n| layout | start | per-rank peak: built / first step / after save (GB) | ideal per rank (GB) "
        "| ratio | sum over ranks (GB) | sum / summed ideal | time to first step (s) |"
    )
    print("|---|---|---|---|---|---|---|---|", flush=True)
    layouts = args.layouts or {"act_state": "1,2,4,2x2", "fastwam": "1,2,4"}.get(args.policy, "4")
    for layout in layouts.split(","):
        nproc = layout_flags(layout)[0]
        tiny_dir = work / f"tiny{layout}"
        tiny = run(
            nproc, tiny_dir / "rec", train_flags(tiny_dir, cache, layout, [*subject.run, *subject.tiny])
        )
        baseline = max(r["end"] for r in tiny)
        fresh_dir, loaded_dir = work / f"large{layout}", work / f"loaded{layout}"
        fresh = run(
            nproc, fresh_dir / "rec", train_flags(fresh_dir, cache, layout, [*subject.run, *subject.large])
        )
        print(row(layout, "fresh", fresh, subject, baseline), flush=True)
        if subject.reload:
            step = fresh_dir / "checkpoints" / "000001"
            from_step = [*subject.run, f"--policy.path={step}"]
            loaded = run(nproc, loaded_dir / "rec", train_flags(loaded_dir, cache, layout, from_step))
            print(row(layout, "--policy.path", loaded, subject, baseline), flush=True)
            shutil.rmtree(loaded_dir / "checkpoints")
        shutil.rmtree(fresh_dir / "checkpoints")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
