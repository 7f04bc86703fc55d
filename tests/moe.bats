#!/usr/bin/env bats
# Mixture-of-Experts models (Mixtral, Qwen2-MoE, Qwen3-MoE; runtime/moe.c): logprobs and greedy
# against transformers' own classes (tests/fixtures/moe/make_moe_refs.py), the same bits at every
# tp x pp layout, batch invariance (dropless routing: a token's output never depends on the batch),
# bf16, and the one-line refusals of what is not supported yet.
load helpers

MOE="mixtral_tiny qwen2_moe_tiny qwen3_moe_tiny"

# fp32 against HF (fp32 both sides), limit 1e-4 as tests/eval.bats: a logprob is a chain of dot
# products of <= 64 terms (D; the experts' 32-48) per matmul and a softmax over 128 logits of
# magnitude <= ~20; with fp32's unit roundoff u = 6e-8 a different summation order (Tandem's fixed
# trees against torch's BLAS, the experts' outputs combined by rank here and by expert id in HF)
# moves a logprob by at most ~n u |x| = 64 x 6e-8 x 20 = 8e-5 and typically ~sqrt(n) u |x| = 1e-5.
# The routing is exact: every fixture's smallest top-k margin is >= 1.6e-4 (the fixtures' report),
# three orders above what rounding can move a probability, so both route every token alike.
@test "moe: eval equals transformers' Mixtral / Qwen2-MoE / Qwen3-MoE (logprobs <= 1e-4, greedy exact)" {
    for f in $MOE; do
        run "$TANDEM" eval --dtype fp32 --model "$FIX/models/$f" --reference "$FIX/refs/$f.jsonl" --max-logprob-diff 1e-4 --quiet
        echo "$f: $output"
        [ "$status" -eq 0 ]
        grep '^{"records"' <<<"$output" | jq -e '.pass and .greedy_mismatches == 0 and .greedy_tokens == 32' >/dev/null
    done
}

# The router is replicated and the experts' down outputs are tp-summed by the fixed tree before the
# combine (runtime/moe.c), so tp 2 x pp 2, tp 2 and tp 4 give 1x1's bits (limit 0).
@test "moe: tp 2 x pp 2, tp 2, tp 4 give the 1x1 run's logprobs bit for bit, greedy = HF" {
    for f in $MOE; do
        ref1="$BATS_TEST_TMPDIR/$f.1x1.jsonl"
        "$TANDEM" eval --dtype fp32 --model "$FIX/models/$f" --reference "$FIX/refs/$f.jsonl" --write-reference "$ref1" --quiet
        for l in "4 2 2" "2 2 1" "4 4 1"; do
            set -- $l
            run timeout 120 $MPIRUN $1 "$TANDEM" eval --dtype fp32 --model "$FIX/models/$f" --reference "$ref1" --tp $2 --pp $3 \
                --max-logprob-diff 0 --quiet
            echo "$f np=$1 tp=$2 pp=$3: $output"
            [ "$status" -eq 0 ]
            grep '^{"records"' <<<"$output" | jq -e --argjson tp $2 --argjson pp $3 \
                '.max_abs_logprob_diff == 0 and .greedy_mismatches == 0 and .tp == $tp and .pp == $pp' >/dev/null
        done
    done
}

# generate's paged KV cache path; the same prompts one at a time, all at once and at tp 2 x pp 2:
# the same tokens and logprobs, byte for byte (dropless routing, rows independent in every GEMM)
@test "moe: generate's greedy = HF; batch 1 == batch 64 == tp 2 x pp 2, logprobs included, fp32 and bf16" {
    for f in $MOE; do
        jq -c '{id, input_ids, max_new_tokens: (.greedy_ids | length)}' "$FIX/refs/$f.jsonl" > "$BATS_TEST_TMPDIR/p.jsonl"
        # prompts of several lengths sharing no batch structure: the references' and their prefixes
        jq -c '{id: (.id + "-h"), input_ids: .input_ids[0:(.input_ids | length / 2 | floor)], max_new_tokens: 6}' \
            "$FIX/refs/$f.jsonl" >> "$BATS_TEST_TMPDIR/p.jsonl"
        gen() { "$TANDEM" generate --model "$FIX/models/$f" --input "$BATS_TEST_TMPDIR/p.jsonl" --greedy --ignore-eos --logprobs 3 "$@" 2>/dev/null; }
        for dt in fp32 bf16; do
            gen --dtype $dt --output "$BATS_TEST_TMPDIR/b1.jsonl" --max-batch 1 --block-size 2
            gen --dtype $dt --output "$BATS_TEST_TMPDIR/b64.jsonl" --max-batch 64
            cmp "$BATS_TEST_TMPDIR/b1.jsonl" "$BATS_TEST_TMPDIR/b64.jsonl"
            timeout 120 $MPIRUN 4 "$TANDEM" generate --model "$FIX/models/$f" --input "$BATS_TEST_TMPDIR/p.jsonl" --greedy \
                --ignore-eos --logprobs 3 --dtype $dt --tp 2 --pp 2 --output "$BATS_TEST_TMPDIR/l.jsonl" 2>/dev/null
            cmp "$BATS_TEST_TMPDIR/b1.jsonl" "$BATS_TEST_TMPDIR/l.jsonl"
            echo "$f $dt: batch 1 == 64 == tp2 x pp2"
            [ $dt = bf16 ] || diff <(jq -c '[.id, .greedy_ids]' "$FIX/refs/$f.jsonl") \
                                   <(jq -c 'select(.id | endswith("-h") | not) | [.id, .completion_ids]' "$BATS_TEST_TMPDIR/b1.jsonl")
        done
    done
}

