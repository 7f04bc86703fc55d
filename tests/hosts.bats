#!/usr/bin/env bats
# Two hosts, for real (issue 29 item 4), and the communication deadline (--comm-timeout). The hosts
# are two network namespaces on this machine joined by a veth pair, at 192.0.2.1 and 192.0.2.2 (the
# documentation range), made and removed by each test (tests/hosts/up.sh, down.sh: needs root and
# iproute2, as CI has); the job is mpirun on host a with a hostfile naming both, the remote daemon
# started by a launcher agent that runs it inside host b's namespace under a hostname of its own
# (tests/hosts/agent.sh), MPI over TCP on the hosts' subnet (tests/hosts/mpirun.sh). What must hold:
# the same bytes as on one host (sft at tp 2, ppo with the actor on one host and the other roles on
# the other), and a link cut mid-run ends the job with one line within the deadline plus the
# launcher's part, no process left on either host, the last checkpoint resuming on one host.
load helpers

HOSTS="$ROOT/tests/hosts"

setup() {
    NS=t$$n$BATS_TEST_NUMBER   # unique per run and test; interface names stay under 16 bytes
}
teardown() {
    bash "$HOSTS/down.sh" "$NS"   # kills what is left in the namespaces, deletes them (also after a failure)
}
hosts_up() {
    bash "$HOSTS/up.sh" "$NS"
}
# $ON_HOSTS "$NS" N COMMAND...: mpirun over both hosts (tests/hosts/mpirun.sh), ranks 0..N/2-1 on host a
# (MPIRUN="$ON_HOSTS $NS" run_ranks ...: the same, each rank's output apart)
ON_HOSTS="bash $HOSTS/mpirun.sh"

