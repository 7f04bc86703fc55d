#!/usr/bin/env bash
# tests/device_train_gpu.sh [DIR] — the training path on a lent GPU machine (not part of make test):
# the optimizer's CUDA entries against the CPU kernels (bit for bit: test_optim backend cuda); sft
# fp32 / bf16, rm, dpo and ppo on --device cuda beside --device cpu (step, loss, grad norm: the
# forward and backward kernels differ in the last bits); a bf16 sft stopped at 10 and resumed on
# cuda against the straight cuda run (bit for bit); ppo as 4 role ranks on cuda; bench --train 15M
# on cpu and cuda. DIR: the bundle (tests/cuda/bundle.sh DIR test_optim; default .device), carried.
set -u
source tests/cuda/device_env.sh "${1:-.device}" >/dev/null
nvidia-smi -L
T=$TANDEM MD=$TANDEM_ASSETS/models W=/tmp/device_train_gpu
S=$MD/stories260K-hf PF=tests/fixtures/pref
rm -rf "$W"; mkdir -p "$W"
echo "== optimizer entries"; timeout 60 "$TANDEM_BUNDLE/build/tests/test_optim" backend cuda 2>&1 | tail -2
awk 'BEGIN { srand(7); for (i = 0; i < 2200; i++) { s = ""; for (k = 0; k < 4; k++) s = s int(rand() * 10);
     r = ""; for (k = 4; k > 0; k--) r = r substr(s, k, 1);
     printf "{\"prompt\": \"%s=\", \"response\": \"%s\"}\n", s, r > (i < 2000 ? "'$W'/rt.jsonl" : "'$W'/rv.jsonl") } }'
$T convert --from random --shape 64,256,2,4,4,512,64 --tokenizer $MD/stories260K/tok512.model --seed 1 --out $W/m 2>/dev/null
# "step loss grad_norm" of every step (no jq there)
L() { grep '"loss"' $1/metrics.jsonl | sed -E 's/.*"step": ([0-9]+), "loss": ([^,]+).*"grad_norm": ([^,]+).*/\1 \2 \3/' | tr '\n' ' '; echo; }
A="--model $W/m --data $W/rt.jsonl --eval-data $W/rv.jsonl --seq-len 32 --batch-size 16 --max-steps 20 --lr 3e-3 --warmup 2
   --save-every 10 --eval-every 10 --threads 16"
for d in fp32 bf16; do for dev in cpu cuda; do
    timeout 60 $T sft $A --dtype $d --device $dev --out $W/s.$d.$dev 2> $W/e || tail -3 $W/e
    echo "sft $d $dev: $(L $W/s.$d.$dev | cut -c1-200)"; grep eval_loss $W/s.$d.$dev/metrics.jsonl | tail -1
done; done
timeout 60 $T sft $A --dtype bf16 --device cuda --out $W/split --stop-after 10 2>/dev/null
timeout 60 $T sft $A --dtype bf16 --device cuda --out $W/split --resume $W/split/checkpoint-10 2>/dev/null
for f in model-00001-of-00001.safetensors optimizer/exp_avg/model-00001-of-00001.safetensors \
         optimizer/exp_avg_sq/model-00001-of-00001.safetensors optimizer/master/model-00001-of-00001.safetensors; do
    cmp $W/s.bf16.cuda/checkpoint-20/$f $W/split/checkpoint-20/$f && echo "resume on cuda: $f same"
done
P="--model $S --data $PF/story_train.jsonl --eval-data $PF/story_val.jsonl --seq-len 64 --batch-size 8 --max-steps 6
   --save-every 6 --lr 1e-3 --threads 16"
for c in rm dpo; do for dev in cpu cuda; do
    timeout 60 $T $c $P --device $dev --out $W/$c.$dev 2> $W/e || tail -3 $W/e; echo "$c $dev: $(L $W/$c.$dev | cut -c1-200)"
done; done
RM=$W/rm.cuda/checkpoint-6
Q="--actor $S --critic $RM --reward $RM --prompts tests/fixtures/ppo/story_prompts_train.jsonl --n-samples-per-prompt 2
   --rollout-batch-size 4 --max-new-tokens 16 --steps 3 --kl-coef 0.01 --actor-lr 3e-4 --critic-lr 1e-3 --threads 16"
K='"critic/score/mean": [^,]*\|"actor/grad_norm": [^,]*\|"critic/grad_norm": [^,]*\|"rollout_logprob_diff_max": [^,]*'
for dev in cpu cuda; do
    timeout 90 $T ppo $Q --device $dev --out $W/ppo.$dev 2> $W/e || tail -3 $W/e
    echo "ppo $dev: $(grep -o "$K" $W/ppo.$dev/metrics.jsonl | tr '\n' ' ')"
done
timeout 120 mpirun --oversubscribe -np 4 $T ppo $Q --device cuda --out $W/ppo4 --actor-ranks 1 --critic-ranks 1 --ref-ranks 1 \
    --reward-ranks 1 2> $W/e > /dev/null || tail -3 $W/e
echo "ppo cuda, 4 role ranks: $(grep -o "$K" $W/ppo4/metrics.jsonl | tr '\n' ' ')"
$T convert --from random --shape 15M --out $W/15M 2>/dev/null
for dt in fp32 bf16; do for dev in cpu cuda; do
    echo "bench --train 15M 8 x 256 $dt $dev: $(timeout 120 $T bench --train --model $W/15M --batch 8 --seq 256 --iters 5 \
        --dtype $dt --device $dev --threads 16 2>/dev/null | grep -o '"tokens_per_s": [^,]*\|"last_loss": [^,]*' | tr '\n' ' ')"
done; done
# LoRA (issue 30) on the GPU beside the CPU: adapters with dropout in sft, adapters with the base as reference in dpo
for dev in cpu cuda; do
    timeout 60 $T sft $A --dtype bf16 --device $dev --lora-r 8 --lora-dropout 0.1 --out $W/lora.$dev 2> $W/e || tail -3 $W/e
    echo "sft lora bf16 $dev: $(L $W/lora.$dev | cut -c1-200)"
    timeout 60 $T dpo $P --device $dev --lora-r 8 --out $W/dpo_lora.$dev 2> $W/e || tail -3 $W/e
    echo "dpo lora $dev: $(L $W/dpo_lora.$dev | cut -c1-200)"
done
