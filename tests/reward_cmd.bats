#!/usr/bin/env bats
# rlhf/reward_cmd.c, the jsonl reward subprocess (checker tests/test_reward_cmd.c): a python3
# verifier answering line by line, labels of every JSON type, 5000 x 200-byte responses past the
# pipe buffers both ways (line by line, batch first, all input first), one long-lived process across
# calls, no file descriptors of ours leaking into it; then every error as its exact one line naming the command: the program exits (status,
# signal, 127 for a missing command), closes its input or output, writes a reply that is not a JSON
# object with a finite number "reward" (quoted one line, cut to 200 bytes), a reward outside +-1e6,
# more replies than requests, an echoed "index" that is not its request's, or does not answer in
# time; and reward_cmd_stop kills a program that ignores its stdin, and all it started, after 5 s.
load helpers

T="$ROOT/build/tests/test_reward_cmd"

# score CMD N [TIMEOUT_S [BYTES]]: $output is the rewards or the error line; the program's stderr apart
score() {
    run --separate-stderr timeout 60 "$T" score "$@"
    echo "$output"
    echo "stderr: $stderr"
}

# score_error CMD N LINE: fails with exactly LINE
score_error() {
    score "$1" "$2"
    [ "$status" -eq 1 ]
    [ "$output" = "$3" ]
}

@test "reward command: a python3 verifier answering line by line gets every response as sent (JSON escapes, UTF-8)" {
    run timeout 60 "$T" python
    echo "$output"
    [ "$status" -eq 0 ]
    [ "${lines[-1]}" = "ok python: 7 rewards = len(response) in code points (JSON escapes, UTF-8)" ]
}

@test "reward command: labels of every JSON type arrive as the same value; no label field for a NULL label" {
    run timeout 60 "$T" labels
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "${lines[-1]}" == "ok labels: "* ]]
}

@test "reward command: 5000 x 200 bytes each way, line by line, a batch read before answering, all input read first" {
    run timeout 120 "$T" many
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$(grep -c '^ok many: 5000 x 200 bytes' <<<"$output")" -eq 3 ]
}

@test "reward command: one long-lived process across calls (a counter goes on)" {
    run timeout 60 "$T" counter
    echo "$output"
    [ "$status" -eq 0 ]
    [ "$output" = "ok counter: one process across calls (1 2 3, then 4 5; n = 0 in between)" ]
}

@test "reward command: replies in order, other fields ignored, its stderr passes through, a last line may lack its newline" {
    score 'i=0; while read l; do i=$((i + 1)); echo "debug $i" >&2; echo "{\"reward\": -$i.5, \"why\": [1, {}]}"; done' 3
    [ "$status" -eq 0 ]
    [ "$output" = $'-1.5\n-2.5\n-3.5' ]
    [ "$stderr" = $'debug 1\ndebug 2\ndebug 3' ]
    score "read l; printf '{\"reward\": 7}'" 1
    [ "$status" -eq 0 ]; [ "$output" = 7 ]
    score 'jq --unbuffered -c "{reward: 1e6}"' 2
    [ "$status" -eq 0 ]; [ "$output" = $'1000000\n1000000' ]
}

@test "reward command: a reward is within +-1e6 (REWARD_ABS_MAX): 3e38, -1e300, 1000001 are errors naming the reply and the value" {
    score 'jq --unbuffered -c "{reward: -1e6}"' 1
    [ "$status" -eq 0 ]; [ "$output" = -1000000 ]
    score_error 'while read l; do echo "{\"reward\": 3e38}"; done' 2 \
        'reward command `while read l; do echo "{\"reward\": 3e38}"; done`: reply 1: reward 3e+38 is outside [-1e+06, 1e+06]: {"reward": 3e38}'
    score_error 'jq --unbuffered -c "if .index == 1 then {reward: -1e300} else {reward: 1} end"' 3 \
        'reward command `jq --unbuffered -c "if .index == 1 then {reward: -1e300} else {reward: 1} end"`: reply 2: reward -1e+300 is outside [-1e+06, 1e+06]: {"reward":-1e+300}'
    score_error 'jq --unbuffered -c "{reward: 1000001}"' 1 \
        'reward command `jq --unbuffered -c "{reward: 1000001}"`: reply 1: reward 1000001 is outside [-1e+06, 1e+06]: {"reward":1000001}'
}

