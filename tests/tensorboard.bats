#!/usr/bin/env bats
# --tensorboard DIR (train/tensorboard.h) on sft, rm, dpo and ppo (stories260K, a few steps each):
# the event files, read by the pinned tensorboard package (tests/fixtures/check_tensorboard.py),
# hold exactly metrics.jsonl's numbers per (tag, step), also after a resume has dropped the steps
# past its checkpoint; every record's CRC equals tensorboard's own CRC-32C, and a corrupt byte is
# caught; a directory that cannot be made stops the run with one line before training.
load helpers

CHECK="$ROOT/tests/fixtures/check_tensorboard.py"
# check_scalars TB_DIR OUT: the event files equal OUT/metrics.jsonl; each file's records check out
check_scalars() {
    run "$HFPY" "$CHECK" scalars "$1" "$2/metrics.jsonl"
    echo "$output"
    [ "$status" -eq 0 ]
    for f in "$1"/events.out.tfevents.*; do
        [ -s "$f" ] || continue   # a stranger's empty file (the resume test's)
        run "$HFPY" "$CHECK" records "$f"
        echo "$output"
        [ "$status" -eq 0 ]
    done
}

setup_file() {
    # sft data: the story pairs' prompts with their chosen responses
    jq -c '{prompt, response: .chosen}' "$ROOT/tests/fixtures/pref/story_train.jsonl" > "$BATS_FILE_TMPDIR/sft.jsonl"
    head -n 24 "$BATS_FILE_TMPDIR/sft.jsonl" > "$BATS_FILE_TMPDIR/sft_val.jsonl"
}

@test "sft --tensorboard: the events equal metrics.jsonl (training and eval lines); resumed at a checkpoint, the steps past it are dropped (purged) and written again" {
    need_story; need_hfpy
    A=(--model "$STORIES" --data "$BATS_FILE_TMPDIR/sft.jsonl" --eval-data "$BATS_FILE_TMPDIR/sft_val.jsonl" --seq-len 64
       --batch-size 4 --max-steps 6 --eval-every 2 --save-every 2 --threads 1)
    tb="$BATS_TEST_TMPDIR/tb"
    run "$TANDEM" sft "${A[@]}" --out "$BATS_TEST_TMPDIR/o" --tensorboard "$tb"
    [ "$status" -eq 0 ]
    check_scalars "$tb" "$BATS_TEST_TMPDIR/o"
    [ "$(ls "$tb" | wc -l)" -eq 1 ]
    # resume at step 4 (after the whole run: steps 4's eval, 5 and 6 are orphans) with another --lr,
    # so the resumed steps' numbers differ from the orphans'. A stranger's empty event file named
    # 5 s after ours: the resumed file must sort after it (TensorBoard reads files in name order).
    t=$(ls "$tb" | sed -E 's/^events\.out\.tfevents\.([0-9]+)\..*/\1/')
    touch "$tb/events.out.tfevents.$((t + 5)).elsewhere"
    cp "$BATS_TEST_TMPDIR/o/metrics.jsonl" "$BATS_TEST_TMPDIR/first.jsonl"
    run "$TANDEM" sft "${A[@]}" --out "$BATS_TEST_TMPDIR/o" --tensorboard "$tb" --resume "$BATS_TEST_TMPDIR/o/checkpoint-4" --lr 5e-4
    [ "$status" -eq 0 ]
    ls "$tb"
    ls "$tb" | grep -q "^events\.out\.tfevents\.$((t + 6))\."
    # the orphans differ from what replaced them, and metrics.jsonl has steps 0..6 once each
    ! diff <(jq -c 'select(.step == 6) | .loss' "$BATS_TEST_TMPDIR/first.jsonl") <(jq -c 'select(.step == 6) | .loss' "$BATS_TEST_TMPDIR/o/metrics.jsonl")
    [ "$(jq -s 'map(select(.loss)) | map(.step)' -c "$BATS_TEST_TMPDIR/o/metrics.jsonl")" = "[1,2,3,4,5,6]" ]
    check_scalars "$tb" "$BATS_TEST_TMPDIR/o"
}

@test "rm and dpo --tensorboard: the events equal metrics.jsonl (training and eval lines)" {
    need_story; need_hfpy
    A=(--model "$STORIES" --data "$PF/story_train.jsonl" --eval-data "$PF/story_val.jsonl" --seq-len 64 --batch-size 4
       --max-steps 2 --threads 1)
    for cmd in rm dpo; do
        run "$TANDEM" $cmd "${A[@]}" --out "$BATS_TEST_TMPDIR/$cmd" --tensorboard "$BATS_TEST_TMPDIR/tb-$cmd"
        [ "$status" -eq 0 ]
        check_scalars "$BATS_TEST_TMPDIR/tb-$cmd" "$BATS_TEST_TMPDIR/$cmd"
    done
    # each command's own keys made it
    jq -se 'map(select(.accuracy != null)) | length == 2' "$BATS_TEST_TMPDIR/rm/metrics.jsonl"
    jq -se 'map(select(."rewards/margins" != null)) | length == 2' "$BATS_TEST_TMPDIR/dpo/metrics.jsonl"
}

