#!/usr/bin/env bats
# LoRA training (issue 30; runtime/lora.h, the terms in runtime/forward.c lora_add and train/grad.c
# lora_backward): adapters beside the frozen base, PEFT's format out.
# - Gradients of every lora_A and lora_B against PyTorch autograd through PEFT's unmerged model
#   (tests/fixtures/lora/make_lora_fixtures.py: nonzero A and B on three fixture models), at 1x1,
#   tp 2, pp 2, tp 2 x pp 2, 1F1B and recompute, with test_grad.c's tolerance (1e-5 of max(1,
#   max|ref|): both sides fp32; the adapters add two small matmuls per projection to the same
#   summation-order differences the base's gradients have; measured worst 2.3e-6).
# - sft --lora-r on stories260K lowers the held-out loss by sft.bats' own margin (0.1; measured
#   2.047 -> 1.790, more than full training's 1.876 at the same lr and steps), and the checkpoint
#   is a PEFT adapter: transformers + peft load it and give Tandem's logprobs (eval --adapter and the
#   --merge'd model) within eval.bats' 1e-4, which the base alone misses by far.
# - The base is frozen: no gradients and no moments for it in the memory plan.
# - Layouts: every layout draws the same A (from --seed) and B = 0, so step 1 is the base model's
#   loss bit for bit; later steps follow 1x1 within resume_layout.bats' 1e-5 (other summation orders).
# - --lora-dropout: masks from the run's seed, the step and each token's place in the step (kernels.h
#   dropout_keep; any micro-batch / dp split the same); gradients against autograd with the same masks,
#   resume bit for bit.
# - --resume: the checkpoint holds the adapter and its moments (optimizer/exp_avg, exp_avg_sq as
#   adapter files): bit for bit at the same layout, within 1e-5 after tp / dp / ZeRO-1 changes.
# - rm (the score head trained in full, PEFT's modules_to_save) and dpo (the reference is the base
#   with the adapters off) meet pref.bats' held-out thresholds; peft scores rm's adapter alike.
# - ppo: grpo and gae with adapters on the actor (and the critic) meet ppo.bats' thresholds, the
#   reference is the actor's base with its adapters off, rollout logprobs == training logprobs every
#   step (tp 2 too), and --resume continues bit for bit.
load helpers

TG="$ROOT/build/tests/test_grad"

# lora_grad MODEL TP PP [1f1b]: test_grad with the fixture's adapter on TP*PP ranks; every rank ok
lora_grad() {
    local model=$1 tp=$2 pp=$3 n=$(($2 * $3))
    run_ranks 120 "$n" env TANDEM_TEST_LORA="$FIX/lora/$model" "$TG" "$FIX/models/$model" "$FIX/lora/$model.json" \
        "$tp" "$pp" ${4:-}
    echo "$output" | grep -E 'worst|loss|FAIL'
    [ "$status" -eq 0 ]
    [ "$(grep -c 'ok: grad' <<<"$output")" -eq "$n" ]
    [ "$(grep -c ' 28 gradient tensors\| 14 gradient tensors' <<<"$output")" -eq "$n" ]
}

@test "lora grad: every lora_A / lora_B gradient matches PEFT's autograd at 1x1, tp 2, pp 2, tp 2 x pp 2 (llama_gqa, qwen2_bias, mistral_swa)" {
    for model in llama_gqa qwen2_bias mistral_swa; do
        run timeout 60 env TANDEM_TEST_LORA="$FIX/lora/$model" "$TG" "$FIX/models/$model" "$FIX/lora/$model.json"
        echo "$output" | grep -E 'worst|loss|FAIL'
        [ "$status" -eq 0 ]
        grep -q 'ok: grad loss, 28 gradient tensors' <<<"$output"
        lora_grad $model 2 1
        lora_grad $model 1 2
        lora_grad $model 2 2
    done
}

@test "lora grad at tp 4 with 2 kv heads: a replicated kv head's lora_B gets its gradient once and the same on its replicas" {
    lora_grad llama_gqa 4 1
}

@test "lora grad: 1F1B micro-batches and recompute (the same bits as keeping every activation)" {
    lora_grad llama_gqa 1 2 1f1b
    run_ranks 120 4 env TANDEM_TEST_RECOMPUTE=1 TANDEM_TEST_LORA="$FIX/lora/llama_gqa" "$TG" \
        "$FIX/models/llama_gqa" "$FIX/lora/llama_gqa.json" 2 2
    [ "$status" -eq 0 ]
    [ "$(grep -c 'recompute: gradients and loss bit-identical' <<<"$output")" -eq 4 ]
}

@test "lora grad with --lora-dropout: PEFT's autograd with Tandem's masks (make_lora_dropout_fixture.py reimplements dropout_keep) at 1x1, tp 2, pp 2, tp 2 x pp 2; recompute draws the same masks" {
    for lay in "1 1 1" "2 2 1" "2 1 2" "4 2 2"; do
        set -- $lay
        run_ranks 120 "$1" env TANDEM_TEST_LORA_DROPOUT="0.25 19088743" TANDEM_TEST_LORA="$FIX/lora/llama_gqa" "$TG" \
            "$FIX/models/llama_gqa" "$FIX/lora/llama_gqa_dropout.json" "$2" "$3"
        echo "$output" | grep -E 'worst|loss|FAIL'
        [ "$status" -eq 0 ]
        [ "$(grep -c 'ok: grad' <<<"$output")" -eq "$1" ]
    done
    run timeout 60 env TANDEM_TEST_RECOMPUTE=1 TANDEM_TEST_LORA_DROPOUT="0.25 19088743" TANDEM_TEST_LORA="$FIX/lora/llama_gqa" "$TG" \
        "$FIX/models/llama_gqa" "$FIX/lora/llama_gqa_dropout.json"
    [ "$status" -eq 0 ]
    grep -q 'recompute: gradients and loss bit-identical' <<<"$output"
}