@test "reward command: one reply per request: a line after the batch's replies, or a reply before its request was written, is an error" {
    # two replies per request, each pair in one write: the surplus is there when the batch's last reply is
    score_error 'while read l; do printf "{\"reward\": 1}\n{\"reward\": 2}\n"; done' 3 \
        'reward command `while read l; do printf "{\"reward\": 1}\n{\"reward\": 2}\n"; done`: more replies than requests: a line after reply 3 of 3: {"reward": 2}'
    score_error 'read l; printf "{\"reward\": 1}\n{\"reward\": 2}\n"; cat >/dev/null' 1 \
        'reward command `read l; printf "{\"reward\": 1}\n{\"reward\": 2}\n"; cat >/dev/null`: more replies than requests: a line after reply 1 of 1: {"reward": 2}'
    # a reply before it read anything, while a 300 kB request (past the 64 KiB pipe) is still being written
    score 'echo "{\"reward\": 1}"; cat >/dev/null' 1 0 300000
    [ "$status" -eq 1 ]
    [ "$output" = 'reward command `echo "{\"reward\": 1}"; cat >/dev/null`: more replies than requests: reply 1 came before request 1 was written: {"reward": 1}' ]
}

@test "reward command: requests carry \"index\" 0..n-1; an echoed index must be its request's (wrong, out of order, not a number: errors)" {
    score 'jq --unbuffered -c "{reward: (.index * 10), index}"' 3
    [ "$status" -eq 0 ]; [ "$output" = $'0\n10\n20' ]
    local why='echoes an "index" other than its request'"'"'s 0 (replies out of order, or more replies than requests)'
    score_error 'jq --unbuffered -c "{reward: 1, index: (.index + 1)}"' 2 \
        "reward command \`jq --unbuffered -c \"{reward: 1, index: (.index + 1)}\"\`: reply 1 $why: {\"reward\":1,\"index\":1}"
    score_error 'while read a && read b; do echo "$b" | jq -c "{reward: 1, index}"; echo "$a" | jq -c "{reward: 2, index}"; done' 4 \
        "reward command \`while read a && read b; do echo \"\$b\" | jq -c \"{reward: 1, index}\"; echo \"\$a\" | jq -c \"{reward: 2, index}\"; done\`: reply 1 $why: {\"reward\":1,\"index\":1}"
    score_error 'jq --unbuffered -c "{reward: 1, index: (.index | tostring)}"' 1 \
        "reward command \`jq --unbuffered -c \"{reward: 1, index: (.index | tostring)}\"\`: reply 1 $why: {\"reward\":1,\"index\":\"0\"}"
}

@test "reward command: no open file of ours but stdin, stdout and stderr reaches the program" {
    # fd 7 open in the test driver; the program sees whether it has one
    run timeout 60 "$T" score 'read l; [ -e /proc/$$/fd/7 ] && r=1 || r=0; echo "{\"reward\": $r}"' 1 7>"$BATS_TEST_TMPDIR/seven"
    echo "$output"
    [ "$status" -eq 0 ]; [ "$output" = 0 ]
}

