#!/usr/bin/env bats
# --device for training (sft, rm, dpo, ppo, bench --train): the training step's memory (gradients,
# Adam moments and the bf16 master, kept activations, the batch's ids, the loss hook's buffers) is
# the model's backend's, and AdamW and the gradient norm are backend entries. --device cpu-guarded
# (kernels/cpu/guarded.c: the CPU kernels behind memory the host cannot touch) completing a run is
# the proof that the host reads and writes that memory only through to_host / to_device; here each
# run also gives --device cpu's bytes: metrics.jsonl (timings removed) and every checkpoint file
# (safetensors of the weights and the optimizer state, state files). One thread: the guard's mprotect calls cost far more
# beside a second spinning thread, and the bits do not depend on it (README).
load helpers

setup_file() {
    make_rev_data "$BATS_FILE_TMPDIR"   # reverse 4 digits (helpers.bash)
    # ppo's reward model and critic: one rm step from stories260K (a new score head)
    if [ -e "$STORIES/config.json" ]; then
        "$TANDEM" rm --model "$STORIES" --data "$PF/story_train.jsonl" --out "$BATS_FILE_TMPDIR/rm" --seq-len 64 \
            --batch-size 4 --max-steps 1 --lr 1e-3 --threads 1 2>/dev/null
    fi
}

G="--device cpu-guarded"

# metrics.jsonl without what measures time
untimed() { sed -E 's/, "(tokens_per_s|samples_per_s|timing_s\/[a-z_]+)": [0-9.e+-]+//g' "$1"; }
# same_out A B [SKIP]: the same files in two runs' --out, each byte for byte (metrics.jsonl untimed),
# but files named SKIP; at least one checkpoint's weights and optimizer state among them
same_out() {
    local a="$1" b="$2" skip="${3:-}" f n=0
    diff <(cd "$a" && find . -type f | sort) <(cd "$b" && find . -type f | sort)
    for f in $(cd "$a" && find . -type f | sort); do
        [ -n "$skip" ] && [ "$(basename "$f")" = "$skip" ] && continue
        case $f in
            *metrics.jsonl) [ -s "$a/$f" ]; diff <(untimed "$a/$f") <(untimed "$b/$f") ;;
            *) cmp "$a/$f" "$b/$f" ;;
        esac
        case $f in *.safetensors) n=$((n + 1)) ;; esac
    done
    echo "$a = $b: $n weight / optimizer files"
    [ "$n" -ge 3 ]
}

random_model() {
    need_assets
    "$TANDEM" convert --from random --shape 64,256,2,4,4,512,64 --tokenizer "$ASSETS/models/stories260K/tok512.model" \
        --seed 1 --out "$1" 2>/dev/null
}

@test "device train: sft on cpu-guarded equals cpu (fp32 and bf16, eval and checkpoints; recompute with 2 micro-batches), and a guarded resume equals the straight run" {
    random_model "$BATS_TEST_TMPDIR/m"
    A=(--model "$BATS_TEST_TMPDIR/m" --data "$BATS_FILE_TMPDIR/rev_train.jsonl" --eval-data "$BATS_FILE_TMPDIR/rev_val.jsonl"
       --seq-len 32 --batch-size 8 --max-steps 4 --lr 3e-3 --warmup 2 --save-every 2 --eval-every 2 --weight-decay 0.1 --threads 1)
    for d in fp32 bf16; do
        for dev in cpu cpu-guarded; do
            "$TANDEM" sft "${A[@]}" --dtype $d --device $dev --out "$BATS_TEST_TMPDIR/$d.$dev" 2> "$BATS_TEST_TMPDIR/err"
        done
        grep -q '| device               | cpu-guarded' "$BATS_TEST_TMPDIR/err"   # the summary names it
        same_out "$BATS_TEST_TMPDIR/$d.cpu" "$BATS_TEST_TMPDIR/$d.cpu-guarded"
    done
    # stop at 2, resume on cpu-guarded: the straight cpu run's bytes (the state went to the file and back)
    "$TANDEM" sft "${A[@]}" --dtype bf16 $G --out "$BATS_TEST_TMPDIR/split" --stop-after 2 2>/dev/null
    "$TANDEM" sft "${A[@]}" --dtype bf16 $G --out "$BATS_TEST_TMPDIR/split" --resume "$BATS_TEST_TMPDIR/split/checkpoint-2" 2>/dev/null
    same_out "$BATS_TEST_TMPDIR/bf16.cpu" "$BATS_TEST_TMPDIR/split"
    # --recompute full, 2 micro-batches a step
    for dev in cpu cpu-guarded; do
        "$TANDEM" sft "${A[@]}" --recompute full --micro-batches 2 --batch-size 4 --device $dev --out "$BATS_TEST_TMPDIR/rc.$dev" 2>/dev/null
    done
    same_out "$BATS_TEST_TMPDIR/rc.cpu" "$BATS_TEST_TMPDIR/rc.cpu-guarded"
}

