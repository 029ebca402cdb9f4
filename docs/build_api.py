"""Build ckpt_tools' API reference with pdoc: `python -W error docs/build_api.py OUTPUT_DIR`, what
`nox -s docs` runs (a pdoc warning, such as a public name that does not resolve, fails the build).

Documented, in ckpt_tools' two tiers: the package's public names (its `__all__`, each with the
docstring of its definition) with the public modules `layout` and `storage`, what an evaluation
pipeline imports; and `ckpt_tools.training`, the trainer's collective save and two-phase resume. Both
load their names lazily and pdoc reads a module's `__dict__`, so every public name is resolved first.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pdoc
import pdoc.render

import ckpt_tools
import ckpt_tools.training

TIERS = (ckpt_tools, ckpt_tools.training)


def build(output: Path) -> None:
    for tier in TIERS:
        for name in tier.__all__:
            getattr(tier, name)
    pdoc.render.configure(docformat="markdown", show_source=False)
    # `ckpt_tools.training` is a submodule named in `ckpt_tools.__all__`: pdoc documents it with the package
    pdoc.pdoc("ckpt_tools", "ckpt_tools.format.layout", "ckpt_tools.files.storage", output_directory=output)


if __name__ == "__main__":
    build(Path(sys.argv[1]))