@test "sft --lora-dropout: masks from --seed, the step and the token's place: resume bit for bit, tp 2 draws 1x1's masks, eval without dropout; ppo refuses it" {
    need_assets
    make_rev_data "$BATS_TEST_TMPDIR"
    t="$BATS_TEST_TMPDIR"
    A=(sft --model "$STORIES" --data "$t/rev_train.jsonl" --eval-data "$t/rev_val.jsonl" --seq-len 32 --batch-size 8 --max-steps 6
       --lr 3e-3 --threads 1 --lora-r 4 --save-every 2 --eval-every 2)
    "$TANDEM" "${A[@]}" --out "$t/d0" 2>/dev/null
    "$TANDEM" "${A[@]}" --lora-dropout 0.1 --out "$t/d" 2>/dev/null
    # step 1's loss (B = 0: no adapter term) and the eval before it are the same; the masks change the
    # gradient (of B, through the dropped-out input) and what follows
    [ "$(jq -s -c '[.[0].eval_loss, .[1].loss]' "$t/d0/metrics.jsonl")" = "$(jq -s -c '[.[0].eval_loss, .[1].loss]' "$t/d/metrics.jsonl")" ]
    [ "$(jq -s '.[1].grad_norm' "$t/d0/metrics.jsonl")" != "$(jq -s '.[1].grad_norm' "$t/d/metrics.jsonl")" ]
    ! diff <(jq .loss "$t/d0/metrics.jsonl") <(jq .loss "$t/d/metrics.jsonl") >/dev/null
    [ "$(jq .lora_dropout "$t/d/checkpoint-6/adapter_config.json")" = 0.1 ]
    "$TANDEM" "${A[@]}" --lora-dropout 0.1 --out "$t/r" --stop-after 2 2>/dev/null
    run "$TANDEM" "${A[@]}" --lora-dropout 0.1 --out "$t/r" --resume "$t/r/checkpoint-2"
    [ "$status" -eq 0 ]
    diff <(numbers "$t/d/metrics.jsonl") <(numbers "$t/r/metrics.jsonl")
    cmp "$t/d/checkpoint-6/adapter_model.safetensors" "$t/r/checkpoint-6/adapter_model.safetensors"
    run timeout 200 $MPIRUN 2 "$TANDEM" "${A[@]}" --lora-dropout 0.1 --out "$t/tp" --tp 2
    [ "$status" -eq 0 ]
    within 1e-5 <(losses "$t/d") <(losses "$t/tp")
    [ "$(losses "$t/tp" | wc -l)" -eq 6 ]
    run_one_line "--lora-dropout 1: must be in [0, 1)" "$TANDEM" "${A[@]}" --lora-dropout 1 --out "$t/x"
    run_one_line "--lora-dropout 0.1: ppo runs its adapters without dropout" "$TANDEM" ppo --actor "$STORIES" --reward-cmd "$RULE" \
        --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 2 --out "$t/x" --lora-r 4 --lora-dropout 0.1
}

@test "sft --lora-dropout: the masks follow each token's place in the step, not the split: batch 8 == 2 micro-batches of 4 == dp 2 (within 1e-5), and a resume at dp 2 continues the 1x1 run within 1e-5" {
    need_assets
    make_rev_data "$BATS_TEST_TMPDIR"
    t="$BATS_TEST_TMPDIR"
    A=(sft --model "$STORIES" --data "$t/rev_train.jsonl" --seq-len 32 --max-steps 6 --lr 3e-3 --threads 1 --lora-r 4
       --lora-dropout 0.1 --save-every 2)
    "$TANDEM" "${A[@]}" --batch-size 8 --out "$t/one" 2>/dev/null
    "$TANDEM" "${A[@]}" --batch-size 4 --micro-batches 2 --out "$t/two" 2>/dev/null
    run timeout 200 $MPIRUN 2 "$TANDEM" "${A[@]}" --batch-size 4 --out "$t/dp"
    [ "$status" -eq 0 ]
    # (each rank drawing its own masks, these differed by 1e-2 from step 2 on)
    within 1e-5 <(losses "$t/one") <(losses "$t/two")
    within 1e-5 <(losses "$t/one") <(losses "$t/dp")
    [ "$(losses "$t/dp" | wc -l)" -eq 6 ]
    run timeout 200 $MPIRUN 2 "$TANDEM" "${A[@]}" --batch-size 4 --zero 1 --out "$t/one" --resume "$t/one/checkpoint-2" --overwrite
    [ "$status" -eq 0 ]
    within 1e-5 <(losses "$t/two") <(losses "$t/one")
    [ "$(losses "$t/one" | wc -l)" -eq 6 ]
}

