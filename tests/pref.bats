#!/usr/bin/env bats
# Preference pairs (train/data.c preference mode), `tandem rm` (score head, Bradley–Terry) and
# `tandem dpo` (frozen reference) on stories260K. The learning tests use
# tests/fixtures/pref/story_{train,val}.jsonl: pairs over stories260K's own samples, chosen = a
# completion containing "happy", rejected = one without, for the same prompt; held-out pairs have
# prompts training never saw (make_story_pairs.py). Loss formulas and gradients against torch:
# tests/hook.bats (make_pref_fixtures.py).
load helpers

SD="$ROOT/build/tests/test_sft_data"
LLAMA="$ASSETS/tokenizers/llama2/tokenizer.model"
MINI="$ASSETS/tokenizers/minimind"

need_pref_assets() {
    need_assets
    for f in "$LLAMA" "$MINI/tokenizer.json" "$STORIES/config.json"; do
        [ -e "$f" ] || skip "$f not present (../shared/assets)"
    done
}

# ids TOK TEXT: `tandem tokenize` ids of TEXT without BOS, comma-separated
ids() {
    jq -cn --arg t "$2" '{text: $t}' | "$TANDEM" tokenize --tokenizer "$1" --jsonl --no-bos | jq -r '.input_ids | join(",")'
}

# jl N: the N-th JSON line of $output (the dump's samples; stderr lines interleave)
jl() { grep '^{' <<<"$output" | sed -n "$1p"; }

# last_metric FILE KEY: the last value of KEY in a metrics.jsonl
last_metric() { jq -r "select(has(\"$2\")) | .\"$2\"" "$1" | tail -1; }
first_metric() { jq -r "select(has(\"$2\")) | .\"$2\"" "$1" | head -1; }

@test "pairs: text pairs are [BOS] + encode(prompt + response) + [EOS] as one text; chosen and rejected stay together" {
    need_pref_assets
    f="$BATS_TEST_TMPDIR/p.jsonl"
    printf '%s\n' '{"prompt": "Hello world.", "chosen": " Nice day.", "rejected": " Bad day!", "margin": 1.5}' > "$f"
    run "$SD" dump "$LLAMA" "$f" preference=1
    echo "$output"
    [ "$status" -eq 0 ]
    whole=$(ids "$LLAMA" "Hello world. Nice day.")
    [ "$(jl 1 | jq -c '.input_ids | join(",")' -r)" = "1,$whole,2" ]
    [ "$(jl 1 | jq -r .side)" = chosen ]
    [ "$(jl 1 | jq -r .margin)" = 1.5 ]
    [ "$(jl 2 | jq -r .side)" = rejected ]
    # the mask starts at the token holding the first response byte; prompt tokens are 0
    n_prompt=$(ids "$LLAMA" "Hello world." | tr ',' '\n' | wc -l)
    [ "$(jl 1 | jq -r "[(.mask[0:$((n_prompt + 1))] | add), (.mask[$((n_prompt + 1)):] | all(. == 1))] | @csv")" = "0,true" ]
    run "$SD" batches "$LLAMA" "$f" preference=1 epochs=3
    echo "$output"
    [[ "$output" == *"0 failures"* ]]
}

@test "pairs: hh-rlhf full texts: the prompt is the common prefix up to the last Assistant:; every record of the first 500 loads" {
    need_pref_assets
    f="$BATS_TEST_TMPDIR/hh.jsonl"
    printf '%s\n' '{"chosen": "\n\nHuman: Hi?\n\nAssistant: Sure thing.", "rejected": "\n\nHuman: Hi?\n\nAssistant: Sure, no."}' > "$f"
    run "$SD" dump "$LLAMA" "$f" preference=1
    echo "$output"
    [ "$status" -eq 0 ]
    whole=$(ids "$LLAMA" $'\n\nHuman: Hi?\n\nAssistant: Sure thing.')
    [ "$(jl 1 | jq -r '.input_ids | join(",")')" = "1,$whole,2" ]
    n_prompt=$(ids "$LLAMA" $'\n\nHuman: Hi?\n\nAssistant:' | tr ',' '\n' | wc -l)
    # responses (" Sure thing." / " Sure, no.") are masked from the token after the prompt's, EOS included
    [ "$(jl 1 | jq -r "[.mask[0:$((n_prompt + 1))] | add] | .[0]")" = 0 ]
    [ "$(jl 1 | jq -r "[.mask[$((n_prompt + 1)):] | all(. == 1)] | .[0]")" = true ]
    run "$SD" dump "$LLAMA" "$ASSETS/data/hh-rlhf/harmless-base-test.first500.jsonl" preference=1 seq_len=512
    [ "$status" -eq 0 ]
    [[ "${lines[-1]}" == "stats records=500 samples=998 bad=0 truncated=15 dropped_long=1 "*" pairs=499" ]]
}

