#!/usr/bin/env bats
# examples/rlvr.sh: its data never trains on a held-out pair; the whole pipeline (random model ->
# chunked SFT -> GRPO -> greedy held-out accuracy) end to end on a tiny budget, with its refusals; and
# that it learns: the example's recipe with 20 GRPO steps (the full 60-step figures: README).
load helpers

@test "rlvr data: every held-out pair and only those are left out of the training files" {
    d="$BATS_TEST_TMPDIR/data"
    bash "$ROOT/examples/rlvr_data.sh" "$d"
    # a, b, answer of each line; held = (a + 2b) mod 7 == 0; the answer is a + b in every file
    check() {   # FILE FIELD WANT_HELD: prints the number of lines, fails on any line out of its class
        jq -r --arg f "$2" '[.prompt, (.[$f] | if $f == "response" then (capture("\\\\boxed\\{(?<n>[0-9]+)\\}$").n // "?") else . end)] | @tsv' "$1" |
            awk -F'\t' -v want="$3" '
            { if (!match($1, /^What is [0-9]+ \+ [0-9]+\?$/)) { print "bad prompt " $1; bad = 1; exit 1 }
              split(substr($1, 9), x, /[ +?]+/); a = x[1] + 0; b = x[2] + 0
              if (a > 99 || b > 99 || ((a + 2 * b) % 7 == 0) != want || $2 != a + b "") { print "line " NR ": " $0; bad = 1; exit 1 }
              n++ }
            END { if (!bad) print n }'
    }
    [ "$(check "$d/sft.jsonl" response 0)" = 8571 ]
    [ "$(check "$d/rl.jsonl" answer 0)" = 8571 ]
    [ "$(check "$d/val.jsonl" answer 0)" = 296 ]
    [ "$(check "$d/heldout_all.jsonl" answer 1)" = 1429 ]
    # together the training pairs and the held-out pairs are all 10000 sums, each once
    [ "$(jq -r .prompt "$d/sft.jsonl" "$d/heldout_all.jsonl" | sort -u | wc -l)" = 10000 ]
    # the held-out fixture of the pipeline test is from the class too
    [ "$(check "$FIX/rlvr/heldout16.jsonl" answer 1)" = 16 ]
}

