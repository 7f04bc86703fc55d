#!/usr/bin/env bats
# tandem ppo --rollout-ranks / --async-lag (rlhf/async.h) on stories260K with a reward program:
# decoupled PPO's loss against a torch transcription of AReaL's (values, gradients, stats); lag 0
# equal to the colocated run bit for bit (weights, dump, metrics); lag 1 and 2: every weight copy
# checked on both sides, the rollout's logprobs equal to the trainer's where the versions agree,
# staleness exactly min(step - 1, L) in the dump, finite; resume at lag 1 and 2 bit for bit; refusals.
load helpers

DECFIX="$FIX/ppo/ppo_decoupled.json"
SPLIT="python3 -u $FIX/ppo/split_reward.py"
base() {
    A=(--actor "$STORIES" --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 4 --rollout-batch-size 2
       --max-new-tokens 16 --actor-lr 3e-3 --kl-coef 0 --threads 1 --reward-cmd "$SPLIT")
}
# dump_core FILE: the dump without the fields only a --rollout-ranks run writes
dump_core() { jq -c 'del(.version, .staleness)' "$1"; }

@test "decoupled PPO vs torch (AReaL's ppo_actor_loss_fn with proximal logprobs and the behaviour weight cap): loss, gradient, stats" {
    run "$ROOT/build/tests/test_ppo_loss" "$DECFIX"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: 72 ppo cases match torch"* ]]
    [[ "$output" != *FAIL* ]]
    # the cases reach the branches: clipped ratios, the dual clip, capped weights, weights of 1, the
    # proximal policy taken from the hook's own input (prox_self)
    [ "$(jq -c '[.actor[] | [.pg_clipfrac, .pg_clipfrac_lower, .behav_capped]]' "$DECFIX")" = "[[3,0,0],[3,1,0],[3,0,4],[3,1,4],[6,0,0],[0,0,4]]" ]
    # the check can fail: the ratio against the behaviour policy, or no cap, is caught
    for edit in 'del(.actor[0].prox_lp)' '.actor[2].behav_cap = 0' '.actor[1].prox_lp = .actor[1].old_lp' '.actor[0].prox_self = 1'; do
        jq -c "$edit" "$DECFIX" > "$BATS_TEST_TMPDIR/bad.json"
        run "$ROOT/build/tests/test_ppo_loss" "$BATS_TEST_TMPDIR/bad.json"
        [ "$status" -ne 0 ] || { echo "not caught: $edit"; false; }
    done
}

@test "decoupled fixture: make_ppo_decoupled.py writes the committed ppo_decoupled.json byte for byte" {
    need_hfpy
    run "$HFPY" "$FIX/ppo/make_ppo_decoupled.py" "$BATS_TEST_TMPDIR/d.json"
    echo "$output"
    [ "$status" -eq 0 ]
    cmp "$BATS_TEST_TMPDIR/d.json" "$DECFIX"
}