@test "pairs: conversational and LLaMA-Factory ShareGPT pairs: the loss is on the last assistant turn, which ends the sequence" {
    need_pref_assets
    f="$BATS_TEST_TMPDIR/c.jsonl"
    printf '%s\n' '{"prompt": [{"role": "user", "content": "Hi"}], "chosen": [{"role": "assistant", "content": "Hello!"}], "rejected": [{"role": "assistant", "content": "Go away."}]}' \
        '{"conversations": [{"from": "human", "value": "Hi"}], "chosen": {"from": "gpt", "value": "Hello!"}, "rejected": {"from": "gpt", "value": "Go away."}}' > "$f"
    run "$SD" dump "$MINI" "$f" preference=1
    echo "$output"
    [ "$status" -eq 0 ]
    # the two formats give the same samples; each ends with <|im_end|> (mask 1) and masks only the answer
    [ "$(jl 1 | jq -c '{input_ids, mask}')" = "$(jl 3 | jq -c '{input_ids, mask}')" ]
    want=$(jq -cn '{messages: [{role: "user", content: "Hi"}, {role: "assistant", content: "Hello!"}]}' | "$TANDEM" tokenize --tokenizer "$MINI" --jsonl)
    wids=$(jq -c '.input_ids' <<<"$want"); wmask=$(jq -c '.mask' <<<"$want")
    got=$(jl 1)
    n=$(jq '.input_ids | length' <<<"$got")
    [ "$(jq -c ".[0:$n]" <<<"$wids")" = "$(jq -c .input_ids <<<"$got")" ]
    [ "$(jq -c ".[0:$n]" <<<"$wmask")" = "$(jq -c .mask <<<"$got")" ]
    [ "$(jq '.mask[-1]' <<<"$got")" = 1 ]
    run "$SD" batches "$MINI" "$ASSETS/data/llama-factory/dpo_en_demo.json" preference=1 seq_len=512 epochs=2
    [[ "${lines[-1]}" == *" 0 failures" ]]
}

@test "pairs: over-long prompts lose tokens from the left (BOS stays); a response that does not fit drops the pair" {
    need_pref_assets
    f="$BATS_TEST_TMPDIR/l.jsonl"
    printf '%s\n' '{"prompt": "one two three four five six seven eight nine ten", "chosen": " yes", "rejected": " no"}' \
        '{"prompt": "a", "chosen": " one two three four five six seven eight nine ten eleven", "rejected": " no"}' > "$f"
    run "$SD" dump "$LLAMA" "$f" preference=1 seq_len=6
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "${lines[-1]}" == "stats records=2 samples=2 bad=0 truncated=1 dropped_long=1 "*" pairs=1" ]]
    full=$(ids "$LLAMA" "one two three four five six seven eight nine ten yes")
    want="1,$(tr ',' '\n' <<<"$full" | tail -4 | paste -sd,),2"
    [ "$(jl 1 | jq -r '.input_ids | join(",")')" = "$want" ]
}

