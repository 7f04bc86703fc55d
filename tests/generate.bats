#!/usr/bin/env bats
# tandem generate: HF greedy parity through the KV-cache engine, invariance of outputs to batch size,
# layout and KV-cache pressure, seeds, stops, logprobs, resume, and bad input.
load helpers

FIXTURES="llama_gqa mistral_swa qwen2_bias qwen2_swa qwen3_tiny llama3_rope llama_linear_rope llama_sharded llama_mqa llama_odd_vocab"

# prompts_from_ref REF OUT: one {"id","input_ids","max_new_tokens"} line per reference record
prompts_from_ref() {
    jq -c '{id, input_ids, max_new_tokens: (.greedy_ids | length)}' "$1" > "$2"
}
# same_greedy REF OUT: every completion equals the reference's greedy_ids
same_greedy() {
    diff <(jq -c '[.id, .greedy_ids]' "$1") <(jq -c '[.id, .completion_ids]' "$2")
}

@test "generate: greedy equals HF on every fixture (KV cache, blocks of 2 and 16)" {
    for f in $FIXTURES; do
        prompts_from_ref "$FIX/refs/$f.jsonl" "$BATS_TEST_TMPDIR/p.jsonl"
        for bs in 2 16; do
            "$TANDEM" generate --model "$FIX/models/$f" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/o.jsonl" \
                --greedy --ignore-eos --block-size $bs 2>/dev/null
            echo "$f block $bs"
            same_greedy "$FIX/refs/$f.jsonl" "$BATS_TEST_TMPDIR/o.jsonl"
        done
    done
}

@test "generate: greedy equals HF on the real models" {
    need_assets
    for pair in "stories260K-hf stories260K" "tinystories-l2c-64d-500it-hf tinystories-l2c"; do
        set -- $pair
        prompts_from_ref "$FIX/refs/$2.jsonl" "$BATS_TEST_TMPDIR/p.jsonl"
        "$TANDEM" generate --model "$ASSETS/models/$1" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/o.jsonl" --greedy --ignore-eos 2>/dev/null
        same_greedy "$FIX/refs/$2.jsonl" "$BATS_TEST_TMPDIR/o.jsonl"
    done
}

@test "generate: stories260K reproduces golden_greedy_200 from a BOS-only prompt" {
    need_assets
    echo '{"input_ids": [1], "max_new_tokens": 200}' > "$BATS_TEST_TMPDIR/p.jsonl"
    "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/o.jsonl" --greedy 2>/dev/null
    got=$(jq -r '.completion_ids | map(tostring) | join(" ")' "$BATS_TEST_TMPDIR/o.jsonl")
    want=$(tail -n +2 <(tr ' ' '\n' < "$ASSETS/models/stories260K/golden_greedy_200.ids") | tr '\n' ' ' | sed 's/ *$//')
    [ "$got" = "$want" ]
    [ "$(jq -r .finish_reason "$BATS_TEST_TMPDIR/o.jsonl")" = length ]
}

# N (default 40) text prompts of varied length for the invariance tests

@test "generate: greedy output and logprobs are identical for batch sizes 1, 7, 64, 1 or 2 threads, layouts 2x1, 1x2, 2x2, 4x1, dp 2" {
    need_assets
    make_prompts "$BATS_TEST_TMPDIR/p.jsonl" "" 70   # more than 64: the 64-slot batch fills, then refills
    for b in 1 7 64; do
        "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/b$b.jsonl" --greedy --logprobs 2 --max-batch $b 2>/dev/null
    done
    cmp "$BATS_TEST_TMPDIR/b1.jsonl" "$BATS_TEST_TMPDIR/b7.jsonl"
    cmp "$BATS_TEST_TMPDIR/b1.jsonl" "$BATS_TEST_TMPDIR/b64.jsonl"
    [ "$(wc -l < "$BATS_TEST_TMPDIR/b1.jsonl")" -eq 70 ]
    # threads split heads, sequences and matmul rows differently, never one element's arithmetic
    "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/t2.jsonl" --greedy --logprobs 2 --threads 2 2>/dev/null
    cmp "$BATS_TEST_TMPDIR/b1.jsonl" "$BATS_TEST_TMPDIR/t2.jsonl"
    # layouts, data parallel ones included (dp groups take every dp-th prompt; rank 0 writes in order);
    # tp too, logprobs and all: its sums are leaves added by one tree at every tp (kernels.h TP_LEAVES)
    for l in "2 2 1" "2 1 2" "4 2 2" "2 1 1" "4 2 1" "4 4 1"; do
        set -- $l
        timeout 120 $MPIRUN $1 "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" \
            --output "$BATS_TEST_TMPDIR/l.jsonl" --greedy --logprobs 2 --tp $2 --pp $3 2>/dev/null
        echo "layout np=$1 tp=$2 pp=$3"
        cmp "$BATS_TEST_TMPDIR/b1.jsonl" "$BATS_TEST_TMPDIR/l.jsonl"
    done
}

