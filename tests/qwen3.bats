#!/usr/bin/env bats
# Qwen3 (Qwen3ForCausalLM: per-head RMSNorm of q and k before RoPE) through the commands that need
# a tokenizer: sft (layouts, recompute, sequence parallel, ZeRO-3, LoRA), rm, dpo and a ppo smoke
# step. Parity with transformers' own Qwen3 (logprobs, greedy, gradients) is in eval.bats,
# generate.bats, grad.bats and bf16_fidelity.bats on tests/fixtures/models/qwen3_tiny; here the model
# is a random LLaMA of convert's with tok512 made Qwen3 by tests/fixtures/qwen3/to_qwen3.py (q_norm /
# k_norm weights 1 + 0.3 N(0, 1), so a skipped norm changes every number), and the window rule on qwen3_tiny.
load helpers

setup_file() {
    [ -d "$ROOT/../shared/assets/models" ] || return 0
    make_rev_data "$BATS_FILE_TMPDIR"
    "$ROOT/bin/tandem" convert --from random --shape 64,256,2,4,2,512,64 --tokenizer "$ROOT/../shared/assets/models/stories260K/tok512.model" \
        --seed 1 --out "$BATS_FILE_TMPDIR/llama" 2>/dev/null
    "$ROOT/.venv/bin/python" "$ROOT/tests/fixtures/qwen3/to_qwen3.py" "$BATS_FILE_TMPDIR/llama" "$BATS_FILE_TMPDIR/q3"
}

losses() { jq -r 'select(.loss != null) | .loss' "$1/metrics.jsonl"; }
# close A B REL: the two loss columns within REL relative, same count
close() {
    [ "$(losses "$1" | wc -l)" -eq "$(losses "$2" | wc -l)" ] && [ "$(losses "$1" | wc -l)" -gt 0 ]
    paste <(losses "$1") <(losses "$2") | awk -v r="$3" '{ d = $1 - $2; if (d < 0) d = -d; if (d > r * $1) bad = 1 } END { exit bad }'
}
# a tensor of a saved safetensors file: its values as a JSON array
tensor() { "$HFPY" -c "import sys, json; from safetensors.numpy import load_file; print(json.dumps(load_file(sys.argv[1])[sys.argv[2]].tolist()))" "$1" "$2"; }

@test "qwen3 sft: 1x1 == tp 2 x pp 2 (1F1B) == tp 2 sequence parallel == dp 2 ZeRO-3 (1e-5), --recompute full bit for bit; the checkpoint keeps qwen3 and trained q_norm / k_norm" {
    need_assets; need_hfpy
    M="$BATS_FILE_TMPDIR/q3"
    A="--data $BATS_FILE_TMPDIR/rev_train.jsonl --seq-len 32 --batch-size 8 --micro-batches 2 --max-steps 4 --lr 3e-3"
    run timeout 120 "$TANDEM" sft --model "$M" $A --out "$BATS_TEST_TMPDIR/one"
    [ "$status" -eq 0 ]
    "$TANDEM" sft --model "$M" $A --out "$BATS_TEST_TMPDIR/rc" --recompute full 2>/dev/null
    diff <(losses "$BATS_TEST_TMPDIR/one") <(losses "$BATS_TEST_TMPDIR/rc")
    run timeout 180 $MPIRUN 4 "$TANDEM" sft --model "$M" $A --tp 2 --pp 2 --out "$BATS_TEST_TMPDIR/tp"
    [ "$status" -eq 0 ]
    run timeout 180 $MPIRUN 2 "$TANDEM" sft --model "$M" $A --tp 2 --sequence-parallel --out "$BATS_TEST_TMPDIR/sp"
    [ "$status" -eq 0 ]
    run timeout 180 $MPIRUN 2 "$TANDEM" sft --model "$M" --data "$BATS_FILE_TMPDIR/rev_train.jsonl" --seq-len 32 --batch-size 8 \
        --micro-batches 1 --max-steps 4 --lr 3e-3 --zero 3 --out "$BATS_TEST_TMPDIR/z3"
    [ "$status" -eq 0 ]
    echo "1x1: $(losses "$BATS_TEST_TMPDIR/one" | tr '\n' ' ')"
    # fp32, other summation orders (tp sums, per-micro-batch gradient sums) through 4 AdamW steps
    for o in tp sp z3; do echo "$o: $(losses "$BATS_TEST_TMPDIR/$o" | tr '\n' ' ')"; close "$BATS_TEST_TMPDIR/one" "$BATS_TEST_TMPDIR/$o" 1e-5; done
    ck="$BATS_TEST_TMPDIR/one/checkpoint-4"
    [ "$(jq -r '.model_type + " " + .architectures[0]' "$ck/config.json")" = "qwen3 Qwen3ForCausalLM" ]
    before=$(tensor "$M/model.safetensors" model.layers.1.self_attn.k_norm.weight)
    after=$(tensor "$(ls "$ck"/*.safetensors | head -1)" model.layers.1.self_attn.k_norm.weight)
    [ "$(jq -n --argjson a "$before" --argjson b "$after" '$a | length')" -eq 16 ]
    [ "$before" != "$after" ]   # trained (its gradient is not zero)
    # the checkpoint generates (loads back with its norms)
    echo '{"prompt": "1234=", "max_new_tokens": 4}' > "$BATS_TEST_TMPDIR/p.jsonl"
    run "$TANDEM" generate --model "$ck" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/g.jsonl" --greedy
    [ "$status" -eq 0 ]
}