@test "--rollout-ranks at --async-lag 0 is the colocated run bit for bit (weights, dump, metrics), at rollout dp 1 and 2" {
    need_story
    base
    run timeout 120 "$TANDEM" ppo "${A[@]}" --steps 3 --out "$BATS_TEST_TMPDIR/colo" --dump-rollouts "$BATS_TEST_TMPDIR/colo.jsonl"
    [ "$status" -eq 0 ]
    for n in 1 2; do
        run_ranks 180 $((1 + n)) "$TANDEM" ppo "${A[@]}" --steps 3 --actor-ranks 1 --rollout-ranks $n \
            --out "$BATS_TEST_TMPDIR/r$n" --dump-rollouts "$BATS_TEST_TMPDIR/r$n.jsonl"
        [ "$status" -eq 0 ]
        # the rollout root got versions 0, 1, 2, three different weights (they moved), each its actor's
        grep '^rollout: weights version' <<<"$output"
        [ "$(grep -c '^rollout: weights version' <<<"$output")" -eq 3 ]
        [ "$(sed -n 's/^rollout: weights version .*checksum \([0-9a-f]*\) (the actor.s \1).*/\1/p' <<<"$output" | sort -u | wc -l)" -eq 3 ]
        cmp "$BATS_TEST_TMPDIR/colo/checkpoint-3/actor/model-00001-of-00001.safetensors" \
            "$BATS_TEST_TMPDIR/r$n/checkpoint-3/actor/model-00001-of-00001.safetensors"
        diff <(dump_core "$BATS_TEST_TMPDIR/colo.jsonl") <(dump_core "$BATS_TEST_TMPDIR/r$n.jsonl")
        diff <(numbers "$BATS_TEST_TMPDIR/colo/metrics.jsonl" | jq -c 'with_entries(select(.key | test("^(async|timing|trainer|rollouter|weight_sync)/") | not))') \
             <(numbers "$BATS_TEST_TMPDIR/r$n/metrics.jsonl" | jq -c 'with_entries(select(.key | test("^(async|timing|trainer|rollouter|weight_sync)/") | not))')
        # version k - 1 sampled step k: staleness 0; the rollout's logprobs were the trainer's
        [ "$(jq -s -c 'map([.step - 1 - .version, .staleness]) | unique' "$BATS_TEST_TMPDIR/r$n.jsonl")" = "[[0,0]]" ]
        [ "$(jq -s -c 'map(.rollout_logprob_diff_max) | unique' "$BATS_TEST_TMPDIR/r$n/metrics.jsonl")" = "[0]" ]
    done
}

@test "--async-lag 1 and 2: each weight copy is the actor's (checksums of both sides), staleness min(step - 1, L), the rollout's logprobs are the trainer's at version 0, finite" {
    need_story
    base
    for L in 1 2; do
        run_ranks 180 2 "$TANDEM" ppo "${A[@]}" --steps 5 --actor-ranks 1 --rollout-ranks 1 --async-lag $L \
            --out "$BATS_TEST_TMPDIR/l$L" --dump-rollouts "$BATS_TEST_TMPDIR/l$L.jsonl"
        echo "$output" | grep -E '^(rollout: weights|step)'
        [ "$status" -eq 0 ]
        M="$BATS_TEST_TMPDIR/l$L/metrics.jsonl" D="$BATS_TEST_TMPDIR/l$L.jsonl"
        # rank 1 (the rollout) received versions 0 .. 4 - L, each with its own checksum equal to the actor's
        grep '^rollout: weights version' <<<"$output" | sed 's/.*version \([0-9]*\):.*checksum \([0-9a-f]*\) (the actor.s \([0-9a-f]*\)).*/\1 \2 \3/' > "$BATS_TEST_TMPDIR/ck"
        cat "$BATS_TEST_TMPDIR/ck"
        [ "$(cut -d' ' -f1 "$BATS_TEST_TMPDIR/ck" | tr '\n' ' ')" = "$(seq -s ' ' 0 $((4 - L))) " ]
        awk '$2 != $3 { exit 1 }' "$BATS_TEST_TMPDIR/ck"
        [ "$(cut -d' ' -f2 "$BATS_TEST_TMPDIR/ck" | sort -u | wc -l)" -eq $((5 - L)) ]
        # staleness per step in the dump and the metrics: min(step - 1, L); versions max(0, step - 1 - L)
        [ "$(jq -s -c --argjson L $L 'map([.step, .version, .staleness] == [.step, ([0, .step - 1 - $L] | max), ([.step - 1, $L] | min)]) | unique' "$D")" = "[true]" ]
        [ "$(jq -s -c 'map(.["async/staleness_max"])' "$M")" = "$(jq -c -n --argjson L $L '[range(5) | [., $L] | min]')" ]
        # step 1 trains version 0's batch on version 0: proximal == behaviour bit for bit on all 8 sequences
        [ "$(jq -s -c 'map([.["async/fresh_sequences"], .["async/behav_prox_diff_max"]])[0]' "$M")" = "[8,0]" ]
        jq -s -e 'map(select(.step == 1) | .behaviour_logprobs == .proximal_logprobs) | all' "$D"
        # later steps: an older behaviour policy (the weights moved), yet the training forward equals the
        # proximal pass bit for bit, and everything is finite
        jq -s -e 'map(select(.step > 1) | .behaviour_logprobs != .proximal_logprobs) | any' "$D"
        [ "$(jq -s -c 'map(.rollout_logprob_diff_max) | unique' "$M")" = "[0]" ]
        jq -s -e 'map(.["actor/pg_loss"], .["actor/grad_norm"], .["async/behav_imp_weight_mean"] | isinfinite or isnan | not) | all' "$M"
        [ "$(jq -s 'map(.["weight_sync/bytes"]) | map(select(. > 0)) | length' "$M")" -eq $((4 - L)) ]
    done
}