@test "sft --lora-r --resume: the checkpoint's adapter_config.json is the truth: every LoRA flag may be left out (bit for bit), a disagreeing one is one line naming it" {
    need_assets
    make_rev_data "$BATS_TEST_TMPDIR"
    t="$BATS_TEST_TMPDIR"
    A=(sft --model "$STORIES" --data "$t/rev_train.jsonl" --seq-len 32 --batch-size 8 --max-steps 4 --lr 3e-3 --threads 1 --save-every 2)
    L=(--lora-r 4 --lora-alpha 32 --lora-rslora --lora-target q_proj,v_proj,down_proj --lora-dropout 0.1)
    "$TANDEM" "${A[@]}" "${L[@]}" --out "$t/straight" 2>/dev/null
    "$TANDEM" "${A[@]}" "${L[@]}" --out "$t/s" --stop-after 2 2>/dev/null
    # no LoRA flag at all (before: "config.json: cannot read"), and --lora-r alone (before: alpha 16,
    # all-linear, no rsLoRA, no dropout: another model, and 16 in the next adapter_config.json)
    for given in "" "--lora-r 4"; do
        rm -rf "$t/r" && cp -r "$t/s" "$t/r"
        run "$TANDEM" "${A[@]}" $given --out "$t/r" --resume "$t/r/checkpoint-2"
        [ "$status" -eq 0 ]
        diff <(numbers "$t/straight/metrics.jsonl") <(numbers "$t/r/metrics.jsonl")
        cmp "$t/straight/checkpoint-4/adapter_model.safetensors" "$t/r/checkpoint-4/adapter_model.safetensors"
        cmp "$t/straight/checkpoint-4/adapter_config.json" "$t/r/checkpoint-4/adapter_config.json"
    done
    c="$t/s/checkpoint-2/adapter_config.json"
    R=("$TANDEM" "${A[@]}" --out "$t/s" --resume "$t/s/checkpoint-2")
    run_one_line "--lora-r 8: --resume $t/s/checkpoint-2 is a LoRA checkpoint of rank 4 ($c: \"r\")" "${R[@]}" --lora-r 8
    run_one_line "--lora-r 0: --resume $t/s/checkpoint-2 is a LoRA checkpoint of rank 4" "${R[@]}" --lora-r 0
    run_one_line "--lora-alpha 16: the checkpoint's $c has lora_alpha 32" "${R[@]}" --lora-alpha 16
    run_one_line "--lora-target all-linear: the checkpoint's $c has target_modules q_proj,v_proj,down_proj" "${R[@]}" --lora-target all-linear
    run_one_line "--lora-dropout 0.2: the checkpoint's $c has lora_dropout 0.1" "${R[@]}" --lora-dropout 0.2
    "$TANDEM" "${A[@]}" --lora-r 4 --max-steps 2 --out "$t/plain" 2>/dev/null
    run_one_line "--lora-rslora: the checkpoint's $t/plain/checkpoint-2/adapter_config.json has use_rslora false" \
        "$TANDEM" "${A[@]}" --out "$t/plain" --resume "$t/plain/checkpoint-2" --lora-rslora
    # a lora_alpha past the range in the checkpoint is named where it is read
    jq '.lora_alpha = 1e39' "$c" > "$t/c.json" && mv "$t/c.json" "$c"
    run_one_line "$c: field \"lora_alpha\" must be a number > 0 and <= 1e+06" "${R[@]}"
}

@test "ppo --lora-r --resume: a LoRA checkpoint resumes without the LoRA flags (its actor/adapter_config.json), the same metrics" {
    need_story
    t="$BATS_TEST_TMPDIR"
    A=(ppo --actor "$STORIES" --reward-cmd "$RULE" --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 2 --rollout-batch-size 2
       --max-new-tokens 8 --steps 2 --threads 1 --actor-lr 3e-3)
    run timeout 120 "$TANDEM" "${A[@]}" --lora-r 4 --lora-alpha 32 --out "$t/straight"
    [ "$status" -eq 0 ]
    run timeout 120 "$TANDEM" "${A[@]}" --lora-r 4 --lora-alpha 32 --out "$t/r" --save-every 1 --stop-after 1
    [ "$status" -eq 0 ]
    run timeout 120 "$TANDEM" "${A[@]}" --out "$t/r" --resume "$t/r/checkpoint-1"
    [ "$status" -eq 0 ]
    diff <(numbers "$t/straight/metrics.jsonl") <(numbers "$t/r/metrics.jsonl")
    run_one_line "--lora-alpha 16: the checkpoint's $t/r/checkpoint-1/actor/adapter_config.json has lora_alpha 32" \
        "$TANDEM" "${A[@]}" --out "$t/r" --resume "$t/r/checkpoint-1" --lora-alpha 16
}

stories_data() {
    jq -Rsc 'split("\n\n") | map(select(length > 80)) | .[] | (split(". ")) as $s | select(($s | length) > 2)
             | {prompt: ($s[0] + "."), response: (" " + ($s[1:] | join(". ")))}' \
        "$ASSETS/data/pretrain/tinystories_train_head.txt" > "$BATS_TEST_TMPDIR/all.jsonl"
    head -n 400 "$BATS_TEST_TMPDIR/all.jsonl" > "$BATS_TEST_TMPDIR/train.jsonl"
    sed -n 401,460p "$BATS_TEST_TMPDIR/all.jsonl" > "$BATS_TEST_TMPDIR/val.jsonl"
}

