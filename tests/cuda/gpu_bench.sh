#!/usr/bin/env bash
# GPU benchmarks of issue 31, run on the lent GPU machine after `source tests/cuda/device_env.sh`:
# random models of real LLaMA shapes (TinyLlama 1.1B; LLaMA-2 7B when SHAPES names it), Tandem
# --device $DEV in bf16 and fp32 against the device's own copy bandwidth (measured in the same run,
# `bench --generate`) and against transformers on the same GPU (bench/hf_generate.py: batch-1 and
# batch-32 decode with 16-token prompts and 32 new tokens; prefill of 4 x 512 tokens); then, at each
# shape in bf16, `bench --kernels` (each forward kernel alone) and `bench --train` (4 x 512: tokens/s,
# for MFU). Run after gpu_check.py, the checks (a whole GPU call: both, in that order).
# Usage: tests/cuda/gpu_bench.sh [OUTDIR] [SHAPES]   (SHAPES default "1.1B"; "1.1B 7B" for both; 7B in
# bf16 only; DEVICE=cpu SHAPES=15M checks the script here)
# Writes OUTDIR/bench_<shape>.txt and prints the JSON lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=${1:-${OUT:-.}}; SHAPES=${2:-1.1B}
T=${TANDEM:-bin/tandem}; DEV=${DEVICE:-cuda}
shape_of() { case $1 in 15M) echo 15M ;; 1.1B) echo 2048,5632,22,32,4,32000,2048 ;; 7B) echo 4096,11008,32,32,32,32000,4096 ;; esac; }
py() { if declare -F without_bundle >/dev/null; then without_bundle python3 "$@"; else python3 "$@"; fi; }
for s in $SHAPES; do
    dir=/tmp/bench-$s
    log=$OUTDIR/bench_$s.txt
    t0=$(date +%s)
    [ -f $dir/model.safetensors ] || $T convert --from random --shape "$(shape_of $s)" --out $dir >/dev/null 2>&1
    echo "== $s: random model $(shape_of $s) written in $(( $(date +%s) - t0 )) s" | tee -a $log
    dts="bf16 fp32"; [ $s = 7B ] && dts=bf16   # 7B: bf16 only (device time)
    for d in $dts; do
        $T bench --generate --device $DEV --model $dir --dtype $d --seq 16 --new-tokens 32 --iters 3 2>>$log | tee -a $log | tail -1
        $T bench --device $DEV --model $dir --dtype $d --batch 4 --seq 512 --iters 3 2>>$log | tee -a $log | tail -1
    done
    py bench/hf_generate.py $dir --dtype bfloat16 --prompt 16 --new 32 --big 32 --pf-batch 4 --pf-seq 512 2>>$log | tee -a $log
    $T bench --kernels --device $DEV --model $dir --dtype bf16 --iters 3 2>>$log | tee -a $log | grep -E 'attention|launch'
    $T bench --train --device $DEV --model $dir --dtype bf16 --batch 4 --seq 512 --iters 2 2>>$log | tee -a $log | tail -1
    [ $s = 7B ] || py bench/hf_generate.py $dir --dtype float32 --prompt 16 --new 32 --big 32 --pf-batch 4 --pf-seq 512 --rounds 2 2>>$log | tee -a $log
    rm -rf $dir
done
