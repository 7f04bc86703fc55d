#!/usr/bin/env bats
# tandem ppo's DAPO-era sampling and shaping and its per-sample records, on stories260K with
# reward programs under tests/fixtures/ppo: --dynamic-sampling (groups of equal rewards dropped and
# redrawn, the cap), --overlong-buffer (verl's formula against the dump's lengths), --mask-truncated
# (the first update's gradient norm against a torch transcription over the dump), --dump-rollouts
# (training == behaviour logprobs on the first mini-batch, at dp 2 and pp 2 too), --resume bit for
# bit with all of them, and their refusals.
# The split rule (split_reward.py): prompts whose first letter is in A-L score 0.5 whatever the
# response (their groups are dropped); the others crc32(response) % 1000 / 1000.
load helpers

SPLIT="python3 -u $FIX/ppo/split_reward.py"
base() {
    A=(--actor "$STORIES" --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 4 --rollout-batch-size 4
       --max-new-tokens 16 --actor-lr 3e-4 --kl-coef 0)
}
# dot: the "." token, a stop id that ends some responses before --max-new-tokens
dot() { jq -cn '{text: "He."}' | "$TANDEM" tokenize --tokenizer "$STORIES" --jsonl --no-bos | jq '.input_ids[-1]'; }

@test "--dynamic-sampling drops the groups of equal rewards, redraws until the batch is full, and is deterministic; draws and drop fraction in the metrics agree with what the reward program saw" {
    need_story
    base
    for r in a b; do
        run timeout 120 "$TANDEM" ppo "${A[@]}" --reward-cmd "tee -a $BATS_TEST_TMPDIR/seen_$r.jsonl | $SPLIT" --steps 3 \
            --dynamic-sampling --out "$BATS_TEST_TMPDIR/$r" --dump-rollouts "$BATS_TEST_TMPDIR/$r.jsonl"
        [ "$status" -eq 0 ]
    done
    echo "$output" | grep '^step'
    # two runs: the same dump and numbers, bit for bit
    cmp "$BATS_TEST_TMPDIR/a.jsonl" "$BATS_TEST_TMPDIR/b.jsonl"
    diff <(numbers "$BATS_TEST_TMPDIR/a/metrics.jsonl") <(numbers "$BATS_TEST_TMPDIR/b/metrics.jsonl")
    M="$BATS_TEST_TMPDIR/a/metrics.jsonl" D="$BATS_TEST_TMPDIR/a.jsonl"
    # every step trained 4 groups of 4, none of them of equal rewards, none from an A-L prompt
    [ "$(jq -s 'group_by(.step) | map(length) | unique' -c "$D")" = "[16]" ]
    jq -s -e 'group_by([.step, (.sample / 4 | floor)]) | map(map(.score_raw) | unique | length > 1) | all' "$D"
    jq -s -e --slurpfile p <(jq -c .prompt "$TRAIN") 'map($p[.prompt_line - 1][0:1] | ascii_upcase | . >= "A" and . <= "L") | any | not' "$D"
    [ "$(jq -s 'map(.["dynamic_sampling/filled_groups"]) | unique' -c "$M")" = "[0]" ]
    # the program saw draws x 4 x 4 samples; its A-L groups are the dropped ones (their share of the groups drawn)
    draws=$(jq -s 'map(.["dynamic_sampling/num_gen_batches"]) | add' "$M")
    dropped=$(jq -s 'map(.["dynamic_sampling/drop_fraction"] * .["dynamic_sampling/num_gen_batches"] * 4) | add | round' "$M")
    seen=$(jq -s length "$BATS_TEST_TMPDIR/seen_a.jsonl")
    al=$(jq -s 'map(.prompt | ltrimstr(" ")[0:1] | ascii_upcase | select(. >= "A" and . <= "L")) | length / 4' "$BATS_TEST_TMPDIR/seen_a.jsonl")
    echo "draws $draws, samples scored $seen, A-L groups $al, dropped $dropped" >&3
    [ "$seen" -eq $((draws * 16)) ]
    [ "$dropped" -eq "$al" ] && [ "$dropped" -gt 0 ] && [ "$draws" -gt 3 ]
    # draw 0 is the step's own prompts and samples: step 1's kept groups of draw 0 are a plain run's
    run timeout 120 "$TANDEM" ppo "${A[@]}" --reward-cmd "$SPLIT" --steps 1 --out "$BATS_TEST_TMPDIR/plain" --dump-rollouts "$BATS_TEST_TMPDIR/plain.jsonl"
    [ "$status" -eq 0 ]
    key='select(.step == 1 and .draw == 0) | [.prompt_line, .response_ids, .behaviour_logprobs]'
    [ -n "$(jq -c "$key" "$D")" ]
    diff <(jq -c "$key" "$D") <(jq -c "$key" "$BATS_TEST_TMPDIR/plain.jsonl" | grep -F -f <(jq -c "$key" "$D"))
}