@test "generate: sampled tokens depend only on the seed (batch, order, layout, KV pressure)" {
    need_assets
    make_prompts "$BATS_TEST_TMPDIR/p.jsonl" ', "temperature": 0.9, "top_k": 40, "top_p": 0.95, "min_p": 0.02, "repetition_penalty": 1.1'
    run_gen() { "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$1" --seed 11 "${@:2}" 2>/dev/null; }
    run_gen "$BATS_TEST_TMPDIR/a.jsonl" --max-batch 64
    run_gen "$BATS_TEST_TMPDIR/b.jsonl" --max-batch 3
    cmp "$BATS_TEST_TMPDIR/a.jsonl" "$BATS_TEST_TMPDIR/b.jsonl"
    # a different seed changes the text
    "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/c.jsonl" --seed 12 2>/dev/null
    run ! cmp -s "$BATS_TEST_TMPDIR/a.jsonl" "$BATS_TEST_TMPDIR/c.jsonl"
    # per-line seeds: reversed input order gives the same completion per id
    jq -c '. + {seed: 5}' "$BATS_TEST_TMPDIR/p.jsonl" > "$BATS_TEST_TMPDIR/s.jsonl"
    tac "$BATS_TEST_TMPDIR/s.jsonl" > "$BATS_TEST_TMPDIR/r.jsonl"
    "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/s.jsonl" --output "$BATS_TEST_TMPDIR/s.out" 2>/dev/null
    "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/r.jsonl" --output "$BATS_TEST_TMPDIR/r.out" --max-batch 5 2>/dev/null
    diff <(jq -c '[.id, .completion_ids]' "$BATS_TEST_TMPDIR/s.out" | sort) <(jq -c '[.id, .completion_ids]' "$BATS_TEST_TMPDIR/r.out" | sort)
    # seeds beyond 32 bits are seeds of their own (3e9 and 5e9 once both became INT_MIN)
    printf '{"prompt": "Once", "seed": 3000000000, "temperature": 2}\n{"prompt": "Once", "seed": 5000000000, "temperature": 2}\n' > "$BATS_TEST_TMPDIR/big.jsonl"
    "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/big.jsonl" --output "$BATS_TEST_TMPDIR/big.out" 2>/dev/null
    [ "$(jq -s '.[0].completion_ids != .[1].completion_ids' "$BATS_TEST_TMPDIR/big.out")" = true ]
    # KV cache of 12 blocks x 16 tokens: sequences wait and get preempted, tokens do not change
    "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/k.jsonl" --seed 11 \
        --kv-cache-mem 0.24 2> "$BATS_TEST_TMPDIR/k.err"
    cat "$BATS_TEST_TMPDIR/k.err" | tail -1
    grep -qE 'KV 12 blocks' "$BATS_TEST_TMPDIR/k.err"
    run ! grep -q ' 0 preemptions' "$BATS_TEST_TMPDIR/k.err"   # the pressure is real
    cmp "$BATS_TEST_TMPDIR/a.jsonl" "$BATS_TEST_TMPDIR/k.jsonl"
    # and a 2x2 layout, and data parallel
    timeout 120 $MPIRUN 4 "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/l.jsonl" \
        --seed 11 --tp 2 --pp 2 2>/dev/null
    cmp "$BATS_TEST_TMPDIR/a.jsonl" "$BATS_TEST_TMPDIR/l.jsonl"
    timeout 120 $MPIRUN 2 "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/d.jsonl" \
        --seed 11 2>/dev/null
    cmp "$BATS_TEST_TMPDIR/a.jsonl" "$BATS_TEST_TMPDIR/d.jsonl"
}

