"""`trainer eval --env.type=... --policy.path=PATH` and `trainer eval --watch OUTPUT_DIR`: policies scored
in their environments (docs/evaluation.md).

One checkpoint: the figures lerobot-eval reports, written as `eval_info.json` with the videos under
`--output_dir` (lerobot-eval's layout), or into the step itself (`<step>/eval.json`) when PATH is a step
of a run of this trainer and no `--output_dir` is given. Any other PATH without `--output_dir` (a
`pretrained_model/` alone, a Hub download, a LeRobot run's step) goes where lerobot-eval puts it:
`outputs/eval/<date>/<time>_<job_name>`, the job named `<env>_<policy type>` unless `--job_name` says.

`--watch`: the evaluator (evaluation/evaluator.py) following the run in OUTPUT_DIR (a local directory or
an `s3://` URL), scoring each committed step the run asked for, with the run's own `--env.*`,
`--eval.*`, `--seed`, `--rename_map`, `--keep_best` ranking and `--keep_last` as its train_config.json
records them; flags given here override them. A run with `--env_eval_freq` launches this same command
itself. The scores no run logged are logged here, and once the run's last step is scored its retention
is applied as the run would have (`--keep_last` + `--keep_best` steps stay).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import ckpt_tools
from ckpt_tools import layout
from trainer.cli.eval_command import EvalPolicy
from trainer.cli.parse import dated_output_dir, parse_config, parse_flags
from trainer.config.environment import EnvConfig, EnvEvalConfig
from trainer.config.registry import split_allow_types
from trainer.config.sections import TrackingSection
from trainer.config.train import encode_config
from trainer.errors import ConfigError
from trainer.evaluation import evaluator, score_log
from trainer.evaluation.env_scores import EnvScoring, score_policy, score_step
from trainer.evaluation.environments import check_imports
from trainer.evaluation.episodes import EnvironmentFailure
from trainer.evaluation.inference import load_policy

WATCH_FLAG = "--watch"
LAUNCHED_FLAG = "--launched_by_run"  # set by the run that starts the evaluator: it reads its stdin
IDLE_FLAG = "--idle_timeout_s"
IDLE_TIMEOUT_S = 3600.0
# --eval.* flags a training run acts on and `trainer eval` would ignore
RUN_ONLY_FLAGS = {"--eval.wait_at_end": "is the training run's (its end waits for the last score)"}
HANDOVER_LOCK_S = 60.0  # a launched evaluator's run releases its lock this soon after closing its input
OUR_LAYOUT = ckpt_tools.Checkpoint.layout  # the layout a run of this trainer writes ("ckpt-tools")
# the run's sections the evaluator reads from a step's train_config.json
RUN_FIELDS = (
    "env",
    "eval",
    "env_eval_freq",
    "steps",
    "seed",
    "rename_map",
    "keep_best",
    "best_metric",
    "best_mode",
    "keep_last",
)


@dataclass
class EnvEvalArgs:
    """`trainer eval --env.type=...`: one policy in one environment."""

    policy: EvalPolicy = field(default_factory=EvalPolicy)
    env: EnvConfig | None = None
    eval: EnvEvalConfig = field(default_factory=EnvEvalConfig)
    seed: int = 1000
    """The first episode's seed (episode i starts from seed + i), as lerobot-eval."""
    rename_map: dict[str, str] = field(default_factory=dict)
    """Environment feature name -> the policy's name for it."""
    output_dir: str | None = None
    """Where eval_info.json and videos/ go; unset: into the step of a run PATH names (eval.json,
    eval_videos/), else lerobot-eval's outputs/eval/<date>/<time>_<job_name>."""
    job_name: str | None = None
    """The default output directory's suffix (lerobot-eval's field); unset: `<env type>_<policy type>`."""
    weights: str | None = None
    """model or ema; unset: the EMA when the checkpoint holds one."""