@test "device train: rm and dpo on cpu-guarded equal cpu (metrics, eval, checkpoints)" {
    need_story
    A=(--model "$STORIES" --data "$PF/story_train.jsonl" --eval-data "$PF/story_val.jsonl" --seq-len 64 --batch-size 4
       --max-steps 2 --save-every 1 --lr 1e-3 --threads 1)
    for c in rm dpo; do
        for dev in cpu cpu-guarded; do
            "$TANDEM" $c "${A[@]}" --device $dev --out "$BATS_TEST_TMPDIR/$c.$dev" 2>/dev/null
        done
        same_out "$BATS_TEST_TMPDIR/$c.cpu" "$BATS_TEST_TMPDIR/$c.cpu-guarded"
    done
    # rm --score through the device too
    head -4 "$PF/story_val.jsonl" | jq -c '{prompt, response: .chosen}' > "$BATS_TEST_TMPDIR/s.jsonl"
    for dev in cpu cpu-guarded; do
        "$TANDEM" rm --score --model "$BATS_TEST_TMPDIR/rm.cpu/checkpoint-2" --input "$BATS_TEST_TMPDIR/s.jsonl" \
            --output "$BATS_TEST_TMPDIR/s.$dev" --device $dev --threads 1 2>/dev/null
    done
    cmp "$BATS_TEST_TMPDIR/s.cpu" "$BATS_TEST_TMPDIR/s.cpu-guarded"
}

@test "device train: ppo on cpu-guarded equals cpu (gae: actor, critic, reference, reward model; grpo bf16 with entropy and KL loss), in one process and as 4 role ranks" {
    need_story
    RM="$BATS_FILE_TMPDIR/rm/checkpoint-1"
    A=(--actor "$STORIES" --critic "$RM" --reward "$RM" --prompts "$TRAIN" --n-samples-per-prompt 2 --rollout-batch-size 2
       --max-new-tokens 8 --steps 2 --save-every 1 --kl-coef 0.01 --actor-lr 3e-4 --critic-lr 1e-3 --threads 1)
    for dev in cpu cpu-guarded; do
        "$TANDEM" ppo "${A[@]}" --device $dev --out "$BATS_TEST_TMPDIR/gae.$dev" 2>/dev/null
    done
    same_out "$BATS_TEST_TMPDIR/gae.cpu" "$BATS_TEST_TMPDIR/gae.cpu-guarded"
    # each role its own rank (and device local_rank % devices); the results move between roles as
    # host copies. The placement differs, so ppo_state.json does.
    run timeout 60 $MPIRUN 4 "$TANDEM" ppo "${A[@]}" $G --out "$BATS_TEST_TMPDIR/four" --actor-ranks 1 --critic-ranks 1 \
        --ref-ranks 1 --reward-ranks 1
    [ "$status" -eq 0 ]
    same_out "$BATS_TEST_TMPDIR/gae.cpu" "$BATS_TEST_TMPDIR/four" ppo_state.json
    B=(--actor "$STORIES" --reward-cmd "$RULE" --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 2 --rollout-batch-size 2
       --max-new-tokens 8 --steps 2 --kl-coef 0 --kl-loss-coef 0.01 --entropy-coef 0.01 --actor-lr 3e-4 --dtype bf16 --threads 1)
    for dev in cpu cpu-guarded; do
        "$TANDEM" ppo "${B[@]}" --device $dev --out "$BATS_TEST_TMPDIR/grpo.$dev" 2>/dev/null
    done
    same_out "$BATS_TEST_TMPDIR/grpo.cpu" "$BATS_TEST_TMPDIR/grpo.cpu-guarded"
}