@test "sft --lora-r: stories260K's held-out loss falls (sft.bats' 0.1); the checkpoint is a PEFT adapter that peft loads with Tandem's logprobs; --merge; the base frozen" {
    need_assets
    need_hfpy
    stories_data
    t="$BATS_TEST_TMPDIR"
    run "$TANDEM" sft --model "$STORIES" --data "$t/train.jsonl" --eval-data "$t/val.jsonl" --out "$t/o" --seq-len 256 \
        --batch-size 8 --max-steps 30 --lr 2e-3 --warmup 3 --threads 2 --lora-r 8 --lora-alpha 16 --merge
    [ "$status" -eq 0 ]
    b=$(grep eval_loss "$t/o/metrics.jsonl" | head -1 | jq .eval_loss); a=$(grep eval_loss "$t/o/metrics.jsonl" | tail -1 | jq .eval_loss)
    echo "eval loss $b -> $a"
    awk -v a="$a" -v b="$b" 'BEGIN { exit !(b - a > 0.1) }'
    # the base frozen: gradients and moments are the adapters' (46K floats), not the model's (256K)
    plan=$(grep -A1 '^memory plan' <<<"$output" | tail -1)
    echo "$plan"
    awk '{ exit !($9 < 0.25 && $10 < 0.5) }' <<<"$plan"
    ck="$t/o/checkpoint-30"
    [ -f "$ck/adapter_config.json" ] && [ -f "$ck/adapter_model.safetensors" ] && [ -f "$ck/trainer_state.json" ]
    [ "$(jq -r '.peft_type + " " + (.r | tostring) + " " + (.target_modules | length | tostring)' "$ck/adapter_config.json")" = "LORA 8 7" ]
    # PEFT's own forward of the saved adapter (unmerged) against Tandem's
    head -3 "$t/val.jsonl" | jq -c '{text: (.prompt + .response)}' > "$t/in.jsonl"
    run timeout 120 "$HFPY" "$ROOT/eval/hf_reference.py" --model "$STORIES" --adapter "$ck" --input "$t/in.jsonl" --out "$t/ref.jsonl" --greedy 8
    [ "$status" -eq 0 ]
    for m in "--model $STORIES --adapter $ck" "--model $t/o/merged"; do
        run "$TANDEM" eval --dtype fp32 $m --reference "$t/ref.jsonl" --max-logprob-diff 1e-4 --quiet
        echo "$m: ${lines[-1]}"
        [ "$status" -eq 0 ]
        echo "${lines[-1]}" | jq -e '.pass and .greedy_mismatches == 0'
    done
    # the adapter matters: the base alone misses PEFT's logprobs by far
    run "$TANDEM" eval --dtype fp32 --model "$STORIES" --reference "$t/ref.jsonl" --max-logprob-diff 1e-4 --quiet
    [ "$status" -ne 0 ]
    echo "${lines[-1]}" | jq -e '.max_abs_logprob_diff > 0.1'
}

@test "sft --lora-r at tp 2, pp 2 and dp 2 ZeRO-1: step 1 is the base model's loss bit for bit (B = 0, the same A); the run follows 1x1 within 1e-5" {
    need_assets
    make_rev_data "$BATS_TEST_TMPDIR"
    t="$BATS_TEST_TMPDIR"
    A=(sft --model "$STORIES" --data "$t/rev_train.jsonl" --seq-len 32 --batch-size 8 --max-steps 6 --lr 3e-3 --threads 1)
    "$TANDEM" "${A[@]}" --out "$t/full" --max-steps 1 2>/dev/null
    "$TANDEM" "${A[@]}" --lora-r 4 --out "$t/one" 2>/dev/null
    "$TANDEM" "${A[@]}" --lora-r 4 --micro-batches 2 --out "$t/two" 2>/dev/null   # dp 2's step: 2 micro-batches
    # the adapters' memory is the backend's (cpu-guarded: the host never touches it): the same bits
    "$TANDEM" "${A[@]}" --lora-r 4 --device cpu-guarded --out "$t/guarded" 2>/dev/null
    diff <(jq .loss "$t/one/metrics.jsonl") <(jq .loss "$t/guarded/metrics.jsonl")
    [ "$(jq -s '.[0].loss' "$t/full/metrics.jsonl")" = "$(jq -s '.[0].loss' "$t/one/metrics.jsonl")" ]
    for lay in "one --tp 2" "one --pp 2" "two --zero 1"; do
        set -- $lay
        ref=$1; shift
        run timeout 200 $MPIRUN 2 "$TANDEM" "${A[@]}" --lora-r 4 --out "$t/l$1$2" "$@"
        [ "$status" -eq 0 ]
        echo "$*: $(jq .loss "$t/l$1$2/metrics.jsonl" | tr '\n' ' ') vs $(jq .loss "$t/$ref/metrics.jsonl" | tr '\n' ' ')"
        within 1e-5 <(losses "$t/$ref") <(losses "$t/l$1$2")
        [ "$(losses "$t/l$1$2" | wc -l)" -eq 6 ]
        cmp "$t/one/checkpoint-6/adapter_config.json" "$t/l$1$2/checkpoint-6/adapter_config.json"
    done
}

@test "sft --lora-r --resume: bit for bit at the same layout (the adapter and its AdamW moments in the checkpoint); 1x1 -> tp 2 -> dp 2 ZeRO-1 follows within 1e-5" {
    need_assets
    make_rev_data "$BATS_TEST_TMPDIR"
    t="$BATS_TEST_TMPDIR"
    A=(sft --model "$STORIES" --data "$t/rev_train.jsonl" --seq-len 32 --batch-size 8 --max-steps 6 --lr 3e-3 --threads 1
       --lora-r 4 --save-every 2)
    "$TANDEM" "${A[@]}" --out "$t/straight" 2>/dev/null
    "$TANDEM" "${A[@]}" --out "$t/s" --stop-after 2 2>/dev/null
    [ -f "$t/s/checkpoint-2/optimizer/exp_avg/adapter_model.safetensors" ] && [ -f "$t/s/checkpoint-2/optimizer/optimizer.json" ]
    run "$TANDEM" "${A[@]}" --out "$t/s" --resume "$t/s/checkpoint-2"
    [ "$status" -eq 0 ]
    diff <(jq .loss "$t/straight/metrics.jsonl") <(jq .loss "$t/s/metrics.jsonl")
    cmp "$t/straight/checkpoint-6/adapter_model.safetensors" "$t/s/checkpoint-6/adapter_model.safetensors"
    run timeout 200 $MPIRUN 2 "$TANDEM" "${A[@]}" --out "$t/s" --resume "$t/s/checkpoint-2" --tp 2 --stop-after 4 --overwrite
    [ "$status" -eq 0 ]
    [[ "$output" == *"saved with tp=1 pp=1 dp=1 zero=0, now tp=2 pp=1 dp=1 zero=0"* ]]
    run timeout 200 $MPIRUN 2 "$TANDEM" "${A[@]}" --micro-batches 1 --batch-size 4 --zero 1 --out "$t/s" --resume "$t/s/checkpoint-4" --overwrite
    [ "$status" -eq 0 ]
    within 1e-5 <(losses "$t/straight") <(losses "$t/s")
    [ "$(losses "$t/s" | wc -l)" -eq 6 ]
    # a full-training checkpoint is not a LoRA one
    "$TANDEM" sft --model "$STORIES" --data "$t/rev_train.jsonl" --seq-len 32 --max-steps 1 --out "$t/full" 2>/dev/null
    run_one_line "checkpoint-1/adapter_config.json: missing: --lora-r resumes from a LoRA run's checkpoint" \
        "$TANDEM" "${A[@]}" --out "$t/full" --resume "$t/full/checkpoint-1"
}

