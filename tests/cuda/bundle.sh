#!/usr/bin/env bash
# tests/cuda/bundle.sh [DIR] [TEST...] — gather what the already built binaries need to run on a machine
# without our Debian libraries (the lent GPU machine: Ubuntu 24.04-like, CUDA at /usr/local/cuda), into
# DIR (default .device/, git-ignored; carry it to the device). Builds nothing: run `make build -j2`
# (and `make cuda` for build/tests/cuda_vs_cpu) first. TEST: more build/tests/* binaries (name or path).
#
# DIR/bin/tandem, DIR/build/tests/*   the binaries, as built
# DIR/libs.tar.xz                     unpacked by tests/cuda/device_env.sh to /tmp/tandem-libs:
#   lib/            every shared library ldd lists for the binaries, Open MPI's tools and plugins, except
#                   glibc's and libgcc_s / libstdc++ (the target's own) and CUDA's (the target's toolkit)
#   ompi/           an Open MPI prefix (OPAL_PREFIX): bin/ orted, orterun (mpirun), ompi_info; its MCA
#                   plugins and help files at the prefix-relative paths ompi_info reports; etc/ its configs
#   pmix/           PMIx's plugins and help files (PMIX_PREFIX), used by orted / mpirun only
#   hwloc-plugins/  empty on purpose: HWLOC_PLUGINS_PATH points here so no other hwloc's plugins load
#   bundle.env      the prefix-relative paths device_env.sh needs
# DIR/assets/     the small real models from ../shared/assets the device checks use
# DIR/MANIFEST.txt  what is where, and where each library came from
# Idempotent: DIR's entries above are rebuilt each run; nothing else in DIR is touched.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
die() { echo "bundle.sh: $*" >&2; exit 1; }
warn() { echo "bundle.sh: warning: $*" >&2; }

