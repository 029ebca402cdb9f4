"""Resume in one process, without a launch: finding the checkpoint, the saved config under new flags,
phase 1 (plan, warning, RNG, sampler) and phase 2 (model, optimizer, scheduler, loss scaler), and
the one-line refusals of legacy, future and foreign checkpoints.

The multi-process behaviour (bit-exactness, resharding, crashes) is in tests/distributed/test_resume.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from ckpt_tools.tensors.tensor_io import read_safetensors
from ckpt_tools.training import Topology
from helpers.pickle_payload import malicious_dcp_metadata
from helpers.run_outputs import model_file
from trainer.cli.parse import parse_config
from trainer.config.train import encode_config
from trainer.data.pipeline.processors import build_processors
from trainer.data.pipeline.sampler import GlobalOrderSampler
from trainer.engine.checkpoint import resume, saving
from trainer.engine.plan import (
    resolve_policy_features,
    saving_section,
    settle_batch_size,
    settle_checkpoint_format,
    settle_parallelism,
)
from trainer.errors import ConfigError
from trainer.policies import build_policy

SINGLE = Topology()


def flags(out: Path, cache: str, *extra: str) -> list[str]:
    return [
        "--policy.type=mlp",
        "--policy.hidden_dim=16",
        "--dataset.episodes=1",
        f"--dataset.cache_dir={cache}",
        "--batch_size=8",
        "--steps=10",
        f"--output_dir={out}",
        *extra,
    ]


class Parts:
    """What train() builds before prepare(), without an Accelerator."""

    def __init__(self, args: list[str]) -> None:
        parsed = parse_config(args)
        self.dataset = parsed.dataset.load()
        self.config = parsed.derive(policy=resolve_policy_features(parsed.policy, self.dataset))  # as planned
        self.policy = build_policy(self.config.policy, self.dataset.obs_dim, self.dataset.action_dim)
        self.optimizer = self.config.optimizer.build(self.policy.parameters())
        self.scheduler = self.config.scheduler.build(self.optimizer, self.config.steps)
        self.sampler = GlobalOrderSampler(len(self.dataset), self.config.batch_size, 1, 0, self.config.seed)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=3)

    def train_steps(self, steps: int) -> None:
        pre, _ = build_processors(self.dataset.stats())
        for _ in range(steps):
            batch = pre(self.dataset.gather(self.sampler.next_indices(), self.config.policy.chunk_size))
            loss, _ = self.policy(batch)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad()
            self.scheduler.step()

    def save(self, step: int) -> str:
        pre, post = build_processors(self.dataset.stats())
        state = saving.training_step(saving_section(self.config), SINGLE, step, self.sampler.position)
        return saving.save(
            saving_section(self.config),
            state,
            model=self.policy,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            scaler=self.scaler,
            preprocessor=pre,
            postprocessor=post,
        )


@contextlib.contextmanager
def kept_rng() -> Iterator[None]:
    """Phase 1 sets the process's global RNG streams: put them back for the tests that follow."""
    python, numpy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng():
        yield
    random.setstate(python)
    np.random.set_state(numpy)


@pytest.fixture
def keep_rng():
    with kept_rng():
        yield


@pytest.fixture(scope="module")
def saved(tmp_path_factory, keep_rng_module) -> tuple[Parts, str]:
    """A run that trained 3 steps and saved (step 3 is `last`); its objects as they were at the save."""
    root = tmp_path_factory.mktemp("resume_run")
    parts = Parts(flags(root / "run", str(root / "cache")))
    parts.train_steps(3)
    return parts, parts.save(3)


@pytest.fixture(scope="module")
def keep_rng_module():
    with kept_rng():
        yield


def copy_run(saved_dir: str, tmp_path: Path) -> Path:
    """A private copy of the saved run's output_dir (tests that damage files)."""
    out = tmp_path / "copy"
    shutil.copytree(Path(saved_dir).parent.parent, out, symlinks=True)
    return out


# ---------------------------------------------------------------------------------- finding it


def test_resume_with_only_output_dir_uses_the_saved_config_and_flags_override(saved):
    parts, step_dir = saved
    out = parts.config.output_dir
    config = parse_config(["--resume=true", f"--output_dir={out}", "--batch_size=4"])
    assert config.policy.hidden_dim == 16 and config.steps == 10  # from train_config.json, not defaults
    assert config.batch_size == 4  # the command line wins
    assert resume.find_checkpoint(config.config_path, config.output_dir) == step_dir