@test "rm --lora-r: held-out accuracy on the story pairs rises from chance to >= 0.9 (pref.bats' thresholds), the score head trained in full; peft scores the saved adapter as rm --score --adapter does" {
    need_assets
    need_hfpy
    t="$BATS_TEST_TMPDIR"
    run timeout 300 "$TANDEM" rm --model "$STORIES" --data "$PF/story_train.jsonl" --eval-data "$PF/story_val.jsonl" \
        --out "$t/rm" --seq-len 64 --batch-size 8 --lr 3e-3 --epochs 3 --log-every 20 --lora-r 8
    [ "$status" -eq 0 ]
    a0=$(jq -s 'map(select(.eval_accuracy)) | first.eval_accuracy' "$t/rm/metrics.jsonl")
    a1=$(jq -s 'map(select(.eval_accuracy)) | last.eval_accuracy' "$t/rm/metrics.jsonl")
    echo "held-out accuracy $a0 -> $a1"
    awk -v a="$a0" -v b="$a1" 'BEGIN { exit !(a < 0.7 && b >= 0.9) }'
    ck="$t/rm/checkpoint-78"
    [ "$(jq -c '[.task_type, .modules_to_save]' "$ck/adapter_config.json")" = '["SEQ_CLS",["classifier","score"]]' ]
    head -4 "$PF/story_val.jsonl" | jq -c '{prompt, response: .chosen}' > "$t/s.jsonl"
    run "$TANDEM" rm --score --model "$STORIES" --adapter "$ck" --input "$t/s.jsonl" --output "$t/s.out"
    [ "$status" -eq 0 ]
    # the eval reward statistics beside the adapter, applied by --adapter: reward_normalized = (r - mean) / std
    jq -e '.mean and .std > 0' "$ck/reward_stats.json"
    jq -s -e --slurpfile st "$ck/reward_stats.json" 'map(((.reward - $st[0].mean) / $st[0].std - .reward_normalized) | fabs < 1e-5) | all' "$t/s.out"
    # --merge (a second short run): the merged reward model scores as base + adapter (its trained head in it)
    run timeout 300 "$TANDEM" rm --model "$STORIES" --data "$PF/story_train.jsonl" --out "$t/rm2" --seq-len 64 --batch-size 8 \
        --lr 3e-3 --max-steps 10 --lora-r 8 --merge
    [ "$status" -eq 0 ]
    "$TANDEM" rm --score --model "$t/rm2/merged" --input "$t/s.jsonl" --output "$t/m.out" 2>/dev/null
    "$TANDEM" rm --score --model "$STORIES" --adapter "$t/rm2/checkpoint-10" --input "$t/s.jsonl" --output "$t/a.out" 2>/dev/null
    diff <(jq .reward "$t/m.out") <(jq .reward "$t/a.out")
    jq -c '{text: (.prompt + .response)}' "$t/s.jsonl" | "$TANDEM" tokenize --tokenizer "$STORIES" --jsonl | jq -c '.input_ids + [2]' > "$t/ids.jsonl"
    # PEFT's sequence classifier with the saved adapter: the same scores (fp32 both sides; 1e-5, pref.bats' layout tolerance)
    cat > "$t/peft_score.py" <<'PY'
import json, sys, torch
from transformers import AutoModelForSequenceClassification
from peft import PeftModel
base, ck, ids, out = sys.argv[1:]
m = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, torch_dtype=torch.float32)
m.config.pad_token_id = 0
pm = PeftModel.from_pretrained(m, ck).eval()
ours = [json.loads(l)["reward"] for l in open(out)]
worst = 0.0
for l, r in zip(open(ids), ours):
    with torch.no_grad():
        s = float(pm(torch.tensor([json.loads(l)])).logits[0, 0])
    worst = max(worst, abs(s - r))
print(f"max |peft - tandem| {worst:.3g}")
assert worst < 1e-5
PY
    run timeout 120 "$HFPY" "$t/peft_score.py" "$STORIES" "$ck" "$t/ids.jsonl" "$t/s.out"
    echo "$output" | tail -1
    [ "$status" -eq 0 ]
}

