#!/usr/bin/env bats
# Sampler (generate/sampler.c): logits processors in HF's order (repetition -> presence/frequency ->
# temperature -> top-k -> top-p -> min-p) and a counter-based draw. Oracle: transformers 4.47's
# processors (fixtures written by tests/fixtures/sampler/make_sampler_fixtures.py); the draw is
# checked by its statistics, never by comparing random streams with another library.
load helpers

TS="$ROOT/build/tests/test_sampler"

# sampler_check EXPECTED ARGS...: runs test_sampler ARGS; it must exit 0 and print EXPECTED
sampler_check() {
    local want=$1
    shift
    run "$TS" "$@"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"$want"* ]]
}

@test "sampler: 29 processor cases match transformers 4.47 (finite entries within 1e-6, -inf exactly)" {
    sampler_check "ok: 29/29 cases match transformers" fixtures "$FIX/sampler/cases.json"
}

@test "sampler: top-p's partial sort (V > 1024) equals a full stable sort on tie-heavy rows" {
    sampler_check "ok: top-p with a partial sort equals a full stable sort" topp_ties
}

@test "sampler: draw frequencies match the processed softmax (chi-square, 0.999 quantile)" {
    sampler_check "ok: draw frequencies match" chisq
}

@test "sampler: the chi-square check rejects a wrong distribution and a biased draw" {
    sampler_check "ok: wrong distributions are rejected" negative
}

@test "sampler: a token is a pure function of (seed, step); different seeds differ" {
    sampler_check "ok: tokens are a pure function of (seed, step)" determinism
}

@test "sampler: sampler_uniform is uniform over steps and over seeds" {
    run "$TS" uniform
    echo "$output"
    [ "$status" -eq 0 ]
}

@test "sampler: temperature 0 (or < 1e-5) is argmax with lowest id on ties, after penalties only; non-finite rows refused" {
    sampler_check "ok: greedy is argmax" greedy
}

@test "sampler: sampling_params_check rejects bad fields (NaN too) and names them" {
    sampler_check "ok: 19 invalid params rejected" check
}

@test "sampler: fixture generator is present and the fixtures are small" {
    [ -f "$FIX/sampler/make_sampler_fixtures.py" ]
    [ "$(stat -c %s "$FIX/sampler/cases.json")" -lt 300000 ]
}
