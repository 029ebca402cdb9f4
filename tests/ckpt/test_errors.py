"""The two error helpers everything shares: `one_line` and `main_decides`."""

from __future__ import annotations

import pytest

from ckpt_tools import CorruptCheckpointError, one_line
from ckpt_tools.training import main_decides


def test_one_line_folds_whitespace_and_names_the_type_of_unexpected_errors() -> None:
    assert one_line(CorruptCheckpointError("a\n  b")) == "a b"
    assert one_line(KeyError("x")) == "KeyError: 'x'"
    assert one_line(OSError("disk\nfull"), expected=(Exception,)) == "disk full"
    assert one_line(RuntimeError()) == "RuntimeError: RuntimeError"
    assert one_line("  two\nlines ") == "two lines"


class _Refused(Exception):
    pass


def _raise(exc: Exception) -> int:
    raise exc


@pytest.mark.usefixtures("one_rank")
def test_main_decides_shares_the_value_or_raises_the_chosen_error() -> None:
    """On a process group (one rank, gloo): the value comes back; an expected failure becomes `error`
    with its line, without the original chained; a bug keeps its own type and traceback."""
    assert main_decides(lambda: 7, error=_Refused) == 7
    with pytest.raises(_Refused, match=r"^broken step$") as refused:
        main_decides(lambda: _raise(CorruptCheckpointError("broken\nstep")), error=_Refused)
    assert refused.value.__cause__ is None and refused.value.__suppress_context__
    with pytest.raises(KeyError):
        main_decides(lambda: _raise(KeyError("bug")), error=_Refused)


def test_main_decides_without_a_process_group_just_computes() -> None:
    assert main_decides(lambda: "alone", error=_Refused) == "alone"
    with pytest.raises(CorruptCheckpointError):
        main_decides(lambda: _raise(CorruptCheckpointError("x")), error=_Refused)
