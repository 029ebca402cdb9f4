"""The two packages as installed distributions: names of their own on the package index, one version
each (the pyproject takes it from the package), the trainer requiring ckpt-tools by its distribution
name, and both commands. `.ci/fresh-install` does the real thing in a fresh venv with pip alone."""

from __future__ import annotations

from importlib.metadata import distribution, entry_points

from packaging.requirements import Requirement

import ckpt_tools
import trainer


def test_distribution_names_versions_and_commands() -> None:
    tools, engine = distribution("ckpt-tools"), distribution("ckpt-trainer")
    assert tools.version == ckpt_tools.__version__ and engine.version == trainer.__version__
    needs = {Requirement(line).name for line in engine.requires or [] if "extra ==" not in line}
    assert "ckpt-tools" in needs and "trainer" not in needs
    scripts = {ep.name: ep.value for ep in entry_points(group="console_scripts")}
    assert scripts["ckpt"] == "ckpt_tools.cli.app:main" and scripts["trainer"] == "trainer.cli:main"
