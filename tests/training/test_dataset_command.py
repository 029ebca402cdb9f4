"""`trainer dataset info|show`: the summary of the LeRobot-written video dataset, and the PNG strip."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from helpers.fixtures import copy_fixture
from trainer.cli import main

ROOT_FLAG = "--dataset.root={}"


@pytest.fixture(scope="module")
def video_root(tmp_path_factory: pytest.TempPathFactory):
    return copy_fixture(tmp_path_factory.mktemp("video"), "lerobot", "dataset_video")


def _run(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


def test_info_names_cameras_with_size_and_encoding(video_root, capsys) -> None:
    code, out, _ = _run(["dataset", "info", ROOT_FLAG.format(video_root)], capsys)
    assert code == 0 and "4 episodes, 80 frames, 10 fps" in out
    assert "observation.images.top: 40x24x3 video, av1 yuv420p" in out
    code, out, _ = _run(["dataset", "info", ROOT_FLAG.format(video_root), "--json"], capsys)
    summary = json.loads(out)
    assert summary["cameras"]["observation.images.wrist"]["encoding"] == "av1 yuv420p"
    assert (
        summary["features"]["action"] == {"dtype": "float32", "shape": [2]} and summary["bytes"]["videos"] > 0
    )


def test_show_writes_the_camera_strip_above_the_curves(video_root, tmp_path, capsys) -> None:
    output = tmp_path / "ep.png"
    code, out, _ = _run(
        ["dataset", "show", ROOT_FLAG.format(video_root), "--episode=3", f"--output={output}"], capsys
    )
    assert code == 0 and out.strip() == str(output)
    image = np.asarray(Image.open(output).convert("RGB")).astype(int)
    # episode 3's top camera is magenta (its target corner): the strip shows the decoded frames
    magenta = (image[..., 0] > 180) & (image[..., 2] > 180) & (image[..., 1] < 120)
    assert magenta.sum() > 2000 and image.shape[1] > image.shape[0]


def test_a_bad_episode_is_one_line(video_root, capsys) -> None:
    code, _, err = _run(["dataset", "show", ROOT_FLAG.format(video_root), "--episode=9"], capsys)
    assert code == 1 and err.count("\n") == 1 and "no episode 9; the dataset holds episodes 0..3" in err