@test "dpo --lora-r: the reference is the base with the adapters off (no second copy; step 1 is ln 2 exactly); held-out accuracy and the property's rate in samples rise (pref.bats' thresholds)" {
    need_assets
    t="$BATS_TEST_TMPDIR"
    run timeout 300 "$TANDEM" dpo --model "$STORIES" --data "$PF/story_train.jsonl" --eval-data "$PF/story_val.jsonl" \
        --out "$t/dpo" --seq-len 64 --batch-size 8 --lr 1e-3 --epochs 3 --beta 0.1 --log-every 20 --lora-r 8
    [ "$status" -eq 0 ]
    # one copy of the weights in the plan (full DPO holds the policy and its reference: twice)
    w=$(grep -A1 '^memory plan' <<<"$output" | tail -1 | awk '{ print $7 }')
    echo "weights MiB $w"
    awk -v w="$w" 'BEGIN { exit !(w > 0.9 && w < 1.1) }'
    [ "$(jq -c 'select(.step == 1) | [.loss, ."rewards/chosen", ."rewards/rejected"]' "$t/dpo/metrics.jsonl")" = "[0.693147181,0,0]" ]
    a1=$(jq -s 'map(select(."eval_rewards/accuracies")) | last."eval_rewards/accuracies"' "$t/dpo/metrics.jsonl")
    echo "held-out implicit-reward accuracy -> $a1"
    awk -v a="$a1" 'BEGIN { exit !(a >= 0.7) }'
    jq -c --argjson k 16 'range(0; $k) as $j | {prompt, seed: (50000 + $j)}' "$PF/story_prompts_val.jsonl" > "$t/g.jsonl"
    for m in "" "--adapter $t/dpo/checkpoint-78"; do
        "$TANDEM" generate --model "$STORIES" $m --input "$t/g.jsonl" --output "$t/g.out" --max-new-tokens 48 2>/dev/null
        jq -s '[.[].completion | test("\\bhappy\\b"; "i")] | map(if . then 1 else 0 end) | add / length' "$t/g.out" >> "$t/rates"
    done
    echo "property rate before / after: $(paste -sd' ' "$t/rates")"
    awk 'NR == 1 { b = $1 } NR == 2 { a = $1 } END { exit !(a >= 3 * b && a >= 0.2) }' "$t/rates"
}

# rule_rate MODEL [ARGS]: ppo.bats' held-out rule score (4 samples of each held-out prompt)
rule_rate() {
    jq -c 'range(0; 4) as $j | {prompt, seed: (70000 + $j)}' "$PF/story_prompts_val.jsonl" > "$BATS_TEST_TMPDIR/hv.jsonl"
    "$TANDEM" generate --model "$@" --input "$BATS_TEST_TMPDIR/hv.jsonl" --output "$BATS_TEST_TMPDIR/hv.out" --max-new-tokens 48 2>/dev/null
    jq -s '[.[].completion | test("\\bhappy\\b"; "i")] | map(if . then 1 else 0 end) | add / length' "$BATS_TEST_TMPDIR/hv.out"
}

@test "grpo --lora-r: the reference is the actor's base with its adapters off (no reference model; KL 0 at step 1); rollout logprobs == training logprobs every step; the held-out rule score rises (ppo.bats' thresholds)" {
    need_story
    t="$BATS_TEST_TMPDIR"
    run timeout 300 "$TANDEM" ppo --actor "$STORIES" --reward-cmd "$RULE" --prompts "$TRAIN" --out "$t/grpo" --advantage grpo \
        --n-samples-per-prompt 8 --rollout-batch-size 8 --max-new-tokens 48 --steps 10 --kl-coef 0 --kl-loss-coef 0.001 \
        --actor-lr 3e-3 --log-every 5 --lora-r 8 --merge
    echo "$output" | grep -E "^step|placement"
    [ "$status" -eq 0 ]
    [[ "$output" != *"ref ranks"* ]]
    [ "$(jq -s 'map(.rollout_logprob_diff_max) | unique' "$t/grpo/metrics.jsonl" -c)" = "[0]" ]
    [ "$(jq -s '.[0]["actor/kl"]' "$t/grpo/metrics.jsonl")" = 0 ]
    [ "$(jq -s '.[-1]["actor/kl"] > 0' "$t/grpo/metrics.jsonl")" = true ]
    before=$(rule_rate "$STORIES"); after=$(rule_rate "$STORIES" --adapter "$t/grpo/checkpoint-10/actor")
    echo "grpo LoRA: held-out rule score $before -> $after"
    # --merge: OUT/merged/actor is the base with the last adapters merged as --adapter merges them
    cp "$BATS_TEST_TMPDIR/hv.out" "$t/adapter.out"
    rule_rate "$t/grpo/merged/actor" >/dev/null
    cmp "$t/adapter.out" "$BATS_TEST_TMPDIR/hv.out"
    awk -v b="$before" -v a="$after" 'BEGIN { exit !(a >= 0.5 && a >= 3 * b) }'
}

