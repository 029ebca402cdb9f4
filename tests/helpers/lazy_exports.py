"""The two sides of a package that exports lazily: what its `if TYPE_CHECKING:` block imports (what
mypy and editors read) and what a fresh interpreter imports (what runs). `ckpt_tools` and `trainer`
both export this way (tests/ckpt/test_exported_members.py, tests/training/test_trainer_exports.py)."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path
from types import ModuleType


def type_checking_imports(package: ModuleType, modules: Collection[str] = ()) -> dict[str, str]:
    """What the `if TYPE_CHECKING:` block of `package`'s `__init__.py` imports: name -> module (a
    module imported by name, one of `modules`, e.g. `from ckpt_tools.files import storage`, maps to
    itself). Each import is checked to be an explicit re-export (`name as name`)."""
    tree = ast.parse(Path(inspect.getfile(package)).read_text(encoding="utf-8"))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
    )
    imported: dict[str, str] = {}
    for statement in block.body:
        assert isinstance(statement, ast.ImportFrom) and statement.module, ast.unparse(statement)
        for alias in statement.names:
            # `name as name`: an explicit re-export, which mypy --strict requires of a package
            assert alias.asname == alias.name, ast.unparse(statement)
            submodule = f"{statement.module}.{alias.name}"
            imported[alias.name] = submodule if submodule in modules else statement.module
    return imported


def modules_after(code: str) -> set[str]:
    """Run `code` in a fresh interpreter and return the top-level modules it imported (on stderr, so
    a command's own output on stdout stays apart)."""
    probe = f"{code}\nimport sys\nprint(' '.join({{m.split('.')[0] for m in sys.modules}}), file=sys.stderr)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return set(result.stderr.split())
