"""Float32 rounding, for the tests that compare numbers computed in another order or on another CPU.

Two computations made on one machine in the same order are bit-exact (a resumed run against an
uninterrupted one, a streamed run against a local one): those tests compare with `torch.equal` and
stay so. Numbers computed in another order are not: a stored reference from another tool, another day
or another CPU (AVX-512, AMX, AVX2 and plain C++ loops split and order a sum differently), one batch
against micro-batches, one rank against several. Those tests compare within a bound derived from
float32 rounding and from the magnitudes of the tensors involved, written beside each comparison.

The tests that make such comparisons carry `@pytest.mark.numerics`; `nox -s tests_isa` runs them
again under AVX2 and under ATen's plain (`default`) kernels, so an expectation that holds on one CPU
only goes red in CI.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

U = 2.0**-24
"""float32's unit roundoff: one rounded operation is off by at most U relative to its exact result."""
EPS = 2.0**-23
"""float32's machine epsilon, the ulp of 1: ulp(x) <= EPS * |x| for every float32 x."""


def largest_magnitude(module: torch.nn.Module, run: Callable[[], Any]) -> float:
    """The largest |value| among the floating-point outputs of every submodule of `module` (and of the
    tensors `run` returns) while `run()` evaluates it: the scale of the roundings in that computation."""
    seen: list[float] = [0.0]

    def record(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point() and value.numel():
                seen.append(float(value.detach().abs().max()))
        elif isinstance(value, tuple | list):
            for item in value:
                record(item)
        elif isinstance(value, dict):
            for item in value.values():
                record(item)

    hooks = [m.register_forward_hook(lambda _m, _i, out: record(out)) for m in module.modules()]
    try:
        record(run())
    finally:
        for hook in hooks:
            hook.remove()
    return max(seen)
