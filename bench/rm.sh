#!/usr/bin/env bash
# Reward-model training throughput: Tandem (`bench --train --score`: new score head, Bradley–Terry over
# B/2 pairs) against a plain PyTorch Bradley–Terry loop (bench/rm_pytorch.py) on the same random
# 15M-shape model, batch, length and threads, in one run.
# Usage: bench/rm.sh [THREADS] [PYTHON]   (PYTHON: one with torch + transformers; default .venv/bin/python, `make pyenv`)
set -euo pipefail
cd "$(dirname "$0")/.."
TH=${1:-2}; PY=${2:-.venv/bin/python}
mkdir -p build/bench
[ -d build/bench/15M ] || bin/tandem convert --from random --shape 15M --out build/bench/15M
A="--model build/bench/15M --batch 8 --seq 256 --iters 3 --threads $TH"
t=$(bin/tandem bench --train --score $A 2>/dev/null); echo "$t"
p=$(OMP_WAIT_POLICY=PASSIVE "$PY" bench/rm_pytorch.py $A); echo "$p"
awk -v a="$(echo "$t" | jq .tokens_per_s)" -v b="$(echo "$p" | jq .tokens_per_s)" 'BEGIN { printf "tandem / pytorch = %.2fx\n", a / b }'
