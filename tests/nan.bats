#!/usr/bin/env bats
# No training on NaN (issue 27, item 2) and degenerate settings (item 11). A step whose loss or
# gradient norm is not finite, in any trained model (sft, rm, dpo, the ppo actor and critic), is not
# applied: the run stops with one line naming the step (ppo: and its prompts), writes no metrics line
# and no checkpoint after it. Weights holding a NaN are refused at load, naming the file and the
# tensor. metrics.jsonl is strict JSON on every line. grpo with one sample per prompt is refused.
load helpers

setup_file() {
    D="$BATS_FILE_TMPDIR"
    for i in $(seq 1 40); do
        printf '{"prompt": "Once upon a time %d", "response": " there was a cat named Tom who liked %d fish."}\n' "$i" "$i"
    done > "$D/sft.jsonl"
    # varied rewards (words / 10), so grpo's advantages and the actor's gradient are not zero
    printf '%s\n' 'import json, sys' 'for line in sys.stdin:' \
        '    print(json.dumps({"reward": len(json.loads(line)["response"].split()) / 10}), flush=True)' > "$D/words.py"
}

SFT=(--seq-len 32 --batch-size 4 --threads 1)
PREF=(--model "$STORIES" --data "$PF/story_train.jsonl" --seq-len 64 --batch-size 4 --threads 1)

# strict_json FILE: every line is a JSON object; NaN / Infinity / nan are not JSON (python's json
# accepts the first two and jq 1.6 reads "-nan" as null, so neither is strict)
strict_json() {
    python3 -c 'import json, sys
def bad(c): raise ValueError("not JSON: " + c)
for i, l in enumerate(open(sys.argv[1]), 1):
    try: assert isinstance(json.loads(l, parse_constant=bad), dict)
    except (ValueError, AssertionError) as e: sys.exit("%s:%d: %s: %s" % (sys.argv[1], i, e, l.strip()))' "$1"
}

# stopped_at: checks $output is one "tandem: ... step N: ..." line about a non-finite loss or
# gradient norm and prints N
stopped_at() {
    [ "$(grep -c '^tandem: ' <<<"$output")" -eq 1 ] || { echo "not one tandem: line"; return 1; }
    grep -qE "^tandem: (\[[a-z]+\] )?step [0-9]+: .*(the loss|the gradient norm) is not finite \(NaN or inf" <<<"$output" ||
        { echo "no non-finite step line"; return 1; }
    grep '^tandem: ' <<<"$output" | sed -E 's/^tandem: (\[[a-z]+\] )?step ([0-9]+):.*/\2/'
}

