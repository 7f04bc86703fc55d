#!/usr/bin/env bats
# A failing machine (issue 27): a full disk, a file-size limit, a run that fails before its first
# checkpoint. Each case is the real thing: a tmpfs of its own that fills up (mounted here; needs
# root, as CI runs), a real `ulimit -f`, a real ppo run whose reward program dies. What must hold:
# one "tandem:" line naming the file and why, exit 1 on every rank, no save reported that did not
# happen, the previous complete checkpoint usable, outputs resumable, and the same command runnable
# again after a run that stopped before its first checkpoint. Model: stories260K (a step is ms).
load helpers

PPO="--advantage grpo --n-samples-per-prompt 2 --rollout-batch-size 2 --max-new-tokens 8 --threads 1"
SFT="--seq-len 32 --batch-size 4 --max-steps 2 --threads 1"

MOUNTS=()
# small_disk DIR SIZE: a tmpfs of SIZE at DIR, unmounted in teardown
small_disk() {
    mkdir -p "$1"
    mount -t tmpfs -o size="$2" tmpfs "$1" || skip "cannot mount a tmpfs at $1 (needs root)"
    MOUNTS+=("$1")
}
# fill DIR: every free block of DIR's filesystem taken
fill() { dd if=/dev/zero of="$1/filler" bs=64k 2>/dev/null || true; }
teardown() {
    for d in "${MOUNTS[@]}"; do umount "$d"; done
}

# sft data on the stories tokenizer: reverse 4 digits
digits() {
    awk 'BEGIN { srand(7); for (i = 0; i < 64; i++) { s = ""; for (k = 0; k < 4; k++) s = s int(rand() * 10);
         printf "{\"prompt\": \"%s=\", \"response\": \"%s\"}\n", s, s } }' > "$1"
}

@test "disk full: ppo stops at the checkpoint that does not fit, one line, exit 1; the previous one is complete and resumes" {
    need_story
    # 1 MiB: not even the first checkpoint fits; nothing is left but metrics.jsonl (item 10: the
    # same command may run again)
    tiny="$BATS_TEST_TMPDIR/tiny"
    small_disk "$tiny" 1m
    run timeout 120 "$TANDEM" ppo --actor "$STORIES" --reward-cmd "$RULE" --prompts "$TRAIN" $PPO --steps 2 --out "$tiny/out"
    echo "$output"
    [ "$status" -eq 1 ]
    [ "$(grep -c '^tandem:' <<<"$output")" -eq 1 ]
    grep -q "^tandem: $tiny/out/checkpoint-2/actor[^ ]*: cannot write: No space left on device$" <<<"$output"
    ! grep -q "^saved\|^ppo: " <<<"$output"
    [ "$(ls "$tiny/out")" = metrics.jsonl ]
    # 5 MiB: one checkpoint (3.1 MB: weights, moments, tokenizer) fits, a second does not
    disk="$BATS_TEST_TMPDIR/disk"
    small_disk "$disk" 5m
    run timeout 120 "$TANDEM" ppo --actor "$STORIES" --reward-cmd "$RULE" --prompts "$TRAIN" $PPO --steps 3 --save-every 1 \
        --out "$disk/out"
    echo "$output"
    [ "$status" -eq 1 ]
    [ "$(grep -c '^tandem:' <<<"$output")" -eq 1 ]
    grep -q "^tandem: $disk/out/checkpoint-2/actor[^ ]*: cannot write: No space left on device$" <<<"$output"
    grep -q "^saved $disk/out/checkpoint-1$" <<<"$output"
    ! grep -q "checkpoint-2$\|^ppo: " <<<"$output"       # no save, no success reported
    [ ! -e "$disk/out/checkpoint-2" ]                    # nothing half-written left
    [ -e "$disk/out/checkpoint-1/ppo_state.json" ]
    # the checkpoint left behind continues the run
    run timeout 120 "$TANDEM" ppo --actor "$STORIES" --reward-cmd "$RULE" --prompts "$TRAIN" $PPO --steps 3 --save-every 1 \
        --out "$BATS_TEST_TMPDIR/more" --resume "$disk/out/checkpoint-1"
    echo "$output"
    [ "$status" -eq 0 ]
    [ -e "$BATS_TEST_TMPDIR/more/checkpoint-3/ppo_state.json" ]
}

