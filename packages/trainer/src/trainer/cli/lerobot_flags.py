"""lerobot-train's flags that are no field of `TrainConfig`, settled before draccus parses.

Every field of LeRobot 0.6.1's `TrainPipelineConfig` is a flag `trainer train` accepts
(tests/training/test_lerobot_train_fields.py walks them all, read from LeRobot's own classes into
tests/fixtures/lerobot_train_fields/train_fields.json). Most are `TrainConfig` fields under LeRobot's
name. The rest are settled here: renamed to the flag that does the same here (`--tolerance_s`,
`--peft.lora_alpha`), accepted when their value asks for what this trainer does anyway (LeRobot's
default: `--save_checkpoint=true`), or refused in one line that says why. None is parsed and then
ignored.
"""

from __future__ import annotations

import json

from trainer.errors import ConfigError

# LeRobot's flag -> this trainer's flag that does the same
RENAMED = {"--tolerance_s": "--dataset.tolerance_s", "--peft.lora_alpha": "--peft.alpha"}

# LeRobot's flags whose `null` is this trainer's default: dropped when null
NULL_IS_DEFAULT = ("--wandb.mode", "--peft.lora_alpha", "--peft.init_type")

# LeRobot's `{feature: {"type", "shape"}}` maps, whose empty default is this trainer's (the dataset's
# features): dropped when `{}`; a filled one is refused with the reason (a list of names still parses)
EMPTY_MAP_IS_DEFAULT = {
    "--policy.input_features": (
        "name the features the policy reads as a list here, "
        "--policy.input_features='[\"observation.state\", ...]' (their shapes come from the dataset)"
    ),
    "--policy.output_features": (
        "the action is the dataset's `action` feature here, its size from the dataset (--policy.action_dim)"
    ),
}

# flag -> (the values that ask for what this trainer does, why another is refused)
SAME_AS_HERE: dict[str, tuple[tuple[object, ...], str]] = {
    "--dataset.repo_type": (("dataset",), "a LeRobotDataset is read from a Hub dataset repo only"),
    "--dataset.return_uint8": (
        (False,),
        "the cameras reach the policy's preprocessor as uint8 and are normalized there: there is no "
        "other form to choose (`trainer dataset show` prints LeRobot's items)",
    ),
    "--dataset.depth_output_unit": (("mm",), "depth maps are not read by this trainer"),
    "--save_checkpoint": (
        (True,),
        "trainer train always saves the final checkpoint: to save only that one, set --save_freq to --steps",
    ),
    "--wandb.disable_artifact": (
        (True,),
        "no checkpoint is uploaded to W&B as an artifact here: publish it with --policy.push_to_hub=true "
        "or --save_checkpoint_to_hub=true",
    ),
    "--wandb.add_tags": ((False,), "this trainer's W&B runs carry no tags (the config is logged whole)"),
    "--peft.init_type": ((None,), "LoRA's adapters start as peft's default initialization"),
    "--policy.use_amp": (
        (False,),
        "autocast is --accelerator.mixed_precision=bf16|fp16 here (fp16 is what lerobot-train's use_amp "
        "picks on CUDA): pass that flag instead",
    ),
    "--policy.use_peft": (
        (False,),
        "LeRobot sets it on a checkpoint saved with PEFT adapters; train LoRA adapters with "
        "--peft.method_type=LORA",
    ),
    "--policy.pretrained_path": (
        (None,),
        "lerobot-train sets it from --policy.path: pass --policy.path=DIR_OR_REPO (its config and weights)",
    ),
    "--policy.pretrained_revision": (
        (None,),
        "--policy.path downloads a Hub policy's main revision: download another with "
        "`hf download REPO --revision REV` and pass its directory to --policy.path",
    ),
}

# a flag or group (with its sub-flags) -> why it is refused whatever its value
REFUSED = {
    "--reward_model": "training a reward model is not built: trainer train trains a policy (--policy.*)",
    "--job": (
        "--job.* submits lerobot-train as a Hugging Face Job; trainer train runs where it is launched "
        "(one process, torchrun or SLURM: docs/training.md, Launching)"
    ),
    "--sample_weighting": (
        "per-sample loss weights (RA-BC) are not built: every sample weighs the same here"
    ),
    "--checkpoint_path": (
        "lerobot-train sets it itself (it is no flag there either): resume with --resume=true and "
        "--config_path=CHECKPOINT or --output_dir=RUN (docs/resume.md)"
    ),
}


def settle_lerobot_flags(args: list[str]) -> list[str]:
    """`args` (one `--flag=value` each, `normalize_argv`'s form) with LeRobot's flags renamed or
    dropped as above; raises ConfigError, one line, for one this trainer cannot honour."""
    out = []
    for arg in args:
        name, has_value, text = arg.partition("=")
        refused = next((g for g in REFUSED if name == g or name.startswith(f"{g}.")), None)
        if refused is not None:
            raise ConfigError(f"{arg}: {REFUSED[refused]}")
        value = _value(text) if has_value else None
        if name in NULL_IS_DEFAULT and has_value and value is None:
            continue
        if name in EMPTY_MAP_IS_DEFAULT and isinstance(value, dict):
            if value:
                raise ConfigError(f"{arg} is refused: {EMPTY_MAP_IS_DEFAULT[name]}")
            continue
        if name in SAME_AS_HERE:
            accepted, why = SAME_AS_HERE[name]
            if value not in accepted:
                raise ConfigError(f"{arg} is refused: {why}")
            continue
        out.append(f"{RENAMED[name]}={text}" if name in RENAMED and has_value else arg)
    return out


def _value(text: str) -> object:
    """A flag's value as JSON reads it (true, 0.5, null), else the text itself."""
    try:
        return json.loads(text.lower() if text.lower() in ("true", "false", "null") else text)
    except ValueError:
        return text