@test "ppo --tensorboard: the events equal metrics.jsonl (verl's tags), also resumed at a checkpoint before the end" {
    need_story; need_hfpy
    A=(--actor "$STORIES" --reward-cmd "$RULE" --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 2
       --rollout-batch-size 2 --max-new-tokens 8 --steps 3 --save-every 1 --threads 1)
    tb="$BATS_TEST_TMPDIR/tb"
    run "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/o" --tensorboard "$tb"
    [ "$status" -eq 0 ]
    check_scalars "$tb" "$BATS_TEST_TMPDIR/o"
    run "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/o" --tensorboard "$tb" --resume "$BATS_TEST_TMPDIR/o/checkpoint-2"
    [ "$status" -eq 0 ]
    [ "$(ls "$tb" | wc -l)" -eq 2 ]
    [ "$(jq -s 'map(.step)' -c "$BATS_TEST_TMPDIR/o/metrics.jsonl")" = "[1,2,3]" ]
    check_scalars "$tb" "$BATS_TEST_TMPDIR/o"
    jq -se 'map(select(."critic/score/mean" != null)) | length == 3' "$BATS_TEST_TMPDIR/o/metrics.jsonl"
}

@test "--tensorboard: a corrupt byte fails the CRC (tensorboard's reader and ours agree); a directory that cannot be made stops the run with one line, before training; inside --out it does not block rerunning a run that stopped before its first checkpoint" {
    need_story; need_hfpy
    A=(--model "$STORIES" --data "$BATS_FILE_TMPDIR/sft.jsonl" --seq-len 64 --batch-size 4 --max-steps 2 --threads 1)
    tb="$BATS_TEST_TMPDIR/tb"
    "$TANDEM" sft "${A[@]}" --out "$BATS_TEST_TMPDIR/o" --tensorboard "$tb" 2>/dev/null
    f=$(ls "$tb"/events.out.tfevents.*)
    run "$HFPY" "$CHECK" records "$f"
    [ "$status" -eq 0 ]
    # one byte of the last record's packed Event (its CRC is the file's last 4 bytes): flipped
    size=$(stat -c %s "$f")
    printf '\x7f' | dd of="$f" bs=1 seek=$((size - 6)) conv=notrunc status=none
    run "$HFPY" "$CHECK" records "$f"
    echo "$output"
    [ "$status" -eq 3 ]
    [[ "$output" == *"CRC differs"* ]]
    # the scalars the reader keeps stop at the bad record: no longer metrics.jsonl's
    run "$HFPY" "$CHECK" scalars "$tb" "$BATS_TEST_TMPDIR/o/metrics.jsonl"
    echo "$output"
    [ "$status" -eq 1 ]
    [[ "$output" == *"missing [("* ]]
    # tensorboard's record reader on its own: the CRC check names the record
    run "$HFPY" -c 'import sys; from tensorboard.compat.tensorflow_stub import pywrap_tensorflow as s
r = s.PyRecordReader_New(sys.argv[1], 0, None, None)
while True: r.GetNext()' "$f"
    echo "$output"
    [[ "$output" == *"failed event crc32 check"* ]]

    # a path under a regular file: one line naming the flag, nothing trained, alone and under mpirun
    touch "$BATS_TEST_TMPDIR/file"
    run_one_line "--tensorboard $BATS_TEST_TMPDIR/file/tb: cannot create or write the directory: Not a directory" \
        "$TANDEM" sft "${A[@]}" --out "$BATS_TEST_TMPDIR/o2" --tensorboard "$BATS_TEST_TMPDIR/file/tb"
    [ ! -e "$BATS_TEST_TMPDIR/o2/metrics.jsonl" ]
    run_one_line "--tensorboard $BATS_TEST_TMPDIR/file/tb: cannot create" \
        timeout 60 $MPIRUN 2 "$TANDEM" sft "${A[@]}" --tp 2 --out "$BATS_TEST_TMPDIR/o3" --tensorboard "$BATS_TEST_TMPDIR/file/tb"
    [ ! -e "$BATS_TEST_TMPDIR/o3/metrics.jsonl" ]
    run_one_line "--tensorboard $BATS_TEST_TMPDIR/file/tb: cannot create" \
        "$TANDEM" ppo --actor "$STORIES" --reward-cmd "$RULE" --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 2 \
        --out "$BATS_TEST_TMPDIR/o4" --tensorboard "$BATS_TEST_TMPDIR/file/tb"
    [ ! -e "$BATS_TEST_TMPDIR/o4/metrics.jsonl" ]

    # OUT/runs/tb (HF's output_dir/runs): what a run that stopped before its first checkpoint left
    # does not block the same command; another name in OUT still does
    o5="$BATS_TEST_TMPDIR/o5"
    mkdir -p "$o5/runs/tb"
    touch "$o5/metrics.jsonl" "$o5/runs/tb/events.out.tfevents.1.elsewhere"
    run "$TANDEM" sft "${A[@]}" --out "$o5" --tensorboard "$o5/runs/tb"
    [ "$status" -eq 0 ]
    check_scalars "$o5/runs/tb" "$o5"
    rm -r "$o5/checkpoint-2"
    touch "$o5/notes"
    run_one_line "it holds notes" "$TANDEM" sft "${A[@]}" --out "$o5" --tensorboard "$o5/runs/tb"
    rm "$o5/notes"
    run_one_line "it holds runs" "$TANDEM" sft "${A[@]}" --out "$o5" --tensorboard "$BATS_TEST_TMPDIR/tb-elsewhere"
}