@test "pairs: bad records name FILE:LINE and the field; --skip-bad-lines counts them" {
    need_pref_assets
    f="$BATS_TEST_TMPDIR/b.jsonl"
    printf '%s\n' '{"prompt": "a", "chosen": " b", "rejected": " c"}' '{"prompt": "a", "chosen": " b"}' > "$f"
    run "$SD" dump "$LLAMA" "$f" preference=1
    [ "$status" -ne 0 ]
    [[ "$output" == *"b.jsonl:2: field \"rejected\" missing"* ]]
    printf '%s\n' '{"prompt": "a", "chosen": "", "rejected": " c"}' > "$f"
    run "$SD" dump "$LLAMA" "$f" preference=1
    [[ "$output" == *"b.jsonl:1: field \"chosen\": empty response"* ]]
    printf '%s\n' '{"prompt": "a", "chosen": " same", "rejected": " same"}' > "$f"
    run "$SD" dump "$LLAMA" "$f" preference=1
    [[ "$output" == *"b.jsonl:1: \"chosen\" and \"rejected\" are identical"* ]]
    printf '%s\n' '{"chosen": [{"role": "assistant", "content": "x"}], "rejected": " y"}' > "$f"
    run "$SD" dump "$LLAMA" "$f" preference=1
    [[ "$output" == *"b.jsonl:1: fields \"chosen\" and \"rejected\" must both be strings or both lists"* ]]
    printf '%s\n' '{"prompt": "a", "chosen": " b", "rejected": " c"}' 'not json' '{"prompt": "a", "chosen": " b", "rejected": " b"}' '{"prompt": "q", "chosen": " d", "rejected": " e"}' > "$f"
    run "$SD" dump "$LLAMA" "$f" preference=1 skip_bad=1
    [ "$status" -eq 0 ]
    [[ "${lines[-1]}" == "stats records=4 samples=4 bad=2 "*" pairs=2" ]]
}

@test "rm: held-out accuracy on the story pairs rises from chance to >= 0.9; rewards' mean/std saved; rm --score reproduces them" {
    need_pref_assets
    out="$BATS_TEST_TMPDIR/rm"
    run timeout 300 "$TANDEM" rm --model "$STORIES" --data "$PF/story_train.jsonl" --eval-data "$PF/story_val.jsonl" \
        --out "$out" --seq-len 64 --batch-size 8 --lr 3e-3 --epochs 3 --log-every 20
    echo "$output" | grep -E "eval|step"
    [ "$status" -eq 0 ]
    a0=$(first_metric "$out/metrics.jsonl" eval_accuracy); a1=$(last_metric "$out/metrics.jsonl" eval_accuracy)
    echo "held-out accuracy $a0 -> $a1"
    awk -v a="$a0" 'BEGIN { exit !(a < 0.7) }'
    awk -v a="$a1" 'BEGIN { exit !(a >= 0.9) }'
    ck="$out/checkpoint-78"
    [ "$(jq -r '.architectures[0], .num_labels, .normalize_reward' "$ck/config.json" | paste -sd,)" = "LlamaForSequenceClassification,1,true" ]
    # rm --score on the held-out pairs' two halves: chosen outscores rejected as often as eval said
    jq -c '{prompt, response: .chosen}, {prompt, response: .rejected}' "$PF/story_val.jsonl" > "$BATS_TEST_TMPDIR/s.jsonl"
    run "$TANDEM" rm --score --model "$ck" --input "$BATS_TEST_TMPDIR/s.jsonl" --output "$BATS_TEST_TMPDIR/s.out"
    [ "$status" -eq 0 ]
    acc=$(jq -s '[range(0; length; 2) as $i | if .[$i].reward > .[$i + 1].reward then 1 else 0 end] | add / length' "$BATS_TEST_TMPDIR/s.out")
    [ "$acc" = "$a1" ] || awk -v a="$acc" -v b="$a1" 'BEGIN { exit !(a - b < 1e-9 && b - a < 1e-9) }'
    mean=$(jq -s '[.[].reward] | add / length' "$BATS_TEST_TMPDIR/s.out")
    awk -v a="$mean" -v b="$(jq .mean "$ck/config.json")" 'BEGIN { d = a - b; exit !(d < 1e-5 && d > -1e-5) }'
    [ "$(jq -s '[.[].reward_normalized] | add / length | fabs < 1e-5' "$BATS_TEST_TMPDIR/s.out")" = true ]
    # the same lines scored at tp 2 x pp 2 under mpirun: the same rewards within 1e-5
    run timeout 120 $MPIRUN 4 "$TANDEM" rm --score --model "$ck" --input "$BATS_TEST_TMPDIR/s.jsonl" --output "$BATS_TEST_TMPDIR/s4.out" --tp 2 --pp 2
    [ "$status" -eq 0 ]
    [ "$(jq -s '(.[0:length/2] | map(.reward)) as $a | (.[length/2:] | map(.reward)) as $b | [range(0; $a | length) | ($a[.] - $b[.]) | fabs] | max < 1e-5' "$BATS_TEST_TMPDIR/s.out" "$BATS_TEST_TMPDIR/s4.out")" = true ]
}