# --dtype bf16 against Tandem's bf16 function transcribed in torch (refs/*.bf16emu.jsonl, by
# make_bf16_refs.py through transformers' classes: weights rounded to bf16, every nn.Linear input
# rounded, the routing in fp32) as tests/bf16_fidelity.bats: the same function up to fp32 summation
# order, except where that order moves a value across a bf16 rounding boundary (a flip), so half the
# pairs within 1e-4 and every pair within 5 sigma of the flips' noise (the .sigma files; measured:
# p50 2.4e-7 on each; mixtral_tiny no flip (max 1e-6), qwen2_moe_tiny max 3.8e-4, qwen3_moe_tiny
# max 0.033 = 0.71 sigma, in the later positions of a record). Not against fp32 or torch.bfloat16: bf16 rounding moves the router's logits by
# ~1e-2 relative, far more than the routing margins (>= 1.6e-4), so some tokens go to other experts
# there (make_moe_refs.py: |bf16-emulated - fp32| up to 44 sigma on qwen3_moe_tiny), a jump the
# first-order sigma model does not describe.
@test "moe: --dtype bf16 computes the bf16 function (transformers' classes with bf16-rounded weights and matmul inputs): p50 <= 1e-4, all within 5 sigma, greedy" {
    for f in $MOE; do
        ref="$FIX/refs/$f.bf16emu.jsonl" ours="$BATS_TEST_TMPDIR/$f.ours.jsonl"
        run "$TANDEM" eval --dtype bf16 --threads 1 --model "$FIX/models/$f" --reference "$ref" --max-logprob-diff 1e30 \
            --write-reference "$ours" --quiet
        echo "$f: $output"
        [ "$status" -eq 0 ]
        grep '^{"records"' <<<"$output" | jq -e '.p50_abs_logprob_diff <= 1e-4 and .greedy_mismatches == 0 and .greedy_tokens == 32' >/dev/null
        run python3 "$FIX/check_bf16_sigma.py" "$ref" "$ours" 5
        echo "$f: sigma check: $output"
        [ "$status" -eq 0 ]
    done
}

# eval's logprobs of a record alone are those it has among the others (eval runs them together)
@test "moe: a sequence's logprobs alone == in a batch of 4, bit for bit" {
    for f in $MOE; do
        jq -c 'del(.greedy_ids, .greedy_top_logprobs)' "$FIX/refs/$f.jsonl" > "$BATS_TEST_TMPDIR/all.jsonl"
        "$TANDEM" eval --dtype fp32 --model "$FIX/models/$f" --reference "$BATS_TEST_TMPDIR/all.jsonl" \
            --write-reference "$BATS_TEST_TMPDIR/all.out" --quiet >/dev/null
        for i in 1 2 3 4; do
            sed -n "${i}p" "$BATS_TEST_TMPDIR/all.jsonl" > "$BATS_TEST_TMPDIR/one.jsonl"
            "$TANDEM" eval --dtype fp32 --model "$FIX/models/$f" --reference "$BATS_TEST_TMPDIR/one.jsonl" \
                --write-reference "$BATS_TEST_TMPDIR/one.out" --quiet >/dev/null
            [ "$(jq -c .top_logprobs "$BATS_TEST_TMPDIR/one.out")" = "$(sed -n "${i}p" "$BATS_TEST_TMPDIR/all.out" | jq -c .top_logprobs)" ]
        done
    done
}

