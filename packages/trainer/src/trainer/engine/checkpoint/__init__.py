"""The checkpoint wing: what a step directory gets from a run (saving), when the loop saves
(schedule), the pushes while training (hub_pushes), the end-of-run publish (publishing), both resume
phases (resume) and whether the run's checkpoints will fit on its disk (disk_forecast)."""
