"""`trainer.load_policy`: every saved form of one checkpoint acts the same; `trainer eval` scores it."""

from __future__ import annotations

import json
import re
import runpy
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import ckpt_tools
import trainer
from ckpt_tools.cli import app as cli_app
from helpers.fixtures import REPO
from helpers.hf_cache import put_in_hub_cache
from helpers.lerobot_data import STATE, VELOCITY, write_dataset
from helpers.run_outputs import saved_model
from trainer.cli import app as cli
from trainer.cli.eval_command import run_eval
from trainer.cli.parse import parse_config
from trainer.engine.plan import train
from trainer.errors import ConfigError

LENGTHS = [40, 40, 40, 40]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A short ACT run on a LeRobotDataset (episode 3 held out), then a LoRA run on top of it."""
    from accelerate.state import AcceleratorState

    tmp = tmp_path_factory.mktemp("load_policy")
    write_dataset(tmp / "ds", LENGTHS, rows_per_file=50)
    common = [f"--dataset.root={tmp / 'ds'}", "--policy.dim=16", "--policy.ffn_dim=32", "--batch_size=16"]
    common += ["--log_freq=4", "--use_policy_training_preset=false", "--scheduler.warmup_steps=0"]
    AcceleratorState._reset_state(reset_partial_state=True)
    train(
        parse_config(
            [
                *common,
                "--dataset.val_episodes=[3]",
                "--steps=8",
                "--save_freq=8",
                f"--output_dir={tmp / 'base'}",
            ]
        )
    )
    AcceleratorState._reset_state(reset_partial_state=True)
    lora = [f"--policy.path={tmp / 'base' / 'checkpoints' / 'last'}", "--peft.method_type=LORA", "--peft.r=4"]
    train(parse_config([*common, *lora, "--steps=4", "--save_freq=4", f"--output_dir={tmp / 'lora'}"]))
    AcceleratorState._reset_state(reset_partial_state=True)
    return {"tmp": tmp, "base": tmp / "base", "lora": tmp / "lora", "data": tmp / "ds"}


def _observations(n: int = 6) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        STATE: rng.standard_normal((n, 4)).astype(np.float32),
        VELOCITY: rng.standard_normal((n, 2)).astype(np.float32),
    }


def _actions(path: str | Path) -> torch.Tensor:
    return trainer.load_policy(str(path)).select_action(_observations())


def test_every_form_of_a_checkpoint_gives_the_same_actions(run, monkeypatch) -> None:
    step = run["base"] / "checkpoints" / "000008"
    reference = _actions(step)
    forms = [run["base"] / "checkpoints" / "last", run["base"], step / "pretrained_model"]
    dcp_only = run["tmp"] / "dcp_only"
    shutil.copytree(step, dcp_only)
    ckpt_tools.convert_safetensors_to_dcp(dcp_only)
    assert torch.equal(_actions(dcp_only), reference)  # safetensors and DCP side by side
    (dcp_only / "pretrained_model" / "model.safetensors").unlink()
    converted = run["tmp"] / "converted"
    ckpt_tools.convert_dcp_to_safetensors(dcp_only, converted)  # what `ckpt convert --output` calls
    published = run["tmp"] / "published"
    ckpt_tools.publish_model(str(step), str(published))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    hub_id = put_in_hub_cache(published, "me/act-policy", repo_type="model")
    for form in [*forms, dcp_only, converted, published, hub_id]:
        assert torch.equal(_actions(form), reference), form
    names = sorted(p.name for p in converted.iterdir())
    assert {
        "config.json",
        "train_config.json",
        "policy_preprocessor.json",
        "policy_postprocessor.json",
    } <= set(names)
    (converted / "model.safetensors").unlink()
    (converted / "config.json").write_text("{}")  # someone else's file: never replaced silently
    with pytest.raises(ckpt_tools.CheckpointError, match=r"config.json already exists; pass --overwrite"):
        ckpt_tools.convert_dcp_to_safetensors(dcp_only, converted)
    assert not (converted / "model.safetensors").exists()  # refused before anything was written


def test_adapter_checkpoint_and_its_merged_copy_act_the_same(run) -> None:
    adapter = run["lora"] / "checkpoints" / "last"
    merged = run["tmp"] / "merged"
    if not cli_app.app.registered_commands:
        cli_app._register()
    done = CliRunner().invoke(cli_app.app, ["merge-adapter", str(adapter), "-o", str(merged)])  # in-process
    assert done.exit_code == 0, done.output
    assert torch.equal(_actions(adapter), _actions(merged))
    assert not torch.equal(_actions(adapter), _actions(run["base"]))  # the adapter changed the policy


def test_select_action_takes_raw_observations_and_returns_dataset_units(run) -> None:
    loaded = trainer.load_policy(str(run["base"]))
    obs = _observations()
    batched = loaded.select_action(obs)
    single = loaded.select_action({k: torch.from_numpy(v[2]) for k, v in obs.items()})
    assert batched.shape == (6, 2) and single.shape == (2,) and torch.allclose(single, batched[2])
    stats = {name: loaded.preprocessor.steps[0].stats["observation.state"][name] for name in ("mean", "std")}
    raw = torch.from_numpy(np.concatenate([obs[STATE], obs[VELOCITY]], axis=1))
    act_stats = loaded.postprocessor.steps[0].stats["action"]
    by_hand = (
        loaded.policy.select_action({"observation.state": (raw - stats["mean"]) / stats["std"]})
        * act_stats["std"]
        + act_stats["mean"]
    )
    assert torch.equal(batched, by_hand)
    with pytest.raises(KeyError, match=r"the observation lacks 'observation.velocity'"):
        loaded.select_action({STATE: obs[STATE]})


def test_eval_on_held_out_episodes_reports_errors_against_the_mean(run, capsys) -> None:
    path = str(run["base"] / "checkpoints" / "last")
    result = run_eval([f"--policy.path={path}", "--dataset.episodes=[3]"])
    assert (result["episodes"], result["frames"]) == (1, 40)
    assert result["action_mse"] > 0 and result["baseline_mse"] > 0
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["eval", f"--policy.path={path}", f"--dataset.root={run['data']}", "--json"])
    assert exit_info.value.code == 0
    printed = json.loads(capsys.readouterr().out)
    assert (
        set(printed) == {"policy", "weights", "action_mse", "baseline_mse", "episodes", "frames"}
        and printed["frames"] == 160
    )


def test_eval_without_a_path_or_on_a_bad_path_is_one_line(run, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["eval", "--help"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith(
        "usage: trainer eval --policy.path=PATH"
    )
    with pytest.raises(ConfigError, match=r"trainer eval needs --policy.path=PATH"):
        run_eval(["--json"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["eval", f"--policy.path={run['tmp'] / 'nothing'}"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err


def _snippet(page: Path, marker: str | None = None) -> str:
    text = page.read_text()
    if marker is not None:
        text = text.split(f"<!-- {marker}:begin -->\n")[1].split(f"<!-- {marker}:end -->")[0]
    return text.split("```python\n")[1].split("```")[0]


def test_the_documented_rollout_script_runs_and_eval_rolls_out(
    tmp_path, dataset_cache, clean_accelerate, capsys, monkeypatch
) -> None:
    out = tmp_path / "pendulum"
    args = [f"--dataset.cache_dir={dataset_cache}", "--dataset.episodes=2", "--dataset.eval_episodes=0"]
    train(parse_config([*args, "--policy.type=mlp", "--steps=4", "--batch_size=8", f"--output_dir={out}"]))
    script = _snippet(REPO / "docs" / "training.md", "rollout-script")
    assert _snippet(REPO / "README.md") == script  # the README shows the same script
    (tmp_path / "rollout.py").write_text(script)
    monkeypatch.setattr(sys, "argv", ["rollout.py", str(out)])
    runpy.run_path(str(tmp_path / "rollout.py"), run_name="__main__")  # as `python rollout.py RUN`
    assert re.fullmatch(r"mean return over 3 episodes: -?\d+\.\d\n", capsys.readouterr().out)
    with pytest.raises(SystemExit):
        cli.main(["eval", f"--policy.path={out}", "--dataset.eval_episodes=2", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"policy", "weights", "policy_return", "random_return", "episodes"}
    assert result["episodes"] == 2 and result["weights"] == "model"  # saved without --ema.enable
    assert result["random_return"] < -100  # real rollouts of 200 steps


def test_a_checkpoint_naming_a_module_imports_nothing_unless_allowed(tmp_path, monkeypatch) -> None:
    """config.json with `"type": "module:Class"`: load_policy refuses in one line before importing
    it, and `trainer eval` too; `allow_types` names the types the caller trusts."""
    marker = tmp_path / "imported"
    (tmp_path / "tripwire_load.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\nclass Cfg:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"type": "tripwire_load:Cfg"}))
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(model / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"'tripwire_load:Cfg', which would import and run .*allow_types"):
        trainer.load_policy(str(model))
    with pytest.raises(ConfigError, match="would import and run"):
        run_eval([f"--policy.path={model}"])
    assert not marker.exists() and "tripwire_load" not in sys.modules
    with pytest.raises(ConfigError, match="not a PolicyConfig subclass"):  # allowed: imported, then checked
        trainer.load_policy(str(model), allow_types=["tripwire_load:Cfg"])
    assert marker.exists()


_LOAD_BOUNDED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import trainer
from trainer.errors import ConfigError
try:
    trainer.load_policy(sys.argv[1])
except ConfigError as exc:
    print("error: " + str(exc), file=sys.stderr)
    sys.exit(1)
print("loaded")
"""


