#!/usr/bin/env bats
# rlhf/ppo_loss.c against a torch implementation transcribed from verl's core_algos.py
# (tests/fixtures/ppo/make_ppo_fixtures.py -> ppo_cases.json; checker tests/test_ppo_loss.c,
# tolerances explained there): KL estimators k1/k2/k3 and their gradients, token rewards, GAE,
# whitening, GRPO / RLOO advantages, the clipped policy loss (clip-higher, dual clip, KL in loss,
# log-ratio clamp) and the clipped value loss (ties) with torch autograd gradients (float64) and
# every PpoStats field, whole and in two micro-batches. The loss aggregations, GSPO, CISPO and the
# REINFORCE++ advantages the same way (make_ppo_variants.py -> ppo_variants.json, on the same batch).
load helpers

PPOFIX="$FIX/ppo/ppo_cases.json"
VARFIX="$FIX/ppo/ppo_variants.json"

# matches_torch GENERATOR FIXTURE N: test_ppo_loss finds all N cases of FIXTURE (written by GENERATOR) equal to torch's
matches_torch() {
    [ -f "$FIX/ppo/$1" ]
    run "$ROOT/build/tests/test_ppo_loss" "$2"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: $3 ppo cases match torch"* ]]
    ! grep -q FAIL <<<"$output"
}

@test "ppo math vs torch: KL k1/k2/k3, rewards, GAE, whitening, GRPO/RLOO, policy and value losses with gradients and stats" {
    matches_torch make_ppo_fixtures.py "$PPOFIX" 108
}

@test "ppo fixture reaches every branch: clipped ratios, the dual clip, clipped values, the k3 clamp, ratio 1" {
    # clip counts per actor case (the last is on-policy: ratio 1 everywhere, nothing clipped)
    [ "$(jq -c '[.actor[] | .pg_clipfrac]' "$PPOFIX")" = "[10,6,10,10,6,8,0]" ]
    [ "$(jq -c '[.actor[] | .pg_clipfrac_lower]' "$PPOFIX")" = "[0,0,4,0,4,5,0]" ]
    [ "$(jq -c '[.actor[] | .logprob_diff_max]' "$PPOFIX")" = "[25,25,25,25,25,25,0]" ]
    [ "$(jq -c '[.critic[] | .vf_clipfrac]' "$PPOFIX")" = "[20,10,19]" ]
    # three tokens past k3's clamp, in each of the two k3 cases
    [ "$(jq '[.kl[] | select(.estimator == "k3") | .kl[] | select(. == 10)] | length' "$PPOFIX")" -eq 6 ]
}

@test "ppo math: a wrong clip bound is caught (the check can fail)" {
    jq -c '.actor[1].clip_high = 0.2' "$PPOFIX" > "$BATS_TEST_TMPDIR/bad.json"
    run "$ROOT/build/tests/test_ppo_loss" "$BATS_TEST_TMPDIR/bad.json"
    echo "$output"
    [ "$status" -ne 0 ]
    [[ "$output" == *FAIL* ]]
}

@test "ppo fixture: make_ppo_fixtures.py writes the committed ppo_cases.json byte for byte" {
    need_hfpy
    run "$HFPY" "$FIX/ppo/make_ppo_fixtures.py" "$BATS_TEST_TMPDIR/ppo_cases.json"
    echo "$output"
    [ "$status" -eq 0 ]
    cmp "$BATS_TEST_TMPDIR/ppo_cases.json" "$PPOFIX"
}

@test "ppo math vs torch: loss aggregations, GSPO, CISPO, REINFORCE++ and its baseline, with gradients and stats" {
    matches_torch make_ppo_variants.py "$VARFIX" 96
}

@test "ppo variants fixture reaches its branches: GSPO clipped and past its clamp, CISPO clipped, ratio 1" {
    # clip counts: ppo x 4 aggregations, cispo x 3, gspo at 3e-4 / 4e-4, at 0.2 / 0.28, past the clamp, on-policy
    [ "$(jq -c '[.actor[] | .pg_clipfrac]' "$VARFIX")" = "[6,6,6,6,22,22,31,17,1,1,0]" ]
    # past the clamp: no gradient through sequence 1 at all, and some everywhere else
    [ "$(jq '.seq_start as $s | .actor[9].dlp[$s[1]:$s[2]] | map(select(. != 0)) | length' "$VARFIX")" -eq 0 ]
    [ "$(jq '.actor[9].dlp | map(select(. != 0)) | length' "$VARFIX")" -eq 49 ]
    # the four aggregations give four different losses
    [ "$(jq '[.actor[0:4][] | .loss] | unique | length' "$VARFIX")" -eq 4 ]
}

