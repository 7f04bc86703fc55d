#!/usr/bin/env bats
# tandem ppo --env-cmd: multi-turn episodes (rlhf/episode.h) on stories260K against
# tests/fixtures/env/mt_env.py (observation, feedback and per-turn rewards of its own, faults on
# demand, a log of what it answered). Every episode is rebuilt from that log by
# tests/fixtures/env/mt_check.py (the ids the model was sent back as action_ids, the feedback text
# tokenised alone, the end rules) and compared with --dump-rollouts; the first update's gradient
# against transformers over the model's tokens only; rollout logprobs == training logprobs at
# every layout and in bf16; the environment's faults; the bounds; the refusals.
load helpers

ENV="python3 -u $FIX/env/mt_env.py"
CHECK="$FIX/env/mt_check.py"

# A: 2 prompts x 4 samples (S 8), turns end at "." or 12 tokens, 2 steps, max turns 3, so the
# default --max-episode-tokens is 2 x 3 x 12 = 72
base() {
    A=(ppo --actor "$STORIES" --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 4 --rollout-batch-size 2
        --max-new-tokens 12 --stop . --steps 2 --actor-lr 1e-3 --threads 1 --overwrite)
}
# check DUMP LOG [MAX_TURNS MAX_EP_TOKENS] [flags]: mt_check's JSON into $ref; no difference allowed
check() {
    run timeout 120 "$HFPY" "$CHECK" "$TANDEM" "$STORIES" "$1" "$2" 8 "${3:-3}" "${4:-72}" "${@:5}"
    echo "$output"
    [ "$status" -eq 0 ]
    ref="$output"
    jq -e '.errors == [] and .episodes == 16' <<<"$ref"
}
# zero_diff METRICS: rollout_logprob_diff_max is 0 at every step, and episodes had several turns
zero_diff() {
    [ "$(jq -s -c 'map(.rollout_logprob_diff_max) | unique' "$1")" = "[0]" ]
    [ "$(jq -s length "$1")" -eq 2 ]
    jq -s -e 'map(.["env/turns_mean"] > 1) | all' "$1"
}

@test "episodes at tp 1: rebuilt from the environment's log (ids, loss mask, feedback tokenised alone, per-turn rewards); the first update's gradient over the model's tokens only (torch)" {
    need_story
    need_hfpy
    base
    o="$BATS_TEST_TMPDIR/o"
    run timeout 120 "$TANDEM" "${A[@]}" --env-cmd "$ENV ok $BATS_TEST_TMPDIR/log.jsonl" --clip 0 --out "$o" --dump-rollouts "$o.jsonl"
    [ "$status" -eq 0 ]
    zero_diff "$o/metrics.jsonl"
    check "$o.jsonl" "$BATS_TEST_TMPDIR/log.jsonl" 3 72 --grad 4
    # both ends happened (done at turn 2 and 3 = --max-turns), with environment tokens between turns
    jq -e '(.turns | unique) == [2, 3] and .env_tokens > 16' <<<"$ref"
    # the metrics: turns and faults of the batch
    for s in 1 2; do
        want=$(jq -s --argjson s $s 'map(select(.step == $s)) | (map(.turns) | add / 8)' "$o.jsonl")
        [ "$(jq --argjson s $s 'select(.step == $s) | .["env/turns_mean"] == '"$want"' and .["env/faults"] == 0' "$o/metrics.jsonl")" = true ]
    done
    gn=$(jq -s '.[0]["actor/grad_norm"]' "$o/metrics.jsonl")
    echo "grad norm: tandem $gn, torch $(jq .grad_norm <<<"$ref") (model tokens), $(jq .grad_norm_all <<<"$ref") (every token)" >&3
    # advantages: GRPO of the log's reward sums, the same double operations (1e-12); fp32 forwards
    # and backwards summed in other orders: logprobs within 1e-4 (a few ulps of |lp| < 20), the norm
    # of ~260K fp32 gradients within 1e-4 relative; the environment's tokens in the loss are far outside
    jq -e '.adv_max_err < 1e-12 and .lp_max_err < 1e-4' <<<"$ref"
    jq -e --argjson g "$gn" '(($g - .grad_norm) | fabs) < 1e-4 * .grad_norm and (($g - .grad_norm_all) | fabs) > 1e-2 * .grad_norm' <<<"$ref"
}