@test "qwen3 sft --lora-r 4 on q_proj, k_proj: the adapters act before the q/k norms (the merged model's logprobs, within 1e-5), which stay frozen" {
    need_assets; need_hfpy
    M="$BATS_FILE_TMPDIR/q3" t="$BATS_TEST_TMPDIR"
    run timeout 120 "$TANDEM" sft --model "$M" --data "$BATS_FILE_TMPDIR/rev_train.jsonl" --seq-len 32 --batch-size 8 --max-steps 3 \
        --lr 3e-3 --lora-r 4 --lora-target q_proj,k_proj --merge --out "$t/l"
    [ "$status" -eq 0 ]
    [ "$(losses "$t/l" | wc -l)" -eq 3 ]
    [ "$(tensor "$M/model.safetensors" model.layers.0.self_attn.q_norm.weight)" = "$(tensor "$t/l/merged/model-00001-of-00001.safetensors" model.layers.0.self_attn.q_norm.weight)" ]
    # the merged model (W + s B A: the adapter inside q_proj / k_proj, PEFT's place) writes a reference
    # of each position's logprob of token 1; base + adapter must give it, the base alone must not
    jq -nc '{id: "a", input_ids: [1,45,300,22,17,400,5,99,12,7,64,3], top_logprobs: [range(12) | [[1, 0]]]}' > "$t/in.jsonl"
    "$TANDEM" eval --dtype fp32 --model "$t/l/merged" --reference "$t/in.jsonl" --write-reference "$t/ref.jsonl" --max-logprob-diff 1e30 --quiet >/dev/null 2>&1
    run "$TANDEM" eval --dtype fp32 --model "$M" --adapter "$t/l/checkpoint-3" --reference "$t/ref.jsonl" --max-logprob-diff 1e-5 --quiet
    echo "${lines[-1]}"
    [ "$status" -eq 0 ]
    run "$TANDEM" eval --dtype fp32 --model "$M" --reference "$t/ref.jsonl" --max-logprob-diff 1e-5 --quiet
    echo "${lines[-1]}"
    [ "$status" -ne 0 ]
}

@test "qwen3 rm and dpo: a score head on Qwen3 trains and saves as Qwen3ForSequenceClassification; dpo steps run" {
    need_assets
    M="$BATS_FILE_TMPDIR/q3"
    run timeout 120 "$TANDEM" rm --model "$M" --data "$PF/story_train.jsonl" --out "$BATS_TEST_TMPDIR/rm" --seq-len 64 --batch-size 8 --max-steps 2
    [ "$status" -eq 0 ]
    [ "$(jq -r '.model_type + " " + .architectures[0]' "$BATS_TEST_TMPDIR/rm/checkpoint-2/config.json")" = "qwen3 Qwen3ForSequenceClassification" ]
    run timeout 120 "$TANDEM" dpo --model "$M" --data "$PF/story_train.jsonl" --out "$BATS_TEST_TMPDIR/dpo" --seq-len 64 --batch-size 8 --max-steps 2
    [ "$status" -eq 0 ]
    [ "$(losses "$BATS_TEST_TMPDIR/dpo" | wc -l)" -eq 2 ]
}

@test "qwen3 ppo smoke: GRPO with a Qwen3 actor, rollout logprobs == training logprobs (diff 0) at 1x1 and actor tp 2 x pp 2" {
    need_assets
    M="$BATS_FILE_TMPDIR/q3"
    A=(--actor "$M" --reward-cmd "$RULE" --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 2 --rollout-batch-size 2
       --max-new-tokens 8 --steps 1 --kl-coef 0 --actor-lr 3e-4)
    run timeout 120 "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/one"
    [ "$status" -eq 0 ]
    [ "$(jq -s 'map(.rollout_logprob_diff_max) | unique' "$BATS_TEST_TMPDIR/one/metrics.jsonl" -c)" = "[0]" ]
    run timeout 180 $MPIRUN 4 "$TANDEM" ppo "${A[@]}" --actor-tp 2 --actor-pp 2 --out "$BATS_TEST_TMPDIR/tp"
    [ "$status" -eq 0 ]
    [ "$(jq -s 'map(.rollout_logprob_diff_max) | unique' "$BATS_TEST_TMPDIR/tp/metrics.jsonl" -c)" = "[0]" ]
}

