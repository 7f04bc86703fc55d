# Shared by tests/*.bats: paths and small helpers.
bats_require_minimum_version 1.5.0   # `run ! cmd`: a negated bare command would not fail a test (set -e ignores it)
ROOT="$(cd "$(dirname "${BATS_TEST_FILENAME}")/.." && pwd)"
TANDEM="$ROOT/bin/tandem"
ASSETS="$ROOT/../shared/assets"
FIX="$ROOT/tests/fixtures"
# mpirun as CI needs it: root, 2 cores, more ranks than cores; -q keeps Open MPI's MPI_ABORT banner
# off, so an error under mpirun is the one "tandem: ..." line a user sees (README)
MPIRUN="mpirun -q --allow-run-as-root --oversubscribe -np"

# Hang guards. Every `timeout N` in the tests, and every wait loop of `seq $(scaled N)` polls, bounds
# something that could hang with N chosen on an idle 2-core machine; none is a timing assertion (the
# few that are say so and call `command timeout`). TANDEM_TEST_SLOW multiplies them all, here only;
# a slower machine sets it higher, no guard is raised on its own. Default 2: on 2 cores shared with
# 8 other busy sessions (load average 14 to 19) the slowest guarded command took 0.3 of its N, so 2
# leaves a machine twice as slow as that room, and a hang costs at most twice its N.
# TANDEM_TEST_GUARD_LOG=FILE appends each guarded command's seconds and its limit to FILE.
TANDEM_TEST_SLOW="${TANDEM_TEST_SLOW:-2}"
[[ "$TANDEM_TEST_SLOW" =~ ^[0-9]*\.?[0-9]+$ ]] && [[ ! "$TANDEM_TEST_SLOW" =~ ^[0.]*$ ]] ||
    { echo "TANDEM_TEST_SLOW=$TANDEM_TEST_SLOW: expected a factor > 0" >&2; exit 1; }
scaled() { awk -v n="$1" -v f="$TANDEM_TEST_SLOW" 'BEGIN { x = n * f; printf "%d\n", x == int(x) ? x : int(x) + 1 }'; }
# timeout(1) with its limit and -k's scaled: what the tests' `timeout [-k K] N CMD...` calls
timeout() {
    local kill=() limit t0=$SECONDS rc=0
    [ "$1" = -k ] && { kill=(-k "$(scaled "$2")"); shift 2; }
    limit=$(scaled "$1"); shift
    command timeout "${kill[@]}" "$limit" "$@" || rc=$?
    [ -z "${TANDEM_TEST_GUARD_LOG:-}" ] || echo "$((SECONDS - t0)) s of $limit: ${BATS_TEST_DESCRIPTION:-} ($1)" >> "$TANDEM_TEST_GUARD_LOG"
    return $rc
}

# run_ranks GUARD NP CMD...: bats' run of `timeout GUARD $MPIRUN NP CMD...` (GUARD: timeout's
# arguments, "120" or "-k 5 60"), but $output and $lines are the ranks' own outputs one after another
# (rank 0's stdout and stderr, then rank 1's, ...), which mpirun --output-filename keeps apart. What
# mpirun prints passes on each rank's output in the pieces it was written in, not in lines (a 4 KiB
# stdout buffer ends mid-line; an error line is several writes), so under load one rank's line can
# hold another rank's text: a test that reads what more than one rank prints reads it here.
run_ranks() {
    local d="$BATS_TEST_TMPDIR/ranks" k
    rm -rf "$d"
    run timeout $1 $MPIRUN "$2" --output-filename "$d" "${@:3}"
    output=$(for ((k = 0; k < $2; k++)); do awk 1 "$d"/*/rank.$k/stdout "$d"/*/rank.$k/stderr 2>/dev/null; done)
    IFS=$'\n' read -d '' -r -a lines <<<"$output" || true
}

# Python with torch + transformers for the reference checks: the project's .venv (`make pyenv`, which
# `make test` runs first). Missing, the check fails: it is a setup bug, not a reason to skip.
HFPY="$ROOT/.venv/bin/python"
need_hfpy() {
    [ -x "$HFPY" ] || { echo "$HFPY missing: run make pyenv (make test does)"; return 1; }
}

need_assets() {
    [ -d "$ASSETS/models" ] || skip "../shared/assets not present (real models and tokenizers live there)"
}

# stories260K and the story data the training and RLHF suites share
STORIES="$ASSETS/models/stories260K-hf"
PF="$FIX/pref"
TRAIN="$FIX/ppo/story_prompts_train.jsonl"
RULE="python3 -u $FIX/ppo/happy_reward.py"
need_story() {
    need_assets
    [ -e "$STORIES/config.json" ] || skip "$STORIES not present (../shared/assets)"
}

