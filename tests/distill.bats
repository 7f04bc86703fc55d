#!/usr/bin/env bats
# tandem ppo --teacher: on-policy distillation (rlhf/distill.h). The teacher is a fifth role, frozen
# and forward-only; its logprobs at the temperature of the student's own samples give the per-token
# advantage term --distill-coef (teacher_lp - old_lp), the whole advantage without a reward, added
# to the estimator's with one. Models: stories260K (the student) and SHARP, stories260K with its
# final norm doubled: the same model at temperature 1/2 (tied embeddings: logits x 2), a teacher of
# the student's vocabulary and tokenizer that it can reach.
load helpers

setup_file() {
    [ -e "$ROOT/../shared/assets/models/stories260K-hf/config.json" ] || return 0
    local s="$ROOT/../shared/assets/models/stories260K-hf" d="$BATS_FILE_TMPDIR/sharp"
    mkdir -p "$d"
    cp "$s/config.json" "$s/tokenizer.model" "$d/"
    "$ROOT/.venv/bin/python" -c 'import sys
from safetensors.numpy import load_file, save_file
w = load_file(sys.argv[1] + "/model.safetensors")
w["model.norm.weight"] = w["model.norm.weight"] * 2
save_file(w, sys.argv[2] + "/model.safetensors", metadata={"format": "pt"})' "$s" "$d"
    export SHARP="$d"
}

# metric KEY FILE STEP: the value of KEY at STEP (1-based) of a metrics.jsonl
metric() { jq -r --arg k "$1" --argjson s "$3" 'select(.step == $s) | .[$k]' "$2"; }