# what is not supported yet is one line naming it, never a silent difference
@test "moe: unsupported configs and a tp that does not divide the experts' width are refused with one line" {
    d="$BATS_TEST_TMPDIR/m"
    refuse() { # KEY=JSON MESSAGE
        rm -rf "$d"; cp -r "$FIX/models/qwen2_moe_tiny" "$d"
        jq -c ". + $1" "$FIX/models/qwen2_moe_tiny/config.json" > "$d/config.json"
        run "$TANDEM" eval --dtype fp32 --model "$d" --reference "$FIX/refs/qwen2_moe_tiny.jsonl" --quiet
        echo "$output"
        [ "$status" -ne 0 ]
        [ "$(grep -c '^tandem: ' <<<"$output")" -eq 1 ]
        grep -q "$2" <<<"$output"
    }
    refuse '{"decoder_sparse_step": 2}' 'decoder_sparse_step != 1 (dense MLP layers between MoE layers) is not supported'
    refuse '{"mlp_only_layers": [1]}' 'a non-empty mlp_only_layers'
    refuse '{"num_experts_per_tok": 5}' 'num_experts_per_tok 5 must be in \[1, num_experts 4\]'
    refuse '{"shared_expert_intermediate_size": 0}' 'shared_expert_intermediate_size must be positive'
    rm -rf "$d"; cp -r "$FIX/models/mixtral_tiny" "$d"
    jq -c '. + {"router_jitter_noise": 0.1}' "$FIX/models/mixtral_tiny/config.json" > "$d/config.json"
    run "$TANDEM" eval --dtype fp32 --model "$d" --reference "$FIX/refs/mixtral_tiny.jsonl" --quiet
    [ "$status" -ne 0 ]; grep -q 'router_jitter_noise != 0 is not supported' <<<"$output"
    # the experts' width split over tp like the dense MLP's: 48 / 4 runs, 50 / 4 is refused
    rm -rf "$d"; cp -r "$FIX/models/mixtral_tiny" "$d"
    run timeout 60 $MPIRUN 4 "$TANDEM" eval --dtype fp32 --model "$FIX/models/mixtral_tiny" --reference "$FIX/refs/mixtral_tiny.jsonl" --tp 4 --quiet
    [ "$status" -eq 0 ]   # 48 / 4: fine
    jq -c '. + {"intermediate_size": 50}' "$FIX/models/mixtral_tiny/config.json" > "$d/config.json"
    run timeout 60 $MPIRUN 4 "$TANDEM" eval --dtype fp32 --model "$d" --reference "$FIX/refs/mixtral_tiny.jsonl" --tp 4 --quiet
    echo "$output"
    [ "$status" -ne 0 ]; grep -q "tandem: --tp 4 does not divide the experts' intermediate size 50" <<<"$output"
}

# The backward (train/moe_grad.c) against autograd through transformers' own classes (the
# fixtures' *.grad.json: make_grad_fixtures.py's packed batch and masked prompt): every gradient,
# the experts', the routers' (through the routing weights; the top-k choice a constant) and
# Qwen2-MoE's shared expert and its gate, within 1e-5 of max(1, max|ref|) (tests/test_grad.c),
# on every rank of tp 2 x pp 2 and tp 2; the replicated routers' gradients bit-identical on every
# tp rank; train_forward's logits bit-identical to model_forward's
@test "moe: gradients match torch autograd of Mixtral / Qwen2-MoE / Qwen3-MoE at 1x1, tp 2 x pp 2 and tp 2" {
    for f in $MOE; do
        for l in "1 1" "2 2" "2 1"; do
            set -- $l
            if [ $(($1 * $2)) -eq 1 ]; then
                run timeout 60 "$ROOT/build/tests/test_grad" "$FIX/models/$f" "$FIX/moe/$f.grad.json"
            else
                run_ranks 120 $(($1 * $2)) "$ROOT/build/tests/test_grad" "$FIX/models/$f" "$FIX/moe/$f.grad.json" $1 $2
            fi
            echo "$f tp $1 pp $2: $(grep -E 'ok: grad|worst' <<<"$output")"
            [ "$status" -eq 0 ]
            [ "$(grep -c 'ok: grad' <<<"$output")" -eq $(($1 * $2)) ]
            [ "$(grep -c 'bit-identical to model_forward' <<<"$output")" -eq $1 ]
            grep -qE 'gate.weight .* max\|ref\| 0\.[1-9]' <<<"$output"   # the router's gradient is checked, not zero
        done
    done
    [ "$(cat "$FIX"/moe/*.grad.json | wc -c)" -lt 3200000 ]   # five fixtures (the z-loss's too), 3.1 MB
}

