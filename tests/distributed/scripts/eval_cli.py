"""`trainer eval` as a torchrun script: tests launch the real CLI through tests/helpers/launch.py."""

import sys

from trainer.cli import main

if __name__ == "__main__":
    main(["eval", *sys.argv[1:]])
