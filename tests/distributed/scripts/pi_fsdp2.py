"""pi0 / pi0.5 sharded on gloo ranks, all in one torchrun launch.

usage: pi_fsdp2.py OUT WORKDIR [hsdp]

WORKDIR holds LeRobot's fixtures `lerobot_pi0_tiny/`, `lerobot_pi05_tiny/` (each naming its tokenizer by
the relative path `tiny_paligemma`, so a run's working directory is the fixture's folder) and the
dataset `dataset_video/`.

The trainer's runs (2 ranks): `fsdp2` fine-tunes LeRobot's pi0.5 checkpoint (`--policy.path`, the
fixture's sizes through --policy.size_overrides) for two steps under FSDP2 with the policy's units,
`ddp` the same under DDP, `lora` fine-tunes the fsdp2 result with LoRA on LeRobot's default targets
under FSDP2. During each sharded run a forward pre-hook counts the calls of every FSDP unit; rank 0
writes OUT/<run>_units.json: the units' classes and those whose forward never ran. With `hsdp` (4
ranks): `hsdp` (2 replicas x 2 shards) and `ddp4` instead.

Then (2 ranks), for each fixture, torch's `fully_shard` on the policy's own units directly: the loss and
its gradients unsharded, then sharded on the same batch, noise and time, and a chunk sampled sharded;
rank 0 writes OUT/<fixture>.json: both losses, the largest gradient difference, the sharded actions'
largest difference from LeRobot's, and how many parameters got a gradient.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import clean_exit
import torch
import torch.distributed as dist
from fresh_accelerator import reset_accelerate
from safetensors.torch import load_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

import trainer
from trainer.cli.parse import parse_config
from trainer.engine import startup
from trainer.engine.plan import train
from trainer.policies.pi import PiPolicy

OUT, WORKDIR, *MODE = sys.argv[1:]
OVERRIDES = "tiny_paligemma/tiny_pi_overrides.json"
TINY = [
    f"--policy.size_overrides={OVERRIDES}", "--dataset.root=../dataset_video", "--batch_size=2",
    "--num_workers=0", "--log_freq=1", "--seed=3", "--steps=2", "--save_freq=2",
]  # fmt: skip
RUNS = {
    "fsdp2": ["--policy.path=pretrained_model", "--parallelism.dp_shard=2"],
    "ddp": ["--policy.path=pretrained_model", "--parallelism.dp_shard=1"],
    "lora": [f"--policy.path={OUT}/fsdp2/checkpoints/last", "--peft.method_type=LORA", "--peft.r=2", "--parallelism.dp_shard=2"],
}  # fmt: skip
HSDP_RUNS = {
    "hsdp": ["--policy.path=pretrained_model", "--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"],
    "ddp4": ["--policy.path=pretrained_model", "--parallelism.dp_shard=1"],
}  # fmt: skip


class UnitCalls:
    """The prepared model of a run (caught from `startup.prepare`) and how often each FSDP unit's
    forward ran (a global forward pre-hook)."""

    def __init__(self) -> None:
        self.model: torch.nn.Module | None = None
        self.calls: dict[int, int] = {}
        prepare = startup.prepare

        def catching(*args: Any, **kwargs: Any) -> Any:
            out = prepare(*args, **kwargs)
            self.model = out[0]
            return out

        startup.prepare = catching
        torch.nn.modules.module.register_module_forward_pre_hook(self._count)

    def _count(self, module: torch.nn.Module, _: Any) -> None:
        if isinstance(module, FSDPModule):
            self.calls[id(module)] = self.calls.get(id(module), 0) + 1

    def report(self) -> dict[str, Any]:
        assert self.model is not None
        units = [m for m in self.model.modules() if isinstance(m, FSDPModule)]
        classes = sorted({type(m).__name__.removeprefix("FSDP") for m in units})
        idle = sorted({type(m).__name__ for m in units if not self.calls.get(id(m))})
        return {"units": len(units), "classes": classes, "never_ran": idle}


def _engine_runs(runs: dict[str, list[str]]) -> None:
    os.chdir(Path(WORKDIR) / "lerobot_pi05_tiny")
    watch = UnitCalls()
    for run, flags in runs.items():
        reset_accelerate()
        watch.model, watch.calls = None, {}
        print(f"=== run {run}", flush=True)
        train(parse_config([*TINY, *flags, f"--output_dir={OUT}/{run}"]))
        if dist.get_rank() == 0 and run not in ("ddp", "ddp4"):
            Path(OUT, f"{run}_units.json").write_text(json.dumps(watch.report()))
    reset_accelerate()


def _fully_shard(folder: Path, mesh: object) -> dict[str, float]:
    os.chdir(folder)
    policy = trainer.load_policy("pretrained_model", size_overrides=OVERRIDES).policy
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
    sharded, _ = policy(batch, noise=noise, time=time)
    sharded.backward()
    sharded_grads = {n: p.grad.full_tensor() for n, p in policy.named_parameters() if p.grad is not None}
    actions = policy.predict_action_chunk(observation, noise=reference["noise"])
    return {
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
    clean_exit.leave()


if __name__ == "__main__":
    main()
