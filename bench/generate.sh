#!/usr/bin/env bash
# Generation benchmark on random-weight models of real shapes (llama2.c's stories15M and 110M):
# decode tokens/s at batch 1 and 32 against the read-bandwidth bound measured in the same run,
# prefill tokens/s, peak memory. Usage: bench/generate.sh [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
TH=${1:-2}
mkdir -p build/bench
for shape in 15M 110M; do
    [ -d build/bench/$shape ] || bin/tandem convert --from random --shape $shape --out build/bench/$shape
    new=128; [ $shape = 110M ] && new=32
    bin/tandem bench --generate --model build/bench/$shape --seq 16 --new-tokens $new --threads "$TH" 2>/dev/null
done