@test "episodes with gae and a critic: the advantages are 0 at the environment's tokens, non-zero at the model's" {
    need_story
    base
    o="$BATS_TEST_TMPDIR/o"
    run timeout 120 "$TANDEM" "${A[@]}" --advantage gae --critic "$STORIES" --env-cmd "$ENV ok" --out "$o" --dump-rollouts "$o.jsonl"
    [ "$status" -eq 0 ]
    zero_diff "$o/metrics.jsonl"
    # GAE runs over the actions only (ppo_gae skips mask-0 positions as verl's compute_gae_advantage_return;
    # tests/ppo_loss.bats checks it against verl's formula with an observation span)
    jq -s -e 'map([.advantages, .env_token] | transpose | map(select(.[1] == 1) | .[0] == 0) | all) | all' "$o.jsonl"
    jq -s -e 'map([.advantages, .env_token] | transpose | map(select(.[1] == 0) | .[0] != 0) | any) | all' "$o.jsonl"
}

@test "per-turn rewards reach the returns at each turn's last token: reinforce++ (gamma 0.5) against verl's formula on the rebuilt episodes" {
    need_story
    need_hfpy
    base
    o="$BATS_TEST_TMPDIR/o"
    run timeout 120 "$TANDEM" "${A[@]}" --advantage reinforce++ --kl-coef 0 --gamma 0.5 --env-cmd "$ENV ok $BATS_TEST_TMPDIR/log.jsonl" \
        --out "$o" --dump-rollouts "$o.jsonl"
    [ "$status" -eq 0 ]
    zero_diff "$o/metrics.jsonl"
    check "$o.jsonl" "$BATS_TEST_TMPDIR/log.jsonl" 3 72 --rpp 0.5
    # gamma 0.5 is exact in the float option; the same double operations (sums in another order) over
    # ~250 returns of size < 10: 1e-12. The rewards all at the episode's end would be off by ~0.1-1
    jq -e '.rpp_max_err < 1e-12' <<<"$ref"
}

@test "episodes at tp 2, pp 2, dp 2, with the actor and the reference on their own ranks, and in bf16: rollout logprobs == training logprobs; the episodes rebuilt from the log" {
    need_story
    need_hfpy
    base
    for L in "2 --actor-tp 2" "2 --actor-pp 2" "2" "3 --actor-ranks 2 --ref-ranks 1"; do
        o="$BATS_TEST_TMPDIR/o${L// /}"
        rm -f "$BATS_TEST_TMPDIR/log.jsonl"
        set -- $L
        run_ranks 120 "$1" "$TANDEM" "${A[@]}" "${@:2}" --env-cmd "$ENV ok $BATS_TEST_TMPDIR/log.jsonl" --out "$o" --dump-rollouts "$o.jsonl"
        [ "$status" -eq 0 ] || { echo "$L: $output"; false; }
        zero_diff "$o/metrics.jsonl"
        check "$o.jsonl" "$BATS_TEST_TMPDIR/log.jsonl"
    done
    rm -f "$BATS_TEST_TMPDIR/log.jsonl"
    run timeout 120 "$TANDEM" "${A[@]}" --dtype bf16 --env-cmd "$ENV ok $BATS_TEST_TMPDIR/log.jsonl" --out "$BATS_TEST_TMPDIR/bf" --dump-rollouts "$BATS_TEST_TMPDIR/bf.jsonl"
    [ "$status" -eq 0 ]
    zero_diff "$BATS_TEST_TMPDIR/bf/metrics.jsonl"
    check "$BATS_TEST_TMPDIR/bf.jsonl" "$BATS_TEST_TMPDIR/log.jsonl"
}

@test "--env-chat-template: the feedback is Llama 2's user message, tokenised alone (transformers' rendering); a turn ended at a stop string or --max-new-tokens is closed first (' </s>')" {
    need_story
    need_hfpy
    base
    o="$BATS_TEST_TMPDIR/o"
    run timeout 120 "$TANDEM" "${A[@]}" --chat-template llama2 --env-chat-template --max-episode-tokens 120 \
        --env-cmd "$ENV ok $BATS_TEST_TMPDIR/log.jsonl" --out "$o" --dump-rollouts "$o.jsonl"
    [ "$status" -eq 0 ]
    zero_diff "$o/metrics.jsonl"
    check "$o.jsonl" "$BATS_TEST_TMPDIR/log.jsonl" 3 120 --llama2
    jq -e '.env_tokens > 100 and .open_turns > 0' <<<"$ref"
}

