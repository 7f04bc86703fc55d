#!/usr/bin/env bats
# ppo --eval-prompts (rlhf/ppo_eval.h): the held-out greedy eval is the greedy generation scored by
# the run's reward, leaves the run's numbers as they are (one process and dp 2), resumes as the
# uninterrupted run, and is refused where it makes no sense. examples/lookup_env.py: the protocol,
# the data's split and its token ids; examples/tool_use.sh end to end, and that it learns.
load helpers

# a --reward-cmd with a graded, deterministic reward: a tenth of the number of "e"s in the response (not its
# length: ppo decodes a response alone, without generate's leading space)
efrac() {
    cat > "$BATS_TEST_TMPDIR/efrac.py" <<'EOF'
import json, sys
for line in sys.stdin:
    t = json.loads(line)["response"]
    print(json.dumps({"reward": t.count("e") / 10}), flush=True)
EOF
    echo "python3 $BATS_TEST_TMPDIR/efrac.py"
}
# the run's numbers: metrics lines without the eval lines and timings
train_numbers() { jq -c 'select(has("eval/n") | not) | del(.samples_per_s) | with_entries(select(.key | startswith("timing_s/") | not))' "$1"; }
# eval_at DIR STEP: that step's eval/reward_mean
eval_at() { jq -r --argjson k "$2" 'select(.step == $k and has("eval/n")) | .["eval/reward_mean"]' "$1/metrics.jsonl"; }

setup_eval() {
    need_assets
    head -6 "$TRAIN" > "$BATS_TEST_TMPDIR/p.jsonl"
    sed -n 100,104p "$TRAIN" > "$BATS_TEST_TMPDIR/e.jsonl"
    A=(--actor "$STORIES" --prompts "$BATS_TEST_TMPDIR/p.jsonl" --advantage grpo --n-samples-per-prompt 2 --rollout-batch-size 2
       --max-new-tokens 8 --steps 4 --reward-cmd "$(efrac)" --actor-lr 1e-3 --threads 1)
}

