"""EMA runs of the real trainer on 2 gloo ranks, several per launch.

usage: ema_run.py OUT CASE   (CASE: two, on 2 ranks, first | hsdp, on 4 ranks)

Each run is `trainer.engine.plan.train(parse_config(flags))` in this process. A spy wraps
`trainer.engine.ema.Ema`: at the shadow's start and after each of its updates it gathers every trained
parameter in full (collective) and rank 0 folds it into a reference EMA computed on full tensors with
the same decay, stored as `<run>/reference_ema.safetensors` when the run ends: the shadow the trainer
kept on its shards must equal it.

`ddp`     DDP on 2 ranks, safetensors, saves at 2 and 4; the end-of-run rollouts score the EMA.
`fsdp2`   FSDP2 on 2 ranks, dcp, saves at 2 (in the background: --async_save) and 4.
`fsdp2_r` resumes `fsdp2` at step 2 on the same topology, into its own output_dir.
`ddp_to_fsdp2` resumes `ddp` at step 2 under FSDP2 (the gathered ema.safetensors read block by block).
`base`    FSDP2, no EMA, 2 steps: the base of `peft`.
`peft`    LoRA on `base` under FSDP2 with EMA (of the adapters only), safetensors + dcp.
`peft_r`  resumes `peft` at step 2 on the same topology (the shadow read under the adapter's names).
hsdp (4 ranks, the same global batch of 16):
`hsdp`    HSDP 2x2, safetensors + dcp.
`hsdp_compiled` the same with activation checkpointing and compile (aot_eager) on every wrap unit.
`fsdp2_to_hsdp` resumes `fsdp2` at step 2 under HSDP 2x2 (its DCP shadow resharded onto the 2-D mesh).
"""

from __future__ import annotations

import sys

import clean_exit
import torch
import torch.distributed as dist
from fresh_accelerator import reset_accelerate
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor

import trainer.engine.ema as ema
from trainer.cli.parse import parse_config
from trainer.engine.plan import train

OUT, CASE = sys.argv[1:3]
REFERENCE: dict[str, torch.Tensor] = {}


def _full(model_params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [p.full_tensor() if isinstance(p, DTensor) else p.detach().clone() for p in model_params]


class SpiedEma(ema.Ema):
    def __init__(self, config, model) -> None:
        super().__init__(config, model)
        full = _full(self._params)
        REFERENCE.clear()
        REFERENCE.update({name: value.clone() for name, value in zip(self.shadow, full, strict=True)})

    def update(self, updates: int) -> float:
        decay = super().update(updates)
        for name, value in zip(self.shadow, _full(self._params), strict=True):
            REFERENCE[name] = torch.lerp(REFERENCE[name], value, 1.0 - decay)
        return decay


ema.Ema = SpiedEma  # type: ignore[misc]
import trainer.engine.startup as startup  # noqa: E402

startup.Ema = SpiedEma  # type: ignore[misc]


def flags(run: str, *extra: str) -> list[str]:
    return [
        f"--output_dir={OUT}/{run}",
        f"--dataset.cache_dir={OUT}/cache",
        "--policy.type=mlp",
        "--policy.hidden_dim=16",
        "--policy.dropout=0",
        "--dataset.episodes=2",
        "--dataset.eval_episodes=0",
        "--steps=4",
        "--save_freq=2",
        "--log_freq=2",
        "--batch_size=8",
        "--seed=3",
        "--ema.enable=true",
        # the default warmup: decay 0 at the first update, 1 - 2**(-2/3) at the second, so the step-2
        # shadow differs from the step-2 weights and a resume that lost it would show
        "--ema.power=0.6666666666666666",
        *extra,
    ]


TWO = {
    "ddp": [
        *flags("ddp", "--parallelism.dp_shard=1", "--checkpoint_format=safetensors"),
        "--dataset.eval_episodes=2",
    ],
    "fsdp2": flags("fsdp2", "--parallelism.dp_shard=2", "--checkpoint_format=dcp", "--async_save=true"),
    "fsdp2_r": [
        *flags("fsdp2_r", "--parallelism.dp_shard=2", "--checkpoint_format=dcp"),
        "--resume=true",
        f"--config_path={OUT}/fsdp2/checkpoints/000002/pretrained_model/train_config.json",
    ],
    "ddp_to_fsdp2": [
        *flags("ddp_to_fsdp2", "--parallelism.dp_shard=2", "--checkpoint_format=safetensors"),
        "--resume=true",
        f"--config_path={OUT}/ddp/checkpoints/000002/pretrained_model/train_config.json",
    ],
    "base": flags("base", "--parallelism.dp_shard=2", "--ema.enable=false", "--steps=2"),
    "peft": flags(
        "peft",
        "--parallelism.dp_shard=2",
        "--checkpoint_format=safetensors_dcp",
        f"--policy.path={OUT}/base/checkpoints/last",
        "--peft.method_type=LORA",
        "--peft.r=2",
        "--peft.alpha=4",
        "--use_policy_training_preset=false",
        "--optimizer.lr=0.01",
    ),
    "peft_r": [
        "--resume=true",
        f"--config_path={OUT}/peft/checkpoints/000002/pretrained_model/train_config.json",
        f"--output_dir={OUT}/peft_r",
    ],
}
HSDP = ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2", "--batch_size=4"]
TRANSFORMS = [  # aot_eager: compile's graph capture and autograd without inductor's C++ build
    "--accelerator.activation_checkpointing=true",
    "--accelerator.compile=true",
    "--accelerator.compile_backend=aot_eager",
]
FOUR = {
    "hsdp": flags("hsdp", *HSDP, "--checkpoint_format=safetensors_dcp"),
    "hsdp_compiled": flags("hsdp_compiled", *HSDP, "--checkpoint_format=safetensors_dcp", *TRANSFORMS),
    "fsdp2_to_hsdp": [
        *flags("fsdp2_to_hsdp", *HSDP, "--checkpoint_format=dcp"),
        "--resume=true",
        f"--config_path={OUT}/fsdp2/checkpoints/000002/pretrained_model/train_config.json",
    ],
}
RUNS = {"two": TWO, "hsdp": FOUR}[CASE]
RESUMED = ("fsdp2_r", "ddp_to_fsdp2", "peft_r", "fsdp2_to_hsdp")  # their references would start mid-way

if __name__ == "__main__":
    for run, run_flags in RUNS.items():
        REFERENCE.clear()
        train(parse_config(run_flags))
        reset_accelerate()
        if dist.get_rank() == 0 and run not in RESUMED and REFERENCE:
            save_file(
                {k: v.contiguous() for k, v in REFERENCE.items()}, f"{OUT}/{run}/reference_ema.safetensors"
            )
    clean_exit.leave()
