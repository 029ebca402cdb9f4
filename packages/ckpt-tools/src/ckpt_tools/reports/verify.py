"""`ckpt verify`: is a checkpoint complete and self-consistent, from metadata alone?

Every check runs even after one fails, so a damaged checkpoint is explained in one pass: the files its
`checkpoint_format` requires, the JSON side files, every safetensors header (byte ranges inside the
file), every DCP chunk table (chunks tile each tensor without gaps or overlaps, records lie inside
their `.distcp` files without sharing bytes, each missing or short file named), processor step files,
adapter files, agreement of names, shapes and dtypes between the formats when a checkpoint holds more
than one, and the `last` pointer a path goes through. The tensor checks (headers, chunk tables,
formats agreeing) are in `verify_groups`; every finding is keyed by the file it is about (`findings`),
so the manifest's check names only files no other check found fault with.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from ckpt_tools.catalog import (
    ADAPTER,
    DCP,
    LEROBOT,
    MODEL,
    OPTIMIZER,
    SAFETENSORS,
    SAFETENSORS_FILE,
    SHARDED_SAFETENSORS,
    WeightSet,
    catalog,
)
from ckpt_tools.errors import CheckpointError, CorruptCheckpointError, Finding, NotACheckpointError, one_line
from ckpt_tools.files import commit, locate, storage
from ckpt_tools.files.manifest import manifest_problems
from ckpt_tools.files.safetensors_io import read_safetensors_header
from ckpt_tools.format import layout
from ckpt_tools.format.adapter_config import adapter_config_problems
from ckpt_tools.format.meta import CheckpointFormat, LeRobotStep, TrainingStep
from ckpt_tools.reports.describe import TensorGroup
from ckpt_tools.reports.findings import Findings
from ckpt_tools.reports.verify_groups import compare_formats, verify_groups


@dataclass(frozen=True)
class VerifyReport:
    """`checked` names what passed; `problems` holds one line per problem found (empty when OK)."""

    path: str
    checked: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "ok": self.ok,
            "checked": list(self.checked),
            "problems": list(self.problems),
        }


def verify_checkpoint(path: str | os.PathLike[str], *, deep: bool = False) -> VerifyReport:
    """Check a step directory, `last`, an output_dir, a model directory or one `.safetensors` file.

    A step with a manifest (`manifest.json`) also has every listed file's size checked, and with
    `deep` its bytes re-hashed: each changed file is named. Raises only when there is nothing to
    verify (missing path, not a checkpoint); every other problem is listed in the report.
    """
    text = os.fspath(path)
    findings = Findings()
    try:
        target = commit.follow_pointers(text)
    except CorruptCheckpointError as exc:  # `last` leads nowhere a reader may go: that is the finding
        return VerifyReport(text, (), (one_line(exc, expected=(Exception,)),))
    if target != text.rstrip("/"):
        pointer = layout.BEST if f"/{layout.BEST}/" in f"/{text.rstrip('/')}/" else layout.LAST
        findings.checked.append(f"{pointer} names a step directory inside {layout.CHECKPOINTS_DIR}/")
    with storage.listed(target):  # on a bucket: one listing instead of a request per file asked about
        return _verify_target(text, target, findings, deep)


def _verify_target(text: str, target: str, findings: Findings, deep: bool) -> VerifyReport:
    cat = catalog(target)
    if cat.layout == SAFETENSORS_FILE:
        findings.run(f"{target}: safetensors header", read_safetensors_header, target, about=target)
        return VerifyReport(text, tuple(findings.checked), findings.problems)
    step_dir, model_dir, state_dir = cat.step_dir, cat.model_dir, cat.state_dir
    locations = list(cat.weight_sets)
    if layout.name(target) == layout.PRETRAINED_MODEL_DIR:  # the weights only (docs/format.md)
        state_dir = None
        locations = [w for w in locations if w.role != OPTIMIZER]
    has_state = state_dir is not None and storage.exists(state_dir)
    if not locations and not has_state:
        raise NotACheckpointError(
            f"{text} holds no model weights and no {layout.TRAINING_STATE_DIR}/: nothing to verify; pass a "
            f"step directory, checkpoints/{layout.LAST} or a {layout.PRETRAINED_MODEL_DIR}/ directory"
        )
    if state_dir and not has_state:
        findings.add(state_dir, f"{state_dir} is missing: the step directory is incomplete")
    step = None
    if has_state and step_dir and state_dir:
        if cat.layout == LEROBOT:
            _verify_lerobot_state(findings, state_dir, locations)
        else:
            step = _verify_training_state(findings, step_dir, state_dir)
    # --deep: the bytes of DCP records no manifest hashes (a bare DCP directory) are checked by CRC-32
    unhashed = deep and (step_dir is None or not storage.exists(layout.join(step_dir, layout.MANIFEST)))
    groups = verify_groups(findings, locations, records=unhashed)
    if cat.layout == LEROBOT:
        findings.extend_about(
            "optimizer state names the model's tensors", state_dir, _optimizer_fqn_problems(groups)
        )
    _check_required(findings, step, locations, model_dir, state_dir)
    _verify_side_files(findings, model_dir, locations)
    compare_formats(findings, groups)
    if step_dir is not None:
        only = layout.PRETRAINED_MODEL_DIR if state_dir is None else None
        _verify_manifest(findings, step_dir, deep, only)
    root = (step_dir or model_dir).rstrip("/") + "/"
    checked = tuple(item.removeprefix(root) for item in findings.checked)
    return VerifyReport(text, checked, findings.problems)


# --- training state --------------------------------------------------------------------------------


def _verify_training_state(findings: Findings, step_dir: str, state_dir: str) -> TrainingStep | None:
    step = None
    step_file = layout.join(state_dir, layout.TRAINING_STEP)
    if _require(findings, step_file, "the step directory is incomplete"):
        step = findings.run(layout.TRAINING_STEP, locate.read_training_step, step_dir, about=step_file)
    rng = layout.join(state_dir, layout.RNG_STATE)
    if storage.exists(rng):
        findings.run(layout.RNG_STATE, read_safetensors_header, rng, about=rng)
    else:
        findings.add(rng, f"{rng} is missing: a resume could not restore the random state")
    for name, kind in (
        (layout.SCHEDULER_STATE, dict),
        (layout.SCALER_STATE, dict),
        (layout.OPTIMIZER_PARAM_GROUPS, list),
    ):
        _check_json_if_present(findings, layout.join(state_dir, name), kind)
    if step is not None and step.mixed_precision == "fp16":
        _require(
            findings, layout.join(state_dir, layout.SCALER_STATE), "an fp16 run needs its loss-scaler state"
        )
    return step


def _verify_manifest(findings: Findings, step_dir: str, deep: bool, only: str | None) -> None:
    """Sizes (and with `deep` digests) of the files the save listed; nothing for a step without one.
    A file another check already found fault with is not named twice (compared by path)."""
    manifest = layout.join(step_dir, layout.MANIFEST)
    problems = findings.run(layout.MANIFEST, manifest_problems, step_dir, deep, only, about=manifest)
    if problems is not None:
        fresh = [finding for finding in problems if not findings.reported(finding.path)]
        findings.extend("sha256 of every listed file" if deep else "size of every listed file", fresh)


def _verify_lerobot_state(findings: Findings, state_dir: str, locations: list[WeightSet]) -> None:
    """LeRobot's `training_state/`: its step file, RNG state and optimizer, all present and readable.
    A sharded run of LeRobot main keeps its optimizer as the DCP directory `optimizer_0/` (checked
    with the other DCP directories); every other run as `optimizer_state.safetensors` +
    `optimizer_param_groups.json`."""
    source = layout.join(state_dir, layout.TRAINING_STEP)
    findings.run(layout.TRAINING_STEP, _read_lerobot_step, source, about=source)
    names = [layout.RNG_STATE]
    if not any((loc.role, loc.format) == (OPTIMIZER, DCP) for loc in locations):
        names.append(layout.OPTIMIZER_SAFETENSORS)
        if _require(findings, layout.join(state_dir, layout.OPTIMIZER_PARAM_GROUPS), "LeRobot writes it too"):
            _check_json_if_present(findings, layout.join(state_dir, layout.OPTIMIZER_PARAM_GROUPS), list)
    for name in names:
        path = layout.join(state_dir, name)
        if _require(findings, path, "LeRobot writes it with every checkpoint"):
            findings.run(name, read_safetensors_header, path, about=path)


def _optimizer_fqn_problems(groups: list[TensorGroup]) -> list[str]:
    """LeRobot's sharded optimizer keys its state by the model's FQNs
    (`optimizer.state.model.action_head.weight.exp_avg`): each one must name a model tensor, and a
    moment must have that tensor's shape, or a resume would put it on the wrong parameter."""
    model = next((g for g in groups if g.role == MODEL), None)
    optimizer = next((g for g in groups if (g.role, g.format) == (OPTIMIZER, DCP)), None)
    if model is None or optimizer is None:
        return []
    shapes = {t.name: t.shape for t in model.tensors}
    problems = []
    for tensor in optimizer.tensors:
        _, _, key = tensor.name.partition("state.")
        fqn, _, state = key.rpartition(".")
        if fqn not in shapes:
            problems.append(
                f"{optimizer.path}: {tensor.name} is state of {fqn!r}, which the model does not hold"
            )
        elif state != "step" and tensor.shape != shapes[fqn]:
            problems.append(
                f"{optimizer.path}: {tensor.name} has shape {list(tensor.shape)}, but {fqn} has "
                f"{list(shapes[fqn])}"
            )
    return problems[:_MAX_NAMED] + (
        [f"... and {len(problems) - _MAX_NAMED} more"] if len(problems) > _MAX_NAMED else []
    )