@test "--resume at --async-lag 0, 1 and 2 (stopped after step 2, or from the uninterrupted run's checkpoint-2): the uninterrupted run's prompts, samples and weights, bit for bit" {
    need_story
    base
    for L in 0 1 2; do
        R=(--actor-ranks 1 --rollout-ranks 1 --async-lag $L --steps 5)
        run timeout 180 $MPIRUN 2 "$TANDEM" ppo "${A[@]}" "${R[@]}" --save-every 2 --out "$BATS_TEST_TMPDIR/u$L" --dump-rollouts "$BATS_TEST_TMPDIR/u$L.jsonl"
        [ "$status" -eq 0 ]
        if [ $L -eq 1 ]; then   # stopped after step 2 (what the run has in flight then is generated, and saved)
            run timeout 180 $MPIRUN 2 "$TANDEM" ppo "${A[@]}" "${R[@]}" --stop-after 2 --out "$BATS_TEST_TMPDIR/k$L" --dump-rollouts "$BATS_TEST_TMPDIR/k$L.jsonl"
            [ "$status" -eq 0 ]
            CK="$BATS_TEST_TMPDIR/k$L/checkpoint-2"
        else                    # the checkpoint the uninterrupted run wrote while its pipeline was full
            CK="$BATS_TEST_TMPDIR/u$L/checkpoint-2"
            cp "$BATS_TEST_TMPDIR/u$L.jsonl" "$BATS_TEST_TMPDIR/k$L.jsonl"
        fi
        [ $L -eq 0 ] || [ -f "$CK/inflight.bin" ]
        run timeout 180 $MPIRUN 2 "$TANDEM" ppo "${A[@]}" "${R[@]}" --resume "$CK" --out "$BATS_TEST_TMPDIR/k$L" \
            --dump-rollouts "$BATS_TEST_TMPDIR/k$L.jsonl"
        [ "$status" -eq 0 ]
        [[ "$output" != *"generated again"* ]]
        cmp "$BATS_TEST_TMPDIR/u$L/checkpoint-5/actor/model-00001-of-00001.safetensors" "$BATS_TEST_TMPDIR/k$L/checkpoint-5/actor/model-00001-of-00001.safetensors"
        cmp "$BATS_TEST_TMPDIR/u$L.jsonl" "$BATS_TEST_TMPDIR/k$L.jsonl"
        # each step's prompts once, as the uninterrupted run's
        diff <(jq -c '[.step, .prompt_line]' "$BATS_TEST_TMPDIR/u$L.jsonl" | sort -u) <(jq -c '[.step, .prompt_line]' "$BATS_TEST_TMPDIR/k$L.jsonl" | sort -u)
        [ "$(jq -s 'map(.step) | unique | length' "$BATS_TEST_TMPDIR/k$L.jsonl")" -eq 5 ]
        [ "$(jq -s 'length' "$BATS_TEST_TMPDIR/k$L.jsonl")" -eq 40 ]
    done
}