# sft through the trainer on a MoE with a tokenizer: a random LLaMA of convert's with tok512 whose
# MLPs tests/fixtures/moe/to_moe.py replaced by experts (N(0, 0.5) routers: the routing differs from
# token to token). fp32 through 4 AdamW steps: tp 2 x pp 2 (1F1B) and dp 2 ZeRO-3 within 1e-5 of
# 1x1 (other summation orders of the same gradients), --recompute full bit for bit; the checkpoint
# is an HF directory transformers loads (Mixtral, Qwen2-MoE in the .venv's 4.47.1) and computes
# Tandem's logprobs from (1e-4, as eval's parity), so the experts' and routers' names go out as in.
moe_model() { # KIND: $BATS_TEST_TMPDIR/KIND, and the rev data beside it
    need_assets; need_hfpy
    make_rev_data "$BATS_TEST_TMPDIR"
    "$TANDEM" convert --from random --shape 64,256,2,4,2,512,64 --tokenizer "$ASSETS/models/stories260K/tok512.model" \
        --seed 1 --out "$BATS_TEST_TMPDIR/llama" 2>/dev/null
    "$HFPY" "$FIX/moe/to_moe.py" "$BATS_TEST_TMPDIR/llama" "$BATS_TEST_TMPDIR/$1" $1
}
moe_sft() { # KIND
    moe_model $1
    local t="$BATS_TEST_TMPDIR" M="$BATS_TEST_TMPDIR/$1"
    A="--data $t/rev_train.jsonl --seq-len 32 --batch-size 8 --micro-batches 2 --max-steps 4 --lr 3e-3"
    run timeout 120 "$TANDEM" sft --model "$M" $A --out "$t/one"
    [ "$status" -eq 0 ]
    "$TANDEM" sft --model "$M" $A --out "$t/rc" --recompute full 2>/dev/null
    diff <(losses "$t/one") <(losses "$t/rc")
    run timeout 180 $MPIRUN 4 "$TANDEM" sft --model "$M" $A --tp 2 --pp 2 --out "$t/tp"
    [ "$status" -eq 0 ]
    run timeout 180 $MPIRUN 2 "$TANDEM" sft --model "$M" --data "$t/rev_train.jsonl" --seq-len 32 --batch-size 8 \
        --micro-batches 1 --max-steps 4 --lr 3e-3 --zero 3 --out "$t/z3"
    [ "$status" -eq 0 ]
    echo "1x1: $(losses "$t/one" | tr '\n' ' ')"
    for o in tp z3; do echo "$o: $(losses "$t/$o" | tr '\n' ' ')"; close "$t/one" "$t/$o" 1e-5; done
    # step 1's routing is 1x1's at every layout (the same weights, the same bits): the same expert load
    for o in tp z3; do [ "$(jq -s -c '.[0] | [.moe_load_max, .moe_load_min]' "$t/$o/metrics.jsonl")" = "$(jq -s -c '.[0] | [.moe_load_max, .moe_load_min]' "$t/one/metrics.jsonl")" ]; done
    [ "$(losses "$t/one" | tail -1 | awk '{ print ($1 < 6.0) }')" = 1 ]   # it learns (6.24 at step 1)
    ck="$t/one/checkpoint-4"
    [ "$(jq -r .model_type "$ck/config.json")" = $1 ]
    jq -nc '{id: "a", input_ids: [1,45,300,22,17,400,5,99,12,7,64,3]}, {id: "b", input_ids: [1,9,8,7,6,5,4,3,2]}' > "$t/in.jsonl"
    [ $1 = qwen3_moe ] && return 0   # transformers 4.51 is not in the .venv (the fixtures' parity is)
    "$HFPY" "$ROOT/eval/hf_reference.py" --model "$ck" --input "$t/in.jsonl" --out "$t/hf.jsonl" --greedy 4 2>/dev/null
    run "$TANDEM" eval --dtype fp32 --model "$ck" --reference "$t/hf.jsonl" --max-logprob-diff 1e-4 --quiet
    echo "${lines[-1]}"
    [ "$status" -eq 0 ]
}
losses() { jq -r 'select(.loss != null) | .loss' "$1/metrics.jsonl"; }
close() { # A B REL: the two loss columns within REL relative, same count
    [ "$(losses "$1" | wc -l)" -eq "$(losses "$2" | wc -l)" ] && [ "$(losses "$1" | wc -l)" -gt 0 ]
    paste <(losses "$1") <(losses "$2") | awk -v r="$3" '{ d = $1 - $2; if (d < 0) d = -d; if (d > r * $1) bad = 1 } END { exit bad }'
}

