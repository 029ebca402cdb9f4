"""FastWAMPolicy: LeRobot's FastWAM behind this engine's `Policy` interface.

A training batch holds the video window (each camera (B, T, 3, H, W) in [0, 1] at the config's
`observation_delta_indices`), `observation.state` (B, T, D) normalized (the proprio token reads frame 0),
`action` (B, H, A) normalized with `action_is_pad`, and the task text. The cameras are resized to
(H, W / cameras) and concatenated along the width in sorted name order, encoded by the frozen VAE;
the prompt by the frozen UMT5. `forward` returns LeRobot's loss: flow matching on the video latents
after the first (weighted per sample by the video timestep) plus on the valid actions (weighted by the
action timestep); `noise=` and `time=` ({"video": ..., "action": ...}, timesteps on the 0..1000 scale
after the shift) fix the draws LeRobot makes inside. Padded video frames are not masked, as in LeRobot.
The joint attention runs as its mask allows: the video stream through every MoT layer first (no video
query reads an action key), then the action stream against each layer's video keys and values; with
`freeze_video_expert` and `lambda_video=0` the last layer's video block stops at its keys and values and
the video head does not run (the loss and the trained gradients are the same). Under either checkpointing
flag every layer runs again in the backward pass, the action stream's from the layer's video input
(its video keys and values computed again rather than kept).

The engine hands the policy its data's tasks before step 1 (`prepare_tasks`): each task's prompt is
encoded then and kept, and the frozen text encoder released, so it never sits beside training.

Acting reads the current frame only: the video expert runs once on the first frame's latents
(timestep 0), each layer's video keys and values are cached, and the action expert alone denoises
`num_inference_steps` Euler steps from noise drawn with `inference_seed` (the same for every sample).

Tensor names are LeRobot's (`model.mot.mixtures.*`, `model.mot.layers.{i}.blocks.*`,
`model.proprio_encoder.*`), so its `model.safetensors` loads as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, cast

import torch
from torch import nn
from torch.nn import functional

from trainer.data.dataset import ACTION_KEY, OBS_KEY, TASK_KEY, task_texts
from trainer.errors import ConfigError
from trainer.policies.common.vla.policy import VLAPolicy
from trainer.policies.fastwam import frozen
from trainer.policies.fastwam.config import FastWAMConfig
from trainer.policies.fastwam.flow import Schedule
from trainer.policies.fastwam.modules import Embedded, MoT, MoTLayer, Stream, rope_table, video_rope

PAD_KEY = "action_is_pad"
VAE_SPATIAL = 16  # Wan2.2's VAE compresses height and width 16x
# What the action stream reads of a MoT layer's video stream: its keys and values, or its input
VideoKeys = tuple[torch.Tensor, torch.Tensor] | Stream


class FastWAM(nn.Module):
    """The trainable parts: the MoT of both experts and the proprio encoder (state -> one context token)."""

    def __init__(self, config: FastWAMConfig) -> None:
        super().__init__()
        video = config.video_size()
        self.mot = MoT(video, config.action_size())
        state_dim = config.state_dim
        self.proprio_encoder = None if state_dim is None else nn.Linear(state_dim, video.text_dim)


def joint_mask(video_len: int, action_len: int, per_frame: int, device: torch.device) -> torch.Tensor:
    """(S, S) boolean, True where a query may attend: video tokens see all video tokens but those of
    latent frame 0, which see frame 0 only; actions see all actions and the frame-0 video tokens."""
    total = video_len + action_len
    mask = torch.zeros((total, total), dtype=torch.bool, device=device)
    mask[:video_len, :video_len] = True
    mask[:per_frame, per_frame:video_len] = False
    mask[video_len:, video_len:] = True
    mask[video_len:, :per_frame] = True
    return mask


def _recomputed(function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args)`, its activations recomputed in the backward pass rather than kept (torch's
    non-reentrant checkpoint, which FSDP2's hooks run inside)."""
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)


