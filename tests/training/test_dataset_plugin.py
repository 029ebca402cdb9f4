"""`--dataset.type=module:ConfigClass`: the example dataset of docs/training.md, trained as printed."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from helpers.fixtures import REPO
from trainer.cli.parse import parse_config
from trainer.engine.plan import train
from trainer.errors import ConfigError


def _example_source() -> str:
    page = (REPO / "docs" / "training.md").read_text()
    block = re.search(
        r"<!-- example-dataset:begin -->\n```python\n(.*?)```\n<!-- example-dataset:end -->", page, re.S
    )
    assert block is not None, "docs/training.md lost its example dataset"
    return block.group(1)


def test_the_documented_example_dataset_trains(tmp_path, monkeypatch, clean_accelerate) -> None:
    source = _example_source()
    assert len(source.splitlines()) <= 32
    (tmp_path / "circle_example.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    args = [
        "--dataset.type=circle_example:CircleConfig",
        "--dataset.episodes=8",
        "--policy.type=mlp",
        "--policy.hidden_dim=32",
        "--policy.dropout=0",
        "--steps=40",
        "--log_freq=10",
        "--save_freq=40",
        "--batch_size=16",
        f"--output_dir={out}",
    ]
    summary = train(parse_config(args))
    assert summary.final_loss < 0.5 * summary.first_loss
    saved = json.loads((Path(summary.last_checkpoint) / "pretrained_model" / "train_config.json").read_text())
    assert saved["dataset"] == {"type": "circle_example:CircleConfig", "episodes": 8, "length": 40, "seed": 0}
    again = parse_config(
        [f"--config_path={Path(summary.last_checkpoint) / 'pretrained_model' / 'train_config.json'}"]
    )
    assert type(again.dataset).__name__ == "CircleConfig" and again.dataset.episodes == 8
    sys.modules.pop("circle_example", None)


def test_a_class_that_is_not_a_dataset_config_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"--dataset.type='json:JSONDecoder' names .* not a DatasetConfig subclass"
    ):
        parse_config(["--dataset.type=json:JSONDecoder"])