_MAX_NAMED = 5
"""Findings named one by one before the rest are counted: a wholly mismatched optimizer is one problem."""


def _read_lerobot_step(source: str) -> LeRobotStep:
    data = storage.read_json_object(source)
    return LeRobotStep.from_dict(data, source)


def _check_required(
    findings: Findings,
    step: TrainingStep | None,
    locations: list[WeightSet],
    model_dir: str,
    state_dir: str | None,
) -> None:
    """The files `checkpoint_format` (and the topology, for the optimizer) say must exist."""
    present = {(loc.role, loc.format) for loc in locations}
    if step is None:
        bare_dcp = any(loc.format == DCP and loc.path == model_dir for loc in locations)
        if not bare_dcp and not any(loc.role in (MODEL, ADAPTER) for loc in locations):
            findings.add(model_dir, f"{model_dir} holds no model weights")
        return  # a DCP directory passed on its own (an optimizer_0/ too) is checked as what it holds
    role = ADAPTER if step.peft else MODEL
    fmt = step.checkpoint_format
    if CheckpointFormat(fmt).has_safetensors and not present & {
        (role, SAFETENSORS),
        (role, SHARDED_SAFETENSORS),
    }:
        path = layout.join(model_dir, layout.ADAPTER_SAFETENSORS if step.peft else layout.MODEL_SAFETENSORS)
        findings.add(path, f"{path} is missing; checkpoint_format is {fmt!r}")
    if CheckpointFormat(fmt).has_dcp and (role, DCP) not in present:
        path = layout.join(model_dir, layout.ADAPTER_DCP_DIR if step.peft else layout.MODEL_DCP_DIR)
        findings.add(path, f"{path}/ is missing; checkpoint_format is {fmt!r}")
    if state_dir is not None:
        _check_optimizer_files(findings, step, present, state_dir)


