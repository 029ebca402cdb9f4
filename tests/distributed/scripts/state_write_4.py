"""4 ranks: an FSDP2 checkpoint (safetensors_dcp), then an HSDP 2x2 model resumed from it, trained on and
saved as dcp. Writes reference full state dicts next to each checkpoint. Usage: state_write_4.py OUT"""

from __future__ import annotations

import sys

import torch.distributed as dist
from state_common import build, dump_full_state, finish, seed_rng_for_save, train, training_step

import ckpt_tools


def main(out: str) -> None:
    dist.init_process_group("gloo")
    model, optimizer = build("fsdp")
    train(model, optimizer, 2)
    seed_rng_for_save()
    ckpt_tools.training.save_checkpoint(
        ckpt_tools.training.SaveRequest(
            checkpoints_dir=f"{out}/fsdp4/checkpoints",
            training_step=training_step(2, "fsdp", "safetensors_dcp"),
            model=model,
            optimizer=optimizer,
            policy_config={"type": "tiny"},
            train_config={"case": "fsdp4"},
        )
    )
    dump_full_state(model, optimizer, f"{out}/fsdp4/reference.pt")

    hsdp, hsdp_optimizer = build("hsdp", seed=1)
    ckpt_tools.training.load_training_state(f"{out}/fsdp4", model=hsdp, optimizer=hsdp_optimizer)
    dump_full_state(hsdp, hsdp_optimizer, f"{out}/resumed/fsdp4_to_hsdp.pt")
    train(hsdp, hsdp_optimizer, 1, first_step=2)
    ckpt_tools.training.save_checkpoint(
        ckpt_tools.training.SaveRequest(
            checkpoints_dir=f"{out}/hsdp2x2/checkpoints",
            training_step=training_step(3, "hsdp", "dcp"),
            model=hsdp,
            optimizer=hsdp_optimizer,
            policy_config={"type": "tiny"},
            train_config={"case": "hsdp2x2"},
        )
    )
    dump_full_state(hsdp, hsdp_optimizer, f"{out}/hsdp2x2/reference.pt")
    finish()


if __name__ == "__main__":
    main(sys.argv[1])
