"""`trainer eval --policy.path=PATH [--dataset.* ...] [--json]`: score a saved policy, no training.

The data defaults to the run's own (the `dataset` section of the checkpoint's train_config.json);
`--dataset.*` flags override it, and LeRobot's `--dataset.root` / `--dataset.repo_id` switch to a
LeRobotDataset. For a LeRobotDataset every episode is scored unless `--dataset.episodes` names some
(the run's own train/val split is not inherited). Under torchrun the work is split across ranks.

A policy trained on several robots (a mixture whose members differ) is scored as one of them,
`--embodiment=NAME` (default: the first member's): on the run's own mixture, that robot's member alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import ckpt_tools
from trainer.cli.parse import LEROBOT_FLAGS, parse_flags, settle_choice
from trainer.config.dataset import DatasetConfig
from trainer.config.registry import split_allow_types
from trainer.data.dataset import OBS_KEY, TASK_KEY
from trainer.data.embedded import sim
from trainer.data.embedded.pendulum import PendulumConfig
from trainer.data.pipeline.renamed import load_renamed
from trainer.data.sources.mixture import MixtureConfig
from trainer.errors import ConfigError
from trainer.evaluation import rollouts as evaluation
from trainer.evaluation.inference import LoadedPolicy, load_policy
from trainer.policies.common import pretrained

USAGE = "usage: trainer eval --policy.path=PATH [--dataset.root=DIR --dataset.episodes=[...]] [--json]"
HELP = f"""{USAGE}