@test "disk full: sft on a 1 MiB filesystem fails its checkpoint with one line (1 and 2 ranks); the same command runs once there is room" {
    need_story
    digits "$BATS_TEST_TMPDIR/d.jsonl"
    disk="$BATS_TEST_TMPDIR/disk"
    small_disk "$disk" 1m
    cmd=("$TANDEM" sft --model "$STORIES" --data "$BATS_TEST_TMPDIR/d.jsonl" --out "$disk/out" $SFT)
    run timeout 120 "${cmd[@]}"
    echo "$output"
    [ "$status" -eq 1 ]
    [ "$(grep -c '^tandem:' <<<"$output")" -eq 1 ]
    grep -q "^tandem: $disk/out/checkpoint-2\.tmp\.[0-9]*/model-00001-of-00001\.safetensors: cannot write: No space left on device$" <<<"$output"
    ! grep -q "^saved\|^trained" <<<"$output"
    [ "$(ls "$disk/out")" = metrics.jsonl ]    # the temp directory is gone
    # two ranks (dp 2): still one line, and the job's status is 1
    run timeout 120 $MPIRUN 2 "${cmd[@]}"
    echo "$output"
    [ "$status" -eq 1 ]
    [ "$(grep -c '^tandem:' <<<"$output")" -eq 1 ]
    grep -q "^tandem: .*model-00001-of-00001\.safetensors: cannot write: No space left on device$" <<<"$output"
    # item 10: what the failed runs left (metrics.jsonl) does not block the same command
    mount -o remount,size=16m "$disk"
    run timeout 120 "${cmd[@]}"
    echo "$output"
    [ "$status" -eq 0 ]
    [ -e "$disk/out/checkpoint-2/trainer_state.json" ]
    [ "$(jq -s length "$disk/out/metrics.jsonl")" -eq 2 ]
    # a complete checkpoint does block it
    run timeout 60 "${cmd[@]}"
    [ "$status" -eq 1 ]
    [[ "$output" == *"out: already exists (use --resume DIR to continue a run, or --overwrite): it holds checkpoint-2"* ]]
}

@test "disk full: metrics.jsonl, generate's output and rm --score's output are checked: one line naming the file, exit 1" {
    need_story
    digits "$BATS_TEST_TMPDIR/d.jsonl"
    disk="$BATS_TEST_TMPDIR/disk"
    small_disk "$disk" 256k
    fill "$disk"
    run timeout 120 "$TANDEM" sft --model "$STORIES" --data "$BATS_TEST_TMPDIR/d.jsonl" --out "$disk/out" $SFT
    echo "$output"
    [ "$status" -eq 1 ]
    [ "$(grep -c '^tandem:' <<<"$output")" -eq 1 ]
    grep -q "^tandem: $disk/out/metrics.jsonl: cannot write: No space left on device$" <<<"$output"
    head -4 "$TRAIN" | jq -c '{prompt}' > "$BATS_TEST_TMPDIR/p.jsonl"
    run timeout 60 "$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$disk/gen.jsonl" --max-new-tokens 8
    echo "$output"
    [ "$status" -eq 1 ]
    [ "$(grep -c '^tandem:' <<<"$output")" -eq 1 ]
    grep -q "^tandem: $disk/gen.jsonl: write failed: No space left on device$" <<<"$output"
    jq -c '{prompt, response: .prompt}' "$BATS_TEST_TMPDIR/p.jsonl" > "$BATS_TEST_TMPDIR/s.jsonl"
    "$TANDEM" rm --model "$STORIES" --data "$FIX/pref/story_train.jsonl" --out "$BATS_TEST_TMPDIR/rm" --seq-len 64 --batch-size 8 \
        --max-steps 1 --threads 1 2>/dev/null
    run timeout 60 "$TANDEM" rm --score --model "$BATS_TEST_TMPDIR/rm/checkpoint-1" --input "$BATS_TEST_TMPDIR/s.jsonl" --output "$disk/scores.jsonl"
    echo "$output"
    [ "$status" -eq 1 ]
    [ "$(grep -c '^tandem:' <<<"$output")" -eq 1 ]
    grep -q "^tandem: $disk/scores.jsonl: cannot write: No space left on device$" <<<"$output"
}