@test "ppo variants: a wrong policy loss or aggregation is caught (the check can fail)" {
    for edit in '.actor[7].policy = "ppo"' '.actor[4].policy = "ppo"' '.actor[1].agg = "token-mean"' '.actor[3].agg = "seq-mean-token-sum"' \
                '.returns[1].gamma = 1' '.rpp_baseline[0].G = 4'; do
        jq -c "$edit" "$VARFIX" > "$BATS_TEST_TMPDIR/bad.json"
        run "$ROOT/build/tests/test_ppo_loss" "$BATS_TEST_TMPDIR/bad.json"
        [ "$status" -ne 0 ] || { echo "not caught: $edit"; false; }
        [[ "$output" == *FAIL* ]]
    done
}

@test "ppo variants fixture: make_ppo_variants.py writes the committed ppo_variants.json byte for byte" {
    need_hfpy
    run "$HFPY" "$FIX/ppo/make_ppo_variants.py" "$BATS_TEST_TMPDIR/ppo_variants.json"
    echo "$output"
    [ "$status" -eq 0 ]
    cmp "$BATS_TEST_TMPDIR/ppo_variants.json" "$VARFIX"
}

# tandem ppo with the new options on stories260K: responses of varying length (they stop at "."), a
# reward of the response's length / 100 (tests/ppo.bats's rule scores 0 in 24 tokens)
ppo_args() {
    A=(--actor "$STORIES" --prompts "$TRAIN" --reward-cmd "jq --unbuffered -c '{reward: (.response | length / 100)}'"
       --n-samples-per-prompt 4 --rollout-batch-size 2 --max-new-tokens 24 --stop . --actor-lr 3e-4 --kl-loss-coef 0.01)
}

@test "ppo --loss-agg: each aggregation gives the same step-1 gradient norm at dp 1, at dp 2 and in micro-batches of 1; the four differ" {
    need_story
    ppo_args
    for agg in token-mean seq-mean-token-mean seq-mean-token-sum seq-mean-token-sum-norm; do
        run timeout 60 "$TANDEM" ppo "${A[@]}" --advantage grpo --steps 1 --loss-agg $agg --out "$BATS_TEST_TMPDIR/$agg"
        [ "$status" -eq 0 ]
        run timeout 60 "$TANDEM" ppo "${A[@]}" --advantage grpo --steps 1 --loss-agg $agg --micro-batch-size 1 --out "$BATS_TEST_TMPDIR/$agg-micro"
        [ "$status" -eq 0 ]
        run timeout 120 $MPIRUN 2 "$TANDEM" ppo "${A[@]}" --advantage grpo --steps 1 --loss-agg $agg --out "$BATS_TEST_TMPDIR/$agg-dp"
        [ "$status" -eq 0 ]
        # the same samples (scores equal), the same gradient up to fp32 summation order (1e-5
        # relative: a weight off by the dp factor or by a dp share's count would be off by 2x)
        for d in micro dp; do
            paste <(jq '[.["critic/score/mean"], .["actor/grad_norm"]] | .[]' "$BATS_TEST_TMPDIR/$agg/metrics.jsonl") \
                  <(jq '[.["critic/score/mean"], .["actor/grad_norm"]] | .[]' "$BATS_TEST_TMPDIR/$agg-$d/metrics.jsonl") |
                awk -v w="$agg $d" '{ d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1; if (d > 1e-5 * (a > 1 ? a : 1)) { print w, "differ", $0; bad = 1 } } END { exit bad }'
        done
        jq -e '.["actor/grad_norm"] > 0' "$BATS_TEST_TMPDIR/$agg/metrics.jsonl"
    done
    # responses of different lengths: every aggregation weighs them differently
    [ "$(jq -s 'map(.["actor/grad_norm"]) | unique | length' "$BATS_TEST_TMPDIR"/{token-mean,seq-mean-token-mean,seq-mean-token-sum,seq-mean-token-sum-norm}/metrics.jsonl)" -eq 4 ]
}