@test "moe sft qwen2_moe: tp 2 x pp 2 and ZeRO-3 follow 1x1, recompute bit for bit; transformers loads the checkpoint" {
    moe_sft qwen2_moe
}

@test "moe sft mixtral: the same" {
    moe_sft mixtral
}

@test "moe sft qwen3_moe: the same (the checkpoint through Tandem only)" {
    moe_sft qwen3_moe
}

# The rollout's logprobs (generate's engine, the KV cache, batches of any shape) are the training
# forward's bit for bit with a MoE actor: the routing is a function of the token alone (dropless,
# fixed-order combine), the same in both, so no routing replay is needed
@test "moe ppo: GRPO steps with a Qwen3-MoE actor: rollout logprobs == training logprobs (diff 0), fp32 at 1x1, bf16 at actor tp 2 x pp 2, with the router z-loss" {
    moe_model qwen3_moe
    A=(--actor "$BATS_TEST_TMPDIR/qwen3_moe" --reward-cmd "$RULE" --prompts "$TRAIN" --advantage grpo --n-samples-per-prompt 2
       --rollout-batch-size 2 --max-new-tokens 8 --steps 2 --kl-coef 0 --actor-lr 3e-4)
    run timeout 120 "$TANDEM" ppo "${A[@]}" --out "$BATS_TEST_TMPDIR/one"
    [ "$status" -eq 0 ]
    [ "$(jq -s 'map(.rollout_logprob_diff_max) | unique' "$BATS_TEST_TMPDIR/one/metrics.jsonl" -c)" = "[0]" ]
    run timeout 180 $MPIRUN 4 "$TANDEM" ppo "${A[@]}" --dtype bf16 --actor-tp 2 --actor-pp 2 --out "$BATS_TEST_TMPDIR/tp"
    [ "$status" -eq 0 ]
    [ "$(jq -s 'map(.rollout_logprob_diff_max) | unique' "$BATS_TEST_TMPDIR/tp/metrics.jsonl" -c)" = "[0]" ]
    # the router z-loss on the actor (--moe-z-loss-coef): step 1's gradient gains its term (the same
    # rollouts: rewards and advantages unchanged), the rollouts stay exact; a dense actor refused
    run timeout 120 "$TANDEM" ppo "${A[@]}" --moe-z-loss-coef 0.05 --out "$BATS_TEST_TMPDIR/z"
    [ "$status" -eq 0 ]
    [ "$(jq -s 'map(.rollout_logprob_diff_max) | unique' "$BATS_TEST_TMPDIR/z/metrics.jsonl" -c)" = "[0]" ]
    jq -e -n --slurpfile a "$BATS_TEST_TMPDIR/one/metrics.jsonl" --slurpfile z "$BATS_TEST_TMPDIR/z/metrics.jsonl" \
        '$a[0]["critic/score/mean"] == $z[0]["critic/score/mean"] and $a[0]["actor/grad_norm"] != $z[0]["actor/grad_norm"]'
    run "$TANDEM" ppo "${A[@]/$BATS_TEST_TMPDIR\/qwen3_moe/$BATS_TEST_TMPDIR/llama}" --moe-z-loss-coef 0.05 --out "$BATS_TEST_TMPDIR/d"
    echo "$output"   # (after the placement line: the actor's config is read with its model)
    [ "$status" -ne 0 ]; [ "$(grep -c '^tandem: ' <<<"$output")" -eq 1 ]
    grep -q '^tandem: --moe-z-loss-coef 0.05: the router z-loss needs a Mixture-of-Experts model (model_type llama has no router)$' <<<"$output"
}

@test "moe: sequence parallel and LoRA on the experts (all-linear, the default) are refused with one line" {
    moe_model mixtral
    local t="$BATS_TEST_TMPDIR"
    mv "$t/mixtral" "$t/m"
    run "$TANDEM" sft --model "$t/m" --data "$t/rev_train.jsonl" --seq-len 32 --batch-size 8 --max-steps 1 --lora-r 4 --out "$t/l"
    echo "$output"
    [ "$status" -ne 0 ]; grep -q '^tandem: --lora-target: model_type mixtral is a Mixture-of-Experts model: only q_proj,k_proj,v_proj,o_proj may be targeted' <<<"$output"
    run timeout 60 $MPIRUN 2 "$TANDEM" sft --model "$t/m" --data "$t/rev_train.jsonl" --seq-len 32 --batch-size 8 --max-steps 1 \
        --tp 2 --sequence-parallel --out "$t/s"
    echo "$output"
    [ "$status" -ne 0 ]; grep -q 'tandem: --sequence-parallel: not supported with a Mixture-of-Experts model (model_type mixtral) yet' <<<"$output"
}

