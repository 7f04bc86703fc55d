#!/usr/bin/env bash
# bench/cuda_matmul.sh [OUTDIR] [SHAPES] — on a GPU (after `source tests/cuda/device_env.sh`): the bf16
# tensor-core matmul (kernels/cuda/matmul_tc.cu, TANDEM_CUDA_MATMUL=tc, the default) against the SIMT
# kernel (TANDEM_CUDA_MATMUL=simt), in the same run (TANDEM_CUDA_TC_FAST=0: tc without its hi-only
# prefill kernel; the log says which), on random models of real shapes: each matmul alone
# (bench --kernels prints both), decode at batch 1 and 32 (16-token prompts, 32 new tokens), prefill
# 4 x 512, and a training step 4 x 512 (the backward is the SIMT SGEMM either way). SHAPES: 1.1B
# (default) and/or 7B. DEVICE=cpu-guarded SHAPES=15M checks the script here. Writes OUTDIR/matmul_<shape>.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-${OUT:-.}}; SHAPES=${2:-1.1B}
T=${TANDEM:-bin/tandem}; DEV=${DEVICE:-cuda}
shape_of() { case $1 in 15M) echo 15M ;; 1.1B) echo 2048,5632,22,32,4,32000,2048 ;; 7B) echo 4096,11008,32,32,32,32000,4096 ;; esac; }
for s in $SHAPES; do
    dir=/tmp/bench-$s log=$OUTDIR/matmul_$s.txt
    [ -f $dir/model.safetensors ] || $T convert --from random --shape "$(shape_of $s)" --dtype bf16 --out $dir >/dev/null 2>&1 ||
        $T convert --from random --shape "$(shape_of $s)" --out $dir >/dev/null 2>&1
    echo "== $s: TANDEM_CUDA_TC_FAST=${TANDEM_CUDA_TC_FAST:-1} (1: bf16-valued x at N > 32 on the hi-only tensor-core kernel; 0: the general one)" | tee -a $log
    $T bench --kernels --device $DEV --model $dir --dtype bf16 --iters 3 2>>$log | tee -a $log | grep -E 'proj|head|launch'
    for mm in tc simt; do
        e="TANDEM_CUDA_MATMUL=$mm"   # both explicit, whatever the default (kernels/cuda/cuda.h)
        echo "== $s bf16, matmul $mm" | tee -a $log
        env $e $T bench --generate --device $DEV --model $dir --dtype bf16 --seq 16 --new-tokens 32 --iters 3 2>>$log | tee -a $log | tail -1
        env $e $T bench --device $DEV --model $dir --dtype bf16 --batch 4 --seq 512 --iters 3 2>>$log | tee -a $log | tail -1
        env $e $T bench --train --device $DEV --model $dir --dtype bf16 --batch 4 --seq 512 --iters 2 2>>$log | tee -a $log | tail -1
    done
    rm -rf $dir
done