@test "ppo with each new option: trains with a finite loss, and 4 steps straight == 2 steps + --resume 2 (metrics and weights bit for bit)" {
    need_story
    ppo_args
    A+=(--steps 4 --mini-batch-size 4)
    for cfg in "--advantage grpo --no-std-norm --loss-agg seq-mean-token-sum-norm" "--advantage rloo --loss-agg seq-mean-token-mean" \
               "--advantage reinforce++ --kl-coef 0.01 --gamma 0.99 --policy-loss cispo --loss-agg seq-mean-token-sum" \
               "--advantage reinforce++-baseline --policy-loss gspo"; do
        d="$BATS_TEST_TMPDIR/$(tr -c 'a-z0-9\n' _ <<<"$cfg")"
        run timeout 60 "$TANDEM" ppo "${A[@]}" $cfg --out "$d/straight"
        [ "$status" -eq 0 ] || { echo "$cfg: $output"; false; }
        run timeout 60 "$TANDEM" ppo "${A[@]}" $cfg --out "$d/split" --save-every 2 --stop-after 2
        [ "$status" -eq 0 ]
        run timeout 60 "$TANDEM" ppo "${A[@]}" $cfg --out "$d/split" --resume "$d/split/checkpoint-2"
        [ "$status" -eq 0 ]
        diff <(numbers "$d/straight/metrics.jsonl") <(numbers "$d/split/metrics.jsonl")
        cmp <(cat "$d"/straight/checkpoint-4/actor/*.safetensors) <(cat "$d"/split/checkpoint-4/actor/*.safetensors)
        # 4 steps, each with a finite (JSON number) loss and gradient, the rollout logprobs exact
        [ "$(jq -s 'map(select((.["actor/pg_loss"] | type) == "number" and .["actor/grad_norm"] > 0 and .rollout_logprob_diff_max == 0)) | length' "$d/straight/metrics.jsonl")" -eq 4 ]
        echo "$cfg: $(jq -s -c 'map(.["actor/pg_loss"])' "$d/straight/metrics.jsonl")" >&3
    done
}

@test "ppo: --policy-loss / --loss-agg / --advantage that make no sense are one line each; gspo's own clip range unless given" {
    need_story
    ppo_args
    A+=(--steps 1 --out "$BATS_TEST_TMPDIR/x")
    run "$TANDEM" ppo "${A[@]}" --critic "$STORIES" --advantage gae --policy-loss gspo
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --policy-loss gspo: --advantage gae gives token-level advantages; GSPO's ratio is a sequence's (use grpo, rloo or reinforce++-baseline)" ]
    run "$TANDEM" ppo "${A[@]}" --advantage reinforce++ --policy-loss gspo
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --policy-loss gspo: --advantage reinforce++ gives token-level advantages; GSPO's ratio is a sequence's (use grpo, rloo or reinforce++-baseline)" ]
    run "$TANDEM" ppo "${A[@]}" --advantage grpo --policy-loss gspo --loss-agg token-mean
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --loss-agg token-mean: --policy-loss gspo aggregates as seq-mean-token-mean (GSPO's objective, verl's compute_policy_loss_gspo)" ]
    run "$TANDEM" ppo "${A[@]}" --advantage grpo --policy-loss cispo --dual-clip 3
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --dual-clip: --policy-loss cispo has no dual clip (only ppo)" ]
    run "$TANDEM" ppo "${A[@]}" --advantage reinforce++-baseline --n-samples-per-prompt 1
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --advantage reinforce++-baseline needs --n-samples-per-prompt >= 2 (the baseline is the group's mean)" ]
    run "$TANDEM" ppo "${A[@]}" --advantage reinforce++ --critic "$STORIES"
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --critic: --advantage reinforce++ uses no critic" ]
    run "$TANDEM" ppo "${A[@]}" --advantage grpo --loss-agg seq-sum
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --loss-agg seq-sum: expected token-mean, seq-mean-token-mean, seq-mean-token-sum or seq-mean-token-sum-norm" ]
    run "$TANDEM" ppo "${A[@]}" --advantage grpo --policy-loss dapo
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --policy-loss dapo: expected ppo, gspo or cispo" ]
    run "$TANDEM" ppo "${A[@]}" --advantage reinforce
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --advantage reinforce: expected gae, grpo, rloo, reinforce++ or reinforce++-baseline" ]
    # gspo: --clip-eps 3e-4 / --clip-eps-high 4e-4 (the paper's) unless given; --clip-eps alone sets both, as for ppo
    run "$TANDEM" ppo "${A[@]}" --advantage grpo --policy-loss gspo --overwrite
    [ "$status" -eq 0 ]
    [[ "$output" == *"| --clip-eps             | 0.0003 "*"| --clip-eps-high        | 0.0004 "* ]]
    run "$TANDEM" ppo "${A[@]}" --advantage grpo --policy-loss gspo --clip-eps 0.001 --overwrite
    [ "$status" -eq 0 ]
    [[ "$output" == *"| --clip-eps             | 0.001 "*"| --clip-eps-high        | 0 "* ]]
}