@test "rm: the saved reward model loads in transformers (AutoModelForSequenceClassification) with Tandem's scores" {
    need_pref_assets
    need_hfpy
    out="$BATS_TEST_TMPDIR/rm"
    run timeout 120 "$TANDEM" rm --model "$STORIES" --data "$PF/story_train.jsonl" --out "$out" --seq-len 64 --batch-size 8 --max-steps 3
    [ "$status" -eq 0 ]
    head -4 "$PF/story_val.jsonl" | jq -c '{prompt, response: .chosen}' > "$BATS_TEST_TMPDIR/s.jsonl"
    run "$TANDEM" rm --score --model "$out/checkpoint-3" --input "$BATS_TEST_TMPDIR/s.jsonl" --output "$BATS_TEST_TMPDIR/s.out"
    [ "$status" -eq 0 ]
    # the ids: [BOS] + encode(prompt + response) + [EOS], from `tandem tokenize`
    jq -c '{text: (.prompt + .response)}' "$BATS_TEST_TMPDIR/s.jsonl" | "$TANDEM" tokenize --tokenizer "$STORIES" --jsonl \
        | jq -c '.input_ids + [2]' | jq -s -c --slurpfile s <(jq -s '[.[].reward]' "$BATS_TEST_TMPDIR/s.out") '{ids: ., scores: $s[0]}' > "$BATS_TEST_TMPDIR/scores.json"
    run timeout 120 "$HFPY" "$FIX/check_hf_score.py" "$out/checkpoint-3" "$BATS_TEST_TMPDIR/scores.json"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: hf score"* ]]
}

@test "rm: tp 2 x pp 2 equals 1x1 (1e-5 relative), and --resume continues bit for bit" {
    need_pref_assets
    A=(--model "$STORIES" --data "$PF/story_train.jsonl" --seq-len 64 --batch-size 4 --max-steps 4 --lr 1e-3)
    run timeout 120 "$TANDEM" rm "${A[@]}" --out "$BATS_TEST_TMPDIR/a"
    [ "$status" -eq 0 ]
    run timeout 200 $MPIRUN 4 "$TANDEM" rm "${A[@]}" --out "$BATS_TEST_TMPDIR/b" --tp 2 --pp 2
    [ "$status" -eq 0 ]
    paste <(jq .loss "$BATS_TEST_TMPDIR/a/metrics.jsonl") <(jq .loss "$BATS_TEST_TMPDIR/b/metrics.jsonl") |
        awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * ($1 < 0 ? -$1 : $1) + 1e-7) { print "differ", $0; bad = 1 } } END { exit bad }'
    run timeout 120 "$TANDEM" rm "${A[@]}" --out "$BATS_TEST_TMPDIR/c" --save-every 2 --stop-after 2
    [ "$status" -eq 0 ]
    run timeout 120 "$TANDEM" rm "${A[@]}" --out "$BATS_TEST_TMPDIR/c" --resume "$BATS_TEST_TMPDIR/c/checkpoint-2"
    [ "$status" -eq 0 ]
    diff <(jq -c '[.step, .loss, .accuracy]' "$BATS_TEST_TMPDIR/a/metrics.jsonl") <(jq -c '[.step, .loss, .accuracy]' "$BATS_TEST_TMPDIR/c/metrics.jsonl")
}

