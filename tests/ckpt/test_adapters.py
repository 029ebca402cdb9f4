"""LoRA merge without peft gives the same function as peft's own base + adapter."""

from __future__ import annotations

import peft
import pytest
import torch
from torch import nn

from ckpt_tools.errors import CheckpointError
from ckpt_tools.state.adapters import merge_lora


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(4, 6)
        self.mid = nn.Linear(6, 6)
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        return self.head(torch.relu(self.mid(torch.relu(self.enc(x)))))


def adapted(use_rslora: bool):
    torch.manual_seed(0)
    base = Tiny()
    base_state = {k: v.clone() for k, v in base.state_dict().items()}
    config = peft.LoraConfig(
        r=2,
        lora_alpha=6,
        target_modules=["enc", "mid"],
        modules_to_save=["head"],
        use_rslora=use_rslora,
        alpha_pattern={"mid": 3},
    )
    model = peft.get_peft_model(base, config)
    with torch.no_grad():  # lora_B starts at zero: give it values so the merge matters
        for name, param in model.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                param.add_(torch.randn_like(param) * 0.3)
    adapter = peft.get_peft_model_state_dict(model)
    config_dict = {k: (sorted(v) if isinstance(v, set) else v) for k, v in config.to_dict().items()}
    return model, base_state, adapter, config_dict


@pytest.mark.numerics
@pytest.mark.parametrize("use_rslora", [False, True])
def test_merged_weights_reproduce_peft_outputs(use_rslora):
    model, base_state, adapter, config = adapted(use_rslora)
    merged = Tiny()
    merged.load_state_dict(merge_lora(base_state, adapter, config))
    x = torch.randn(8, 4)
    # (W + s * B @ A) @ x against W @ x + s * B @ (A @ x): the same terms summed in another order, each
    # order within (4 + rank) * U * sum(|terms|) of the exact result (U = 2**-24; terms and outputs are
    # O(1) here), so ~1e-6 apart at most; rtol 1e-5 (168 U) leaves margin, and a wrong scale, a swapped
    # A/B or a missed layer moves the outputs by ~1e-1.
    torch.testing.assert_close(merged(x), model(x), rtol=1e-5, atol=1e-6)


def test_inputs_are_not_modified():
    _, base_state, adapter, config = adapted(False)
    before = {k: v.clone() for k, v in base_state.items()}
    merge_lora(base_state, adapter, config)
    assert all(torch.equal(before[k], base_state[k]) for k in before)


def test_adapter_for_another_model_is_refused():
    _, base_state, adapter, config = adapted(False)
    del base_state["enc.weight"]
    with pytest.raises(CheckpointError, match="does not have"):
        merge_lora(base_state, adapter, config)


def test_dora_is_refused():
    _, base_state, adapter, config = adapted(False)
    with pytest.raises(CheckpointError, match="DoRA"):
        merge_lora(base_state, adapter, {**config, "use_dora": True})