@test "--resume at --async-lag 1 from a checkpoint without in-flight batches (a lag-0 run's): they are generated again, said in one line; the prompts stay the uninterrupted run's" {
    need_story
    base
    run timeout 180 $MPIRUN 2 "$TANDEM" ppo "${A[@]}" --actor-ranks 1 --rollout-ranks 1 --steps 4 --stop-after 2 --out "$BATS_TEST_TMPDIR/z" \
        --dump-rollouts "$BATS_TEST_TMPDIR/z.jsonl"
    [ "$status" -eq 0 ]
    run timeout 180 $MPIRUN 2 "$TANDEM" ppo "${A[@]}" --actor-ranks 1 --rollout-ranks 1 --async-lag 1 --steps 4 --resume "$BATS_TEST_TMPDIR/z/checkpoint-2" \
        --out "$BATS_TEST_TMPDIR/z" --dump-rollouts "$BATS_TEST_TMPDIR/z.jsonl"
    [ "$status" -eq 0 ]
    [[ "$output" == *"resuming: 0 of the 1 batches in flight at step 2 are in"*"generated again from the resumed weights"* ]]
    # step 3 from the resumed weights (version 2, staleness 0), step 4 from them too (lag 1)
    [ "$(jq -s -c 'map([.step, .version]) | unique' "$BATS_TEST_TMPDIR/z.jsonl")" = "[[1,0],[2,1],[3,2],[4,2]]" ]
    run timeout 120 "$TANDEM" ppo "${A[@]}" --steps 4 --out "$BATS_TEST_TMPDIR/plain" --dump-rollouts "$BATS_TEST_TMPDIR/plain.jsonl"
    diff <(jq -c '[.step, .prompt_line]' "$BATS_TEST_TMPDIR/plain.jsonl") <(jq -c '[.step, .prompt_line]' "$BATS_TEST_TMPDIR/z.jsonl")
}

@test "--rollout-ranks / --async-lag refusals: one line each" {
    need_story
    base
    refuse() {   # refuse NP EXPECTED ARGS...
        local np=$1 want=$2
        shift 2
        run timeout 60 $MPIRUN "$np" "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/x" "$@"
        echo "$output"
        [ "$status" -ne 0 ]
        [[ "$output" == *"$want"* ]]
        [ "$(grep -c '^tandem:' <<<"$output")" -eq 1 ]
    }
    refuse 1 "--async-lag 1: needs --rollout-ranks" --async-lag 1
    refuse 1 "--async-lag -1: must be >= 0" --async-lag -1
    refuse 1 "--behav-imp-weight-cap: only with --async-lag >= 1" --behav-imp-weight-cap 2
    refuse 2 "--rollout-ranks: not with --lora-r" --actor-ranks 1 --rollout-ranks 1 --lora-r 4
    refuse 2 "--rollout-ranks: not with --dynamic-sampling" --actor-ranks 1 --rollout-ranks 1 --dynamic-sampling
    refuse 2 "--policy-loss gspo: decoupled PPO" --actor-ranks 1 --rollout-ranks 1 --async-lag 1 --policy-loss gspo
    refuse 2 "--async-lag 1: not with --top-k" --actor-ranks 1 --rollout-ranks 1 --async-lag 1 --top-k 5
    refuse 3 "--rollout-ranks 1: must be a multiple of the actor's tp x pp = 2" --actor-ranks 2 --actor-tp 2 --rollout-ranks 1
    refuse 2 "the rollout ranks are a group of their own" --colocate actor,rollout --rollout-ranks 1 --actor-ranks 1
}

@test "--rollout-ranks at tp 2 (shards one to one): lag 0 is the colocated tp-2 run bit for bit; lag 1 runs exact on both shards" {
    need_story
    base
    run timeout 180 $MPIRUN 2 "$TANDEM" ppo "${A[@]}" --steps 3 --actor-tp 2 --out "$BATS_TEST_TMPDIR/colo"
    [ "$status" -eq 0 ]
    for L in 0 1; do
        run timeout 240 $MPIRUN 4 "$TANDEM" ppo "${A[@]}" --steps 3 --actor-tp 2 --actor-ranks 2 --rollout-ranks 2 --async-lag $L \
            --out "$BATS_TEST_TMPDIR/l$L"
        [ "$status" -eq 0 ]
        [ "$(jq -s -c 'map(.rollout_logprob_diff_max) | unique' "$BATS_TEST_TMPDIR/l$L/metrics.jsonl")" = "[0]" ]
    done
    cmp "$BATS_TEST_TMPDIR/colo/checkpoint-3/actor/model-00001-of-00001.safetensors" "$BATS_TEST_TMPDIR/l0/checkpoint-3/actor/model-00001-of-00001.safetensors"
    [ "$(jq -s -c 'map([.["async/fresh_sequences"], .["async/behav_prox_diff_max"]])[0]' "$BATS_TEST_TMPDIR/l1/metrics.jsonl")" = "[8,0]" ]
}

