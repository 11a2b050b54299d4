"""Tensor parallelism: the group as the model sees it, its collectives and head splits
(`distributed`), how every rank runs the same plan (`tp_group`), and the group's processes
(`tp_spawn`). The sharded layers themselves are `worker/layers/parallel.py`."""
