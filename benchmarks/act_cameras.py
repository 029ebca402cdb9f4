"""The ACT benchmark's pieces (bench_act.py launches them; never part of the tests).

- `TwoCamerasConfig`: a dataset plug-in (`--dataset.type=act_cameras:TwoCamerasConfig`) of random
  episodes with two 96x96 uint8 cameras, `observation.images.top` and `observation.images.wrist`.
- As a torchrun script, `bare OUT MODE BATCH STEPS WINDOW` (MODE: trained | frozen): a bare FSDP2 loop
  over the same ACT (same classes, FSDP units, AdamW groups, clipping, per-rank batch, data path through
  the same preprocessor), timed as the trainer's metrics time it (windows of WINDOW steps, the first
  dropped, the median window); `frozen` leaves the trunk out of the optimizer and of autograd. Prints
  one `RESULT {json}` line on rank 0 with the step time and every rank's peak RSS.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

import numpy as np
import torch

from trainer.config.dataset import DatasetConfig
from trainer.data.dataset import ArrayDataset

CAMERAS = ("observation.images.top", "observation.images.wrist")
SIZE = 96
FRAMES, EPISODE = 400, 50
# LeRobot's ACT with a narrower transformer than its defaults (dim_model 512, dim_feedforward 3200),
# so that a CPU step takes seconds, not minutes; the trunk is the full ResNet-18.
ACT_FLAGS: dict[str, Any] = {
    "dim_model": 256, "n_heads": 8, "dim_feedforward": 1024, "n_encoder_layers": 4, "n_decoder_layers": 1,
    "n_vae_encoder_layers": 4, "latent_dim": 32, "chunk_size": 20, "n_action_steps": 20, "dropout": 0.0,
    "pretrained_backbone_weights": None,
}  # fmt: skip


@dataclass
class TwoCamerasConfig(DatasetConfig):
    """Random episodes with two 96x96 cameras (content does not matter for step time)."""

    def load(self, input_features: Sequence[str] = ()) -> ArrayDataset:
        rng = np.random.default_rng(0)
        images = {name: rng.integers(0, 256, (FRAMES, 3, SIZE, SIZE), dtype=np.uint8) for name in CAMERAS}
        features = list(input_features) or ["observation.state", *CAMERAS]
        return ArrayDataset(
            rng.standard_normal((FRAMES, 6), dtype=np.float32),
            rng.standard_normal((FRAMES, 2), dtype=np.float32),
            [EPISODE] * (FRAMES // EPISODE),
            features,
            images=images,
        )


def bare(mode: str, batch_size: int, steps: int, window: int) -> dict[str, object]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from trainer.data.pipeline.processors import build_processors
    from trainer.policies import build_policy
    from trainer.policies.act import ACTConfig
    from trainer.policies.act.modules import ACTDecoderLayer, ACTEncoderLayer
    from trainer.policies.common.base import optimizer_params
    from trainer.policies.common.resnet import ResNetStage

    dist.init_process_group("gloo")
    dataset = TwoCamerasConfig().load()
    shapes = {name: [3, SIZE, SIZE] for name in CAMERAS}
    config = ACTConfig(**ACT_FLAGS, input_features=["observation.state", *CAMERAS], image_shapes=shapes)
    torch.manual_seed(0)
    policy = build_policy(config, dataset.obs_dim, dataset.action_dim)
    if mode == "frozen":
        policy.backbone.requires_grad_(False)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for module in policy.modules():
        if isinstance(module, ACTEncoderLayer | ACTDecoderLayer | ResNetStage):
            fully_shard(module, mesh=mesh)
    fully_shard(policy, mesh=mesh)
    groups = optimizer_params(policy, policy)
    optimizer = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-4)
    preprocessor, _ = build_processors(dataset.stats())
    generator = torch.Generator().manual_seed(dist.get_rank())

    def step() -> None:
        rows = torch.randint(len(dataset), (batch_size,), generator=generator)
        loss, _ = policy(preprocessor(dataset.gather(rows, config.chunk_size)))
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in policy.parameters() if p.requires_grad], 10.0)
        optimizer.step()
        optimizer.zero_grad()

    windows = []
    for _ in range(steps // window + 1):  # the first window is the warm-up, as in the trainer's metrics
        dist.barrier()
        start = time.perf_counter()
        for _ in range(window):
            step()
        dist.barrier()
        windows.append((time.perf_counter() - start) / window)
    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024], dtype=torch.float64)
    peaks = [torch.zeros_like(peak) for _ in range(dist.get_world_size())]
    dist.all_gather(peaks, peak)
    return {"step_s": median(windows[1:]), "peak_rss_mb": [float(p) for p in peaks]}


if __name__ == "__main__":
    mode, batch, steps, window = sys.argv[2], *(int(a) for a in sys.argv[3:6])
    result = bare(mode, batch, steps, window)
    import torch.distributed as dist

    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # FSDP2 on gloo can abort at interpreter teardown (tests/distributed/scripts/clean_exit.py)
