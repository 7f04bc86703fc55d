#!/usr/bin/env bash
# tests/cuda/bundle_selftest.sh [DIR] — check the bundle tests/cuda/bundle.sh made (default .device/)
# on this machine with the Debian libraries it stands in for taken away: as root, in a private mount
# namespace (unshare -m; nothing changes outside it), /usr/lib/x86_64-linux-gnu becomes a tmpfs of
# symlinks to everything but the hidden libraries, and empty files / directories cover Open MPI's
# tools, configs and help files. Three modes:
#   brief     hides Open MPI (+ PMIx), OpenBLAS, SentencePiece, cJSON, PCRE2, utf8proc, curl, hwloc,
#             libevent; unpacks with python3 (tar, mkdir, mv need libpcre2-8, so they are gone too)
#   strict    also every other library the bundle carries except libz (python3 needs it), the Debian
#             plugin dirs of hwloc / UCX / libfabric / verbs, ssh
#   nopython  brief but without python3 and with PCRE2 left (the xz | tar fallback of device_env.sh)
# In each: ldd shows "not found" and tandem does not start; then `source tests/cuda/device_env.sh`,
# ldd resolves everything, and tandem runs --help, eval on every tiny fixture and on the bundled real
# models, eval through MPI_Init as a singleton, an MPI program singleton isolated and with orted,
# mpirun -np 2 tandem eval --tp 2, and cuda_vs_cpu (77 without a GPU: libcudart / libcublas load).
# Writes /tmp/tandem-selftest and /tmp/tandem-libs. Last line: "selftest: N modes passed" or a failure.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
W=/tmp/tandem-selftest
FIXTURES="llama_gqa mistral_swa qwen2_bias qwen2_swa llama3_rope llama_linear_rope llama_sharded llama_mqa llama_odd_vocab"
L=/usr/lib/x86_64-linux-gnu

if [ "${1:-}" != --inside ]; then
    cd "$ROOT" || exit 1
    DIR="$(cd "${1:-.device}" && pwd)" || exit 1
    [ -f "$DIR/libs.tar.xz" ] || { echo "selftest: $DIR/libs.tar.xz missing: run tests/cuda/bundle.sh" >&2; exit 1; }
    [ "$(id -u)" = 0 ] || { echo "selftest: needs root (mount namespace)" >&2; exit 1; }
    rm -rf "$W" && mkdir -p "$W/empty-dir" "$W/orig" && : > "$W/empty-file"
    tar -xJf "$DIR/libs.tar.xz" -C "$W" ./lib   # the bundled library names, for strict mode
    ls "$W/lib" > "$W/bundled.txt" && rm -rf "${W:?}/lib"
    if command -v mpicc >/dev/null; then
        cat > "$W/mpi_hello.c" <<'EOF'
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int r, s;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &s);
    double x = 1.5, y = 0;
    MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    printf("mpi_hello: rank %d of %d, allreduce %g\n", r, s, y);
    MPI_Finalize();
    return 0;
}
EOF
        mpicc "$W/mpi_hello.c" -o "$W/mpi_hello" || exit 1
    fi
    passed=0
    for mode in ${SELFTEST_MODES:-brief strict nopython}; do
        echo "=================== mode $mode"
        unshare -m bash "${BASH_SOURCE[0]}" --inside "$mode" "$DIR" || { echo "selftest: mode $mode FAILED"; exit 1; }
        passed=$((passed + 1))
    done
    echo "selftest: $passed modes passed"
    exit 0
fi

# ---------------------------------------------------------------- inside the namespace
MODE="$2" DIR="$3"
cd "$ROOT" || exit 1
fail() { echo "selftest[$MODE]: FAIL: $*"; exit 1; }