@test "--dynamic-sampling at the cap (--max-sample-draws 2, every reward equal): the batch is filled with the dropped groups in draw order, i.e. the plain run's, and the metrics say so" {
    need_story
    base
    run timeout 120 "$TANDEM" ppo "${A[@]}" --reward-cmd "$SPLIT --all-equal" --steps 2 --dynamic-sampling --max-sample-draws 2 \
        --out "$BATS_TEST_TMPDIR/cap" --dump-rollouts "$BATS_TEST_TMPDIR/cap.jsonl"
    [ "$status" -eq 0 ]
    [[ "$output" == *"| 2 draw(s), 8 of 8 groups dropped, 4 refilled"* ]]
    jq -s -e 'map(.["dynamic_sampling/num_gen_batches"] == 2 and .["dynamic_sampling/drop_fraction"] == 1 and .["dynamic_sampling/filled_groups"] == 4) | all' "$BATS_TEST_TMPDIR/cap/metrics.jsonl"
    run timeout 120 "$TANDEM" ppo "${A[@]}" --reward-cmd "$SPLIT --all-equal" --steps 2 --out "$BATS_TEST_TMPDIR/plain" \
        --dump-rollouts "$BATS_TEST_TMPDIR/plain.jsonl"
    [ "$status" -eq 0 ]
    cmp "$BATS_TEST_TMPDIR/cap.jsonl" "$BATS_TEST_TMPDIR/plain.jsonl"
    diff <(numbers "$BATS_TEST_TMPDIR/plain/metrics.jsonl") <(numbers "$BATS_TEST_TMPDIR/cap/metrics.jsonl" | jq -c 'with_entries(select(.key | startswith("dynamic_sampling/") | not))')
}

@test "--overlong-buffer: each sample's penalty is verl's min(-(n - (Lmax - L)) / L * F, 0) on the dump's lengths, added to its reward; the metrics' mean is the dump's" {
    need_story
    base
    run timeout 120 "$TANDEM" ppo "${A[@]}" --reward-cmd "$SPLIT" --steps 2 --stop-token-ids "$(dot)" --overlong-buffer 6 \
        --overlong-penalty 0.5 --missing-eos-penalty 0.25 --out "$BATS_TEST_TMPDIR/o" --dump-rollouts "$BATS_TEST_TMPDIR/o.jsonl"
    [ "$status" -eq 0 ]
    D="$BATS_TEST_TMPDIR/o.jsonl"
    # the same operations in the same order in double (n - 10 exact, one division, * 0.5 exact): equal bits
    jq -s -e 'map((.response_ids | length) as $n | ([-($n - (16 - 6)) / 6 * 0.5, 0] | min) == .overlong_penalty) | all' "$D"
    jq -s -e 'map(.missing_eos_penalty == (if .finish == "stop" then 0 else -0.25 end)
                  and .reward == .score_raw + .overlong_penalty + .missing_eos_penalty) | all' "$D"
    # both sides of the buffer were sampled: penalised and free responses
    jq -s -e 'map(.overlong_penalty < 0) | any' "$D"; jq -s -e 'map(.overlong_penalty == 0) | any' "$D"
    for s in 1 2; do
        want=$(jq -s --argjson s $s 'map(select(.step == $s)) | (map(.overlong_penalty) | add / length), (map(select(.overlong_penalty < 0)) | length / 16)' "$D" | paste -sd' ')
        got=$(jq -r --argjson s $s 'select(.step == $s) | "\(.["critic/overlong_penalty/mean"]) \(.["response_length/overlong_ratio"])"' "$BATS_TEST_TMPDIR/o/metrics.jsonl")
        awk -v w="$want" -v g="$got" 'BEGIN { split(w, a, " "); split(g, b, " "); d = a[1] - b[1]; exit !(d < 1e-8 && d > -1e-8 && a[2] == b[2]) }'
    done
}

