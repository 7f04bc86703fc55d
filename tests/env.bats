#!/usr/bin/env bats
# rlhf/env.c, the environment protocol (driver tests/test_env.c; the program
# tests/fixtures/env/echo_env.py answers a batch in reverse order): a program's replies matched to
# their episodes out of order, per-turn rewards, the exact request lines; each per-episode fault (a
# line that is not JSON, a reply naming another episode, bad fields, no reply within the timeout, a
# late reply dropped on the next call) ends that episode only; a program that exits is one error
# line naming it with its status. Over HTTP (a loopback server written here): the same, plus an
# HTTP 500, a body that is not JSON, a server too slow for the timeout, and no server at all.
load helpers

T="$ROOT/build/tests/test_env"
ECHO="python3 $FIX/env/echo_env.py"

# drive cmd|url CMD|URL TIMEOUT WORD...: $output is the replies or the error line; stderr apart
drive() {
    run --separate-stderr timeout 30 "$T" "$@"
    echo "$output"
    echo "stderr: $stderr"
}

# the replies and detail lines of $output (not the seconds line)
replies() { printf '%s\n' "$output" | grep -v '^seconds '; }
# the longest call's seconds, as an integer number of tenths
tenths() { printf '%s\n' "$output" | awk '/^seconds /{print int($2 * 10 + 0.5)}'; }

@test "env command: replies out of order go to their episodes; per-turn rewards; done at the last turn; the request lines" {
    ECHO_ENV_LOG=1 drive cmd "$ECHO 2" 5 reset:0,1,2 step:0,1,2 step:2,0
    [ "$status" -eq 0 ]
    diff <(replies) - <<'EOF'
reset 0 ok done=0 reward=0 text= [obs p0]
reset 1 ok done=0 reward=0 text= [obs p1]
reset 2 ok done=0 reward=0 text= [obs p2]
step 0 ok done=0 reward=0.25 text= [fb 0.1 a0.1|0,1]
step 1 ok done=0 reward=0.25 text= [fb 1.1 a1.1|1,1]
step 2 ok done=0 reward=0.25 text= [fb 2.1 a2.1|2,1]
step 2 ok done=1 reward=0.5 text= [fb 2.2 a2.2|2,2]
step 0 ok done=1 reward=0.5 text= [fb 0.2 a0.2|0,2]
dropped 0
EOF
    # what the program read: OpenRLHF's field names, the prompt line as a JSON value
    [[ "$stderr" == *'echo_env: {"type":"reset","episode":1,"prompt":{"prompt":"p1"}}'* ]]
    [[ "$stderr" == *'echo_env: {"type":"step","episode":2,"turn":2,"action":"a2.2","action_ids":[2,2]}'* ]]
}

@test "env command: a line that is not JSON, one naming another episode, bad fields: that episode only ends, reward 0" {
    # one unattributable line per call, replies in reverse order: each fault lands on its own episode
    drive cmd "$ECHO 3 nonjson:1 wrong:4 bad:6 huge:7" 5 reset:0,1,2 reset:3,4 step:0,2,3 reset:5,6,7 step:5,6,7
    [ "$status" -eq 0 ]
    diff <(replies) - <<'EOF'
reset 0 ok done=0 reward=0 text= [obs p0]
reset 1 bad_reply done=1 reward=0 text=
reset 2 ok done=0 reward=0 text= [obs p2]
detail: episode 1: bad_reply: oops, not JSON
reset 3 ok done=0 reward=0 text= [obs p3]
reset 4 wrong_episode done=1 reward=0 text=
detail: episode 4: wrong_episode: {"episode": 1004, "observation": " [obs p4]"}
step 0 ok done=0 reward=0.25 text= [fb 0.1 a0.1|0,1]
step 2 ok done=0 reward=0.25 text= [fb 2.1 a2.1|2,1]
step 3 ok done=0 reward=0.25 text= [fb 3.1 a3.1|3,1]
reset 5 ok done=0 reward=0 text= [obs p5]
reset 6 ok done=0 reward=0 text= [obs p6]
reset 7 ok done=0 reward=0 text= [obs p7]
step 5 ok done=0 reward=0.25 text= [fb 5.1 a5.1|5,1]
step 6 bad_reply done=1 reward=0 text=
step 7 bad_reply done=1 reward=0 text=
detail: episode 7: bad_reply: {"episode": 7, "turn": 1, "environment_feedback": " [fb 7.1 a7.1|7,1]", "reward": 1e+300, "done": false}
dropped 0
EOF
}

@test "env command: no reply within the timeout ends those episodes (the call takes the timeout, not more); the late reply is dropped on the next call" {
    drive cmd "$ECHO 3 late:1 silent:2" 1 reset:0,1,2,3 step:0,3
    [ "$status" -eq 0 ]
    diff <(replies) - <<'EOF'
reset 0 ok done=0 reward=0 text= [obs p0]
reset 1 timeout done=1 reward=0 text=
reset 2 timeout done=1 reward=0 text=
reset 3 ok done=0 reward=0 text= [obs p3]
detail: episode 1: timeout
step 0 ok done=0 reward=0.25 text= [fb 0.1 a0.1|0,1]
step 3 ok done=0 reward=0.25 text= [fb 3.1 a3.1|3,1]
dropped 1
EOF
    # 1 s of timeout, plus at most 0.5 s of this machine's load (a timing check, hence the margin)
    [ "$(tenths)" -ge 10 ] && [ "$(tenths)" -le 15 ]
}