@test "reward command: the program exits: its status and how many replies came, every time" {
    score_error 'exit 3' 8 'reward command `exit 3`: exited with status 3 after 0 of 8 replies'
    score_error "read l; read l; echo '{\"reward\": 1}'; echo '{\"reward\": 2}'; exit 3" 8 \
        "reward command \`read l; read l; echo '{\"reward\": 1}'; echo '{\"reward\": 2}'; exit 3\`: exited with status 3 after 2 of 8 replies"
    score_error "read l; printf '{\"reward\": 7}'" 2 \
        "reward command \`read l; printf '{\"reward\": 7}'\`: exited with status 0 after 1 of 2 replies"
    score_error 'kill -9 $$' 3 'reward command `kill -9 $$`: was killed by signal 9 (Killed) after 0 of 3 replies'
    # written then gone: the line it wrote is the error, not the exit (it raced before)
    for i in $(seq 20); do
        score_error 'echo hello' 8 'reward command `echo hello`: reply 1 is not a JSON object with a finite number "reward": hello'
    done
}

@test "reward command: a command that does not exist: sh's status 127, and sh's own line on stderr" {
    score_error 'nosuch_reward_program_x' 3 \
        'reward command `nosuch_reward_program_x`: exited with status 127 (command not found?) after 0 of 3 replies'
    [[ "$stderr" == *"nosuch_reward_program_x: not found"* ]]
}

@test "reward command: replies that are not a JSON object with a finite number \"reward\", quoted on one line" {
    local pre='reply 1 is not a JSON object with a finite number "reward": '
    score_error 'while read l; do echo hello; done' 2 "reward command \`while read l; do echo hello; done\`: ${pre}hello"
    for reply in '{"score": 1}' '{"reward": "x"}' '{"reward": NaN}' '{"reward": Infinity}' '{"reward": 1e999}' \
                 '{"reward": -1e400}' '{"reward": null}' '{"reward": true}' '{"reward": [1]}' '[1]' '1' \
                 '{"reward": 1} x' '{"reward": 1}{"reward": 2}' '{"reward": 1' '' '{"Reward": 1}'; do
        score "while read l; do echo '$reply'; done" 2
        [ "$status" -eq 1 ]
        [ "$output" = "reward command \`while read l; do echo '$reply'; done\`: ${pre}$reply" ]
    done
    # the second reply is the bad one
    score_error 'while read l; do echo "{\"reward\": 1}"; read l; echo oops; done' 4 \
        'reward command `while read l; do echo "{\"reward\": 1}"; read l; echo oops; done`: reply 2 is not a JSON object with a finite number "reward": oops'
    # control bytes are escaped, long lines cut at 200 bytes (not inside a UTF-8 character) with "..."
    score_error "printf 'bad\r\n'" 1 "reward command \`printf 'bad\r\n'\`: ${pre}bad\\r"
    score_error "printf 'a\tb\033c\n'" 1 "reward command \`printf 'a\tb\033c\n'\`: ${pre}a\\tb\\x1bc"
    local z300
    z300=$(printf '%0300d' 0)
    score_error "printf '%0300d\n' 0" 1 "reward command \`printf '%0300d\n' 0\`: ${pre}${z300:0:200}..."
    score_error "printf '%0199d\303\251\n' 0" 1 "reward command \`printf '%0199d\303\251\n' 0\`: ${pre}${z300:0:199}..."
    # a line with no end: an error at 16 MiB, not memory without bound
    score_error "head -c 17000000 /dev/zero | tr '\\0' 0" 1 \
        "reward command \`head -c 17000000 /dev/zero | tr '\\0' 0\`: reply 1 has no newline in its first 16 MiB: ${z300:0:200}..."
}

@test "reward command: a command in messages is one line too (escaped newlines and tabs), cut at 200 bytes" {
    score_error $'exit 4\n# two\tlines' 2 'reward command `exit 4\n# two\tlines`: exited with status 4 after 0 of 2 replies'
    local c
    c="exit 5 # $(printf 'y%.0s' $(seq 300))"
    score_error "$c" 1 "reward command \`${c:0:200}...\`: exited with status 5 after 0 of 1 replies"
}

