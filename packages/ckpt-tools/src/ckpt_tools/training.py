"""The trainer's tier of ckpt-tools: the collective save and the two-phase resume, the stable API
between a training loop and its checkpoints. An evaluation pipeline needs none of it (`import
ckpt_tools`); a training loop that writes checkpoints in this format uses it as the trainer does.

Saving, on every rank: `prepare_save_groups(timeout)` once, then per step
`save_checkpoint(SaveRequest(...))`, or `start_checkpoint(SaveRequest(...))` and, later, `finish()` on
the `PendingCheckpoint` it returns (a background save). Every rank learns of a failure as the same
`SaveFailedError`; `main_decides` is the pattern: the main rank decides, every rank gets its value or
its error. `write_scores`, `point_best` and `prune_steps` keep a run's evaluated steps (`eval.json`,
the `best` pointer, `--keep_last`).

Resuming, in two phases around the framework's `prepare` (docs/resume.md):

1. Before: `read_training_step` of the step (top level), `plan_resume(saved, RunShape(...))` compares
   the saved topology and batch semantics with the current ones (a `ResumePlan`: what is sample-exact,
   what is warned, what is refused, `ResumeRefusedError`), `load_rng_state`, the sampler at the saved
   `SamplerPosition`.
2. After: `load_training_state` loads model and optimizer state, resharding DCP shards onto the
   current `Topology`; `load_model_weights` loads weights alone into a prepared model.

Loaded lazily, as `ckpt_tools` is: `import ckpt_tools.training` imports no torch until a name is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckpt_tools import _lazy

# What mypy and editors read (as in `ckpt_tools/__init__.py`): the real types, one `from` line per
# module, each name re-exported explicitly.
# isort: off
if TYPE_CHECKING:
    from ckpt_tools.errors import ResumeRefusedError as ResumeRefusedError, SaveFailedError as SaveFailedError
    from ckpt_tools.files.commit import prune_steps as prune_steps
    from ckpt_tools.files.scores import point_best as point_best, write_scores as write_scores
    from ckpt_tools.format.meta import SamplerPosition as SamplerPosition, Topology as Topology
    from ckpt_tools.state.collective import main_decides as main_decides
    from ckpt_tools.state.lerobot_load import (
        check_lerobot_resumable as check_lerobot_resumable,
        is_lerobot_checkpoint as is_lerobot_checkpoint,
        load_lerobot_rng_state as load_lerobot_rng_state,
        load_lerobot_training_state as load_lerobot_training_state,
        read_lerobot_training_step as read_lerobot_training_step,
    )
    from ckpt_tools.state.lerobot_save import (
        read_named_optimizer_state as read_named_optimizer_state,
        write_lerobot_training_state as write_lerobot_training_state,
    )
    from ckpt_tools.state.resume_plan import (
        ResumePlan as ResumePlan,
        RunShape as RunShape,
        plan_resume as plan_resume,
    )
    from ckpt_tools.state.rng import load_rng_state as load_rng_state, save_rng_state as save_rng_state
    from ckpt_tools.state.save import (
        PendingCheckpoint as PendingCheckpoint,
        SaveRequest as SaveRequest,
        prepare_save_groups as prepare_save_groups,
        save_checkpoint as save_checkpoint,
        start_checkpoint as start_checkpoint,
    )
    from ckpt_tools.state.training_load import (
        load_model_weights as load_model_weights,
        load_training_state as load_training_state,
    )
# isort: on

# public name -> the module that defines it (mypy --strict checks these modules: noxfile.py typecheck)
_EXPORTS: dict[str, str] = {
    # saving
    "prepare_save_groups": "ckpt_tools.state.save",
    "SaveRequest": "ckpt_tools.state.save",
    "save_checkpoint": "ckpt_tools.state.save",
    "start_checkpoint": "ckpt_tools.state.save",
    "PendingCheckpoint": "ckpt_tools.state.save",
    "save_rng_state": "ckpt_tools.state.rng",
    "SaveFailedError": "ckpt_tools.errors",
    "main_decides": "ckpt_tools.state.collective",
    # a run's evaluated steps
    "write_scores": "ckpt_tools.files.scores",
    "point_best": "ckpt_tools.files.scores",
    "prune_steps": "ckpt_tools.files.commit",
    # resuming: the plan before prepare, the state after
    "Topology": "ckpt_tools.format.meta",
    "SamplerPosition": "ckpt_tools.format.meta",
    "RunShape": "ckpt_tools.state.resume_plan",
    "ResumePlan": "ckpt_tools.state.resume_plan",
    "plan_resume": "ckpt_tools.state.resume_plan",
    "ResumeRefusedError": "ckpt_tools.errors",
    "load_rng_state": "ckpt_tools.state.rng",
    "load_training_state": "ckpt_tools.state.training_load",
    "load_model_weights": "ckpt_tools.state.training_load",
    # continuing a LeRobot run (docs/resume.md): its step, RNG and state under LeRobot's names
    "is_lerobot_checkpoint": "ckpt_tools.state.lerobot_load",
    "check_lerobot_resumable": "ckpt_tools.state.lerobot_load",
    "read_lerobot_training_step": "ckpt_tools.state.lerobot_load",
    "load_lerobot_rng_state": "ckpt_tools.state.lerobot_load",
    "load_lerobot_training_state": "ckpt_tools.state.lerobot_load",
    # the way back: a step of ours as LeRobot main's (trainer export --lerobot_step)
    "read_named_optimizer_state": "ckpt_tools.state.lerobot_save",
    "write_lerobot_training_state": "ckpt_tools.state.lerobot_save",
}
_MODULES: dict[str, str] = {}

__all__ = sorted(_EXPORTS)

if not TYPE_CHECKING:  # to a type checker, a module __getattr__ would make every misspelt name `Any`
    __getattr__ = _lazy.loader(__name__, _EXPORTS, _MODULES)


def __dir__() -> list[str]:
    return __all__
