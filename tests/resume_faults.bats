#!/usr/bin/env bats
# A killed run resumed (issue 27 items 5 and 7): after kill -9 and --resume, OUT/metrics.jsonl
# equals the uninterrupted run's, timings aside (sft, rm with its eval lines, dpo, ppo), and the
# temporaries of a write a kill cut short (checkpoint-N.tmp.PID/, ppo's checkpoint-N/actor.tmp.PID/,
# the state files' NAME.tmp.PID) are removed at start and resume, never left inside a complete
# checkpoint. The kills are real (kill -9 of the running process once a later step's metrics line
# is on disk; ppo's is deterministic: its reward program stops answering at step 4); a stopped run
# with junk lines past its checkpoint and a cut last line stands for a kill at any other moment.
# Model: stories260K, 6 steps of a few ms.
load helpers

setup_file() {
    # sft data on the stories tokenizer: reverse 4 digits (train and eval)
    awk 'BEGIN { srand(7); for (i = 0; i < 80; i++) { s = ""; for (k = 0; k < 4; k++) s = s int(rand() * 10);
         printf "{\"prompt\": \"%s=\", \"response\": \"%s\"}\n", s, s } }' > "$BATS_FILE_TMPDIR/digits.jsonl"
    head -16 "$BATS_FILE_TMPDIR/digits.jsonl" > "$BATS_FILE_TMPDIR/digits_val.jsonl"
}

# numbers FILE: metrics.jsonl without its timings (bench/behaviour.sh's filter: the text edited, not
# reprinted, so every other byte is compared)
numbers() {
    perl -pe 's{,\s*"(?:timing_s/[^"]*|[^"]*_per_s)"\s*:\s*-?[0-9.eE+-]+}{}g' "$1"
}

# the commands: 6 steps each, an eval every 2 steps where the command has one
sft_cmd() { CMD=("$TANDEM" sft --model "$STORIES" --data "$BATS_FILE_TMPDIR/digits.jsonl" --eval-data "$BATS_FILE_TMPDIR/digits_val.jsonl"
                 --eval-every 2 --seq-len 32 --batch-size 4 --max-steps 6 --lr 1e-3 --threads 1); MARK=trainer_state.json; }
rm_cmd() { CMD=("$TANDEM" rm --model "$STORIES" --data "$PF/story_train.jsonl" --eval-data "$PF/story_val.jsonl" --eval-every 2
                --seq-len 64 --batch-size 4 --max-steps 6 --lr 1e-3 --threads 1); MARK=trainer_state.json; }
dpo_cmd() { CMD=("$TANDEM" dpo --model "$STORIES" --data "$PF/story_train.jsonl" --eval-data "$PF/story_val.jsonl" --eval-every 2
                 --seq-len 64 --batch-size 4 --max-steps 6 --lr 1e-3 --threads 1); MARK=trainer_state.json; }
ppo_cmd() { CMD=("$TANDEM" ppo --actor "$STORIES" --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 2
                 --rollout-batch-size 2 --max-new-tokens 8 --steps 6 --threads 1); MARK=ppo_state.json; }

# straight NAME: the uninterrupted run, into $BATS_TEST_TMPDIR/NAME
straight() {
    local extra=()
    [ "${CMD[1]}" = ppo ] && extra=(--reward-cmd "$RULE")
    run timeout 120 "${CMD[@]}" "${extra[@]}" --out "$BATS_TEST_TMPDIR/$1"
    [ "$status" -eq 0 ]
}

# resume_from DIR STEP: the same command, --resume DIR/checkpoint-STEP
resume_from() {
    local extra=()
    [ "${CMD[1]}" = ppo ] && extra=(--reward-cmd "$RULE")
    run timeout 120 "${CMD[@]}" "${extra[@]}" --out "$1" --save-every 2 --resume "$1/checkpoint-$2"
    [ "$status" -eq 0 ]
}

# killed DIR: the command with --save-every 2, kill -9 once checkpoint-2 is complete and a metrics
# line of step 3 or later is on disk (ppo: its reward program takes step 4's first request and
# answers no more, so the kill lands in step 4 every time)
killed() {
    local out="$1" pid end=$((SECONDS + $(scaled 120))) extra=()
    if [ "${CMD[1]}" = ppo ]; then
        cat > "$BATS_TEST_TMPDIR/stall.py" <<'EOF'
import json, re, sys
word, n = re.compile(r"\bhappy\b", re.IGNORECASE), 0
for line in sys.stdin:
    n += 1
    if n > 12:   # 3 steps of 2 prompts x 2 samples answered: step 4 waits until tandem is gone
        open(sys.argv[1], "w").close()
        for line in sys.stdin: pass
        break
    print(json.dumps({"reward": 1.0 if word.search(json.loads(line)["response"]) else 0.0}), flush=True)
EOF
        extra=(--reward-cmd "python3 -u $BATS_TEST_TMPDIR/stall.py $BATS_TEST_TMPDIR/stalled")
    fi
    "${CMD[@]}" "${extra[@]}" --out "$out" --save-every 2 > /dev/null 2>&1 3>&- &
    pid=$!
    while [ "$SECONDS" -lt "$end" ]; do
        if [ "${CMD[1]}" = ppo ]; then [ -e "$BATS_TEST_TMPDIR/stalled" ] && break
        else [ -e "$out/checkpoint-2/$MARK" ] && grep -q '^{"step": [3-9]' "$out/metrics.jsonl" 2>/dev/null && break; fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.01
    done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" || true
    [ -e "$out/checkpoint-2/$MARK" ]
    grep -q '^{"step": [3-9]' "$out/metrics.jsonl"   # lines past the checkpoint, to be trimmed
}