@test "reward command: a program that closes its input or its output while running" {
    # its input: only seen once our writes stop fitting in the pipe (1000 x 200 bytes)
    score 'exec <&-; sleep 2' 1000 0 200
    [ "$status" -eq 1 ]
    [ "$output" = 'reward command `exec <&-; sleep 2`: closed its input after 0 of 1000 replies' ]
    score_error 'exec >&-; while read l; do :; done' 3 \
        'reward command `exec >&-; while read l; do :; done`: closed its output after 0 of 3 replies'
}

@test "reward command: no answer within the timeout: the error after 1 s; stop then returns at once" {
    run timeout 60 "$T" timeout
    echo "$output"
    [ "$status" -eq 0 ]
    [ "${lines[0]}" = 'reward command `while read l; do :; done`: no reply within 1 s (0 of 8 replies)' ]
    [[ "${lines[-1]}" == "ok timeout: "* ]]
}

@test "reward command: stop kills a program that ignores its stdin after 5 s, with everything it started" {
    run timeout 20 "$T" stop "$BATS_TEST_TMPDIR"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == "ok stop: a program that ignores its stdin is killed after "* ]]
    local pids left=""
    pids=$(cat "$BATS_TEST_TMPDIR/pids")
    [ "$(wc -w <<<"$pids")" -eq 2 ]
    # neither runs (a zombie only waits for a reaper: PID 1 is not always one); SIGKILL lands async
    for _ in $(seq $(scaled 20)); do
        left=$(ps -o pid=,stat=,args= -p "${pids// /,}" | awk '$2 !~ /^Z/') || true
        [ -z "$left" ] && break
        sleep 0.1
    done
    echo "left: $left"
    [ -z "$left" ]
}

# gone FILE: no pid of FILE runs within 2 s (a zombie only waits for a reaper: PID 1 is not always one)
gone() {
    local pids left=""
    pids=$(cat "$1")
    [ -n "$pids" ]
    for _ in $(seq 20); do
        left=$(ps -o pid=,stat=,args= -p "$(tr ' ' , <<<"$pids")" | awk '$2 !~ /^Z/') || true
        [ -z "$left" ] && break
        sleep 0.1
    done
    echo "left: $left"
    if [ -n "$left" ]; then kill -9 $pids 2>/dev/null || true; return 1; fi
}

@test "reward command: the program and all it started end with us, on every way out (stop, exit, an error, SIGTERM/INT/HUP, SIGKILL, _exit)" {
    # stop: it exits at the end of its input, its second process must not stay behind
    run timeout 20 "$T" end stop "$BATS_TEST_TMPDIR"
    echo "$output"; [ "$status" -eq 0 ]
    gone "$BATS_TEST_TMPDIR/pids"
    run timeout 20 "$T" end exit "$BATS_TEST_TMPDIR"
    [ "$status" -eq 0 ]; gone "$BATS_TEST_TMPDIR/pids"
    run timeout 20 "$T" end error "$BATS_TEST_TMPDIR"
    [ "$status" -eq 1 ]; [ "${lines[-1]}" = "tandem: an error while the reward command runs" ]
    gone "$BATS_TEST_TMPDIR/pids"
    # a signal still ends the process as it did (status 128 + the signal)
    run timeout 20 "$T" end term "$BATS_TEST_TMPDIR"
    [ "$status" -eq 143 ]; gone "$BATS_TEST_TMPDIR/pids"
    run timeout 20 env --default-signal=INT "$T" end int "$BATS_TEST_TMPDIR"
    [ "$status" -eq 130 ]; gone "$BATS_TEST_TMPDIR/pids"
    run timeout 20 "$T" end hup "$BATS_TEST_TMPDIR"
    [ "$status" -eq 129 ]; gone "$BATS_TEST_TMPDIR/pids"
    # no code of ours runs: its keeper's PR_SET_PDEATHSIG
    run timeout 20 "$T" end kill "$BATS_TEST_TMPDIR"
    [ "$status" -eq 137 ]; gone "$BATS_TEST_TMPDIR/pids"
    run timeout 20 "$T" end _exit "$BATS_TEST_TMPDIR"
    [ "$status" -eq 1 ]; gone "$BATS_TEST_TMPDIR/pids"
}

