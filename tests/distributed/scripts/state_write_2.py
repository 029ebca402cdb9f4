"""2 ranks: FSDP2 (dcp), FSDP2 with bf16 compute (safetensors) and DDP (safetensors) checkpoints, then
resumes across topologies and formats: 4 -> 2 ranks, HSDP -> FSDP2, DDP safetensors -> FSDP2,
FSDP2 DCP -> DDP, and FSDP2 -> FSDP2 followed by one more step. Each result is dumped as a full state
dict for the tests to compare. Needs state_write_4.py's output. Usage: state_write_2.py OUT"""

from __future__ import annotations

import contextlib
import sys

import torch
import torch.distributed as dist
from state_common import build, dump_full_state, finish, seed_rng_for_save, train, training_step

import ckpt_tools
from ckpt_tools.files import storage
from ckpt_tools.state import training_load as load


def save(out: str, case: str, kind: str, fmt: str, model, optimizer, step: int = 2) -> None:
    seed_rng_for_save()
    ckpt_tools.training.save_checkpoint(
        ckpt_tools.training.SaveRequest(
            checkpoints_dir=f"{out}/{case}/checkpoints",
            training_step=training_step(step, kind, fmt),
            model=model,
            optimizer=optimizer,
            policy_config={"type": "tiny"},
            train_config={"case": case},
        )
    )
    dump_full_state(model, optimizer, f"{out}/{case}/reference.pt")


def resume(out: str, source: str, kind: str, name: str):
    model, optimizer = build(kind, seed=3)
    with counted_weight_reads() as reads:
        ckpt_tools.training.load_training_state(f"{out}/{source}", model=model, optimizer=optimizer)
    reads["shard_bytes"] = sum(
        p.to_local().nbytes if hasattr(p, "to_local") else p.nbytes for p in model.parameters()
    )
    reads["optimizer_shard_bytes"] = sum(
        t.to_local().nbytes if hasattr(t, "to_local") else t.nbytes
        for param_state in optimizer.state.values()
        for t in param_state.values()
        if torch.is_tensor(t)
    )
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, reads)
    if dist.get_rank() == 0:
        torch.save(gathered, f"{out}/resumed/{name}.reads.pt")
    dump_full_state(model, optimizer, f"{out}/resumed/{name}.pt")
    return model, optimizer


@contextlib.contextmanager
def counted_weight_reads():
    """Count what this rank reads of `model.safetensors` and `optimizer_state.safetensors` (ranged
    reads through ckpt_tools.files.storage) and whether a whole-file reader (`read_weight_set`,
    `read_optimizer_safetensors`) ran."""
    reads = {"model_bytes": 0, "optimizer_bytes": 0, "whole_file": False, "whole_optimizer": False}
    open_file, read_weight_set = storage.open_file, load.read_weight_set
    read_optimizer = load.read_optimizer_safetensors

    class Counting:
        def __init__(self, handle, counter):
            self.handle, self.counter = handle, counter

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def seek(self, *args):
            return self.handle.seek(*args)

        def readinto(self, buffer):
            got = self.handle.readinto(buffer)
            reads[self.counter] += got
            return got

    def counting_open(path, *args, **kwargs):
        handle = open_file(path, *args, **kwargs)
        for name, counter in (
            ("model.safetensors", "model_bytes"),
            ("optimizer_state.safetensors", "optimizer_bytes"),
        ):
            if str(path).endswith(name):
                return Counting(handle, counter)
        return handle

    def whole(*args, **kwargs):
        reads["whole_file"] = True
        return read_weight_set(*args, **kwargs)

    def whole_optimizer(*args, **kwargs):
        reads["whole_optimizer"] = True
        return read_optimizer(*args, **kwargs)

    storage.open_file, load.read_weight_set = counting_open, whole
    load.read_optimizer_safetensors = whole_optimizer
    try:
        yield reads
    finally:
        storage.open_file, load.read_weight_set = open_file, read_weight_set
        load.read_optimizer_safetensors = read_optimizer


def main(out: str) -> None:
    dist.init_process_group("gloo")
    model, optimizer = build("fsdp")
    train(model, optimizer, 2)
    save(out, "fsdp2", "fsdp", "dcp", model, optimizer)
    train(model, optimizer, 1, first_step=2)
    dump_full_state(model, optimizer, f"{out}/fsdp2/continued.pt")

    bf16, bf16_optimizer = build("fsdp", bf16=True)
    train(bf16, bf16_optimizer, 1)
    save(out, "fsdp2_bf16", "fsdp", "safetensors", bf16, bf16_optimizer, step=1)

    ddp, ddp_optimizer = build("ddp")
    train(ddp, ddp_optimizer, 2)
    save(out, "ddp2", "ddp", "safetensors", ddp, ddp_optimizer)

    resume(out, "fsdp4", "fsdp", "fsdp4_to_fsdp2")
    resume(out, "hsdp2x2", "fsdp", "hsdp_to_fsdp2")
    resume(out, "ddp2", "fsdp", "ddp2_to_fsdp2")
    resume(out, "fsdp2", "ddp", "fsdp2_to_ddp")
    again, again_optimizer = resume(out, "fsdp2", "fsdp", "fsdp2_to_fsdp2")
    train(again, again_optimizer, 1, first_step=2)
    dump_full_state(again, again_optimizer, f"{out}/resumed/fsdp2_continued.pt")

    ckpt_tools.training.load_rng_state(f"{out}/fsdp4", dist.get_rank(), dist.get_world_size())
    states = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(torch.get_rng_state(), states, dst=0)
    if dist.get_rank() == 0:
        torch.save(states, f"{out}/resumed/rng_fsdp4_on_2.pt")
    finish()


if __name__ == "__main__":
    main(sys.argv[1])