@test "ppo --eval-prompts: the eval is generate's greedy output scored by the reward program, before and after; the run's numbers and weights keep their bits" {
    setup_eval
    run timeout 120 "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/plain"
    [ "$status" -eq 0 ]
    run timeout 120 "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/ev" --eval-prompts "$BATS_TEST_TMPDIR/e.jsonl" --eval-every 2
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"eval step 0 (before): reward_mean"*"over 5 prompts"* ]]
    diff <(train_numbers "$BATS_TEST_TMPDIR/plain/metrics.jsonl") <(train_numbers "$BATS_TEST_TMPDIR/ev/metrics.jsonl")
    cmp <(cat "$BATS_TEST_TMPDIR"/plain/checkpoint-4/actor/*.safetensors) <(cat "$BATS_TEST_TMPDIR"/ev/checkpoint-4/actor/*.safetensors)
    # the weights moved, so the comparison could fail
    ! cmp -s <(cat "$STORIES"/*.safetensors) <(cat "$BATS_TEST_TMPDIR"/ev/checkpoint-4/actor/*.safetensors)
    # eval lines at steps 0, 2, 4, each after that step's training line, of 5 prompts
    [ "$(jq -c 'select(has("eval/n")) | [.step, .["eval/n"]]' "$BATS_TEST_TMPDIR/ev/metrics.jsonl" | tr -d '\n')" = "[0,5][2,5][4,5]" ]
    [ "$(jq -r '.step' "$BATS_TEST_TMPDIR/ev/metrics.jsonl" | tr '\n' ' ')" = "0 1 2 2 3 4 4 " ]
    # the same number from generate's greedy output and the reward program, for the starting and the final weights
    jq -c '{id: input_line_number, prompt}' "$BATS_TEST_TMPDIR/e.jsonl" > "$BATS_TEST_TMPDIR/gen_in.jsonl"
    for m in "$STORIES:0" "$BATS_TEST_TMPDIR/ev/checkpoint-4/actor:4"; do
        run timeout 60 "$TANDEM" generate --model "${m%:*}" --input "$BATS_TEST_TMPDIR/gen_in.jsonl" --output "$BATS_TEST_TMPDIR/g.jsonl" \
            --temperature 0 --max-new-tokens 8 --threads 1
        [ "$status" -eq 0 ]
        want=$(jq -c '{prompt, response: .completion}' "$BATS_TEST_TMPDIR/g.jsonl" | python3 "$BATS_TEST_TMPDIR/efrac.py" |
               jq -s 'map(.reward) | add / length')
        got=$(eval_at "$BATS_TEST_TMPDIR/ev" "${m##*:}")
        echo "step ${m##*:}: eval $got, generate + reward $want"
        python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 1e-8 * max(abs(b), 1))" "$got" "$want"
    done
    # and the eval moved with the weights (the two checks are not of one number)
    [ "$(eval_at "$BATS_TEST_TMPDIR/ev" 0)" != "$(eval_at "$BATS_TEST_TMPDIR/ev" 4)" ]
}

@test "ppo --eval-prompts at dp 2 and tp 2: the same evals as one process, the run's weights as without it" {
    setup_eval
    run timeout 120 "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/one" --eval-prompts "$BATS_TEST_TMPDIR/e.jsonl"
    [ "$status" -eq 0 ]
    run timeout 200 $MPIRUN 2 "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/dp"
    [ "$status" -eq 0 ]
    run timeout 200 $MPIRUN 2 "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/dpev" --eval-prompts "$BATS_TEST_TMPDIR/e.jsonl"
    [ "$status" -eq 0 ]
    cmp <(cat "$BATS_TEST_TMPDIR"/dp/checkpoint-4/actor/*.safetensors) <(cat "$BATS_TEST_TMPDIR"/dpev/checkpoint-4/actor/*.safetensors)
    diff <(train_numbers "$BATS_TEST_TMPDIR/dp/metrics.jsonl") <(train_numbers "$BATS_TEST_TMPDIR/dpev/metrics.jsonl")
    # the greedy eval of the starting weights is the one process's at any layout (the final weights may
    # differ in the last bits between dp 1 and 2: the dp sum's order)
    [ "$(eval_at "$BATS_TEST_TMPDIR/dpev" 0)" = "$(eval_at "$BATS_TEST_TMPDIR/one" 0)" ]
    [ -n "$(eval_at "$BATS_TEST_TMPDIR/dpev" 4)" ]
    run timeout 200 $MPIRUN 2 "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/tp" --actor-tp 2 --eval-prompts "$BATS_TEST_TMPDIR/e.jsonl"
    [ "$status" -eq 0 ]
    [ "$(eval_at "$BATS_TEST_TMPDIR/tp" 0)" = "$(eval_at "$BATS_TEST_TMPDIR/one" 0)" ]
}

@test "ppo --eval-prompts --resume: killed at an eval step or between, the resumed metrics are the uninterrupted run's" {
    setup_eval
    B=("${A[@]}" --eval-prompts "$BATS_TEST_TMPDIR/e.jsonl" --eval-every 2)
    run timeout 120 "$TANDEM" ppo "${B[@]}" --out "$BATS_TEST_TMPDIR/straight"
    [ "$status" -eq 0 ]
    for k in 2 3; do
        run timeout 120 "$TANDEM" ppo "${B[@]}" --out "$BATS_TEST_TMPDIR/r$k" --save-every "$k" --stop-after "$k"
        [ "$status" -eq 0 ]
        run timeout 120 "$TANDEM" ppo "${B[@]}" --out "$BATS_TEST_TMPDIR/r$k" --resume "$BATS_TEST_TMPDIR/r$k/checkpoint-$k"
        [ "$status" -eq 0 ]
        diff <(numbers "$BATS_TEST_TMPDIR/straight/metrics.jsonl") <(numbers "$BATS_TEST_TMPDIR/r$k/metrics.jsonl")
    done
}

@test "ppo --eval-prompts: refusals" {
    setup_eval
    B=("${A[@]}" --steps 1 --out "$BATS_TEST_TMPDIR/o")
    run timeout 60 "$TANDEM" ppo "${B[@]}" --eval-every 2
    [ "$status" -ne 0 ] && [[ "$output" == *"--eval-every: only with --eval-prompts"* ]]
    run timeout 60 "$TANDEM" ppo "${B[@]}" --eval-prompts "$BATS_TEST_TMPDIR/e.jsonl" --eval-every -1
    [ "$status" -ne 0 ] && [[ "$output" == *"--eval-every -1: must be >= 0"* ]]
    : > "$BATS_TEST_TMPDIR/empty.jsonl"
    run timeout 60 "$TANDEM" ppo "${B[@]}" --eval-prompts "$BATS_TEST_TMPDIR/empty.jsonl"
    [ "$status" -ne 0 ] && [[ "$output" == *"--eval-prompts $BATS_TEST_TMPDIR/empty.jsonl: no prompts"* ]]
    echo '{"prompt": 3}' > "$BATS_TEST_TMPDIR/bad.jsonl"
    run timeout 60 "$TANDEM" ppo "${B[@]}" --eval-prompts "$BATS_TEST_TMPDIR/bad.jsonl"
    [ "$status" -ne 0 ] && [[ "$output" == *"bad.jsonl:1:"* ]]
}

@test "lookup_env.py: interleaved episodes, the tool's answers, the rewards, at most 3 turns" {
    E="python3 $ROOT/examples/lookup_env.py"
    L='{"prompt": "What is the number of kivo?", "name": "kivo", "number": "4821"}'
    M='{"prompt": "What is the number of abc?", "name": "abc", "number": "1111"}'
    out=$(printf '%s\n' \
        "{\"type\": \"reset\", \"episode\": 7, \"prompt\": $L}" "{\"type\": \"reset\", \"episode\": 8, \"prompt\": $M}" \
        "{\"type\": \"reset\", \"episode\": 9, \"prompt\": $L}" \
        '{"type": "step", "episode": 8, "turn": 1, "action": " <lookup>kivo</lookup>", "action_ids": []}' \
        '{"type": "step", "episode": 7, "turn": 1, "action": " <lookup>kivo</lookup>", "action_ids": []}' \
        '{"type": "step", "episode": 9, "turn": 1, "action": " <lookup>kivo</lookup>", "action_ids": []}' \
        '{"type": "step", "episode": 7, "turn": 2, "action": " <answer>4821</answer>", "action_ids": []}' \
        '{"type": "step", "episode": 8, "turn": 2, "action": " <answer>4821</answer>", "action_ids": []}' \
        '{"type": "step", "episode": 9, "turn": 2, "action": " <lookup>kiv</lookup>", "action_ids": []}' \
        '{"type": "step", "episode": 9, "turn": 3, "action": " <lookup>kivo</lookup>", "action_ids": []}' | $E | jq -c .)
    echo "$out"
    want='{"episode":7,"observation":""}
{"episode":8,"observation":""}
{"episode":9,"observation":""}
{"episode":8,"environment_feedback":"<result>unknown</result>","reward":0,"done":false}
{"episode":7,"environment_feedback":"<result>4821</result>","reward":0,"done":false}
{"episode":9,"environment_feedback":"<result>4821</result>","reward":0,"done":false}
{"episode":7,"environment_feedback":"","reward":1,"done":true}
{"episode":8,"environment_feedback":"","reward":0,"done":true}
{"episode":9,"environment_feedback":"<result>unknown</result>","reward":0,"done":false}
{"episode":9,"environment_feedback":"<result>4821</result>","reward":0,"done":true}'
    [ "$out" = "$want" ]
    # an action with neither tool call nor answer ends the episode with 0
    out=$(printf '%s\n' "{\"type\": \"reset\", \"episode\": 0, \"prompt\": $L}" \
        '{"type": "step", "episode": 0, "turn": 1, "action": " 4821", "action_ids": []}' | $E | tail -1 | jq -c .)
    [ "$out" = '{"episode":0,"environment_feedback":"","reward":0,"done":true}' ]
}

@test "lookup_env.py data: held-out names and numbers never in training; the SFT records' ids are a rollout's" {
    need_assets
    d="$BATS_TEST_TMPDIR/d"
    mkdir -p "$d"
    python3 "$ROOT/examples/lookup_env.py" data "$d" 1 500 100
    [ "$(wc -l < "$d/rl.jsonl")" = 500 ] && [ "$(wc -l < "$d/sft.jsonl")" = 1000 ] && [ "$(wc -l < "$d/heldout.jsonl")" = 100 ]
    python3 "$ROOT/examples/lookup_env.py" check "$d/heldout.jsonl"
    run python3 "$ROOT/examples/lookup_env.py" check "$d/val.jsonl"
    [ "$status" -ne 0 ] && [[ "$output" == *"val.jsonl:1: "*"is not held out"* ]]
    # no held-out name or number in any training line, demonstration or validation line
    held=$(jq -r '.name, .number' "$d/heldout.jsonl" | sort -u)
    [ -z "$(comm -12 <(echo "$held") <(jq -r '.name, .number' "$d/rl.jsonl" "$d/val.jsonl" | sort -u))" ]
    [ -z "$(grep -oE '[a-z]{3,8}|[0-9]{4}' "$d/sft.jsonl" | sort -u | comm -12 <(echo "$held") -)" ]
    # names 3-8 letters, numbers 4 digits, prompts the issue's
    jq -e -s 'all(.[]; (.name | test("^[a-z]{3,8}$")) and (.number | test("^[0-9]{4}$"))
                      and .prompt == "What is the number of \(.name)?")' "$d/rl.jsonl" "$d/heldout.jsonl"
    # sft's ids of an answer record ([BOS] encode(prompt) encode(response)) are a rollout's: the question, the
    # model's turn, the feedback tokenised on its own, the next turn (each encoded alone, as ppo does)
    TOK="$ASSETS/models/stories260K/tok512.model"
    enc() { printf '%s\n' "$1" | "$TANDEM" tokenize --tokenizer "$TOK" --no-bos; }
    jq -c 'select(.response | startswith("<answer>"))' "$d/sft.jsonl" | head -20 > "$d/a.jsonl"
    while read -r r; do
        p=$(jq -r .prompt <<<"$r") resp=$(jq -r .response <<<"$r")
        q=${p%% <lookup>*} rest=${p#* <lookup>}
        name=${rest%%</lookup>*} num=${p##*<result>}; num=${num%</result>}
        sft_ids="$(enc "$p") $(enc "$resp")"
        roll_ids="$(enc "$q") $(enc "<lookup>$name</lookup>") $(enc "<result>$num</result>") $(enc "<answer>$num</answer>")"
        [ "$sft_ids" = "$roll_ids" ] || { echo "$r: $sft_ids != $roll_ids"; false; }
    done < "$d/a.jsonl"
    [ "$(wc -l < "$d/a.jsonl")" = 20 ]
}

@test "tool_use.sh end to end on a tiny budget: the JSON line, success rates in [0, 1], refusals" {
    need_assets
    o="$BATS_TEST_TMPDIR/run"
    OUT="$o" N_TRAIN=200 SFT_MAX=20 SFT_CHUNK=10 SFT_TARGET=2 RL_STEPS=2 RL_PROMPTS=4 RL_G=2 \
        run timeout 300 bash "$ROOT/examples/tool_use.sh" -
    echo "$output"
    [ "$status" -eq 0 ]
    last=${lines[${#lines[@]} - 1]}
    echo "$last" | jq -e '.heldout_lines == 200 and .sft_steps == 20
        and (.heldout_success_before | type == "number" and . >= 0 and . <= 1)
        and (.heldout_success_after | type == "number" and . >= 0 and . <= 1)
        and (.seconds | has("sft") and has("rl"))'
    [ "$(grep -c '^sft step' <<<"$output")" = 2 ]
    # 2 GRPO steps over episodes of the environment, the held-out eval before and after
    [ "$(jq -s 'map(select(has("eval/n") | not)) | length' "$o/rl/metrics.jsonl")" = 2 ]
    [ "$(jq -s -c 'map(select(has("eval/n")) | [.step, .["eval/n"]])' "$o/rl/metrics.jsonl")" = "[[0,200],[2,200]]" ]
    [ "$(jq -s 'map(.rollout_logprob_diff_max // 0) | max' "$o/rl/metrics.jsonl")" = 0 ]
    # a held-out file with a training line is refused before any training
    head -1 "$o/rl.jsonl" > "$BATS_TEST_TMPDIR/bad.jsonl"
    OUT="$o" run timeout 60 bash "$ROOT/examples/tool_use.sh" "$BATS_TEST_TMPDIR/bad.jsonl"
    [ "$status" -ne 0 ]
    [[ "$output" == *"is not held out"* ]]
    [ ! -d "$o/sft" ]
    OUT="$o" SFT_MODEL="$BATS_TEST_TMPDIR" run timeout 60 bash "$ROOT/examples/tool_use.sh" -
    [ "$status" -ne 0 ]
    [[ "$output" == *"SFT_MODEL=$BATS_TEST_TMPDIR: not a model directory"* ]]
}

@test "tool_use.sh learns: GRPO over episodes with the lookup environment raises the greedy held-out success (names and numbers never trained on) by >= 0.12 to >= 0.7 in 30 steps" {
    need_assets
    # GRPO alone (the example's recipe, seed 1, 30 steps instead of 150) from tests/fixtures/tool_use/sft,
    # the example's seed-1 SFT (the SFT is what took 2 of the 3 minutes): 0.605 -> 0.80 here (150 steps:
    # 0.92; examples/tool_use.sh). The bar leaves room for another CPU's float rounding.
    o="$BATS_TEST_TMPDIR/learn"
    OUT="$o" SEED=1 SFT_MODEL="$ROOT/tests/fixtures/tool_use/sft" RL_STEPS=30 run timeout 600 bash "$ROOT/examples/tool_use.sh" -
    echo "$output"
    [ "$status" -eq 0 ]
    last=${lines[${#lines[@]} - 1]}
    echo "$last" | jq -e '.heldout_lines == 200 and .sft_steps == 0 and .heldout_success_after - .heldout_success_before >= 0.12
                          and .heldout_success_after >= 0.7'
    # every step's rollout logprobs were the training logprobs over the multi-turn episodes
    [ "$(jq -s 'map(select(has("eval/n") | not) | .rollout_logprob_diff_max) | unique' -c "$o/rl/metrics.jsonl")" = "[0]" ]
}

@test "ppo --eval-prompts with --env-cmd: the eval's episodes are the environment's, their ids apart from the run's and unique" {
    need_assets
    d="$BATS_TEST_TMPDIR/d"
    mkdir -p "$d"
    python3 "$ROOT/examples/lookup_env.py" data "$d" 1 20 5
    run timeout 120 "$TANDEM" ppo --actor "$STORIES" --prompts "$d/rl.jsonl" --out "$BATS_TEST_TMPDIR/o" --advantage grpo \
        --n-samples-per-prompt 2 --rollout-batch-size 2 --steps 3 --max-new-tokens 8 --max-episode-tokens 24 --threads 1 \
        --env-cmd "tee -a $BATS_TEST_TMPDIR/msgs.jsonl | python3 $ROOT/examples/lookup_env.py" \
        --eval-prompts "$d/heldout.jsonl" --eval-every 1
    echo "$output"
    [ "$status" -eq 0 ]
    # 3 steps x 4 episodes, and 4 evals x 5 episodes, each reset once under its own id
    [ "$(jq -s 'map(select(.type == "reset")) | length' "$BATS_TEST_TMPDIR/msgs.jsonl")" = 32 ]
    [ "$(jq -s 'map(select(.type == "reset") | .episode) | unique | length' "$BATS_TEST_TMPDIR/msgs.jsonl")" = 32 ]
    # the eval's resets carry the held-out lines, and every id of theirs is past every training id
    jq -s -e 'map(select(.type == "reset")) | (map(select(.prompt.name | test("^[a-z]+$")))) as $r
        | ($r | map(select(.prompt.prompt | IN($held[])))) as $ev | ($r - $ev) as $tr
        | ($ev | length) == 20 and ($tr | length) == 12 and ($ev | map(.episode) | min) > ($tr | map(.episode) | max)' \
        --slurpfile held <(jq .prompt "$d/heldout.jsonl") "$BATS_TEST_TMPDIR/msgs.jsonl"
    [ "$(jq -c 'select(has("eval/n")) | [.step, .["eval/n"]]' "$BATS_TEST_TMPDIR/o/metrics.jsonl" | tr -d '\n')" = "[0,5][1,5][2,5][3,5]" ]
}
