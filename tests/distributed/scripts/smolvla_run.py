"""SmolVLA runs of the real trainer on 2 gloo ranks, all in one torchrun launch.

usage: smolvla_run.py OUT WORKDIR [hsdp]

WORKDIR holds the tiny backbone as `tiny_smolvlm/` and LeRobot's camera dataset as `dataset_video/`
(the backbone name is relative, as in LeRobot's fixture). `naive` shards with a unit per decoder layer
(LlamaDecoderLayer) and must fail: SmolVLA calls a decoder layer's parts, never its forward(), so that
unit's parameters are never gathered; its one-line error is printed as `naive failed: ...`. `fsdp2`
(the policy's own units) and `ddp` train the same tiny SmolVLA from the same seed for three steps;
`lora` fine-tunes the fsdp2 result with LoRA on LeRobot's default targets under FSDP2, and
`fsdp2_to_ddp` resumes the fsdp2 run's step 2 on DDP for the third step. With `hsdp`
(4 ranks): `hsdp` (2 replicas x 2 shards) and `ddp4` (DDP) train the same way instead.
`act_lerobot` (in this launch to spare one of its own) fine-tunes LeRobot's ACT checkpoint, WORKDIR's
`lerobot_act/` step, on its dataset `dataset_tiny/` under FSDP2 for two steps.
After each run, `token table of <run>: ...` says how often the VLM's token table was read on each
rank's rows (`vocab_parallel.lookup`) and the row counts of the embedding units whose forward ran (a
forward of the table's unit would gather it whole).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import clean_exit
import torch
from fresh_accelerator import reset_accelerate
from torch.distributed.fsdp import FSDPModule

from trainer.cli.parse import parse_config
from trainer.engine.plan import train
from trainer.policies.common import vocab_parallel

OUT, WORKDIR, *MODE = sys.argv[1:]
TINY = [
    "--policy.type=smolvla", "--policy.vlm_model_name=tiny_smolvlm", "--policy.chunk_size=5",
    "--policy.n_action_steps=5", "--policy.num_vlm_layers=4", "--policy.num_steps=3",
    "--policy.resize_imgs_with_padding=[32,32]", "--dataset.root=dataset_video", "--batch_size=2",
    "--num_workers=0", "--log_freq=1", "--seed=3", "--steps=2", "--save_freq=2",
]  # fmt: skip
RUNS = {
    "naive": ["--parallelism.dp_shard=2", "--accelerator.fsdp.wrap_modules=[SmolVLMEncoderLayer,LlamaDecoderLayer]"],
    "fsdp2": ["--parallelism.dp_shard=2", "--steps=3"],
    "ddp": ["--parallelism.dp_shard=1", "--steps=3"],
    "lora": [f"--policy.path={OUT}/fsdp2/checkpoints/last", "--peft.method_type=LORA", "--peft.r=2", "--parallelism.dp_shard=2"],
}  # fmt: skip
ACT_LEROBOT = [
    "--policy.path=lerobot_act", "--dataset.root=dataset_tiny", "--batch_size=2", "--num_workers=0",
    "--steps=2", "--save_freq=2", "--log_freq=1", "--parallelism.dp_shard=2",
]  # fmt: skip
FSDP2_TO_DDP = [
    "--resume=true", f"--config_path={OUT}/fsdp2/checkpoints/000002/pretrained_model/train_config.json",
    "--parallelism.dp_shard=1", "--steps=3",
]  # fmt: skip
HSDP_RUNS = {
    "hsdp": ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"],
    "ddp4": ["--parallelism.dp_shard=1"],
}  # fmt: skip


class TableReads:
    """The token table's reads during a run: row-sharded lookups, and the rows of every embedding unit
    whose forward ran."""

    def __init__(self) -> None:
        self.lookups = 0
        self.forwards: set[int] = set()
        lookup = vocab_parallel.lookup

        def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
            self.lookups += 1
            return lookup(*args, **kwargs)

        vocab_parallel.lookup = counted
        torch.nn.modules.module.register_module_forward_pre_hook(self._seen)

    def _seen(self, module: torch.nn.Module, _: Any) -> None:
        if isinstance(module, FSDPModule) and isinstance(module, torch.nn.Embedding):
            self.forwards.add(module.num_embeddings)

    def report(self, run: str) -> str:
        return f"token table of {run}: {self.lookups} row-sharded lookups, embedding units run: {sorted(self.forwards)}"


if __name__ == "__main__":
    os.chdir(WORKDIR)
    reads = TableReads()
    for run, flags in (HSDP_RUNS if MODE == ["hsdp"] else RUNS).items():
        reset_accelerate()
        print(f"=== run {run}", flush=True)
        reads.lookups, reads.forwards = 0, set()
        try:
            train(parse_config([*TINY, *flags, f"--output_dir={OUT}/{run}"]))
        except Exception as exc:  # the naive units: reported, not raised (the launch goes on)
            if run != "naive":
                raise
            print(f"naive failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}", flush=True)
        print(reads.report(run), flush=True)
    if MODE != ["hsdp"]:
        reset_accelerate()
        train(parse_config([*FSDP2_TO_DDP, f"--output_dir={OUT}/fsdp2_to_ddp"]))
        reset_accelerate()
        train(parse_config([*ACT_LEROBOT, f"--output_dir={OUT}/act_lerobot"]))
    reset_accelerate()
    clean_exit.leave()
