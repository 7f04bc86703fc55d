#!/usr/bin/env bats
# rlhf/ppo_loss.c against a torch implementation written from verl's core_algos.py
# (tests/fixtures/ppo/make_ppo_fixtures.py -> ppo_cases.json; checker tests/test_ppo_loss.c,
# tolerances explained there): KL estimators, token rewards, GAE, whitening, GRPO / RLOO advantages,
# the clipped policy loss (clip-higher, dual clip, KL in loss) and the clipped value loss with
# their gradients (torch autograd, float64) and clip counts.
load helpers

@test "ppo math vs torch: KL k1/k2/k3, rewards, GAE, whitening, GRPO/RLOO, policy and value losses with gradients" {
    [ -f "$FIX/ppo/make_ppo_fixtures.py" ]
    run "$ROOT/build/tests/test_ppo_loss" "$FIX/ppo/ppo_cases.json"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: 60 ppo cases match torch"* ]]
    # the fixture exercises every branch: clipped ratios, the dual clip, clipped values, the k3 clamp
    [ "$(jq '[.actor[] | .pg_clipfrac_lower] | max' "$FIX/ppo/ppo_cases.json")" -gt 0 ]
    [ "$(jq '[.actor[] | .pg_clipfrac] | min' "$FIX/ppo/ppo_cases.json")" -gt 0 ]
    [ "$(jq '[.critic[] | .vf_clipfrac] | min' "$FIX/ppo/ppo_cases.json")" -gt 0 ]
    [ "$(jq '[.kl.k3[] | select(. == 10)] | length' "$FIX/ppo/ppo_cases.json")" -eq 1 ]
}

@test "ppo math: a wrong clip bound is caught (the check can fail)" {
    jq -c '.actor[1].clip_high = 0.2' "$FIX/ppo/ppo_cases.json" > "$BATS_TEST_TMPDIR/bad.json"
    run "$ROOT/build/tests/test_ppo_loss" "$BATS_TEST_TMPDIR/bad.json"
    [ "$status" -ne 0 ]
    [[ "$output" == *FAIL* ]]
}
