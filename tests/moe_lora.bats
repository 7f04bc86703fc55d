#!/usr/bin/env bats
# LoRA on Mixture-of-Experts models (runtime/lora.c lora_moe_check): adapters on the attention's
# q/k/v/o_proj only, the routed experts and the router frozen and excluded. The base has no gradient
# (train/moe_grad.c skips every expert, router and shared-expert weight GEMM and makes no per-source
# buffer: moe_ep_src_grads CHECKs it), while d x still flows through the experts to the adapters of
# the layers below. ep 2 gives ep 1's bytes (the adapters are dp-replicated; their gradients come
# from the same rows as at ep 1); tp 2 x pp 2 follows 1x1 within lora.bats' 1e-5; the saved adapter
# is PEFT's (its names are those get_peft_model_state_dict gives for these classes), and transformers
# + peft give Tandem's logprobs within eval.bats' 1e-4.
load helpers

lora_moe_model() { # KIND: $BATS_TEST_TMPDIR/KIND, the rev data beside it (ep.bats' tiny random model)
    need_assets; need_hfpy
    make_rev_data "$BATS_TEST_TMPDIR"
    "$TANDEM" convert --from random --shape 64,256,2,4,2,512,64 --tokenizer "$ASSETS/models/stories260K/tok512.model" \
        --seed 1 --out "$BATS_TEST_TMPDIR/llama" 2>/dev/null
    "$HFPY" "$FIX/moe/to_moe.py" "$BATS_TEST_TMPDIR/llama" "$BATS_TEST_TMPDIR/$1" $1 >/dev/null
}
same_dir() { # A B: every file of two checkpoints byte for byte
    (cd "$1" && find . -type f | sort) > "$BATS_TEST_TMPDIR/files"
    [ "$(wc -l < "$BATS_TEST_TMPDIR/files")" -ge 4 ]
    while read -r f; do cmp "$1/$f" "$2/$f"; done < "$BATS_TEST_TMPDIR/files"
}
ATT="--lora-r 4 --lora-alpha 8 --lora-target q_proj,k_proj,v_proj,o_proj"

@test "moe lora: sft on Qwen2-MoE's attention at dp 2 ep 2 == ep 1 bit for bit (adapter, moments, metrics), eval loss, fp32, and bf16 with ZeRO-3 (the frozen base sliced as two units); GRPO's actor too" {
    lora_moe_model qwen2_moe
    local t="$BATS_TEST_TMPDIR"
    head -5 "$t/rev_val.jsonl" > "$t/val5.jsonl"   # 3 eval batches of 2: dp rank 1 runs one fewer (the lockstep)
    A=(sft --model "$t/qwen2_moe" --data "$t/rev_train.jsonl" --eval-data "$t/val5.jsonl" --seq-len 32 --batch-size 4
       --micro-batches 2 --max-steps 3 --lr 3e-3 $ATT)
    for e in 1 2; do
        run timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" --ep $e --out "$t/e$e"
        [ "$status" -eq 0 ]
    done
    same_dir "$t/e1/checkpoint-3" "$t/e2/checkpoint-3"
    diff <(jq -c 'del(.tokens_per_s)' "$t/e1/metrics.jsonl") <(jq -c 'del(.tokens_per_s)' "$t/e2/metrics.jsonl")
    [ "$(grep -c eval_loss "$t/e2/metrics.jsonl")" -eq 2 ]
    # the adapters learn: the loss moves off the base's (step 1 is the base's: B = 0)
    [ "$(losses "$t/e1" | awk 'NR == 1 { a = $1 } END { print (a != $1) }')" = 1 ]
    timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" --dtype bf16 --out "$t/b1" 2>/dev/null
    run timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" --dtype bf16 --ep 2 --zero 3 --out "$t/b2"
    [ "$status" -eq 0 ]
    for f in adapter_model.safetensors optimizer/exp_avg/adapter_model.safetensors optimizer/exp_avg_sq/adapter_model.safetensors; do
        cmp "$t/b1/checkpoint-3/$f" "$t/b2/checkpoint-3/$f"   # optimizer.json names the zero stage
    done
    diff <(grep eval_ "$t/b1/metrics.jsonl") <(grep eval_ "$t/b2/metrics.jsonl")
    printf '%s\n' 'import json, sys' 'for line in sys.stdin:' \
        '    if line.strip(): print(json.dumps({"reward": float(sum(c in "aeiou" for c in json.loads(line)["response"]) % 4)}), flush=True)' \
        > "$t/vowels.py"
    P=(ppo --actor "$t/qwen2_moe" --reward-cmd "python3 -u $t/vowels.py" --prompts "$TRAIN" --advantage grpo
       --n-samples-per-prompt 2 --rollout-batch-size 3 --max-new-tokens 8 --stop . --steps 2 --kl-coef 0.01 --actor-lr 3e-3 $ATT)
    timeout 120 $MPIRUN 2 "$TANDEM" "${P[@]}" --out "$t/p1" 2>/dev/null
    run timeout 120 $MPIRUN 2 "$TANDEM" "${P[@]}" --actor-ep 2 --out "$t/p2"
    [ "$status" -eq 0 ]
    [ "$(jq -s -c 'map(.rollout_logprob_diff_max) | unique' "$t/p2/metrics.jsonl")" = "[0]" ]
    F='del(.samples_per_s) | with_entries(select(.key | startswith("timing") | not))'
    diff <(jq -c "$F" "$t/p1/metrics.jsonl") <(jq -c "$F" "$t/p2/metrics.jsonl")
    cmp "$t/p1/checkpoint-2/actor/adapter_model.safetensors" "$t/p2/checkpoint-2/actor/adapter_model.safetensors"
}