def _check_optimizer_files(
    findings: Findings, step: TrainingStep, present: set[tuple[str, str]], state_dir: str
) -> None:
    if (OPTIMIZER, DCP) in present:
        return
    gathered = layout.join(state_dir, layout.OPTIMIZER_SAFETENSORS)
    if step.topology.is_sharded and storage.exists(gathered):
        findings.add(
            gathered,
            f"{state_dir} holds a gathered {layout.OPTIMIZER_SAFETENSORS} from a sharded run (an older "
            "release's layout): it cannot be resumed; its weights still load (--policy.path)",
        )
        return
    if step.topology.is_sharded:
        shards = layout.join(state_dir, layout.OPTIMIZER_DCP_DIR)
        findings.add(
            shards,
            f"{shards}/ is missing; a sharded run ({step.topology.describe()}) stores its optimizer as "
            "DCP shards",
        )
        return
    _require(findings, layout.join(state_dir, layout.OPTIMIZER_SAFETENSORS), "the optimizer state is missing")
    _require(
        findings, layout.join(state_dir, layout.OPTIMIZER_PARAM_GROUPS), "the optimizer state is missing"
    )


def _verify_side_files(findings: Findings, model_dir: str, locations: list[WeightSet]) -> None:
    for name in (layout.POLICY_CONFIG, layout.TRAIN_CONFIG, layout.ADAPTER_CONFIG):
        _check_json_if_present(findings, layout.join(model_dir, name), dict)
    adapter_config = layout.join(model_dir, layout.ADAPTER_CONFIG)
    if storage.exists(adapter_config):
        findings.extend_about(
            "adapter_config.json fields", adapter_config, _adapter_config_problems(adapter_config)
        )
    has_adapter = any(loc.role == ADAPTER for loc in locations)
    if has_adapter:
        _require(findings, adapter_config, "adapter weights need their config")
    elif storage.exists(adapter_config):
        findings.add(
            adapter_config,
            f"{adapter_config} has no adapter weights beside it "
            f"({layout.ADAPTER_SAFETENSORS} or {layout.ADAPTER_DCP_DIR}/): the adapter is incomplete",
        )
    names = storage.list_names(model_dir)
    for processor in (layout.PREPROCESSOR, layout.POSTPROCESSOR):
        _verify_processor(findings, model_dir, processor, names)


