# shellcheck shell=bash
# tests/cuda/device_env.sh — source it on the GPU machine, from the repo root, with the bundle that
# tests/cuda/bundle.sh made carried along:
#     source tests/cuda/device_env.sh            # bundle in .device/ (or $TANDEM_BUNDLE)
#     source tests/cuda/device_env.sh DIR
# Unpacks DIR/libs.tar.xz to /tmp/tandem-libs (once per tarball), then exports LD_LIBRARY_PATH (bundled
# libraries, then /usr/local/cuda/lib64, then any pip nvidia/ cuBLAS / cudart / NCCL dirs, then what was there),
# PATH, Open MPI's relocation and singleton variables, TANDEM (the bundled binary) and TANDEM_ASSETS.
# Writes only under /tmp (and nothing in DIR). Sourcing it twice gives the same environment.
# `without_bundle CMD ...` runs CMD with the LD_LIBRARY_PATH and PATH from before.
# Returns non-zero (without exiting the shell) if the bundle is missing or does not unpack.

_tandem_env() {
    local dir="${TANDEM_BUNDLE:-.device}"
    if [ -n "${1:-}" ] && [ -f "$1/libs.tar.xz" ]; then dir="$1"; fi
    [ -f "$dir/libs.tar.xz" ] || { echo "device_env: $dir/libs.tar.xz missing (run tests/cuda/bundle.sh and carry its DIR)" >&2; return 1; }
    dir="$(cd "$dir" && pwd)"
    local dest=/tmp/tandem-libs
    local stamp
    stamp="$(cksum < "$dir/libs.tar.xz")"
    local state="cached" py
    py="$(command -v python3 2>/dev/null)" && [ -x "$py" ] || py=""
    if [ "$(cat "$dest/.stamp" 2>/dev/null)" != "$stamp" ]; then
        rm -rf "$dest" "$dest.part"
        # python3 first (always there on the GPU machine; needs no xz-utils, and no mkdir / mv / tar,
        # which link libselinux -> libpcre2-8, one of the libraries this bundle stands in for)
        if [ -n "$py" ]; then
            LD_LIBRARY_PATH="${TANDEM_ENV_ORIG_LD-${LD_LIBRARY_PATH:-}}" "$py" -B -c '
import os, sys, tarfile
src, dest, stamp = sys.argv[1:]
with tarfile.open(src, "r:xz") as t:
    t.extractall(dest + ".part", **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))
with open(dest + ".part/.stamp", "w") as f:
    f.write(stamp + "\n")
os.rename(dest + ".part", dest)' "$dir/libs.tar.xz" "$dest" "$stamp" || { echo "device_env: unpacking (python3) failed" >&2; return 1; }
            state="unpacked (python3)"
        else
            mkdir -p "$dest.part" && xz -dc "$dir/libs.tar.xz" | tar -C "$dest.part" -xf - &&
                echo "$stamp" > "$dest.part/.stamp" && mv "$dest.part" "$dest" ||
                { echo "device_env: unpacking (xz | tar) failed" >&2; return 1; }
            state="unpacked (xz)"
        fi
    fi
    local TANDEM_OMPI_PKGLIB TANDEM_OMPI_BIN TANDEM_OMPI_VERSION TANDEM_PMIX TANDEM_BUNDLE_LIBS
    . "$dest/bundle.env" || return 1

    # CUDA from the pip wheels (nvidia/cublas/lib, nvidia/cu13/lib, ...), after the toolkit's own
    local nv=""
    if [ -n "$py" ]; then
        nv="$(LD_LIBRARY_PATH="${TANDEM_ENV_ORIG_LD-${LD_LIBRARY_PATH:-}}" "$py" -B -c '
import glob, os, site
dirs = []
for sp in site.getsitepackages() + [site.getusersitepackages()]:
    for pat in ("libcublas.so.13*", "libcudart.so.13*", "libnccl.so.2*"):
        for f in sorted(glob.glob(os.path.join(sp, "nvidia", "**", pat), recursive=True)):
            if os.path.dirname(f) not in dirs:
                dirs.append(os.path.dirname(f))