@test "ppo (gae) --lora-r on the actor and the critic (its score head in full) at tp 2: rollout == training logprobs, the reward rises (ppo.bats' > 2); --resume continues bit for bit" {
    need_story
    t="$BATS_TEST_TMPDIR"
    "$TANDEM" rm --model "$STORIES" --data "$PF/story_train.jsonl" --out "$t/rm" --seq-len 64 --batch-size 8 --lr 3e-3 --epochs 3 2>/dev/null
    RM="$t/rm/checkpoint-78"
    A=(ppo --actor "$STORIES" --critic "$RM" --reward "$RM" --prompts "$TRAIN" --rollout-batch-size 16 --max-new-tokens 48
       --kl-coef 0.01 --actor-lr 3e-3 --critic-lr 1e-2 --log-every 5 --lora-r 8 --actor-tp 2 --critic-tp 2)
    # 30 steps: the score's climb is machine-dependent in its first 20 (an AVX-512 EPYC, 2026-11-29:
    # last-5 mean 2.35 at 20 steps, a rise of 1.76; 4.2 from step 23 on)
    run timeout 300 $MPIRUN 2 "$TANDEM" "${A[@]}" --steps 30 --out "$t/ppo"
    [ "$status" -eq 0 ]
    [ "$(jq -s 'map(.rollout_logprob_diff_max) | unique' "$t/ppo/metrics.jsonl" -c)" = "[0]" ]
    first=$(jq -s '[.[0:5][]["critic/score/mean"]] | add / 5' "$t/ppo/metrics.jsonl")
    last=$(jq -s '[.[-5:][]["critic/score/mean"]] | add / 5' "$t/ppo/metrics.jsonl")
    echo "RM score (first 5 / last 5 steps) $first -> $last"
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b - a > 2) }'
    [ "$(jq -c '[.task_type, .modules_to_save]' "$t/ppo/checkpoint-30/critic/adapter_config.json")" = '["SEQ_CLS",["classifier","score"]]' ]
    # --resume: 4 steps straight, and 2 + 2 through a checkpoint (the adapters and their moments)
    run timeout 300 $MPIRUN 2 "$TANDEM" "${A[@]}" --steps 4 --out "$t/s4"
    [ "$status" -eq 0 ]
    run timeout 300 $MPIRUN 2 "$TANDEM" "${A[@]}" --steps 4 --out "$t/r" --save-every 2 --stop-after 2
    [ "$status" -eq 0 ]
    run timeout 300 $MPIRUN 2 "$TANDEM" "${A[@]}" --steps 4 --out "$t/r" --resume "$t/r/checkpoint-2"
    [ "$status" -eq 0 ]
    diff <(numbers "$t/s4/metrics.jsonl") <(numbers "$t/r/metrics.jsonl")
    cmp "$t/s4/checkpoint-4/actor/adapter_model.safetensors" "$t/r/checkpoint-4/actor/adapter_model.safetensors"
}

@test "ppo --ROLE-adapter: an sft LoRA adapter as the actor's start (merged: KL 0 at step 1; with --lora-r: the adapters trained on), an rm LoRA adapter as the reward on a causal-LM base" {
    need_story
    t="$BATS_TEST_TMPDIR"
    make_rev_data "$t"
    "$TANDEM" sft --model "$STORIES" --data "$t/rev_train.jsonl" --seq-len 32 --batch-size 8 --max-steps 5 --lr 3e-3 --threads 1 \
        --lora-r 8 --out "$t/sft" 2>/dev/null
    A=(ppo --actor "$STORIES" --actor-adapter "$t/sft/checkpoint-5" --reward-cmd "$RULE" --prompts "$TRAIN" --advantage grpo
       --n-samples-per-prompt 4 --rollout-batch-size 4 --max-new-tokens 16 --steps 2 --kl-coef 0 --kl-loss-coef 0.001 --actor-lr 3e-3)
    run timeout 120 "$TANDEM" "${A[@]}" --out "$t/merged"
    [ "$status" -eq 0 ]
    # the reference is the starting policy, base + the same adapter: identical weights at step 1
    [ "$(jq -s '.[0]["actor/kl"]' "$t/merged/metrics.jsonl")" = 0 ]
    run timeout 120 "$TANDEM" "${A[@]}" --out "$t/lora" --lora-r 8
    [ "$status" -eq 0 ]
    # the policy runs the adapter unmerged, the reference merged: the same function up to fp32 rounding
    [ "$(jq -s '.[0]["actor/kl"] | fabs < 1e-5' "$t/lora/metrics.jsonl")" = true ]
    [ "$(jq -s 'map(.rollout_logprob_diff_max) | unique' "$t/lora/metrics.jsonl" -c)" = "[0]" ]
    # the adapter matters: the first rollout's samples differ from the base's
    run timeout 120 "$TANDEM" ppo --actor "$STORIES" --reward-cmd "$RULE" --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 4 \
        --rollout-batch-size 4 --max-new-tokens 16 --steps 1 --kl-coef 0 --actor-lr 3e-3 --out "$t/base"
    [ "$status" -eq 0 ]
    [ "$(jq -s '.[0]["response_length/mean"]' "$t/base/metrics.jsonl")" != "$(jq -s '.[0]["response_length/mean"]' "$t/merged/metrics.jsonl")" ] ||
        [ "$(jq -s '.[0]["actor/entropy"]' "$t/base/metrics.jsonl")" != "$(jq -s '.[0]["actor/entropy"]' "$t/merged/metrics.jsonl")" ]
    # a reward model trained as a LoRA adapter (its score head in it) on the causal-LM base
    "$TANDEM" rm --model "$STORIES" --data "$PF/story_train.jsonl" --out "$t/rm" --seq-len 64 --batch-size 8 --lr 3e-3 --max-steps 20 \
        --lora-r 8 2>/dev/null
    run timeout 120 "$TANDEM" ppo --actor "$STORIES" --reward "$STORIES" --reward-adapter "$t/rm/checkpoint-20" --prompts "$TRAIN" \
        --advantage grpo --n-samples-per-prompt 4 --rollout-batch-size 4 --max-new-tokens 16 --steps 1 --kl-coef 0 --actor-lr 3e-4 --out "$t/rw"
    [ "$status" -eq 0 ]
    run_one_line "--actor-adapter $t/none: not a directory" "$TANDEM" "${A[@]}" --actor-adapter "$t/none" --out "$t/x"
}