@test "teacher == the student's starting weights: at step 1 every distillation advantage is exactly 0 (alone); with a reward, step 1 is the run without --teacher bit for bit" {
    need_story
    A=(--actor "$STORIES" --prompts "$TRAIN" --n-samples-per-prompt 2 --rollout-batch-size 4 --max-new-tokens 16 --steps 1
       --kl-coef 0 --actor-lr 1e-3)
    run timeout 120 "$TANDEM" ppo "${A[@]}" --teacher "$STORIES" --out "$BATS_TEST_TMPDIR/alone"
    [ "$status" -eq 0 ]
    m="$BATS_TEST_TMPDIR/alone/metrics.jsonl"
    # the advantage is the distillation term alone: all 0, so the loss and its gradient are exactly 0
    for k in actor/teacher_kl critic/advantages/mean actor/pg_loss actor/grad_norm; do
        [ "$(metric "$k" "$m" 1)" = 0 ] || { echo "$k = $(metric "$k" "$m" 1)"; false; }
    done
    awk -v l="$(metric response_length/mean "$m" 1)" 'BEGIN { exit !(l > 0) }'   # there were actions to be 0
    run timeout 120 "$TANDEM" ppo "${A[@]}" --advantage grpo --reward-cmd "$RULE" --out "$BATS_TEST_TMPDIR/rule"
    [ "$status" -eq 0 ]
    run timeout 120 "$TANDEM" ppo "${A[@]}" --advantage grpo --reward-cmd "$RULE" --teacher "$STORIES" --out "$BATS_TEST_TMPDIR/both"
    [ "$status" -eq 0 ]
    [ "$(metric actor/teacher_kl "$BATS_TEST_TMPDIR/both/metrics.jsonl" 1)" = 0 ]
    diff <(numbers "$BATS_TEST_TMPDIR/rule/metrics.jsonl") <(numbers "$BATS_TEST_TMPDIR/both/metrics.jsonl" | jq -c 'del(.["actor/teacher_kl"])')
    cmp <(cat "$BATS_TEST_TMPDIR"/rule/checkpoint-1/actor/*.safetensors) <(cat "$BATS_TEST_TMPDIR"/both/checkpoint-1/actor/*.safetensors)
}

@test "the advantage: alone it is -coef x the reverse KL estimate per token; with grpo it is grpo's plus that term" {
    need_story
    A=(--actor "$STORIES" --prompts "$TRAIN" --n-samples-per-prompt 2 --rollout-batch-size 4 --max-new-tokens 16 --steps 1
       --kl-coef 0)
    D=(--teacher "$SHARP" --distill-coef 0.5)
    run timeout 120 "$TANDEM" ppo "${A[@]}" "${D[@]}" --out "$BATS_TEST_TMPDIR/alone"
    [ "$status" -eq 0 ]
    m="$BATS_TEST_TMPDIR/alone/metrics.jsonl"
    kl=$(metric actor/teacher_kl "$m" 1); adv=$(metric critic/advantages/mean "$m" 1)
    echo "alone: teacher_kl $kl, advantages/mean $adv"
    # adv_t = 0.5 (teacher_lp - old_lp): its mean is -0.5 x the mean of (old_lp - teacher_lp), the same
    # sum scaled by a power of two; the two are printed to 9 digits, so they agree to 1e-8 relative
    awk -v k="$kl" -v a="$adv" 'BEGIN { d = a + 0.5 * k; if (d < 0) d = -d; exit !(k > 0.05 && d <= 1e-8 * k) }'
    # the same samples (step 1: the same weights and seeds) with the rule's grpo advantage: the mean
    # advantage moves by exactly the distillation term's mean (doubles: 1e-9 relative of the 9 digits)
    run timeout 120 "$TANDEM" ppo "${A[@]}" --advantage grpo --reward-cmd "$RULE" --out "$BATS_TEST_TMPDIR/rule"
    [ "$status" -eq 0 ]
    run timeout 120 "$TANDEM" ppo "${A[@]}" "${D[@]}" --advantage grpo --reward-cmd "$RULE" --out "$BATS_TEST_TMPDIR/both"
    [ "$status" -eq 0 ]
    r=$(metric critic/advantages/mean "$BATS_TEST_TMPDIR/rule/metrics.jsonl" 1)
    b=$(metric critic/advantages/mean "$BATS_TEST_TMPDIR/both/metrics.jsonl" 1)
    k2=$(metric actor/teacher_kl "$BATS_TEST_TMPDIR/both/metrics.jsonl" 1)
    echo "grpo: advantages/mean $r; with the teacher $b; teacher_kl $k2"
    [ "$k2" = "$kl" ]
    [ "$(metric critic/score/mean "$BATS_TEST_TMPDIR/rule/metrics.jsonl" 1)" = "$(metric critic/score/mean "$BATS_TEST_TMPDIR/both/metrics.jsonl" 1)" ]
    awk -v r="$r" -v b="$b" -v k="$kl" 'BEGIN { d = b - (r - 0.5 * k); if (d < 0) d = -d; exit !(d <= 1e-8) }'
}

# reverse_kl STUDENT OUT: the student's mean reverse KL to SHARP per token on its own samples of the
# held-out prompts (2 each, seed 7): step 1 of a distillation run, whose metrics come before any update
reverse_kl() {
    "$TANDEM" ppo --actor "$1" --teacher "$SHARP" --prompts "$PF/story_prompts_val.jsonl" --out "$2" --rollout-batch-size 48 \
        --n-samples-per-prompt 2 --max-new-tokens 16 --steps 1 --kl-coef 0 --seed 7 2>/dev/null
    metric actor/teacher_kl "$2/metrics.jsonl" 1
}

@test "learning: the student's reverse KL to the teacher on held-out prompts falls; the teacher on ranks of its own (dp 2) gives the same numbers and weights as one process, at tp 2 the same KL to rounding" {
    need_story
    A=(--actor "$STORIES" --teacher "$SHARP" --prompts "$TRAIN" --n-samples-per-prompt 2 --rollout-batch-size 16
       --max-new-tokens 16 --steps 10 --kl-coef 0 --actor-lr 3e-4)
    run timeout 300 "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/one" --save-every 3
    [ "$status" -eq 0 ]
    [ "$(jq -s 'map(.rollout_logprob_diff_max) | unique' -c "$BATS_TEST_TMPDIR/one/metrics.jsonl")" = "[0]" ]
    before=$(reverse_kl "$STORIES" "$BATS_TEST_TMPDIR/m0"); after=$(reverse_kl "$BATS_TEST_TMPDIR/one/checkpoint-10/actor" "$BATS_TEST_TMPDIR/m1")
    echo "held-out reverse KL to the teacher: $before -> $after; per step: $(jq -r '.["actor/teacher_kl"]' "$BATS_TEST_TMPDIR/one/metrics.jsonl" | tr '\n' ' ')" >&3
    # measured 0.457 -> 0.332 (--seed 1234), 0.267 and 0.286 (--seed 1, 2): a fall by 27-42%; the test asks
    # a sixth. At --actor-lr 1e-3 the noise of 32 samples a step wins and the KL rises (0.45 -> 0.62)
    awk -v b="$before" -v a="$after" 'BEGIN { exit !(b > 0.3 && a < b * 5 / 6) }'
    # actor on rank 0, the teacher's group on ranks 1-2 at dp 2 (each chunk one replica's, the others'
    # zeros summed): its logprobs reach the actor's rank by the world broadcast, the same bits
    run_ranks 300 3 "$TANDEM" ppo "${A[@]:0:12}" --steps 3 --kl-coef 0 --actor-lr 3e-4 --out "$BATS_TEST_TMPDIR/three" --actor-ranks 1 --teacher-ranks 2
    [ "$status" -eq 0 ]
    [[ "$output" == *"actor ranks 0-0 (group actor, tp 1 pp 1 dp 1); teacher ranks 1-2 (group teacher, tp 1 pp 1 dp 2)"* ]]
    diff <(numbers "$BATS_TEST_TMPDIR/one/metrics.jsonl" | head -3) <(numbers "$BATS_TEST_TMPDIR/three/metrics.jsonl")
    cmp <(cat "$BATS_TEST_TMPDIR"/one/checkpoint-3/actor/*.safetensors) <(cat "$BATS_TEST_TMPDIR"/three/checkpoint-3/actor/*.safetensors)
    # the teacher at tp 2 on those ranks: its logits in another summation order, so the step's reverse
    # KL agrees to float rounding (1e-5 relative) rather than in every bit
    run_ranks 300 3 "$TANDEM" ppo "${A[@]:0:12}" --steps 1 --kl-coef 0 --out "$BATS_TEST_TMPDIR/tp" --actor-ranks 1 --teacher-ranks 2 --teacher-tp 2
    [ "$status" -eq 0 ]
    [[ "$output" == *"teacher ranks 1-2 (group teacher, tp 2 pp 1 dp 1)"* ]]
    k1=$(metric actor/teacher_kl "$BATS_TEST_TMPDIR/one/metrics.jsonl" 1); k2=$(metric actor/teacher_kl "$BATS_TEST_TMPDIR/tp/metrics.jsonl" 1)
    echo "teacher_kl at step 1: $k1 (one process), $k2 (teacher at tp 2)"
    awk -v a="$k1" -v b="$k2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * a) }'
}

@test "--resume with --teacher: 4 steps straight == 2, stop, resume 2 more (metrics and weights bit for bit), with a reward and alone; the placement saved names the teacher" {
    need_story
    for mode in alone rule; do
        A=(--actor "$STORIES" --teacher "$SHARP" --prompts "$TRAIN" --n-samples-per-prompt 2 --rollout-batch-size 4
           --max-new-tokens 16 --steps 4 --kl-coef 0 --actor-lr 3e-4 --distill-coef 0.7)
        [ $mode = alone ] || A+=(--advantage grpo --reward-cmd "$RULE" --kl-loss-coef 0.01)
        d="$BATS_TEST_TMPDIR/$mode"
        run timeout 120 "$TANDEM" ppo "${A[@]}" --out "$d/straight"
        [ "$status" -eq 0 ]
        run timeout 120 "$TANDEM" ppo "${A[@]}" --out "$d/split" --save-every 2 --stop-after 2
        [ "$status" -eq 0 ]
        [ "$(jq -r .placement "$d/split/checkpoint-2/ppo_state.json")" = "$([ $mode = alone ] && echo "actor@0+1:tp1:pp1,teacher@0+1:tp1:pp1" ||
            echo "actor@0+1:tp1:pp1,ref@0+1:tp1:pp1,teacher@0+1:tp1:pp1")" ]
        run timeout 120 "$TANDEM" ppo "${A[@]}" --out "$d/split" --resume "$d/split/checkpoint-2"
        [ "$status" -eq 0 ]
        [[ "$output" != *"another placement"* ]]
        diff <(numbers "$d/straight/metrics.jsonl") <(numbers "$d/split/metrics.jsonl")
        cmp <(cat "$d"/straight/checkpoint-4/actor/*.safetensors) <(cat "$d"/split/checkpoint-4/actor/*.safetensors)
        # the teacher is not trained, so not checkpointed
        [ ! -e "$d/split/checkpoint-4/teacher" ]
    done
}

@test "--teacher: senseless combinations and another vocabulary or tokenizer are one line each" {
    need_story
    A=(--actor "$STORIES" --prompts "$TRAIN" --n-samples-per-prompt 2 --rollout-batch-size 2 --steps 1 --out "$BATS_TEST_TMPDIR/x")
    run timeout 60 "$TANDEM" ppo "${A[@]}" --teacher "$FIX/models/llama_gqa"
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --teacher $FIX/models/llama_gqa: vocabulary of 128 tokens, the actor's has 512: the roles must share the actor's tokenizer" ]
    # the same vocabulary size, another tokenizer
    mkdir "$BATS_TEST_TMPDIR/tok"
    cp "$SHARP"/config.json "$SHARP"/model.safetensors "$BATS_TEST_TMPDIR/tok/"
    { cat "$SHARP/tokenizer.model"; printf x; } > "$BATS_TEST_TMPDIR/tok/tokenizer.model"
    run timeout 60 "$TANDEM" ppo "${A[@]}" --teacher "$BATS_TEST_TMPDIR/tok"
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --teacher $BATS_TEST_TMPDIR/tok: its tokenizer.model differs from the actor's: the roles must share the actor's tokenizer" ]
    # aidreams260K: 512 tokens too, but its own tokenizer, which its directory does not hold
    run timeout 60 "$TANDEM" ppo "${A[@]}" --teacher "$ASSETS/models/aidreams260K-hf"
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --teacher $ASSETS/models/aidreams260K-hf: no tokenizer.model beside the actor's: cannot check that it reads the actor's token ids" ]
    # under mpirun, the teacher on a rank of its own: every rank exits, one line
    run timeout 60 $MPIRUN 2 "$TANDEM" ppo "${A[@]}" --teacher "$BATS_TEST_TMPDIR/tok" --actor-ranks 1 --teacher-ranks 1
    [ "$status" -ne 0 ]; [ "${lines[-1]}" = "tandem: --teacher $BATS_TEST_TMPDIR/tok: its tokenizer.model differs from the actor's: the roles must share the actor's tokenizer" ]
    [ "$(grep -c '^tandem: ' <<<"$output")" -eq 1 ]
    # a score-head model
    mkdir "$BATS_TEST_TMPDIR/score"
    cp "$SHARP"/tokenizer.model "$BATS_TEST_TMPDIR/score/"
    jq '.architectures = ["LlamaForSequenceClassification"] | .num_labels = 1' "$SHARP/config.json" > "$BATS_TEST_TMPDIR/score/config.json"
    run timeout 60 "$TANDEM" ppo "${A[@]}" --teacher "$BATS_TEST_TMPDIR/score"
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --teacher $BATS_TEST_TMPDIR/score: a score-head model; the teacher is a causal LM" ]
    run timeout 60 "$TANDEM" ppo "${A[@]}" --teacher "$BATS_TEST_TMPDIR/nope"
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --teacher $BATS_TEST_TMPDIR/nope: not a directory" ]
    why="with --teacher and no reward the advantage is the distillation term alone (give --reward, --reward-cmd or --reward-url to add one)"
    run timeout 60 "$TANDEM" ppo "${A[@]}" --teacher "$SHARP" --critic "$STORIES"
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --critic $STORIES: no reward for it to learn values of: $why" ]
    for adv in gae grpo rloo; do
        run timeout 60 "$TANDEM" ppo "${A[@]}" --teacher "$SHARP" --advantage $adv
        [ "$status" -ne 0 ]; [ "$output" = "tandem: --advantage $adv: no reward to estimate an advantage of: $why" ]
    done
    for f in "--missing-eos-penalty 1" "--reward-clip 2" --normalize-reward; do
        run timeout 60 "$TANDEM" ppo "${A[@]}" --teacher "$SHARP" $f
        [ "$status" -ne 0 ]; [ "$output" = "tandem: ppo: --normalize-reward, --reward-clip, --missing-eos-penalty and --overlong-buffer shape a reward: $why" ]
    done
    for c in 0 -1 1e+07; do
        run timeout 60 "$TANDEM" ppo "${A[@]}" --teacher "$SHARP" --distill-coef $c
        [ "$status" -ne 0 ]; [ "$output" = "tandem: --distill-coef $c: must be in (0, 1e6]: the weight of the teacher's per-token term" ]
    done
    run timeout 60 "$TANDEM" ppo "${A[@]}" --advantage grpo --reward-cmd "$RULE" --distill-coef 0.5
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --distill-coef 0.5: without --teacher there is no distillation term" ]
    run timeout 60 "$TANDEM" ppo "${A[@]}" --advantage grpo --reward-cmd "$RULE" --teacher-ranks 1
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --teacher-ranks 1: this run has no teacher" ]
    # neither a reward nor a teacher: the message of old
    run timeout 60 "$TANDEM" ppo "${A[@]}"
    [ "$status" -ne 0 ]; [ "$output" = "tandem: ppo: give exactly one of --reward DIR, --reward-cmd CMD, --reward-url URL[,URL...] and --reward-fn NAME (or none with --teacher)" ]
    [ ! -e "$BATS_TEST_TMPDIR/x" ]
}

@test "the teacher's logprobs against transformers: one-token responses, so actor/teacher_kl is a Monte Carlo estimate of the exact reverse KL at the prompts' next token (T 0.8)" {
    need_story
    need_hfpy
    head -8 "$TRAIN" | jq -c '{text: .prompt}' | "$TANDEM" tokenize --tokenizer "$STORIES" --jsonl | jq -c '{input_ids}' > "$BATS_TEST_TMPDIR/p.jsonl"
    # all 8 prompts x 256 samples of one token each, before any update
    run timeout 120 "$TANDEM" ppo --actor "$STORIES" --teacher "$SHARP" --prompts "$BATS_TEST_TMPDIR/p.jsonl" --out "$BATS_TEST_TMPDIR/o" \
        --rollout-batch-size 8 --n-samples-per-prompt 256 --max-new-tokens 1 --temperature 0.8 --steps 1 --kl-coef 0
    [ "$status" -eq 0 ]
    est=$(metric actor/teacher_kl "$BATS_TEST_TMPDIR/o/metrics.jsonl" 1)
    run timeout 120 "$HFPY" "$FIX/ppo/teacher_kl.py" "$STORIES" "$SHARP" 0.8 "$BATS_TEST_TMPDIR/p.jsonl"
    [ "$status" -eq 0 ]
    kl=$(jq .kl <<<"$output"); var=$(jq .var <<<"$output")
    echo "teacher_kl $est; exact $kl, one-sample variance $var" >&3
    # the estimate's standard error: sqrt(var / 2048) = 0.030 (8 prompts x 256 samples, each prompt
    # weighing 1/8); the test allows 4 of them (0.12). The teacher at temperature 1 instead of 0.8 would
    # give 0.197 (exact, same script), its logprobs one position early 21.5, the sign flipped -0.42
    awk -v e="$est" -v k="$kl" -v v="$var" 'BEGIN { d = e - k; if (d < 0) d = -d; exit !(k > 0.1 && d <= 4 * sqrt(v / 2048)) }'
}

@test "--teacher: GSPO (a sequence ratio) with the per-token distillation term, and --overlong-buffer with no reward, are one line each" {
    need_story
    A=(--actor "$STORIES" --teacher "$SHARP" --prompts "$TRAIN" --n-samples-per-prompt 2 --rollout-batch-size 2 --steps 1
       --out "$BATS_TEST_TMPDIR/x")
    run timeout 60 "$TANDEM" ppo "${A[@]}" --policy-loss gspo
    [ "$status" -ne 0 ]; [ "$output" = "tandem: --policy-loss gspo: --teacher adds a per-token advantage (the distillation term); GSPO's ratio is a sequence's" ]
    run timeout 60 "$TANDEM" ppo "${A[@]}" --policy-loss gspo --advantage grpo --reward-cmd "$RULE"
    [ "$status" -ne 0 ]; [[ "$output" == "tandem: --policy-loss gspo: --teacher adds a per-token advantage"* ]]
    run timeout 60 "$TANDEM" ppo "${A[@]}" --overlong-buffer 4
    [ "$status" -ne 0 ]; [[ "$output" == "tandem: ppo: --normalize-reward, --reward-clip, --missing-eos-penalty and --overlong-buffer shape a reward: "* ]]
    [ ! -e "$BATS_TEST_TMPDIR/x/checkpoint-1" ]
}
