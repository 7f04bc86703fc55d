#!/usr/bin/env bats
# Expert parallelism (--ep E, runtime/moe_ep.c): the experts of a Mixture-of-Experts model split over
# E of the data-parallel ranks, tokens dispatched and returned by all-to-all in a fixed order. Every
# row goes through the same GEMMs as at ep 1 (a matmul's rows are independent) and each expert's
# gradient adds the source ranks' contributions by the dp reduction's own tree, so ep 2 gives ep 1's
# bytes: generate, eval, sft's weights and optimizer state, resume across ep, GRPO's rollouts and
# steps. The dp ranks finish their prompts / batches at different times (prompts of several lengths,
# an odd number of eval batches): the lockstep (moe_drain, moe_idle_pass) keeps the ep group in step;
# every multi-rank run has a hang guard.
load helpers

MOE="mixtral_tiny qwen2_moe_tiny qwen3_moe_tiny"

@test "ep: generate at ep 2 (dp 2), tp 2 x ep 2 and pp 2 x ep 2 gives ep 1's bytes (greedy, logprobs, prompts finishing at different steps)" {
    for f in $MOE; do
        p="$BATS_TEST_TMPDIR/p.jsonl"
        jq -c '{id, input_ids, max_new_tokens: (.greedy_ids | length)}' "$FIX/refs/$f.jsonl" > "$p"
        jq -c '{id: (.id + "-h"), input_ids: .input_ids[0:(.input_ids | length / 2 | floor)], max_new_tokens: 3}' \
            "$FIX/refs/$f.jsonl" >> "$p"
        G=(generate --model "$FIX/models/$f" --input "$p" --greedy --ignore-eos --logprobs 3)
        "$TANDEM" "${G[@]}" --output "$BATS_TEST_TMPDIR/one.jsonl" 2>/dev/null
        run timeout 60 $MPIRUN 2 "$TANDEM" "${G[@]}" --ep 2 --output "$BATS_TEST_TMPDIR/ep2.jsonl"
        [ "$status" -eq 0 ]
        grep -q 'experts 0-.* (ep 2)' <<<"$output"   # the memory plan: each rank's experts
        cmp "$BATS_TEST_TMPDIR/one.jsonl" "$BATS_TEST_TMPDIR/ep2.jsonl"
        echo "$f: ep 2 == ep 1"
    done
    timeout 120 $MPIRUN 4 "$TANDEM" "${G[@]}" --tp 2 --ep 2 --output "$BATS_TEST_TMPDIR/tp2ep2.jsonl" 2>/dev/null
    cmp "$BATS_TEST_TMPDIR/one.jsonl" "$BATS_TEST_TMPDIR/tp2ep2.jsonl"
    timeout 120 $MPIRUN 4 "$TANDEM" "${G[@]}" --pp 2 --ep 2 --output "$BATS_TEST_TMPDIR/pp2ep2.jsonl" 2>/dev/null
    cmp "$BATS_TEST_TMPDIR/one.jsonl" "$BATS_TEST_TMPDIR/pp2ep2.jsonl"
    "$TANDEM" "${G[@]}" --dtype bf16 --output "$BATS_TEST_TMPDIR/bf1.jsonl" 2>/dev/null
    timeout 60 $MPIRUN 2 "$TANDEM" "${G[@]}" --dtype bf16 --ep 2 --output "$BATS_TEST_TMPDIR/bf2.jsonl" 2>/dev/null
    cmp "$BATS_TEST_TMPDIR/bf1.jsonl" "$BATS_TEST_TMPDIR/bf2.jsonl"
}

