"""pi0 / pi0.5 sharded with torch's FSDP2 on gloo ranks, its units the policy's `fsdp_wrap_modules`.

usage: pi_fsdp2.py OUT FIXTURE...

For each LeRobot fixture folder (cwd: it names its tokenizer relatively) every rank loads the checkpoint,
takes the loss and its gradients unsharded, then shards each JointLayer and SigLIP encoder layer (and
the root) and takes them again on the same batch, noise and time, and samples a chunk sharded. Rank 0
writes OUT/<kind>.json: both losses, the largest gradient difference, the sharded actions' largest
difference from LeRobot's, and how many parameters got a gradient.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

from trainer.policies.pi import PiPolicy

OUT, *FIXTURES = sys.argv[1:]


def _check(folder: str, mesh: object) -> dict[str, float]:
    os.chdir(folder)
    policy = PiPolicy.from_lerobot("pretrained_model", size_overrides="tiny_paligemma/tiny_pi_overrides.json")
    reference = load_file("reference_padded_task.safetensors")
    batch = {k.removeprefix("pre."): v for k, v in reference.items() if k.startswith("pre.")}
    observation = {k: v for k, v in batch.items() if k not in ("action", "action_is_pad")}
    noise, time = reference["loss.noise"], reference["loss.time"]
    plain, _ = policy.forward(batch, noise=noise, time=time)
    plain.backward()
    grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
    policy.zero_grad(set_to_none=True)
    for module in list(policy.modules()):
        if type(module).__name__ in PiPolicy.fsdp_wrap_modules:
            fully_shard(module, mesh=mesh)
    fully_shard(policy, mesh=mesh)
    for method in PiPolicy.fsdp_forward_methods:
        register_fsdp_forward_method(policy, method)
    sharded, _ = policy(batch, noise=noise, time=time)
    sharded.backward()
    sharded_grads = {n: p.grad.full_tensor() for n, p in policy.named_parameters() if p.grad is not None}
    actions = policy.sample_actions(observation, noise=reference["noise"])
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
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for folder in FIXTURES:
        result = _check(folder, mesh)
        if dist.get_rank() == 0:
            Path(OUT, f"{Path(folder).name}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
