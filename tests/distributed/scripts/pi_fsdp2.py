"""pi0 / pi0.5 sharded on gloo ranks, all in one torchrun launch.

usage: pi_fsdp2.py OUT WORKDIR [hsdp]

WORKDIR holds LeRobot's fixtures `lerobot_pi0_tiny/`, `lerobot_pi05_tiny/` (each naming its tokenizer by
the relative path `tiny_paligemma`, so a run's working directory is the fixture's folder) and the
dataset `dataset_video/`.

The trainer's runs (2 ranks): `fsdp2` fine-tunes LeRobot's pi0.5 checkpoint (`--policy.path`, the
fixture's sizes through --policy.size_overrides) for two steps under FSDP2 with the policy's units,
`ddp` the same under DDP, `lora` fine-tunes it with LoRA on LeRobot's default targets under FSDP2,
`fsdp2_bf16` as `fsdp2` with every unit computing in bfloat16 (an FSDP2 mixed precision policy).
`fsdp2` saves safetensors and DCP, its sharded tensors sent to the main rank in 1 KiB pieces. Right
after each build (`engine.build.after_prepare`) rank 0 writes OUT/<run>_build.json: whether the policy
was built on the meta device, and whether it (a PEFT run's base) then held exactly the checkpoint's
weights. During each sharded run a forward pre-hook counts the calls of every FSDP unit and a forward hook
notes the units whose outputs need a gradient (FSDP2 gathers those again in the backward pass); rank 0
writes OUT/<run>_units.json: the units' classes, the names of those whose forward never ran, and the parameters
(digits as N) that the units gathered in the backward pass hold as their own. With `hsdp` (4 ranks):
`hsdp` (2 replicas x 2 shards) and `ddp4` instead.

Then (2 ranks), for each fixture, torch's `fully_shard` on the policy's own units directly: the loss and
its gradients unsharded, then sharded on the same batch, noise and time, and a chunk sampled sharded,
then the token embedding looked up on each rank's own tokens; rank 0 writes OUT/<fixture>.json: both
losses, the largest gradient difference, the sharded actions' largest difference from LeRobot's, how
many parameters got a gradient, how often the embedding's forward ran, its rows on rank 0, whether every
rank's embeddings equal the unsharded table's and its gradient's largest difference from FSDP2's
average of the unsharded ones. Last, OUT/accumulated.json: that gradient after two micro-batches, the
sync off for the first, under a bfloat16 / float32 mixed precision policy.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import clean_exit
import torch
import torch.distributed as dist
from fresh_accelerator import reset_accelerate
from safetensors.torch import load_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor

import trainer
from ckpt_tools.state import gathered_write
from trainer.cli.parse import parse_config
from trainer.engine import build as model_build
from trainer.engine import startup
from trainer.engine.peft_policy import base_weight_names
from trainer.engine.plan import train
from trainer.policies.common import vocab_parallel
from trainer.policies.pi import PiPolicy
from trainer.policies.pi.weights import from_lerobot

OUT, WORKDIR, *MODE = sys.argv[1:]
gathered_write.PIECE_BYTES = 1024  # each rank's rows of the token embedding (31 KB) written in pieces
OVERRIDES = "tiny_paligemma/tiny_pi_overrides.json"
TINY = [
    f"--policy.size_overrides={OVERRIDES}", "--dataset.root=../dataset_video", "--batch_size=2",
    "--num_workers=0", "--log_freq=1", "--seed=3", "--steps=2", "--save_freq=2",
]  # fmt: skip
RUNS = {
    "fsdp2": ["--policy.path=pretrained_model", "--parallelism.dp_shard=2", "--checkpoint_format=safetensors_dcp"],
    "ddp": ["--policy.path=pretrained_model", "--parallelism.dp_shard=1"],
    "lora": ["--policy.path=pretrained_model", "--peft.method_type=LORA", "--peft.r=2", "--parallelism.dp_shard=2"],
    "fsdp2_bf16": ["--policy.path=pretrained_model", "--parallelism.dp_shard=2",
                   "--accelerator.fsdp.mixed_precision_policy.param_dtype=bfloat16"],
}  # fmt: skip
HSDP_RUNS = {
    "hsdp": ["--policy.path=pretrained_model", "--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"],
    "ddp4": ["--policy.path=pretrained_model", "--parallelism.dp_shard=1"],
}  # fmt: skip


class UnitCalls:
    """The prepared model of a run (caught from `startup.prepare`), how often each FSDP unit's forward
    ran (a global forward pre-hook) and which units gave an output that needs a gradient (a global
    forward hook): FSDP2 registers its pre-backward gather on exactly those outputs."""

    def __init__(self) -> None:
        self.model: torch.nn.Module | None = None
        self.calls: dict[int, int] = {}
        self.in_backward: set[int] = set()
        prepare = startup.prepare

        def catching(*args: Any, **kwargs: Any) -> Any:
            out = prepare(*args, **kwargs)
            self.model = out[0]
            return out

        startup.prepare = catching
        torch.nn.modules.module.register_module_forward_pre_hook(self._count)
        torch.nn.modules.module.register_module_forward_hook(self._needs_gradient)

    def _count(self, module: torch.nn.Module, _: Any) -> None:
        if isinstance(module, FSDPModule):
            self.calls[id(module)] = self.calls.get(id(module), 0) + 1

    def _needs_gradient(self, module: torch.nn.Module, _: Any, output: Any) -> None:
        if isinstance(module, FSDPModule) and any(t.requires_grad for t in _tensors(output)):
            self.in_backward.add(id(module))

    def _gathered_in_backward(self) -> list[str]:
        """The parameters each unit gathered in the backward pass manages (not its nested units'), digits as N."""
        assert self.model is not None
        names: set[str] = set()
        for prefix, unit in self.model.named_modules():
            if id(unit) not in self.in_backward:
                continue
            nested = {
                id(p)
                for m in unit.modules()
                if m is not unit and isinstance(m, FSDPModule)
                for p in m.parameters()
            }
            own = [f"{prefix}.{name}" for name, p in unit.named_parameters() if id(p) not in nested]
            names.update(re.sub(r"\.\d+\.", ".N.", name) for name in own)
        return sorted(names)

    def report(self) -> dict[str, Any]:
        assert self.model is not None
        units = [m for m in self.model.modules() if isinstance(m, FSDPModule)]
        classes = sorted({type(m).__name__.removeprefix("FSDP") for m in units})
        idle = sorted(
            name.split("paligemma_with_expert.")[-1]
            for name, m in self.model.named_modules()
            if isinstance(m, FSDPModule) and not self.calls.get(id(m))
        )
        return {
            "units": len(units),
            "classes": classes,
            "never_ran": idle,
            "backward": self._gathered_in_backward(),
        }


class BuildWatch:
    """How each run built its policy (caught from `engine.build.after_prepare`): on the meta device or
    eagerly, and whether it then held exactly the LeRobot checkpoint's weights (renamed as ours)."""

    def __init__(self) -> None:
        self.record: dict[str, Any] = {}
        after_prepare = model_build.after_prepare

        def watching(built: model_build.BuiltPolicy, *args: Any) -> None:
            after_prepare(built, *args)
            held = {name: _full(value) for name, value in built.policy.state_dict().items()}  # collective
            if built.policy is not built.base:  # a PEFT wrapper: its base's tensors under the base's names
                held = {base: held[name] for name, base in base_weight_names(built.policy).items()}
            lerobots = from_lerobot(load_file("pretrained_model/model.safetensors"), pi05=True)
            self.record = {
                "on_meta": built.on_meta,
                "holds_lerobots": held.keys() == lerobots.keys()
                and all(torch.equal(held[k], lerobots[k]) for k in held),
            }

        model_build.after_prepare = watching


def _tensors(output: Any) -> list[torch.Tensor]:
    """The tensors in a forward's output (a tensor, or tuples of them and None)."""
    if isinstance(output, torch.Tensor):
        return [output]
    return [t for part in output for t in _tensors(part)] if isinstance(output, tuple) else []


def _full(value: torch.Tensor) -> torch.Tensor:
    return value.full_tensor() if isinstance(value, DTensor) else value


def _engine_runs(runs: dict[str, list[str]]) -> None:
    os.chdir(Path(WORKDIR) / "lerobot_pi05_tiny")
    watch, builds = UnitCalls(), BuildWatch()
    for run, flags in runs.items():
        reset_accelerate()
        watch.model, watch.calls, watch.in_backward = None, {}, set()
        print(f"=== run {run}", flush=True)
        train(parse_config([*TINY, *flags, f"--output_dir={OUT}/{run}"]))
        if dist.get_rank() == 0 and run not in ("ddp", "ddp4"):
            Path(OUT, f"{run}_units.json").write_text(json.dumps(watch.report()))
        if dist.get_rank() == 0:
            Path(OUT, f"{run}_build.json").write_text(json.dumps(builds.record))
    reset_accelerate()


def _rank_tokens(rank: int, table: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s token ids (a count of its own, the padding id 0 and both ends of the vocabulary
    among them) and the weights of its loss on their embeddings."""
    (vocab, width), generator = table, torch.Generator().manual_seed(100 + rank)
    tokens = torch.randint(0, vocab, (rank + 1, 9 + 4 * rank), generator=generator)
    tokens[0, :3] = torch.tensor([0, vocab - 1, vocab // 2])
    return tokens, torch.randn(*tokens.shape, width, generator=generator)


def _plain_lookups(embed: torch.nn.Module, ranks: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each rank's embeddings by the unsharded table, and the gradient FSDP2 gives the table for the
    ranks' losses together (their average)."""
    outs, grads = [], []
    for rank in range(ranks):
        tokens, weights = _rank_tokens(rank, embed.weight.shape)
        out = embed(tokens)
        (out * weights).sum().backward()
        outs.append(out.detach())
        grads.append(embed.weight.grad)
        embed.weight.grad = None
    return outs, torch.stack(grads).mean(0)


def _vocab_parallel(embed: torch.nn.Module, language: Any, plain: list[torch.Tensor],
                    plain_grad: torch.Tensor) -> dict[str, Any]:  # fmt: skip
    """The sharded table looked up on each rank's own tokens (counts differ between ranks) against the
    unsharded lookups, and its gradient against FSDP2's average of the unsharded ones."""
    rank = dist.get_rank()
    tokens, weights = _rank_tokens(rank, embed.weight.shape)
    out = language(tokens)
    (out * weights).sum().backward()
    grad = embed.weight.grad.full_tensor()
    equal = torch.tensor([float(torch.equal(out, plain[rank]))])
    dist.all_reduce(equal, op=dist.ReduceOp.MIN)
    return {
        "embeddings_equal": bool(equal.item()),
        "table_shard_rows": embed.weight.to_local().shape[0],
        "max_table_grad_diff": (grad - plain_grad).abs().max().item(),
    }


class _Table(torch.nn.Module):
    """A root unit around a row-sharded table (FSDP2's backward callbacks belong to the root)."""

    def __init__(self, embed: torch.nn.Embedding) -> None:
        super().__init__()
        self.embed = embed

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return vocab_parallel.lookup(self.embed, tokens)


def _accumulated_without_sync(mesh: object) -> dict[str, Any]:
    """Two micro-batches, FSDP2's gradient sync off for the first (accelerate's no_sync), under a mixed
    precision policy computing in bfloat16 and reducing in float32 (where FSDP2 would look for the
    gathered gradient of a unit it never gathered): the table's gradient is the unsharded average."""
    torch.manual_seed(0)
    embed = torch.nn.Embedding(483, 32, padding_idx=0)
    expected = sum(_plain_lookups(embed, dist.get_world_size())[1] for _ in range(2))
    model = _Table(embed)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    fully_shard(embed, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    tokens, weights = _rank_tokens(dist.get_rank(), embed.weight.shape)
    for sync in (False, True):
        model.set_requires_gradient_sync(sync)
        (model(tokens).float() * weights).sum().backward()
    grad = embed.weight.grad.full_tensor()
    return {"dtype": str(grad.dtype), "max_diff": (grad - expected).abs().max().item()}


def _fully_shard(folder: Path, mesh: object) -> dict[str, float]:
    os.chdir(folder)
    policy = trainer.load_policy("pretrained_model", size_overrides=OVERRIDES).policy
    backbone = policy.model.paligemma_with_expert
    embed = backbone.get_submodule("paligemma.model.language_model.embed_tokens")
    plain_embeddings, plain_table_grad = _plain_lookups(embed, dist.get_world_size())
    reference = load_file("reference_padded_task.safetensors")
    batch = {k.removeprefix("pre."): v for k, v in reference.items() if k.startswith("pre.")}
    observation = {k: v for k, v in batch.items() if k not in ("action", "action_is_pad")}
    noise, time = reference["loss.noise"], reference["loss.time"]
    plain, _ = policy.forward(batch, noise=noise, time=time)
    plain.backward()
    grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
    policy.zero_grad(set_to_none=True)
    for module in reversed(list(policy.modules())):  # the innermost units first, as accelerate shards them
        if type(module).__name__ in PiPolicy._fsdp_wrap_modules:
            fully_shard(module, mesh=mesh)
    fully_shard(policy, mesh=mesh)
    for method in PiPolicy._fsdp_forward_methods:
        register_fsdp_forward_method(policy, method)
    table_forwards = []  # FSDP2 gathers a unit only around its forward: the table's must never run
    embed.register_forward_pre_hook(lambda *_: table_forwards.append(1))
    sharded, _ = policy(batch, noise=noise, time=time)
    sharded.backward()
    sharded_grads = {n: p.grad.full_tensor() for n, p in policy.named_parameters() if p.grad is not None}
    actions = policy.predict_action_chunk(observation, noise=reference["noise"])
    policy.zero_grad(set_to_none=True)
    table = _vocab_parallel(embed, backbone.embed_language, plain_embeddings, plain_table_grad)
    return {
        **table,
        "table_forwards": len(table_forwards),
        "plain_loss": plain.item(),
        "sharded_loss": sharded.item(),
        "reference_loss": reference["loss.mean"].item(),
        "same_grad_names": sorted(grads) == sorted(sharded_grads),
        "grads": len(grads),
        "max_grad_diff": max((sharded_grads[n] - g).abs().max().item() for n, g in grads.items()),
        "max_action_diff": (actions - reference["actions.normalized"]).abs().max().item(),
    }


def main() -> None:
    if MODE == ["hsdp"]:
        _engine_runs(HSDP_RUNS)
        clean_exit.leave()
    _engine_runs(RUNS)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for kind in ("lerobot_pi0_tiny", "lerobot_pi05_tiny"):
        result = _fully_shard(Path(WORKDIR) / kind, mesh)
        if dist.get_rank() == 0:
            Path(OUT, f"{kind}.json").write_text(json.dumps(result))
    accumulated = _accumulated_without_sync(mesh)
    if dist.get_rank() == 0:
        Path(OUT, "accumulated.json").write_text(json.dumps(accumulated))
    clean_exit.leave()


if __name__ == "__main__":
    main()
