"""The engine in one process: checkpoints through ckpt_tools, metrics, bf16, gradient accumulation."""

from __future__ import annotations

import json
import math
import os
import struct
import warnings
from pathlib import Path

import pytest
import torch

import ckpt_tools
from ckpt_tools import layout
from ckpt_tools.training import Topology
from helpers.numerics import EPS, U
from helpers.run_outputs import metrics, saved_model
from helpers.train_flags import tiny_args
from trainer.cli.parse import parse_config
from trainer.config.sections import ParallelismSection
from trainer.data.embedded.pendulum import PendulumConfig
from trainer.data.pipeline.sampler import GlobalOrderSampler
from trainer.distributed.factory import build_accelerator
from trainer.engine.plan import train
from trainer.errors import ConfigError
from trainer.reporting.loss_curve import read_history


def test_single_process_run_writes_checkpoints_and_metrics(
    tmp_path, dataset_cache, clean_accelerate, capsys
) -> None:
    out = tmp_path / "run"
    args = tiny_args(
        str(out),
        dataset_cache,
        "--policy.type=mlp",
        "--steps=60",
        "--log_freq=20",
        "--save_freq=30",
        "--batch_size=32",
        "--policy.repo_id=user/never-published",
    )
    summary = train(parse_config(args))
    err = capsys.readouterr().err
    assert (
        "warning: --policy.repo_id=user/never-published is set but --policy.push_to_hub is false: nothing "
        "will be published" in err
    )
    assert "(1 process, device cpu)" in err and "NO" not in err.split("\n")[0]
    assert summary.last_checkpoint == str(out / "checkpoints" / "000060")
    assert ckpt_tools.latest_step_dir(str(out)).endswith("000060")
    step = ckpt_tools.read_training_step(summary.last_checkpoint)
    assert (step.step, step.dp_world_size, step.batch_size, step.checkpoint_format) == (
        60,
        1,
        32,
        "safetensors",
    )
    assert (step.sampler.epoch, step.sampler.offset) == (2, 60 * 32 - 2 * 800 // 32 * 32)
    model_dir = saved_model(out, 60)
    for name in ("model.safetensors", "config.json", "train_config.json", "policy_preprocessor.json"):
        assert (model_dir / name).is_file(), name
    assert json.loads((model_dir / "config.json").read_text())["obs_dim"] == 3
    records = metrics(out)
    losses = [r["loss"] for r in records if r.get("event") == "train"]
    assert len(losses) == 3 and losses[-1] < 0.85 * losses[0]
    windows = [r["losses"] for r in records if r.get("event") == "step_losses"]
    history = read_history(out / "metrics.jsonl")  # what loss_curve.png draws: every one of the 60 steps
    assert [s for s, _ in history.step_loss] == list(range(1, 61)) and [len(w) for w in windows] == [20] * 3
    assert all(abs(sum(w) / len(w) - loss) < 1e-6 for w, loss in zip(windows, losses, strict=True))
    png = (out / "loss_curve.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png[12:16] == b"IHDR"
    width, height = struct.unpack(">II", png[16:24])
    assert width >= 200 and height >= 100  # a drawn figure, not an empty file


def test_train_config_json_alone_reproduces_the_run(tmp_path, dataset_cache, clean_accelerate) -> None:
    first = train(parse_config(tiny_args(str(tmp_path / "a"), dataset_cache, "--policy.dropout=0")))
    saved = os.path.join(first.last_checkpoint, "pretrained_model", "train_config.json")
    config = parse_config([f"--config_path={saved}", f"--output_dir={tmp_path / 'b'}"])
    clean_accelerate_between_runs()
    second = train(config)
    a = ckpt_tools.load_model_state_dict(first.last_checkpoint)
    b = ckpt_tools.load_model_state_dict(second.last_checkpoint)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_existing_checkpoints_are_not_mixed_with_a_new_run(tmp_path, dataset_cache, clean_accelerate) -> None:
    args = tiny_args(str(tmp_path), dataset_cache, "--policy.type=mlp", "--steps=2")
    train(parse_config(args))
    clean_accelerate_between_runs()
    with pytest.raises(ConfigError, match="already holds checkpoints"):
        train(parse_config(args))


def test_bf16_mixed_precision_runs(tmp_path, dataset_cache, clean_accelerate) -> None:
    summary = train(
        parse_config(tiny_args(str(tmp_path), dataset_cache, "--accelerator.mixed_precision=bf16"))
    )
    state = ckpt_tools.load_model_state_dict(summary.last_checkpoint)
    assert {t.dtype for t in state.values()} == {torch.float32}  # autocast: fp32 master weights
    assert torch.isfinite(torch.tensor(summary.final_loss))


def test_fp16_on_cpu_autocasts_in_float16_and_saves_the_scaler(
    tmp_path, dataset_cache, clean_accelerate
) -> None:
    """The factory's CPU fp16 adapter: forward under float16 autocast (fp32 outputs), the optimizer
    steps through the loss scaler, and every checkpoint holds the scaler's state."""
    config = parse_config(tiny_args(str(tmp_path), dataset_cache, "--accelerator.mixed_precision=fp16"))
    accelerator = build_accelerator(ParallelismSection(Topology(), config.accelerator, 300), None)
    net, seen = torch.nn.Sequential(torch.nn.Linear(3, 2)), []
    net[0].register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    model, optimizer = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    assert model(torch.randn(4, 3)).dtype == torch.float32 and seen == [torch.float16]
    assert isinstance(accelerator.scaler, torch.amp.GradScaler) and optimizer.scaler is accelerator.scaler
    clean_accelerate_between_runs()

    summary = train(config)
    scaler = json.loads((Path(summary.last_checkpoint) / "training_state" / layout.SCALER_STATE).read_text())
    # 4 updates through the scaler: each overflow (fp16's first steps may have one) halves the scale
    # from 2**16 and restarts the count of good steps, which the state records
    skipped = 4 - scaler["_growth_tracker"]
    assert skipped <= 1 and scaler["scale"] == 2.0 ** (16 - skipped)
    state = ckpt_tools.load_model_state_dict(summary.last_checkpoint)
    assert {t.dtype for t in state.values()} == {torch.float32}


# Batch 8 in one step against batch 4 x 2 accumulated micro-batches: the same 8 samples, summed in
# another order (two means of 4 added, against one mean of 8, and kernels blocked for 4 rows instead
# of 8), so the gradients agree to float32 rounding, not bit for bit. Each gradient element is a sum
# over the 8 samples of terms made by the backward pass's dot products (at most 128 terms: the hidden
# width). Reordering a float32 sum of n terms moves it by at most 2 * n * U * sum(|terms|) (each order
# is within n * U * sum(|terms|) of the exact sum); with n = 8 + 128 and the tensor's largest |gradient|
# as the scale of its terms, GRAD_ULPS = 2 * 136 units U of max|g| (1.6e-5 of it) bound the difference.
# AVX-512, AVX2 and the default kernels measure at most 2.5 U * max|g|, and accumulating wrongly (a
# micro-batch dropped or counted twice, the loss not divided by the steps, an update per micro-batch)
# moves g by a fair fraction of max|g|, some 1e4 times the bound.
GRAD_ULPS = 2 * (8 + 128)


@pytest.mark.numerics
def test_gradient_accumulation_gives_the_same_update(tmp_path, dataset_cache, clean_accelerate) -> None:
    """batch 8 x accum 1 (one step) and batch 4 x accum 2 (two steps) see the same 8 samples: one AdamW
    update each, from the same gradient to float32 rounding, so the same weights to the rounding that
    AdamW's first step lets through.

    The gradient is read from the saved optimizer state: after one update exp_avg = (1 - beta1) * g (its
    norm, 4.1, is under the clip at 10). AdamW's first step moves each weight by lr * d with
    d = m_hat / (sqrt(v_hat) + eps) = g / (|g| + eps): about the sign of g, and a steep function of g
    where |g| is within a few eps (1e-8) of 0 (the smallest here are 3e-8), where the last bits of g
    decide d: on an AMX CPU one weight came out 3e-6 apart, over the rtol 1e-5 / atol 1e-6 this test
    had. So the weights are compared within lr * |d_a - d_b|, computed in
    float64 from each run's own saved moments, plus the float32 rounding of the update itself in each
    run (multiplying by 1 - lr * wd, adding lr * d: an ulp of |w| each, and a few U of lr * d for the
    square root, the division and eps): 2 * (2 * EPS * |w| + 8 * U * lr) for the two runs."""
    common = [
        "--policy.type=mlp",
        "--policy.dropout=0",
        "--use_policy_training_preset=false",
        "--scheduler.type=constant",
        "--scheduler.warmup_steps=0",
    ]
    one = train(
        parse_config(tiny_args(str(tmp_path / "a"), dataset_cache, *common, "--steps=1", "--batch_size=8"))
    )
    clean_accelerate_between_runs()
    accum = ["--steps=2", "--batch_size=4", "--accelerator.gradient_accumulation.steps=2", "--log_freq=1"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        two = train(parse_config(tiny_args(str(tmp_path / "b"), dataset_cache, *common, *accum)))
    assert not [w for w in caught if "lr_scheduler.step()" in str(w.message)]
    records = metrics(tmp_path / "b")
    logged = [r for r in records if r.get("event") == "train"]
    assert "grad_norm" not in logged[0]  # step 1: no update yet, so no norm (never nan)
    assert math.isfinite(logged[1]["grad_norm"]) and logged[1]["grad_norm"] > 0
    a = ckpt_tools.load_model_state_dict(one.last_checkpoint)
    b = ckpt_tools.load_model_state_dict(two.last_checkpoint)
    (group,) = _param_groups(one.last_checkpoint)
    assert _param_groups(two.last_checkpoint) == [group]
    lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
    moments = {run: _adam_moments(summary.last_checkpoint) for run, summary in (("a", one), ("b", two))}
    initial = _initial_weights(dataset_cache)
    assert a.keys() == b.keys() == moments["a"].keys() == moments["b"].keys()
    for key in a:
        assert not torch.equal(a[key], initial[key]), f"{key} was not updated"
        (m_a, v_a, step_a), (m_b, v_b, step_b) = moments["a"][key], moments["b"][key]
        assert step_a == step_b == 1, f"{key}: {step_a} and {step_b} updates, not one each"
        grad_bound = GRAD_ULPS * U * float(m_a.abs().max())
        grad_off = float((m_a - m_b).abs().max())
        assert grad_off <= grad_bound, f"{key}: exp_avg {grad_off:.3g} apart, over {grad_bound:.3g}"

        def direction(m: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            m_hat, v_hat = m.double() / (1 - beta1), v.double() / (1 - beta2)
            return m_hat / (v_hat.sqrt() + eps)

        w_a, w_b = a[key].double(), b[key].double()
        weight_bound = lr * (direction(m_a, v_a) - direction(m_b, v_b)).abs()
        weight_bound += 2 * (2 * EPS * torch.maximum(w_a.abs(), w_b.abs()) + 8 * U * lr)
        assert (w_a - w_b).abs().le(weight_bound).all(), (
            f"{key}: weights {float((w_a - w_b).abs().max()):.3g} apart where their gradients allow "
            f"{float(weight_bound[(w_a - w_b).abs().argmax()]):.3g}"
        )


def _param_groups(step: Path) -> list[dict]:
    """The optimizer's hyperparameters as saved (lr, betas, eps, weight decay), without the names."""
    groups = json.loads((Path(step) / layout.TRAINING_STATE_DIR / layout.OPTIMIZER_PARAM_GROUPS).read_text())
    return [{k: v for k, v in group.items() if k != "params"} for group in groups]


def _adam_moments(step: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor, int]]:
    """Each parameter's AdamW moments (exp_avg, exp_avg_sq) and update count, as saved."""
    from safetensors.torch import load_file

    state = load_file(str(Path(step) / layout.TRAINING_STATE_DIR / layout.OPTIMIZER_SAFETENSORS))
    names = {key.split("/")[1] for key in state if key.startswith("state/")}
    return {
        name: (
            state[f"state/{name}/exp_avg"],
            state[f"state/{name}/exp_avg_sq"],
            int(state[f"state/{name}/step"]),
        )
        for name in names
    }


def _initial_weights(cache: str) -> dict[str, torch.Tensor]:
    from trainer.engine.plan import seed_everything
    from trainer.policies import build_policy

    config = parse_config(["--policy.type=mlp", f"--dataset.cache_dir={cache}"])
    seed_everything(config.seed)
    return build_policy(config.policy, 3, 1).state_dict()


def clean_accelerate_between_runs() -> None:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


def test_sampler_order_is_global_and_split_by_rank(dataset_cache) -> None:
    single = GlobalOrderSampler(100, batch_size=8, dp_world_size=1, dp_rank=0, seed=3)
    ranks = [GlobalOrderSampler(100, batch_size=4, dp_world_size=2, dp_rank=r, seed=3) for r in range(2)]
    for _ in range(30):  # crosses epochs: 100 // 8 = 12 steps per epoch
        assert torch.equal(single.next_indices(), torch.cat([s.next_indices() for s in ranks]))
        assert single.position == ranks[0].position == ranks[1].position
    resumed = GlobalOrderSampler(100, batch_size=8, dp_world_size=1, dp_rank=0, seed=3)
    resumed.set_position(*single.position)
    assert torch.equal(resumed.next_indices(), single.next_indices())


def test_dataset_is_cached_and_chunks_pad_at_episode_end(tmp_path) -> None:
    config = PendulumConfig(episodes=2, cache_dir=str(tmp_path))
    dataset = config.load()
    assert config.cache_path().is_file() and len(dataset) == 400
    again = config.load()
    assert torch.equal(again.observations, dataset.observations)
    batch = dataset.gather(torch.tensor([0, 198, 199]), 3)
    assert batch["action_is_pad"].tolist() == [[False] * 3, [False, False, True], [False, True, True]]
    assert torch.equal(batch["action"][2, 2], dataset.actions[199])
    assert dataset.episode_bounds().tolist() == [[0, 200], [200, 400]]
