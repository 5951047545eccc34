"""The parts of a slice run, each doing one thing; workers/slice_runner.py runs them in order.

- `claim`: take a queued job for this worker, or say why not.
- `restore`: bring the job's workload onto the GPU, warm or from its checkpoint.
- `steps`: plan a slice and step the workload until the slice is used up.
- `boundary`: read what the policy decides from at a slice's end, and ask it.
- `checkpointer`: snapshot, name and persist checkpoints; roll back to the last good one.
- `metrics_recorder`: the job's metric curves, saved with its checkpoints.
- `result_writer`: store a finished job's result before it counts as succeeded.
- `slice_writes`: the compare-and-set writes that end or continue a slice.
- `failures`: how a failed slice ends: retried, uncharged, or failed at once.
- `tiers`, `errors`, `outcome`: the small things the parts share.
"""
