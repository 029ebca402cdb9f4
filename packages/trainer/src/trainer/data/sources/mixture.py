"""`--dataset.type=mixture`: several LeRobotDatasets in one run, each drawn by its weight.

Two spellings, both implying the type (cli/parse.py):

- `--dataset.mixture=FILE`: a JSON list of members, each with LeRobot's dataset fields (`repo_id`,
  `root`, `revision`, `episodes`, `rename_map`) and its `weight` (positive; the weights are
  normalized). A relative `root` is relative to the file. The same dataset may appear twice with
  different `episodes`.
- `--dataset.repo_id='[a,b]' --dataset.weights='[3,1]'` (with `--dataset.root='[ra,rb]'` for local
  copies; `--dataset.revision` applies to every one).

The members resolve once, when the config is built, into `members`: train_config.json records them
(absolute roots), so `--resume=true` needs neither the file nor the flags. Every other `--dataset.*`
flag (video backend, ImageNet statistics, augmentation, `eval_split`) applies to every member; the
episodes are chosen per member.

For a policy of one fixed layout, members must agree on what it is trained on: one fps, one action size,
and every observation feature and camera the run reads, under the mixture's names (the first member's,
or what each member's `rename_map` maps its own names to), with one size. A disagreement is one line
naming the member, the feature and the fix. The data is `data/pipeline/mixture.py`'s `Mixture` of the
members as single-dataset runs load them. A policy that takes members that differ
(`PolicyConfig.takes_mixed_members`, SmolVLA) gets a `MixedMixture` (data/pipeline/embodiments.py)
when they do: each member padded to the widest, its missing cameras empty slots, at its own fps.

With `--dataset.streaming=true` every member is read in place (its `root` an fsspec URL, `s3://...` or
`hf://datasets/...`; a local one as `file://`), each through its own block cache: the members split
`--dataset.cache_size` equally, so a process still holds at most that much.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ckpt_tools import layout
from trainer.config.dataset import Dataset, DatasetConfig, FrameResize
from trainer.data.dataset import ACTION_KEY, ALL_CAMERAS, TASK_KEY, is_camera
from trainer.data.format import metadata as fmt
from trainer.data.pipeline.embodiments import MixedMixture
from trainer.data.pipeline.mixture import Mixture
from trainer.data.pipeline.renamed import RenamedDataset
from trainer.data.pipeline.resized import ResizedFrames, resized_shape
from trainer.data.sources.lerobot import LeRobotConfig
from trainer.errors import ConfigError

MIXTURE_HINT = "see docs/datasets_at_scale.md"
# what every refusal of members that differ adds: the policies that take them (PolicyConfig.takes_mixed_members)
DIFFER_HINT = "; or train a policy that takes members that differ (--policy.type=smolvla)"


@dataclass
class MixtureMember:
    """One dataset of a mixture: LeRobot's dataset fields and its sampling weight."""

    repo_id: str | None = None
    root: str | None = None
    revision: str | None = None
    episodes: list[int] | None = None
    rename_map: dict[str, str] = field(default_factory=dict)
    weight: float = 1.0

    @property
    def name(self) -> str:
        return self.repo_id or os.path.basename(os.path.normpath(self.root or ""))