@test "generate: the KV bound is exact; a preempted sliding-window sequence larger than the pool is recomputed in chunks" {
    # llama_gqa, blocks of 4 tokens (1 KiB each: 2 layers x k,v x 4 x 2 heads x 8 x 4 B): a prompt of
    # 4 + 5 new tokens caches 8 positions (the last token is never fed) = exactly 2 blocks
    P="$BATS_TEST_TMPDIR/p.jsonl"
    echo '{"input_ids": [1, 5, 6, 7], "max_new_tokens": 5}' > "$P"
    gen() { "$TANDEM" generate --input "$P" --greedy --ignore-eos --threads 1 "$@"; }
    gen --model "$FIX/models/llama_gqa" --output "$BATS_TEST_TMPDIR/big.jsonl" 2>/dev/null
    gen --model "$FIX/models/llama_gqa" --output "$BATS_TEST_TMPDIR/two.jsonl" --block-size 4 --kv-cache-mem 0.00244140625 2>/dev/null
    cmp "$BATS_TEST_TMPDIR/big.jsonl" "$BATS_TEST_TMPDIR/two.jsonl"
    run gen --model "$FIX/models/llama_gqa" --output "$BATS_TEST_TMPDIR/one.jsonl" --block-size 4 --kv-cache-mem 0.0014
    [ "$status" -ne 0 ]; [[ "$output" == *"p.jsonl:1: 4 prompt + 5 new tokens need 2 KV blocks of 4 tokens, the cache holds 1"* ]]
    # mistral_swa (W = 4), blocks of 5 tokens, a pool of 3: sequences get preempted once their
    # context is longer than the pool; the recompute runs alone, fed in chunks while blocks leave the
    # window. Tokens equal the unconstrained run's (chunking changes no arithmetic).
    printf '%s\n' '{"input_ids": [82, 35], "max_new_tokens": 21}' \
        '{"input_ids": [97, 48, 104, 91, 123, 110, 97, 86, 121, 70], "max_new_tokens": 22}' \
        '{"input_ids": [6, 110, 62, 102, 123, 34, 86, 9, 118, 23, 17, 50, 63], "max_new_tokens": 20}' \
        '{"input_ids": [114], "max_new_tokens": 38}' > "$P"
    gen --model "$FIX/models/mistral_swa" --output "$BATS_TEST_TMPDIR/big.jsonl" 2>/dev/null
    gen --model "$FIX/models/mistral_swa" --output "$BATS_TEST_TMPDIR/small.jsonl" --block-size 5 --kv-cache-mem 0.008544921875 2> "$BATS_TEST_TMPDIR/e"
    tail -1 "$BATS_TEST_TMPDIR/e"
    grep -q 'KV 3 blocks x 5 tokens' "$BATS_TEST_TMPDIR/e"
    run ! grep -q ' 0 preemptions' "$BATS_TEST_TMPDIR/e"
    cmp "$BATS_TEST_TMPDIR/big.jsonl" "$BATS_TEST_TMPDIR/small.jsonl"
    # data parallel: a prompt another group owns that can never fit is still one line from rank 0
    printf '%s\n' '{"input_ids": [1, 2], "max_new_tokens": 2}' '{"input_ids": [1, 2], "max_new_tokens": 200}' > "$P"
    run timeout 60 $MPIRUN 2 "$TANDEM" generate --model "$FIX/models/llama_gqa" --input "$P" --output "$BATS_TEST_TMPDIR/dp.jsonl" \
        --block-size 4 --kv-cache-mem 0.01
    echo "$output"
    [ "$status" -ne 0 ]; [ "$status" -ne 124 ]
    [[ "$output" == *"p.jsonl:2: 2 prompt + 200 new tokens need 51 KV blocks of 4 tokens, the cache holds 10"* ]]
}

@test "generate: sliding window frees blocks outside the window" {
    # mistral_swa has W = 4: with 2-token blocks a query's window spans at most ceil(3 / 2) + 1 = 3
    # blocks, all a sequence holds after prefill (engine_add's bound)
    echo '{"input_ids": [1, 5, 6, 7], "max_new_tokens": 60}' > "$BATS_TEST_TMPDIR/p.jsonl"
    "$TANDEM" generate --model "$FIX/models/mistral_swa" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/o.jsonl" \
        --greedy --ignore-eos --block-size 2 2> "$BATS_TEST_TMPDIR/e"
    tail -1 "$BATS_TEST_TMPDIR/e"
    peak=$(grep -oE 'peak [0-9]+ used' "$BATS_TEST_TMPDIR/e" | cut -d' ' -f2)
    [ "$peak" -le 3 ]
    [ "$(jq '.completion_ids | length' "$BATS_TEST_TMPDIR/o.jsonl")" -eq 60 ]
    # a model without a window holds all 32 blocks
    "$TANDEM" generate --model "$FIX/models/llama_gqa" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/o.jsonl" \
        --greedy --ignore-eos --block-size 2 2> "$BATS_TEST_TMPDIR/e"
    grep -q 'peak 32 used' "$BATS_TEST_TMPDIR/e"
}

