"""The parts of a slice run, each doing one thing; workers/slice_runner.py runs them in order.

- `claim`: take a queued job for this worker, or say why not.
"""
