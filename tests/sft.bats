#!/usr/bin/env bats
# tandem sft: learning (real model, synthetic task from random init), layouts, resume, bad input.
load helpers

setup_file() {
    make_rev_data "$BATS_FILE_TMPDIR"   # reverse 4 digits (helpers.bash)
}

need_tok() { need_assets; TOK="$ASSETS/models/stories260K/tok512.model"; }

# random tiny model with the tok512 tokenizer
random_model() { "$TANDEM" convert --from random --shape 64,256,2,4,4,512,64 --tokenizer "$TOK" --seed "${2:-1}" --out "$1" 2>/dev/null; }
# eval loss after (the last "eval_loss" in metrics.jsonl)
eval_after() { grep eval_loss "$1/metrics.jsonl" | tail -1 | jq .eval_loss; }
eval_before() { grep eval_loss "$1/metrics.jsonl" | head -1 | jq .eval_loss; }
# below A X: A is a number (not an empty or null read) and A < X
below() { [[ "$1" =~ ^[0-9.]+([eE][-+]?[0-9]+)?$ ]] && awk -v a="$1" -v x="$2" 'BEGIN { exit !(a < x) }'; }

REV="--seq-len 32 --batch-size 32 --max-steps 300 --lr 3e-3 --warmup 20 --log-every 100"

@test "sft: a tiny model from random init learns to reverse digits (eval loss 6.3 -> < 0.05), 1x1" {
    need_tok
    random_model "$BATS_TEST_TMPDIR/m"
    "$TANDEM" sft --model "$BATS_TEST_TMPDIR/m" --data "$BATS_FILE_TMPDIR/rev_train.jsonl" --eval-data "$BATS_FILE_TMPDIR/rev_val.jsonl" \
        --out "$BATS_TEST_TMPDIR/o" $REV --threads 2 2>/dev/null
    echo "eval loss: $(eval_before "$BATS_TEST_TMPDIR/o") -> $(eval_after "$BATS_TEST_TMPDIR/o")"
    # measured 0.014 (README): 0.05 leaves a 3.5x margin for thread-count rounding, and a model
    # that has not learned the task stays above 1
    below "$(eval_after "$BATS_TEST_TMPDIR/o")" 0.05
    # the saved model greedily reverses held-out strings (measured 20 / 20; 18 allows two slips)
    head -20 "$BATS_FILE_TMPDIR/rev_val.jsonl" | jq -c '{id: .response, prompt: .prompt, max_new_tokens: 6}' > "$BATS_TEST_TMPDIR/p.jsonl"
    "$TANDEM" generate --model "$BATS_TEST_TMPDIR/o/checkpoint-300" --input "$BATS_TEST_TMPDIR/p.jsonl" --output "$BATS_TEST_TMPDIR/g.jsonl" --greedy 2>/dev/null
    right=$(jq -r 'select((.completion | gsub("^ "; "")) == .id) | .id' "$BATS_TEST_TMPDIR/g.jsonl" | wc -l)
    echo "greedy reversals right: $right / 20"
    [ "$right" -ge 18 ]
}

@test "sft: the same task under mpirun at tp=2 x pp=2 with 2 micro-batches (1F1B)" {
    need_tok
    random_model "$BATS_TEST_TMPDIR/m"
    run timeout 600 $MPIRUN 4 "$TANDEM" sft --model "$BATS_TEST_TMPDIR/m" --data "$BATS_FILE_TMPDIR/rev_train.jsonl" \
        --eval-data "$BATS_FILE_TMPDIR/rev_val.jsonl" --out "$BATS_TEST_TMPDIR/o" $REV --batch-size 16 --micro-batches 2 --tp 2 --pp 2
    [ "$status" -eq 0 ]
    echo "eval loss: $(eval_before "$BATS_TEST_TMPDIR/o") -> $(eval_after "$BATS_TEST_TMPDIR/o")"
    below "$(eval_after "$BATS_TEST_TMPDIR/o")" 0.05   # as at 1x1
}