@test "generate: stops (EOS, stop strings across tokens, stop ids, min/max new tokens)" {
    need_assets
    cat > "$BATS_TEST_TMPDIR/p.jsonl" <<'JSON'
{"id": "eos", "prompt": "Once upon a time", "temperature": 0, "max_new_tokens": 400}
{"id": "str", "prompt": "Once upon a time", "temperature": 0, "stop": ["Lily"]}
{"id": "two", "prompt": "Once upon a time", "temperature": 0, "stop": ["ere", "the"]}
{"id": "ids", "prompt": "Once upon a time", "temperature": 0, "stop_token_ids": [426], "logprobs": 3}
{"id": "min", "prompt": "Once upon a time", "temperature": 0, "stop_token_ids": [426], "min_new_tokens": 20, "logprobs": 3}
{"id": "minplain", "prompt": "Once upon a time", "temperature": 0, "stop_token_ids": [426], "min_new_tokens": 20}
{"id": "minstr", "prompt": "Once upon a time", "temperature": 0, "stop": ["Lily"], "min_new_tokens": 20}
{"id": "min5", "prompt": "Once upon a time", "temperature": 0, "stop": ["little"], "min_new_tokens": 5, "max_new_tokens": 12}
{"id": "nomin5", "prompt": "Once upon a time", "temperature": 0, "stop": ["little"], "max_new_tokens": 12}
{"id": "len", "prompt": "Once upon a time", "temperature": 0, "max_new_tokens": 5}
{"id": "cold", "prompt": "Once upon a time", "temperature": 1e-40, "max_new_tokens": 30}
JSON
    # stories260K ends stories with BOS (1), llama2.c style: declare it an EOS in generation_config.json
    cp -r "$STORIES" "$BATS_TEST_TMPDIR/m"
    echo '{"eos_token_id": [1]}' > "$BATS_TEST_TMPDIR/m/generation_config.json"
    "$TANDEM" generate --model "$BATS_TEST_TMPDIR/m" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/o.jsonl" 2>/dev/null
    cat "$BATS_TEST_TMPDIR/o.jsonl"
    q() { jq -r "select(.id == \"$1\") | $2" "$BATS_TEST_TMPDIR/o.jsonl"; }
    [ "$(q eos .finish_reason)" = stop ]
    [ "$(q eos '.completion_ids[-1]')" = 1 ]              # EOS ends it, kept in the ids
    [ "$(q eos '.completion_ids | map(select(. == 1)) | length')" = 1 ]
    # a stop string and what follows it are cut: exactly the greedy text before its first occurrence
    [ "$(q str .finish_reason)" = stop ]
    [ "$(q str .completion)" = "$(q eos '.completion | split("Lily")[0]')" ]
    # of several stop strings the first in the text wins, whatever their order in the list (here
    # both end in the same token: ", there")
    [ "$(q two .completion)" = "$(q eos '.completion as $c | $c[:([("ere", "the") as $s | $c | index($s)] | min)]')" ]
    [ "$(q ids '.completion_ids[-1]')" = 426 ]
    [ "$(q ids '.completion_ids | map(select(. == 426)) | length')" = 1 ]
    [ "$(q min '.completion_ids | length')" -ge 21 ]
    [ "$(q min '.completion_ids[:20] | map(select(. == 426)) | length')" = 0 ]
    [ "$(q minplain '.completion_ids | tojson')" = "$(q min '.completion_ids | tojson')" ]   # without logprobs too
    # min_new_tokens holds back stop strings too (vLLM's min_tokens), and the logprobs stay those
    # of the raw distribution: where ids stopped on 426, min reports 426 as the top alternative
    [ "$(q minstr '.completion_tokens')" -ge 20 ]
    # as for stop ids, the first min_new_tokens tokens cannot end a stop: without min_new "little"
    # stops within 5 tokens; with 5 held back it is passed over and the greedy text runs on
    [ "$(q nomin5 .finish_reason)" = stop ]
    [ "$(q nomin5 .completion_tokens)" -le 5 ]
    [ "$(q min5 .finish_reason)" = length ]
    [ "$(q min5 '.completion_ids | tojson')" = "$(q eos '.completion_ids[:12] | tojson')" ]
    [[ "$(q minstr .completion)" == "$(q eos '.completion | split("Lily")[0]')Lily"* ]]
    n=$(q ids '.completion_tokens')
    [ "$(q ids '[.logprobs[].top]')" = "$(q min "[.logprobs[:$n][].top]")" ]
    [ "$(q ids '.logprobs[-1].top[0][0]')" = 426 ]
    # a temperature below 1e-5 is greedy (1e-40 would overflow the logits into NaN)
    [ "$(q cold .completion_ids)" = "$(q eos '.completion_ids[:30]')" ]
    # --min-new-tokens yields to a line's smaller max_new_tokens
    "$TANDEM" generate --model "$BATS_TEST_TMPDIR/m" --input <(echo '{"prompt": "Once", "max_new_tokens": 3}') --output "$BATS_TEST_TMPDIR/n.jsonl" \
        --min-new-tokens 9 2>/dev/null
    [ "$(jq .completion_tokens "$BATS_TEST_TMPDIR/n.jsonl")" = 3 ]
    # generation_config.json's "eos_token_id": null means none given (as in HF), not an error
    echo '{"eos_token_id": null}' > "$BATS_TEST_TMPDIR/m/generation_config.json"
    "$TANDEM" generate --model "$BATS_TEST_TMPDIR/m" --input <(echo '{"prompt": "Once", "max_new_tokens": 3}') --output "$BATS_TEST_TMPDIR/n.jsonl" 2>/dev/null
    [ "$(jq .completion_tokens "$BATS_TEST_TMPDIR/n.jsonl")" = 3 ]
    [ "$(q len .finish_reason)" = length ]
    [ "$(q len .completion_tokens)" = 5 ]
}

