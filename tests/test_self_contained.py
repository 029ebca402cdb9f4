"""The repository stands on its own: no tracked file refers to a folder beside the checkout or to a
path of a development machine, so a fresh clone with nothing beside it passes its tests."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Assembled from pieces so that this file does not match itself.
OUTSIDE = re.compile(
    "|".join([r"\.\./" + "shared", "/" + "work/", "shared" + r"/fixtures", "SHARED" + "_FIXTURES"])
)


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    paths = [REPO / name for name in listed.decode().split("\0") if name]
    return [
        path
        for path in paths
        if path.is_file() and not path.is_symlink() and b"\0" not in path.read_bytes()[:8192]
    ]


def test_no_tracked_file_refers_outside_the_repository() -> None:
    found = []
    for path in _tracked_text_files():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}")
    assert not found, "files refer outside the repository:\n" + "\n".join(found)


def test_the_third_party_fixtures_are_committed() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "tests/fixtures"], cwd=REPO, capture_output=True, text=True, check=True
    )
    names = set(listed.stdout.split())
    for required in (
        "tests/fixtures/lerobot/dataset_tiny/meta/info.json",
        "tests/fixtures/lerobot/checkpoint_act/checkpoints/000004/pretrained_model/model.safetensors",
        "tests/fixtures/lerobot/dataset_video/meta/info.json",
        "tests/fixtures/lerobot/dataset_images/meta/info.json",
        "tests/fixtures/lerobot/dataset_arm6/meta/info.json",
        "tests/fixtures/lerobot/dataset_video_frames.safetensors",
        "tests/fixtures/lerobot/dataset_images_frames.safetensors",
        "tests/fixtures/lerobot_smolvla_tiny/pretrained_model/model.safetensors",
        "tests/fixtures/lerobot_smolvla_tiny/tiny_smolvlm/tokenizer.json",
        "tests/fixtures/lerobot_smolvla_tiny/reference.safetensors",
        "tests/fixtures/lerobot_smolvla_tiny/reference_padded_task.safetensors",
        "tests/fixtures/lerobot_pi0_tiny/pretrained_model/model.safetensors",
        "tests/fixtures/lerobot_pi0_tiny/tiny_paligemma/tokenizer.json",
        "tests/fixtures/lerobot_pi0_tiny/reference_padded_task.safetensors",
        "tests/fixtures/lerobot_pi05_tiny/pretrained_model/model.safetensors",
        "tests/fixtures/lerobot_pi05_tiny/reference_padded_task.safetensors",
        "tests/fixtures/lerobot_diffusion_tiny/pretrained_model/model.safetensors",
        "tests/fixtures/lerobot_diffusion_tiny/reference.safetensors",
        "tests/fixtures/lerobot/dataset_pusht_image/meta/info.json",
        "tests/fixtures/lerobot_pusht_act/pretrained_model/config.json",
        "tests/fixtures/lerobot_pusht_act/tensor_shapes.json",
    ):
        assert required in names, f"{required} is not committed"
