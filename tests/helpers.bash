# Shared by tests/*.bats: paths and small helpers.
bats_require_minimum_version 1.5.0   # `run ! cmd`: a negated bare command would not fail a test (set -e ignores it)
ROOT="$(cd "$(dirname "${BATS_TEST_FILENAME}")/.." && pwd)"
TANDEM="$ROOT/bin/tandem"
ASSETS="$ROOT/../shared/assets"
FIX="$ROOT/tests/fixtures"
# mpirun as CI needs it: root, 2 cores, more ranks than cores; -q keeps Open MPI's MPI_ABORT banner
# off, so an error under mpirun is the one "tandem: ..." line a user sees (README)
MPIRUN="mpirun -q --allow-run-as-root --oversubscribe -np"

# Python with torch + transformers for the reference checks: the project's .venv (`make pyenv`, which
# `make test` runs first). Missing, the check fails: it is a setup bug, not a reason to skip.
HFPY="$ROOT/.venv/bin/python"
need_hfpy() {
    [ -x "$HFPY" ] || { echo "$HFPY missing: run make pyenv (make test does)"; return 1; }
}

need_assets() {
    [ -d "$ASSETS/models" ] || skip "../shared/assets not present (real models and tokenizers live there)"
}

# stories260K and the story data the training and RLHF suites share
STORIES="$ASSETS/models/stories260K-hf"
PF="$FIX/pref"
TRAIN="$FIX/ppo/story_prompts_train.jsonl"
RULE="python3 -u $FIX/ppo/happy_reward.py"
need_story() {
    need_assets
    [ -e "$STORIES/config.json" ] || skip "$STORIES not present (../shared/assets)"
}