Scores a saved policy without training (docs/training.md, Evaluation):
  --policy.path=PATH   a step or model directory, checkpoints/last, an output_dir, or a Hub repo id
  --dataset.*          the data; default: the dataset section of the run's train_config.json
                       (sim task: rollouts over --dataset.eval_episodes; LeRobotDataset: offline
                       action error over --dataset.episodes, default every episode)
  --rename_map={...}   dataset feature -> policy feature names; default: the run's own
  --batch_size=256     frames per forward pass on a dataset
  --device=cpu         where the policy runs
  --weights=model|ema  which weights; default: the EMA when the checkpoint holds one (--ema.enable)
  --embodiment=NAME    the robot of a policy trained on several (a mixture member's name); default:
                       the first; on the run's own mixture, that member's data alone
  --json               print one JSON object instead of a line
  --allow_types=a:B,.. module:Class types the checkpoint may name (imported: trust them first)"""
_SPLIT_FIELDS = ("episodes", "val_episodes", "eval_split")  # a LeRobot run's split: not inherited by eval


@dataclass
class EvalPolicy:
    path: str = ""
    """The policy to evaluate: any form `trainer.load_policy` accepts."""


@dataclass
class EvalConfig:
    policy: EvalPolicy = field(default_factory=EvalPolicy)
    dataset: DatasetConfig = field(default_factory=PendulumConfig)
    rename_map: dict[str, str] = field(default_factory=dict)
    """Dataset observation feature -> the policy's name for it; default: the run's own --rename_map."""
    batch_size: int = 256
    """Frames per forward pass on a dataset."""
    device: str = "cpu"
    """Where the policy runs."""
    weights: str | None = None
    """model or ema (a run's --ema.enable average); unset: the EMA when the checkpoint holds one."""
    embodiment: str | None = None
    """The robot of a policy trained on several, by its mixture member's name; unset: the first."""


def run_eval(args: Sequence[str]) -> dict[str, Any]:
    """Parse, load, score; returns the result (the same on every rank)."""
    allowed, rest = split_allow_types([a for a in args if a != "--json"])
    path = next((a.split("=", 1)[1] for a in reversed(rest) if a.startswith("--policy.path=")), None)
    if not path:
        raise ConfigError(
            f"trainer eval needs --policy.path=PATH (a checkpoint, model directory or Hub id); {USAGE}"
        )
    with _saved_dataset(path, rest) as config_path:
        settle_choice(rest, config_path, DatasetConfig, "dataset", allowed)
        config = parse_flags(EvalConfig, rest, config_path)
    loaded = load_policy(
        path, config.device, config.weights, allow_types=allowed, embodiment=config.embodiment
    )
    world, rank, reduce = _ranks()
    if config.dataset.rollout_episodes:
        camera = _sim_camera(config.dataset, loaded)
        result = evaluation.rollout_returns(
            _sim_actor(loaded), config.dataset.rollout_episodes, world, rank, reduce, camera, loaded.reset
        )
    else:
        data, rename = _robot_data(config.dataset, config.rename_map, loaded)
        dataset, _, _ = load_renamed(data, rename, loaded.input_features, held_out=False)
        result = evaluation.action_errors(
            loaded.act, dataset, world, rank, reduce, config.batch_size, loaded.reset
        )
    return {"policy": path, "weights": loaded.weights, **result}


def _robot_data(
    dataset: DatasetConfig, rename: dict[str, str], loaded: LoadedPolicy
) -> tuple[DatasetConfig, dict[str, str]]:
    """The data a policy of several robots is scored on, and its renames: on a mixture, the member of
    the chosen robot alone (every episode it trains on), its own rename_map followed by the run's."""
    robot = loaded.embodiment
    if robot is None or not isinstance(dataset, MixtureConfig):
        return dataset, rename
    labels = dataset.labels()
    if robot.name not in labels:
        raise ConfigError(
            f"the mixture has no member {robot.name!r} (it has {', '.join(labels)}): give that robot's data "
            "with --dataset.root, or choose one of its members with --embodiment"
        )
    index = labels.index(robot.name)
    own = dataset.members[index].rename_map
    renames = {old: rename.get(new, new) for old, new in own.items()}
    renames.update({old: new for old, new in rename.items() if old not in own.values()})
    return dataclasses.replace(dataset.member_config(index), eval_split=0.0), renames


def _sim_actor(loaded: LoadedPolicy) -> Any:
    return lambda obs: loaded.select_action(obs).cpu().numpy()


def _sim_camera(dataset: DatasetConfig, loaded: LoadedPolicy) -> bool:
    """Whether the rollouts run the camera task; a policy reading a feature the sim does not give
    (a camera it was trained on, without --dataset.camera=true) is refused in one line."""
    camera = dataset.rollout_camera
    given = (OBS_KEY, sim.CAMERA, TASK_KEY) if camera else (OBS_KEY, TASK_KEY)
    missing = [name for name in loaded.input_features if name not in given]
    if missing:
        fix = "pass --dataset.camera=true" if missing[0] == sim.CAMERA else "evaluate it on its own dataset"
        raise ConfigError(
            f"the policy reads {missing[0]!r}, which the sim task gives no value for (it gives "
            f"{', '.join(given)}): {fix}"
        )
    return camera


@contextlib.contextmanager
def _saved_dataset(path: str, args: list[str]) -> Iterator[str | None]:
    """A config file holding the run's own dataset section and --rename_map, unless the flags choose
    another dataset type."""
    try:
        train_config = ckpt_tools.open_checkpoint(pretrained.resolve(path)).train_config()
    except ckpt_tools.CheckpointError:
        train_config = {}
    saved = train_config.get("dataset")
    explicit = next((a.split("=", 1)[1] for a in reversed(args) if a.startswith("--dataset.type=")), None)
    implied = explicit or ("lerobot" if any(a.startswith(LEROBOT_FLAGS) for a in args) else None)
    if not isinstance(saved, dict) or (implied is not None and implied != saved.get("type")):
        yield None
        return
    if saved.get("type") == "lerobot":
        saved = {k: v for k, v in saved.items() if k not in _SPLIT_FIELDS}
    with tempfile.TemporaryDirectory(prefix="trainer-eval-") as tmp:
        file = os.path.join(tmp, "eval_config.json")
        with open(file, "w", encoding="utf-8") as handle:
            json.dump({"dataset": saved, "rename_map": train_config.get("rename_map", {})}, handle)
        yield file


def _ranks() -> tuple[int, int, evaluation.Reduce]:
    """(world size, rank, sum over ranks); a torchrun launch joins a gloo group for the sums."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return 1, 0, lambda totals: totals
    if not dist.is_initialized():
        dist.init_process_group("gloo")

    def reduce(totals: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(totals)
        return totals

    return dist.get_world_size(), dist.get_rank(), reduce
