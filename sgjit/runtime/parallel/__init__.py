"""Tensor parallelism: a model's layers split over ranks (`shard.py`), the collectives its forward
pass meets (`comm.py` over `group.py`), the step messages rank 0 sends the others (`step.py`), how
the ranks start and stop (`launch.py`) and what a rank other than 0 runs (`worker.py`).
docs/architecture.md says how the ranks run together."""