@test "the weight transfer alone (test_weight_sync): every parameter of the shard, exact, at tp 1 fp32 and tp 2 bf16" {
    need_story
    # stories260K's parameters from its config: embedding (tied head), 5 layers, the final norm
    C="$STORIES/config.json"
    n=$(jq '.hidden_size as $d | .intermediate_size as $f | ($d / .num_attention_heads * .num_key_value_heads) as $kv
            | .vocab_size * $d + .num_hidden_layers * (2 * $d * $d + 2 * $d * $kv + 3 * $d * $f + 2 * $d) + $d' "$C")
    for cfg in "2 fp32 4" "4 bf16 2"; do
        set -- $cfg
        run_ranks 60 $1 "$ROOT/build/tests/test_weight_sync" "$STORIES" 3 $2
        echo "$output"
        [ "$status" -eq 0 ]
        j=$(grep '^{"bench": "weight_sync"' <<<"$output")
        # every element once over the shards (tp 2: the norms are on both ranks, counted twice)
        want=$n; [ $1 -eq 4 ] && want=$((n + $(jq '.hidden_size * (2 * .num_hidden_layers + 1)' "$C")))
        [ "$(jq .bytes <<<"$j")" -eq $((want * $3)) ]
        # three transfers, each checked on the rollout root: its arena's checksum is the actor's
        [ "$(grep -c '^rollout: weights version 0: .*checksum \([0-9a-f]*\) (the actor.s \1)' <<<"$output")" -eq 3 ]
    done
}

@test "episodes (--env-cmd) on --rollout-ranks: lag 0 is the colocated run bit for bit (weights, dump with its turns, metrics); lag 1 stale by one version, exact where the versions agree; resume at lag 1 bit for bit" {
    need_story
    E=(--actor "$STORIES" --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 4 --rollout-batch-size 2
       --max-new-tokens 12 --stop . --actor-lr 1e-3 --kl-coef 0 --threads 1 --env-cmd "python3 -u $FIX/env/mt_env.py ok")
    run timeout 120 "$TANDEM" ppo "${E[@]}" --steps 3 --out "$BATS_TEST_TMPDIR/colo" --dump-rollouts "$BATS_TEST_TMPDIR/colo.jsonl"
    [ "$status" -eq 0 ]
    run_ranks 180 2 "$TANDEM" ppo "${E[@]}" --steps 3 --actor-ranks 1 --rollout-ranks 1 \
        --out "$BATS_TEST_TMPDIR/r0" --dump-rollouts "$BATS_TEST_TMPDIR/r0.jsonl"
    [ "$status" -eq 0 ]
    cmp "$BATS_TEST_TMPDIR/colo/checkpoint-3/actor/model-00001-of-00001.safetensors" \
        "$BATS_TEST_TMPDIR/r0/checkpoint-3/actor/model-00001-of-00001.safetensors"
    diff <(dump_core "$BATS_TEST_TMPDIR/colo.jsonl") <(dump_core "$BATS_TEST_TMPDIR/r0.jsonl")
    # the turns came over from the rollout side: several turns, environment tokens with mask 0
    jq -s -e 'map(.turns) | max > 1' "$BATS_TEST_TMPDIR/r0.jsonl"
    jq -s -e 'map([.env_token, .loss_mask] | transpose[] | select(.[0] == 1) | .[1] == 0) | all' "$BATS_TEST_TMPDIR/r0.jsonl"
    drop='with_entries(select(.key | test("^(async|timing|trainer|rollouter|weight_sync)/") | not))'
    diff <(numbers "$BATS_TEST_TMPDIR/colo/metrics.jsonl" | jq -c "$drop") <(numbers "$BATS_TEST_TMPDIR/r0/metrics.jsonl" | jq -c "$drop")
    # lag 1: 4 steps straight, and 2 steps then --resume: the same episodes and weights
    run_ranks 180 2 "$TANDEM" ppo "${E[@]}" --steps 4 --actor-ranks 1 --rollout-ranks 1 --async-lag 1 \
        --out "$BATS_TEST_TMPDIR/l1" --dump-rollouts "$BATS_TEST_TMPDIR/l1.jsonl"
    [ "$status" -eq 0 ]
    [ "$(jq -s -c 'map(.staleness) | unique' "$BATS_TEST_TMPDIR/l1.jsonl")" = "[0,1]" ]
    jq -s -e 'map(.["env/turns_mean"] > 1 and (.["actor/pg_loss"] | isnormal or . == 0)) | all' "$BATS_TEST_TMPDIR/l1/metrics.jsonl"
    # step 1's episodes came from version 0, the trainer's weights then: proximal == behaviour exactly
    [ "$(jq -s -c 'map([.["async/fresh_sequences"], .["async/behav_prox_diff_max"]])[0]' "$BATS_TEST_TMPDIR/l1/metrics.jsonl")" = "[8,0]" ]
    run_ranks 180 2 "$TANDEM" ppo "${E[@]}" --steps 4 --actor-ranks 1 --rollout-ranks 1 --async-lag 1 --save-every 2 --stop-after 2 \
        --out "$BATS_TEST_TMPDIR/s" --dump-rollouts "$BATS_TEST_TMPDIR/s.jsonl"
    [ "$status" -eq 0 ]
    run_ranks 180 2 "$TANDEM" ppo "${E[@]}" --steps 4 --actor-ranks 1 --rollout-ranks 1 --async-lag 1 \
        --resume "$BATS_TEST_TMPDIR/s/checkpoint-2" --out "$BATS_TEST_TMPDIR/s" --dump-rollouts "$BATS_TEST_TMPDIR/s.jsonl"
    [ "$status" -eq 0 ]
    cmp "$BATS_TEST_TMPDIR/l1.jsonl" "$BATS_TEST_TMPDIR/s.jsonl"
    cmp "$BATS_TEST_TMPDIR/l1/checkpoint-4/actor/model-00001-of-00001.safetensors" \
        "$BATS_TEST_TMPDIR/s/checkpoint-4/actor/model-00001-of-00001.safetensors"
}

@test "replies dropped by the environment on the rollout ranks reach the trainer's metrics (env/dropped): the colocated run's counts" {
    need_story
    E=(--actor "$STORIES" --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 4 --rollout-batch-size 2 --steps 2
       --max-new-tokens 12 --stop . --actor-lr 1e-3 --kl-coef 0 --threads 1 --env-cmd "python3 -u $FIX/env/mt_env.py dup")
    run timeout 120 "$TANDEM" ppo "${E[@]}" --out "$BATS_TEST_TMPDIR/colo"
    [ "$status" -eq 0 ]
    run_ranks 180 2 "$TANDEM" ppo "${E[@]}" --actor-ranks 1 --rollout-ranks 1 --out "$BATS_TEST_TMPDIR/r"
    [ "$status" -eq 0 ]
    # episodes 3 and 7 of each step answer turn 1 twice: the second replies, dropped
    [ "$(jq -s -c 'map(.["env/dropped"])' "$BATS_TEST_TMPDIR/colo/metrics.jsonl")" = "[2,2]" ]
    [ "$(jq -s -c 'map(.["env/dropped"])' "$BATS_TEST_TMPDIR/r/metrics.jsonl")" = "[2,2]" ]
}