@test "rm under mpirun at tp 2 x pp 2: held-out accuracy on the story pairs rises from chance to >= 0.9" {
    need_pref_assets
    out="$BATS_TEST_TMPDIR/rm22"
    run timeout 300 $MPIRUN 4 "$TANDEM" rm --model "$STORIES" --data "$PF/story_train.jsonl" --eval-data "$PF/story_val.jsonl" \
        --out "$out" --seq-len 64 --batch-size 8 --lr 3e-3 --epochs 3 --log-every 20 --tp 2 --pp 2
    echo "$output" | grep -E "eval|step"
    [ "$status" -eq 0 ]
    a0=$(first_metric "$out/metrics.jsonl" eval_accuracy); a1=$(last_metric "$out/metrics.jsonl" eval_accuracy)
    echo "tp 2 x pp 2 held-out accuracy $a0 -> $a1"
    awk -v a="$a0" 'BEGIN { exit !(a < 0.7) }'
    awk -v a="$a1" 'BEGIN { exit !(a >= 0.9) }'
}

@test "rm on hh-rlhf (harmless-base test, first 500: 200 to train, 50 held out): train and held-out accuracy reported (a tiny model: no target)" {
    need_pref_assets
    hh="$ASSETS/data/hh-rlhf/harmless-base-test.first500.jsonl"
    [ -e "$hh" ] || skip "$hh not present (../shared/assets)"
    # real data end to end (its format, 256-token truncation, eval, scoring), not a learning target:
    # one epoch of 200 pairs (it was 2 x 400: 48 s of the suite for the same checks)
    head -200 "$hh" > "$BATS_TEST_TMPDIR/train.jsonl"; tail -50 "$hh" > "$BATS_TEST_TMPDIR/val.jsonl"
    out="$BATS_TEST_TMPDIR/hh"
    run timeout 1200 "$TANDEM" rm --model "$STORIES" --data "$BATS_TEST_TMPDIR/train.jsonl" --eval-data "$BATS_TEST_TMPDIR/val.jsonl" \
        --out "$out" --seq-len 256 --batch-size 16 --lr 1e-3 --epochs 1 --log-every 10
    echo "$output" | grep -E "eval|step|data"
    [ "$status" -eq 0 ]
    ck=$(ls -d "$out"/checkpoint-* | sort -t- -k2 -n | tail -1)
    # training-set accuracy: the trained RM scores the first 100 training pairs' two full texts
    head -100 "$BATS_TEST_TMPDIR/train.jsonl" | jq -c '{text: .chosen}, {text: .rejected}' > "$BATS_TEST_TMPDIR/s.jsonl"
    run timeout 120 "$TANDEM" rm --score --model "$ck" --input "$BATS_TEST_TMPDIR/s.jsonl" --output "$BATS_TEST_TMPDIR/s.out" --seq-len 256
    [ "$status" -eq 0 ]
    tr=$(jq -s '[range(0; length; 2) as $i | if .[$i].reward > .[$i + 1].reward then 1 else 0 end] | add / length' "$BATS_TEST_TMPDIR/s.out")
    v0=$(first_metric "$out/metrics.jsonl" eval_accuracy); v1=$(last_metric "$out/metrics.jsonl" eval_accuracy)
    echo "hh-rlhf: train accuracy (100 pairs) $tr; held-out accuracy $v0 -> $v1" >&3
    [ "$(jq -s length "$BATS_TEST_TMPDIR/s.out")" -eq 200 ]
    awk -v a="$tr" -v b="$v1" 'BEGIN { exit !(a >= 0 && a <= 1 && b >= 0 && b <= 1) }'
}

