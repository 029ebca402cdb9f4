"""Build ckpt_tools' API reference with pdoc: `python -W error docs/build_api.py OUTPUT_DIR`, what
`nox -s docs` runs (a pdoc warning, such as a public name that does not resolve, fails the build).

Documented: the package's public names (its `__all__`, each with the docstring of its definition) and
the two public modules, `layout` and `storage`. The package loads its names lazily and pdoc reads a
module's `__dict__`, so every public name is resolved first.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pdoc
import pdoc.render

import ckpt_tools


def build(output: Path) -> None:
    for name in ckpt_tools.__all__:
        getattr(ckpt_tools, name)
    pdoc.render.configure(docformat="markdown", show_source=False)
    pdoc.pdoc("ckpt_tools", "ckpt_tools.format.layout", "ckpt_tools.files.storage", output_directory=output)


if __name__ == "__main__":
    build(Path(sys.argv[1]))