@test "moe lora: Mixtral's attention adapters at tp 2 x pp 2 follow 1x1 within 1e-5; the adapter loads in PEFT with Tandem's logprobs (<= 1e-4, greedy exact), the base alone misses; generate --adapter at ep 2 == ep 1 == PEFT's greedy" {
    lora_moe_model mixtral
    local t="$BATS_TEST_TMPDIR"
    A=(sft --model "$t/mixtral" --data "$t/rev_train.jsonl" --seq-len 32 --batch-size 8 --max-steps 4 --lr 3e-3 $ATT)
    "$TANDEM" "${A[@]}" --out "$t/one" 2>/dev/null
    run timeout 180 $MPIRUN 4 "$TANDEM" "${A[@]}" --tp 2 --pp 2 --out "$t/tp"
    [ "$status" -eq 0 ]
    within 1e-5 <(losses "$t/one") <(losses "$t/tp")
    [ "$(losses "$t/tp" | wc -l)" -eq 4 ]
    ck="$t/one/checkpoint-4"
    [ "$(jq -c .target_modules "$ck/adapter_config.json")" = '["q_proj","k_proj","v_proj","o_proj"]' ]
    head -3 "$t/rev_val.jsonl" | jq -c '{text: (.prompt + .response)}' > "$t/in.jsonl"
    run timeout 120 "$HFPY" "$ROOT/eval/hf_reference.py" --model "$t/mixtral" --adapter "$ck" --input "$t/in.jsonl" \
        --out "$t/ref.jsonl" --greedy 8
    [ "$status" -eq 0 ]
    run "$TANDEM" eval --dtype fp32 --model "$t/mixtral" --adapter "$ck" --reference "$t/ref.jsonl" --max-logprob-diff 1e-4 --quiet
    echo "${lines[-1]}"
    [ "$status" -eq 0 ]
    echo "${lines[-1]}" | jq -e '.pass and .greedy_mismatches == 0'
    run "$TANDEM" eval --dtype fp32 --model "$t/mixtral" --reference "$t/ref.jsonl" --max-logprob-diff 1e-4 --quiet
    [ "$status" -ne 0 ]
    echo "${lines[-1]}" | jq -e '.max_abs_logprob_diff > 0.01'
    jq -c '{id, input_ids, max_new_tokens: (.greedy_ids | length)}' "$t/ref.jsonl" > "$t/p.jsonl"
    G=(generate --model "$t/mixtral" --adapter "$ck" --input "$t/p.jsonl" --greedy --ignore-eos --logprobs 3)
    "$TANDEM" "${G[@]}" --output "$t/g1.jsonl" 2>/dev/null
    run timeout 60 $MPIRUN 2 "$TANDEM" "${G[@]}" --ep 2 --output "$t/g2.jsonl"
    [ "$status" -eq 0 ]
    cmp "$t/g1.jsonl" "$t/g2.jsonl"
    diff <(jq -c .completion_ids "$t/g1.jsonl") <(jq -c .greedy_ids "$t/ref.jsonl")
}

@test "moe lora: the routed experts and the router may not be targeted: --lora-target (all-linear, the default, too) and an adapter's target_modules, one line each" {
    lora_moe_model mixtral
    local t="$BATS_TEST_TMPDIR"
    W='is a Mixture-of-Experts model: only q_proj,k_proj,v_proj,o_proj may be targeted (the routed experts and the router are excluded'
    A=(sft --model "$t/mixtral" --data "$t/rev_train.jsonl" --seq-len 32 --batch-size 8 --max-steps 1 --lora-r 4)
    for tg in "" "--lora-target all-linear" "--lora-target q_proj,gate_proj"; do
        run "$TANDEM" "${A[@]}" $tg --out "$t/x"
        one_line_re "^tandem: --lora-target: model_type mixtral $W"
    done
    timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" --lora-target q_proj --ep 2 --out "$t/ok" 2>/dev/null   # allowed at ep 2
    cp -r "$t/ok/checkpoint-1" "$t/bad"
    echo '{"prompt": "1234="}' > "$t/p.jsonl"
    jq '.target_modules = ["q_proj", "down_proj"]' "$t/ok/checkpoint-1/adapter_config.json" > "$t/bad/adapter_config.json"
    run "$TANDEM" generate --model "$t/mixtral" --adapter "$t/bad" --input "$t/p.jsonl" --output "$t/g.jsonl"
    one_line_re "^tandem: $t/bad/adapter_config.json: model_type mixtral $W"
    jq '.target_modules = ["q_proj", "w1"]' "$t/ok/checkpoint-1/adapter_config.json" > "$t/bad/adapter_config.json"
    run "$TANDEM" generate --model "$t/mixtral" --adapter "$t/bad" --input "$t/p.jsonl" --output "$t/g.jsonl"
    one_line_re 'names w1: .*Mixture-of-Experts model.s q_proj k_proj v_proj o_proj only: its routed experts and router are excluded'
}
