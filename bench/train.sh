#!/usr/bin/env bash
# Training throughput: Tandem (recompute none and full, separate processes for separate memory
# peaks) against PyTorch on the same random 15M-shape model, batch, length and threads, in one run.
# Usage: bench/train.sh [THREADS] [PYTHON]   (PYTHON: one with torch + transformers; default .venv/bin/python, `make pyenv`)
set -euo pipefail
cd "$(dirname "$0")/.."
TH=${1:-2}; PY=${2:-.venv/bin/python}
mkdir -p build/bench
[ -d build/bench/15M ] || bin/tandem convert --from random --shape 15M --out build/bench/15M
A="--model build/bench/15M --batch 8 --seq 256 --iters 3 --threads $TH"
t0=$(bin/tandem bench --train $A 2>/dev/null); echo "$t0"
bin/tandem bench --train $A --recompute full 2>/dev/null
p=$(OMP_WAIT_POLICY=PASSIVE "$PY" bench/train_pytorch.py $A); echo "$p"
awk -v a="$(echo "$t0" | jq .tokens_per_s)" -v b="$(echo "$p" | jq .tokens_per_s)" 'BEGIN { printf "tandem / pytorch = %.2fx\n", a / b }'
