#!/usr/bin/env bats
# A process that no launcher started (no mpirun) runs alone without initialising MPI (runtime/comm.c).
# Open MPI's singleton start wrote a 4 MiB shared-memory segment and a PMIx store before any Tandem
# code ran: under a `ulimit -f` below about 4000 KiB it failed with PMIx banners (under 1 it hung).
# What must hold: under such a limit a one-process generate and sft run, give what they give without
# the limit, and print nothing of Open MPI or PMIx. Model: stories260K (a step is ms).
load helpers

# bash's ulimit -f counts KiB: 3000 is below the ~4000 Open MPI needed (measured: 3000 and 4000 fail),
# above every file written here (the largest: sft's weights and each AdamW moment, 1 MiB each)
LIMIT=3000

# limited CMD...: runs CMD under ulimit -f $LIMIT, no launcher in its environment
limited() {
    run timeout 120 env -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u PMIX_RANK -u PMI_RANK \
        bash -c 'ulimit -f '"$LIMIT"' && exec "$@"' _ "$@"
    echo "$output"
    [ "$status" -eq 0 ]
    # nothing of Open MPI's start: no PMIx/OPAL error, no MPI_Init banner, no forwarded signal
    ! grep -Eqi 'pmix|opal|mpi_init|open ?mpi|mpi_abort|forwarding signal' <<<"$output"
}

@test "no launcher: generate under ulimit -f 3000 runs without MPI and gives the unlimited run's output" {
    need_story
    jq -c '{id: (input_line_number | tostring), prompt}' "$FIX/ppo/story_prompts_train.jsonl" | head -8 > "$BATS_TEST_TMPDIR/p.jsonl"
    gen=("$TANDEM" generate --model "$STORIES" --input "$BATS_TEST_TMPDIR/p.jsonl" --max-new-tokens 24 --logprobs 2 --threads 1)
    "${gen[@]}" --output "$BATS_TEST_TMPDIR/ref.jsonl" 2>/dev/null
    limited "${gen[@]}" --output "$BATS_TEST_TMPDIR/out.jsonl"
    [ "$(wc -l < "$BATS_TEST_TMPDIR/out.jsonl")" -eq 8 ]
    cmp "$BATS_TEST_TMPDIR/ref.jsonl" "$BATS_TEST_TMPDIR/out.jsonl"
}

@test "no launcher: sft (2 steps, a checkpoint) under ulimit -f 3000 gives the unlimited run's losses, weights and optimizer state" {
    need_story
    bash "$FIX/sft/make_data.sh" "$ASSETS" > "$BATS_TEST_TMPDIR/d.jsonl"
    sft=("$TANDEM" sft --model "$STORIES" --data "$BATS_TEST_TMPDIR/d.jsonl" --seq-len 32 --batch-size 4 --max-steps 2 --threads 1)
    "${sft[@]}" --out "$BATS_TEST_TMPDIR/ref" 2>/dev/null
    limited "${sft[@]}" --out "$BATS_TEST_TMPDIR/out"
    loss() { jq -c 'select(.loss) | [.step, .loss, .grad_norm]' "$1/metrics.jsonl"; }
    [ "$(loss "$BATS_TEST_TMPDIR/out" | wc -l)" -eq 2 ]
    diff <(loss "$BATS_TEST_TMPDIR/ref") <(loss "$BATS_TEST_TMPDIR/out")
    for f in model-00001-of-00001.safetensors optimizer/exp_avg/model-00001-of-00001.safetensors \
        optimizer/exp_avg_sq/model-00001-of-00001.safetensors optimizer/optimizer.json; do
        cmp "$BATS_TEST_TMPDIR/ref/checkpoint-2/$f" "$BATS_TEST_TMPDIR/out/checkpoint-2/$f"
    done
}
