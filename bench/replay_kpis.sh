#!/usr/bin/env bash
# The replay benchmark: the shared job traces and a generated heavy-tailed one under fifo,
# priority, las and clockq, clockq's goals judged against the baselines of the same run, then
# the simulator's speed on 100,000 generated jobs and 1,000 GPUs.
# Usage: bench/replay_kpis.sh [--markdown] [--seed N] [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
$PY bench/replay_kpis.py "$@"
echo
echo "## Simulator speed"
echo
$PY bench/replay_speed.py --load 1.2