@test "--mask-truncated: truncated samples weigh 0 and leave the token mean's count; their rewards stay in the group statistics (torch: advantages and the first update's gradient norm)" {
    need_story
    need_hfpy
    base
    run timeout 120 "$TANDEM" ppo "${A[@]}" --reward-cmd "$SPLIT" --steps 1 --stop-token-ids "$(dot)" --mask-truncated --clip 0 \
        --out "$BATS_TEST_TMPDIR/m" --dump-rollouts "$BATS_TEST_TMPDIR/m.jsonl"
    [ "$status" -eq 0 ]
    D="$BATS_TEST_TMPDIR/m.jsonl"
    jq -s -e 'map((.loss_mask | unique) == (if .finish == "stop" then [1] else [0] end)) | all' "$D"
    run timeout 120 "$HFPY" "$FIX/ppo/dump_grad_ref.py" "$STORIES" "$D" 4
    echo "$output"
    [ "$status" -eq 0 ]
    ref="$output"
    gn=$(jq '.["actor/grad_norm"]' "$BATS_TEST_TMPDIR/m/metrics.jsonl")
    echo "grad norm: tandem $gn, torch $(jq .grad_norm <<<"$ref") (masked), $(jq .grad_norm_all <<<"$ref") (truncated samples in the loss)" >&3
    # a batch with both kinds; advantages: GRPO over all 4 samples of each group (to the printed 17 digits)
    jq -e '.truncated > 0 and .stopped > 0 and .adv_max_err < 1e-12' <<<"$ref"
    # fp32 forwards and backwards in both, summed in other orders: logprobs within 1e-4 (|lp| < 20,
    # a few ulps of the logits' log-sum-exp), the norm of ~260K fp32 gradients within 1e-4 relative;
    # the unmasked norm is far outside that
    jq -e --argjson gn "$gn" '.lp_max_err < 1e-4 and (($gn - .grad_norm) | fabs) < 1e-4 * .grad_norm
                              and (($gn - .grad_norm_all) | fabs) > 1e-2 * .grad_norm' <<<"$ref"
}

