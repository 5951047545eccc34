#!/usr/bin/env bash
# Issue 11's forecast benchmark: persistence, linear and the LSTM on every series in
# ../shared/data/load/ (horizon 15 min, seed 0), one table. About 6 minutes on a 2-core machine.
# Usage: bench/evaluate_predictor.sh [--markdown] [--only SUBSTRING] [--json-out FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
export CLOCKQ_VAR_DIR="${CLOCKQ_VAR_DIR:-$(mktemp -d)}"
exec .venv/bin/python bench/evaluate_predictor.py "$@"