@test "reward command: a program ppo started ends with the job: SIGTERM or SIGINT to mpirun, SIGTERM to one rank, kill -9 of the one process" {
    need_story
    local prog="exec 2>/dev/null; sleep 300 & echo \$\$ \$! > $BATS_TEST_TMPDIR/pids; while read l; do echo '{\"reward\": 1}'; done"
    local A=(--actor "$STORIES" --prompts "$FIX/ppo/story_prompts_train.jsonl" --advantage grpo --n-samples-per-prompt 2
             --rollout-batch-size 2 --steps 100000 --out "$BATS_TEST_TMPDIR/o")
    # start CMD...: runs the job in the background until its program runs; $launcher: CMD's process
    # (job control on: SIGINT is not ignored in a background job then)
    start() {
        rm -f "$BATS_TEST_TMPDIR/pids"
        set -m
        timeout 120 "$@" > "$BATS_TEST_TMPDIR/log" 2>&1 &
        job=$!
        set +m
        for _ in $(seq 600); do [ -s "$BATS_TEST_TMPDIR/pids" ] && break; sleep 0.1; done
        [ -s "$BATS_TEST_TMPDIR/pids" ]
        local t; t=$(pgrep -x -P "$job" timeout) || t=$job   # helpers.bash's timeout() is a shell function
        launcher=$(pgrep -P "$t")
    }
    # the job's rank pids, world rank 0 first
    ranks() {
        for p in $(pgrep -f "$BATS_TEST_TMPDIR/o"); do
            r=$(tr '\0' '\n' < /proc/$p/environ | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
            [ -n "$r" ] && echo "$r $p"
        done | sort -n | awk '{ print $2 }'
    }
    for sig in TERM INT; do
        start $MPIRUN 2 "$TANDEM" ppo "${A[@]}" --reward-cmd "$prog"
        kill -$sig "$launcher"
        wait $job || true
        gone "$BATS_TEST_TMPDIR/pids"
    done
    for rank in 0 1; do
        start $MPIRUN 2 "$TANDEM" ppo "${A[@]}" --reward-cmd "$prog"
        pids=($(ranks)); echo "ranks ${pids[*]}"
        [ "${#pids[@]}" -eq 2 ]
        kill -TERM "${pids[$rank]}"
        wait $job || true
        gone "$BATS_TEST_TMPDIR/pids"
    done
    # one process, SIGKILL
    start "$TANDEM" ppo "${A[@]}" --reward-cmd "$prog"
    kill -KILL "$launcher"
    wait $job || true
    gone "$BATS_TEST_TMPDIR/pids"
}

@test "reward command: a label that is not JSON is the caller's bug: a CHECK, not an error line" {
    run timeout 60 "$T" badlabel
    [ "$status" -ne 0 ]
    [[ "$output" == *"CHECK(l != NULL) failed"* ]]
}

@test "reward command: a program that exits 147 (128 + SIGSTOP's number) at the end of its input is an exit status: ppo ends, no stopped keeper" {
    need_story
    run timeout 60 "$TANDEM" ppo --actor "$STORIES" --prompts "$FIX/ppo/story_prompts_train.jsonl" --advantage grpo --n-samples-per-prompt 2 \
        --rollout-batch-size 2 --steps 2 --out "$BATS_TEST_TMPDIR/o" --reward-cmd 'while read l; do echo "{\"reward\": 1}"; done; exit 147'
    echo "$output"
    [ "$status" -eq 0 ]
    [ -e "$BATS_TEST_TMPDIR/o/checkpoint-2/ppo_state.json" ]
}