print(":".join(dirs))' 2>/dev/null)"
    fi

    # the environment from before the first sourcing, so a second one does not stack
    if [ -z "${TANDEM_ENV_ORIG_SET:-}" ]; then
        export TANDEM_ENV_ORIG_SET=1 TANDEM_ENV_ORIG_LD="${LD_LIBRARY_PATH:-}" TANDEM_ENV_ORIG_PATH="$PATH"
    fi
    export LD_LIBRARY_PATH="$dest/lib:/usr/local/cuda/lib64${nv:+:$nv}${TANDEM_ENV_ORIG_LD:+:$TANDEM_ENV_ORIG_LD}"
    export PATH="$dir/bin:$dest/$TANDEM_OMPI_BIN:/usr/local/cuda/bin:$TANDEM_ENV_ORIG_PATH"

    # Open MPI 4.1, relocated: OPAL_PREFIX moves bindir (orted), pkglibdir (MCA plugins) and pkgdatadir
    # (help files) but not sysconfdir (/etc/openmpi), hence the explicit param and hostfile paths.
    export OPAL_PREFIX="$dest/ompi"
    export OMPI_MCA_mca_base_component_path="$dest/$TANDEM_OMPI_PKGLIB"
    export OMPI_MCA_mca_base_param_files="$dest/ompi/etc/openmpi-mca-params.conf"
    export OMPI_MCA_orte_default_hostfile="$dest/ompi/etc/openmpi-default-hostfile"
    # singleton MPI_Init (no mpirun) without forking orted / a PMIx server; Tandem never spawns
    export OMPI_MCA_ess_singleton_isolated=1
    # no ssh / rsh there: mpirun on one node must not look for them
    export OMPI_MCA_plm_rsh_agent=false
    # containers: no ptrace between ranks (CMA), small /dev/shm is still fine for a few ranks
    export OMPI_MCA_btl_vader_single_copy_mechanism=none
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    # PMIx (orted and mpirun only): Debian's install dirs are absolute, so PMIX_PREFIX alone moves none
    if [ -n "$TANDEM_PMIX" ]; then
        local p="$dest/$TANDEM_PMIX"
        export PMIX_PREFIX="$p" PMIX_EXEC_PREFIX="$p" PMIX_LIBDIR="$p/lib" PMIX_PKGLIBDIR="$p/lib/pmix" \
               PMIX_DATADIR="$p/share" PMIX_PKGDATADIR="$p/share/pmix" PMIX_SYSCONFDIR="$p/share" \
               PMIX_MCA_mca_base_component_path="$p/lib/pmix"
    fi
    # hwloc loads only its built-in components (no plugins of another hwloc found on the machine)
    export HWLOC_PLUGINS_PATH="$dest/hwloc-plugins"

    export TANDEM_BUNDLE="$dir" TANDEM="$dir/bin/tandem"
    if [ -d "$dir/assets" ]; then export TANDEM_ASSETS="$dir/assets"; fi

    local cub="none" d
    for d in /usr/local/cuda/lib64 ${nv//:/ }; do
        if [ -e "$d/libcublas.so.13" ]; then cub="$d"; break; fi
    done
    echo "device_env: $state $dest ($TANDEM_BUNDLE_LIBS libs, Open MPI $TANDEM_OMPI_VERSION); LD_LIBRARY_PATH=$LD_LIBRARY_PATH;" \
         "libcublas.so.13 in $cub; OPAL_PREFIX=$OPAL_PREFIX OMPI_MCA_ess_singleton_isolated=1 OMPI_ALLOW_RUN_AS_ROOT=1;" \
         "PATH+=$dir/bin; TANDEM=$TANDEM${TANDEM_ASSETS:+ TANDEM_ASSETS=$TANDEM_ASSETS}"
}
# run a program with the environment from before (python3 + torch, nvcc, gcc: the bundled Debian
# libz / libssl / libgomp ... would otherwise come first for them too)
without_bundle() { env LD_LIBRARY_PATH="${TANDEM_ENV_ORIG_LD:-}" PATH="${TANDEM_ENV_ORIG_PATH:-$PATH}" "$@"; }
_tandem_env "$@"