@dataclass
class WatchArgs:
    """What the evaluator reads of a run (its train_config.json), flags over it."""

    env: EnvConfig | None = None
    eval: EnvEvalConfig = field(default_factory=EnvEvalConfig)
    env_eval_freq: int = 0
    steps: int = 0
    seed: int = 1000
    rename_map: dict[str, str] = field(default_factory=dict)
    keep_best: int = 0
    best_metric: str | None = None
    best_mode: str | None = None
    keep_last: int = 0


def is_env_eval(args: Sequence[str]) -> bool:
    """Whether `trainer eval` was asked for an environment evaluation (or to follow a run)."""
    return any(a.startswith(("--env.", WATCH_FLAG)) for a in args)


def run_env_eval(args: list[str]) -> dict[str, Any]:
    """One policy scored in one environment; returns lerobot-eval's record. A failure is one line."""
    allowed, rest = _split_args(args)
    parsed = _parse(EnvEvalArgs, rest, None)
    if not parsed.policy.path:
        raise ConfigError(
            "trainer eval --env.type=... needs --policy.path=PATH (a checkpoint or model directory)"
        )
    if parsed.env is None:
        raise ConfigError(
            "trainer eval needs --env.type=pusht|aloha|pendulum|gym to score a policy in an environment"
        )
    scoring = EnvScoring(parsed.env, parsed.eval, parsed.seed, parsed.rename_map)
    _set_up_process(parsed.eval)
    step_dir = _run_step(parsed.policy.path) if parsed.output_dir is None else None
    if step_dir is not None:
        return _into_step(step_dir, parsed, scoring, allowed)
    loaded = load_policy(parsed.policy.path, parsed.eval.device, parsed.weights, allow_types=allowed)
    output_dir = parsed.output_dir or dated_output_dir(
        "eval", parsed.job_name or f"{parsed.env.type}_{loaded.config.type}"
    )
    try:
        record = score_policy(loaded, scoring, output_dir, "videos")
    except EnvironmentFailure as exc:
        raise ConfigError(
            f"{parsed.policy.path}: evaluation in --env.type={parsed.env.type} failed: {exc}"
        ) from None
    record = {"policy": parsed.policy.path, "weights": loaded.weights, **record}
    ckpt_tools.storage.write_json(layout.join(output_dir, "eval_info.json"), record)
    _say(f"wrote {layout.join(output_dir, 'eval_info.json')}")
    return record