@test "generate: --logprobs match HF's greedy logprobs" {
    prompts_from_ref "$FIX/refs/llama_gqa.jsonl" "$BATS_TEST_TMPDIR/p.jsonl"
    "$TANDEM" generate --model "$FIX/models/llama_gqa" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/o.jsonl" \
        --greedy --ignore-eos --logprobs 3 2>/dev/null
    # each step's top-3 equals HF's first 3 [id, logprob] entries within 1e-4 (fp32, see eval.bats)
    paste -d '\n' <(jq -c '[.greedy_top_logprobs[] | .[:3]]' "$FIX/refs/llama_gqa.jsonl") \
                  <(jq -c '[.logprobs[] | .top]' "$BATS_TEST_TMPDIR/o.jsonl") |
    jq -s -e 'def chk(a; b): [range(0; a|length) as $i | range(0; 3) as $j |
                  (a[$i][$j][0] == b[$i][$j][0]) and (((a[$i][$j][1] - b[$i][$j][1]) | fabs) < 1e-4)] | all;
              [range(0; length; 2) as $k | chk(.[$k]; .[$k + 1])] | all'
    jq -s -e 'length > 0 and all(.[]; .logprobs | all(.logprob == .top[0][1] and .token == .top[0][0]))' "$BATS_TEST_TMPDIR/o.jsonl"
}

# paged_vs_eval MODEL: sampled tokens' logprobs from paged decode (two sequences per step) equal
# eval's teacher-forced whole-sequence forward (contiguous k, v) bit for bit, and the comparison is live

@test "generate: sampled tokens' logprobs equal the whole-sequence forward's, bit for bit (paged decode vs eval)" {
    # generation decodes through the paged head-major KV cache, two sequences per step; eval runs the
    # teacher-forced forward over each whole sequence with contiguous k, v. The logprob of every
    # sampled token must be the same float (diff 0, no tolerance): what PPO's actor needs.
    # head_dim 16 with a sliding window (mistral_swa), 64 (llama3_rope); head_dim 8 in the next test
    paged_vs_eval "$FIX/models/mistral_swa"
    paged_vs_eval "$FIX/models/llama3_rope"
    # W = 4 with 2-token blocks: blocks leave the window every other step and are handed out again;
    # a block freed while still in the window would be overwritten and change the logprobs
    paged_vs_eval "$FIX/models/mistral_swa" --block-size 2 --kv-cache-mem 0.01
}

@test "generate: the same on real stories260K (head_dim 8: scalar tails)" {
    need_assets
    paged_vs_eval "$STORIES"
}

@test "generate: --resume skips finished ids and drops a partial last line" {
    need_assets
    make_prompts "$BATS_TEST_TMPDIR/p.jsonl" ""
    "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/full.jsonl" --greedy 2>/dev/null
    head -5 "$BATS_TEST_TMPDIR/full.jsonl" > "$BATS_TEST_TMPDIR/o.jsonl"
    sed -n 6p "$BATS_TEST_TMPDIR/full.jsonl" | head -c 30 >> "$BATS_TEST_TMPDIR/o.jsonl"   # killed mid-line
    run "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/o.jsonl" --greedy --resume
    echo "$output" | grep 'resume: 5 of 40'
    cmp "$BATS_TEST_TMPDIR/full.jsonl" "$BATS_TEST_TMPDIR/o.jsonl"
    # a blank line (an editor's trailing newline) is passed over, as the input reader does
    echo >> "$BATS_TEST_TMPDIR/o.jsonl"
    run "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/o.jsonl" --greedy --resume
    [ "$status" -eq 0 ]
    echo "$output" | grep 'resume: 40 of 40'
    # a corrupt line in the middle is an error, and the file is left alone
    sed -i '3s/.*/{"id": "p3", "oops"/' "$BATS_TEST_TMPDIR/o.jsonl"
    cp "$BATS_TEST_TMPDIR/o.jsonl" "$BATS_TEST_TMPDIR/before"
    run "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/o.jsonl" --greedy --resume
    [ "$status" -ne 0 ]
    [[ "$output" == *"o.jsonl:3: not a complete output line; cannot --resume"* ]]
    cmp "$BATS_TEST_TMPDIR/before" "$BATS_TEST_TMPDIR/o.jsonl"
}

