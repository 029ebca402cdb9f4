"""The public surface of `trainer` is exactly this list, every name resolves where the lazy table says
it is defined, type checkers see the same names with their real signatures (the `TYPE_CHECKING`
imports), and `import trainer` never imports torch."""

from __future__ import annotations

import pytest

import trainer
from helpers.lazy_exports import modules_after, type_checking_imports

# Adding a name here is a decision about the stable API evaluation pipelines and LeRobot users type against.
PUBLIC = {"load_policy", "open_dataset"}


def test_all_is_exactly_the_public_list() -> None:
    assert set(trainer.__all__) == PUBLIC
    assert trainer.__all__ == sorted(trainer.__all__)


def test_type_checkers_see_the_lazy_table() -> None:
    """The `TYPE_CHECKING` imports (what mypy and editors read), the lazy table (what runs) and
    `__all__` name the same objects from the same modules: a name missing from either side fails."""
    assert type_checking_imports(trainer) == trainer._EXPORTS
    assert set(trainer._EXPORTS) == set(trainer.__all__)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_each_name_resolves_where_the_table_says_it_is_defined(name: str) -> None:
    """So `nox -s typecheck`'s strict run over the table's modules checks each definition itself."""
    member = getattr(trainer, name)
    assert member.__name__ == name and member.__module__ == trainer._EXPORTS[name]


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'load_polcy'"):
        _ = trainer.load_polcy


def test_import_does_not_import_torch() -> None:
    assert "torch" not in modules_after("import trainer; trainer.__all__")
