#!/usr/bin/env bats
# tandem verify: the math grader against its table and the anchors' graders (verl's math_dapo and
# gsm8k, transcribed in fixtures/verify/anchor_graders.py), the format rule, the code sandbox's
# containment (loops, fork bombs, memory, output, writes, network: each a 0 that leaves nothing
# behind), the pool's timeout, and the input errors.
load helpers

VF="$FIX/verify"
PY=/usr/bin/python3   # the anchors' transcription needs only the standard library

# verify KIND IN.jsonl [options]: runs tandem verify into $BATS_TEST_TMPDIR/out.jsonl
verify() {
    local kind=$1 in=$2
    shift 2
    run timeout 120 "$TANDEM" verify "$kind" --input "$in" --output "$BATS_TEST_TMPDIR/out.jsonl" "$@"
    echo "$output"
}

# reward_of ID: the reward of output line ID; reason_of ID: its reason
reward_of() { jq -r --argjson id "$1" 'select(.id == $id) | .reward' "$BATS_TEST_TMPDIR/out.jsonl"; }
reason_of() { jq -r --argjson id "$1" 'select(.id == $id) | .reason' "$BATS_TEST_TMPDIR/out.jsonl"; }

@test "verify math: the table (>= 100 cases) against expect and against the anchors' graders" {
    [ "$(grep -c . "$VF/math_cases.jsonl")" -ge 100 ]
    "$PY" "$VF/anchor_graders.py" inputs "$VF/math_cases.jsonl" > "$BATS_TEST_TMPDIR/in.jsonl"
    verify math "$BATS_TEST_TMPDIR/in.jsonl" --workers 2
    [ "$status" -eq 0 ]
    [[ "$output" == *"verify math: n $(grep -c . "$VF/math_cases.jsonl"), mean reward"*"timed out 0"* ]]
    run "$PY" "$VF/anchor_graders.py" check "$VF/math_cases.jsonl" "$BATS_TEST_TMPDIR/out.jsonl"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "${lines[-1]}" == *"cases: "*" pass; the anchor agrees on "* ]]
}

@test "verify math: the check fails when tandem disagrees with expect or with the anchor" {
    "$PY" "$VF/anchor_graders.py" inputs "$VF/math_cases.jsonl" > "$BATS_TEST_TMPDIR/in.jsonl"
    verify math "$BATS_TEST_TMPDIR/in.jsonl"
    [ "$status" -eq 0 ]
    # a flipped expect, and a deliberate difference unmarked: each is caught
    sed '1s/"expect": 1/"expect": 0/' "$VF/math_cases.jsonl" > "$BATS_TEST_TMPDIR/t1.jsonl"
    run "$PY" "$VF/anchor_graders.py" check "$BATS_TEST_TMPDIR/t1.jsonl" "$BATS_TEST_TMPDIR/out.jsonl"
    [ "$status" -eq 1 ]
    [[ "$output" == *"case 1 "*"tandem 1, expected 0"* ]]
    sed 's/, "differs": "the anchor keeps %"//' "$VF/math_cases.jsonl" > "$BATS_TEST_TMPDIR/t2.jsonl"
    run "$PY" "$VF/anchor_graders.py" check "$BATS_TEST_TMPDIR/t2.jsonl" "$BATS_TEST_TMPDIR/out.jsonl"
    [ "$status" -eq 1 ]
    [[ "$output" == *"tandem 1, anchor 0"* ]]
}

@test "verify math: ids are copied, reasons say why, huge inputs stay fast" {
    {
        echo '{"id": "a", "response": "so \\boxed{\\frac{3}{6}}", "answer": 0.5}'
        echo '{"response": "so \\boxed{7}", "answer": "8"}'
        echo '{"id": 3, "response": "nothing here", "answer": "8"}'
        "$PY" -c 'import json; print(json.dumps({"id": 4, "response": "\\boxed{" * 140000, "answer": "1"}))'
    } > "$BATS_TEST_TMPDIR/in.jsonl"
    verify math "$BATS_TEST_TMPDIR/in.jsonl" --timeout 5
    [ "$status" -eq 0 ]
    [ "$(sed -n 1p "$BATS_TEST_TMPDIR/out.jsonl")" = '{"id":"a","reward":1,"reason":"correct"}' ]
    [ "$(sed -n 2p "$BATS_TEST_TMPDIR/out.jsonl")" = '{"reward":0,"reason":"wrong answer: got \"7\", expected \"8\""}' ]
    [ "$(reason_of 3)" = 'no \boxed{} answer and no #### line' ]
    [ "$(reason_of 4)" = 'the last \boxed{ has unbalanced braces' ]
}