@test "generate: bad input is one clear line naming the line and field" {
    need_assets
    P="$BATS_TEST_TMPDIR/p.jsonl" O="$BATS_TEST_TMPDIR/o.jsonl"
    # exit 1 (a user error, not a crash), one "tandem:" line, no output file
    gen() { run "$TANDEM" generate --model "$STORIES" --input "$P" --output "$O" "$@"; echo "$output"; [ "$status" -eq 1 ]; [ ! -e "$O" ]
            [ "$(echo "$output" | grep -c '^tandem: ')" -eq 1 ]; }
    printf '{"prompt": "a"}\n{"prompt": "b"\n' > "$P";                  gen; [[ "$output" == *"p.jsonl:2: not a JSON object"* ]]
    printf '{"prompt": "a"}\n{"text": "b"}\n' > "$P";                   gen; [[ "$output" == *"p.jsonl:2: field \"prompt\" missing"* ]]
    printf '{"prompt": "a"} {"prompt": "b"}\n' > "$P";                 gen; [[ "$output" == *"p.jsonl:1: text after the JSON object (one object per line)"* ]]
    printf '{"prompt": "a", "top_p": 1.5}\n' > "$P";                    gen; [[ "$output" == *"p.jsonl:1: "*"top_p"* ]]
    printf '{"prompt": "a", "temperature": -1}\n' > "$P";               gen; [[ "$output" == *"p.jsonl:1: "*"temperature"* ]]
    printf '{"prompt": "a", "top_k": -2}\n' > "$P";                     gen; [[ "$output" == *"p.jsonl:1: "*"top_k"* ]]
    printf '{"prompt": "a", "repetition_penalty": 0}\n' > "$P";         gen; [[ "$output" == *"p.jsonl:1: "*"repetition_penalty"* ]]
    printf '{"prompt": "a", "max_new_tokens": "x"}\n' > "$P";           gen; [[ "$output" == *"p.jsonl:1: field \"max_new_tokens\" must be an integer"* ]]
    printf '{"prompt": "a", "max_new_tokens": 3e9}\n' > "$P";           gen; [[ "$output" == *"p.jsonl:1: field \"max_new_tokens\" must be an integer in"* ]]
    printf '{"prompt": "a", "seed": 1e300}\n' > "$P";                   gen; [[ "$output" == *"p.jsonl:1: field \"seed\" must be an integer of magnitude below 2^53"* ]]
    printf '{"input_ids": [1, 600]}\n' > "$P";                          gen; [[ "$output" == *"p.jsonl:1: \"input_ids\" entries must be token ids in [0, 512)"* ]]
    printf '{"prompt": "a"}\n' > "$P"
    run "$TANDEM" generate --model "$STORIES" --input "$P" --output "$BATS_TEST_TMPDIR/no/such/dir/o.jsonl"
    [ "$status" -ne 0 ]; [[ "$output" == *"o.jsonl: cannot open for writing"* ]]
    gen --top-p 0;  [[ "$output" == *"top_p"* ]]
    # too long for max_position_embeddings (512): error, or --truncate keeps the last tokens
    python_free_long=$(printf 'Once upon a time %.0s' $(seq 1 200))
    echo "{\"prompt\": \"$python_free_long\", \"max_new_tokens\": 20}" > "$P"
    gen; [[ "$output" == *"p.jsonl:1: prompt of "*" exceeds max_position_embeddings 512"* ]]
    run "$TANDEM" generate --model "$STORIES" --input "$P" --output "$O" --truncate --greedy
    [ "$status" -eq 0 ]
    [ "$(jq .prompt_tokens "$O")" -eq 492 ]
    rm -f "$O"
    echo '{"input_ids": [1, 2, 3], "max_new_tokens": 100}' > "$P"
    gen --kv-cache-mem 0.05; [[ "$output" == *"p.jsonl:1: 3 prompt + 100 new tokens need 7 KV blocks of 16 tokens, the cache holds 2"* ]]
    # max_new_tokens near INT_MAX must not wrap past the max-positions check
    echo '{"prompt": "a", "max_new_tokens": 2147483645}' > "$P"; gen; [[ "$output" == *"p.jsonl:1: prompt of 2 tokens + max_new_tokens 2147483645 exceeds"* ]]
    printf '{"prompt": "a"}\n{"id": 1e17, "prompt": "b"}\n' > "$P";  gen; [[ "$output" == *"p.jsonl:2: a numeric \"id\" must be an integer of magnitude below 2^53"* ]]
    printf '{"id": 9007199254740993, "prompt": "b"}\n' > "$P";          gen; [[ "$output" == *"p.jsonl:1: a numeric \"id\" must be"* ]]   # 2^53 + 1 would read as 2^53
    printf '{"prompt": "a\0b"}\n' > "$P";                             gen; [[ "$output" == *"p.jsonl:1: a NUL byte in the line"* ]]
    printf '{"prompt": "a\\u0000b"}\n' > "$P";                        gen; [[ "$output" == *"p.jsonl:1: a string holds \\u0000 (NUL)"* ]]
    printf '{"prompt": "a \\ud800 b"}\n' > "$P";                       gen; [[ "$output" == *"p.jsonl:1: not a JSON object (invalid JSON near column 15)"* ]]
    printf '{"prompt": "a \xff b"}\n' > "$P";                         gen; [[ "$output" == *"p.jsonl:1: not valid UTF-8 (byte 15)"* ]]
    printf '{"prompt": "a"}\n' > "$P"
    gen --chat-template bogus;           [[ "$output" == *"--chat-template: unknown chat template \"bogus\""* ]]
    # a chat line for a model without a chat template names the line
    printf '{"prompt": "a"}\n{"messages": [{"role": "user", "content": "hi"}]}\n' > "$P"
    gen;                                 [[ "$output" == *"p.jsonl:2: "*"no chat_template in tokenizer_config.json; pass --chat-template NAME"* ]]
    printf '{"prompt": "a"}\n' > "$P"
    gen --logprobs 50;                   [[ "$output" == "tandem: --logprobs must be in [0, 20]" ]]
    gen --min-new-tokens 9 --max-new-tokens 3; [[ "$output" == "tandem: --min-new-tokens must be in [0, --max-new-tokens]" ]]
    # one parser for generate's and ppo's --stop-token-ids: it names the bad entry
    gen --stop-token-ids '407] junk';    [[ "$output" == *'--stop-token-ids 407] junk: "407] junk" is not a token id in [0, 512)'* ]]
    gen --stop-token-ids 407.5;          [[ "$output" == *'--stop-token-ids 407.5: "407.5" is not a token id in [0, 512)'* ]]
    gen --stop-token-ids 5,512;          [[ "$output" == *'--stop-token-ids 5,512: "512" is not a token id in [0, 512)'* ]]
    run "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR" --output "$O"
    [ "$status" -ne 0 ]; [[ "$output" == *"cannot read after line 0: Is a directory"* ]]
    # --output naming the --input file would overwrite the prompts: refused, the file untouched
    cp "$P" "$BATS_TEST_TMPDIR/keep"
    run "$TANDEM" generate --model "$STORIES" --input "$P" --output "$P"
    [ "$status" -ne 0 ]; [[ "$output" == *"p.jsonl: --output is the --input file"* ]]
    cmp "$P" "$BATS_TEST_TMPDIR/keep"
    # a failing run leaves an existing output file as it was
    echo PRECIOUS > "$O"
    echo '{"prompt": "a", "top_p": 2}' > "$P"
    run "$TANDEM" generate --model "$STORIES" --input "$P" --output "$O"
    [ "$status" -ne 0 ]; [ "$(cat "$O")" = PRECIOUS ]
}

