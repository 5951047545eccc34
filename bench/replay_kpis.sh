#!/usr/bin/env bash
# Issue 10's benchmark: both shared job traces under fifo, priority, las and clockq, the goals
# judged in the same run, then the simulator's speed on 100,000 generated jobs and 1,000 GPUs.
# About two minutes on a 2-core machine. Usage: bench/replay_kpis.sh [--markdown]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
$PY bench/replay_kpis.py "$@"
echo
echo "## Simulator speed"
echo
$PY bench/replay_speed.py --load 1.2
