"""LoRA fine-tuning runs of the real trainer under torchrun, several per launch (one launch per topology).

usage: peft_run.py OUT CASE   (CASE: fsdp2 | ddp2 | hsdp2x2; launch fsdp2 first)

Each run is `trainer.engine.plan.train(parse_config(flags))` in this process. A spy wraps
`trainer.engine.checkpoint.saving.save`: before every checkpoint it gathers the full PEFT model state dict
(collective) and rank 0 stores it, with the names and dtypes of the trainable parameters, as
`<run>/spy/<step>.pt`, so the tests can compare the saved adapter with what was in memory and check that
the frozen base never moved. Losses are in each run's metrics.jsonl (log_freq=1).

fsdp2   `base`: the base policy, a short full training run of a tiny ACT (FSDP2, safetensors);
        `a`: LoRA, 4 steps from `base`, DCP adapters at steps 2 and 4; `r`: resumes `a` at step 2 on the same
        topology; `bf16`: bf16 base, bf16 mixed precision, a full-training head, safetensors.
ddp2    `x`: resumes fsdp2/a at step 2 under DDP (DCP adapter shards -> replicated), safetensors.
hsdp2x2 `x`: resumes fsdp2/a at step 2 under HSDP 2x2 (same global batch), safetensors + DCP.
"""

from __future__ import annotations

import os
import sys

import clean_exit
import torch
import torch.distributed as dist
from fresh_accelerator import reset_accelerate
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

import trainer.engine.checkpoint.saving as saving
from trainer.cli.parse import parse_config
from trainer.engine.plan import train

OUT, CASE = sys.argv[1:3]
BASE = f"{OUT}/fsdp2/base/checkpoints/last"
TINY_ACT = [
    "--policy.type=act_state",
    "--policy.dim=16",
    "--policy.heads=2",
    "--policy.ffn_dim=32",
    "--policy.encoder_layers=1",
    "--policy.decoder_layers=1",
    "--policy.chunk=4",
]
SPY_DIR: list[str] = []


def _held(param: torch.Tensor) -> str:
    placements = getattr(param, "placements", ())
    return "shard" if any(p.is_shard() for p in placements) else "full"


def spy_save(save):
    def wrapped(config, state, *, model, **kwargs):
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dist.get_rank() == 0:
            params = dict(model.named_parameters())
            trainable = {n: p.dtype for n, p in params.items() if p.requires_grad}
            # how each frozen parameter is held on this rank: "shard" (a DTensor split across ranks) or "full"
            layout = {n: _held(p) for n, p in params.items() if not p.requires_grad}
            os.makedirs(SPY_DIR[0], exist_ok=True)
            record = {"state": full, "trainable": trainable, "frozen_layout": layout}
            torch.save(record, f"{SPY_DIR[0]}/{state.step}.pt")
        return save(config, state, model=model, **kwargs)

    return wrapped


saving.save = spy_save(saving.save)


def common(run: str) -> list[str]:
    return [
        f"--output_dir={OUT}/{CASE}/{run}",
        f"--dataset.cache_dir={OUT}/cache",
        "--dataset.episodes=2",
        "--dataset.eval_episodes=0",
        "--log_freq=1",
        "--save_freq=2",
        "--seed=7",
    ]


def fresh(run: str, *flags: str) -> list[str]:
    lora = [
        "--peft.method_type=LORA",
        "--peft.r=4",
        "--peft.alpha=8",
        "--use_policy_training_preset=false",
        "--optimizer.lr=0.01",
    ]
    return [
        f"--policy.path={BASE}",
        "--policy.dropout=0",
        *lora,
        "--steps=4",
        "--batch_size=4",
        *common(run),
        *flags,
    ]


def resumed(run: str, *flags: str) -> list[str]:
    saved = f"{OUT}/fsdp2/a/checkpoints/000002/pretrained_model/train_config.json"
    return ["--resume=true", f"--config_path={saved}", *common(run), *flags]


RUNS = {
    "fsdp2": {
        "base": [*TINY_ACT, "--steps=2", "--batch_size=4", "--parallelism.dp_shard=2", *common("base")],
        "a": fresh("a", "--parallelism.dp_shard=2", "--checkpoint_format=dcp"),
        "r": resumed("r"),
        "bf16": fresh(
            "bf16",
            "--parallelism.dp_shard=2",
            "--policy.dtype=bfloat16",
            "--accelerator.mixed_precision=bf16",
            "--peft.full_training_modules=[head.1]",
            "--accelerator.fsdp.ignored_modules=obs_proj",
            "--steps=2",
        ),
    },
    "ddp2": {"x": resumed("x", "--parallelism.dp_shard=1", "--checkpoint_format=safetensors")},
    "hsdp2x2": {
        "x": resumed(
            "x",
            "--parallelism.dp_replicate=2",
            "--parallelism.dp_shard=2",
            "--batch_size=2",
            "--checkpoint_format=safetensors_dcp",
        )
    },
}


if __name__ == "__main__":
    for run, flags in RUNS[CASE].items():
        SPY_DIR[:] = [f"{OUT}/{CASE}/{run}/spy"]
        train(parse_config(flags))
        reset_accelerate()
    clean_exit.leave()
