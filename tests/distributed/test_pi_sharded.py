"""pi0 and pi0.5 sharded on 2 gloo ranks, one torchrun launch (scripts/pi_fsdp2.py).

The trainer fine-tunes LeRobot's pi0.5 checkpoint under FSDP2 with the policy's units as DDP does (the
same losses and gradient norms), the checkpoint streamed under LeRobot's names into a meta build, every
unit's forward runs but the token embedding's and the idle last PaliGemma MLP's (a unit FSDP2 would
never gather is named), a frozen PaliGemma is never gathered in the backward pass, LoRA on
LeRobot's default targets trains under FSDP2, so does FSDP2 computing in bfloat16 (a mixed precision
policy), and the sharded save writes the bytes of the gathered tensors. torch's `fully_shard` on the
same units gives the unsharded loss bit for bit and LeRobot's, the gradients of one process, LeRobot's
sampled chunk, and each rank's own tokens looked up on the table's rows as the unsharded table gives
them.
HSDP 2x2 (`pi_fsdp2.py OUT WORKDIR hsdp`, 4 ranks) is measured by hand (docs/pi.md): it does not fit
the suite's time."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load, save

import ckpt_tools
from helpers.fixtures import fixture_dir
from helpers.launch import run_torchrun
from helpers.run_outputs import metrics, saved_model

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(400)]

SCRIPT = Path(__file__).parent / "scripts" / "pi_fsdp2.py"
KINDS = ("lerobot_pi0_tiny", "lerobot_pi05_tiny")


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("pi_sharded")
    for kind in KINDS:
        shutil.copytree(fixture_dir(kind), work / kind)
    shutil.copytree(fixture_dir("lerobot", "dataset_video"), work / "dataset_video")
    (work / "out").mkdir()
    run_torchrun(SCRIPT, 2, str(work / "out"), str(work), timeout=360)
    return work / "out"


def _train_records(run: Path) -> list[dict]:
    records = metrics(run)
    return [r for r in records if r.get("event") == "train"]


@pytest.mark.parametrize("run", ["fsdp2", "ddp", "lora"])
def test_lerobots_checkpoint_streams_into_a_meta_build(out: Path, run: str) -> None:
    """LeRobot's names (two decoder stacks, the lm_heads) read under the policy's renaming into the
    shards of a policy built on the meta device (LoRA's: into its frozen base, under its names inside
    the wrapper), not whole on every rank: after the build it holds exactly the checkpoint's weights."""
    assert json.loads((out / f"{run}_build.json").read_text()) == {"on_meta": True, "holds_lerobots": True}


def test_lerobots_checkpoint_fine_tunes_on_fsdp2_as_on_ddp(out: Path) -> None:
    fsdp2, ddp = _train_records(out / "fsdp2"), _train_records(out / "ddp")
    assert [r["step"] for r in fsdp2] == [1, 2]
    for key in ("loss", "grad_norm"):
        np.testing.assert_allclose([r[key] for r in fsdp2], [r[key] for r in ddp], rtol=1e-5)


def test_fsdp2_computing_in_bfloat16_trains_to_the_float32_runs_loss(out: Path) -> None:
    """--accelerator.fsdp.mixed_precision_policy.param_dtype=bfloat16: the units' gathered weights in
    bfloat16, the float32 noised actions and time embedding cast to them at the action and time
    projections (the first forward failed there). The losses and gradient norms differ from the float32
    run's (the policy reached the units) by bfloat16's rounding: 8 significant bits (3.9e-3 relative
    per operand) move them by up to 2e-3 relative here; 2e-2 leaves room and still fails on a real error."""
    bf16, float32 = _train_records(out / "fsdp2_bf16"), _train_records(out / "fsdp2")
    assert [r["step"] for r in bf16] == [1, 2]
    for key in ("loss", "grad_norm"):
        ours, reference = [r[key] for r in bf16], [r[key] for r in float32]
        assert ours != reference
        np.testing.assert_allclose(ours, reference, rtol=2e-2)


@pytest.mark.parametrize("run", ["fsdp2", "lora"])
def test_every_fsdp_unit_runs_its_forward(out: Path, run: str) -> None:
    """The units are the modules whose forward() runs (each decoder layer and its MLP's projections,
    SigLIP's layers and embeddings, the norms): none is left that FSDP2 would never gather but the token
    embedding, a unit so that it is sharded on its own and read on each rank's rows without a gather,
    and the MLP projections of PaliGemma's last layer, which nothing reads (frozen, never run)."""
    units = json.loads((out / f"{run}_units.json").read_text())
    idle_mlp = [f"layers.1.paligemma.mlp.{p}_proj" for p in ("down", "gate", "up")]
    assert units["never_ran"] == [*idle_mlp, "paligemma.model.language_model.embed_tokens"]
    assert {"DecoderLayer", "MLPProjection", "SiglipEncoderLayer", "SiglipVisionEmbeddings",
            "GemmaTextScaledWordEmbedding", "PiRMSNorm"} <= set(units["classes"])  # fmt: skip


