"""A SmolVLM backbone directory at SmolVLM2-500M-Video-Instruct's published sizes, offline: the tiny
fixture backbone's files (tokenizer included) with its config enlarged. The default-size SmolVLA
(450,046,176 parameters with LeRobot's defaults) builds from it with random weights; nothing downloads.
Shared by the suite (tests/training/test_smolvla.py) and the memory benchmark."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

TINY_BACKBONE = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot_smolvla_tiny" / "tiny_smolvlm"

# SmolVLM2-500M-Video-Instruct's text and vision towers, as the fixture's tensors.txt lists them
SMOLVLM2_500M_TEXT = {"hidden_size": 960, "intermediate_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 15, "num_key_value_heads": 5, "head_dim": 64, "vocab_size": 49280}  # fmt: skip
SMOLVLM2_500M_VISION = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12, "patch_size": 16, "image_size": 512}  # fmt: skip


def write_smolvlm2_500m(destination: Path) -> Path:
    """`destination`: a backbone directory whose config has SmolVLM2-500M's sizes (scale factor 4)."""
    shutil.copytree(TINY_BACKBONE, destination)
    config = json.loads((destination / "config.json").read_text())
    config["scale_factor"] = 4
    config["text_config"].update(SMOLVLM2_500M_TEXT)
    config["vision_config"].update(SMOLVLM2_500M_VISION)
    (destination / "config.json").write_text(json.dumps(config))
    return destination