@DatasetConfig.register_subclass("mixture")
@dataclass
class MixtureConfig(LeRobotConfig):
    """Several LeRobotDatasets with sampling weights (docs/datasets_at_scale.md)."""

    repo_id: str | None = None
    """'[a,b]': the Hugging Face dataset repo ids of the mixture's datasets (read through the Hub cache
    without --dataset.root)."""
    root: str | None = None
    """'[ra,rb]': the local directories of the mixture's datasets, one per repo id when both are given
    (with --dataset.streaming, URLs read in place)."""
    mixture: str | None = None
    """JSON file listing the mixture's datasets: each with repo_id, root, revision, episodes, rename_map
    and its sampling weight (positive, normalized)."""
    weights: list[float] | None = None
    """Sampling weight of each dataset of --dataset.repo_id='[a,b]' (positive, normalized; default equal)."""
    members: list[MixtureMember] = field(default_factory=list)
    """The mixture's datasets as resolved from --dataset.mixture or the lists (train_config.json records them)."""

    def __post_init__(self) -> None:
        # set per copy by `serving` (the policy's, not the run's: not fields, so not saved): the policy
        # takes members that differ, pads their sizes and cameras, resizes its frames (FrameResize)
        self.mixed_members, self.padded = False, True
        self.resize: FrameResize | None = None
        given = _given_members(self)
        if given and self.members:
            raise ConfigError(
                "the mixture is given twice (its saved members and --dataset.mixture or list flags): give one"
            )
        self.members = self.members or given
        self.mixture, self.repo_id, self.root, self.revision, self.weights = None, None, None, None, None
        if not self.members:
            raise ConfigError(
                "--dataset.type=mixture needs --dataset.mixture=FILE or --dataset.repo_id='[a,b]' "
                f"(and --dataset.weights='[3,1]'); {MIXTURE_HINT}"
            )
        if self.episodes is not None or self.val_episodes:
            raise ConfigError(
                "--dataset.episodes and --dataset.val_episodes choose episodes of one dataset: give each "
                "member its `episodes` in the --dataset.mixture file (held out: --dataset.eval_split)"
            )
        self.cache_bytes()
        check_members(self.members)
        for index in range(len(self.members)):
            self.member_config(index)  # each member's own checks

    def labels(self) -> list[str]:
        return member_labels(self.members)

    def member_config(self, index: int) -> LeRobotConfig:
        """Member `index` as a single-dataset config, with the flags every member shares."""
        member = self.members[index]
        with self.naming(index):
            return LeRobotConfig(
                repo_id=member.repo_id,
                root=member.root,
                revision=member.revision,
                episodes=member.episodes,
                streaming=self.streaming,
                cache_size=str(max(1, self.cache_bytes() // len(self.members))),  # split: see above
                video_backend=self.video_backend,
                tolerance_s=self.tolerance_s,
                use_imagenet_stats=self.use_imagenet_stats,
                image_transforms=self.image_transforms,
                eval_split=self.eval_split,
                max_feature_size=self.max_feature_size,
                skip_nonfinite=self.skip_nonfinite,
            )

    @contextlib.contextmanager
    def naming(self, index: int) -> Iterator[None]:
        """A ConfigError raised inside, prefixed with the member it is about."""
        try:
            yield
        except ConfigError as exc:
            raise ConfigError(f"mixture member {index} ({self.labels()[index]}): {exc}") from None

    def serving(
        self, mixed_members: bool, padded: bool = True, resize: FrameResize | None = None
    ) -> MixtureConfig:
        """A copy that loads members that differ as a `MixedMixture` when the policy takes them (with
        `padded` false, when they differ in fps and statistics only), and refuses them in one line
        otherwise; with `resize`, members may record one camera at different sizes (the flags are the
        policy's, not the run's: they are not saved)."""
        copy = dataclasses.replace(self, members=list(self.members))
        copy.mixed_members, copy.padded, copy.resize = mixed_members, padded, resize
        return copy

    def load(self, input_features: Sequence[str] = ()) -> Mixture:
        return self._load(input_features, held_out=False)

    def load_validation(self, input_features: Sequence[str] = ()) -> Mixture | None:
        return self._load(input_features, held_out=True) if self.eval_split else None

    def _load(self, requested: Sequence[str], held_out: bool) -> Mixture:
        """Each member loaded as a single-dataset run would load it, asked for the first member's
        features under its own names, and served under the mixture's; members that differ, for a policy
        that takes them, as a `MixedMixture` (padded, or for a policy of one layout checked to agree on
        everything but fps)."""
        infos = []
        for index in range(len(self.members)):
            with self.naming(index):
                infos.append(fmt.read_info(self.member_config(index).local_root()))
        mixed = self.mixed_members and members_differ(infos, self.members)
        if mixed and self.padded:
            return self._load_mixed(infos, requested, held_out)
        check_rates(infos, self.labels(), fps=not mixed)
        datasets: list[Dataset] = []
        for index, (member, info) in enumerate(zip(self.members, infos, strict=True)):
            features = datasets[0].input_features if datasets else list(requested)
            with self.naming(index):
                if datasets:
                    check_features(info, member.rename_map, features)
                own_name = {new: old for old, new in member.rename_map.items()}
                asked = [own_name.get(name, name) for name in features]
                config = self.member_config(index)
                data = config.load_validation(asked) if held_out else config.load(asked)
                assert data is not None  # held out: every member holds some out (eval_split)
                datasets.append(RenamedDataset(data, member.rename_map) if member.rename_map else data)
        datasets, shapes = self._fit_frames(infos, datasets)
        vectors = [n for n in datasets[0].input_features if n not in shapes and n != TASK_KEY]
        check_sizes(infos, self.members, self.labels(), vectors)  # the cameras' sizes: _fit_frames
        # held out: every frame counts once, so val_loss is over the held-out frames as they are
        weights = [float(len(d)) for d in datasets] if held_out else [m.weight for m in self.members]
        if mixed:  # one layout, each member at its own fps with its own statistics
            return MixedMixture(datasets, weights, self.labels(), shapes)
        return Mixture(datasets, weights, self.labels())

    def _load_mixed(self, infos: Sequence[fmt.Info], requested: Sequence[str], held_out: bool) -> Mixture:
        """Members that differ (data/pipeline/embodiments.py), each asked for the features it has among
        those requested (the wildcard and the task as they are), at its own fps."""
        datasets: list[Dataset] = []
        for index, (member, info) in enumerate(zip(self.members, infos, strict=True)):
            rename = member.rename_map
            own_name = {new: old for old, new in rename.items()}
            has = {rename.get(name, name) for name in (*info.cameras, *info.observation_features)}
            asked = [own_name.get(name, name) for name in requested if name in has or not _named(name)]
            with self.naming(index):
                config = self.member_config(index)
                data = config.load_validation(asked) if held_out else config.load(asked)
                assert data is not None  # held out: every member holds some out (eval_split)
            datasets.append(RenamedDataset(data, rename) if rename else data)
        datasets, shapes = self._fit_frames(infos, datasets)
        missing = [n for n in requested if _named(n) and not any(n in d.input_features for d in datasets)]
        if missing:
            raise ConfigError(
                f"no mixture member has feature {missing[0]}: leave it out of --policy.input_features"
            )
        weights = [float(len(d)) for d in datasets] if held_out else [m.weight for m in self.members]
        return MixedMixture(datasets, weights, self.labels(), shapes)

    def _fit_frames(
        self, infos: Sequence[fmt.Info], datasets: Sequence[Dataset]
    ) -> tuple[list[Dataset], dict[str, tuple[int, int, int]]]:
        """The members as served, and (C, H, W) of every camera a member serves, under the mixture's
        names. A camera the members record at different sizes goes through the policy's own resize
        (`ResizedFrames`) when it has one, and is refused in one line naming the member otherwise."""
        sizes: dict[str, dict[tuple[int, int, int], int]] = {}  # camera -> its sizes, each's first member
        for index, (member, info, data) in enumerate(zip(self.members, infos, datasets, strict=True)):
            for camera in info.cameras:
                name = member.rename_map.get(camera, camera)
                if name in data.input_features:  # not a camera it records but does not serve
                    sizes.setdefault(name, {}).setdefault(info.camera_shape(camera), index)
        differ = [name for name, seen in sizes.items() if len(seen) > 1]
        if differ and self.resize is None:
            self._refuse_sizes(differ[0], sizes[differ[0]])
        shapes = {name: next(iter(seen)) for name, seen in sizes.items()}
        if not differ:
            return list(datasets), shapes
        assert self.resize is not None
        resize = self.resize
        shapes.update({name: resized_shape(resize, shapes[name]) for name in differ})
        served: list[Dataset] = []
        for data in datasets:
            own = [name for name in differ if name in data.input_features]
            served.append(ResizedFrames(data, own, resize) if own else data)
        return served, shapes

    def _refuse_sizes(self, name: str, seen: dict[tuple[int, int, int], int]) -> None:
        """One camera at two sizes, for a policy that reads frames at their recorded size."""
        (first, _), (shape, index) = list(seen.items())[:2]
        raise ConfigError(
            f"mixture member {index} ({self.labels()[index]}): its camera {name} is "
            f"{'x'.join(map(str, shape))}, another member's {'x'.join(map(str, first))}: this policy reads "
            "frames at their recorded size; give one name one frame size (map it to another name in the "
            "member's rename_map), or train a policy that resizes its frames (--policy.type=smolvla, pi0, pi05)"
        )

    def banner(self) -> list[str]:
        total = sum(member.weight for member in self.members)
        lines = [f"mixture of {len(self.members)} LeRobotDatasets, drawn by weight:"]
        for index, (member, label) in enumerate(zip(self.members, self.labels(), strict=True)):
            config = self.member_config(index)
            with self.naming(index):
                described = config.banner()[0]
            episodes = "all episodes" if member.episodes is None else f"episodes {member.episodes}"
            lines.append(f"  {label} (weight {member.weight / total:.3g}, {episodes}): {described}")
        return lines


def _given_members(config: MixtureConfig) -> list[MixtureMember]:
    """The members `--dataset.mixture` or the list flags name ([] when neither is given)."""
    if config.mixture:
        if config.repo_id or config.root or config.weights is not None:
            raise ConfigError(
                "--dataset.mixture lists the datasets and their weights: drop --dataset.repo_id, "
                "--dataset.root and --dataset.weights"
            )
        return read_members(config.mixture)
    repo_ids, roots = _listed(config.repo_id, "--dataset.repo_id"), _listed(config.root, "--dataset.root")
    if not repo_ids and not roots:
        return []
    if repo_ids and roots and len(repo_ids) != len(roots):
        raise ConfigError(
            f"--dataset.repo_id lists {len(repo_ids)} datasets and --dataset.root {len(roots)}: give one root "
            "per repo id"
        )
    count = max(len(repo_ids), len(roots))
    weights = config.weights if config.weights is not None else [1.0] * count
    if len(weights) != count:
        raise ConfigError(
            f"--dataset.weights gives {len(weights)} weights for {count} datasets: give one weight per dataset"
        )
    return [
        MixtureMember(
            repo_id=repo_ids[i] if repo_ids else None,
            root=_absolute(roots[i]) if roots else None,
            revision=config.revision,
            weight=float(weights[i]),
        )
        for i in range(count)
    ]


def _absolute(root: str, folder: str | Path = ".") -> str:
    """A member's root as train_config.json records it: a URL as given, a path made absolute (relative
    to `folder`)."""
    return root if layout.is_url(root) else os.path.abspath(os.path.join(folder, root))


def _listed(value: str | None, flag: str) -> list[str]:
    """`[a,b]` (brackets, commas, optional quotes) as its items; a plain value as one item."""
    if not value:
        return []
    if not value.startswith("["):
        return [value]
    if not value.endswith("]"):
        raise ConfigError(f"{flag}={value} opens a list it does not close: write {flag}='[a,b]'")
    items = [item.strip().strip("'\"") for item in value[1:-1].split(",")]
    if not all(items):
        raise ConfigError(f"{flag}={value} has an empty item: write {flag}='[a,b]'")
    return items


def member_labels(members: Sequence[MixtureMember]) -> list[str]:
    """Each member's name in errors, the log and metrics.jsonl: its repo id or root folder, `#index`
    added where two members share it."""
    names = [member.name for member in members]
    return [f"{n}#{i}" if names.count(n) > 1 else n for i, n in enumerate(names)]


MEMBER_FIELDS = {f.name for f in fields(MixtureMember)}


def read_members(path: str) -> list[MixtureMember]:
    """The members a mixture file lists, each checked for its fields' types (one line naming the
    member); relative roots resolved against the file's folder."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"--dataset.mixture={path}: cannot read it as JSON ({exc}); {MIXTURE_HINT}"
        ) from None
    if not isinstance(data, list) or not data or not all(isinstance(entry, dict) for entry in data):
        raise ConfigError(
            f"--dataset.mixture={path} must hold a non-empty JSON list of members, each an object with "
            f"repo_id or root and a weight; {MIXTURE_HINT}"
        )
    folder = Path(path).resolve().parent
    return [_member(entry, index, folder, path) for index, entry in enumerate(data)]


def _member(entry: dict[str, Any], index: int, folder: Path, path: str) -> MixtureMember:
    where = f"--dataset.mixture={path}: member {index}"
    unknown = sorted(set(entry) - MEMBER_FIELDS)
    if unknown:
        raise ConfigError(
            f"{where} has field {unknown[0]!r}; a member has {', '.join(sorted(MEMBER_FIELDS))}"
        )
    strings = ("repo_id", "root", "revision")
    if any(entry.get(name) is not None and not isinstance(entry[name], str) for name in strings):
        raise ConfigError(f"{where}: repo_id, root and revision must be strings")
    episodes = entry.get("episodes")
    if episodes is not None and not (
        isinstance(episodes, list) and all(isinstance(e, int) and not isinstance(e, bool) for e in episodes)
    ):
        raise ConfigError(f"{where}: episodes must be a list of episode indices, got {episodes!r}")
    rename = entry.get("rename_map", {})
    if not isinstance(rename, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in rename.items()
    ):
        raise ConfigError(f"{where}: rename_map must map its feature names to the mixture's, got {rename!r}")
    weight = entry.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise ConfigError(f"{where}: weight must be a number, got {weight!r}")
    root = entry.get("root")
    return MixtureMember(
        repo_id=entry.get("repo_id"),
        root=_absolute(root, folder) if root else None,
        revision=entry.get("revision"),
        episodes=episodes,
        rename_map=dict(rename),
        weight=float(weight),
    )


def check_members(members: Sequence[MixtureMember]) -> None:
    """Weights positive (their sum too), every member locatable, one revision per repo id, and each
    member's renames distinct."""
    labels = member_labels(members)
    if all(member.weight == 0 for member in members):
        raise ConfigError("the mixture's weights sum to 0: give every member a positive weight")
    first_revision: dict[str, int] = {}
    for index, (member, label) in enumerate(zip(members, labels, strict=True)):
        where = f"mixture member {index} ({label})"
        if not member.weight > 0 or not math.isfinite(member.weight):
            raise ConfigError(
                f"{where} has weight {member.weight:g}: weights must be positive numbers (drop a member "
                "to leave it out)"
            )
        if not member.repo_id and not member.root:
            raise ConfigError(f"{where} names no dataset: give it repo_id or root")
        renamed = list(member.rename_map.values())
        if len(set(renamed)) != len(renamed):
            raise ConfigError(
                f"{where}: its rename_map gives two features the same name: {member.rename_map}"
            )
        if member.repo_id:
            seen = first_revision.setdefault(member.repo_id, index)
            if members[seen].revision != member.revision:
                raise ConfigError(
                    f"{where} reads {member.repo_id} at revision {member.revision or 'default'}, member "
                    f"{seen} at {members[seen].revision or 'default'}: one dataset is read at one revision "
                    "in a run; give both the same revision"
                )


def _named(feature: str) -> bool:
    """Whether a requested feature names one observation feature (not the camera wildcard or the task)."""
    return feature not in (ALL_CAMERAS, TASK_KEY)


def members_differ(infos: Sequence[fmt.Info], members: Sequence[MixtureMember]) -> bool:
    """Whether the members differ in fps, action size, cameras or observation features and their sizes
    (under the mixture's names): such a mixture is a `MixedMixture` for a policy that takes it."""

    def layout(info: fmt.Info, rename: dict[str, str]) -> tuple[object, ...]:
        vectors = sorted((rename.get(n, n), info.size(n)) for n in info.observation_features)
        cameras = sorted(rename.get(n, n) for n in info.cameras)
        return info.fps, info.size(ACTION_KEY), tuple(vectors), tuple(cameras)

    return len({layout(info, m.rename_map) for info, m in zip(infos, members, strict=True)}) > 1


def check_rates(infos: Sequence[fmt.Info], labels: Sequence[str], fps: bool = True) -> None:
    """One action size (and with `fps`, one fps) across the members."""
    checks: list[tuple[str, Sequence[float], str]] = [
        ("fps", [info.fps for info in infos], "resample them to one rate"),
        ("action size", [info.size(ACTION_KEY) for info in infos], "map their actions to one action space"),
    ]
    for what, values, fix in checks[0 if fps else 1 :]:
        if len(set(values)) > 1:
            listed = ", ".join(f"{label} {value:g}" for label, value in zip(labels, values, strict=True))
            raise ConfigError(
                f"the mixture's members disagree on {what} ({listed}): this policy trains on one; {fix}"
                f"{DIFFER_HINT}"
            )


def check_features(info: fmt.Info, rename: dict[str, str], features: Sequence[str]) -> None:
    """Every feature the first member serves is among this member's (under the mixture's names)."""
    cameras = [rename.get(name, name) for name in info.cameras]
    vectors = [rename.get(name, name) for name in info.observation_features]
    for name in features:
        if is_camera(name) and name not in cameras:
            raise ConfigError(
                f"has no camera {name} (its cameras: {', '.join(cameras) or 'none'}): map one of its cameras "
                f"to it in the member's rename_map, or leave {name} out of --policy.input_features{DIFFER_HINT}"
            )
        if not is_camera(name) and name != TASK_KEY and name not in vectors:  # every dataset has tasks
            raise ConfigError(
                f"has no feature {name} (its observation features: {', '.join(vectors) or 'none'}): map one "
                "of its features to it in the member's rename_map, or name the features to train on in "
                f"--policy.input_features{DIFFER_HINT}"
            )


def check_sizes(
    infos: Sequence[fmt.Info],
    members: Sequence[MixtureMember],
    labels: Sequence[str],
    features: Sequence[str],
) -> None:
    """Each observation vector the run reads has one size across the members."""
    for name in features:
        sizes = []
        for info, member in zip(infos, members, strict=True):
            own = {new: old for old, new in member.rename_map.items()}.get(name, name)
            sizes.append((info.size(own),))
        if len(set(sizes)) > 1:
            listed = ", ".join(
                f"{label} {'x'.join(map(str, size))}" for label, size in zip(labels, sizes, strict=True)
            )
            raise ConfigError(
                f"the mixture's members disagree on the size of {name} ({listed}): this policy reads one; "
                f"map it to one size in the datasets, or leave it out of --policy.input_features{DIFFER_HINT}"
            )