# HF's load-balancing loss (config.json's output_router_logits: transformers' *ForCausalLM adds
# router_aux_loss_coef x load_balancing_loss_func to the loss): the fixture's loss and gradients are
# transformers' own on the padded batch of both sequences (attention_mask: the padding counts in
# neither), so the loss checks the aux value and every gradient its derivative through the routers'
# softmax; without the term (the same fixture, moe_aux_coef removed) they must fail
@test "moe: the load-balancing loss and its gradients equal transformers' Qwen2-MoE with output_router_logits, at 1x1 and tp 2" {
    f=qwen2_moe_tiny fx="$FIX/moe/qwen2_moe_tiny.aux.grad.json"
    [ "$(jq '.moe_aux_coef > 0 and .aux_loss > 1' "$fx")" = true ]
    run timeout 60 "$ROOT/build/tests/test_grad" "$FIX/models/$f" "$fx"
    echo "$output" | grep -E 'loss|worst|ok:'
    [ "$status" -eq 0 ]; grep -q 'ok: grad' <<<"$output"
    run_ranks 120 2 "$ROOT/build/tests/test_grad" "$FIX/models/$f" "$fx" 2 1
    [ "$status" -eq 0 ]; [ "$(grep -c 'ok: grad' <<<"$output")" -eq 2 ]
    jq -c 'del(.moe_aux_coef)' "$fx" > "$BATS_TEST_TMPDIR/noaux.json"
    run timeout 60 "$ROOT/build/tests/test_grad" "$FIX/models/$f" "$BATS_TEST_TMPDIR/noaux.json"
    [ "$status" -ne 0 ]; grep -q 'loss .* FAIL' <<<"$output"
}

# in sft: the step's loss is the cross-entropy + coef x the micro-batches' mean aux (step 1: the
# same weights as without the term, so loss = the plain run's + coef x moe_aux_loss), reported as
# moe_aux_loss; off without output_router_logits (the default of the released checkpoints); pp > 1
# refused (HF's loss needs every layer's routing at once)
@test "moe sft: output_router_logits adds router_aux_loss_coef x the load-balancing loss (moe_aux_loss in the metrics); the experts' load in the metrics; pp 2 refused" {
    moe_model qwen2_moe
    local t="$BATS_TEST_TMPDIR"
    cp -r "$t/qwen2_moe" "$t/qa"
    jq '. + {"output_router_logits": true, "router_aux_loss_coef": 0.5}' "$t/qwen2_moe/config.json" > "$t/qa/config.json"
    A="--data $t/rev_train.jsonl --seq-len 32 --batch-size 8 --micro-batches 2 --max-steps 2 --lr 3e-3"
    "$TANDEM" sft --model "$t/qwen2_moe" $A --out "$t/plain" 2>/dev/null
    "$TANDEM" sft --model "$t/qa" $A --out "$t/aux" 2>/dev/null
    run ! grep -q moe_aux_loss "$t/plain/metrics.jsonl"
    # the experts' load (every step, with or without the term): the busiest / idlest expert's share x E
    jq -e -s 'map(.moe_load_max >= 1 and .moe_load_min <= 1 and .moe_load_min >= 0) | all and length == 2' "$t/plain/metrics.jsonl"
    jq -e -n --slurpfile p "$t/plain/metrics.jsonl" --slurpfile a "$t/aux/metrics.jsonl" \
        '($a[0].moe_aux_loss > 1.5) and (($a[0].loss - $p[0].loss - 0.5 * $a[0].moe_aux_loss) | fabs < 1e-5 * $a[0].loss)
         and ($a[1].loss != $p[1].loss)'
    run timeout 60 $MPIRUN 2 "$TANDEM" sft --model "$t/qa" $A --pp 2 --out "$t/pp"
    echo "$output"
    [ "$status" -ne 0 ]; grep -q "tandem: --pp 2: the router's load-balancing loss (config.json output_router_logits, model_type qwen2_moe) needs every layer's routing on one stage" <<<"$output"
}