# item 5 at ep 2: the same transformers references and bound as tests/moe.bats (1e-4 in fp32, greedy
# exact; the bound's arithmetic is there), and 1x1's logprobs bit for bit (limit 0)
@test "ep: eval at ep 2 == 1x1 bit for bit and equals transformers' classes (<= 1e-4, greedy exact)" {
    for f in $MOE; do
        ref1="$BATS_TEST_TMPDIR/$f.1x1.jsonl"
        "$TANDEM" eval --dtype fp32 --model "$FIX/models/$f" --reference "$FIX/refs/$f.jsonl" --write-reference "$ref1" --quiet
        run timeout 60 $MPIRUN 2 "$TANDEM" eval --dtype fp32 --model "$FIX/models/$f" --reference "$ref1" --ep 2 \
            --max-logprob-diff 0 --quiet
        echo "$f: $output"
        [ "$status" -eq 0 ]
        grep '^{"records"' <<<"$output" | jq -e '.max_abs_logprob_diff == 0 and .greedy_mismatches == 0 and .dp == 2' >/dev/null
        run timeout 60 $MPIRUN 2 "$TANDEM" eval --dtype fp32 --model "$FIX/models/$f" --reference "$FIX/refs/$f.jsonl" --ep 2 \
            --max-logprob-diff 1e-4 --quiet
        [ "$status" -eq 0 ]
        grep '^{"records"' <<<"$output" | jq -e '.pass and .greedy_mismatches == 0 and .greedy_tokens == 32' >/dev/null
    done
}

# torch autograd's gradients (tests/fixtures/moe/*.grad.json, the fixtures of tests/moe.bats) at ep 2:
# each dp rank runs its own one of the two sequences, so an expert's folded gradient is the union's only
# if every source's rows went to and came back from the right ranks (test_grad sums the other tensors
# and the loss over dp); tolerance as tests/moe.bats. With --recompute full, bit for bit the run that
# keeps every activation, each folded over its sources
@test "ep: gradients at ep 2 and tp 2 x ep 2 match torch autograd of Mixtral / Qwen2-MoE / Qwen3-MoE" {
    for f in $MOE; do
        run_ranks 60 2 "$ROOT/build/tests/test_grad" "$FIX/models/$f" "$FIX/moe/$f.grad.json" 1 1 ep2
        echo "$output" | grep -E 'worst|FAIL' || true
        [ "$status" -eq 0 ]; [ "$(grep -c 'ok: grad' <<<"$output")" -eq 2 ]
    done
    TANDEM_TEST_RECOMPUTE=1 run_ranks 60 2 "$ROOT/build/tests/test_grad" "$FIX/models/mixtral_tiny" "$FIX/moe/mixtral_tiny.grad.json" 1 1 ep2
    [ "$status" -eq 0 ]; [ "$(grep -c 'recompute: gradients and loss bit-identical' <<<"$output")" -eq 2 ]
    run_ranks 120 4 "$ROOT/build/tests/test_grad" "$FIX/models/qwen2_moe_tiny" "$FIX/moe/qwen2_moe_tiny.grad.json" 2 1 ep2
    [ "$status" -eq 0 ]; [ "$(grep -c 'ok: grad' <<<"$output")" -eq 4 ]
}

# sft through the trainer (tests/moe.bats's tok512 MoE models): every file of the checkpoint (weights,
# optimizer moments, trainer state) is ep 1's, byte for byte
ep_model() { # KIND
    need_assets; need_hfpy
    make_rev_data "$BATS_TEST_TMPDIR"
    "$TANDEM" convert --from random --shape 64,256,2,4,2,512,64 --tokenizer "$ASSETS/models/stories260K/tok512.model" \
        --seed 1 --out "$BATS_TEST_TMPDIR/llama" 2>/dev/null
    "$HFPY" "$FIX/moe/to_moe.py" "$BATS_TEST_TMPDIR/llama" "$BATS_TEST_TMPDIR/$1" $1 >/dev/null
}
same_ckpt() { # A B [PATTERN]: every file of two checkpoints (named PATTERN)
    (cd "$1" && find . -type f -name "${3:-*}" | sort) > "$BATS_TEST_TMPDIR/files"
    [ "$(wc -l < "$BATS_TEST_TMPDIR/files")" -ge 3 ]
    while read -r f; do cmp "$1/$f" "$2/$f"; done < "$BATS_TEST_TMPDIR/files"
}