# stopped DIR: the command stopped after step 3 (checkpoints 2 and 3, rm's "after" eval and reward
# statistics at step 3), then what a kill at any later moment leaves: lines of later steps and a
# line cut short
stopped() {
    local extra=()
    [ "${CMD[1]}" = ppo ] && extra=(--reward-cmd "$RULE")
    run timeout 120 "${CMD[@]}" "${extra[@]}" --out "$1" --save-every 2 --stop-after 3
    [ "$status" -eq 0 ]
    printf '{"step": 4, "loss": 1}\n{"step": 5, "eval_loss": 2}\n{"step": 6, "lo' >> "$1/metrics.jsonl"
}

# check COMMAND: straight == killed + resumed from 2 == stopped + resumed from 3, timings aside
check() {
    "$1_cmd"
    straight a
    killed "$BATS_TEST_TMPDIR/k"
    resume_from "$BATS_TEST_TMPDIR/k" 2
    diff <(numbers "$BATS_TEST_TMPDIR/a/metrics.jsonl") <(numbers "$BATS_TEST_TMPDIR/k/metrics.jsonl")
    stopped "$BATS_TEST_TMPDIR/s"
    resume_from "$BATS_TEST_TMPDIR/s" 3
    diff <(numbers "$BATS_TEST_TMPDIR/a/metrics.jsonl") <(numbers "$BATS_TEST_TMPDIR/s/metrics.jsonl")
}

@test "metrics after kill -9 and --resume: sft (eval every 2) equals the uninterrupted run's, timings aside" {
    need_story
    check sft
}

@test "metrics after kill -9 and --resume: rm (eval every 2, reward statistics) equals the uninterrupted run's, timings aside" {
    need_story
    check rm
    [ "$(grep -c eval_reward_mean "$BATS_TEST_TMPDIR/s/metrics.jsonl")" -eq 1 ]
}

@test "metrics after kill -9 and --resume: dpo (eval every 2) equals the uninterrupted run's, timings aside" {
    need_story
    check dpo
}

@test "metrics after kill -9 and --resume: ppo equals the uninterrupted run's, timings aside" {
    need_story
    check ppo
}

@test "stale temporaries: a killed sft save's checkpoint-N.tmp.PID and state temporaries are removed at start and at resume" {
    need_story
    sft_cmd
    o="$BATS_TEST_TMPDIR/o"
    # a new run into an OUT holding only a killed run's unfinished checkpoint
    mkdir -p "$o/checkpoint-2.tmp.4242" && touch "$o/checkpoint-2.tmp.4242/config.json" "$o/metrics.jsonl.tmp.4242"
    run timeout 120 "${CMD[@]}" --out "$o" --save-every 2 --stop-after 2
    [ "$status" -eq 0 ]
    [[ "$output" == *"removed $o/checkpoint-2.tmp.4242"* ]]
    [ ! -e "$o/checkpoint-2.tmp.4242" ] && [ ! -e "$o/metrics.jsonl.tmp.4242" ]
    # a kill while saving checkpoint-4 and its state file, then --resume from checkpoint-2
    mkdir -p "$o/checkpoint-4.tmp.1" && touch "$o/checkpoint-4.tmp.1/model.safetensors" "$o/checkpoint-2/trainer_state.json.tmp.77"
    touch "$o/notes.tmp.1"   # not a name a run writes: left alone
    run timeout 120 "${CMD[@]}" --out "$o" --save-every 2 --resume "$o/checkpoint-2"
    [ "$status" -eq 0 ]
    [ -e "$o/checkpoint-6/trainer_state.json" ] && [ -e "$o/notes.tmp.1" ]
    run find "$o" -name '*.tmp.*' ! -name notes.tmp.1
    [ -z "$output" ]
}

@test "stale temporaries: a killed ppo save's checkpoint-N/actor.tmp.PID is removed at resume, not left inside the rewritten checkpoint" {
    need_story
    ppo_cmd
    o="$BATS_TEST_TMPDIR/o"
    run timeout 120 "${CMD[@]}" --reward-cmd "$RULE" --out "$o" --save-every 2 --stop-after 2 --steps 4
    [ "$status" -eq 0 ]
    # what kill -9 during checkpoint-4's actor write leaves: checkpoint-4/ with the actor's temporary
    mkdir -p "$o/checkpoint-4/actor.tmp.4242" && touch "$o/checkpoint-4/actor.tmp.4242/model.safetensors"
    run timeout 120 "${CMD[@]}" --reward-cmd "$RULE" --out "$o" --save-every 2 --steps 4 --resume "$o/checkpoint-2"
    [ "$status" -eq 0 ]
    [ -e "$o/checkpoint-4/ppo_state.json" ] && [ -e "$o/checkpoint-4/actor/config.json" ]
    run find "$o" -name '*.tmp.*'
    [ -z "$output" ]
}

@test "a trainer_state.json whose data cursor has the wrong magic stops the resume with a line saying so (not \"56 bytes, expected 56\")" {
    need_story
    sft_cmd
    run timeout 120 "${CMD[@]}" --out "$BATS_TEST_TMPDIR/o" --max-steps 2
    [ "$status" -eq 0 ]
    s="$BATS_TEST_TMPDIR/o/checkpoint-2/trainer_state.json"
    sed -i 's/"data_cursor": "[0-9a-f]\{8\}/"data_cursor": "00000000/' "$s"
    grep -q '"data_cursor": "00000000' "$s"
    run "${CMD[@]}" --out "$BATS_TEST_TMPDIR/o" --resume "$BATS_TEST_TMPDIR/o/checkpoint-2"
    echo "$output"
    [ "$status" -eq 1 ]
    [ "${lines[-1]}" = "tandem: $s: not a data cursor: its magic is 00000000, expected 52434454 (\"TDCR\")" ]
}
