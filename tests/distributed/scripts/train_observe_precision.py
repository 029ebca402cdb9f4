"""`trainer train` through the real CLI, with what mixed precision, the loss scaler and clipping did
recorded on every rank.

Usage: torchrun --nproc-per-node=N train_observe_precision.py OBSERVED_PREFIX OVERFLOW_AT [trainer flags]

The loop's `prepare` is wrapped (nothing else changes); `watch` then records, per rank:
  dtypes      the dtype of the first Linear's output in each training forward (what autocast made it);
  scales      the loss scale at each training forward (None without a scaler);
  weights     at each training forward, the float64 sum of this rank's parameters (its local shards
              on a sharded run): equal at two forwards exactly when no update ran between them;
  norms       before each optimizer update that runs, the global gradient norm the optimizer sees
              (after clipping); torch's step hooks fire only for updates the scaler lets through;
and, on the last rank only, makes training step OVERFLOW_AT (1-based, 0: never) overflow, an overflow
that rank alone meets. OVERFLOW_AT=N multiplies that step's loss by inf (every gradient of that rank
becomes non-finite); OVERFLOW_AT=N:shard instead sets one element of the first gradient shard that
rank holds to inf after backward, after the gradients were reduced, so no other rank's gradients see
it: the ranks must agree to skip through the scaler alone. Each rank writes OBSERVED_PREFIX.rank<R>.pt
when evaluation starts. The in-process tests import `watch` from this file for one-process runs.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

import trainer.engine.loop
import trainer.engine.startup
from trainer.cli import main
from trainer.distributed.factory import prepare


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a (possibly sharded DTensor) parameter or gradient."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _poison_local_gradient_shard(model: Any) -> None:
    """One element of the first non-empty gradient shard this rank holds becomes inf."""
    with torch.no_grad():
        grad = next(g for p in model.parameters() if (g := p.grad) is not None and _local(g).numel())
        _local(grad).view(-1)[0] = float("inf")


def watch(
    accelerator: Any, model: Any, optimizer: Any, overflow_at: int, where: str = "loss"
) -> dict[str, list]:
    """Hook the prepared model and optimizer; returns the record the hooks fill. `where` is "loss" or
    "shard" (see the module docstring)."""
    record: dict[str, list] = {"dtypes": [], "scales": [], "weights": [], "norms": []}
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    linear.register_forward_hook(
        lambda module, _inputs, output: (
            record["dtypes"].append(str(output.dtype)) if module.training else None
        )
    )
    forward, last_rank = model.forward, accelerator.process_index == accelerator.num_processes - 1

    def overflows_now() -> bool:
        return last_rank and len(record["scales"]) == overflow_at

    def counted_forward(*args: Any, **kwargs: Any) -> Any:
        if model.training:
            scaler = accelerator.scaler
            record["scales"].append(None if scaler is None else float(scaler.get_scale()))
            record["weights"].append(
                sum(float(_local(p).detach().double().sum()) for p in model.parameters())
            )
        loss, rest = forward(*args, **kwargs)
        if model.training and where == "loss" and overflows_now():
            loss = loss * float("inf")
        return loss, rest

    model.forward = counted_forward
    backward = accelerator.backward

    def poisoning_backward(loss: Any, **kwargs: Any) -> None:
        backward(loss, **kwargs)
        if where == "shard" and overflows_now():
            _poison_local_gradient_shard(model)

    accelerator.backward = poisoning_backward

    def norm_before_update(opt: Any, _args: Any, _kwargs: Any) -> None:
        grads = [
            p.grad.detach().float()
            for group in opt.param_groups
            for p in group["params"]
            if p.grad is not None
        ]
        record["norms"].append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

    optimizer.optimizer.register_step_pre_hook(norm_before_update)
    return record


if __name__ == "__main__":
    prefix, overflow, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
    overflow_at, _, where = overflow.partition(":")
    records: dict[str, Any] = {}

    def watched_prepare(
        accelerator: Any, policy: Any, optimizer: Any, scheduler: Any, wrap_plan: Any
    ) -> tuple:
        model, optimizer, scheduler = prepare(accelerator, policy, optimizer, scheduler, wrap_plan)
        records["rank"] = accelerator.process_index
        records["record"] = watch(accelerator, model, optimizer, int(overflow_at), where or "loss")
        return model, optimizer, scheduler

    evaluate = trainer.engine.loop.score_at_end

    def save_then_evaluate(*args: Any, **kwargs: Any) -> Any:
        torch.save(records["record"], f"{prefix}.rank{records['rank']}.pt")
        return evaluate(*args, **kwargs)

    trainer.engine.startup.prepare = watched_prepare
    trainer.engine.loop.score_at_end = save_then_evaluate
    main(["train", *flags])