@test "--max-turns and --max-episode-tokens bound every episode (finish \"length\"); the feedback that does not fit is not appended" {
    need_story
    need_hfpy
    base
    o="$BATS_TEST_TMPDIR/t1"
    run timeout 120 "$TANDEM" "${A[@]}" --max-turns 1 --env-cmd "$ENV ok $BATS_TEST_TMPDIR/log1.jsonl" --out "$o" --dump-rollouts "$o.jsonl"
    [ "$status" -eq 0 ]
    check "$o.jsonl" "$BATS_TEST_TMPDIR/log1.jsonl" 1 24
    # one turn: no feedback, the environment's tokens are the observations; done comes at turn 2 at the earliest
    jq -s -e 'map(.turns == 1 and .finish == "length" and (.turn | max) <= 1) | all' "$o.jsonl"
    o="$BATS_TEST_TMPDIR/e"
    run timeout 120 "$TANDEM" "${A[@]}" --max-turns 5 --max-episode-tokens 30 --env-cmd "$ENV long $BATS_TEST_TMPDIR/log2.jsonl" \
        --out "$o" --dump-rollouts "$o.jsonl"
    [ "$status" -eq 0 ]
    check "$o.jsonl" "$BATS_TEST_TMPDIR/log2.jsonl" 5 30
    jq -s -e 'map((.response_ids | length) <= 30) | all' "$o.jsonl"
    jq -s -e 'map(select(.finish == "length")) | length > 0' "$o.jsonl"
}

# fault MODE K FAULT: the episodes e % 4 == K end with FAULT and reward 0 (every turn's), the others
# are whole; env/faults counts them
fault() {
    base
    o="$BATS_TEST_TMPDIR/$1"
    run timeout 120 "$TANDEM" "${A[@]}" --env-timeout 2 --env-cmd "$ENV $1" --out "$o" --dump-rollouts "$o.jsonl"
    [ "$status" -eq 0 ]
    [ "$(jq -s -c 'map(.rollout_logprob_diff_max) | unique' "$o/metrics.jsonl")" = "[0]" ]
    jq -s -e --argjson k "$2" --arg f "$3" 'map(if ((.step - 1) * 8 + .sample) % 4 == $k
        then .env_fault == $f and .score_raw == 0 and (.turn_rewards | map(. == 0) | all)
        else .env_fault == "ok" and .score_raw > 0 end) | all' "$o.jsonl"
    [ "$(jq -s -c 'map(.["env/faults"])' "$o/metrics.jsonl")" = "[2,2]" ]
}

@test "an environment's faults end that episode with reward 0, counted: a reply that is not JSON, one naming another episode, none within --env-timeout (bounded)" {
    need_story
    fault badjson 1 bad_reply
    fault wrong 2 wrong_episode
    t0=$SECONDS
    fault hang 3 timeout
    [ "$(jq -s -c 'map(.["env/timeouts"])' "$BATS_TEST_TMPDIR/hang/metrics.jsonl")" = "[2,2]" ]
    # two steps, one 2 s timeout each (hang guard, not a timing assertion: without --env-timeout it would never end)
    echo "hang: $((SECONDS - t0)) s" >&3
    # every episode ends at its reset: no action in the batch, nothing trained, the run goes on
    o="$BATS_TEST_TMPDIR/rb"
    run timeout 120 "$TANDEM" "${A[@]}" --env-cmd "$ENV resetbad" --out "$o" --dump-rollouts "$o.jsonl"
    [ "$status" -eq 0 ]
    [ "$(jq -s -c 'map([.["env/faults"], .["actor/grad_norm"], .["response_length/mean"]])' "$o/metrics.jsonl")" = "[[8,0,0],[8,0,0]]" ]
    jq -s -e 'map(.env_fault == "bad_reply" and .response_ids == []) | all' "$o.jsonl"
}

@test "a hang with several ranks (the actor at dp 2, the reference on its own rank): the waits on the environment are within the deadline, the episode times out, the run goes on" {
    need_story
    base
    # --env-timeout 3 > --comm-timeout 2: without the episodes' deadline (rlhf/episode.c: (2 + 3) x
    # (3 turns + 1)) the actor's rank 1 (in a broadcast) and the reference's rank 2 (in roles_share)
    # pass the deadline at every step and stop the run (each says so after lingering 10 s + 3 s x
    # its local rank: runtime/comm_mpi.c, hence 6 steps of ~3 s)
    o="$BATS_TEST_TMPDIR/o"
    run_ranks 120 3 "$TANDEM" "${A[@]}" --steps 6 --actor-ranks 2 --ref-ranks 1 --comm-timeout 2 --env-timeout 3 \
        --env-cmd "$ENV hang" --out "$o"
    [ "$status" -eq 0 ] || { echo "$output"; false; }
    [ "$(jq -s -c 'map([.["env/timeouts"], .rollout_logprob_diff_max]) | unique' "$o/metrics.jsonl")" = "[[2,0]]" ]
    [ "$(jq -s length "$o/metrics.jsonl")" -eq 6 ]
}