@test "ulimit -f: generate stops with one line (File too large), exit 1, whole lines only; --resume then completes the output" {
    need_story
    # 120 prompts x 200 new tokens with 10 logprobs each: about 7.5 MB of output, past the limit of 5 MB
    jq -c 'range(0; 8) as $j | {id: "\(input_line_number)-\($j)", prompt, seed: $j}' "$TRAIN" | head -120 > "$BATS_TEST_TMPDIR/p.jsonl"
    gen=("$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --max-new-tokens 200 --logprobs 10 --threads 1)
    "${gen[@]}" --output "$BATS_TEST_TMPDIR/ref.jsonl" 2>/dev/null
    [ "$(stat -c %s "$BATS_TEST_TMPDIR/ref.jsonl")" -gt $((5000 * 1024 + 1000000)) ]
    # bash's ulimit -f counts KiB. 5000: below the output's size, above every other file written.
    # One process runs without MPI (runtime/comm.c), so Open MPI's start (which needed about 4000)
    # plays no part: tests/no_launcher.bats
    run timeout 120 bash -c 'ulimit -f 5000 && exec "$@"' _ "${gen[@]}" --output "$BATS_TEST_TMPDIR/out.jsonl"
    echo "$output"
    [ "$status" -eq 1 ]
    [ "$(grep -c '^tandem:' <<<"$output")" -eq 1 ]
    grep -q "^tandem: $BATS_TEST_TMPDIR/out.jsonl: write failed: File too large$" <<<"$output"
    [ "$(tail -c 1 "$BATS_TEST_TMPDIR/out.jsonl" | od -An -c | tr -d ' ')" = '\n' ]   # no line cut
    jq -e . "$BATS_TEST_TMPDIR/out.jsonl" >/dev/null
    run timeout 120 "${gen[@]}" --output "$BATS_TEST_TMPDIR/out.jsonl" --resume
    echo "$output"
    [ "$status" -eq 0 ]
    cmp "$BATS_TEST_TMPDIR/ref.jsonl" "$BATS_TEST_TMPDIR/out.jsonl"
}

@test "a failed run can be rerun: ppo whose reward program dies at step 1, then the same command succeeds; a finished run blocks it" {
    need_story
    flag="$BATS_TEST_TMPDIR/reward-works"
    # the reward program dies until the flag exists
    reward="sh -c 'if [ -e $flag ]; then exec $RULE; else exit 3; fi'"
    cmd=("$TANDEM" ppo --actor "$STORIES" --reward-cmd "$reward" --prompts "$TRAIN" $PPO --steps 2 --out "$BATS_TEST_TMPDIR/out")
    run timeout 120 "${cmd[@]}"
    echo "$output"
    [ "$status" -eq 1 ]
    [ "$(grep -c '^tandem:' <<<"$output")" -eq 1 ]
    touch "$flag"
    run timeout 120 "${cmd[@]}"
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$(jq -s length "$BATS_TEST_TMPDIR/out/metrics.jsonl")" -eq 2 ]
    [ -e "$BATS_TEST_TMPDIR/out/checkpoint-2/ppo_state.json" ]
    run timeout 60 "${cmd[@]}"
    echo "$output"
    [ "$status" -eq 1 ]
    [[ "$output" == *"out: already exists (use --resume DIR to continue a run, or --overwrite): it holds checkpoint-2"* ]]
}
