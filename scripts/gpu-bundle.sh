#!/usr/bin/env bash
# Build here, run on the GPU machine: a lent GPU's time is short, and a fresh machine spends
# about two minutes of it building the library. `pack` builds the named targets in a local
# CUDA build folder (the CI-like machine: Debian 12, nvcc 13, cuDNN and NCCL under
# /usr/local/cuda) and copies what they need to run into one folder: the shared library
# (stripped, xz-compressed: about 15 MB), the executables, and the shared libraries of
# Debian packages that the GPU machine's image lacks (xxHash, PCRE2, utf8proc, simdjson,
# cpp-httplib and brotli; its image has the rest, see gpu-check.sh's header). Name that
# folder in the device call's `carry`; there, `env` unpacks the library and prints the
# LD_LIBRARY_PATH to use (the folder's libraries, the machine's cudart, and cuDNN / NCCL
# from PyTorch's wheels), after checking with ldd that every executable resolves all of
# its libraries. `env` never changes the bundle: it unpacks into a temporary folder.
#
# Usage (here):   scripts/gpu-bundle.sh pack BUILD_DIR BUNDLE_DIR TARGET...
#                 e.g. scripts/gpu-bundle.sh pack build build-bundle bench_gpu_train test_gpu
# Usage (there):  eval "$(scripts/gpu-bundle.sh env BUNDLE_DIR)" && BUNDLE_DIR/bin/test_gpu
#                 scripts/gpu-bundle.sh tests BUNDLE_DIR [GTEST_FILTER]: every test_* executable
#                 of the bundle, one after another (--gtest_brief=1: failures in full), then
#                 one table of passed / failed per executable; non-zero if any failed.
# The GPU tests and benchmarks read nothing from the build folder, so they run from the
# bundle as they do from a build (the tests that read fixtures of the source tree are
# CPU tests).
set -euo pipefail
cmd=${1:-}
case $cmd in
  pack)
    [[ $# -ge 4 ]] || { echo "usage: $0 pack BUILD_DIR BUNDLE_DIR TARGET..." >&2; exit 2; }
    build=$2 out=$3
    shift 3
    grep -q "MCPP_ENABLE_CUDA:BOOL=ON" "$build/CMakeCache.txt" ||
      { echo "gpu-bundle: $build is not a CUDA build (-DMCPP_ENABLE_CUDA=ON)" >&2; exit 1; }
    # Replace only an earlier bundle (never a folder of something else).
    [[ ! -e $out || -f $out/MANIFEST ]] ||
      { echo "gpu-bundle: $out exists and is not a bundle (no MANIFEST); not replacing it" >&2
        exit 1; }
    cmake --build "$build" --target megatron_core "$@"
    rm -rf "$out" && mkdir -p "$out/bin" "$out/lib"
    bins=()
    for t in "$@"; do
      b=$(find "$build" -maxdepth 3 -type f -name "$t" -perm -u+x | head -1)
      [[ -n $b ]] || { echo "gpu-bundle: no executable '$t' in $build" >&2; exit 1; }
      strip --strip-unneeded -o "$out/bin/$t" "$b"
      bins+=("$b")
    done
    strip --strip-unneeded -o "$out/lib/libmegatron_core.so" "$build/libmegatron_core.so"
    # The Debian libraries the GPU machine lacks, as plain files under their sonames.
    lacking='/(libxxhash|libpcre2-8|libutf8proc|libsimdjson|libcpp-httplib|libbrotli)'
    ldd "$build/libmegatron_core.so" "${bins[@]}" |
      awk -v re="$lacking" '$2 == "=>" && $3 ~ re {print $1, $3}' |
      sort -u | while read -r name path; do cp -L "$path" "$out/lib/$name"; done
    xz -T0 -6 "$out/lib/libmegatron_core.so"
    dirty=$(git diff --quiet HEAD -- src || echo " (+ uncommitted changes in src/)")
    { echo "commit $(git rev-parse HEAD)$dirty"
      echo "built $(date -u +%FT%TZ) in $build"; echo "targets $*"; } > "$out/MANIFEST"
    du -sh "$out"
    ;;
  env)
    [[ $# -eq 2 ]] || { echo "usage: $0 env BUNDLE_DIR" >&2; exit 2; }
    dir=$(cd "$2" && pwd)
    lib=$dir/lib
    if [[ -f $lib/libmegatron_core.so.xz ]]; then
      # Unpacked into a folder of its own: the bundle stays as packed (it may be a read-only
      # copy, and a bundle unpacked in place would no longer fit a device call's carry).
      tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpu-bundle-lib.XXXXXX")
      cp "$lib"/* "$tmp"/ && lib=$tmp
      xz -d -f "$lib/libmegatron_core.so.xz" 2>/dev/null ||
        python3 -c "import lzma, sys
open(sys.argv[1][:-3], 'wb').write(lzma.open(sys.argv[1]).read())" "$lib/libmegatron_core.so.xz"
    fi
    pyroot() { python3 -c "import importlib, os
m = importlib.import_module('$1')
print(m.__file__ and os.path.dirname(m.__file__) or list(m.__path__)[0])" 2>/dev/null || true; }
    cudnn=$(pyroot nvidia.cudnn) nccl=$(pyroot nvidia.nccl)
    path="$lib${cudnn:+:$cudnn/lib}${nccl:+:$nccl/lib}:/usr/local/cuda/lib64"
    path="$path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    missing=$(for b in "$dir"/bin/*; do LD_LIBRARY_PATH=$path ldd "$b" |
      sed -n "s|^\(.*not found\)|$(basename "$b"):\1|p"; done | sort -u)
    [[ -z $missing ]] ||
      { echo "gpu-bundle: unresolved libraries:" >&2; echo "$missing" >&2; exit 1; }
    echo "export LD_LIBRARY_PATH='$path' NCCL_NVLS_ENABLE=0"
    ;;
  tests)
    [[ $# -ge 2 ]] || { echo "usage: $0 tests BUNDLE_DIR [GTEST_FILTER]" >&2; exit 2; }
    dir=$2 filter=${3:-*}
    set +e  # run every executable, whatever the earlier ones did
    envline=$("$0" env "$dir") || exit 1
    eval "$envline"
    cat "$dir/MANIFEST"
    table="| executable | passed | failed | exit |"$'\n'"|---|---|---|---|"
    rc=0
    for b in "$dir"/bin/test_*; do
      [[ -x $b ]] || continue
      log=$(mktemp)
      "$b" --gtest_brief=1 --gtest_filter="$filter" 2>&1 | tee "$log"
      brc=${PIPESTATUS[0]}
      passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
      failed=$(grep -c '^\[  FAILED  \] [A-Za-z]' "$log" || true)
      table+=$'\n'"| $(basename "$b") | ${passed:-0} | $failed | $brc |"
      [[ $brc == 0 ]] || rc=1
      rm -f "$log"
    done
    echo "$table"
    exit $rc
    ;;
  *)
    echo "usage: $0 pack BUILD_DIR BUNDLE_DIR TARGET... | $0 env BUNDLE_DIR |" \
      "$0 tests BUNDLE_DIR [GTEST_FILTER]" >&2
    exit 2
    ;;
esac