@test "--mask-truncated with every response truncated: the first update changes no weight (as one whose rewards are all equal: zero gradient, fresh Adam); without it the weights move" {
    need_story
    base
    for m in on off equal; do
        flag=(--reward-cmd "$SPLIT"); [ $m = on ] && flag+=(--mask-truncated); [ $m = equal ] && flag=(--reward-cmd "$SPLIT --all-equal")
        run timeout 120 "$TANDEM" ppo "${A[@]}" "${flag[@]}" --steps 1 --max-new-tokens 4 --out "$BATS_TEST_TMPDIR/$m" --dump-rollouts "$BATS_TEST_TMPDIR/$m.jsonl"
        [ "$status" -eq 0 ]
    done
    jq -s -e 'map(.finish == "length") | all' "$BATS_TEST_TMPDIR/on.jsonl"
    [ "$(jq '.["actor/grad_norm"]' "$BATS_TEST_TMPDIR/on/metrics.jsonl")" = 0 ]
    [ "$(jq '.["actor/grad_norm"]' "$BATS_TEST_TMPDIR/off/metrics.jsonl")" != 0 ]
    cmp <(cat "$BATS_TEST_TMPDIR"/equal/checkpoint-1/actor/*.safetensors) <(cat "$BATS_TEST_TMPDIR"/on/checkpoint-1/actor/*.safetensors)
    ! cmp -s <(cat "$BATS_TEST_TMPDIR"/equal/checkpoint-1/actor/*.safetensors) <(cat "$BATS_TEST_TMPDIR"/off/checkpoint-1/actor/*.safetensors)
}

@test "--dump-rollouts: one line per sample and step with the prompt's id and line; training == behaviour logprobs exactly on the first mini-batch (2 mini-batches, 2 epochs; and at dp 2, at pp 2)" {
    need_story
    base
    jq -c '. + {id: ("p\(input_line_number)")}' "$TRAIN" > "$BATS_TEST_TMPDIR/ids.jsonl"
    B=("${A[@]/$TRAIN/$BATS_TEST_TMPDIR/ids.jsonl}" --reward-cmd "$SPLIT" --actor-lr 3e-3)
    run timeout 120 "$TANDEM" ppo "${B[@]}" --steps 2 --mini-batch-size 8 --ppo-epochs 2 --out "$BATS_TEST_TMPDIR/one" --dump-rollouts "$BATS_TEST_TMPDIR/one.jsonl"
    [ "$status" -eq 0 ]
    D="$BATS_TEST_TMPDIR/one.jsonl"
    [ "$(jq -s 'map([.step, .sample])' -c "$D")" = "$(jq -nc '[range(1; 3) as $s | range(16) | [$s, .]]')" ]
    jq -s -e 'map(.prompt_id == "p\(.prompt_line)" and (.response_ids | length) == (.behaviour_logprobs | length)
                  and (.training_logprobs | length) == (.response_ids | length) and (.advantages | length) == (.response_ids | length)) | all' "$D"
    # per step: the 8 sequences of the first mini-batch equal bit for bit, the second's (after an update) not
    [ "$(jq -s -c 'group_by(.step) | map(map(select(.training_logprobs == .behaviour_logprobs)) | length)' "$D")" = "[8,8]" ]
    # the prompt's tokens are the tokenizer's of its line's text
    line=$(jq 'select(.step == 1 and .sample == 0) | .prompt_line' "$D")
    [ "$(jq -c 'select(.step == 1 and .sample == 0) | .prompt_ids' "$D")" = "$(sed -n "${line}p" "$TRAIN" | jq -c '{text: .prompt}' | "$TANDEM" tokenize --tokenizer "$STORIES" --jsonl | jq -c .input_ids)" ]
    for l in "dp:" "pp:--actor-pp 2"; do
        run timeout 120 $MPIRUN 2 "$TANDEM" ppo "${B[@]}" ${l#*:} --steps 1 --out "$BATS_TEST_TMPDIR/${l%%:*}" --dump-rollouts "$BATS_TEST_TMPDIR/${l%%:*}.jsonl"
        [ "$status" -eq 0 ]
        [ "$(jq -s 'length' "$BATS_TEST_TMPDIR/${l%%:*}.jsonl")" -eq 16 ]
        jq -s -e 'map(.training_logprobs == .behaviour_logprobs and (.training_logprobs | length) > 0) | all' "$BATS_TEST_TMPDIR/${l%%:*}.jsonl"
    done
}

@test "--resume with --dynamic-sampling, --overlong-buffer, --mask-truncated and --dump-rollouts: 4 steps straight == 2, a killed step 3, resume from 2 (metrics, weights and the dump bit for bit)" {
    need_story
    base
    A+=(--reward-cmd "$SPLIT" --steps 4 --dynamic-sampling --overlong-buffer 4 --mask-truncated --stop-token-ids "$(dot)" --lr-schedule cosine)
    run timeout 120 "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/straight" --dump-rollouts "$BATS_TEST_TMPDIR/straight.jsonl"
    [ "$status" -eq 0 ]
    # the first part runs past its checkpoint (step 3's lines in the dump), as a run killed after it would
    run timeout 120 "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/split" --save-every 2 --stop-after 3 --dump-rollouts "$BATS_TEST_TMPDIR/split.jsonl"
    [ "$status" -eq 0 ]
    [ "$(jq -s 'map(.step) | max' "$BATS_TEST_TMPDIR/split.jsonl")" -eq 3 ]
    printf '{"step": 4, "sample": 0, "cut' >> "$BATS_TEST_TMPDIR/split.jsonl"
    run timeout 120 "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/split" --resume "$BATS_TEST_TMPDIR/split/checkpoint-2" --dump-rollouts "$BATS_TEST_TMPDIR/split.jsonl"
    [ "$status" -eq 0 ]
    cmp "$BATS_TEST_TMPDIR/straight.jsonl" "$BATS_TEST_TMPDIR/split.jsonl"
    diff <(numbers "$BATS_TEST_TMPDIR/straight/metrics.jsonl") <(numbers "$BATS_TEST_TMPDIR/split/metrics.jsonl")
    cmp <(cat "$BATS_TEST_TMPDIR"/straight/checkpoint-4/actor/*.safetensors) <(cat "$BATS_TEST_TMPDIR"/split/checkpoint-4/actor/*.safetensors)
    jq -s -e 'map(.["dynamic_sampling/num_gen_batches"]) | add > 4' "$BATS_TEST_TMPDIR/straight/metrics.jsonl"
}

@test "ppo: --dynamic-sampling, --max-sample-draws, --overlong-buffer, --overlong-penalty and --dump-rollouts refused with one line when they make no sense" {
    need_story
    base
    A+=(--reward-cmd "$SPLIT" --steps 1 --out "$BATS_TEST_TMPDIR/x")
    check() {
        run timeout 60 "$TANDEM" ppo "${A[@]}" "${@:2}"
        [ "$status" -ne 0 ] && [ "${lines[-1]}" = "tandem: $1" ] && [ "$(grep -c '^tandem: ' <<<"$output")" -eq 1 ] || { echo "$output"; false; }
    }
    check "--dynamic-sampling needs --n-samples-per-prompt >= 2 (a group of one sample always has equal rewards)" --dynamic-sampling --n-samples-per-prompt 1
    check "--dynamic-sampling needs --advantage grpo, rloo or reinforce++-baseline (it drops groups whose equal rewards give them no group advantage; gae's come from a critic, reinforce++'s from returns)" \
        --dynamic-sampling --advantage gae --critic "$STORIES"
    check "--dynamic-sampling needs --advantage grpo, rloo or reinforce++-baseline (it drops groups whose equal rewards give them no group advantage; gae's come from a critic, reinforce++'s from returns)" \
        --dynamic-sampling --advantage reinforce++
    check "--max-sample-draws: only with --dynamic-sampling" --max-sample-draws 3
    check "--max-sample-draws 0: must be >= 1" --dynamic-sampling --max-sample-draws 0
    check "--overlong-buffer 0: must be in [1, --max-new-tokens 16) (the penalty grows over the last L tokens)" --overlong-buffer 0
    check "--overlong-buffer 16: must be in [1, --max-new-tokens 16) (the penalty grows over the last L tokens)" --overlong-buffer 16
    check "--overlong-buffer -2: must be in [1, --max-new-tokens 16) (the penalty grows over the last L tokens)" --overlong-buffer -2
    check "--overlong-penalty -0.5: must be >= 0" --overlong-buffer 4 --overlong-penalty -0.5
    check "--overlong-penalty: only with --overlong-buffer" --overlong-penalty 2
    check "--dump-rollouts $BATS_TEST_TMPDIR: not a file name" --dump-rollouts "$BATS_TEST_TMPDIR"
    check "--dump-rollouts /nonexistent/d.jsonl: its directory /nonexistent does not exist" --dump-rollouts /nonexistent/d.jsonl
    [ ! -e "$BATS_TEST_TMPDIR/x/checkpoint-1" ]
}