@test "rlvr.sh end to end on a tiny budget: the JSON line, accuracies in [0, 1], refusals" {
    need_assets
    o="$BATS_TEST_TMPDIR/run"
    OUT="$o" SFT_MAX=20 SFT_CHUNK=10 SFT_TARGET=2 RL_STEPS=2 RL_PROMPTS=4 RL_G=2 \
        run timeout 300 bash "$ROOT/examples/rlvr.sh" "$FIX/rlvr/heldout16.jsonl"
    echo "$output"
    [ "$status" -eq 0 ]
    last=${lines[${#lines[@]} - 1]}
    echo "$last" | jq -e '.mode == "grpo" and .heldout_problems == 16 and .sft_steps == 20
        and (.heldout_accuracy_before | type == "number" and . >= 0 and . <= 1)
        and (.heldout_accuracy_after | type == "number" and . >= 0 and . <= 1)
        and (.seconds | has("sft") and has("rl"))'
    # SFT ran its two chunks (checked after each), RL its 2 steps on training prompts only
    [ "$(grep -c '^sft step' <<<"$output")" = 2 ]
    [ "$(jq -s 'length' "$o/rl/metrics.jsonl")" = 2 ]
    # the rewards came from the built-in verifier (--reward-fn math: its metric)
    [ "$(jq -s 'map(.["reward/timeouts"]) | length' "$o/rl/metrics.jsonl")" = 2 ]
    [ -d "$o/rl/checkpoint-2/actor" ]
    # the held-out answers were scored by the verifier: one verdict per held-out line
    [ "$(wc -l < "$o/eval_rl.verify_out")" = 16 ]
    # a held-out file with a training pair (1 + 1: 1 + 2 = 3) is refused, before any training
    echo '{"prompt": "What is 1 + 1?", "answer": "2"}' > "$BATS_TEST_TMPDIR/bad.jsonl"
    OUT="$o" run timeout 60 bash "$ROOT/examples/rlvr.sh" "$BATS_TEST_TMPDIR/bad.jsonl"
    [ "$status" -ne 0 ]
    [[ "$output" == *"1 + 1 is not held out"* ]]
    [ ! -d "$o/sft" ]
    OUT="$o" run timeout 60 bash "$ROOT/examples/rlvr.sh" - ppo
    [ "$status" -ne 0 ]
    [[ "$output" == *"mode 'ppo'"* ]]
}

@test "rlvr.sh learns: GRPO with --reward-fn math raises the greedy held-out accuracy (1429 pairs never trained on) by >= 0.2 in 20 steps, to >= 0.7" {
    need_assets
    # the example's recipe with 20 GRPO steps instead of 60 (about 1 min on 2 idle cores). Seed 1 on an
    # AVX-512 EPYC: 0.538 -> 0.820 (60 steps: 0.857; seeds 1-4: 0.46-0.54 -> 0.86-0.93). The bars
    # leave room for another CPU's float rounding, which changes the trajectory, not the learning.
    o="$BATS_TEST_TMPDIR/learn"
    OUT="$o" RL_STEPS=20 run timeout 900 bash "$ROOT/examples/rlvr.sh" -
    echo "$output"
    [ "$status" -eq 0 ]
    last=${lines[${#lines[@]} - 1]}
    echo "$last" | jq -e '.heldout_problems == 1429 and .heldout_accuracy_after - .heldout_accuracy_before >= 0.2
                          and .heldout_accuracy_after >= 0.7'
    # every step's rollout logprobs were the training logprobs, and the reward came from the verifier
    [ "$(jq -s 'map(.rollout_logprob_diff_max) | unique' -c "$o/rl/metrics.jsonl")" = "[0]" ]
    [ "$(jq -s 'map(.["reward/timeouts"]) | add' "$o/rl/metrics.jsonl")" = 0 ]
}

@test "rlvr.sh distill on a tiny budget: a fresh student whose SFT data are the teacher's own greedy answers, then on-policy distillation; the JSON line" {
    need_assets
    o="$BATS_TEST_TMPDIR/run"
    OUT="$o" SFT_MAX=10 SFT_CHUNK=10 SFT_TARGET=2 STUDENT_TARGET=2 RL_STEPS=2 RL_PROMPTS=4 RL_G=2 \
        run timeout 300 bash "$ROOT/examples/rlvr.sh" "$FIX/rlvr/heldout16.jsonl" distill
    echo "$output"
    [ "$status" -eq 0 ]
    last=${lines[${#lines[@]} - 1]}
    echo "$last" | jq -e '.mode == "distill" and (.heldout_accuracy_before | type == "number")
        and (.heldout_accuracy_after | type == "number")'
    # the student's SFT data: every training prompt with the teacher's greedy completion, nothing else
    [ "$(wc -l < "$o/student_sft.jsonl")" = "$(wc -l < "$o/sft.jsonl")" ]
    cmp <(jq -c '{prompt, response: .completion}' "$o/teacher.gen") "$o/student_sft.jsonl"
    ! cmp -s <(jq -c .response "$o/sft.jsonl") <(jq -c .response "$o/student_sft.jsonl")
    # the student is its own, smaller model (48-dim), trained by ppo with the teacher and no reward
    [ "$(jq .hidden_size "$o/student_init/config.json")" = 48 ]
    [ "$(jq -s 'map(has("actor/teacher_kl")) | all' "$o/rl/metrics.jsonl")" = true ]
    [ "$(jq -s 'length' "$o/rl/metrics.jsonl")" = 2 ]
}