@test "ep: sft at dp 2 ep 2 == dp 2 ep 1 bit for bit (weights, optimizer state, eval loss over an odd number of batches, the z-loss and routing statistics); tp 2 x ep 2 too" {
    ep_model qwen2_moe
    local t="$BATS_TEST_TMPDIR" M="$BATS_TEST_TMPDIR/qwen2_moe"
    head -5 "$t/rev_val.jsonl" > "$t/val5.jsonl"   # 3 eval batches of 2: dp rank 1 runs one fewer
    A=(sft --model "$M" --data "$t/rev_train.jsonl" --eval-data "$t/val5.jsonl" --seq-len 32 --batch-size 4
       --micro-batches 2 --max-steps 3 --lr 3e-3)
    run timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" --moe-z-loss-coef 0.01 --out "$t/e1"
    [ "$status" -eq 0 ]
    run timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" --moe-z-loss-coef 0.01 --ep 2 --out "$t/e2"
    [ "$status" -eq 0 ]
    same_ckpt "$t/e1/checkpoint-3" "$t/e2/checkpoint-3"
    jq -s -e 'map(select(has("moe_z_loss")) | .moe_z_loss > 0 and .["moe_tokens/0"] > 0) | length == 3 and all' "$t/e2/metrics.jsonl"
    diff <(jq -c 'del(.tokens_per_s)' "$t/e1/metrics.jsonl") <(jq -c 'del(.tokens_per_s)' "$t/e2/metrics.jsonl")
    [ "$(grep -c eval_loss "$t/e2/metrics.jsonl")" -eq 2 ]
    run timeout 180 $MPIRUN 4 "$TANDEM" "${A[@]}" --tp 2 --out "$t/t1"
    [ "$status" -eq 0 ]
    run timeout 180 $MPIRUN 4 "$TANDEM" "${A[@]}" --tp 2 --ep 2 --out "$t/t2"
    [ "$status" -eq 0 ]
    same_ckpt "$t/t1/checkpoint-3" "$t/t2/checkpoint-3"
}

# ZeRO-1 at ep 2: the experts' moments sharded over the expert-data-parallel ranks (dp 4 ep 2: edp 2),
# the rest over dp; the same weights as plain ep 1 (Megatron's distributed optimizer changes where
# the state lives, not the arithmetic), and its checkpoint resumes at plain ep 1
@test "ep: ZeRO-1 at dp 4 ep 2 == plain dp 4 ep 1 bit for bit; its checkpoint resumes at ep 1" {
    ep_model qwen3_moe
    local t="$BATS_TEST_TMPDIR"
    A=(sft --model "$t/qwen3_moe" --data "$t/rev_train.jsonl" --seq-len 32 --batch-size 2 --micro-batches 2 --max-steps 4
       --lr 3e-3 --save-every 2)
    run timeout 180 $MPIRUN 4 "$TANDEM" "${A[@]}" --out "$t/p"
    [ "$status" -eq 0 ]
    run timeout 180 $MPIRUN 4 "$TANDEM" "${A[@]}" --ep 2 --zero 1 --out "$t/z"
    [ "$status" -eq 0 ]
    grep -q 'AdamW ZeRO1' <<<"$output"
    same_ckpt "$t/p/checkpoint-4" "$t/z/checkpoint-4" '*.safetensors'   # weights and moments (the json name zero 1)
    run timeout 180 $MPIRUN 4 "$TANDEM" "${A[@]}" --resume "$t/z/checkpoint-2" --out "$t/r"
    [ "$status" -eq 0 ]
    same_ckpt "$t/p/checkpoint-4" "$t/r/checkpoint-4"
}