@test "replies dropped are counted (env/dropped); an environment that never answers in time stops the run after 3 calls, one line" {
    need_story
    base
    o="$BATS_TEST_TMPDIR/d"
    run timeout 120 "$TANDEM" "${A[@]}" --env-cmd "$ENV dup" --out "$o"
    [ "$status" -eq 0 ]
    # episodes 3 and 7 of each step answer turn 1 twice: the second replies, dropped
    [ "$(jq -s -c 'map([.["env/dropped"], .["env/faults"]])' "$o/metrics.jsonl")" = "[[2,0],[2,0]]" ]
    # 1.5 s per reply, 1 s per call: every reset of steps 1, 2, 3 times out (then its replies are stale)
    o="$BATS_TEST_TMPDIR/s"
    run timeout 120 "$TANDEM" "${A[@]}" --steps 6 --env-timeout 1 --env-cmd "$ENV slow" --out "$o"
    echo "$output"
    [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
    [ "$(grep -c '^tandem: ' <<<"$output")" -eq 1 ]
    grep '^tandem: ' <<<"$output" | grep -q "mt_env.py slow: 3 calls in a row without one reply within --env-timeout 1 s"
    [ "$(jq -s -c 'map(.["env/timeouts"])' "$o/metrics.jsonl")" = "[8,8]" ]
}

@test "--loss-agg seq-mean-token-sum-norm with episodes divides by the most model tokens of one (min(--max-turns x --max-new-tokens, --max-episode-tokens) = 36), not --max-new-tokens (torch)" {
    need_story
    need_hfpy
    base
    o="$BATS_TEST_TMPDIR/o"
    run timeout 120 "$TANDEM" "${A[@]}" --loss-agg seq-mean-token-sum-norm --env-cmd "$ENV ok $BATS_TEST_TMPDIR/log.jsonl" --clip 0 \
        --out "$o" --dump-rollouts "$o.jsonl"
    [ "$status" -eq 0 ]
    check "$o.jsonl" "$BATS_TEST_TMPDIR/log.jsonl" 3 72 --grad 4 --norm 36
    gn=$(jq -s '.[0]["actor/grad_norm"]' "$o/metrics.jsonl")
    echo "grad norm: tandem $gn, torch $(jq .grad_norm <<<"$ref") (norm 36)" >&3
    # as the token-mean check (first test): fp32 sums in other orders, 1e-4 relative; norm 12 is 3x off
    jq -e --argjson g "$gn" '(($g - .grad_norm) | fabs) < 1e-4 * .grad_norm' <<<"$ref"
}

# serve MODE LOG: mt_env.py over HTTP on 127.0.0.1 (killed by teardown); sets URL
serve() {
    python3 "$FIX/env/mt_env.py" --http "$BATS_TEST_TMPDIR/port" "$@" 3>&- &
    echo $! >> "$BATS_TEST_TMPDIR/pids"
    for _ in $(seq "$(scaled 100)"); do [ -s "$BATS_TEST_TMPDIR/port" ] && break; sleep 0.1; done
    URL="http://127.0.0.1:$(cat "$BATS_TEST_TMPDIR/port")"
    rm "$BATS_TEST_TMPDIR/port"
}
teardown() {
    [ -f "$BATS_TEST_TMPDIR/pids" ] || return 0
    while read -r p; do kill "$p" 2>/dev/null || true; done < "$BATS_TEST_TMPDIR/pids"
}

@test "--env-url: the same episodes over HTTP, rebuilt from the server's log; a reply that never comes ends its episode at --env-timeout" {
    need_story
    need_hfpy
    base
    serve ok "$BATS_TEST_TMPDIR/log.jsonl"
    o="$BATS_TEST_TMPDIR/o"
    run timeout 120 "$TANDEM" "${A[@]}" --env-url "$URL" --out "$o" --dump-rollouts "$o.jsonl"
    [ "$status" -eq 0 ]
    zero_diff "$o/metrics.jsonl"
    check "$o.jsonl" "$BATS_TEST_TMPDIR/log.jsonl"
    serve hang
    o="$BATS_TEST_TMPDIR/h"
    run timeout 120 "$TANDEM" "${A[@]}" --env-url "$URL" --env-timeout 2 --out "$o" --dump-rollouts "$o.jsonl"
    [ "$status" -eq 0 ]
    jq -s -e 'map(if ((.step - 1) * 8 + .sample) % 4 == 3 then .env_fault == "timeout" and .score_raw == 0
        else .env_fault == "ok" end) | all' "$o.jsonl"
    [ "$(jq -s -c 'map(.["env/timeouts"])' "$o/metrics.jsonl")" = "[2,2]" ]
}

