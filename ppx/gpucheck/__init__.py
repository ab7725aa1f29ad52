"""`ppx gpu-check`: every CUDA path of ppx checked on the GPUs a machine has, from real runs.

Each check (`orchestrate.CHECKS`: timers, memory, saved, profiler, bf16, overlap, nccl,
throughput, split) is the ``ppx run``s it needs (`runs`) and pure functions from what they recorded
(summary.json, metrics.jsonl, timeline.json, profiler traces) to rows of figure, threshold and
verdict (`verdict`); `report` writes gpu-check.md and gpu-check.json."""
