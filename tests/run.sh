#!/usr/bin/env bash
# Runs every tests/*.bats file (bats-core, TAP output) and prints the closing line
# "N passed, N failed, N skipped". A skipped test is never counted as a pass.
# Usage: tests/run.sh [FILE.bats ...]; TANDEM_TEST_SLOW=F multiplies every hang guard (tests/helpers.bash).
set -u
cd "$(dirname "$0")/.."
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(tests/*.bats)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
log=$(mktemp)
bats --tap "${files[@]}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
passed=$(grep -E '^ok ' "$log" | grep -vc '# skip')
skipped=$(grep -E '^ok ' "$log" | grep -c '# skip')
failed=$(grep -cE '^not ok ' "$log")
planned=$(grep -m1 -oE '^1\.\.[0-9]+' "$log" | cut -d. -f3)
# a run killed or crashed part-way reports fewer results than its plan: the missing ones failed
missing=$(( ${planned:-0} - passed - skipped - failed ))
[ "$missing" -gt 0 ] && failed=$((failed + missing))
[ -z "$planned" ] && failed=$((failed + 1))   # no plan line: bats itself did not run
[ "$status" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1   # bats failed with every result ok
rm -f "$log"
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