@test "sft: stories260K on held-out TinyStories: eval loss goes down" {
    need_assets
    jq -Rsc 'split("\n\n") | map(select(length > 80)) | .[] | (split(". ")) as $s | select(($s | length) > 2)
             | {prompt: ($s[0] + "."), response: (" " + ($s[1:] | join(". ")))}' \
        "$ASSETS/data/pretrain/tinystories_train_head.txt" > "$BATS_TEST_TMPDIR/all.jsonl"
    head -n 400 "$BATS_TEST_TMPDIR/all.jsonl" > "$BATS_TEST_TMPDIR/train.jsonl"
    sed -n 401,460p "$BATS_TEST_TMPDIR/all.jsonl" > "$BATS_TEST_TMPDIR/val.jsonl"
    "$TANDEM" sft --model "$ASSETS/models/stories260K-hf" --data "$BATS_TEST_TMPDIR/train.jsonl" --eval-data "$BATS_TEST_TMPDIR/val.jsonl" \
        --out "$BATS_TEST_TMPDIR/o" --seq-len 256 --batch-size 8 --max-steps 30 --lr 2e-3 --warmup 3 --threads 2 2>/dev/null
    b=$(eval_before "$BATS_TEST_TMPDIR/o"); a=$(eval_after "$BATS_TEST_TMPDIR/o")
    echo "eval loss $b -> $a"
    # measured 2.047 -> 1.876 (README): a drop of 0.17; 0.1 is well above run-to-run noise (the data
    # and seed are fixed, only thread rounding differs)
    [[ "$a" =~ ^[0-9.]+$ && "$b" =~ ^[0-9.]+$ ]]
    awk -v a="$a" -v b="$b" 'BEGIN { exit !(b - a > 0.1) }'
}

# sft_vs_torch OUT [LAUNCH... -- EXTRA...]: trains stories260K-hf with the fixture's settings (args in
# tests/fixtures/sft/stories260K_6steps.json) on make_data.sh's 8 records, then compares with the torch loop
sft_vs_torch() {
    local out=$1; shift
    local fx="$FIX/sft/stories260K_6steps.json" a
    a=$(jq -r '.args | "--seq-len \(.seq_len) --epochs \(.epochs) --lr \(.lr) --warmup \(.warmup) --weight-decay \(.weight_decay) --clip \(.clip) --lr-schedule \(.schedule)"' "$fx")
    run timeout 300 "$@" --model "$ASSETS/models/stories260K-hf" --data "$BATS_TEST_TMPDIR/d.jsonl" --out "$out" $a
    [ "$status" -eq 0 ]
    run "$ROOT/build/tests/test_checkpoint" torch-sft "$fx" "$ASSETS/models/stories260K-hf" "$out/checkpoint-6" "$out/metrics.jsonl"
    echo "$*:"; echo "$output"
    [ "$status" -eq 0 ]
    grep -q '^steps: 6,' <<<"$output"
    grep -q '^tensors: 47,' <<<"$output"
    grep -q 'ok: torch-sft' <<<"$output"
}

@test "sft vs torch: 6 steps on stories260K (warmup, cosine, clip, decay) equal a plain torch loop: losses, grad norms, every tensor's change; also at tp2 x pp2 with 2 micro-batches and dp2 ZeRO-1" {
    need_assets
    # each step is the whole data set (8 records), so the order records are drawn in only changes
    # summation order; the tolerances are explained in tests/test_checkpoint.c (torch-sft)
    bash "$FIX/sft/make_data.sh" "$ASSETS" > "$BATS_TEST_TMPDIR/d.jsonl"
    [ "$(wc -l < "$BATS_TEST_TMPDIR/d.jsonl")" -eq "$(jq .records "$FIX/sft/stories260K_6steps.json")" ]
    sft_vs_torch "$BATS_TEST_TMPDIR/o1" "$TANDEM" sft --batch-size 8 --threads 2
    sft_vs_torch "$BATS_TEST_TMPDIR/o4" $MPIRUN 4 "$TANDEM" sft --batch-size 4 --micro-batches 2 --tp 2 --pp 2
    sft_vs_torch "$BATS_TEST_TMPDIR/o2" $MPIRUN 2 "$TANDEM" sft --batch-size 4 --zero 1
}

# losses (one per step) of a metrics file

