#!/usr/bin/env bash
# One short GPU call, most important first, each step under its own timeout and written to $OUT as
# it finishes: the oracle harness (every entry, the invariances), the GPU checks (gpu_check.py), then
# 1.1B bf16: bench --kernels, bench --generate, bench --train (tokens/s -> MFU).
# Usage (on the GPU machine, repo root, bundle carried): bash tests/cuda/gpu_final.sh
set -u
source tests/cuda/device_env.sh >/dev/null 2>&1
O=${OUT:-/tmp}; T=$TANDEM
timeout 20 $TANDEM_BUNDLE/build/tests/cuda_vs_cpu > $O/ops.txt 2>&1; echo "ops rc=$? $(tail -1 $O/ops.txt)"
PYTHONUNBUFFERED=1 timeout 60 python3 tests/cuda/gpu_check.py --device cuda --assets $TANDEM_BUNDLE/assets --only parity,greedy_hf,batch,rollout,bf16 --out $O > $O/gpu_check.txt 2>&1
echo "check rc=$? $(tail -1 $O/gpu_check.txt)"; grep '^FAIL' $O/gpu_check.txt | cut -c1-300 | head -5
$T convert --from random --shape 2048,5632,22,32,4,32000,2048 --out /tmp/m1 >/dev/null 2>&1
timeout 25 $T bench --kernels --device cuda --model /tmp/m1 --dtype bf16 --iters 3 > $O/kernels.txt 2>/dev/null
grep -E 'attention|launch' $O/kernels.txt | cut -c1-150
timeout 30 $T bench --generate --device cuda --model /tmp/m1 --dtype bf16 --seq 16 --new-tokens 32 --iters 2 2>/dev/null | tail -1 > $O/generate.txt
cut -c1-420 $O/generate.txt
timeout 40 $T bench --train --device cuda --model /tmp/m1 --dtype bf16 --batch 4 --seq 512 --iters 2 > $O/train.txt 2>&1
tail -1 $O/train.txt | cut -c1-400
