"""`python -m trainer.cli`: the same entry point as the `trainer` console script."""

from trainer.cli.app import main

main()