def _verify_processor(findings: Findings, model_dir: str, processor: str, names: list[str]) -> None:
    """A processor is `<name>.json` plus `<name>_step_0..N-1.safetensors`, numbered without gaps."""
    config_name = layout.processor_config_name(processor)
    pattern = re.compile(rf"^{re.escape(processor)}_step_(\d+)\.safetensors$")
    indices = sorted(int(match[1]) for name in names if (match := pattern.match(name)))
    config = layout.join(model_dir, config_name)
    if config_name not in names:
        if indices:
            findings.add(
                config, f"{config} is missing: {len(indices)} {processor} step file(s) have no config"
            )
        return
    _check_json_if_present(findings, config, dict)
    named = findings.run(f"{processor} state files", _named_state_files, config, about=config)
    if named:
        _verify_named_state_files(findings, model_dir, processor, [n for n in named if n])
        return
    gaps = sorted(set(range(indices[-1] + 1)) - set(indices)) if indices else []
    missing = [layout.join(model_dir, layout.processor_step_name(processor, index)) for index in gaps]
    findings.extend(
        f"{processor} steps",
        (
            Finding(
                path, f"{path} is missing: {processor} steps must be numbered 0..{indices[-1]} without gaps"
            )
            for path in missing
        ),
    )
    for index in indices:
        name = layout.processor_step_name(processor, index)
        path = layout.join(model_dir, name)
        findings.run(name, read_safetensors_header, path, about=path)


def _named_state_files(config_path: str) -> list[str | None] | None:
    try:
        config = storage.read_json(config_path)
    except CheckpointError:
        return None  # already reported as invalid JSON
    return layout.named_state_files(config, config_path)


def _verify_named_state_files(findings: Findings, model_dir: str, processor: str, names: list[str]) -> None:
    """Each state file a processor config names (LeRobot's `state_file`) exists and reads."""
    for name in names:
        path = layout.join(model_dir, name)
        if _require(
            findings, path, f"{layout.processor_config_name(processor)} names it as a step's state_file"
        ):
            findings.run(name, read_safetensors_header, path, about=path)


def _adapter_config_problems(path: str) -> list[str]:
    """The fields a merge reads (scale, ranks, patterns); an unreadable file is the JSON check's."""
    try:
        config = storage.read_json(path)
    except CheckpointError:
        return []
    return adapter_config_problems(config, path) if isinstance(config, dict) else []


def _require(findings: Findings, path: str, why: str) -> bool:
    """Record a problem when `path` is missing; return whether it exists."""
    if storage.exists(path):
        return True
    findings.add(path, f"{path} is missing: {why}")
    return False


def _check_json_if_present(findings: Findings, path: str, kind: type[object]) -> None:
    """A JSON side file, when present, parses to the kind the format gives it (object or list)."""
    if not storage.exists(path):
        return
    try:
        data = storage.read_json(path)
    except CheckpointError as exc:
        findings.add(path, one_line(exc, expected=(Exception,)))
        return
    if not isinstance(data, kind):
        expected = "an object" if kind is dict else "a list"
        findings.add(path, f"{path} must hold {expected}, not {type(data).__name__}; the file is damaged")
        return
    findings.checked.append(layout.name(path))