# rewards/margins is beta times a difference of response logprob sums of ~-100: the sums carry ~1e-5
# relative (fp32, another summation order per layout), so the margin is compared to 1e-5 absolute.
@test "dpo: tp 2 x pp 2 equals 1x1 (1e-5 relative, margins 1e-5 absolute) on loss, margins and logps; --resume continues bit for bit" {
    need_pref_assets
    A=(--model "$STORIES" --data "$PF/story_train.jsonl" --seq-len 64 --batch-size 4 --max-steps 4 --lr 1e-3)
    run timeout 120 "$TANDEM" dpo "${A[@]}" --out "$BATS_TEST_TMPDIR/a"
    [ "$status" -eq 0 ]
    run timeout 200 $MPIRUN 4 "$TANDEM" dpo "${A[@]}" --out "$BATS_TEST_TMPDIR/b" --tp 2 --pp 2
    [ "$status" -eq 0 ]
    q='select(has("loss")) | [.loss, ."rewards/margins", ."logps/chosen", ."logps/rejected"] | @tsv'
    paste <(jq -r "$q" "$BATS_TEST_TMPDIR/a/metrics.jsonl" | tr '\t' '\n') <(jq -r "$q" "$BATS_TEST_TMPDIR/b/metrics.jsonl" | tr '\t' '\n') |
        awk '{ n++; d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1; if (d > 1e-5 * (a > 1 ? a : 1)) { print "differ", $0; bad = 1 } } END { exit bad || n != 16 }'
    run timeout 120 "$TANDEM" dpo "${A[@]}" --out "$BATS_TEST_TMPDIR/c" --save-every 2 --stop-after 2
    [ "$status" -eq 0 ]
    run timeout 120 "$TANDEM" dpo "${A[@]}" --out "$BATS_TEST_TMPDIR/c" --resume "$BATS_TEST_TMPDIR/c/checkpoint-2"
    [ "$status" -eq 0 ]
    diff <(jq -c '[.step, .loss, ."rewards/margins"]' "$BATS_TEST_TMPDIR/a/metrics.jsonl") <(jq -c '[.step, .loss, ."rewards/margins"]' "$BATS_TEST_TMPDIR/c/metrics.jsonl")
}