def _action_layer_from_video(
    layer: MoTLayer, video: Stream, action: dict[str, Stream], mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """A MoT layer's action stream against the video keys and values computed here from the layer's
    video input (the video stream stops at them): checkpointed, so the backward pass keeps that input
    rather than the keys and values."""
    _, kv = layer({"video": video}, mask, None, False)
    return layer(action, mask, kv, True)[0]


class FastWAMPolicy(VLAPolicy):
    """LeRobot's FastWAM (`--policy.type=fastwam`), built from its config alone; acting serves LeRobot's
    action queue (`VLAPolicy.select_action`, `n_action_steps` per chunk)."""

    # One unit per MoT layer (both experts' blocks: the joint attention reads them together) and one per
    # linear projection inside it, each expert's embeddings (and one per Linear of its text and time
    # embeddings) and each head: every one runs its own forward(), where FSDP gathers it.
    _fsdp_wrap_modules: ClassVar[tuple[str, ...]] = (
        "MoTLayer", "Projection", "VideoExpert", "ActionExpert", "VideoHead", "ActionHead",
    )  # fmt: skip
    _fsdp_forward_methods: ClassVar[tuple[str, ...]] = ("select_action", "predict_action_chunk")

    def __init__(self, config: FastWAMConfig) -> None:
        super().__init__(config, config.n_action_steps)
        self.config: FastWAMConfig = config
        cameras = config.cameras
        height, width = config.image_size
        if not cameras:
            raise ConfigError(
                "--policy.type=fastwam reads cameras: give at least one observation.images.* feature"
            )
        if width % len(cameras):
            raise ConfigError(
                f"--policy.image_size={list(config.image_size)}: its width {width} does not split into "
                f"{len(cameras)} cameras side by side; give a width divisible by {len(cameras)}"
            )
        if height % VAE_SPATIAL or width % VAE_SPATIAL:
            raise ConfigError(
                f"--policy.image_size={list(config.image_size)}: the Wan VAE needs a height and width "
                f"divisible by {VAE_SPATIAL}"
            )
        if config.proprio_dim and config.obs_dim and config.proprio_dim != config.obs_dim:
            raise ConfigError(
                f"--policy.proprio_dim={config.proprio_dim}, but the state has {config.obs_dim} values: give "
                f"--policy.proprio_dim={config.obs_dim} (a checkpoint's proprio encoder reads its own width)"
            )
        if config.proprio_dim is not None and config.state_dim == 0:
            raise ConfigError(
                "--policy.proprio_dim: the dataset has no observation.state; set --policy.proprio_dim=null"
            )
        action_dim = config.action_size().action_dim
        for dim in config.toggle_action_dimensions:
            if not -action_dim <= int(dim) < action_dim:
                raise ConfigError(
                    f"--policy.toggle_action_dimensions={list(config.toggle_action_dimensions)}: {dim} is no "
                    f"dimension of the {action_dim}-dimensional action; give indices in [-{action_dim}, {action_dim - 1}]"
                )
        # before the model: a frozen part that does not resolve is one line
        self.frozen_directories = frozen.locate_all(config)
        self.model = FastWAM(config)
        if config.freeze_video_expert:
            self.model.mot.video.requires_grad_(False)
            for layer in self.model.mot.paired():
                layer.block("video").requires_grad_(False)
        self.video_schedule = Schedule.of(config.video_scheduler)
        self.action_schedule = Schedule.of(config.action_scheduler)
        self._frozen: frozen.FrozenParts | None = None

    # ---------------------------------------------------------------- inputs

    @property
    def dtype(self) -> torch.dtype:
        return getattr(torch, self.config.torch_dtype)

    def frozen_parts(self, device: torch.device) -> frozen.FrozenParts:
        """The frozen tokenizer, text encoder and VAE, loaded on first use."""
        if self._frozen is None:
            self._frozen = frozen.load(self.config, self.frozen_directories, device, self.dtype)
        return self._frozen

    def prepare_tasks(self, tasks: Sequence[str], device: torch.device) -> None:
        """Every task's prompt encoded now and kept, then the frozen text encoder released: a prompt
        depends on its task alone, so training never runs the 5.68 B encoder (LeRobot keeps it beside
        training and encodes every prompt in `forward`)."""
        prompts = [self.config.prompt_template.format(task=task) for task in tasks]
        self.frozen_parts(device).keep_prompts_only(prompts, self.config.tokenizer_max_len, device)

    def video(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The cameras resized to (H, W / cameras) and concatenated along the width in sorted order:
        (B, 3, T, H, W) for a window, (B, 3, 1, H, W) for one frame."""
        height, width = self.config.image_size
        size = (height, width // len(self.config.cameras))
        frames = []
        for name in self.config.cameras:
            if name not in batch:
                raise ValueError(
                    f"the batch lacks camera {name!r}: FastWAM reads {', '.join(self.config.cameras)}"
                )
            frame = batch[name]
            frame = frame if frame.ndim == 5 else frame.unsqueeze(1)
            if tuple(frame.shape[-2:]) != size:
                flat = functional.interpolate(
                    frame.flatten(0, 1), size=size, mode="bilinear", align_corners=False, antialias=True
                )
                frame = flat.unflatten(0, frame.shape[:2])
            frames.append(frame)
        return torch.cat(frames, dim=-1).permute(0, 2, 1, 3, 4)

    def context(self, batch: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
        """(B, L + 1, text_dim): the prompt's UMT5 embeddings (padding zeroed) and the proprio token of
        the state at frame 0 of the window; every position is attended."""
        if TASK_KEY not in batch:
            raise ValueError("the batch holds no task: FastWAM encodes the task's prompt")
        given = batch[TASK_KEY]
        tasks = list(given) if isinstance(given, list) else task_texts(given)
        prompts = [self.config.prompt_template.format(task=task) for task in tasks]
        parts = self.frozen_parts(device)
        context = parts.encode_prompts(prompts, self.config.tokenizer_max_len, device).to(self.dtype)
        if self.model.proprio_encoder is None:
            return context
        state = batch[OBS_KEY]
        state = state[:, 0] if state.ndim == 3 else state
        token = self.model.proprio_encoder(state.to(device, self.dtype).unsqueeze(1)).to(context.dtype)
        return torch.cat([context, token], dim=1)

    # ---------------------------------------------------------------- the joint model

    def streams(
        self, video: Embedded | None, action: Embedded | None, context_len: int, device: torch.device
    ) -> dict[str, Stream]:
        """Each embedded expert as a MoT layer's input."""
        ones = torch.ones((1, context_len), dtype=torch.bool, device=device)
        head_dim = self.config.video_size().attn_head_dim
        out = {}
        if video is not None:
            rotations = video_rope(head_dim, video.grid, device)
            out["video"] = Stream(video.tokens, video.t_mod, video.context, ones.expand(video.tokens.shape[0], -1), rotations, torch.float64)  # fmt: skip
        if action is not None:
            length = action.tokens.shape[1]
            rotations = rope_table(head_dim)[:length].view(length, 1, -1).to(device)
            out["action"] = Stream(action.tokens, action.t_mod, action.context, ones.expand(action.tokens.shape[0], -1), rotations, torch.float32)  # fmt: skip
        return out

    def recomputes(self) -> bool:
        """Whether the MoT layers run again in the backward pass (either of LeRobot's two flags)."""
        return self.training and (
            self.config.use_gradient_checkpointing or self.config.mot_checkpoint_mixed_attn
        )

    def video_pass(
        self, video: Embedded, mask: torch.Tensor, context_len: int, finish_last: bool
    ) -> tuple[torch.Tensor | None, list[VideoKeys]]:
        """The video stream alone through every MoT layer (`mask`: the joint mask's video rows and
        columns): its tokens after the last layer (None unless `finish_last`: only the video loss reads
        them) and, for each layer, what the action stream reads of it: its keys and values, or, when the
        layers are recomputed, the layer's video input, from which the action stream's checkpointed
        layer computes them again (half their size kept per layer: at LeRobot's size, 294 video tokens
        of width 3,072, and batch 8, 14 MB against 29 MB, 0.43 GB per rank over 30 layers)."""
        stream = self.streams(video, None, context_len, video.tokens.device)
        layers = self.model.mot.paired()
        keys: list[VideoKeys] = []
        recomputes = self.recomputes()
        for i, layer in enumerate(layers):
            finish = finish_last or i < len(layers) - 1
            if recomputes:
                keys.append(stream["video"])
                if not finish:
                    break  # the last layer's keys and values are all the action stream needs of it
            tokens, kv = self.run_layer(layer, stream, mask, None, finish)
            if not recomputes:
                assert kv is not None  # the video stream ran
                keys.append(kv)
            if tokens:
                stream = {"video": stream["video"]._replace(tokens=tokens["video"])}
        return (stream["video"].tokens if finish_last else None), keys

    def action_pass(
        self, action: Embedded, mask: torch.Tensor, context_len: int, keys: list[VideoKeys]
    ) -> torch.Tensor:
        """The action stream through every MoT layer against the video keys and values of
        `video_pass` (`mask`: the joint mask's action rows): its tokens after the last layer."""
        stream = self.streams(None, action, context_len, action.tokens.device)
        for layer, video in zip(self.model.mot.paired(), keys, strict=True):
            if isinstance(video, Stream):
                tokens = cast(
                    dict[str, torch.Tensor], _recomputed(_action_layer_from_video, layer, video, stream, mask)
                )
            else:
                tokens, _ = self.run_layer(layer, stream, mask, video, True)
            stream = {"action": stream["action"]._replace(tokens=tokens["action"])}
        return stream["action"].tokens

    def run_layer(
        self,
        layer: MoTLayer,
        stream: dict[str, Stream],
        mask: torch.Tensor,
        cached: tuple[torch.Tensor, torch.Tensor] | None,
        finish: bool,
    ) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, torch.Tensor] | None]:
        """One MoT layer on one stream, recomputed in the backward pass under the checkpointing flags."""
        if self.recomputes():
            return cast(
                tuple[dict[str, torch.Tensor], tuple[torch.Tensor, torch.Tensor] | None],
                _recomputed(layer, stream, mask, cached, finish),
            )
        return layer(stream, mask, cached, finish)

    def forward(
        self,
        batch: dict[str, torch.Tensor],
        noise: dict[str, torch.Tensor] | None = None,
        time: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """LeRobot's training loss and its two parts (`loss_video`, `loss_action`, lambdas applied)."""
        noise, time = noise or {}, time or {}
        actions = batch[ACTION_KEY]
        device = actions.device
        video = self.video(batch)
        if video.shape[2] != self.config.model_video_frames:
            raise ValueError(
                f"the batch holds {video.shape[2]} video frames; FastWAM reads {self.config.model_video_frames} "
                f"(observation_delta_indices {self.config.observation_delta_indices})"
            )
        latents = self.frozen_parts(device).encode_video(video)
        context = self.context(batch, device)
        batch_size = latents.shape[0]
        noise_video = noise["video"] if "video" in noise else torch.randn_like(latents)
        t_video = (
            time["video"]
            if "video" in time
            else self.video_schedule.training_timestep(torch.rand(batch_size, device=device))
        )
        noisy = self.video_schedule.noisy(latents, noise_video, t_video)
        noisy[:, :, 0:1] = latents[:, :, 0:1]
        actions = actions.to(self.dtype)
        noise_action = noise["action"] if "action" in noise else torch.randn_like(actions)
        t_action = (
            time["action"]
            if "action" in time
            else self.action_schedule.training_timestep(torch.rand(batch_size, device=device))
        )
        noisy_action = self.action_schedule.noisy(actions, noise_action, t_action)

        video_expert, action_expert = self.model.mot.video, self.model.mot.action
        weights = self.config.loss
        lambda_video, lambda_action = float(weights["lambda_video"]), float(weights["lambda_action"])
        video_in = video_expert(noisy, t_video, context)
        video_len, per_frame = video_in.tokens.shape[1], video_in.grid[1] * video_in.grid[2]
        mask = joint_mask(video_len, actions.shape[1], per_frame, device)
        # freeze_video_expert with lambda_video=0 (LeRobot's recipe): the video loss is zero whatever the
        # prediction and nothing after the last layer's video keys and values trains, so neither the
        # rest of that layer's video block nor the head runs (a trained one would still be decayed)
        read_video = lambda_video != 0 or not self.config.freeze_video_expert
        video_out, keys = self.video_pass(
            video_in, mask[:video_len, :video_len], context.shape[1], read_video
        )
        action_in = action_expert(noisy_action, t_action, context)
        action_out = self.action_pass(action_in, mask[video_len:], context.shape[1], keys)
        pred_action = action_expert.head(action_out)

        video_loss = torch.zeros((), device=device)
        if video_out is not None:
            pred_video = video_expert.unpatchify(video_expert.head(video_out, video_in.t), video_in.grid)
            video_error = functional.mse_loss(
                pred_video[:, :, 1:].float(), (noise_video - latents)[:, :, 1:].float(), reduction="none"
            )
            video_loss = (
                video_error.mean(dim=(1, 3, 4)).mean(dim=1) * self.video_schedule.loss_weight(t_video)
            ).mean()
        action_error = functional.mse_loss(
            pred_action.float(), (noise_action - actions).float(), reduction="none"
        ).mean(dim=2)
        valid = ~batch[PAD_KEY] if PAD_KEY in batch else torch.ones_like(action_error, dtype=torch.bool)
        valid = valid.to(action_error.dtype)
        per_sample = (action_error * valid).sum(dim=1) / valid.sum(dim=1).clamp(min=1.0)
        action_loss = (per_sample * self.action_schedule.loss_weight(t_action)).mean()
        video_part, action_part = lambda_video * video_loss, lambda_action * action_loss
        return video_part + action_part, {
            "loss_video": video_part.detach(),
            "loss_action": action_part.detach(),
        }

    # ---------------------------------------------------------------- acting

    def initial_noise(self, batch_size: int, device: torch.device) -> torch.Tensor:
        """LeRobot's initial action latents: one (1, H, A) draw from `inference_seed` on `rand_device`,
        shared by every sample."""
        seed = self.config.inference_seed
        generator = None if seed is None else torch.Generator(self.config.rand_device).manual_seed(seed)
        shape = (1, self.config.action_horizon, self.config.action_size().action_dim)
        draw = torch.randn(shape, generator=generator, device=self.config.rand_device, dtype=torch.float32)
        return draw.to(device, self.dtype).expand(batch_size, -1, -1)

    def finish_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """LeRobot's gripper toggle (`toggle_action_dimensions`, its postprocessor's step after the
        unnormalizer): each such dimension's value v in the dataset's units becomes sign(1 - 2v), an
        open / close command of -1 or 1 (0 at exactly 0.5, as LeRobot's `torch.sign`)."""
        if not self.config.toggle_action_dimensions:
            return actions
        toggled = actions.clone()
        for dim in self.config.toggle_action_dimensions:
            toggled[..., dim] = torch.sign(-(toggled[..., dim] * 2.0 - 1.0))  # in turn, as LeRobot
        return toggled

    def initializer_of(self, module: nn.Module) -> None:
        """None: every module is plain torch, initialized by its own `reset_parameters()`."""
        return None

    @torch.no_grad()
    def predict_action_chunk(
        self, batch: dict[str, torch.Tensor], noise: torch.Tensor | None = None
    ) -> torch.Tensor:
        """A normalized action chunk (B, action_horizon, action_dim) from the current frame, denoised
        from `noise` (B, action_horizon, action_dim) when given, else from LeRobot's seeded draw."""
        first = {name: batch[name][:, 0] if batch[name].ndim == 5 else batch[name] for name in self.config.cameras if name in batch}  # fmt: skip
        image = self.video({**batch, **first})
        device = image.device
        latents = self.frozen_parts(device).encode_video(image)
        context = self.context(batch, device)
        batch_size = latents.shape[0]
        video_expert, action_expert = self.model.mot.video, self.model.mot.action
        video_in = video_expert(latents, torch.zeros(batch_size, device=device), context)
        video_len = video_in.tokens.shape[1]
        actions = self.initial_noise(batch_size, device) if noise is None else noise.to(device, self.dtype)
        mask = joint_mask(video_len, actions.shape[1], video_len, device)
        _, keys = self.video_pass(video_in, mask[:video_len, :video_len], context.shape[1], False)
        timesteps, deltas = self.action_schedule.sampling(
            self.config.num_inference_steps, self.config.sigma_shift
        )
        for timestep, delta in zip(timesteps.to(device), deltas.to(device), strict=True):
            action_in = action_expert(actions, timestep.view(1).to(self.dtype), context)
            velocity = action_expert.head(
                self.action_pass(action_in, mask[video_len:], context.shape[1], keys)
            )
            actions = actions + velocity * delta.to(actions.dtype)
        return actions.float()