def test_config_path_through_last_names_the_step(saved):
    parts, step_dir = saved
    via_last = model_file(Path(parts.config.output_dir), name="train_config.json")
    config = parse_config(["--resume=true", f"--config_path={via_last}"])
    assert resume.find_checkpoint(config.config_path, config.output_dir) == step_dir


def test_resume_before_the_first_save_starts_fresh(tmp_path, saved):
    parts, _ = saved
    config = parse_config(flags(tmp_path / "new", parts.config.dataset.cache_dir, "--resume=true"))
    point = resume.before_prepare(saving_section(config), SINGLE, parts.policy, parts.sampler, 0, 1)
    assert point.step_dir is None and point.start_step == 0
    assert point.message == f"--resume=true: no checkpoint under {config.output_dir}: starting a fresh run"


def dcp_run_config(tmp_path: Path) -> Path:
    """The train_config.json an FSDP2 run with DCP checkpoints saves."""
    config = parse_config(["--parallelism.dp_shard=2", "--checkpoint_format=dcp"])
    path = tmp_path / "train_config.json"
    path.write_text(json.dumps(encode_config(config)))
    return path


def test_dcp_format_from_the_saved_config_becomes_safetensors_on_a_non_sharded_resume(tmp_path):
    saved = dcp_run_config(tmp_path)
    for topology in (SINGLE, Topology(dp_replicate=2)):
        config = parse_config(["--resume=true", f"--config_path={saved}", "--parallelism.dp_shard=1"])
        checkpoint_format, note = settle_checkpoint_format(config, topology)
        assert checkpoint_format == "safetensors" and config.checkpoint_format == "dcp"  # not edited
        assert note == (
            "--checkpoint_format=dcp of the saved config needs a sharded run; "
            f"this {topology.describe()} run saves --checkpoint_format=safetensors"
        )


def test_dcp_format_is_kept_on_a_sharded_resume_and_refused_when_typed_on_a_non_sharded_one(tmp_path):
    saved = dcp_run_config(tmp_path)
    sharded = parse_config(["--resume=true", f"--config_path={saved}"])
    assert settle_checkpoint_format(sharded, Topology(dp_shard=2)) == ("dcp", "")
    for args in (
        ["--resume=true", "--checkpoint_format=dcp"],  # chosen on the command line
        [],  # not a resume: the saved config is the new run's own choice
    ):
        config = parse_config([f"--config_path={saved}", "--parallelism.dp_shard=1", *args])
        with pytest.raises(
            ConfigError, match=r"--checkpoint_format=dcp needs a sharded run \(single process"
        ):
            settle_checkpoint_format(config, SINGLE)


# -------------------------------------------------------------------------------------- phase 1


def fresh_parts(saved_parts: Parts, *extra: str) -> Parts:
    out = saved_parts.config.output_dir
    return Parts(["--resume=true", f"--output_dir={out}", *extra])


def test_phase1_restores_sampler_and_rng_and_is_silent_when_nothing_changed(saved, keep_rng):
    parts, step_dir = saved
    new = fresh_parts(parts)
    point = resume.before_prepare(saving_section(new.config), SINGLE, new.policy, new.sampler, 0, 1)
    assert point.step_dir == step_dir and point.start_step == 3
    assert new.sampler.position == parts.sampler.position == (0, 24)
    assert point.changes == [] and "warning" not in point.message
    saved_rng, _ = read_safetensors(f"{step_dir}/training_state/rng_state.safetensors")
    assert torch.equal(torch.get_rng_state(), saved_rng["rank0/torch"])


def test_changed_global_batch_warns_once_about_sample_exactness(saved, keep_rng):
    parts, _ = saved
    new = fresh_parts(parts, "--batch_size=4")
    point = resume.before_prepare(saving_section(new.config), SINGLE, new.policy, new.sampler, 0, 1)
    assert point.changes == [
        "batch_size 8 -> 4",
        "effective batch 8 -> 4 (the learning rate is not rescaled)",
    ]
    assert point.message.count("warning:") == 1
    assert "global batch changed" in point.message
    assert "--global_batch_size" not in point.message  # the user chose it: no hint
    assert new.sampler.position == (0, 24)  # same sample offset, grouped into smaller steps
    assert point.record()["batch"] == {
        "saved": {"batch_size": 8, "dp_world_size": 1, "global_batch_size": 8, "grad_accum_steps": 1},
        "now": {"batch_size": 4, "dp_world_size": 1, "global_batch_size": 4, "grad_accum_steps": 1},
    }