# only_before OUT N: OUT's metrics.jsonl is strict JSON and ends at step N - 1; OUT holds no
# checkpoint of step N or later, and the earlier ones are complete
only_before() {
    strict_json "$1/metrics.jsonl"
    [ "$(grep -c . "$1/metrics.jsonl")" -eq "$(($2 - 1))" ] || { echo "metrics lines: $(grep -c . "$1/metrics.jsonl")"; return 1; }
    for c in "$1"/checkpoint-*; do
        [ -e "$c" ] || continue
        k=${c##*checkpoint-}
        [ "$k" -lt "$2" ] || { echo "$c written at or after the non-finite step $2"; return 1; }
        [ -e "$c/trainer_state.json" ]
    done
}

# poison DIR TENSOR ROW COL: one element of TENSOR in the model directory DIR (model.safetensors, or
# the file its index names) becomes NaN (F32 or BF16); prints that file's path
poison() {
    python3 - "$@" <<'EOF'
import json, os, struct, sys
d, name, r, c = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
index = os.path.join(d, "model.safetensors.index.json")
path = os.path.join(d, json.load(open(index))["weight_map"][name] if os.path.exists(index) else "model.safetensors")
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    t = json.loads(f.read(n))[name]
    size = {"F32": 4, "BF16": 2}[t["dtype"]]
    f.seek(8 + n + t["data_offsets"][0] + (r * t["shape"][1] + c) * size)
    f.write(struct.pack("<f", float("nan")) if size == 4 else b"\xc0\x7f")
print(path)
EOF
}

@test "nan: sft --lr 1e30 stops at the first non-finite step, applies and saves nothing of it; metrics.jsonl stays JSON" {
    need_story
    out="$BATS_TEST_TMPDIR/o"
    run timeout 120 "$TANDEM" sft --model "$STORIES" --data "$BATS_FILE_TMPDIR/sft.jsonl" --out "$out" "${SFT[@]}" \
        --max-steps 6 --save-every 1 --lr 1e30
    echo "$output" | grep -E '^step|^tandem|^saved'
    [ "$status" -eq 1 ]
    n=$(stopped_at)
    [[ "$output" == *"the step was not applied and no checkpoint was written after it; lower --lr (now 1e+30)"* ]]
    only_before "$out" "$n"
}

@test "nan: the same under mpirun at dp=2 with ZeRO-1: every rank stops at the same step, one line" {
    need_story
    out="$BATS_TEST_TMPDIR/o"
    run timeout 120 $MPIRUN 2 "$TANDEM" sft --model "$STORIES" --data "$BATS_FILE_TMPDIR/sft.jsonl" --out "$out" "${SFT[@]}" \
        --batch-size 2 --zero 1 --max-steps 6 --save-every 1 --lr 1e30
    echo "$output" | grep -E '^step|^tandem|^saved'
    [ "$status" -ne 0 ]
    n=$(stopped_at)
    only_before "$out" "$n"
}

@test "nan: a checkpoint holding one NaN weight is refused by --resume, generate and eval, naming the file and the tensor" {
    need_story
    out="$BATS_TEST_TMPDIR/o"
    "$TANDEM" sft --model "$STORIES" --data "$BATS_FILE_TMPDIR/sft.jsonl" --out "$out" "${SFT[@]}" --max-steps 2 --save-every 1 \
        --lr 1e-3 2>/dev/null
    ck="$out/checkpoint-1"
    file=$(poison "$ck" model.layers.1.mlp.up_proj.weight 3 5)
    want="tandem: $file: tensor model.layers.1.mlp.up_proj.weight holds a non-finite value (model.layers.1.mlp.up_proj.weight[3, 5] = nan): refusing to load it (a diverged run's checkpoint? use an earlier one)"
    run timeout 60 "$TANDEM" sft --model "$STORIES" --data "$BATS_FILE_TMPDIR/sft.jsonl" --out "$out" "${SFT[@]}" --max-steps 4 \
        --save-every 1 --lr 1e-3 --resume "$ck"
    [ "$status" -eq 1 ]
    [ "$(grep '^tandem: ' <<<"$output")" = "$want" ]
    [ ! -e "$out/checkpoint-3" ]
    echo '{"prompt": "Once upon a time"}' > "$BATS_TEST_TMPDIR/p.jsonl"
    run timeout 60 "$TANDEM" generate --model "$ck" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/g.jsonl" --max-new-tokens 4
    [ "$status" -eq 1 ]
    [ "$(grep '^tandem: ' <<<"$output")" = "$want" ]
    echo '{"text": "Once upon a time there was a cat."}' > "$BATS_TEST_TMPDIR/t.jsonl"
    run timeout 60 "$TANDEM" eval --model "$ck" --data "$BATS_TEST_TMPDIR/t.jsonl" --threads 1
    [ "$status" -eq 1 ]
    [ "$(grep '^tandem: ' <<<"$output")" = "$want" ]
    # at tp=2 the rank holding that row of the shard reports it
    run timeout 60 $MPIRUN 2 "$TANDEM" generate --model "$ck" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/g2.jsonl" \
        --max-new-tokens 4 --tp 2
    [ "$status" -ne 0 ]
    [[ "$(grep '^tandem: ' <<<"$output")" == "tandem: [rank "[01]"] $file: tensor model.layers.1.mlp.up_proj.weight holds a non-finite value"* ]]
}

@test "nan: rm and dpo with --lr 1e30 stop at the first non-finite step, nothing saved after it" {
    need_story
    for cmd in rm dpo; do
        out="$BATS_TEST_TMPDIR/$cmd"
        run timeout 120 "$TANDEM" "$cmd" "${PREF[@]}" --out "$out" --max-steps 6 --save-every 1 --lr 1e30
        echo "$cmd: $(grep -E '^tandem' <<<"$output")"
        [ "$status" -eq 1 ]
        n=$(stopped_at)
        only_before "$out" "$n"
    done
}

@test "nan: ppo with --actor-lr 1e30 / --critic-lr 1e30 stops naming the role, the step and its prompts; no checkpoint" {
    need_story
    R="python3 -u $BATS_FILE_TMPDIR/words.py"
    # two mini-batches a step: the first update makes the weights huge, the second is not finite
    out="$BATS_TEST_TMPDIR/actor"
    run timeout 120 "$TANDEM" ppo --actor "$STORIES" --reward-cmd "$R" --prompts "$TRAIN" --out "$out" --advantage grpo \
        --n-samples-per-prompt 2 --rollout-batch-size 2 --mini-batch-size 2 --max-new-tokens 8 --steps 2 --kl-coef 0 \
        --actor-lr 1e30 --threads 1
    echo "$output" | grep -E '^step|^tandem'
    [ "$status" -eq 1 ]
    [ "$(stopped_at)" = 1 ]
    [[ "$output" == *"tandem: step 1: the actor's update (epoch 1, mini-batch 2): "*"the update was not applied and no checkpoint was written after it; the step's prompts: $TRAIN lines "[0-9]*", "[0-9]*"; lower --actor-lr or check the rewards"* ]]
    strict_json "$out/metrics.jsonl"
    [ ! -s "$out/metrics.jsonl" ]
    [ -z "$(ls -d "$out"/checkpoint-* 2>/dev/null)" ]
    # the critic in its own role group: the critic's group speaks
    out="$BATS_TEST_TMPDIR/critic"
    run_ranks 120 2 "$TANDEM" ppo --actor "$STORIES" --critic "$STORIES" --reward-cmd "$R" --prompts "$TRAIN" --out "$out" \
        --rollout-batch-size 2 --mini-batch-size 1 --max-new-tokens 8 --steps 2 --kl-coef 0 --critic-lr 1e30 --threads 1 \
        --actor-ranks 1 --critic-ranks 1
    echo "$output" | grep -E '^step|^tandem'
    [ "$status" -ne 0 ]
    [ "$(stopped_at)" = 1 ]
    [[ "$output" == *"tandem: [critic] step 1: the critic's update (epoch 1, mini-batch 2): "*"; the step's prompts: $TRAIN lines "[0-9]*", "[0-9]*"; lower --critic-lr or check the rewards"* ]]
    [ -z "$(ls -d "$out"/checkpoint-* 2>/dev/null)" ]
}

@test "degenerate: grpo with --n-samples-per-prompt 1 is refused (a group of one has advantage 0)" {
    need_story
    run timeout 60 "$TANDEM" ppo --actor "$STORIES" --reward-cmd "python3 -u $BATS_FILE_TMPDIR/words.py" --prompts "$TRAIN" \
        --out "$BATS_TEST_TMPDIR/x" --advantage grpo --n-samples-per-prompt 1
    [ "$status" -eq 1 ]
    [ "$output" = "tandem: --advantage grpo needs --n-samples-per-prompt >= 2 (a group of 1 has advantage 0: nothing would be trained)" ]
    [ ! -e "$BATS_TEST_TMPDIR/x" ]
    # the default is 1 sample: grpo without the flag is refused the same way
    run timeout 60 "$TANDEM" ppo --actor "$STORIES" --reward-cmd "python3 -u $BATS_FILE_TMPDIR/words.py" --prompts "$TRAIN" \
        --out "$BATS_TEST_TMPDIR/x" --advantage grpo
    [ "$status" -eq 1 ]
    [[ "$output" == "tandem: --advantage grpo needs --n-samples-per-prompt >= 2"* ]]
}
