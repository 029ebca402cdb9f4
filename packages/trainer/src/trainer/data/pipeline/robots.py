"""One robot's share of a processor's state: with several embodiments (a mixture of robots that
differ, data/pipeline/embodiments.py) a processor holds one set of statistics per embodiment, the
default's under their own names and embodiment k's under `embodiment.<k>.` in the same step file, and
its config lists them under `embodiments`. Read back, checked, split per robot and cut to one robot's
sizes and features (what `Processor.for_embodiment` keeps and an export writes)."""

from __future__ import annotations

from typing import Any

import torch

from trainer.config.dataset import Embodiment
from trainer.data.dataset import ACTION_KEY, OBS_KEY
from trainer.errors import ConfigError

EMBODIMENTS = "embodiments"  # the processor config's list of embodiments
EMBODIMENT_PREFIX = "embodiment."  # `embodiment.<k>.`: embodiment k's statistics in a step file


def saved_embodiments(config: Any) -> list[Embodiment]:
    """The embodiments a saved processor config lists ([] when it has none), each entry checked."""
    listed = config.get(EMBODIMENTS) if isinstance(config, dict) else None
    if listed is None:
        return []
    if not isinstance(listed, list) or not listed:
        raise ConfigError(f"its processor config's {EMBODIMENTS} is not a list of embodiments")
    found = []
    for index, entry in enumerate(listed):
        features = entry.get("input_features") if isinstance(entry, dict) else None
        sizes = [entry.get(n) for n in ("obs_dim", "action_dim")] if isinstance(entry, dict) else []
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("name"), str)
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes)
            and isinstance(features, list)
            and all(isinstance(f, str) for f in features)
        ):
            raise ConfigError(
                f"its processor config's embodiment {index} is not {{name, obs_dim, action_dim, input_features}}"
            )
        found.append(
            Embodiment(entry["name"], int(entry["obs_dim"]), int(entry["action_dim"]), tuple(features))
        )
    names = [e.name for e in found]
    if len(set(names)) != len(names):
        raise ConfigError(f"its processor config names an embodiment twice: {', '.join(names)}")
    return found


def embodiment_tensors(
    config: Any, step_tensors: list[dict[str, torch.Tensor]], embodiment: Embodiment
) -> list[dict[str, torch.Tensor]]:
    """One embodiment's step tensors of a saved processor, under their own names and as saved (what
    LeRobot's normalizer reads, unchanged), cut to its sizes and features: an export's state files."""
    embodiments = saved_embodiments(config)
    own = split(step_tensors, len(embodiments))[embodiments.index(embodiment)]
    return [
        {
            name: cut(name.rpartition(".")[0], t, embodiment)
            for name, t in tensors.items()
            if kept(name.rpartition(".")[0], embodiment)
        }
        for tensors in own
    ]


def kept(key: str, embodiment: Embodiment) -> bool:
    """Whether an embodiment has the feature `key` normalizes (the state and action always)."""
    return key in (OBS_KEY, ACTION_KEY) or key in embodiment.input_features


def cut(key: str, tensor: torch.Tensor, embodiment: Embodiment) -> torch.Tensor:
    """A statistic of `key` cut to an embodiment's own size along its last axis (the state's and the
    action's; the others as they are)."""
    sizes = {OBS_KEY: embodiment.obs_dim, ACTION_KEY: embodiment.action_dim}
    return tensor[..., : sizes[key]] if key in sizes else tensor


def split(step_tensors: list[dict[str, torch.Tensor]], count: int) -> list[list[dict[str, torch.Tensor]]]:
    """Each embodiment's step tensors (the default's under their own names, embodiment k's under
    `embodiment.<k>.`; all of them for one set without embodiments)."""
    sets: list[list[dict[str, torch.Tensor]]] = [[{} for _ in step_tensors] for _ in range(max(count, 1))]
    for index, tensors in enumerate(step_tensors):
        for name, tensor in tensors.items():
            k, own = 0, name
            if count and name.startswith(EMBODIMENT_PREFIX):
                number, _, own = name.removeprefix(EMBODIMENT_PREFIX).partition(".")
                k = int(number) if number.isdigit() else -1
                if not 0 < k < count:
                    raise ConfigError(
                        f"its processor step {index} holds {name}, but the config lists {count} embodiments"
                    )
            sets[k][index][own] = tensor
    return sets