@test "verify format: a well-formed \\boxed{} or #### line at the end" {
    "$PY" - "$BATS_TEST_TMPDIR/in.jsonl" <<'EOF'
import json, sys
cases = [  # (response, expected reward) by the rule in rlhf/verify.h
    ("so the answer is \\boxed{5}", 1), ("so \\boxed{5}.\n\n", 1), ("$\\boxed{5}$", 1),
    ("\\[\\boxed{x+1}\\]", 1), ("\\boxed{5} and then more text", 0), ("#### 72", 1),
    ("work\n#### 1,234\n", 1), ("#### seventy", 0), ("\\boxed{5", 0), ("\\boxed{}", 0), ("", 0),
    ("\\boxed 5", 0), ("#### 5 apples", 0), ("\\boxed{\\frac{1}{2}}", 1),
]
with open(sys.argv[1], "w") as f:
    for i, (r, e) in enumerate(cases):
        f.write(json.dumps({"id": i, "response": r, "expect": e}) + "\n")
EOF
    verify format "$BATS_TEST_TMPDIR/in.jsonl"
    [ "$status" -eq 0 ]
    want=$(jq -c '[.id, .expect]' "$BATS_TEST_TMPDIR/in.jsonl")
    got=$(jq -c '[.id, .reward]' "$BATS_TEST_TMPDIR/out.jsonl")
    [ "$got" = "$want" ]
    [ "$(reason_of 8)" = 'the last \boxed{ has unbalanced braces' ]
    [ "$(reason_of 4)" = 'does not end with a \boxed{...} answer or a #### line' ]
}

@test "verify: bad input is one line naming file and line, and no output is written" {
    IN="$BATS_TEST_TMPDIR/in.jsonl" OUT="$BATS_TEST_TMPDIR/out.jsonl"
    printf '{"response": "\\\\boxed{1}", "answer": "1"}\nnot json\n' > "$IN"
    run "$TANDEM" verify math --input "$IN" --output "$OUT"
    [ "$status" -eq 1 ]
    [ "$output" = "tandem: $IN:2: not a JSON object (invalid JSON near column 1)" ]
    [ ! -e "$OUT" ]
    printf '{"response": "x"}\n{"response": "x", "answer": [1]}\n' > "$IN"
    run "$TANDEM" verify math --input "$IN" --output "$OUT"
    [ "$output" = "tandem: $IN:1: field \"answer\" missing" ]
    sed -i 1d "$IN"
    run "$TANDEM" verify math --input "$IN" --output "$OUT"
    [ "$output" = "tandem: $IN:1: field \"answer\" is not a string or a number" ]
    printf '{"response": "x", "answer": "1"}\n{"answer": "1"}\n' > "$IN"
    run "$TANDEM" verify math --input "$IN" --output "$OUT"
    [ "$output" = "tandem: $IN:2: field \"response\" missing" ]
    printf '{"response": "x", "tests": {"inputs": ["1"], "outputs": ["1"]}}\n{"response": "x", "tests": {"inputs": [], "outputs": []}}\n' > "$IN"
    run "$TANDEM" verify code --input "$IN" --output "$OUT"
    [ "$status" -eq 1 ]
    [ "$output" = "tandem: $IN:2: field \"tests\": empty test list" ]
    printf '{"response": "x", "tests": {"inputs": ["1", "2"], "outputs": ["1"]}}\n' > "$IN"
    run "$TANDEM" verify code --input "$IN" --output "$OUT"
    [ "$output" = "tandem: $IN:1: field \"tests\": 2 inputs but 1 outputs" ]
    [ ! -e "$OUT" ]
    run "$TANDEM" verify algebra --input "$IN" --output "$OUT"
    [ "$output" = "tandem: verify: unknown verifier 'algebra' (math | code | format)" ]
    run "$TANDEM" verify code --input "$IN" --output "$OUT" --workers 0
    [ "$output" = "tandem: --workers: must be 1..64, got 0" ]
    run "$TANDEM" verify code --input "$IN" --output "$OUT" --timeout 0
    [ "$output" = "tandem: --timeout: must be > 0 seconds, got 0" ]
    run "$TANDEM" verify code --input "$IN"
    [ "$output" = "tandem: verify: --output missing" ]
}