losses() { jq -c '[.step, .loss, .grad_norm]' "$1/metrics.jsonl"; }
same_weights() { cmp <(cat "$1"/*.safetensors) <(cat "$2"/*.safetensors); }
# every process on both hosts has ended (what ip netns pids sees, less zombies: an ended process
# that the init process has yet to reap; tests/hosts/down.sh would kill the rest)
hosts_left() { for h in a b; do ip netns pids "$NS$h"; done | xargs -r ps -o stat=,pid= -p | awk '$1 !~ /^Z/'; }
hosts_empty() { [ -z "$(hosts_left)" ]; }
hosts_ps() { for h in a b; do echo "host $NS$h:"; ip netns pids "$NS$h" | xargs -r ps -o pid,stat,etimes,args -p | cut -c1-160; done; }

SFT=(--seq-len 32 --batch-size 8 --lr 1e-3 --threads 1)

@test "hosts: sft at tp 2 with a rank on each host equals one host bit for bit (losses, grad norms, weights); the deadline defaults to 60 s" {
    need_story
    make_rev_data "$BATS_TEST_TMPDIR"
    A=(sft --model "$STORIES" --data "$BATS_TEST_TMPDIR/rev_train.jsonl" "${SFT[@]}" --max-steps 12 --tp 2)
    run timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" --out "$BATS_TEST_TMPDIR/one"
    [ "$status" -eq 0 ]
    hosts_up
    MPIRUN="$ON_HOSTS $NS" run_ranks 60 2 hostname   # one rank on each host
    [ "$status" -eq 0 ]; [ "$(sort <<<"$output" | tr '\n' ' ')" = "${NS}a ${NS}b " ]
    run timeout 120 $ON_HOSTS "$NS" 2 "$TANDEM" "${A[@]}" --out "$BATS_TEST_TMPDIR/two"
    [ "$status" -eq 0 ]
    grep -q '^| --comm-timeout *| 60 *|$' <<<"$output"   # the default deadline (README)
    [ "$(losses "$BATS_TEST_TMPDIR/two" | wc -l)" -eq 12 ]
    diff <(losses "$BATS_TEST_TMPDIR/one") <(losses "$BATS_TEST_TMPDIR/two")
    same_weights "$BATS_TEST_TMPDIR/one/checkpoint-12" "$BATS_TEST_TMPDIR/two/checkpoint-12"
}

@test "hosts: ppo with the actor on host a and critic, reference and reward on host b equals the one-process run" {
    need_story
    "$TANDEM" rm --model "$STORIES" --data "$FIX/pref/story_train.jsonl" --out "$BATS_TEST_TMPDIR/rm" --seq-len 64 --batch-size 8 \
        --max-steps 2 --threads 1 2>/dev/null
    RMD="$BATS_TEST_TMPDIR/rm/checkpoint-2"
    A=(ppo --actor "$STORIES" --critic "$RMD" --reward "$RMD" --prompts "$TRAIN" --n-samples-per-prompt 2 --rollout-batch-size 4
       --max-new-tokens 16 --steps 3 --kl-coef 0.01 --actor-lr 3e-4 --critic-lr 1e-3 --threads 1)
    run timeout 120 "$TANDEM" "${A[@]}" --out "$BATS_TEST_TMPDIR/one"
    [ "$status" -eq 0 ]
    hosts_up
    MPIRUN="$ON_HOSTS $NS" run_ranks 120 2 "$TANDEM" "${A[@]}" --out "$BATS_TEST_TMPDIR/two" --actor-ranks 1 --critic-ranks 1 --colocate critic,ref,reward
    [ "$status" -eq 0 ]
    [[ "$output" == *"actor ranks 0-0 (group actor,"*"critic ranks 1-1 (group critic+ref+reward,"*"reward ranks 1-1 (group critic+ref+reward,"* ]]
    [ "$(jq -s length "$BATS_TEST_TMPDIR/two/metrics.jsonl")" -eq 3 ]
    diff <(numbers "$BATS_TEST_TMPDIR/one/metrics.jsonl") <(numbers "$BATS_TEST_TMPDIR/two/metrics.jsonl")
    for r in actor critic; do same_weights "$BATS_TEST_TMPDIR/one/checkpoint-3/$r" "$BATS_TEST_TMPDIR/two/checkpoint-3/$r"; done
}

@test "hosts: the link cut mid-run ends sft at tp 2 with one line within the deadline and the launcher's keepalive, nothing left on either host; the last checkpoint resumes on one host, bit for bit" {
    need_story
    make_rev_data "$BATS_TEST_TMPDIR"
    A=(sft --model "$STORIES" --data "$BATS_TEST_TMPDIR/rev_train.jsonl" "${SFT[@]}" --max-steps 40 --save-every 5 --tp 2)
    run timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" --out "$BATS_TEST_TMPDIR/one"   # the uninterrupted run, one host
    [ "$status" -eq 0 ]
    hosts_up
    out="$BATS_TEST_TMPDIR/cut"
    $ON_HOSTS "$NS" 2 "$TANDEM" "${A[@]}" --out "$out" --comm-timeout 5 > "$BATS_TEST_TMPDIR/log" 2>&1 &
    job=$!
    for _ in $(seq $(scaled 600)); do   # the cut comes in step 13 or so, past checkpoint-10
        [ "$(cat "$out/metrics.jsonl" 2>/dev/null | wc -l)" -ge 12 ] && break
        kill -0 $job 2>/dev/null || break
        sleep 0.1
    done
    ip -n "${NS}a" link set "${NS}a0" down
    cut=$(date +%s%N)
    for _ in $(seq $(scaled 300)); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
    status=0; wait $job || status=$?
    ended=$(( ($(date +%s%N) - cut) / 1000000 ))
    for _ in $(seq $(scaled 50)); do hosts_empty && break; sleep 0.1; done
    empty=$(( ($(date +%s%N) - cut) / 1000000 ))
    echo "job ended ${ended} ms after the cut (status $status), both hosts empty after ${empty} ms" >&3
    hosts_ps; grep -v '^step\|^|\|^+' "$BATS_TEST_TMPDIR/log"
    [ "$(cat "$out/metrics.jsonl" | wc -l)" -lt 40 ]   # it was cut mid-run
    [ "$status" -ne 0 ]
    # one line: rank 0's (host b's rank cannot reach mpirun any more); Open MPI's own transport
    # messages, if any, are not ours
    [ "$(grep -c '^tandem:' "$BATS_TEST_TMPDIR/log")" -eq 1 ]
    [[ "$(grep '^tandem:' "$BATS_TEST_TMPDIR/log")" =~ ^"tandem: rank 0 on host ${NS}a: no progress in MPI_"[A-Za-z]+" for 5 s (a peer or the network is gone; --comm-timeout sets the deadline); stopping"$ ]]
    # the daemons' keepalive (tests/hosts/mpirun.sh: 8 to 9 s after the cut) ends the job between
    # the line (5 s) and the ranks' own exit (5 + 10 s): measured 10.2 s; 20 s leaves room for a
    # loaded machine
    [ "$ended" -lt 20000 ]
    hosts_empty
    # the last complete checkpoint continues on one host (two ranks, shared memory) to the same end
    last="$out/checkpoint-$(ls "$out" | sed -n 's/^checkpoint-\([0-9]*\)$/\1/p' | sort -n | tail -1)"
    [ -e "$last/trainer_state.json" ]
    echo "resuming from $last" >&3
    run timeout 120 $MPIRUN 2 "$TANDEM" "${A[@]}" --out "$out" --resume "$last"
    [ "$status" -eq 0 ]
    diff <(losses "$BATS_TEST_TMPDIR/one") <(losses "$out")
    same_weights "$BATS_TEST_TMPDIR/one/checkpoint-40" "$out/checkpoint-40"
}

@test "hosts: the link cut where the daemons' keepalive cannot end the job: every process on both hosts (ranks, orted, mpirun) is gone by the ranks' own exit plus a few seconds" {
    need_story
    make_rev_data "$BATS_TEST_TMPDIR"
    hosts_up
    out="$BATS_TEST_TMPDIR/cut"
    # Issue 39 item 3. A daemon holding a message its peer never acknowledges (the remote rank's
    # line forwarded to mpirun at the deadline, a rank's end reported, mpirun's order to stop) is
    # not probed by TCP keepalive, and TCP's retransmissions give up after about 15 minutes: with
    # the README's recipe the remote orted was still alive 100 s after the cut. Here keepalive's
    # first probe comes after 60 s idle, so only the ranks can end the job, as where keepalive
    # never fires. The arithmetic, the same at the default deadline D = 60 and here at D = 5: the
    # line at D after the cut (or up to D / 8 later: the watchdog's look), the ranks' own exit
    # max(D / 2, 10) s later (1.5 D = 90 s there, D + 10 = 15 s here), when the exiting rank ends
    # its daemon (orted on host b, mpirun on host a: its parent, stuck on a connection whose data
    # goes unacknowledged: three retransmissions, 1.4 s at TCP's least timeout, and the watcher's
    # look every 0.2 s) and the host's other rank, its parent gone, follows within 0.25 s; so every
    # process on both hosts is gone a few seconds after the exit, whatever D: measured 16.8 and
    # 19.2 s after the cut here on a loaded machine; the bound 15 + 7 = 22 s (97 s at D = 60).
    # Before the fix mpirun and orted were still there 98 s after the cut. tp 2 x dp 2: two ranks
    # on each host, so each host has a rank that is not the first.
    HOSTS_KEEPALIVE="60 1 8" $ON_HOSTS "$NS" 4 "$TANDEM" sft --model "$STORIES" --data "$BATS_TEST_TMPDIR/rev_train.jsonl" \
        "${SFT[@]}" --max-steps 100000 --tp 2 --out "$out" --comm-timeout 5 > "$BATS_TEST_TMPDIR/log" 2>&1 &
    job=$!
    for _ in $(seq 600); do
        [ "$(cat "$out/metrics.jsonl" 2>/dev/null | wc -l)" -ge 3 ] && break
        kill -0 $job 2>/dev/null || break
        sleep 0.1
    done
    ip -n "${NS}a" link set "${NS}a0" down
    cut=$(date +%s%N)
    for _ in $(seq 400); do hosts_empty && break; sleep 0.1; done
    empty=$(( ($(date +%s%N) - cut) / 1000000 ))
    status=0; kill -0 $job 2>/dev/null || { wait $job || status=$?; }
    echo "both hosts empty ${empty} ms after the cut (job status $status)" >&3
    hosts_ps; grep -v '^step\|^|\|^+' "$BATS_TEST_TMPDIR/log"
    [ "$(cat "$out/metrics.jsonl" | wc -l)" -ge 3 ]
    [[ "$(grep '^tandem:' "$BATS_TEST_TMPDIR/log" | head -1)" =~ ^"tandem: rank "[01]" on host ${NS}a: no progress in MPI_"[A-Za-z]+" for 5 s (a peer or the network is gone; --comm-timeout sets the deadline); stopping"$ ]]
    hosts_empty
    [ "$empty" -lt 22000 ]
    [ "$status" -ne 0 ]
}

@test "deadline: a rank stopped (SIGSTOP) mid-run over a live link: the host's first rank says so in one line, every rank exits, status 1" {
    need_story
    make_rev_data "$BATS_TEST_TMPDIR"
    # tp 2 x dp 2 on one host: rank 3 stopped, ranks 0-2 wait for it; only local rank 0 speaks
    timeout 120 $MPIRUN 4 "$TANDEM" sft --model "$STORIES" --data "$BATS_TEST_TMPDIR/rev_train.jsonl" "${SFT[@]}" --max-steps 100000 \
        --tp 2 --out "$BATS_TEST_TMPDIR/o" --comm-timeout 5 > "$BATS_TEST_TMPDIR/log" 2>&1 &
    job=$!
    for _ in $(seq $(scaled 600)); do
        [ "$(cat "$BATS_TEST_TMPDIR/o/metrics.jsonl" 2>/dev/null | wc -l)" -ge 3 ] && break
        sleep 0.1
    done
    ranks=$(for p in $(pgrep -f "$BATS_TEST_TMPDIR/o --comm-timeout 5"); do
        r=$(tr '\0' '\n' < /proc/$p/environ | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
        [ -n "$r" ] && echo "$r $p"; done)
    echo "$ranks"
    [ "$(wc -l <<<"$ranks")" -eq 4 ]
    kill -STOP "$(awk '$1 == 3 { print $2 }' <<<"$ranks")"
    stop=$(date +%s%N)
    status=0; wait $job || status=$?
    ended=$(( ($(date +%s%N) - stop) / 1000000 ))
    echo "ended ${ended} ms after the stop" >&3
    grep -v '^step\|^|\|^+' "$BATS_TEST_TMPDIR/log"
    [ "$status" -eq 1 ]
    [ "$(grep -c '^tandem:' "$BATS_TEST_TMPDIR/log")" -eq 1 ]
    # Tandem's one line (Open MPI itself may print a transport line after it as the ranks go, e.g.
    # "[vm:PID] Read -1, expected N, errno = 3" from its shared-memory copy of a dead peer: not ours)
    [[ "$(grep '^tandem:' "$BATS_TEST_TMPDIR/log")" =~ ^"tandem: rank 0 on host $(hostname): no progress in MPI_"[A-Za-z]+" for 5 s (a peer or the network is gone; --comm-timeout sets the deadline); stopping"$ ]]
    # the line at 5 s, the exit 10 s later (the launcher's turn first: runtime/comm.c), then mpirun
    # ends the rest: measured 16.1 s; 30 s leaves room for a loaded machine
    [ "$ended" -ge 14000 ]   # (a rank may have begun waiting just before the stop)
    [ "$ended" -lt 30000 ]
    for _ in $(seq $(scaled 50)); do pgrep -f "$BATS_TEST_TMPDIR/o --comm-timeout 5" >/dev/null || break; sleep 0.1; done
    ! pgrep -f "$BATS_TEST_TMPDIR/o --comm-timeout 5"
}

@test "deadline: --comm-timeout's default is 60 s or TANDEM_COMM_TIMEOUT; bad values are one line naming the flag or the variable" {
    for c in generate eval sft rm dpo ppo bench; do
        "$TANDEM" $c --help | grep -q -- '--comm-timeout X .*(default 60)$'
    done
    TANDEM_COMM_TIMEOUT=7.5 "$TANDEM" sft --help | grep -q -- '--comm-timeout X .*(default 7.5)$'
    run_one_line 'tandem: --comm-timeout -1: expected seconds, 0 (no deadline) to 1e9' "$TANDEM" sft --model x --comm-timeout -1
    run_one_line 'tandem: TANDEM_COMM_TIMEOUT=soon: expected seconds, 0 (no deadline) to 1e9' env TANDEM_COMM_TIMEOUT=soon "$TANDEM" generate --model x
    run timeout 60 $MPIRUN 2 -x TANDEM_COMM_TIMEOUT=soon "$TANDEM" sft --model x   # once, not once per rank
    [ "$status" -eq 1 ]; [ "$output" = 'tandem: TANDEM_COMM_TIMEOUT=soon: expected seconds, 0 (no deadline) to 1e9' ]
}
