#!/usr/bin/env bats
# tandem verify: the math grader against its table and the anchors' graders (verl's math_dapo and
# gsm8k, transcribed in fixtures/verify/anchor_graders.py), the format rule, the code sandbox's
# containment (loops, fork bombs, memory, output, writes, network: each a 0 that leaves nothing
# behind), the pool's timeout, and the input errors.
load helpers

VF="$FIX/verify"
PY=/usr/bin/python3   # the anchors' transcription needs only the standard library

setup() {
    MARK="$$-$BATS_TEST_NUMBER"
    export TMPDIR="$BATS_TEST_TMPDIR/tmp"
    mkdir -p "$TMPDIR"
    OUT="$BATS_TEST_TMPDIR/out.jsonl"
    D=
}

teardown() { [ -z "$D" ] || rm -rf "$D"; }

# verify KIND IN.jsonl [options]: runs tandem verify into $OUT
verify() {
    local kind=$1 in=$2
    shift 2
    run timeout 120 "$TANDEM" verify "$kind" --input "$in" --output "$OUT" "$@"
    echo "$output"
    cat "$OUT"
}

# reward_of ID: the reward of output line ID; reason_of ID: its reason
reward_of() { jq -r --argjson id "$1" 'select(.id == $id) | .reward' "$OUT"; }
reason_of() { jq -r --argjson id "$1" 'select(.id == $id) | .reason' "$OUT"; }

@test "verify math: the table (>= 100 cases) against expect and against the anchors' graders" {
    [ "$(grep -c . "$VF/math_cases.jsonl")" -ge 100 ]
    "$PY" "$VF/anchor_graders.py" inputs "$VF/math_cases.jsonl" > "$BATS_TEST_TMPDIR/in.jsonl"
    verify math "$BATS_TEST_TMPDIR/in.jsonl" --workers 2
    [ "$status" -eq 0 ]
    [[ "$output" == *"verify math: n $(grep -c . "$VF/math_cases.jsonl"), mean reward"*"timed out 0"* ]]
    run "$PY" "$VF/anchor_graders.py" check "$VF/math_cases.jsonl" "$OUT"
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
    run "$PY" "$VF/anchor_graders.py" check "$BATS_TEST_TMPDIR/t1.jsonl" "$OUT"
    [ "$status" -eq 1 ]
    [[ "$output" == *"case 1 "*"tandem 1, expected 0"* ]]
    sed 's/, "differs": "the anchor keeps %"//' "$VF/math_cases.jsonl" > "$BATS_TEST_TMPDIR/t2.jsonl"
    run "$PY" "$VF/anchor_graders.py" check "$BATS_TEST_TMPDIR/t2.jsonl" "$OUT"
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
    [ "$(sed -n 1p "$OUT")" = '{"id":"a","reward":1,"reason":"correct"}' ]
    [ "$(sed -n 2p "$OUT")" = '{"reward":0,"reason":"wrong answer: got \"7\", expected \"8\""}' ]
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
    got=$(jq -c '[.id, .reward]' "$OUT")
    [ "$got" = "$want" ]
    [ "$(reason_of 8)" = 'the last \boxed{ has unbalanced braces' ]
    [ "$(reason_of 4)" = 'does not end with a \boxed{...} answer or a #### line' ]
}