@test "env command: a program that never answers: every episode times out, the run is not hung, and closing it is prompt" {
    local t0=$SECONDS
    drive cmd "$ECHO hang" 0.5 reset:0,1 step:0 step:1
    [ "$status" -eq 0 ]
    [ "$(replies | grep -c ' timeout done=1 reward=0 text=$')" -eq 4 ]
    [ $((SECONDS - t0)) -le 10 ]
}

@test "env command: a program that exits mid-call, or does not exist: one error line naming it, with its status" {
    drive cmd "$ECHO 3 exit:1" 5 reset:0,1 step:0,1
    [ "$status" -eq 1 ]
    [ "${lines[-1]}" = "environment command \`$ECHO 3 exit:1\`: exited with status 3 with 2 of 2 replies of a step call outstanding" ]
    drive cmd "no-such-env-program-41" 5 reset:0
    [ "$status" -eq 1 ]
    [ "${lines[-1]}" = "environment command \`no-such-env-program-41\`: exited with status 127 (command not found?) with 1 of 1 replies of a reset call outstanding" ]
    drive cmd "kill -9 \$\$" 5 reset:0
    [ "$status" -eq 1 ]
    [ "${lines[-1]}" = "environment command \`kill -9 \$\$\`: was killed by signal 9 (Killed) with 1 of 1 replies of a reset call outstanding" ]
}

# serve [MAX_TURNS] [KIND:EPISODE ...]: tests/fixtures/env/env_server.py on 127.0.0.1; sets URL
serve() {
    rm -f "$BATS_TEST_TMPDIR/port"
    python3 "$FIX/env/env_server.py" "$BATS_TEST_TMPDIR/port" "$@" 2>>"$BATS_TEST_TMPDIR/server.log" 3>&- &
    SERVERS="${SERVERS:-} $!"
    for _ in $(seq $(scaled 50)); do [ -s "$BATS_TEST_TMPDIR/port" ] && break; sleep 0.1; done
    URL="http://127.0.0.1:$(cat "$BATS_TEST_TMPDIR/port")"
}
teardown() { [ -z "${SERVERS:-}" ] || kill $SERVERS 2>/dev/null || true; }

@test "env server: POST URL/reset and URL/step, one request per episode, the same replies as the program" {
    serve 2
    drive url "$URL/" 5 reset:0,1,2 step:0,1,2 step:2,0
    [ "$status" -eq 0 ]
    local http; http=$(replies)
    drive cmd "$ECHO 2" 5 reset:0,1,2 step:0,1,2 step:2,0
    [ "$status" -eq 0 ]
    [ "$http" = "$(replies)" ]
    [[ "$http" == *"step 0 ok done=1 reward=0.5 text= [fb 0.2 a0.2|0,2]"* ]]
    # what the server got: each request on its own path, the same bodies as the program's lines
    grep -qxF 'env_server: /reset {"type":"reset","episode":1,"prompt":{"prompt":"p1"}}' "$BATS_TEST_TMPDIR/server.log"
    grep -qxF 'env_server: /step {"type":"step","episode":2,"turn":2,"action":"a2.2","action_ids":[2,2]}' "$BATS_TEST_TMPDIR/server.log"
    [ "$(grep -c '^env_server: ' "$BATS_TEST_TMPDIR/server.log")" -eq 8 ]
}

@test "env server: an HTTP 500, a body that is not JSON, another episode, bad fields, too slow: that episode only ends, reward 0; the call takes the timeout" {
    serve 2 500:1 nonjson:2 wrong:3 slow:4 bad:5
    drive url "$URL" 1 reset:0,1,2,3,4 step:0 reset:5 step:5
    [ "$status" -eq 0 ]
    diff <(replies) - <<'EOF'
reset 0 ok done=0 reward=0 text= [obs p0]
reset 1 bad_reply done=1 reward=0 text=
reset 2 bad_reply done=1 reward=0 text=
reset 3 wrong_episode done=1 reward=0 text=
reset 4 timeout done=1 reward=0 text=
detail: episode 1: bad_reply: HTTP 500: overloaded
step 0 ok done=0 reward=0.25 text= [fb 0.1 a0.1|0,1]
reset 5 ok done=0 reward=0 text= [obs p5]
step 5 bad_reply done=1 reward=0 text=
detail: episode 5: bad_reply: {"episode": 5, "turn": 1, "environment_feedback": " [fb 5.1 a5.1|5,1]", "reward": 0.25, "done": "yes"}
dropped 0
EOF
    # the slow one is given up at 1 s, not waited for (5 s); margin for this machine's load
    [ "$(tenths)" -ge 10 ] && [ "$(tenths)" -le 15 ]
}

@test "env server: no server at all is one error line naming the URL (credentials hidden); a URL that is not http(s) is refused" {
    local port
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    drive url "http://user:secret@127.0.0.1:$port/env" 5 reset:0,1
    [ "$status" -eq 1 ]
    [ "${lines[-1]}" = "environment server http://127.0.0.1:$port/env: Couldn't connect to server (all 2 reset requests)" ]
    drive url "ftp://127.0.0.1/env" 5 reset:0
    [ "$status" -eq 1 ]
    [ "${lines[-1]}" = "--env-url ftp://127.0.0.1/env: not an http(s) URL" ]
}