@test "an environment program that exits: one error line naming it, every rank exits" {
    need_story
    base
    run_ranks 120 2 "$TANDEM" "${A[@]}" --env-cmd "$ENV exit" --out "$BATS_TEST_TMPDIR/o"
    echo "$output"
    [ "$status" -ne 0 ]
    [ "$status" -ne 124 ]
    [ "$(grep -c '^tandem: ' <<<"$output")" -eq 1 ]
    grep '^tandem: ' <<<"$output" | grep -q "mt_env.py"
}

@test "--env-* options are refused with one line when they make no sense" {
    need_story
    base
    refuse() {
        run timeout 60 "$TANDEM" "${A[@]}" --out "$BATS_TEST_TMPDIR/r" "$@"
        # one error line (after the placement line when the refusal needs the tokenizer); a failure
        # prints nothing on stdout, so the caller's grep fails (not on the echoed flags)
        [ "$status" -ne 0 ] && [[ "${lines[-1]}" == "tandem: "* ]] && [ "$(grep -vc '^placement ' <<<"$output")" -eq 1 ] ||
            { echo "$* -> $output" >&2; return 1; }
        echo "${lines[-1]}"
    }
    E=(--env-cmd "$ENV ok")
    refuse "${E[@]}" --env-url http://127.0.0.1:9/ | grep -q "not both"
    refuse "${E[@]}" --reward-cmd "$RULE" | grep -q "refused with it"
    refuse --reward-cmd "$RULE" --max-turns 2 | grep -q "only with --env-cmd"
    refuse --reward-cmd "$RULE" --env-chat-template | grep -q "only with --env-cmd"
    refuse "${E[@]}" --env-timeout 0 | grep -q -- "--env-timeout 0"
    refuse "${E[@]}" --max-turns 0 | grep -q -- "--max-turns 0"
    refuse "${E[@]}" --max-episode-tokens 0 | grep -q -- "--max-episode-tokens 0"
    refuse "${E[@]}" --env-chat-template | grep -q "no chat_template"
    refuse "${E[@]}" --overlong-buffer 4 | grep -q -- "--overlong-buffer"
    refuse "${E[@]}" --mask-truncated | grep -q -- "--mask-truncated"
    refuse "${E[@]}" --missing-eos-penalty 0.5 | grep -q -- "--missing-eos-penalty"
    # a prompt and the episode must fit the model's positions
    refuse "${E[@]}" --max-episode-tokens 600 | grep -q "max_position_embeddings"
    refuse --env-cmd "" | grep -q "empty"
    refuse "${E[@]}" --steps 300000000 | grep -q "2^31 - 1 ids"
}

@test "--resume with episodes: 4 steps straight == 2 steps, then --resume 2 more (metrics and weights bit for bit: seeds and episode ids are functions of the step)" {
    need_story
    base
    A+=(--env-cmd "$ENV ok")
    run timeout 120 "$TANDEM" "${A[@]}" --steps 4 --out "$BATS_TEST_TMPDIR/s4"
    [ "$status" -eq 0 ]
    run timeout 120 "$TANDEM" "${A[@]}" --steps 4 --save-every 2 --stop-after 2 --out "$BATS_TEST_TMPDIR/s2"
    [ "$status" -eq 0 ]
    run timeout 120 "$TANDEM" "${A[@]}" --steps 4 --resume "$BATS_TEST_TMPDIR/s2/checkpoint-2" --out "$BATS_TEST_TMPDIR/s2"
    [ "$status" -eq 0 ]
    diff <(numbers "$BATS_TEST_TMPDIR/s4/metrics.jsonl") <(numbers "$BATS_TEST_TMPDIR/s2/metrics.jsonl")
    cmp <(cat "$BATS_TEST_TMPDIR"/s4/checkpoint-4/actor/*.safetensors) <(cat "$BATS_TEST_TMPDIR"/s2/checkpoint-4/actor/*.safetensors)
}
