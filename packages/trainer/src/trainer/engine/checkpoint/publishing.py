"""End-of-training publish: `--policy.push_to_hub=true --policy.repo_id=namespace/name`.

The run's last checkpoint, saved collectively at the final step, is published with
`ckpt_tools.publish_model`: the model (or a PEFT run's adapter), the processors, config.json,
train_config.json and a model card carrying the final loss. A checkpoint holding only DCP shards
(`--checkpoint_format=dcp`) is converted to safetensors in place first, as `ckpt convert` would,
so every checkpoint format publishes. The main rank alone converts and uploads; the outcome is then
broadcast, so all ranks finish together or all raise the same one-line `PublishFailedError`.
A failed publish deletes nothing: the checkpoints stay, and `ckpt push` publishes them later.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import ckpt_tools
from trainer.config.sections import HubSection, SavingSection
from trainer.engine.checkpoint.hub_pushes import CheckpointPusher
from trainer.errors import USER_ERRORS, ConfigError, PublishFailedError
from trainer.reporting.metrics import Logger
from trainer.reporting.summary import RunSummary

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

# How long the other ranks wait for the main rank's upload: a large model over a slow link takes far
# longer than the process group's default collective timeout.
UPLOAD_TIMEOUT = timedelta(hours=6)


def check_publish_config(hub: HubSection) -> str | None:
    """Refuse at start what would fail at the end of a long run: a malformed Hub repo id, no Hub
    token in huggingface_hub's usual places (HF_TOKEN, `hf auth login`), --policy.private for an
    fsspec target. Returns a warning for a repo id that will not be used (LeRobot launch lines name
    one without --policy.push_to_hub and expect a publish)."""
    pushes = hub.publishes
    if hub.repo_id is not None and not pushes:
        return (
            f"warning: --policy.repo_id={hub.repo_id} is set but --policy.push_to_hub is false: nothing "
            "will be published (add --policy.push_to_hub=true, or publish later with `ckpt push`)"
        )
    if not pushes or hub.repo_id is None:
        return None
    if ckpt_tools.is_fsspec_target(hub.repo_id):
        if hub.private:
            raise ConfigError(
                f"--policy.private applies to Hub repos only, not to --policy.repo_id={hub.repo_id}"
            )
        return None
    from huggingface_hub import get_token
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(hub.repo_id)
    except HFValidationError as exc:
        raise ConfigError(f"--policy.repo_id={hub.repo_id}: {' '.join(str(exc).split())}") from None
    if "/" not in hub.repo_id:
        raise ConfigError(f"--policy.repo_id={hub.repo_id} needs a namespace: give namespace/name")
    if get_token() is None:
        flag = "--policy.push_to_hub=true" if hub.push_to_hub else "--save_checkpoint_to_hub=true"
        raise ConfigError(f"{flag} needs a Hub token with write access: set HF_TOKEN or run `hf auth login`")
    return None


def publish_final(
    section: SavingSection, summary: RunSummary, logger: Logger, pushes: CheckpointPusher | None = None
) -> None:
    """Collective: call on all ranks after the final checkpoint is saved.

    Waits for the main rank's checkpoint pushes (`pushes`, --save_checkpoint_to_hub), then publishes
    `summary.last_checkpoint` when --policy.push_to_hub is set. Raises `PublishFailedError` on every
    rank when the main rank's publish failed (a failed push is a warning, never an error).
    """
    if not section.hub.publishes:
        return
    with waiting_group(UPLOAD_TIMEOUT) as group:  # made before the upload, while every rank is here
        ckpt_tools.training.main_decides(
            lambda: _finish_on_main(section, summary, logger, pushes),
            error=PublishFailedError,
            expected=USER_ERRORS,
            group=group,
        )


def _finish_on_main(
    section: SavingSection, summary: RunSummary, logger: Logger, pushes: CheckpointPusher | None
) -> None:
    if pushes is not None:
        pushes.close()
    if section.hub.push_to_hub:
        _publish_on_main(section, summary, logger)


def _publish_on_main(section: SavingSection, summary: RunSummary, logger: Logger) -> None:
    """Convert a DCP-only checkpoint, then publish it; any failure is one `PublishFailedError` line."""
    from huggingface_hub.utils import disable_progress_bars

    step_dir, repo_id = summary.last_checkpoint, section.hub.repo_id
    disable_progress_bars()  # a run's log gets one line per publish, not upload bars
    try:
        if (
            step_dir is None or repo_id is None
        ):  # repo_id: checked by PolicyConfig; a step: every run saves its last
            raise ckpt_tools.PublishError("the run saved no checkpoint to publish")
        if not ckpt_tools.open_checkpoint(step_dir).publishable:
            logger.note(f"converting the DCP shards of {step_dir} to safetensors for publishing")
            ckpt_tools.convert_dcp_to_safetensors(step_dir, max_shard_size=section.shard_size)
        # a run that kept an EMA publishes it (what `trainer eval` and `load_policy` score by default)
        weights = ckpt_tools.open_checkpoint(step_dir).default_weights
        logger.note(f"publishing {step_dir} ({weights} weights) to {repo_id}")
        result = ckpt_tools.publish_model(
            step_dir,
            repo_id,
            private=section.hub.private,
            endpoint=os.environ.get("HF_ENDPOINT"),  # read now, not when huggingface_hub was imported
            extra_card_info=_card_extras(summary),
            weights=weights,
        )
    except Exception as exc:  # any failure must reach the other ranks, or they wait for ever
        # Not chained: a client exception carries the request, Authorization header included.
        detail = str(exc) if isinstance(exc, ckpt_tools.CheckpointError) else f"{type(exc).__name__}: {exc}"
        private = " --private" if section.hub.private else ""
        raise PublishFailedError(
            f"publishing {step_dir} to {repo_id} failed: {' '.join(detail.split())}; publish the intact "
            f"checkpoint later with `ckpt push {step_dir} {repo_id}{private}`"
        ) from None
    for remark in result.notes:
        logger.note(f"warning: {remark}")
    commit = f" at commit {result.commit_oid}" if result.commit_oid else ""
    logger.note(
        f"published {len(result.files)} files to {result.url}{commit}",
        event="publish",
        url=result.url,
        commit=result.commit_oid,
        files=result.files,
    )


def _card_extras(summary: RunSummary) -> dict[str, Any]:
    """What the run knows beyond its files: the final loss, and the evaluation returns when it ran."""
    extras: dict[str, Any] = {}
    if not math.isnan(summary.final_loss):
        extras["final_loss"] = summary.final_loss
    if summary.episodes > 0:
        extras["Evaluation return (policy / random torques)"] = (
            f"{summary.policy_return:.1f} / {summary.random_return:.1f}"
        )
    return extras


@contextlib.contextmanager
def waiting_group(timeout: timedelta | float) -> Iterator[ProcessGroup | None]:
    """Collective: a gloo group for an outcome the main rank takes long to reach (a publish's upload,
    the evaluator's last scores), made while every rank is here, with a timeout that outlasts it (the
    default group's would end the other ranks' wait too soon); None without a process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        yield None
        return
    seconds = timeout if isinstance(timeout, timedelta) else timedelta(seconds=timeout)
    group = dist.new_group(backend="gloo", timeout=seconds)
    try:
        yield group
    finally:
        dist.destroy_process_group(group)
