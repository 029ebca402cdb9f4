"""The training engine: the run plan, the loop, checkpointing, two-phase resume, PEFT, end-of-training publishing."""