def test_global_batch_changed_by_the_ranks_alone_names_the_flag_that_keeps_it(saved, tmp_path, keep_rng):
    """A run saved on 2 DDP ranks resumed on one process with the same --batch_size: the global batch
    halves, and the warning names --global_batch_size (docs/resume.md, elastic restarts)."""

    def two_ranks(data):
        data.update(dp_world_size=2)
        data["topology"].update(dp_replicate=2)

    out = copy_run(saved[1], tmp_path)
    rewrite_training_step(out, two_ranks)
    new = Parts(["--resume=true", f"--output_dir={out}"])
    point = resume.before_prepare(saving_section(new.config), SINGLE, new.policy, new.sampler, 0, 1)
    assert (
        "the global batch follows the number of ranks (2 -> 1); --global_batch_size=16 keeps" in point.message
    )
    record = point.record()
    assert record["event"] == "resume" and record["step"] == 3 and record["sample_exact"] is False
    assert (
        record["batch"]["saved"]["global_batch_size"] == 16
        and record["batch"]["now"]["global_batch_size"] == 8
    )


# -------------------------------------------------------------------------------------- phase 2


def test_phase2_restores_model_optimizer_scheduler_and_scaler(saved, keep_rng):
    parts, _ = saved
    new = fresh_parts(parts)
    point = resume.before_prepare(saving_section(new.config), SINGLE, new.policy, new.sampler, 0, 1)
    resume.after_prepare(
        point, model=new.policy, optimizer=new.optimizer, scheduler=new.scheduler, scaler=new.scaler
    )
    for (name, got), want in zip(
        new.policy.state_dict().items(), parts.policy.state_dict().values(), strict=True
    ):
        assert torch.equal(got, want), name
    assert new.scheduler.state_dict() == parts.scheduler.state_dict()
    assert new.scheduler.get_last_lr() == parts.scheduler.get_last_lr()
    assert new.scaler.state_dict() == parts.scaler.state_dict()
    got, want = new.optimizer.state_dict(), parts.optimizer.state_dict()
    assert got["param_groups"] == want["param_groups"]
    for index, entry in want["state"].items():
        for key, value in entry.items():
            assert torch.equal(got["state"][index][key], value), (index, key)


# ------------------------------------------------------------------------------------- refusals


def rewrite_training_step(out: Path, edit) -> None:
    path = out / "checkpoints" / "000003" / "training_state" / "training_step.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def refusal(parts: Parts, out: Path, *extra: str) -> str:
    new = Parts(["--resume=true", f"--output_dir={out}", *extra])
    with pytest.raises(ConfigError) as caught:
        point = resume.before_prepare(saving_section(new.config), SINGLE, new.policy, new.sampler, 0, 1)
        resume.after_prepare(
            point, model=new.policy, optimizer=new.optimizer, scheduler=new.scheduler, scaler=None
        )
    message = str(caught.value)
    assert "\n" not in message and message.startswith("cannot resume from ")
    return message


def test_legacy_checkpoint_is_refused_in_one_line(saved, tmp_path, keep_rng):
    out = copy_run(saved[1], tmp_path)
    rewrite_training_step(out, lambda data: data.pop("format_version"))
    assert "older release and cannot be resumed" in refusal(saved[0], out)


def test_future_format_version_is_refused(saved, tmp_path, keep_rng):
    out = copy_run(saved[1], tmp_path)
    rewrite_training_step(out, lambda data: data.update(format_version=99))
    assert "upgrade ckpt-tools" in refusal(saved[0], out)


def test_sharded_checkpoint_with_a_gathered_optimizer_is_refused(saved, tmp_path, keep_rng):
    """An older release's sharded checkpoint: full optimizer state instead of optimizer_0/."""

    def sharded(data):
        data.update(dp_world_size=2)
        data["topology"].update(dp_shard=2)

    out = copy_run(saved[1], tmp_path)
    rewrite_training_step(out, sharded)
    assert "cannot be resumed" in refusal(saved[0], out)


def test_weights_of_another_architecture_are_refused_before_loading(saved, tmp_path, keep_rng):
    message = refusal(saved[0], Path(saved[0].config.output_dir), "--policy.hidden_dim=8")
    assert "do not fit this policy" in message and "resized" in message