# The router z-loss (--moe-z-loss-coef; ST-MoE): tests/fixtures/moe/make_zloss_fixture.py transcribes
# Megatron-Core's z_loss_func (coef x mean over the tokens of logsumexp(router logits)^2, each layer's
# term summed) in torch on transformers' MixtralForCausalLM (coef 0.1) and differentiates it by
# autograd: the z value (summed over the pp stages' layers) and every gradient within test_grad's
# 1e-5 x max(1, |ref|). The z value is a sum of 2 x 25 squares of fp32 logsumexps (|lse| ~ 2, each
# a few ulps: ~1e-6 absolute on 9.7), far inside 1e-5 x 9.7; the gradients' error is the plain
# fixture's (measured worst 3.1e-6). Without the term the same fixture fails (the embedding's
# gradient moves by 0.4).
@test "moe: the router z-loss and its gradients equal a torch transcription of Megatron-Core's z_loss_func on transformers' Mixtral, at 1x1, tp 2 x pp 2 and tp 2; without it they fail" {
    f=mixtral_tiny fx="$FIX/moe/mixtral_tiny.z.grad.json"
    [ "$(jq '.moe_z_coef > 0 and .z_loss > 1' "$fx")" = true ]
    for l in "1 1" "2 2" "2 1"; do
        set -- $l
        run_ranks 120 $(($1 * $2)) "$ROOT/build/tests/test_grad" "$FIX/models/$f" "$fx" $1 $2
        echo "tp $1 pp $2: $(grep -E 'z_loss|worst' <<<"$output")"
        [ "$status" -eq 0 ]
        [ "$(grep -c 'ok: grad' <<<"$output")" -eq $(($1 * $2)) ]
        [ "$(grep -c 'z_loss .* torch' <<<"$output")" -eq $(($1 * $2)) ]
    done
    jq -c 'del(.moe_z_coef)' "$fx" > "$BATS_TEST_TMPDIR/noz.json"
    run timeout 60 "$ROOT/build/tests/test_grad" "$FIX/models/$f" "$BATS_TEST_TMPDIR/noz.json"
    [ "$status" -ne 0 ]; grep -q 'embed_tokens.weight .* FAIL' <<<"$output"
}

# sft: --moe-z-loss-coef 0 (the default) keeps every byte (metrics but the timing, the checkpoint);
# a large coefficient drives the routers' logsumexp down (moe_z_loss, the mean over layers of
# mean_t lse_t^2: step 1 is the same weights in both runs, so the same z, 29; by step 6 the
# cross-entropy alone has grown the routers' logits (measured z 142) while coef 0.05 took it to 0.6);
# the routing statistics: moe_balance_loss equals HF's aux loss (moe_aux_loss) with
# one micro-batch, moe_tokens/E sum to the step's tokens x k x layers, and TensorBoard holds them;
# the option refused with one line when negative, not finite or on a dense model
@test "moe sft --moe-z-loss-coef: 0 keeps every byte, a large one lowers the routers' logsumexp; moe_balance_loss, moe_tokens/E in metrics and TensorBoard; refusals" {
    moe_model qwen2_moe
    local t="$BATS_TEST_TMPDIR" M="$BATS_TEST_TMPDIR/qwen2_moe"
    A="--data $t/rev_train.jsonl --seq-len 32 --batch-size 8 --micro-batches 2 --max-steps 6 --lr 3e-3"
    "$TANDEM" sft --model "$M" $A --out "$t/plain" 2>/dev/null
    "$TANDEM" sft --model "$M" $A --out "$t/z0" --moe-z-loss-coef 0 2>/dev/null
    diff <(numbers "$t/plain/metrics.jsonl") <(numbers "$t/z0/metrics.jsonl")
    cmp "$t/plain/checkpoint-6/model-00001-of-00001.safetensors" "$t/z0/checkpoint-6/model-00001-of-00001.safetensors"
    run ! grep -q moe_z_loss "$t/plain/metrics.jsonl"
    "$TANDEM" sft --model "$M" $A --out "$t/zs" --moe-z-loss-coef 1e-9 2>/dev/null
    "$TANDEM" sft --model "$M" $A --out "$t/zl" --moe-z-loss-coef 0.05 --tensorboard "$t/tb" 2>/dev/null
    echo "z small: $(jq -r .moe_z_loss "$t/zs/metrics.jsonl" | tr '\n' ' ')"
    echo "z large: $(jq -r .moe_z_loss "$t/zl/metrics.jsonl" | tr '\n' ' ')"
    jq -e -n --slurpfile s "$t/zs/metrics.jsonl" --slurpfile l "$t/zl/metrics.jsonl" \
        '($s[0].moe_z_loss == $l[0].moe_z_loss) and ($l[0].moe_z_loss > 10) and ($l[5].moe_z_loss < 0.1 * $l[0].moe_z_loss)
         and ($l[5].moe_z_loss < 0.1 * $s[5].moe_z_loss)'
    # per layer, so any pp (unlike HF's load-balancing loss): tp 2 x pp 2's step 1 is 1x1's
    run timeout 120 $MPIRUN 4 "$TANDEM" sft --model "$M" ${A/--max-steps 6/--max-steps 1} --moe-z-loss-coef 0.05 --tp 2 --pp 2 --out "$t/zp"
    [ "$status" -eq 0 ]
    jq -e -n --slurpfile p "$t/zp/metrics.jsonl" --slurpfile l "$t/zl/metrics.jsonl" \
        '(($p[0].moe_z_loss - $l[0].moe_z_loss) | fabs) < 1e-6 * $l[0].moe_z_loss and $p[0].moe_balance_loss == $l[0].moe_balance_loss'
    # tokens per expert: every step's sum = its tokens x k (2) x layers (2)
    jq -e -s 'map([to_entries[] | select(.key | startswith("moe_tokens/")) | .value] as $n
                  | ($n | length) == 4 and ($n | add) == .tokens * 4 and .moe_balance_loss >= 2) | all' "$t/zl/metrics.jsonl"
    run "$HFPY" "$ROOT/tests/fixtures/check_tensorboard.py" scalars "$t/tb" "$t/zl/metrics.jsonl"
    echo "$output"; [ "$status" -eq 0 ]
    "$HFPY" -c 'import sys; from tensorboard.backend.event_processing import event_accumulator as ea