# what to hide from /usr/lib/x86_64-linux-gnu: names, and name prefixes (stem.so and stem.so.*)
brief_re='^lib(mpi|mpi_[a-z0-9_]+|open-pal|open-rte|oshmem|mca_common_[a-z]+|ompitrace|ompi_dbg_msgq|pmix|hwloc|event|event_[a-z]+|event-2\.1|event_[a-z]+-2\.1|openblas|openblas[a-z0-9._-]*|sentencepiece|sentencepiece_train|cjson|cjson_utils|pcre2-8|utf8proc|curl|curl-gnutls|curl-nss)\.(so|a)(\..*)?$'
dir_re='^(openmpi|pmix2|openblas-openmp|openblas-pthread|openblas64-openmp|openblas64-pthread)$'
strict_dir_re='^(hwloc|ucx|libfabric|libibverbs)$'
extra_re=''
case "$MODE" in
    nopython) brief_re="${brief_re/|pcre2-8|/|}";;
    strict)
        while read -r so; do
            stem="${so%%.so*}"
            [ "$stem" = libz ] && continue
            extra_re+="|${stem//+/\\+}"
        done < "$W/bundled.txt"
        extra_re="^(${extra_re#|})\\.so(\\..*)?$";;
esac

cover() { # PATH...: an empty file or directory over each that exists
    local p
    for p in "$@"; do
        if [ -d "$p" ] && [ ! -L "$p" ]; then mount --bind "$W/empty-dir" "$p"
        elif [ -e "$p" ]; then mount --bind "$W/empty-file" "$p"; fi
    done
}
cover /etc/openmpi /usr/share/openmpi /usr/share/pmix /usr/bin/orted /usr/bin/orterun /usr/bin/ompi_info \
      /usr/bin/opal_wrapper /usr/bin/ompi-server /usr/bin/orte-server
case "$MODE" in
    strict) cover /usr/lib/libpsm1 /usr/bin/ssh /usr/bin/rsh /etc/libibverbs.d;;
    nopython) for p in $(type -ap python3); do cover "$p" "$(readlink -f "$p")"; done;;
esac
# the farm: a tmpfs of symlinks into a second view of $L, put over $L in one step (a half-made one
# would lack the loader itself)
mount --bind "$L" "$W/orig" || fail "bind $L"
mkdir -p "$W/farm" && mount -t tmpfs -o mode=755 tandem-selftest "$W/farm" || fail "tmpfs"
hidden=()
for e in "$W/orig"/* "$W/orig"/.[!.]*; do
    n="${e##*/}"
    [ -e "$e" ] || [ -L "$e" ] || continue
    if [[ "$n" =~ $brief_re || "$n" =~ $dir_re ]] || { [ "$MODE" = strict ] && [[ "$n" =~ $extra_re || "$n" =~ $strict_dir_re ]]; }; then
        hidden+=("$n")
        continue
    fi
    ln -s "$e" "$W/farm/$n"
done
mount --bind "$W/farm" "$L" || fail "farm over $L"
# from here on only tools that need none of the hidden libraries (no mount, mkdir, mv, grep, sed, tar)
echo "hidden in $L: ${#hidden[@]} entries (${hidden[*]:0:12} ...)"

T="$DIR/bin/tandem"
echo "--- before: ldd $T"
before="$(ldd "$T" 2>&1)"
nf=0
while IFS= read -r line; do
    [[ "$line" == *"not found"* ]] && { echo "  $line"; nf=$((nf + 1)); }
done <<< "$before"
[ "$nf" -gt 0 ] || fail "nothing is missing before device_env.sh: the hiding did not work"
"$T" --help > /dev/null 2> "$W/err.txt" && fail "tandem ran without the bundle"
echo "  tandem --help without the bundle: $(head -1 "$W/err.txt")"

echo "--- source tests/cuda/device_env.sh $DIR"
rm -rf /tmp/tandem-libs
# shellcheck source=/dev/null
source tests/cuda/device_env.sh "$DIR" || fail "device_env.sh"
source tests/cuda/device_env.sh "$DIR" > "$W/second.txt" || fail "device_env.sh twice"
[[ "$(cat "$W/second.txt")" == "device_env: cached"* ]] || fail "second sourcing did not reuse the unpacked libs"
env > "$W/env1.txt"; source tests/cuda/device_env.sh "$DIR" > /dev/null; env > "$W/env2.txt"
cmp -s "$W/env1.txt" "$W/env2.txt" || fail "sourcing again changed the environment: $(diff "$W/env1.txt" "$W/env2.txt")"