def test_cli_reports_a_refused_resume_in_one_line(saved, tmp_path, keep_rng, clean_accelerate, capsys):
    """Through `trainer train`: exit 1 and one `error:` line, no traceback."""
    from trainer.cli import main

    out = copy_run(saved[1], tmp_path)
    rewrite_training_step(out, lambda data: data.pop("format_version"))
    with pytest.raises(SystemExit) as exited:
        main(["train", "--resume=true", f"--output_dir={out}"])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"error: cannot resume from {out}/checkpoints/000003: ")


def _plant_optimizer(step: Path) -> Path:
    return step / "training_state" / "optimizer_0"


def _plant_model(step: Path) -> Path:
    (step / "pretrained_model" / "model.safetensors").unlink()  # the DCP shards are the weights then
    return step / "pretrained_model" / "pytorch_model_fsdp_0"


def _plant_adapter(step: Path) -> Path:
    (step / "pretrained_model" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2}))
    return step / "pretrained_model" / "adapter_model_fsdp_0"


@pytest.mark.parametrize(
    "plant", [_plant_optimizer, _plant_model, _plant_adapter], ids=["optim", "model", "adapter"]
)
def test_resume_refuses_a_crafted_metadata_without_running_it(
    saved, tmp_path, keep_rng, clean_accelerate, capsys, plant
):
    """`trainer train --resume`: torch's DCP reader would unpickle these `.metadata` files as they are."""
    from trainer.cli import main

    out = copy_run(saved[1], tmp_path)
    target = tmp_path / "payload_ran"
    dcp_dir = plant(out / "checkpoints" / "000003")
    dcp_dir.mkdir()
    (dcp_dir / ".metadata").write_bytes(malicious_dcp_metadata(target))
    with pytest.raises(SystemExit) as exited:
        main(["train", "--resume=true", f"--output_dir={out}"])
    assert exited.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and f"{dcp_dir.name}/.metadata" in err and "refused" in err
    assert not target.exists()


def test_saved_layout_that_does_not_fit_the_new_world_keeps_its_kind(tmp_path):
    """The cluster shrank and nobody retyped the layout: a sharded run stays sharded over every rank."""
    saved = dcp_run_config(tmp_path)
    config = parse_config(["--resume=true", f"--config_path={saved}"])
    assert (config.parallelism.dp_replicate, config.parallelism.dp_shard) == (1, 2)
    parallelism, note = settle_parallelism(config, world_size=4)
    assert (parallelism.dp_replicate, parallelism.dp_shard) == (1, -1)
    assert (config.parallelism.dp_replicate, config.parallelism.dp_shard) == (1, 2)  # not edited
    assert note.startswith("the saved --parallelism.dp_replicate=1 --parallelism.dp_shard=2 does not fit 4")
    assert "this run is FSDP2 4" in note
    single = parse_config(["--resume=true", f"--config_path={saved}"])
    assert "this run is single process" in settle_parallelism(single, world_size=1)[1]


def test_saved_layout_is_kept_when_it_fits_or_when_typed(tmp_path):
    saved = dcp_run_config(tmp_path)
    fits = parse_config(["--resume=true", f"--config_path={saved}"])
    assert settle_parallelism(fits, world_size=2) == (fits.parallelism, "")
    typed = parse_config(["--resume=true", f"--config_path={saved}", "--parallelism.dp_shard=3"])
    assert settle_parallelism(typed, world_size=4) == (typed.parallelism, "")
    assert typed.parallelism.dp_shard == 3  # resolve_topology then refuses it with every degree named
    fresh = parse_config([f"--config_path={saved}"])
    assert settle_parallelism(fresh, world_size=4) == (fresh.parallelism, "")


def test_global_batch_size_sets_the_per_rank_batch_of_each_launch(tmp_path):
    """--global_batch_size is divided over each launch's data-parallel ranks (an elastic relaunch on
    fewer nodes repeats the same command); one that does not divide says what the run trains."""
    config = parse_config([f"--output_dir={tmp_path}", "--global_batch_size=16"])
    assert settle_batch_size(config, 2) == (8, "")
    assert settle_batch_size(config, 1) == (16, "")
    batch, note = settle_batch_size(config, 3)
    assert batch == 5 and note.startswith("--global_batch_size=16 does not divide over 3 data-parallel ranks")
    assert "5 x 3 = 15 samples per step" in note
    plain = parse_config([f"--output_dir={tmp_path}", "--batch_size=4"])
    assert settle_batch_size(plain, 3) == (4, "")  # without it, --batch_size is per rank as always


