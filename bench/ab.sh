#!/usr/bin/env bash
# A/B of two tandem binaries in one run, alternating A B A B so the VM's drift hits both alike:
# prefill (8 x 256), decode (32 sequences, greedy) and a training step (8 x 256, AdamW), on
# the random 15M shape at tp=2 (2 ranks, 1 thread each). Prints each round's tokens/s and the
# median B/A ratio per workload. Usage: bench/ab.sh BIN_A BIN_B [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
A=$1 B=$2 ROUNDS=${3:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p build/bench
[ -d build/bench/15M ] || bin/tandem convert --from random --shape 15M --out build/bench/15M 2>/dev/null
python3 -c 'import json; [print(json.dumps({"input_ids": [1 + (i * 7 + t * 13) % 31000 for t in range(16)]})) for i in range(32)]' \
    > build/bench/prompts32.jsonl
run() {   # BIN WORK -> tokens/s
    local bin=$1 work=$2 args
    case $work in
        prefill) args="--batch 8 --seq 256 --iters 3" ;;
        decode)   # 32 prompts of 16 tokens, 64 new each, greedy: the end report's decode-step rate
            mpirun -q --oversubscribe -np 2 "$bin" generate --model build/bench/15M --tp 2 --threads 1 --greedy \
                --input build/bench/prompts32.jsonl --output /dev/null --max-new-tokens 64 --ignore-eos 2>&1 |
                sed -n 's/.*decode steps [0-9]* tokens \([0-9.]*\) tok\/s.*/\1/p'
            return ;;
        train) args="--train --batch 8 --seq 256 --iters 3" ;;
    esac
    mpirun -q --oversubscribe -np 2 "$bin" bench --model build/bench/15M --tp 2 --threads 1 $args 2>/dev/null |
        grep '^{' | tail -1 | jq -r .tokens_per_s
}
for work in prefill decode train; do
    ra=() rb=()
    for ((i = 0; i < ROUNDS; i++)); do ra+=("$(run "$A" $work)"); rb+=("$(run "$B" $work)"); done
    printf '%s\n' "${ra[@]}" > /tmp/ab_a; printf '%s\n' "${rb[@]}" > /tmp/ab_b
    python3 - "$work" <<'PY'
import statistics, sys
a = [float(x) for x in open('/tmp/ab_a')]; b = [float(x) for x in open('/tmp/ab_b')]
print(f"{sys.argv[1]:8s} A {' '.join(f'{x:.0f}' for x in a)} | B {' '.join(f'{x:.0f}' for x in b)} tok/s | "
      f"median B/A {statistics.median(b) / statistics.median(a):.3f}")
PY
done