@test "device train: bench --train runs on cpu-guarded (LM and --score) with cpu's loss" {
    M="$FIX/models/llama_gqa"
    for s in "" --score; do
        for dev in cpu cpu-guarded; do
            run "$TANDEM" bench --train $s --model "$M" --batch 2 --seq 16 --iters 2 --threads 1 --device $dev
            [ "$status" -eq 0 ]
            echo "$output" | grep '^{"bench": "train"' | jq -e '.tokens_per_s > 0' >/dev/null
            echo "$output" | grep '^{"bench": "train"' | jq .last_loss > "$BATS_TEST_TMPDIR/loss.$dev"
        done
        [[ "$output" == *"| device               | cpu-guarded"* ]]
        cat "$BATS_TEST_TMPDIR/loss.cpu-guarded"
        cmp "$BATS_TEST_TMPDIR/loss.cpu" "$BATS_TEST_TMPDIR/loss.cpu-guarded"
    done
}

@test "device train: --device cuda without a GPU: one line" {
    M="$FIX/models/llama_gqa"
    D=(--model "$M" --data "$BATS_FILE_TMPDIR/rev_train.jsonl" --out "$BATS_TEST_TMPDIR/o")
    if nvidia-smi -L >/dev/null 2>&1; then
        skip "a GPU is present: --device cuda runs"
    elif nm "$TANDEM" | grep -qE ' [DdRr] cuda_backend$'; then
        run_one_line "--device cuda: no usable CUDA device" "$TANDEM" sft "${D[@]}" --device cuda
        run_one_line "--device cuda: no usable CUDA device" "$TANDEM" bench --train --model "$M" --device cuda
    else
        run_one_line "--device cuda: this build has no CUDA backend" "$TANDEM" sft "${D[@]}" --device cuda
    fi
}

@test "device train: tp, pp and dp on cpu-guarded equal cpu (buffers staged through host memory): sft tp 2 x pp 2, dp 3, sequence parallel with LoRA, ZeRO-1 in bf16, ZeRO-2 at tp 2 x dp 2, ZeRO-3; ppo with a tp-2 actor under ZeRO-3" {
    need_story
    random_model "$BATS_TEST_TMPDIR/m"
    A=(--model "$BATS_TEST_TMPDIR/m" --data "$BATS_FILE_TMPDIR/rev_train.jsonl" --eval-data "$BATS_FILE_TMPDIR/rev_val.jsonl"
       --seq-len 32 --batch-size 6 --max-steps 2 --lr 3e-3 --save-every 2 --eval-every 2 --threads 1)
    # dp 3: the gradient mean divides by 3 (not a power of two: on the host, through a copy)
    for L in "4 --tp 2 --pp 2" "3" "2 --tp 2 --sequence-parallel --lora-r 4 --lora-dropout 0.1" "2 --zero 1 --dtype bf16" \
             "4 --tp 2 --zero 2" "2 --zero 3"; do
        set -- $L
        n=$1; shift
        o=$(echo "$L" | tr -d ' -')
        for dev in cpu cpu-guarded; do
            timeout 120 $MPIRUN $n "$TANDEM" sft "${A[@]}" "$@" --device $dev --out "$BATS_TEST_TMPDIR/$o.$dev" 2>/dev/null
        done
        same_out "$BATS_TEST_TMPDIR/$o.cpu" "$BATS_TEST_TMPDIR/$o.cpu-guarded"
    done
    RM="$BATS_FILE_TMPDIR/rm/checkpoint-1"
    B=(--actor "$STORIES" --critic "$RM" --reward "$RM" --prompts "$TRAIN" --n-samples-per-prompt 2 --rollout-batch-size 4
       --max-new-tokens 8 --steps 2 --save-every 2 --kl-coef 0.01 --actor-lr 3e-4 --critic-lr 1e-3 --threads 1
       --actor-ranks 2 --actor-tp 2 --critic-ranks 1 --ref-ranks 1 --reward-ranks 0 --zero 3)
    for dev in cpu cpu-guarded; do
        timeout 120 $MPIRUN 4 "$TANDEM" ppo "${B[@]}" --device $dev --out "$BATS_TEST_TMPDIR/ppo.$dev" 2>/dev/null
    done
    same_out "$BATS_TEST_TMPDIR/ppo.cpu" "$BATS_TEST_TMPDIR/ppo.cpu-guarded"
    grep -q '"rollout_logprob_diff_max": 0,' "$BATS_TEST_TMPDIR/ppo.cpu-guarded/metrics.jsonl"
}