# ZeRO-2 / ZeRO-3 at ep 2: each layer two units, its non-expert tensors over dp (reduce-scattered
# right after the layer's backward) and its routed experts over the edp group (reduce-scattered once
# the step's sources are folded); ZeRO-3 slices the weights by the same units and gathers both for
# the forward and backward. One micro-batch per step: every ZeRO stage adds plain's tree (optim.h),
# so the weights and moments are plain ep 1's; resume across ep and zero stage. dp 4 ep 2 (edp 2) on
# Qwen3-MoE, dp 2 ep 2 (edp 1) on Qwen2-MoE's shared expert, eval over an odd number of batches (the
# gathered weights' lockstep).
@test "ep: ZeRO-2 and ZeRO-3 at dp 4 ep 2 and dp 2 ep 2 == plain ep 1 bit for bit; resume across ep and zero stage" {
    local t="$BATS_TEST_TMPDIR"
    for k in "qwen3_moe 4" "qwen2_moe 2"; do
        set -- $k
        rm -rf "$t/llama"; ep_model $1
        head -5 "$t/rev_val.jsonl" > "$t/val5.jsonl"   # 3 eval batches of 1 at dp 2 (2 at dp 4): ranks finish apart
        A=(sft --model "$t/$1" --data "$t/rev_train.jsonl" --seq-len 32 --batch-size 2 --max-steps 4 --lr 3e-3
           --save-every 2 --eval-data "$t/val5.jsonl" --eval-every 2)
        run timeout 180 $MPIRUN $2 "$TANDEM" "${A[@]}" --out "$t/p$2"
        [ "$status" -eq 0 ]
        for z in 2 3; do
            run timeout 180 $MPIRUN $2 "$TANDEM" "${A[@]}" --ep 2 --zero $z --out "$t/z$z-$2"
            [ "$status" -eq 0 ]
            grep -q "AdamW ZeRO$z" <<<"$output"
            grep -q "rank 1   experts .* (ep 2; .*gradients and optimizer state over edp $(($2 / 2)))" <<<"$output"
            same_ckpt "$t/p$2/checkpoint-4" "$t/z$z-$2/checkpoint-4" '*.safetensors'   # weights and moments
            F='del(.tokens_per_s)'
            diff <(jq -c "$F" "$t/p$2/metrics.jsonl") <(jq -c "$F" "$t/z$z-$2/metrics.jsonl")
        done
        grep -q "rank 1   experts .* (ep 2; weights, gradients and optimizer state over edp $(($2 / 2)))" <<<"$output"
        [ "$(grep -c eval_loss "$t/z3-$2/metrics.jsonl")" -ge 3 ]   # before, at step 2, after: diffed above
        run timeout 180 $MPIRUN $2 "$TANDEM" "${A[@]}" --resume "$t/z3-$2/checkpoint-2" --out "$t/r$2"   # ZeRO-3 ep 2 -> plain ep 1
        [ "$status" -eq 0 ]
        same_ckpt "$t/p$2/checkpoint-4" "$t/r$2/checkpoint-4" '*.safetensors'
        run timeout 180 $MPIRUN $2 "$TANDEM" "${A[@]}" --resume "$t/z2-$2/checkpoint-2" --ep 2 --zero 3 --out "$t/q$2"
        [ "$status" -eq 0 ]
        same_ckpt "$t/p$2/checkpoint-4" "$t/q$2/checkpoint-4" '*.safetensors'
        run timeout 180 $MPIRUN $2 "$TANDEM" "${A[@]}" --resume "$t/p$2/checkpoint-2" --ep 2 --zero 2 --out "$t/s$2"
        [ "$status" -eq 0 ]
        same_ckpt "$t/p$2/checkpoint-4" "$t/s$2/checkpoint-4" '*.safetensors'
    done
}

# The checkpoint is layout-free (HF's tensors, one per expert; the optimizer state likewise): a run
# resumed at the other ep continues bit for bit
@test "ep: resume ep 2 -> ep 1 and ep 1 -> ep 2 == the uninterrupted run, bit for bit" {
    ep_model mixtral
    local t="$BATS_TEST_TMPDIR"
    A=(sft --model "$t/mixtral" --data "$t/rev_train.jsonl" --seq-len 32 --batch-size 4 --micro-batches 2 --max-steps 4
       --lr 3e-3 --save-every 2)
    timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" --out "$t/u1" 2>/dev/null
    timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" --ep 2 --out "$t/u2" 2>/dev/null
    same_ckpt "$t/u1/checkpoint-4" "$t/u2/checkpoint-4"
    timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" --resume "$t/u2/checkpoint-2" --out "$t/r1" 2>/dev/null
    timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" --ep 2 --resume "$t/u1/checkpoint-2" --out "$t/r2" 2>/dev/null
    same_ckpt "$t/u1/checkpoint-4" "$t/r1/checkpoint-4"
    same_ckpt "$t/u1/checkpoint-4" "$t/r2/checkpoint-4"
}

