"""SmolVLA's LeRobot form (`SmolVLAConfig.lerobot_adapter`): its config.json is LeRobot's SmolVLAConfig
schema already (`SmolVLAConfig.to_dict`), read back here; its tensor names are LeRobot's, so they pass
as they are both ways; the processor pipeline of `make_smolvla_pre_post_processors`; and the one flag a
`--policy.path` base cannot follow, another backbone."""

from __future__ import annotations

from typing import Any

from trainer.config.policy import LeRobotAdapter
from trainer.data.dataset import TASK_KEY
from trainer.data.pipeline import lerobot_schema
from trainer.errors import ConfigError
from trainer.policies.common.vla import features
from trainer.policies.common.vla.hub import same_config
from trainer.policies.smolvla.config import SmolVLAConfig


class SmolVLAAdapter(LeRobotAdapter[SmolVLAConfig]):
    """LeRobot's SmolVLAConfig and `make_smolvla_pre_post_processors`."""

    def config_from_lerobot(
        self, saved: dict[str, Any], preprocessor: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A saved config.json (LeRobot's schema, ours being the same) as SmolVLAConfig's fields."""
        if not isinstance(saved.get("input_features"), dict):
            return saved  # already ours (train_config.json's policy section)
        if saved.get("rtc_config") is not None:
            raise ConfigError(
                "the policy's config.json enables real-time chunking (rtc_config), which is not supported"
            )
        return features.fields_from_lerobot(saved, dropped=("rtc_config",))

    def config_to_lerobot(self, config: SmolVLAConfig) -> dict[str, Any]:
        """config.json itself: it is LeRobot's schema already."""
        return config.to_dict()

    def check_path_flags(self, base: dict[str, Any], flags: dict[str, str], path: str) -> None:
        """A `--policy.vlm_model_name` other than the base's is refused unless it names the same
        backbone (the same config.json): the base's weights belong to its own backbone."""
        name, saved = flags.get("vlm_model_name"), base.get("vlm_model_name")
        if name is None or not isinstance(saved, str) or name == saved:
            return
        if not same_config(name, saved, "--policy.vlm_model_name"):
            raise ConfigError(
                f"--policy.vlm_model_name={name} but --policy.path={path} was trained on {saved} (another "
                "backbone config): drop --policy.vlm_model_name, or give a copy of that backbone"
            )

    def pipeline(self, config: SmolVLAConfig) -> lerobot_schema.LeRobotPipeline:
        """LeRobot's `make_smolvla_pre_post_processors`: rename, batch axis, the task's newline, its
        tokenizer (this backbone's, at this length and padding), device, then the normalizer."""
        saved = config.to_dict()
        tokenizer = lerobot_schema.step(
            "tokenizer_processor",
            max_length=config.tokenizer_max_length,
            task_key=TASK_KEY,
            padding_side="right",
            padding=config.pad_language_to,
            truncation=True,
            tokenizer_name=config.vlm_model_name,
        )
        before = (
            lerobot_schema.rename(),
            lerobot_schema.to_batch(),
            lerobot_schema.step("smolvla_new_line_processor"),
            tokenizer,
            lerobot_schema.device(),
        )
        typed = {**saved["input_features"], **saved["output_features"]}
        return lerobot_schema.LeRobotPipeline(before, typed, dict(config.normalization_mapping))