def test_global_batch_size_with_a_typed_batch_size_is_refused(tmp_path):
    config = parse_config([f"--output_dir={tmp_path}", "--global_batch_size=16", "--batch_size=4"])
    with pytest.raises(ConfigError, match=r"--batch_size=4 and --global_batch_size=16 both set the batch"):
        settle_batch_size(config, 2)
    with pytest.raises(ConfigError, match="--global_batch_size must be >= 0"):
        parse_config([f"--output_dir={tmp_path}", "--global_batch_size=-1"])


def test_a_lerobot_run_is_refused_in_one_line(tmp_path, clean_accelerate, capsys):
    """`trainer train --resume` on the output directory `lerobot-train` wrote (the shared fixture):
    refused before its config (LeRobot's, not ours) is parsed, in one line that names LeRobot."""
    from helpers.fixtures import copy_fixture
    from trainer.cli import main

    out = copy_fixture(tmp_path, "lerobot", "checkpoint_act")
    with pytest.raises(SystemExit) as exited:
        main(["train", "--resume=true", f"--output_dir={out}"])
    assert exited.value.code == 1
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and "\n" not in err
    assert err.startswith(f"error: cannot resume from {out}/checkpoints/000004: ") and "by LeRobot" in err


# ------------------------------------------------------------------------------ a broken `last`

BROKEN_LAST = {
    "fifo": os.mkfifo,
    "directory": lambda path: path.mkdir(),
    "self-link": lambda path: path.symlink_to("last"),
    "missing-step": lambda path: path.symlink_to("000009"),
    "not-utf8": lambda path: path.write_bytes(b"\xff\xfe"),
}


@pytest.mark.parametrize("kind", list(BROKEN_LAST))
def test_a_broken_last_refuses_the_resume_and_keeps_every_step(
    saved, tmp_path, keep_rng, clean_accelerate, capsys, kind
):
    """`last` that is not a pointer to a complete step is a refusal, never "no checkpoint": a fresh
    start would train over the run, and its retention (--keep_last=1) delete the committed steps."""
    from trainer.cli import main

    out = copy_run(saved[1], tmp_path)
    (out / "checkpoints" / "last").unlink()
    BROKEN_LAST[kind](out / "checkpoints" / "last")
    with pytest.raises(SystemExit) as exited:
        main(["train", "--resume=true", f"--output_dir={out}", "--keep_last=1", "--steps=12"])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (
        err.strip().splitlines()[-1].startswith(f"error: cannot resume from {out}: {out}/checkpoints/last ")
    )
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["000003", "last"]


def test_a_broken_last_refuses_a_fresh_run_in_that_output_dir(saved, tmp_path):
    out = copy_run(saved[1], tmp_path)
    (out / "checkpoints" / "last").unlink()
    (out / "checkpoints" / "last").mkdir()
    config = parse_config(flags(out, saved[0].config.dataset.cache_dir))
    with pytest.raises(ConfigError, match=r"holds a broken checkpoint pointer: .*last is a directory"):
        saving.check_fresh_output_dir(config.output_dir, config.resume)


# ------------------------------------------------------- every resume input checked, one line each