# rm (a score head on the MoE) and dpo (policy and reference both at ep 2) through 2 steps, their eval
# over 5 pairs (an odd number of batches: the reference's and the policy's idle passes), and
# rm --score over 3 batches: ep 1's files and numbers; dpo with a dense --ref (held at ep 1) too
@test "ep: rm, dpo and rm --score at ep 2 == ep 1 bit for bit (eval and scoring over an odd number of batches)" {
    ep_model qwen2_moe
    local t="$BATS_TEST_TMPDIR"
    head -5 "$PF/story_val.jsonl" > "$t/v5.jsonl"
    for cmd in rm dpo; do
        A=($cmd --model "$t/qwen2_moe" --data "$PF/story_train.jsonl" --eval-data "$t/v5.jsonl" --seq-len 64 --batch-size 2
           --max-steps 2 --lr 1e-3)
        run timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" --out "$t/${cmd}1"
        [ "$status" -eq 0 ]
        run timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" --ep 2 --out "$t/${cmd}2"
        [ "$status" -eq 0 ]
        same_ckpt "$t/${cmd}1/checkpoint-2" "$t/${cmd}2/checkpoint-2"
        diff <(grep eval_ "$t/${cmd}1/metrics.jsonl") <(grep eval_ "$t/${cmd}2/metrics.jsonl")
    done
    for e in 1 2; do
        run timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" --ref "$t/llama" --ep $e --out "$t/dense$e"
        [ "$status" -eq 0 ]
    done
    same_ckpt "$t/dense1/checkpoint-2" "$t/dense2/checkpoint-2"
    ! cmp -s "$t/dense2/checkpoint-2/model.safetensors" "$t/dpo2/checkpoint-2/model.safetensors"   # the reference mattered
    jq -c '{prompt, response: .chosen}' "$t/v5.jsonl" > "$t/s.jsonl"
    S=(rm --score --model "$t/rm1/checkpoint-2" --input "$t/s.jsonl" --batch-size 2)
    timeout 60 $MPIRUN 2 "$TANDEM" "${S[@]}" --output "$t/s1.jsonl" 2>/dev/null
    timeout 60 $MPIRUN 2 "$TANDEM" "${S[@]}" --ep 2 --output "$t/s2.jsonl" 2>/dev/null
    [ "$(wc -l < "$t/s2.jsonl")" -eq 5 ]
    cmp "$t/s1.jsonl" "$t/s2.jsonl"
}

# GRPO with a MoE actor at ep 2: a reward with variance (vowels mod 4) so the steps move the weights,
# a stop string so the dp ranks' rollouts end at different steps; rollout logprobs == training
# logprobs at every step, and every metric but the speed, the weights and the optimizer state are
# ep 1's
@test "ep: GRPO with a Qwen3-MoE actor at --actor-ep 2 (its reference at --ref-ep 2; PPO with a MoE critic at --critic-ep 2): rollout_logprob_diff_max 0 every step, ep 1's metrics and weights" {
    ep_model qwen3_moe
    local t="$BATS_TEST_TMPDIR"
    printf '%s\n' 'import json, sys' 'for line in sys.stdin:' \
        '    if line.strip(): print(json.dumps({"reward": float(sum(c in "aeiou" for c in json.loads(line)["response"]) % 4)}), flush=True)' \
        > "$t/vowels.py"
    A=(ppo --actor "$t/qwen3_moe" --reward-cmd "python3 -u $t/vowels.py" --prompts "$TRAIN" --advantage grpo
       --n-samples-per-prompt 2 --rollout-batch-size 3 --max-new-tokens 8 --stop . --steps 3 --kl-coef 0.01 --actor-lr 3e-4)
    run timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" --out "$t/p1"
    [ "$status" -eq 0 ]
    run timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" --actor-ep 2 --out "$t/p2"
    [ "$status" -eq 0 ]
    [ "$(jq -s -c 'map(.rollout_logprob_diff_max) | unique' "$t/p2/metrics.jsonl")" = "[0]" ]
    jq -e -s 'map(."actor/grad_norm" > 0) | all and length == 3' "$t/p2/metrics.jsonl"
    jq -e -s 'map(."response_length/mean") | min < 8' "$t/p2/metrics.jsonl"   # some rollouts stopped early
    F='del(.samples_per_s) | with_entries(select(.key | startswith("timing") | not))'
    diff <(jq -c "$F" "$t/p1/metrics.jsonl") <(jq -c "$F" "$t/p2/metrics.jsonl")
    same_ckpt "$t/p1/checkpoint-3/actor" "$t/p2/checkpoint-3/actor"
    # the MoE reference (kl 0.01) at --ref-ep 2 too: the same again
    run timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" --actor-ep 2 --ref-ep 2 --out "$t/p3"
    [ "$status" -eq 0 ]
    grep -q 'ref@0+2:tp1:pp1:ep2' "$t/p3/checkpoint-3/ppo_state.json"
    diff <(jq -c "$F" "$t/p1/metrics.jsonl") <(jq -c "$F" "$t/p3/metrics.jsonl")
    same_ckpt "$t/p1/checkpoint-3/actor" "$t/p3/checkpoint-3/actor"
    # PPO with a MoE critic (a score head on the same model, GAE) at --critic-ep 2: ep 1's metrics, critic and actor
    C=(--advantage gae --critic "$t/qwen3_moe" --critic-lr 1e-3 --steps 2)
    run timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" "${C[@]}" --out "$t/c1"
    [ "$status" -eq 0 ]
    run timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" "${C[@]}" --actor-ep 2 --ref-ep 2 --critic-ep 2 --out "$t/c2"
    [ "$status" -eq 0 ]
    jq -e -s 'map(."critic/grad_norm" > 0) | all and length == 2' "$t/c2/metrics.jsonl"
    diff <(jq -c "$F" "$t/c1/metrics.jsonl") <(jq -c "$F" "$t/c2/metrics.jsonl")
    same_ckpt "$t/c1/checkpoint-2/critic" "$t/c2/checkpoint-2/critic"
}