@test "qwen3 bf16: sft at tp 2 x pp 2 follows 1x1 (1e-5, bf16.bats' reasoning), the packed bf16 activations give --recompute full's losses bit for bit; a GRPO step at actor tp 2 x pp 2 has rollout == training logprobs" {
    need_assets
    M="$BATS_FILE_TMPDIR/q3"
    A="--data $BATS_FILE_TMPDIR/rev_train.jsonl --seq-len 32 --batch-size 8 --micro-batches 2 --max-steps 4 --lr 3e-3 --dtype bf16"
    "$TANDEM" sft --model "$M" $A --out "$BATS_TEST_TMPDIR/one" 2>/dev/null
    "$TANDEM" sft --model "$M" $A --recompute full --out "$BATS_TEST_TMPDIR/rc" 2>/dev/null
    diff <(losses "$BATS_TEST_TMPDIR/one") <(losses "$BATS_TEST_TMPDIR/rc")
    run timeout 180 $MPIRUN 4 "$TANDEM" sft --model "$M" $A --tp 2 --pp 2 --out "$BATS_TEST_TMPDIR/tp"
    [ "$status" -eq 0 ]
    echo "$(losses "$BATS_TEST_TMPDIR/one" | tr '\n' ' ') vs $(losses "$BATS_TEST_TMPDIR/tp" | tr '\n' ' ')"
    close "$BATS_TEST_TMPDIR/one" "$BATS_TEST_TMPDIR/tp" 1e-5
    run timeout 180 $MPIRUN 4 "$TANDEM" ppo --actor "$M" --reward-cmd "$RULE" --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 2 \
        --rollout-batch-size 2 --max-new-tokens 8 --steps 1 --kl-coef 0 --actor-lr 3e-4 --dtype bf16 --actor-tp 2 --actor-pp 2 --out "$BATS_TEST_TMPDIR/ppo"
    [ "$status" -eq 0 ]
    [ "$(jq -s 'map(.rollout_logprob_diff_max) | unique' "$BATS_TEST_TMPDIR/ppo/metrics.jsonl" -c)" = "[0]" ]
}

@test "qwen3 sliding window: Qwen2's opt-in rule (use_sliding_window; layers >= max_window_layers); off by default even with sliding_window set" {
    # qwen3_tiny's config.json has sliding_window 4096 with use_sliding_window false: full attention
    # (its HF parity is eval.bats'). Opted in with a window of 4 from layer 1, the first 4 positions
    # (inside every window) keep their logprobs to the bit and every later one moves.
    d="$BATS_TEST_TMPDIR/w"; mkdir -p "$d"
    cp "$FIX/models/qwen3_tiny/model.safetensors" "$d/"
    jq '.use_sliding_window = true | .sliding_window = 4 | .max_window_layers = 1' "$FIX/models/qwen3_tiny/config.json" > "$d/config.json"
    run "$TANDEM" eval --dtype fp32 --model "$FIX/models/qwen3_tiny" --reference "$FIX/refs/qwen3_tiny.jsonl" --write-reference "$BATS_TEST_TMPDIR/full.jsonl" --quiet
    [ "$status" -eq 0 ]
    jq -c 'del(.greedy_ids, .greedy_top_logprobs)' "$FIX/refs/qwen3_tiny.jsonl" > "$BATS_TEST_TMPDIR/nogreedy.jsonl"
    run "$TANDEM" eval --dtype fp32 --model "$d" --reference "$BATS_TEST_TMPDIR/nogreedy.jsonl" --write-reference "$BATS_TEST_TMPDIR/win.jsonl" \
        --max-logprob-diff 1e30 --quiet
    [ "$status" -eq 0 ]
    # per record and position: the top-1 logprob with and without the window
    jq -n --slurpfile a "$BATS_TEST_TMPDIR/full.jsonl" --slurpfile b "$BATS_TEST_TMPDIR/win.jsonl" -e '
        [range($a | length) as $r | range($a[$r].top_logprobs | length) as $t
         | {t: $t, d: (($a[$r].top_logprobs[$t][0][1] - $b[$r].top_logprobs[$t][0][1]) | fabs)}]
        | (map(select(.t < 4) | .d) | max == 0) and (map(select(.t >= 4) | .d) | min > 0)'
    # max_window_layers = num_hidden_layers: no layer at or above it, full attention everywhere
    jq '.max_window_layers = 2' "$d/config.json" > "$d/c2" && mv "$d/c2" "$d/config.json"
    run "$TANDEM" eval --dtype fp32 --model "$d" --reference "$BATS_TEST_TMPDIR/full.jsonl" --max-logprob-diff 0 --quiet
    [ "$status" -eq 0 ]
}