def test_a_frozen_paligemma_is_never_gathered_in_the_backward_pass(out: Path) -> None:
    """Each decoder layer is a unit of its own and the prefix runs before the suffix, so under LoRA
    (PaliGemma frozen, as under train_expert_only) no output of PaliGemma's layers needs a gradient and
    FSDP2 gathers only the expert's layers in the backward pass (a unit pairing the two layers, as
    before, brought the 2 B model's layer back with each expert layer). A full fine-tune gathers both."""
    lora, full = (
        json.loads((out / f"{run}_units.json").read_text())["backward"] for run in ("lora", "fsdp2")
    )
    decoder = re.compile(r"layers\.N\.(paligemma|expert)\.")
    streams = {
        run: {m.group(1) for n in names if (m := decoder.search(n))}
        for run, names in (("lora", lora), ("fsdp2", full))
    }
    assert streams == {"lora": {"expert"}, "fsdp2": {"paligemma", "expert"}}
    # nor SigLIP's layers or the token table (the root unit's own few, the projector's say, always are)
    assert not [n for n in lora if "encoder.layers" in n or "embed_tokens" in n]


def test_lora_under_fsdp2_trains_lerobots_default_targets(out: Path) -> None:
    """The expert's q/v projections and the action projections (LeRobot's pattern names pi0's time MLP,
    `action_time_mlp_*`, which pi0.5 lacks), PaliGemma untouched."""
    model_dir = saved_model(out / "lora")
    with safe_open(str(model_dir / "adapter_model.safetensors"), "pt") as handle:
        names = list(handle.keys())
        lora_b = [handle.get_tensor(n) for n in names if ".lora_B." in n]
    targets = {name.split(".lora_")[0].removeprefix("base_model.model.model.") for name in names}
    expert = {f"paligemma_with_expert.layers.{i}.expert.self_attn.{p}_proj" for i in range(2) for p in "qv"}
    assert targets == expert | {"action_in_proj", "action_out_proj"}
    assert any(t.abs().sum() > 0 for t in lora_b)  # the adapters moved from their zero start


@pytest.mark.parametrize(("kind", "grads"), [("lerobot_pi0_tiny", 81), ("lerobot_pi05_tiny", 84)])
def test_fsdp2_on_the_policys_units_gives_lerobots_loss_and_the_same_gradients(
    out: Path, kind: str, grads: int
) -> None:
    result = json.loads((out / f"{kind}.json").read_text())
    assert result["sharded_loss"] == result["plain_loss"]
    assert abs(result["sharded_loss"] - result["reference_loss"]) < 1e-5
    assert result["same_grad_names"] and result["grads"] == grads  # every trainable tensor but the 7 unread
    assert result["max_grad_diff"] < 1e-6
    assert result["max_action_diff"] < 1e-5


@pytest.mark.parametrize("kind", KINDS)
def test_the_token_embedding_is_looked_up_on_each_ranks_rows(out: Path, kind: str) -> None:
    """Sharded by FSDP2, the table is never gathered (its unit's forward never runs) and each rank reads
    its own rows: every rank's own tokens (their counts differ) get the unsharded table's embeddings
    bit for bit, and the table the average of the unsharded gradients, as FSDP2 averages them."""
    result = json.loads((out / f"{kind}.json").read_text())
    assert result["table_forwards"] == 0
    assert result["table_shard_rows"] == 242  # of 483: no rank holds the table
    assert result["embeddings_equal"]
    assert result["max_table_grad_diff"] < 1e-6


def test_the_sharded_save_writes_the_gathered_tables_bytes(out: Path) -> None:
    """The FSDP2 run's model.safetensors, each rank's rows sent to the main rank in pieces (the token
    embedding's 483 rows split 242 / 241), has the bytes the safetensors library writes for its tensors
    and the values of the same step's DCP shards."""
    model_dir = saved_model(out / "fsdp2")
    written = (model_dir / "model.safetensors").read_bytes()
    tensors = load(written)
    assert written == save(tensors, metadata={"format": "pt"})
    from_dcp = ckpt_tools.load_model_state_dict(str(model_dir / "pytorch_model_fsdp_0"))
    assert tensors.keys() == from_dcp.keys() and all(torch.equal(tensors[k], from_dcp[k]) for k in tensors)


def test_the_tables_gradient_accumulates_with_the_sync_off(out: Path) -> None:
    """FSDP2's gradient sync off for a micro-batch, bfloat16 compute, float32 reduction: the row-sharded
    table still gets the unsharded gradients' average (within bfloat16's rounding of the inputs)."""
    result = json.loads((out / "accumulated.json").read_text())
    assert result["dtype"] == "torch.float32"
    assert result["max_diff"] < 0.05