def _with_metadata(path: Path, **changes: str | None) -> None:
    """Rewrite a safetensors file with metadata entries changed (None removes one)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), "pt") as handle:
        metadata = dict(handle.metadata() or {})
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    for key, value in changes.items():
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    save_file(tensors, str(path), metadata=metadata)


def _rng(**changes: str | None):
    return lambda state: _with_metadata(state / "rng_state.safetensors", **changes)


def _write(name: str, text: str):
    return lambda state: (state / name).write_text(text)


def _sparse(name: str, size: int):
    def make(state: Path) -> None:
        with (state / name).open("wb") as handle:
            handle.truncate(size)

    return make


def _step_record(**fields: object):
    def edit(state: Path) -> None:
        data = json.loads((state / "training_step.json").read_text())
        for key, value in fields.items():
            target, name = (data["sampler"], key[8:]) if key.startswith("sampler_") else (data, key)
            target[name] = value
        (state / "training_step.json").write_text(json.dumps(data))

    return edit


RESUME_DAMAGE = {
    "rng python deep": (_rng(**{"rank0/python": "[" * 100_000 + "]" * 100_000}), "nests JSON too deeply"),
    "rng python 5000 digits": (_rng(**{"rank0/python": "[" + "9" * 5000 + ", null]"}), "JSON cannot carry"),
    "rng python not JSON": (_rng(**{"rank0/python": "version three"}), "is not valid JSON"),
    "rng python wrong arity": (_rng(**{"rank0/python": "[3]"}), "not the 2 values a generator state"),
    "rng numpy wrong types": (_rng(**{"rank0/numpy": '[1, "a", 0, 0.0]'}), "not the 4 values"),
    "rng python missing": (_rng(**{"rank0/python": None}), "metadata lacks rank0/python"),
    "rng world_size huge": (_rng(world_size="9" * 5000), "metadata world_size is"),
    "rng version out of range": (_rng(**{"rank0/python": "[99, null]"}), "does not load"),
    "optimizer extras not objects": (
        lambda state: _with_metadata(state / "optimizer_state.safetensors", state_extras='{"0.weight": 5}'),
        "state_extras is",
    ),
    "param groups an object": (_write("optimizer_param_groups.json", '{"params": 1}'), "not a list of param"),
    "param groups a string lr": (
        lambda state: _write(
            "optimizer_param_groups.json",
            json.dumps(
                [{**json.loads((state / "optimizer_param_groups.json").read_text())[0], "lr": "fast"}]
            ),
        )(state),
        "optimizer_param_groups.json[0]: lr is 'fast', expected a float",
    ),
    "param groups two groups": (
        _write("optimizer_param_groups.json", '[{"params": []}, {"params": []}]'),
        "holds 2 param groups and this optimizer 1",
    ),
    "scheduler a string step": (
        _write("scheduler_state.json", '{"last_epoch": "three"}'),
        "scheduler_state.json: last_epoch is 'three', expected a int",
    ),
    "scheduler a list": (_write("scheduler_state.json", "[]"), "expected a JSON object"),
    "scheduler 150 MB": (_sparse("scheduler_state.json", 150 << 20), "is larger than 16777216 bytes"),
    "step 999 inside 000003": (_step_record(step=999), "records step 999 inside the step directory 000003"),
    "sampler offset beyond the dataset": (_step_record(sampler_offset=10**9), "sampler offset 1000000000"),
}


@pytest.mark.parametrize("case", list(RESUME_DAMAGE))
def test_every_resume_input_is_checked_in_one_line(saved, tmp_path, keep_rng, case):
    """Each damaged file is one `cannot resume from <step>: ...` line, before any step runs
    (RecursionError, ValueError, TypeError and MemoryError tracebacks before)."""
    damage, fragment = RESUME_DAMAGE[case]
    out = copy_run(saved[1], tmp_path)
    damage(out / "checkpoints" / "000003" / "training_state")
    new = Parts(["--resume=true", f"--output_dir={out}"])
    with pytest.raises(ConfigError) as caught:
        point = resume.before_prepare(saving_section(new.config), SINGLE, new.policy, new.sampler, 0, 1)
        resume.after_prepare(
            point, model=new.policy, optimizer=new.optimizer, scheduler=new.scheduler, scaler=new.scaler
        )
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"cannot resume from {out}/checkpoints/000003: ")
    assert fragment in message, message
    assert len(message) < 600


@pytest.mark.parametrize("text", ["[" * 100_000, '{"steps": 1' + "0" * 5000 + "}"], ids=["deep", "digits"])
def test_a_damaged_saved_train_config_is_one_line(saved, tmp_path, text):
    out = copy_run(saved[1], tmp_path)
    model_file(out, 3, "train_config.json").write_text(text)
    with pytest.raises(ConfigError) as caught:
        parse_config(["--resume=true", f"--output_dir={out}"])
    assert "\n" not in str(caught.value) and "train_config.json" in str(caught.value)


def test_a_real_resume_with_fewer_episodes_is_refused_at_its_sampler_offset(tmp_path, keep_rng):
    """Saved at sample offset 256 of a 400-sample epoch (2 episodes); resumed with 1 episode (200
    samples): one line naming the offset and the dataset, not a ValueError from the sampler."""
    parts = Parts(flags(tmp_path / "run", str(tmp_path / "cache"), "--dataset.episodes=2", "--batch_size=64"))
    parts.train_steps(4)
    parts.save(4)
    new = Parts(["--resume=true", f"--output_dir={tmp_path / 'run'}", "--dataset.episodes=1"])
    with pytest.raises(ConfigError) as caught:
        resume.before_prepare(saving_section(new.config), SINGLE, new.policy, new.sampler, 0, 1)
    message = str(caught.value)
    assert message.startswith(
        f"cannot resume from {tmp_path / 'run'}/checkpoints/000004: its sampler offset 256 "
    )
    assert "beyond this run's dataset of 200 samples" in message and "\n" not in message