@test "generate: ids print exactly, null fields take the default, a line's stops replace --stop" {
    need_assets
    P="$BATS_TEST_TMPDIR/p.jsonl" O="$BATS_TEST_TMPDIR/o.jsonl"
    gen() { "$TANDEM" generate --model "$STORIES" --input "$P" --output "$O" --greedy "$@" 2>/dev/null; }
    # ids up to 2^53 come back digit for digit, and --resume tells neighbours apart
    printf '{"id": 9007199254740991, "prompt": "Once", "max_new_tokens": 2}\n{"id": 9007199254740990, "prompt": "Once", "max_new_tokens": 2}\n' > "$P"
    gen
    [ "$(cut -c1-23 "$O")" = "$(printf '{"id":9007199254740991,\n{"id":9007199254740990,')" ]
    head -1 "$O" > "$BATS_TEST_TMPDIR/half" && mv "$BATS_TEST_TMPDIR/half" "$O"
    gen --resume
    [ "$(jq -c .id "$O" | tr '\n' ' ')" = "9007199254740991 9007199254740990 " ]
    # null means "not given": the default seed, stops, prompt source
    printf '{"id": "a", "prompt": "Once", "max_new_tokens": 6, "temperature": 1, "seed": null, "stop": null, "input_ids": null, "messages": null}\n' > "$P"
    gen --seed 3
    printf '{"id": "a", "prompt": "Once", "max_new_tokens": 6, "temperature": 1}\n' > "$P"
    cp "$O" "$BATS_TEST_TMPDIR/null.jsonl"
    gen --seed 3
    cmp "$O" "$BATS_TEST_TMPDIR/null.jsonl"
    # --stop "[END]" is a stop string (not JSON); a line's "stop" replaces --stop, not adds to it
    printf '{"id": "x", "prompt": "Once upon a time", "max_new_tokens": 8, "stop": "xyz"}\n{"id": "y", "prompt": "Once upon a time", "max_new_tokens": 8}\n' > "$P"
    gen --stop ' was'
    [ "$(jq -r 'select(.id == "x") | .finish_reason' "$O")" = length ]
    [ "$(jq -r 'select(.id == "y") | .completion' "$O")" = "$(jq -r 'select(.id == "x") | .completion | split(" was")[0]' "$O")" ]
    [ "$(jq -r 'select(.id == "y") | .finish_reason' "$O")" = stop ]
    gen --stop '[END]'
    [ "$(jq -r 'select(.id == "y") | .finish_reason' "$O")" = length ]
}