def _edited_model(run: dict[str, Path], tmp_path: Path, edit) -> Path:
    model = tmp_path / "model"
    shutil.copytree(saved_model(run["base"], 8), model)
    edit(model)
    return model


def _config_edit(**fields):
    def edit(model: Path) -> None:
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, **fields}))

    return edit


def _processor_edit(name: str, text: str):
    return lambda model: (model / name).write_text(text)


def _processor_tensor(model: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = model / "policy_preprocessor_step_0.safetensors"
    tensors = load_file(str(path))
    tensors["observation.state.mean"] = torch.zeros(5)
    save_file(tensors, str(path))


EDITED = {
    "hidden size 200000": (_config_edit(dim=200_000), "does not describe its weights"),
    "more encoder layers": (_config_edit(encoder_layers=3), "the weights lack"),
    "processor steps without files": (
        _processor_edit("policy_preprocessor.json", '{"steps": [{"type": "normalize", "features": []}, {}]}'),
        "lists 2 steps for 1 step files",
    ),
    "processor step not a normalize": (
        _processor_edit("policy_postprocessor.json", '{"steps": [{"type": "exec", "features": ["action"]}]}'),
        "step 0 is not a normalize step",
    ),
    "processor feature without its stats": (
        _processor_edit(
            "policy_preprocessor.json",
            '{"steps": [{"type": "normalize", "features": ["observation.image"]}]}',
        ),
        "has no observation.image.mean tensor",
    ),
    "processor stats of another size": (_processor_tensor, "observation.state.mean has shape [5]"),
}


@pytest.mark.parametrize("case", list(EDITED))
def test_load_policy_checks_the_config_against_the_weights_before_building(run, tmp_path, case) -> None:
    """Under a 3 GB address-space limit: each edit is one `error:` line, nothing allocated."""
    import subprocess

    edit, fragment = EDITED[case]
    model = _edited_model(run, tmp_path, edit)
    result = subprocess.run(
        [sys.executable, "-c", _LOAD_BOUNDED, str(model)], capture_output=True, text=True, timeout=120
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr[
        -2000:
    ]
    assert fragment in lines[0], lines[0]