# generate's sampled tokens and logprobs (paged decode, two sequences per step) against eval's
# whole-sequence forward of the same tokens: equal bit for bit. DTYPE (default auto), KV (--kv-dtype,
# default fp32) and DOT (--cpu-bf16-dot, default exact) for both.
paged_vs_eval() { # MODEL [generate flags]
    local m="$1"
    printf '{"input_ids":[1,5,9,13,2,7]}\n{"input_ids":[1,9,13]}\n{"input_ids":[1,3]}\n' > "$BATS_TEST_TMPDIR/p.jsonl"
    "$TANDEM" generate --dtype "${DTYPE:-auto}" --kv-dtype "${KV:-fp32}" --cpu-bf16-dot "${DOT:-exact}" --model "$m" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/g.jsonl" \
        --max-new-tokens 24 --ignore-eos --logprobs 1 --temperature 0.9 --seed 5 --max-batch 2 "${@:2}" 2>/dev/null
    # reference records: the sampled token and its logprob at each generated position
    jq -c '{input_ids: (.prompt + .completion_ids),
            top_logprobs: (([range(0; (.prompt | length) - 1)] | map([])) + [.logprobs[] | [[.token, .logprob]]] + [[]])}' \
        "$BATS_TEST_TMPDIR/g.jsonl" > "$BATS_TEST_TMPDIR/ref.jsonl"
    run "$TANDEM" eval --dtype "${DTYPE:-auto}" --kv-dtype "${KV:-fp32}" --cpu-bf16-dot "${DOT:-exact}" --model "$m" --reference "$BATS_TEST_TMPDIR/ref.jsonl" --max-logprob-diff 0
    echo "$m: $output"
    [ "$status" -eq 0 ]
    echo "$output" | tail -1 | jq -e '.records == 3 and .max_abs_logprob_diff == 0'
    # the comparison is live: the same records with every logprob moved by 1e-6 fail it
    jq -c '.top_logprobs |= (to_entries | map(if .value != [] then .value[0][1] += 1e-6 else . end | .value))' \
        "$BATS_TEST_TMPDIR/ref.jsonl" > "$BATS_TEST_TMPDIR/bad.jsonl"
    run "$TANDEM" eval --dtype "${DTYPE:-auto}" --kv-dtype "${KV:-fp32}" --cpu-bf16-dot "${DOT:-exact}" --model "$m" --reference "$BATS_TEST_TMPDIR/bad.jsonl" --max-logprob-diff 0
    [ "$status" -eq 1 ]
    echo "$output" | tail -1 | jq -e '.pass == false and .max_abs_logprob_diff > 0'
}

# N prompts of several lengths and budgets (id p1.., "max_new_tokens" 10..22), EXTRA_JSON appended to each
make_prompts() { # OUT EXTRA_JSON [N]
    for i in $(seq 1 "${3:-40}"); do
        words=$(printf 'the cat sat on the mat %.0s' $(seq 1 $((i % 7 + 1))))
        echo "{\"id\": \"p$i\", \"prompt\": \"Once upon a time $words and\", \"max_new_tokens\": $((10 + i % 13))$2}"
    done > "$1"
}

# sft's synthetic task, reverse 4 digits (tok512 gives every digit its own token): DIR/rev_train.jsonl
# (2000 records), DIR/rev_val.jsonl (200)
make_rev_data() { # DIR
    local D="$1"
    awk 'BEGIN { srand(7); for (i = 0; i < 2200; i++) { s = ""; for (k = 0; k < 4; k++) s = s int(rand() * 10);
         r = ""; for (k = 4; k > 0; k--) r = r substr(s, k, 1);
         printf "{\"prompt\": \"%s=\", \"response\": \"%s\"}\n", s, r > (i < 2000 ? "'"$D"'/rev_train.jsonl" : "'"$D"'/rev_val.jsonl") } }'
}

# run_one_line TEXT CMD...: runs the command; it exits non-zero with exactly one line of output, containing TEXT
run_one_line() {
    local want="$1"; shift
    run "$@"
    echo "$output"
    [ "$status" -ne 0 ]
    [ "${#lines[@]}" -eq 1 ]
    [[ "$output" == *"$want"* ]]
}

# one_line_re REGEX: the command run last failed with exactly one line of output, matching REGEX (grep)
one_line_re() { echo "$output"; [ "$status" -ne 0 ]; [ "${#lines[@]}" -eq 1 ]; grep -q "$1" <<<"$output"; }

# the numbers of a run's metrics.jsonl FILE without its timings (what must be equal between runs)
numbers() { jq -c 'del(.tokens_per_s, .samples_per_s) | with_entries(select(.key | startswith("timing_s/") | not))' "$1"; }
# losses DIR: the training loss of each step of DIR/metrics.jsonl
losses() { jq -r 'select(.loss != null) | .loss' "$1/metrics.jsonl"; }
# within TOL A B: files of numbers, line by line |a - b| <= TOL * max(|a|, 1) (and as many lines);
# prints the worst ratio
within() {
    paste "$2" "$3" | awk -v tol="$1" '{ d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1; if (a < 1) a = 1
        r = d / a; if (r > worst) worst = r; if (r > tol || NF != 2) bad = 1; n++ }
        END { printf "%d values, worst relative difference %.2e (tolerance %g)\n", n, worst, tol; exit bad || n == 0 }'
}
