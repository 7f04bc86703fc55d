#!/usr/bin/env bash
# Builds an ASan/UBSan tandem in a scratch copy of the tree and runs every fuzz.py target on it.
# Usage: bash tests/fuzz/run.sh [RUNS per target, default 100] [SEED, default 1]
# Minutes, not seconds: a developer tool, not part of `make test`. Problems are kept in
# fuzz-problems/ (input, argv, stderr); the exit status is non-zero if there were any.
# In-process fuzzing of the parsers themselves (libFuzzer, 100,000 executions by default):
# tests/fuzz/libfuzz.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-100} seed=${2:-1}
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
tar --exclude=./build --exclude=./bin --exclude=./.git --exclude=./fuzz-problems -cf - . | tar -xf - -C "$src"
make -C "$src" --no-print-directory -j"$(nproc)" build \
    OPT="-O1 -g -march=native -fsanitize=address,undefined -fno-omit-frame-pointer" \
    LDFLAGS="-fsanitize=address,undefined" >/dev/null
# two pipeline stages under mpirun: a problem that only one stage sees must still be one line
cat > "$src/pp2" <<WRAP
#!/usr/bin/env bash
exec env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 100 \\
    mpirun -q --oversubscribe -np 2 "$src/bin/tandem" "\$@" --pp 2 --threads 1
WRAP
chmod +x "$src/pp2"
status=0
for t in generate checkpoint sft eval; do
    python3 tests/fuzz/fuzz.py "$src/bin/tandem" "$t" --runs "$runs" --seed "$seed" || status=1
done
for t in checkpoint generate; do
    python3 tests/fuzz/fuzz.py "$src/pp2" "$t" --runs "$((runs / 2))" --seed "$seed" || status=1
done
exit $status