@test "verify: bad input is one line naming file and line, and no output is written" {
    IN="$BATS_TEST_TMPDIR/in.jsonl"
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

# code_cases OUT.jsonl ID PROGRAM INPUT OUTPUT [ID PROGRAM INPUT OUTPUT ...]: a code input file, one
# test case per sample (the program in a ```python block)
code_cases() {
    local out=$1
    shift
    "$PY" - "$out" "$@" <<'EOF'
import json, sys
out, rest = sys.argv[1], sys.argv[2:]
with open(out, "w") as f:
    for i in range(0, len(rest), 4):
        sid, prog, inp, want = rest[i:i + 4]
        f.write(json.dumps({"id": sid, "response": "Here:\n```python\n" + prog + "\n```\n",
                            "tests": {"inputs": [inp], "outputs": [want]}}) + "\n")
EOF
}

# no process of a sandbox uid (sandbox.h SANDBOX_UID_BASE) is left, and none of the program's
# marker files exists outside
nothing_left() {
    run bash -c "ps -eo uid=,pid=,args= | awk '\$1 >= 1000000000 && \$1 < 1268435456'"
    echo "left: $output"
    [ -z "$output" ]
    for d in /tmp /var/tmp /dev/shm "$ROOT" "$BATS_TEST_TMPDIR"; do [ ! -e "$d/tandem-escape-$MARK" ]; done
    [ -z "$(ls "$TMPDIR")" ]   # the sandboxes write nothing into TMPDIR either
}

@test "verify code: passing, wrong, crashing programs; the fenced-block rules" {
    code_cases "$BATS_TEST_TMPDIR/in.jsonl" \
        ok 'a, b = map(int, input().split())
print(a + b)' '2 3' '5' \
        wrong 'print(6)' '2 3' '5' \
        crash 'raise ValueError("no luck")' '' '5' \
        exit3 'import sys; print(5); sys.exit(3)' '' '5' \
        selfkill 'import os, signal; print(5, flush=True); os.kill(os.getpid(), signal.SIGTERM)' '' '5' \
        cwd 'open("f.txt", "w").write("7"); print(open("f.txt").read())' '' '7  '
    {   # the last block counts; other languages and unclosed blocks are a 0
        echo '{"id": "last", "response": "```python\nprint(1)\n```\nthen\n```py\nprint(2)\n```", "tests": {"inputs": [""], "outputs": ["2"]}}'
        echo '{"id": "bare", "response": "```\nprint(input()[::-1])\n```", "tests": {"inputs": ["abc", "xy\n"], "outputs": ["cba\n", "yx"]}}'
        echo '{"id": "twotests", "response": "```python\nprint(int(input()) * 2)\n```", "tests": {"inputs": ["2", "3"], "outputs": ["4", "7"]}}'
        echo '{"id": "c", "response": "```c\nint main() { return 0; }\n```", "tests": {"inputs": [""], "outputs": [""]}}'
        echo '{"id": "open", "response": "```python\nprint(1)\n", "tests": {"inputs": [""], "outputs": ["1"]}}'
        echo '{"id": "none", "response": "print(1)", "tests": {"inputs": [""], "outputs": ["1"]}}'
        "$PY" -c 'import json; print(json.dumps({"id": "huge", "response": "```python\n" + "#" * (2 << 20) + "\nprint(1)\n```", "tests": {"inputs": [""], "outputs": ["1"]}}))'
    } >> "$BATS_TEST_TMPDIR/in.jsonl"
    verify code "$BATS_TEST_TMPDIR/in.jsonl" --workers 2 --timeout 20
    [ "$status" -eq 0 ]
    [ "$(reward_of '"ok"')" = 1 ]
    [ "$(reason_of '"ok"')" = "passed 1 tests" ]
    [ "$(reason_of '"wrong"')" = 'test 1: wrong answer: got "6", expected "5"' ]
    [ "$(reason_of '"crash"')" = "test 1: runtime error (exit 1): ValueError: no luck" ]
    [ "$(reason_of '"exit3"')" = "test 1: runtime error (exit 3): " ]
    # the program is not the namespace's pid 1, so a signal it sends itself kills it as anywhere
    [ "$(reason_of '"selfkill"')" = "test 1: killed by signal 15 (Terminated)" ]
    [ "$(reward_of '"cwd"')" = 1 ]
    [ "$(reward_of '"last"')" = 1 ]
    [ "$(reward_of '"bare"')" = 1 ]
    [ "$(reason_of '"twotests"')" = 'test 2: wrong answer: got "6", expected "7"' ]
    [ "$(reason_of '"c"')" = "the last code block is c, not python" ]
    [ "$(reason_of '"open"')" = "the last fenced code block is not closed" ]
    [ "$(reason_of '"none"')" = "no fenced code block" ]
    [ "$(reason_of '"huge"')" = "the program is longer than 1048576 bytes" ]
    [ "$(jq -s 'map(.reward) | add' "$OUT")" = 4 ]
    nothing_left
}

@test "verify code: loops, fork bombs, memory, output, file size: each a 0 with a reason, nothing left" {
    code_cases "$BATS_TEST_TMPDIR/in.jsonl" \
        loop 'while True: pass' '' '1' \
        bomb 'import os
while True: os.fork()' '' '1' \
        bomb_quiet 'import os, time
while True:
    try: os.fork()
    except OSError: time.sleep(0.01)' '' '1' \
        mem 'x = bytearray(8 << 30); print(1)' '' '1' \
        output 'while True: print("x" * 10000)' '' '1' \
        closed 'import os
os.close(1); os.close(2)
while True: pass' '' '1' \
        bigfile 'open("big", "wb").write(b"x" * (40 << 20)); print(1)' '' '1' \
        daemon 'import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0: time.sleep(1000)
    os._exit(0)
print(1)' '' '1'
    verify code "$BATS_TEST_TMPDIR/in.jsonl" --workers 4 --timeout 4
    [ "$status" -eq 0 ]
    [[ "$(reason_of '"loop"')" == "test 1: timeout (over 4 s of "*")" ]]
    [ "$(jq -r 'select(.id == "loop") | .timed_out' "$OUT")" = true ]
    # fork fails (EAGAIN) at the process limit; the last stderr line is one of the tracebacks the
    # processes print at once, so only its start is fixed
    [[ "$(reason_of '"bomb"')" == "test 1: runtime error (exit 1): "* ]]
    [[ "$(reason_of '"bomb_quiet"')" == "test 1: timeout (over 4 s of "*")" ]]
    [ "$(reason_of '"mem"')" = "test 1: runtime error (exit 1): MemoryError" ]
    [ "$(reason_of '"output"')" = "test 1: output limit (over 1048576 bytes)" ]
    [[ "$(reason_of '"closed"')" == "test 1: timeout (over 4 s of "*")" ]]   # no pipe left to watch
    [ "$(reason_of '"bigfile"')" = "test 1: runtime error (exit 1): OSError: [Errno 27] File too large" ]
    # the daemon's grandchild (setsid, still sleeping when the program ends) dies with the namespace
    [ "$(reward_of '"daemon"')" = 1 ]
    [ "$(jq -s 'map(select(.reward == 0)) | length' "$OUT")" = 7 ]
    [[ "$output" == *"timed out 3"* ]]
    nothing_left
}

@test "verify code: writes outside its directory fail, and nothing is written" {
    code_cases "$BATS_TEST_TMPDIR/in.jsonl" \
        write "open('/tmp/tandem-escape-$MARK', 'w').write('x')" '' '' \
        probe "import os
for d in ['/tmp', '/var/tmp', '/dev/shm', '$ROOT', '$BATS_TEST_TMPDIR', '/root', '/']:
    try:
        open(os.path.join(d, 'tandem-escape-$MARK'), 'w').write('x')
        print('wrote', d)
    except OSError as e:
        print('denied')   # EROFS, or EACCES where the uid may not enter (/root)
print(sorted(os.listdir('/tmp')), len([p for p in os.listdir('/proc') if p.isdigit()]))" '' \
        "$(printf 'denied\n%.0s' 1 2 3 4 5 6 7)
['sandbox'] 2"
    verify code "$BATS_TEST_TMPDIR/in.jsonl" --timeout 20
    [ "$status" -eq 0 ]
    [ "$(reason_of '"write"')" = "test 1: runtime error (exit 1): OSError: [Errno 30] Read-only file system: '/tmp/tandem-escape-$MARK'" ]
    # every write outside fails; /tmp is empty but for the working directory; the program sees
    # two processes: the namespace's init and itself
    [ "$(reward_of '"probe"')" = 1 ]
    nothing_left
}

@test "verify code: no network, not even the host's loopback" {
    PORT_FILE="$BATS_TEST_TMPDIR/port"
    "$PY" -c "
import socket, sys
s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(8)
open(sys.argv[1] + '.tmp', 'w').write(str(s.getsockname()[1]))
import os; os.rename(sys.argv[1] + '.tmp', sys.argv[1])
s.settimeout(60)
while True:
    c, _ = s.accept(); c.sendall(b'hello'); c.close()
" "$PORT_FILE" 3>&- &
    server=$!
    for i in $(seq 50); do [ -e "$PORT_FILE" ] && break; sleep 0.1; done
    port=$(cat "$PORT_FILE")
    prog="import socket
s = socket.create_connection(('127.0.0.1', $port), timeout=2)
print(s.recv(5).decode())"
    # the control: outside the sandbox the same program reaches the server
    [ "$(echo "$prog" | "$PY")" = hello ]
    code_cases "$BATS_TEST_TMPDIR/in.jsonl" net "$prog" '' 'hello' \
        dns "import socket; print(socket.gethostbyname('example.com'))" '' '93.184.215.14'
    verify code "$BATS_TEST_TMPDIR/in.jsonl" --timeout 20
    kill "$server"
    [ "$status" -eq 0 ]
    [ "$(reason_of '"net"')" = "test 1: runtime error (exit 1): OSError: [Errno 101] Network is unreachable" ]
    [ "$(reward_of '"dns"')" = 0 ]
    [[ "$(reason_of '"dns"')" == "test 1: runtime error (exit 1): socket.gaierror: "* ]]
    nothing_left
}

@test "verify code: the pool runs samples at once; the timeout is per sample over all its tests" {
    prog='import time; time.sleep(1.5); print(1)'
    code_cases "$BATS_TEST_TMPDIR/in.jsonl" a "$prog" '' 1 b "$prog" '' 1 c "$prog" '' 1 d "$prog" '' 1
    verify code "$BATS_TEST_TMPDIR/in.jsonl" --workers 4 --timeout 20
    [ "$status" -eq 0 ]
    [ "$(jq -s 'map(.reward) | add' "$OUT")" = 4 ]
    # one worker would take 4 x 1.5 = 6 s of sleep alone; 4 workers overlap them (a timing
    # assertion with 1.5 s of room for four python3 start-ups under load)
    secs=$(echo "$output" | sed -n 's/.*timed out 0, \([0-9.]*\) s (4 workers)/\1/p')
    awk -v s="$secs" 'BEGIN { exit !(s < 4.5) }'
    # three tests of 1.5 s each do not fit a 3.5 s budget: the third is cut at the sample's deadline
    echo '{"id": "three", "response": "```python\nimport time; time.sleep(1.5); print(1)\n```", "tests": {"inputs": ["", "", ""], "outputs": ["1", "1", "1"]}}' > "$BATS_TEST_TMPDIR/in.jsonl"
    verify code "$BATS_TEST_TMPDIR/in.jsonl" --timeout 3.5
    [ "$status" -eq 0 ]
    [ "$(reason_of '"three"')" = "test 3: timeout (over 3.5 s of wall clock)" ]
    [[ "$output" == *"n 1, mean reward 0.0000, timed out 1,"* ]]
    nothing_left
}

@test "verify code: as a user without root (setpriv to nobody), through a user namespace" {
    command -v setpriv || skip "setpriv (util-linux) missing"
    [ "$(id -u)" = 0 ] || skip "needs root to become nobody"
    D=$(mktemp -d /tmp/tandem-verify-nobody.XXXXXX)   # a path nobody can reach (teardown removes it)
    chmod 777 "$D"
    code_cases "$D/in.jsonl" ok 'print(int(input()) + 1)' '41' '42' \
        bomb 'import os
while True: os.fork()' '' '1' \
        write "open('/tmp/tandem-escape-$MARK', 'w')" '' '' \
        umount "import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print(libc.umount2(b'/tmp', 2), libc.mount(b'none', b'/', None, ctypes.c_ulong(0x5020), None))   # the uid 0 of a user namespace could
open('/tmp/tandem-escape2-$MARK', 'w')" '' ''
    chmod 644 "$D/in.jsonl"
    run timeout 60 setpriv --reuid 65534 --regid 65534 --clear-groups env TMPDIR="$D" \
        "$TANDEM" verify code --input "$D/in.jsonl" --output "$D/out.jsonl" --timeout 10
    echo "$output"
    [ "$status" -eq 0 ]
    OUT="$D/out.jsonl"
    [ "$(reward_of '"ok"')" = 1 ]
    # fork fails (EAGAIN) at the process limit; the last stderr line is one of the tracebacks the
    # processes print at once, so only its start is fixed
    [[ "$(reason_of '"bomb"')" == "test 1: runtime error (exit 1): "* ]]
    [[ "$(reason_of '"write"')" == *"Read-only file system"* ]]
    # with every capability gone, the tmpfs over /tmp cannot be unmounted nor / remounted writable
    # (the host's /tmp would be reached), so the write fails
    [ ! -e "/tmp/tandem-escape2-$MARK" ] || { rm -f "/tmp/tandem-escape2-$MARK"; false; }
    [[ "$(reason_of '"umount"')" == *"Read-only file system"* ]]
    nothing_left
}

@test "verify code: tandem killed mid-run takes its sandboxes with it" {
    code_cases "$BATS_TEST_TMPDIR/in.jsonl" a 'while True: pass' '' 1 b 'import os, time
os.fork(); time.sleep(100)' '' 1
    "$TANDEM" verify code --input "$BATS_TEST_TMPDIR/in.jsonl" --output "$OUT" --workers 2 --timeout 60 3>&- &
    pid=$!
    for i in $(seq $(scaled 100)); do   # until both sandboxes run (3 processes of sandbox uids)
        [ "$(ps -eo uid= | awk '$1 >= 1000000000 && $1 < 1268435456' | wc -l)" -ge 3 ] && break
        sleep 0.1
    done
    [ "$(ps -eo uid= | awk '$1 >= 1000000000 && $1 < 1268435456' | wc -l)" -ge 3 ]
    kill -9 "$pid"
    wait "$pid" || true
    # the parent-death signal kills each sandbox's pid 1, and with it its namespace
    for i in $(seq $(scaled 50)); do
        [ -z "$(ps -eo uid= | awk '$1 >= 1000000000 && $1 < 1268435456')" ] && break
        sleep 0.1
    done
    [ ! -e "$OUT" ]
    nothing_left
}

@test "verify: the C API as tandem ppo calls it (build/tests/test_verify)" {
    run timeout 60 "$ROOT/build/tests/test_verify"
    echo "$output"
    [ "$status" -eq 0 ]
    [ "${lines[-1]}" = ok ]
    ! grep -q FAIL <<<"$output"
    nothing_left
}

# ---- ppo --reward-fn: the verifiers as the reward ----------------------------------------------------

@test "ppo --reward-fn: a prompt line without its reference is refused naming file:line; a bad name, two reward sources, bad workers / timeout, one line each" {
    STORIES="$ROOT/../shared/assets/models/stories260K-hf"
    [ -e "$STORIES/config.json" ] || skip "../shared/assets/models/stories260K-hf is absent"
    printf '{"prompt": "Once upon", "answer": "5"}\n{"prompt": "A cat"}\n' > "$BATS_TEST_TMPDIR/p.jsonl"
    A=(ppo --actor "$STORIES" --prompts "$BATS_TEST_TMPDIR/p.jsonl" --out "$BATS_TEST_TMPDIR/o" --advantage grpo
       --n-samples-per-prompt 2 --rollout-batch-size 2 --max-new-tokens 4 --steps 1)
    run timeout 60 "$TANDEM" "${A[@]}" --reward-fn math
    [ "$status" -ne 0 ]
    [[ "$output" == *"p.jsonl:2: --reward-fn math: "*"answer"* ]]
    [ "$(grep -c 'tandem:' <<< "$output")" -eq 1 ]
    printf '{"prompt": "Once upon", "tests": {"inputs": [], "outputs": []}}\n{"prompt": "A cat", "tests": {"inputs": ["1"], "outputs": ["1"]}}\n' > "$BATS_TEST_TMPDIR/c.jsonl"
    run timeout 60 "$TANDEM" "${A[@]/p.jsonl/c.jsonl}" --reward-fn code
    [ "$status" -ne 0 ]
    [[ "$output" == *"c.jsonl:1: --reward-fn code: "* ]]
    run timeout 60 "$TANDEM" "${A[@]}" --reward-fn maths
    [ "$status" -ne 0 ] && [[ "$output" == *"--reward-fn"*"maths"* ]]
    run timeout 60 "$TANDEM" "${A[@]}" --reward-fn math --reward-cmd true
    [ "$status" -ne 0 ] && [[ "$output" == *"exactly one of"* ]]
    run timeout 60 "$TANDEM" "${A[@]}" --reward-fn format --reward-workers 0
    [ "$status" -ne 0 ] && [[ "$output" == *"--reward-workers 0"* ]]
    run timeout 60 "$TANDEM" "${A[@]}" --reward-fn format --reward-fn-timeout 0
    [ "$status" -ne 0 ] && [[ "$output" == *"--reward-fn-timeout 0"* ]]
    run timeout 60 "$TANDEM" "${A[@]}" --reward-fn format --reward-workers 65
    [ "$status" -ne 0 ] && [[ "$output" == *"--reward-workers 65: must be in [1, 64]"* ]]
    run timeout 60 "$TANDEM" "${A[@]}" --reward-cmd true --reward-workers 2
    [ "$status" -ne 0 ] && [[ "$output" == *"--reward-workers and --reward-fn-timeout: only with --reward-fn"* ]]
}

@test "ppo --reward-fn math: the rewards are the verifier's (a response scored as tandem verify scores it), timeouts in the metrics" {
    STORIES="$ROOT/../shared/assets/models/stories260K-hf"
    [ -e "$STORIES/config.json" ] || skip "../shared/assets/models/stories260K-hf is absent"
    # the story model writes no \boxed{} and no "#### N": every sample is 0, and tandem verify says why
    printf '{"prompt": "Once upon a time", "answer": "5"}\n{"prompt": "The cat", "answer": "\\\\frac{1}{2}"}\n' > "$BATS_TEST_TMPDIR/p.jsonl"
    run timeout 120 "$TANDEM" ppo --actor "$STORIES" --prompts "$BATS_TEST_TMPDIR/p.jsonl" --out "$BATS_TEST_TMPDIR/o" \
        --advantage grpo --n-samples-per-prompt 2 --rollout-batch-size 2 --max-new-tokens 8 --steps 2 --reward-fn math
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$(jq -s 'map(.["reward/timeouts"]) | add' "$BATS_TEST_TMPDIR/o/metrics.jsonl")" = 0 ]
    [ "$(jq -s 'map(.["critic/score/mean"]) | add' "$BATS_TEST_TMPDIR/o/metrics.jsonl")" = 0 ]
}

@test "ppo --reward-fn math: --resume is bit for bit (4 steps straight == 2, stop, 2 more), with an entropy bonus so the weights move" {
    STORIES="$ROOT/../shared/assets/models/stories260K-hf"
    [ -e "$STORIES/config.json" ] || skip "../shared/assets/models/stories260K-hf is absent"
    printf '{"prompt": "Once upon a time", "answer": "5"}\n{"prompt": "The cat", "answer": "7"}\n' > "$BATS_TEST_TMPDIR/p.jsonl"
    A=(--actor "$STORIES" --prompts "$BATS_TEST_TMPDIR/p.jsonl" --advantage grpo --n-samples-per-prompt 2 --rollout-batch-size 2
       --max-new-tokens 8 --steps 4 --reward-fn math --entropy-coef 0.1 --actor-lr 1e-3)
    run timeout 120 "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/straight"
    [ "$status" -eq 0 ]
    run timeout 120 "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/split" --save-every 2 --stop-after 2
    [ "$status" -eq 0 ]
    run timeout 120 "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/split" --resume "$BATS_TEST_TMPDIR/split/checkpoint-2"
    [ "$status" -eq 0 ]
    diff <(numbers "$BATS_TEST_TMPDIR/straight/metrics.jsonl") <(numbers "$BATS_TEST_TMPDIR/split/metrics.jsonl")
    cmp <(cat "$BATS_TEST_TMPDIR"/straight/checkpoint-4/actor/*.safetensors) <(cat "$BATS_TEST_TMPDIR"/split/checkpoint-4/actor/*.safetensors)
    # the weights moved (the entropy bonus), so the comparison could fail
    ! cmp -s <(cat "$STORIES"/*.safetensors) <(cat "$BATS_TEST_TMPDIR"/straight/checkpoint-4/actor/*.safetensors)
}