@test "rm / dpo --resume: another model's checkpoint, an LM checkpoint for rm, a reward model for dpo, other data, an incomplete checkpoint: one line each" {
    need_pref_assets
    A=(--data "$PF/story_train.jsonl" --seq-len 64 --batch-size 4 --max-steps 2)
    run timeout 60 "$TANDEM" rm --model "$STORIES" "${A[@]}" --out "$BATS_TEST_TMPDIR/r" --save-every 1
    [ "$status" -eq 0 ]
    run timeout 60 "$TANDEM" dpo --model "$STORIES" "${A[@]}" --out "$BATS_TEST_TMPDIR/d" --save-every 1
    [ "$status" -eq 0 ]
    before=$(cat "$BATS_TEST_TMPDIR"/r/checkpoint-2/* "$BATS_TEST_TMPDIR/r/metrics.jsonl" | md5sum)
    run "$TANDEM" rm --model "$STORIES" "${A[@]}" --out "$BATS_TEST_TMPDIR/r" --resume "$BATS_TEST_TMPDIR/d/checkpoint-1"
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --resume $BATS_TEST_TMPDIR/d/checkpoint-1: a causal-LM checkpoint, not a reward model's (no score head)" ]
    run "$TANDEM" dpo --model "$STORIES" "${A[@]}" --out "$BATS_TEST_TMPDIR/d" --resume "$BATS_TEST_TMPDIR/r/checkpoint-1"
    [ "$status" -ne 0 ]; [ "$output" = "tandem: $BATS_TEST_TMPDIR/r/checkpoint-1: a score-head model; dpo trains a causal LM" ]
    run "$TANDEM" rm --model "$FIX/models/llama_gqa" "${A[@]}" --out "$BATS_TEST_TMPDIR/x" --resume "$BATS_TEST_TMPDIR/r/checkpoint-1"
    [ "$status" -ne 0 ]; [[ "$output" == "tandem: --resume $BATS_TEST_TMPDIR/r/checkpoint-1: a checkpoint of another model "* ]]
    run "$TANDEM" rm --model "$STORIES" --data "$PF/story_val.jsonl" --seq-len 64 --batch-size 4 --max-steps 2 --out "$BATS_TEST_TMPDIR/r" --resume "$BATS_TEST_TMPDIR/r/checkpoint-1"
    [ "$status" -ne 0 ]; [[ "$output" == *"checkpoint-1/trainer_state.json: data cursor saved for 402 samples"*"resume with the same data"* ]]
    rm "$BATS_TEST_TMPDIR/r/checkpoint-1/trainer_state.json"
    run "$TANDEM" rm --model "$STORIES" "${A[@]}" --out "$BATS_TEST_TMPDIR/r" --resume "$BATS_TEST_TMPDIR/r/checkpoint-1"
    [ "$status" -ne 0 ]; [[ "$output" == *"checkpoint-1/trainer_state.json: missing: not a complete checkpoint"* ]]
    [ ! -e "$BATS_TEST_TMPDIR/x" ]
    # the failed resumes left the run's last checkpoint and its metrics as they were
    [ "$(cat "$BATS_TEST_TMPDIR"/r/checkpoint-2/* "$BATS_TEST_TMPDIR/r/metrics.jsonl" | md5sum)" = "$before" ]
}

@test "dpo: the first step's loss is ln 2 exactly (reference == policy bit for bit); held-out accuracy and the property's rate in samples rise" {
    need_pref_assets
    out="$BATS_TEST_TMPDIR/dpo"
    run timeout 300 "$TANDEM" dpo --model "$STORIES" --data "$PF/story_train.jsonl" --eval-data "$PF/story_val.jsonl" \
        --out "$out" --seq-len 64 --batch-size 8 --lr 1e-4 --epochs 3 --beta 0.1 --log-every 20
    echo "$output" | grep -E "eval|step"
    [ "$status" -eq 0 ]
    [ "$(jq -c 'select(.step == 1) | [.loss, ."rewards/chosen", ."rewards/rejected"]' "$out/metrics.jsonl")" = "[0.693147181,0,0]" ]
    a0=$(first_metric "$out/metrics.jsonl" "eval_rewards/accuracies"); a1=$(last_metric "$out/metrics.jsonl" "eval_rewards/accuracies")
    echo "held-out implicit-reward accuracy $a0 -> $a1"
    awk -v a="$a1" 'BEGIN { exit !(a >= 0.7) }'
    # the property ("happy") in 16 fresh samples of each held-out prompt, before and after
    jq -c --argjson k 16 'range(0; $k) as $j | {prompt, seed: (50000 + $j)}' "$PF/story_prompts_val.jsonl" > "$BATS_TEST_TMPDIR/g.jsonl"
    for m in "$STORIES" "$out/checkpoint-78"; do
        "$TANDEM" generate --model "$m" --input "$BATS_TEST_TMPDIR/g.jsonl" --output "$BATS_TEST_TMPDIR/g.out" --max-new-tokens 48 2>/dev/null
        jq -s '[.[].completion | test("\\bhappy\\b"; "i")] | map(if . then 1 else 0 end) | add / length' "$BATS_TEST_TMPDIR/g.out" >> "$BATS_TEST_TMPDIR/rates"
    done
    echo "property rate before / after: $(paste -sd' ' "$BATS_TEST_TMPDIR/rates")"
    awk 'NR == 1 { b = $1 } NR == 2 { a = $1 } END { exit !(a >= 3 * b && a >= 0.2) }' "$BATS_TEST_TMPDIR/rates"
}

@test "rm / dpo: bad options and inputs are one line each" {
    need_pref_assets
    run "$TANDEM" dpo --model "$STORIES" --data "$PF/story_train.jsonl" --out "$BATS_TEST_TMPDIR/x" --loss hinge
    [ "$status" -ne 0 ] && [[ "$output" == *"--loss hinge: expected sigmoid or ipo"* ]]
    run "$TANDEM" dpo --model "$STORIES" --data "$PF/story_train.jsonl" --out "$BATS_TEST_TMPDIR/x" --beta 0
    [ "$status" -ne 0 ] && [[ "$output" == *"--beta 0: must be > 0"* ]]
    run "$TANDEM" dpo --model "$STORIES" --data "$PF/story_train.jsonl" --out "$BATS_TEST_TMPDIR/x" --label-smoothing 0.5
    [ "$status" -ne 0 ] && [[ "$output" == *"--label-smoothing 0.5: must be in [0, 0.5)"* ]]
    run "$TANDEM" rm --model "$STORIES" --data "$PF/story_train.jsonl" --out "$BATS_TEST_TMPDIR/x" --ref "$STORIES"
    [ "$status" -ne 0 ] && [[ "$output" == *"rm: --ref is a dpo option"* ]]
    run "$TANDEM" rm --model "$STORIES" --data "$FIX/sft_data/pr.jsonl" --out "$BATS_TEST_TMPDIR/x"
    [ "$status" -ne 0 ] && [[ "$output" == *"pr.jsonl:1: field \"chosen\" missing"* ]]
    run "$TANDEM" rm --score --model "$STORIES" --input "$PF/story_val.jsonl" --output "$BATS_TEST_TMPDIR/x.jsonl"
    [ "$status" -ne 0 ] && [[ "$output" == *"a causal LM, not a reward model"* ]]
    [ ! -e "$BATS_TEST_TMPDIR/x" ] && [ ! -e "$BATS_TEST_TMPDIR/x.jsonl" ]
    [ "$(grep -c '^tandem: ' <<<"$output")" -eq 1 ]
}

@test "rm --score: a line longer than max_position_embeddings keeps its last tokens and is counted, as one longer than --seq-len is" {
    need_pref_assets
    run timeout 120 "$TANDEM" rm --model "$STORIES" --data "$PF/story_train.jsonl" --out "$BATS_TEST_TMPDIR/r" --seq-len 64 \
        --batch-size 4 --max-steps 1
    [ "$status" -eq 0 ]
    ck="$BATS_TEST_TMPDIR/r/checkpoint-1"
    [ "$(jq .max_position_embeddings "$ck/config.json")" -eq 512 ]
    long=$(printf 'The cat sat on the mat and the dog ran to the park. %.0s' $(seq 1 60))   # ~800 tokens
    printf '{"text": "%s"}\n{"text": "Once upon a time there was a cat."}\n' "$long" > "$BATS_TEST_TMPDIR/in.jsonl"
    [ "$("$TANDEM" tokenize --model "$ck" --jsonl < "$BATS_TEST_TMPDIR/in.jsonl" | head -1 | jq '.input_ids | length')" -gt 600 ]
    # --seq-len past the model's positions: cut to 512 (the end kept) and said, not scored at positions it has not got
    run "$TANDEM" rm --score --model "$ck" --input "$BATS_TEST_TMPDIR/in.jsonl" --output "$BATS_TEST_TMPDIR/a.jsonl" --seq-len 2048
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"rm --score: 1 of 2 lines longer than 512 tokens (max_position_embeddings) scored on their last 512 tokens"* ]]
    run "$TANDEM" rm --score --model "$ck" --input "$BATS_TEST_TMPDIR/in.jsonl" --output "$BATS_TEST_TMPDIR/b.jsonl" --seq-len 512
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"rm --score: 1 of 2 lines longer than 512 tokens (--seq-len) scored on their last 512 tokens"* ]]
    cmp "$BATS_TEST_TMPDIR/a.jsonl" "$BATS_TEST_TMPDIR/b.jsonl"
    # lines that fit say nothing
    tail -1 "$BATS_TEST_TMPDIR/in.jsonl" > "$BATS_TEST_TMPDIR/short.jsonl"
    run "$TANDEM" rm --score --model "$ck" --input "$BATS_TEST_TMPDIR/short.jsonl" --output "$BATS_TEST_TMPDIR/c.jsonl" --seq-len 2048
    [ "$status" -eq 0 ]; [[ "$output" != *"longer than"* ]]
}