@test "sft: 10 steps straight == 5 steps, stop, resume 5 more (bit for bit), and save->resume into another layout (more in resume_layout.bats)" {
    need_tok
    random_model "$BATS_TEST_TMPDIR/m"
    A="--data $BATS_FILE_TMPDIR/rev_train.jsonl --seq-len 32 --batch-size 16 --max-steps 10 --lr 3e-3 --warmup 2"
    "$TANDEM" sft --model "$BATS_TEST_TMPDIR/m" $A --out "$BATS_TEST_TMPDIR/straight" 2>/dev/null
    "$TANDEM" sft --model "$BATS_TEST_TMPDIR/m" $A --out "$BATS_TEST_TMPDIR/split" --stop-after 5 2>/dev/null
    [ -f "$BATS_TEST_TMPDIR/split/checkpoint-5/trainer_state.json" ]
    "$TANDEM" sft --model "$BATS_TEST_TMPDIR/m" $A --out "$BATS_TEST_TMPDIR/split" --resume "$BATS_TEST_TMPDIR/split/checkpoint-5" 2>/dev/null
    diff <(losses "$BATS_TEST_TMPDIR/straight") <(losses "$BATS_TEST_TMPDIR/split")
    [ "$(losses "$BATS_TEST_TMPDIR/split" | wc -l)" -eq 10 ]
    cmp "$BATS_TEST_TMPDIR/straight/checkpoint-10/model-00001-of-00001.safetensors" "$BATS_TEST_TMPDIR/split/checkpoint-10/model-00001-of-00001.safetensors"
    # resume into tp=2: the weights, data position and optimizer state (resharded) continue (said)
    run timeout 120 $MPIRUN 2 "$TANDEM" sft --model "$BATS_TEST_TMPDIR/m" $A --out "$BATS_TEST_TMPDIR/tp2" --tp 2 \
        --resume "$BATS_TEST_TMPDIR/split/checkpoint-5"
    [ "$status" -eq 0 ]
    [[ "$output" == *"the optimizer state (resharded) continue"* ]]
    # step 6's loss comes before any update: the restored weights on the next batch give the straight
    # run's step-6 loss, within the 1e-5 relative that tp's summation order allows (see the layouts test)
    first=$(losses "$BATS_TEST_TMPDIR/tp2" | head -1); want=$(losses "$BATS_TEST_TMPDIR/straight" | sed -n 6p)
    echo "tp=2 after resume: $first, straight step 6: $want"
    [[ "$first" =~ ^[0-9.]+$ ]]
    awk -v a="$first" -v b="$want" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * b) }'
}

@test "sft: layouts tp=2, pp=2 (1F1B, 4 micro-batches), dp=2 plain and ZeRO-1 follow the 1x1 losses" {
    need_tok
    random_model "$BATS_TEST_TMPDIR/m"
    A="--data $BATS_FILE_TMPDIR/rev_train.jsonl --seq-len 32 --batch-size 8 --micro-batches 4 --max-steps 4 --lr 3e-3"
    "$TANDEM" sft --model "$BATS_TEST_TMPDIR/m" $A --out "$BATS_TEST_TMPDIR/ref" 2>/dev/null
    # dp=2 splits each step's 8 micro-batches 4 + 4: pass --micro-batches 2 per rank
    for l in "2 2 1 4 0" "2 1 2 4 0" "4 2 2 4 0" "2 1 1 2 0" "2 1 1 2 1"; do
        set -- $l
        run timeout 180 $MPIRUN $1 "$TANDEM" sft --model "$BATS_TEST_TMPDIR/m" --data "$BATS_FILE_TMPDIR/rev_train.jsonl" \
            --seq-len 32 --batch-size 8 --micro-batches $4 --max-steps 4 --lr 3e-3 --tp $2 --pp $3 --zero $5 --out "$BATS_TEST_TMPDIR/l"
        [ "$status" -eq 0 ]
        echo "np=$1 tp=$2 pp=$3 M=$4 zero=$5: $(losses "$BATS_TEST_TMPDIR/l" | tr '\n' ' ') vs $(losses "$BATS_TEST_TMPDIR/ref" | tr '\n' ' ')"
        # fp32 with other summation orders (tp all-reduces, per-micro-batch gradient sums), carried
        # through 4 AdamW steps: within 1e-5 relative (measured: 1e-7)
        [ "$(losses "$BATS_TEST_TMPDIR/l" | wc -l)" -eq 4 ]
        [ "$(losses "$BATS_TEST_TMPDIR/ref" | wc -l)" -eq 4 ]
        paste <(losses "$BATS_TEST_TMPDIR/ref") <(losses "$BATS_TEST_TMPDIR/l") |
            awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) bad = 1 } END { exit bad }'
        rm -rf "$BATS_TEST_TMPDIR/l"
    done
}