def _split_args(args: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """`--allow_types` apart from the rest (`--json` is the CLI's); a flag that only a training run acts
    on is refused, not ignored."""
    given = next((a.partition("=")[0] for a in args if a.partition("=")[0] in RUN_ONLY_FLAGS), None)
    if given is not None:
        raise ConfigError(f"{given} {RUN_ONLY_FLAGS[given]}: drop it from trainer eval")
    return split_allow_types([a for a in args if a != "--json"])


def _run_step(path: str) -> str | None:
    """The step of a run of this trainer that PATH names, which its record goes into as the evaluator
    writes it; None for anything else: a Hub repo id, a model directory, a `pretrained_model/` without
    a step around it, a LeRobot run's step (lerobot-eval writes beside a run, never into it)."""
    if not layout.is_url(path) and not os.path.exists(path):
        return None  # a Hub repo id: load_policy downloads it (or says why it cannot)
    try:
        checkpoint = ckpt_tools.open_checkpoint(path)
    except ckpt_tools.CheckpointError as exc:
        raise ConfigError(f"--policy.path={path}: {exc}") from None
    step_dir = checkpoint.step_dir
    if step_dir is None or checkpoint.layout != OUR_LAYOUT:
        return None
    record = layout.join(step_dir, layout.TRAINING_STATE_DIR, layout.TRAINING_STEP)
    return step_dir if ckpt_tools.storage.exists(record) else None


def _into_step(
    step_dir: str, parsed: EnvEvalArgs, scoring: EnvScoring, allowed: tuple[str, ...]
) -> dict[str, Any]:
    """No --output_dir: the record goes into the step PATH names, as the evaluator writes it."""
    if parsed.weights is not None:
        raise ConfigError(
            "--weights applies with --output_dir: a step's eval.json scores the weights it would load"
        )
    record = score_step(step_dir, scoring, parsed.eval.device, allowed)
    if "error" in record:
        raise ConfigError(f"{step_dir}: {record['error']}")
    return record


def run_watch(args: list[str]) -> dict[str, Any]:
    """The evaluator following a run until its last step is scored (or it is stopped)."""
    allowed, rest = _split_args(args)
    output_dir, launched, idle, flags = _watch_flags(rest)
    watcher = _Watcher(output_dir, launched, flags, allowed)
    control = evaluator.Control(launched)
    scored = evaluator.follow(output_dir, watcher.plan_of, watcher.score, watcher.report, _say, control, idle)
    return {"output_dir": output_dir, "scored": scored}


class _Watcher:
    """What `evaluator.follow` calls back: each step's plan (read once), its scoring (the process set
    up for it at the first), and the report of what landed after the run."""

    def __init__(self, output_dir: str, launched: bool, flags: list[str], allowed: tuple[str, ...]) -> None:
        self.output_dir, self.launched, self.flags, self.allowed = output_dir, launched, flags, allowed
        self.plans: dict[str, evaluator.StepPlan] = {}
        self.set_up = False

    def plan_of(self, step_dir: str) -> evaluator.StepPlan:
        if step_dir not in self.plans:
            self.plans[step_dir] = _step_plan(step_dir, self.flags, self.allowed)
        return self.plans[step_dir]

    def score(self, step_dir: str, plan: evaluator.StepPlan) -> dict[str, Any]:
        assert plan.scoring is not None  # follow refuses a run without an environment
        if not self.set_up:
            _set_up_process(plan.scoring.eval)
            self.set_up = True
        return score_step(step_dir, plan.scoring, plan.scoring.eval.device, self.allowed)

    def report(self, scored: list[str], final: bool) -> None:
        """The scores no run logged, into metrics.jsonl and the run's trackers (evaluation/score_log.py),
        and at the end the run's retention over them. A launched evaluator's run has just let go of its
        files: its lock is waited for a little."""
        wait_s = HANDOVER_LOCK_S if self.launched else 0.0
        tracking = functools.partial(_run_tracking, self.output_dir, self.allowed)
        with contextlib.redirect_stdout(sys.stderr):  # what trackers print stays off `--json`'s output
            logged = score_log.log_landed(self.output_dir, scored, tracking, wait_s)
        if logged:
            _say(
                f"steps {', '.join(logged)} logged into {self.output_dir}/metrics.jsonl and the run's trackers"
            )
        elif logged is None and final:
            _say(
                f"a run holds {self.output_dir} (or it cannot be locked): the scores it did not log reach "
                "metrics.jsonl when a run there reads them (a resume does)"
            )
        if final and self.plans:
            self._prune(self.plans[max(self.plans)], wait_s)

    def _prune(self, plan: evaluator.StepPlan, wait_s: float) -> None:
        """The retention the run (its latest step's plan) would have applied had it waited for these
        scores: --keep_last steps and --keep_best's K best stay."""
        pruned = score_log.prune_landed(self.output_dir, plan.keep_last, plan.ranking, wait_s)
        if pruned:
            kept = f" and --keep_best={plan.ranking.keep}" if plan.ranking is not None else ""
            _say(
                f"steps {', '.join(pruned)} removed now that they are scored (--keep_last={plan.keep_last}{kept})"
            )


def _run_tracking(output_dir: str, allowed: tuple[str, ...]) -> tuple[TrackingSection, dict[str, Any]] | None:
    """The trackers of the run in `output_dir`, as its resume would continue them (its saved config),
    and the config they record; None, said in one line, when that config cannot be read here."""
    from trainer.engine.plan import tracking_section  # the training engine, loaded only to log late scores

    flags = ["--resume=true", f"--output_dir={output_dir}", *(f"--allow_types={name}" for name in allowed)]
    try:
        config = parse_config(flags)
        return tracking_section(config), encode_config(config)
    except ConfigError as exc:
        _say(f"the run's trackers are not logged to: its config does not load here ({exc})")
        return None


def _watch_flags(args: list[str]) -> tuple[str, bool, float, list[str]]:
    output_dir, launched, idle, flags = None, False, IDLE_TIMEOUT_S, []
    for arg in args:
        name, _, value = arg.partition("=")
        if name == WATCH_FLAG:
            output_dir = value
        elif name == LAUNCHED_FLAG:
            launched = value.lower() in ("true", "1", "yes")
        elif name == IDLE_FLAG:
            try:
                idle = float(value)
            except ValueError:
                raise ConfigError(f"{IDLE_FLAG}={value}: give seconds, e.g. {IDLE_FLAG}=600") from None
        else:
            flags.append(arg)
    if not output_dir:
        raise ConfigError(f"{WATCH_FLAG}=OUTPUT_DIR names the run to follow (a directory or an s3:// URL)")
    path = output_dir if layout.is_url(output_dir) else os.path.abspath(output_dir)
    return path, launched, idle, flags


def _step_plan(step_dir: str, flags: list[str], allowed: tuple[str, ...]) -> evaluator.StepPlan:
    """A step's plan: its run's sections from its train_config.json, the flags over them."""
    try:
        saved = ckpt_tools.open_checkpoint(step_dir).train_config()
    except ckpt_tools.CheckpointError as exc:
        raise ConfigError(f"{step_dir}: {exc}") from None
    run = {key: saved[key] for key in RUN_FIELDS if key in saved}
    if any(a.startswith("--env.type=") for a in flags):
        run.pop("env", None)  # another environment than the run's: its fields do not apply
    parsed = _parse(WatchArgs, flags, run)
    if parsed.env is not None and "env" in run:
        check_imports(parsed.env, allowed)
    run_had_env = run.get("env") is not None
    every = parsed.env_eval_freq if run_had_env or any(a.startswith("--env_eval_freq=") for a in flags) else 0
    scoring = (
        EnvScoring(parsed.env, parsed.eval, parsed.seed, parsed.rename_map)
        if parsed.env is not None
        else None
    )
    return evaluator.StepPlan(scoring, every, parsed.steps, _ranking(parsed), parsed.keep_last)


def _ranking(parsed: WatchArgs) -> ckpt_tools.Ranking | None:
    if not parsed.keep_best or not parsed.best_metric:
        return None
    mode = parsed.best_mode or ckpt_tools.default_mode(parsed.best_metric)
    return ckpt_tools.Ranking(parsed.best_metric, mode, parsed.keep_best)


def _parse(cls: type[Any], args: list[str], saved: dict[str, Any] | None) -> Any:
    """draccus over `args`, with `saved` (a run's sections) as the config file under them."""
    with tempfile.TemporaryDirectory(prefix="trainer-eval-") as tmp:
        config_path = None
        if saved is not None:
            config_path = os.path.join(tmp, "run.json")
            with open(config_path, "w", encoding="utf-8") as handle:
                json.dump(saved, handle)
        return parse_flags(cls, args, config_path, lambda message: f"trainer eval: {message}")


def _set_up_process(settings: EnvEvalConfig) -> None:
    """The evaluator's share of the machine: its cores (`--eval.cpus`, inherited by its environment
    processes) and its torch threads."""
    import torch

    if settings.cpus:
        try:
            os.sched_setaffinity(0, settings.cpus)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--eval.cpus={settings.cpus}: {exc}") from None
    torch.set_num_threads(settings.threads)


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