@test "ep: --ep not dividing dp, not dividing the experts, on a dense model, LoRA on the experts, or rollout ranks: one line each" {
    run timeout 60 $MPIRUN 2 "$TANDEM" eval --model "$FIX/models/qwen3_moe_tiny" --reference "$FIX/refs/qwen3_moe_tiny.jsonl" --ep 3
    one_line_re '^tandem: --ep 3 must divide the data-parallel size dp = 2'
    run timeout 60 $MPIRUN 4 "$TANDEM" eval --model "$FIX/models/qwen3_moe_tiny" --reference "$FIX/refs/qwen3_moe_tiny.jsonl" --ep 4
    one_line_re "^tandem: --ep 4 does not divide the model's num_experts 6$"
    run timeout 60 $MPIRUN 2 "$TANDEM" eval --model "$FIX/models/qwen3_tiny" --reference "$FIX/refs/qwen3_tiny.jsonl" --ep 2
    one_line_re '^tandem: --ep 2: model_type qwen3 is dense (no experts to split over ep ranks)$'
    ep_model mixtral
    local t="$BATS_TEST_TMPDIR"
    A=(sft --model "$t/mixtral" --data "$t/rev_train.jsonl" --seq-len 32 --batch-size 4 --max-steps 1 --ep 2)
    run timeout 60 $MPIRUN 2 "$TANDEM" "${A[@]}" --lora-r 4 --out "$t/l"
    one_line_re '^tandem: --lora-target: model_type mixtral is a Mixture-of-Experts model: only q_proj,k_proj,v_proj,o_proj'
    run timeout 60 $MPIRUN 3 "$TANDEM" ppo --actor "$t/mixtral" --reward-cmd "$RULE" --prompts "$TRAIN" --advantage grpo \
        --n-samples-per-prompt 2 --rollout-batch-size 2 --max-new-tokens 4 --steps 1 --actor-ranks 2 --rollout-ranks 1 \
        --actor-ep 2 --out "$t/p"
    one_line_re '^tandem: --actor-ep 2: not with --rollout-ranks'
    P=(ppo --reward-cmd "$RULE" --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 2 --rollout-batch-size 2
       --max-new-tokens 4 --steps 1 --out "$t/p")
    run timeout 60 $MPIRUN 2 "$TANDEM" "${P[@]}" --actor "$t/mixtral" --actor-ep 3
    one_line_re '^tandem: --actor-ep 3 must divide the data-parallel size dp = 2'
    run timeout 60 $MPIRUN 2 "$TANDEM" "${P[@]}" --actor "$t/llama" --actor-ep 2
    [ "$status" -ne 0 ]   # after the placement line; the model's checks name their role
    grep -q '^tandem: \[actor\] --actor-ep 2: model_type llama is dense (no experts to split over ep ranks)$' <<<"$output"
}