@test "sft: bad input: existing --out, another model's checkpoint, incomplete checkpoint, malformed data line" {
    need_tok
    random_model "$BATS_TEST_TMPDIR/m"
    mkdir "$BATS_TEST_TMPDIR/exists"; touch "$BATS_TEST_TMPDIR/exists/notes.txt"   # not a run's: an OUT with only metrics.jsonl is fine (faults.bats)
    run "$TANDEM" sft --model "$BATS_TEST_TMPDIR/m" --data "$BATS_FILE_TMPDIR/rev_train.jsonl" --out "$BATS_TEST_TMPDIR/exists"
    [ "$status" -ne 0 ]; [[ "$output" == *"exists: already exists (use --resume DIR to continue a run, or --overwrite)"* ]]
    # another command's complete checkpoint (ppo's state file) blocks a new sft run too
    mkdir -p "$BATS_TEST_TMPDIR/ppo_out/checkpoint-2"; echo '{}' > "$BATS_TEST_TMPDIR/ppo_out/checkpoint-2/ppo_state.json"
    run "$TANDEM" sft --model "$BATS_TEST_TMPDIR/m" --data "$BATS_FILE_TMPDIR/rev_train.jsonl" --out "$BATS_TEST_TMPDIR/ppo_out"
    [ "$status" -ne 0 ]; [[ "$output" == *"ppo_out: already exists (use --resume DIR to continue a run, or --overwrite): it holds checkpoint-2"* ]]
    run "$TANDEM" sft --model "$BATS_TEST_TMPDIR/m" --data "$BATS_FILE_TMPDIR/rev_train.jsonl" --out "$BATS_TEST_TMPDIR/o" \
        --resume "$ASSETS/models/stories260K-hf"
    [ "$status" -ne 0 ]; [[ "$output" == *"a checkpoint of another model"* ]]
    cp -r "$BATS_TEST_TMPDIR/m" "$BATS_TEST_TMPDIR/half"
    run "$TANDEM" sft --model "$BATS_TEST_TMPDIR/m" --data "$BATS_FILE_TMPDIR/rev_train.jsonl" --out "$BATS_TEST_TMPDIR/o" \
        --resume "$BATS_TEST_TMPDIR/half"
    [ "$status" -ne 0 ]; [[ "$output" == *"half/trainer_state.json: missing: not a complete checkpoint"* ]]
    { head -3 "$BATS_FILE_TMPDIR/rev_train.jsonl"; echo '{"prompt": "12="'; } > "$BATS_TEST_TMPDIR/bad.jsonl"
    run "$TANDEM" sft --model "$BATS_TEST_TMPDIR/m" --data "$BATS_TEST_TMPDIR/bad.jsonl" --out "$BATS_TEST_TMPDIR/o2"
    [ "$status" -ne 0 ]; [[ "$output" == *"bad.jsonl:4"* ]]
    [ ! -e "$BATS_TEST_TMPDIR/o2" ]
    run "$TANDEM" sft --model "$BATS_TEST_TMPDIR/m" --data "$BATS_TEST_TMPDIR/bad.jsonl" --out "$BATS_TEST_TMPDIR/o3" --skip-bad-lines --max-steps 1 --batch-size 2
    [ "$status" -eq 0 ]; [[ "$output" == *"1 bad records skipped"* ]]
}

@test "sft: --threads 1, 2 and 3 train the same weights bit for bit (the backward's tiles, not OpenBLAS's threading)" {
    need_assets
    A=(--model "$ASSETS/models/stories260K-hf" --data "$BATS_FILE_TMPDIR/rev_train.jsonl" --seq-len 32 --batch-size 16 --max-steps 4 --lr 1e-3)
    for t in 1 2 3; do "$TANDEM" sft "${A[@]}" --threads $t --out "$BATS_TEST_TMPDIR/t$t" 2>/dev/null; done
    for t in 2 3; do
        diff <(losses "$BATS_TEST_TMPDIR/t1") <(losses "$BATS_TEST_TMPDIR/t$t")
        cmp <(cat "$BATS_TEST_TMPDIR"/t1/checkpoint-4/*.safetensors) <(cat "$BATS_TEST_TMPDIR"/t$t/checkpoint-4/*.safetensors)
    done
}

@test "sft --recompute full: the same losses bit for bit" {
    need_tok
    random_model "$BATS_TEST_TMPDIR/m"
    A="--data $BATS_FILE_TMPDIR/rev_train.jsonl --seq-len 32 --batch-size 16 --max-steps 6 --lr 3e-3"
    "$TANDEM" sft --model "$BATS_TEST_TMPDIR/m" $A --out "$BATS_TEST_TMPDIR/a" 2>/dev/null
    "$TANDEM" sft --model "$BATS_TEST_TMPDIR/m" $A --out "$BATS_TEST_TMPDIR/b" --recompute full 2>/dev/null
    [ "$(losses "$BATS_TEST_TMPDIR/a" | wc -l)" -eq 6 ]
    diff <(losses "$BATS_TEST_TMPDIR/a") <(losses "$BATS_TEST_TMPDIR/b")
    run "$TANDEM" sft --model "$BATS_TEST_TMPDIR/m" $A --out "$BATS_TEST_TMPDIR/c" --recompute some
    [ "$status" -ne 0 ]; [[ "$output" == *"--recompute some: expected full or none"* ]]
}