@test "generate: chat messages are rendered with the model's template and generation prompt" {
    need_assets
    M="$BATS_TEST_TMPDIR/chat"
    "$TANDEM" convert --from random --shape 64,128,2,4,2,6400,256 --out "$M" 2>/dev/null
    cp "$ASSETS/tokenizers/minimind/tokenizer.json" "$ASSETS/tokenizers/minimind/tokenizer_config.json" "$M/"
    msgs='[{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi there"}]'
    echo "{\"id\": \"c\", \"messages\": $msgs, \"max_new_tokens\": 6}" > "$BATS_TEST_TMPDIR/p.jsonl"
    "$TANDEM" generate --model "$M" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/o.jsonl" --greedy --ignore-eos 2>/dev/null
    # the prompt is exactly what tandem tokenize renders (checked against transformers in tokenizer.bats)
    want=$(echo "{\"messages\": $msgs}" | "$TANDEM" tokenize --model "$M" --jsonl --add-generation-prompt | jq '.input_ids | length')
    [ "$want" -gt 10 ]
    [ "$(jq .prompt_tokens "$BATS_TEST_TMPDIR/o.jsonl")" -eq "$want" ]
    echo "{\"messages\": $msgs}" | "$TANDEM" tokenize --model "$M" --jsonl --add-generation-prompt |
        jq -c '{id: "c", input_ids, max_new_tokens: 6}' > "$BATS_TEST_TMPDIR/i.jsonl"
    "$TANDEM" generate --model "$M" --input "$BATS_TEST_TMPDIR/i.jsonl" --output "$BATS_TEST_TMPDIR/i.out" --greedy --ignore-eos 2>/dev/null
    [ "$(jq -c .completion_ids "$BATS_TEST_TMPDIR/o.jsonl")" = "$(jq -c .completion_ids "$BATS_TEST_TMPDIR/i.out")" ]
    [ "$(jq .completion_tokens "$BATS_TEST_TMPDIR/o.jsonl")" -eq 6 ]
    [ "$(jq -c .prompt "$BATS_TEST_TMPDIR/o.jsonl")" = "$(echo "$msgs" | jq -c .)" ]
}

@test "--threads defaults to the cores available to the rank: the affinity, shared among the node's ranks unless bound" {
    echo '{"input_ids": [1, 5, 9]}' > "$BATS_TEST_TMPDIR/p.jsonl"
    th() { "$@" "$TANDEM" generate --model "$FIX/models/llama_gqa" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/o.jsonl" \
        --max-new-tokens 2 2>&1 | grep -E '^\| --threads ' | awk '{ print $4 }'; }
    n=$(nproc)
    [ "$(th env)" = "$n" ]
    [ "$(th env OMPI_COMM_WORLD_LOCAL_SIZE=2)" = "$(( n / 2 > 0 ? n / 2 : 1 ))" ]
    [ "$(th taskset -c 0)" = 1 ]                                       # bound by the launcher: its share already
    [ "$(th env OMPI_COMM_WORLD_LOCAL_SIZE=64)" = 1 ]                  # never 0
}