@test "--lora-r with --zero 2 and 3 at dp 2: plain dp's bits for sft, rm (score head in the adapters) and grpo; ZeRO-3 slices the frozen base" {
    need_story
    make_rev_data "$BATS_TEST_TMPDIR"
    t="$BATS_TEST_TMPDIR"
    for z in 0 2 3; do
        run timeout 200 $MPIRUN 2 "$TANDEM" sft --model "$STORIES" --data "$t/rev_train.jsonl" --eval-data "$t/rev_val.jsonl" --seq-len 32 \
            --batch-size 8 --max-steps 4 --lr 3e-3 --threads 1 --lora-r 4 --eval-every 2 --zero $z --out "$t/s$z"
        [ "$status" -eq 0 ]
        run timeout 200 $MPIRUN 2 "$TANDEM" rm --model "$STORIES" --data "$PF/story_train.jsonl" --eval-data "$PF/story_val.jsonl" \
            --seq-len 64 --batch-size 4 --lr 3e-3 --max-steps 4 --lora-r 4 --zero $z --out "$t/r$z"
        [ "$status" -eq 0 ]
        run timeout 200 $MPIRUN 2 "$TANDEM" ppo --actor "$STORIES" --reward-cmd "$RULE" --prompts "$TRAIN" --advantage grpo \
            --n-samples-per-prompt 4 --rollout-batch-size 4 --max-new-tokens 16 --steps 2 --kl-coef 0 --kl-loss-coef 0.001 \
            --actor-lr 3e-3 --lora-r 4 --zero $z --out "$t/p$z"
        [ "$status" -eq 0 ]
    done
    for z in 2 3; do
        diff <(numbers "$t/s0/metrics.jsonl") <(numbers "$t/s$z/metrics.jsonl")
        cmp "$t/s0/checkpoint-4/adapter_model.safetensors" "$t/s$z/checkpoint-4/adapter_model.safetensors"
        diff <(numbers "$t/r0/metrics.jsonl") <(numbers "$t/r$z/metrics.jsonl")
        cmp "$t/r0/checkpoint-4/adapter_model.safetensors" "$t/r$z/checkpoint-4/adapter_model.safetensors"
        diff <(numbers "$t/p0/metrics.jsonl") <(numbers "$t/p$z/metrics.jsonl")
    done
    run_one_line "--merge with --zero 3: the merge needs the whole weights" "$TANDEM" sft --model "$STORIES" --data "$t/rev_train.jsonl" \
        --out "$t/x" --lora-r 4 --merge --zero 3
}

@test "sft --lora-*: bad settings are one line each" {
    need_assets
    make_rev_data "$BATS_TEST_TMPDIR"
    A=(sft --model "$STORIES" --data "$BATS_TEST_TMPDIR/rev_train.jsonl" --out "$BATS_TEST_TMPDIR/x" --max-steps 1)
    run_one_line "--lora-r -1: must be >= 0" "$TANDEM" "${A[@]}" --lora-r -1
    run_one_line "--merge: merges LoRA adapters; give --lora-r" "$TANDEM" "${A[@]}" --merge
    run_one_line "--lora-target q_proj,x_proj: x_proj is not a projection" "$TANDEM" "${A[@]}" --lora-r 4 --lora-target q_proj,x_proj
    run_one_line "--lora-alpha 0: must be > 0" "$TANDEM" "${A[@]}" --lora-r 4 --lora-alpha 0
    run_one_line "--lora-alpha 1e+07: must be > 0 and <= 1e+06" "$TANDEM" "${A[@]}" --lora-r 4 --lora-alpha 1e7
    # an empty target list trained nothing (grad norm 0) and saved an adapter --adapter refuses
    run_one_line "--lora-target '': names no projection" "$TANDEM" "${A[@]}" --lora-r 4 --lora-target ''
    run_one_line "--lora-target ',': names no projection" "$TANDEM" "${A[@]}" --lora-r 4 --lora-target ,
    # without --lora-r these were ignored and the run trained every weight (sft, rm, dpo, ppo)
    for f in "--lora-alpha 32" "--lora-target q_proj" "--lora-rslora" "--lora-dropout 0.1"; do
        run_one_line "${f%% *}: a LoRA setting without --lora-r: the run would train every weight" "$TANDEM" "${A[@]}" $f
    done
    for cmd in rm dpo; do
        run_one_line "--lora-alpha: a LoRA setting without --lora-r" "$TANDEM" $cmd --model "$STORIES" --data "$PF/story_train.jsonl" \
            --out "$BATS_TEST_TMPDIR/x" --lora-alpha 32
    done
    P=(ppo --actor "$STORIES" --reward-cmd "$RULE" --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 2 --out "$BATS_TEST_TMPDIR/x")
    run_one_line "--lora-target: a LoRA setting without --lora-r" "$TANDEM" "${P[@]}" --lora-target q_proj
    run_one_line "--lora-target '': names no projection" "$TANDEM" "${P[@]}" --lora-r 4 --lora-target ''
    # an adapter to train on is read at its own rank and scale: a disagreeing flag is named with the file
    "$TANDEM" "${A[@]}" --lora-r 4 --lora-alpha 8 --out "$BATS_TEST_TMPDIR/a4" 2>/dev/null
    c="$BATS_TEST_TMPDIR/a4/checkpoint-1/adapter_config.json"
    # (after ppo's placement line; before: "expected [8, 64] from config.json")
    for f in "--lora-r 8|\"r\" is 4, but --lora-r is 8: give --lora-r 4" "--lora-r 4|\"lora_alpha\" 8, but --lora-alpha 16: give --lora-alpha 8"; do
        run "$TANDEM" "${P[@]}" --max-new-tokens 4 --steps 1 --actor-adapter "$BATS_TEST_TMPDIR/a4/checkpoint-1" ${f%%|*}
        echo "$output"
        [ "$status" -eq 1 ]
        [[ "${lines[-1]}" == "tandem: $c: ${f#*|}"* ]]
    done
}