DIR="" TESTS=()
for a in "$@"; do
    if [ -f "build/tests/$a" ] && [ -x "build/tests/$a" ]; then TESTS+=("build/tests/$a")
    elif [[ "$a" == build/tests/* ]]; then [ -x "$a" ] || die "$a: not built"; TESTS+=("$a")
    elif [ -z "$DIR" ]; then DIR="$a"
    else die "$a: not a built build/tests/ binary, and DIR is already $DIR"; fi
done
DIR="${DIR:-.device}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
case "$DIR" in /|"$ROOT"|"$HOME"|/tmp|/usr*|/etc*) die "refusing DIR=$DIR";; esac
case "$DIR" in "$ROOT"/*) git check-ignore -q "$DIR/x" || warn "$DIR is not git-ignored (add it to .git/info/exclude)";; esac

[ -x bin/tandem ] || die "bin/tandem missing: run make build -j2 first"
BINS=(bin/tandem)
[ -x build/tests/cuda_vs_cpu ] && BINS+=(build/tests/cuda_vs_cpu)
for t in "${TESTS[@]+"${TESTS[@]}"}"; do [[ " ${BINS[*]} " == *" $t "* ]] || BINS+=("$t"); done
command -v ompi_info >/dev/null || die "ompi_info not found (Open MPI's tools: apt-get install openmpi-bin)"

# Stale binaries are the easy mistake: the device run would test old code.
newer=$(find runtime kernels tokenizer generate train rlhf eval bench tandem.c -newer bin/tandem \
        \( -name '*.c' -o -name '*.h' -o -name '*.cpp' \) 2>/dev/null | head -3 | tr '\n' ' ')
[ -z "$newer" ] || warn "sources newer than bin/tandem: $newer(rebuild?)"
# -march=native here (AMD znver3): the device CPU may be Intel. AVX2/FMA/BMI2 are everywhere an H100 is;
# AVX-512 or AMD-only opcodes (SSE4a, clzero, mwaitx) would be SIGILL on some hosts.
for b in "${BINS[@]}"; do
    n=$(objdump -d --no-show-raw-insn "$b" 2>/dev/null |
        grep -cE '%zmm|\s(extrq|insertq|movntss|movntsd|clzero|monitorx|mwaitx)\s' || true)
    [ "$n" = 0 ] || warn "$b has $n AVX-512 / AMD-only instructions (build with OPT='-O2 -march=x86-64-v3')"
done

STAGE="$(mktemp -d /tmp/tandem-bundle.XXXXXX)"
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE"/lib "$STAGE"/ompi/bin "$STAGE"/ompi/etc "$STAGE"/pmix "$STAGE"/hwloc-plugins

# --- Open MPI: a relocatable prefix (OPAL_PREFIX moves bindir, pkglibdir, pkgdatadir; not sysconfdir)
opath() { ompi_info --path "$1" --parsable | sed -n "s/^path:$1://p"; }
PREFIX="$(opath prefix)" BINDIR="$(opath bindir)" PKGLIB="$(opath pkglibdir)" PKGDATA="$(opath pkgdatadir)"
SYSCONF="$(opath sysconfdir)"
rel() { case "$2" in "$1"/*) echo "${2#"$1"/}";; *) die "$2 is not under $1";; esac; }
PKGLIB_REL="$(rel "$PREFIX" "$PKGLIB")" PKGDATA_REL="$(rel "$PREFIX" "$PKGDATA")" BINDIR_REL="$(rel "$PREFIX" "$BINDIR")"
mkdir -p "$STAGE/ompi/$PKGLIB_REL" "$STAGE/ompi/$PKGDATA_REL" "$STAGE/ompi/$BINDIR_REL"
cp -L "$PKGLIB"/*.so "$STAGE/ompi/$PKGLIB_REL/"
cp -rL "$PKGDATA"/. "$STAGE/ompi/$PKGDATA_REL/"
cp -L "$SYSCONF"/* "$STAGE/ompi/etc/"
for t in orted orterun ompi_info; do
    p="$BINDIR/$t"; [ -x "$p" ] || p="$(command -v "$t")" || die "$t not found"
    cp -L "$p" "$STAGE/ompi/$BINDIR_REL/$t"
done
ln -s orterun "$STAGE/ompi/$BINDIR_REL/mpirun"
ln -s orterun "$STAGE/ompi/$BINDIR_REL/mpiexec"
OMPI_VERSION="$(ompi_info --version 2>/dev/null | sed -n 's/^Open MPI v//p' | head -1)"

# --- PMIx (external to Debian's Open MPI): its plugins and help files, relocated by PMIX_PREFIX
PMIX_LIB="$(ldd "$PKGLIB"/*.so 2>/dev/null | awk '$1 ~ /^libpmix\.so/ && $3 ~ /^\// {if (!f) print $3; f = 1}')"
PMIX_PREFIX_SRC=""
if [ -n "$PMIX_LIB" ]; then
    d="$(dirname "$(dirname "$(readlink -f "$PMIX_LIB")")")"
    [ -d "$d/lib/pmix" ] && PMIX_PREFIX_SRC="$d"
fi
if [ -n "$PMIX_PREFIX_SRC" ]; then
    mkdir -p "$STAGE/pmix/lib/pmix"
    cp -L "$PMIX_PREFIX_SRC"/lib/pmix/*.so "$STAGE/pmix/lib/pmix/"
    [ -d "$PMIX_PREFIX_SRC/share" ] && cp -rL "$PMIX_PREFIX_SRC/share" "$STAGE/pmix/"
    [ -d "$PMIX_PREFIX_SRC/etc" ] && cp -rL "$PMIX_PREFIX_SRC/etc" "$STAGE/pmix/"
else
    warn "PMIx prefix not found (orted / mpirun may not work; MPI singleton in isolated mode does not need it)"
fi
# settings that name this machine's install dirs (Debian's pmix-mca-params.conf sets
# mca_base_component_path to its plugin dir) would name nothing there: commented out
for f in "$STAGE"/ompi/etc/*.conf "$STAGE"/pmix/share/*.conf "$STAGE"/pmix/etc/*.conf; do
    [ -f "$f" ] || continue
    sed -i -E "s@^([^#].*(${PREFIX%/}/lib/x86_64-linux-gnu/openmpi|${PMIX_PREFIX_SRC:-/nonexistent}).*)@# bundle.sh: \1@" "$f"
done

# --- shared libraries: ldd's closure of every ELF we carry
keep_system='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libnsl|libmvec|libBrokenLocale|libthread_db|libc_malloc_debug|libnss_[a-z0-9_]+|libgcc_s|libstdc\+\+)\.so'
cuda_own='^(libcuda|libcudart|libcublas|libcublasLt|libnvidia-[a-zA-Z0-9_-]+|libnvrtc|libnvJitLink|libcudadevrt)\.so'
ELFS=("${BINS[@]}" "$STAGE/ompi/$BINDIR_REL"/{orted,orterun,ompi_info} "$STAGE/ompi/$PKGLIB_REL"/*.so)
[ -d "$STAGE/pmix/lib/pmix" ] && ELFS+=("$STAGE"/pmix/lib/pmix/*.so)
LDD="$(ldd "${ELFS[@]}" 2>&1)"
missing="$(echo "$LDD" | awk '/=> not found/ {print $1}' | sort -u | tr '\n' ' ')"
[ -z "$missing" ] || die "ldd cannot resolve here: $missing"
: > "$STAGE/libs.txt"
while read -r name path; do
    [[ "$name" =~ $keep_system ]] && continue
    [[ "$name" =~ $cuda_own || "$path" == /usr/local/cuda* ]] && continue
    cp -L "$path" "$STAGE/lib/$name"
    echo "$name <= $(readlink -f "$path")" >> "$STAGE/libs.txt"
done < <(echo "$LDD" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u -k1,1)
nlibs=$(wc -l < "$STAGE/libs.txt")
for must in libmpi.so.40 libopenblas.so.0 libgomp.so.1 libgfortran.so.5 libquadmath.so.0 libsentencepiece.so.0; do
    [ -f "$STAGE/lib/$must" ] || warn "$must not bundled (not in ldd's list?)"
done

cat > "$STAGE/bundle.env" <<EOF
# written by tests/cuda/bundle.sh; read by tests/cuda/device_env.sh (paths relative to the unpacked dir)
TANDEM_OMPI_PKGLIB=ompi/$PKGLIB_REL
TANDEM_OMPI_PKGDATA=ompi/$PKGDATA_REL
TANDEM_OMPI_BIN=ompi/$BINDIR_REL
TANDEM_OMPI_VERSION=$OMPI_VERSION
TANDEM_PMIX=$([ -n "$PMIX_PREFIX_SRC" ] && echo pmix)
TANDEM_BUNDLE_LIBS=$nlibs
EOF

# --- DIR: replace only our own entries
rm -rf "${DIR:?}/bin" "$DIR/build" "$DIR/assets" "$DIR/MANIFEST.txt" "$DIR/libs.tar.xz.part"
for b in "${BINS[@]}"; do mkdir -p "$DIR/$(dirname "$b")"; cp "$b" "$DIR/$b"; done
# The same inputs give the same tar bytes; xz (-2: ~9 s on 2 cores, -6 would take 20-30 s) runs only
# when they changed.
tar -C "$STAGE" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
    --exclude=./libs.txt --exclude=./libs.tar -cf "$STAGE/libs.tar" .
XZ_LEVEL=-2
sum="$(sha256sum < "$STAGE/libs.tar" | cut -c1-64) xz$XZ_LEVEL"
if [ -f "$DIR/libs.tar.xz" ] && [ "$(cat "$DIR/.libs.tar.sha256" 2>/dev/null)" = "$sum" ]; then
    libs_state="unchanged"
else
    rm -f "$DIR/libs.tar.xz" "$DIR/.libs.tar.sha256"
    xz -T2 $XZ_LEVEL < "$STAGE/libs.tar" > "$DIR/libs.tar.xz.part"
    mv "$DIR/libs.tar.xz.part" "$DIR/libs.tar.xz"
    echo "$sum" > "$DIR/.libs.tar.sha256"
    libs_state="written"
fi

# --- models: the small real LLaMA-architecture ones (../shared/assets does not travel)
ASSETS="$ROOT/../shared/assets"
MODELS="stories260K stories260K-hf tinystories-l2c-64d-500it-hf aidreams260K-hf"
if [ -d "$ASSETS/models" ]; then
    mkdir -p "$DIR/assets/models"
    for m in $MODELS; do
        if [ -d "$ASSETS/models/$m" ]; then cp -r "$ASSETS/models/$m" "$DIR/assets/models/"
        else warn "$ASSETS/models/$m missing"; fi
    done
    [ -f "$ASSETS/README.md" ] && cp "$ASSETS/README.md" "$DIR/assets/"
    chmod -R u+w "$DIR/assets"
else
    warn "$ASSETS absent: no real models bundled"
fi

{
    echo "Tandem device bundle, made $(date -u +%FT%TZ) on $(. /etc/os-release; echo "$PRETTY_NAME"), $(ldd --version | head -1)"
    echo "git: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!tests/cuda' 2>/dev/null || echo ' (+ local changes)')"
    echo "Open MPI $OMPI_VERSION prefix $PREFIX; PMIx ${PMIX_PREFIX_SRC:-none}"
    echo "== binaries (sha256)"
    (cd "$DIR" && sha256sum "${BINS[@]}")
    echo "== libs.tar.xz: lib/ ($nlibs libraries), ompi/, pmix/, hwloc-plugins/, bundle.env"
    sed 's/^/  /' "$STAGE/libs.txt"
    echo "== assets"
    [ -d "$DIR/assets" ] && (cd "$DIR" && du -sk assets/models/* | awk '{printf "  %6d KiB  %s\n", $1, $2}')
} > "$DIR/MANIFEST.txt"

total=$(du -sk "$DIR" | awk '{print $1}')
echo "bundle: $DIR $((total / 1024)) MiB: ${BINS[*]}; libs.tar.xz $(($(stat -c %s "$DIR/libs.tar.xz") / 1024)) KiB $libs_state" \
     "($nlibs libs + Open MPI $OMPI_VERSION plugins); assets $( [ -d "$DIR/assets" ] && du -sk "$DIR/assets" | awk '{print $1}' || echo 0) KiB"
[ "$total" -lt $((48 * 1024)) ] || warn "$DIR is $((total / 1024)) MiB: with the working tree it must stay under 64 MiB"