a = ea.EventAccumulator(sys.argv[1]); a.Reload(); t = set(a.Tags()["scalars"])
sys.exit(0 if {"moe_z_loss", "moe_balance_loss", "moe_tokens/0", "moe_tokens/3"} <= t else 1)' "$t/tb"
    # one micro-batch, dp 1: the balance statistic is HF's load-balancing loss of that batch
    cp -r "$M" "$t/qa"
    jq '. + {"output_router_logits": true, "router_aux_loss_coef": 0.5}' "$M/config.json" > "$t/qa/config.json"
    "$TANDEM" sft --model "$t/qa" --data "$t/rev_train.jsonl" --seq-len 32 --batch-size 8 --max-steps 2 --lr 3e-3 --out "$t/aux" 2>/dev/null
    jq -e -s 'map((.moe_balance_loss - .moe_aux_loss) | fabs < 1e-5) | all' "$t/aux/metrics.jsonl"
    run_one_line "tandem: --moe-z-loss-coef -1: must be a finite number >= 0 (0 = off)" \
        "$TANDEM" sft --model "$M" $A --out "$t/bad" --moe-z-loss-coef -1
    for v in nan inf 1e39; do   # the option parser's own check (a finite float)
        run_one_line "tandem: --moe-z-loss-coef: expected a number, got \"$v\"" "$TANDEM" sft --model "$M" $A --out "$t/bad" --moe-z-loss-coef $v
    done
    run_one_line "tandem: --moe-z-loss-coef 0.1: the router z-loss needs a Mixture-of-Experts model (model_type llama has no router)" \
        "$TANDEM" sft --model "$t/llama" $A --out "$t/bad" --moe-z-loss-coef 0.1
}

# The experts' matmuls run as grouped GEMMs (runtime/moe.c, train/moe_grad.c): bench --train counts
# the backend's matmul calls of one step per layer (forward, the backward's rerun of the block, the
# backward): 7 per expert (gate+up in one call, down; again in the rerun; 3 backward: 28 at E 4) + 6
# for the attention (qkv in one call, o; o, q, k, v backward) + 3 for the router (forward, rerun,
# backward) + the lm_head's 2 shared by the 2 layers = 38; the same at 2 x 16 and 16 x 16 tokens
# (64 and 512 (token, choice) pairs): one GEMM per token would grow with them
@test "moe: a training step's expert matmuls are grouped GEMMs (bench --train's call count per layer does not grow with the tokens)" {
    for b in "2 16" "16 16"; do
        set -- $b
        "$TANDEM" bench --train --model "$FIX/models/mixtral_tiny" --iters 1 --batch $1 --seq $2 2>/dev/null | grep moe_gemms
    done > "$BATS_TEST_TMPDIR/g.jsonl"
    cat "$BATS_TEST_TMPDIR/g.jsonl"
    jq -e -s 'length == 2 and .[0].tokens_x_k == 64 and .[1].tokens_x_k == 512 and
              (map(.matmul_calls_per_layer) | unique) == [38]' "$BATS_TEST_TMPDIR/g.jsonl"
}
