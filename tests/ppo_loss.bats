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

@test "ppo math vs torch: KL k1/k2/k3, rewards, GAE, whitening, GRPO/RLOO, policy and value losses with gradients and stats" {
    [ -f "$FIX/ppo/make_ppo_fixtures.py" ]
    run "$ROOT/build/tests/test_ppo_loss" "$PPOFIX"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: 108 ppo cases match torch"* ]]
    ! grep -q FAIL <<<"$output"
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
    [ -f "$FIX/ppo/make_ppo_variants.py" ]
    run "$ROOT/build/tests/test_ppo_loss" "$VARFIX"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: 96 ppo cases match torch"* ]]
    ! grep -q FAIL <<<"$output"
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