echo "--- after: ldd"
for b in "$T" "$DIR"/build/tests/* "$W/mpi_hello"; do
    [ -x "$b" ] || continue
    out="$(ldd "$b")"
    ! echo "$out" | grep -q "not found" || fail "$b: $(echo "$out" | grep "not found")"
    bundled=$(echo "$out" | grep -c "=> /tmp/tandem-libs/lib/")
    system=$(echo "$out" | grep "=> /" | grep -v "/tmp/tandem-libs/lib/" | awk '{print $1}' | tr '\n' ' ')
    echo "  ${b#"$ROOT"/}: $bundled from /tmp/tandem-libs/lib; system: $system"
done

echo "--- tandem --help"
"$TANDEM" --help | head -2 || fail "--help"

check_eval() { # MODEL REF [extra]: eval passes, greedy exact; prints the summary's key numbers
    local out
    out="$("$TANDEM" eval --dtype fp32 --model "$1" --reference "$2" --max-logprob-diff 1e-4 --quiet "${@:3}" 2> "$W/eval.err")" ||
        fail "eval $1: $out $(cat "$W/eval.err")"
    local s; s="$(echo "$out" | grep '^{"records"')"
    echo "$s" | grep -q '"greedy_mismatches": 0' && echo "$s" | grep -q '"pass": true' || fail "eval $1: $s"
    [ ! -s "$W/eval.err" ] || fail "eval $1 wrote to stderr: $(cat "$W/eval.err")"
    echo "  $(basename "$1"): $(echo "$s" | grep -oE '"(records|max_abs_logprob_diff|greedy_mismatches|tp|pass)": [^,}]+' | tr '\n' ' ')"
}
echo "--- eval, tiny fixtures (tests/fixtures)"
for f in $FIXTURES; do check_eval "tests/fixtures/models/$f" "tests/fixtures/refs/$f.jsonl"; done
echo "--- eval, real models from the bundle ($TANDEM_ASSETS)"
check_eval "$TANDEM_ASSETS/models/stories260K-hf" tests/fixtures/refs/stories260K.jsonl
check_eval "$TANDEM_ASSETS/models/tinystories-l2c-64d-500it-hf" tests/fixtures/refs/tinystories-l2c.jsonl
check_eval "$TANDEM_ASSETS/models/aidreams260K-hf" tests/fixtures/refs/aidreams260K.fp32.jsonl

echo "--- MPI singleton (no mpirun)"
OMPI_COMM_WORLD_SIZE=1 OMPI_COMM_WORLD_RANK=0 check_eval "$TANDEM_ASSETS/models/stories260K-hf" tests/fixtures/refs/stories260K.jsonl
echo "    (that eval ran MPI_Init: OMPI_COMM_WORLD_SIZE=1 makes Tandem start MPI)"
if [ -x "$W/mpi_hello" ]; then
    for iso in 1 0; do
        out="$(OMPI_MCA_ess_singleton_isolated=$iso timeout 60 "$W/mpi_hello" 2> "$W/mpi.err")" || fail "mpi_hello isolated=$iso: $out $(cat "$W/mpi.err")"
        [ ! -s "$W/mpi.err" ] || fail "mpi_hello isolated=$iso stderr: $(cat "$W/mpi.err")"
        echo "  ess_singleton_isolated=$iso: $out"
    done
fi
echo "--- mpirun -np 2 (the bundled orterun and orted)"
out="$(timeout 120 mpirun -q --oversubscribe -np 2 "$TANDEM" eval --dtype fp32 --model tests/fixtures/models/llama_gqa \
        --reference tests/fixtures/refs/llama_gqa.jsonl --tp 2 --quiet 2>&1)" || fail "mpirun: $out"
echo "$out" | grep -q '"pass": true' || fail "mpirun: $out"
echo "  $(command -v mpirun): $(echo "$out" | grep -oE '"(max_abs_logprob_diff|tp|pass)": [^,}]+' | tr '\n' ' ')"

if [ -x "$DIR/build/tests/cuda_vs_cpu" ]; then
    echo "--- cuda_vs_cpu (77 = no CUDA device here; 0 = passed on a GPU)"
    out="$("$DIR/build/tests/cuda_vs_cpu" 2>&1)"; rc=$?
    [ "$rc" = 77 ] || [ "$rc" = 0 ] || fail "cuda_vs_cpu rc=$rc: $out"
    echo "  rc=$rc: $(echo "$out" | tail -1)"
fi
echo "selftest[$MODE]: ok"
