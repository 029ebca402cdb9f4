"""The `trainer` command line: argument parsing, the generated flag list, the train and eval commands.

`main` is the console script (`trainer = "trainer.cli:main"`); `python -m trainer.cli` runs the same.
"""

from trainer.cli.app import main

__all__ = ["main"]
