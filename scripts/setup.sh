# Shared by scripts/forge, scripts/test and scripts/bench: install missing Debian packages
# (first run only), then configure and build with CMake when the build is out of date.
# Sourced, not executed; sets FORGE_ROOT and FORGE_BUILD.

FORGE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# FORGE_ISA=avx2: Forge's own kernels without their AVX-512 versions (core/kernels/isa.h), built in
# build-avx2, with oneDNN held to AVX2 too, and PyTorch's kernels and OpenBLAS when scripts/bench
# runs them: an AVX-512 machine then tests and measures the path that AVX2-only CPUs take.
FORGE_ISA="${FORGE_ISA:-avx512}"
case "$FORGE_ISA" in
  avx512)
    FORGE_BUILD="${FORGE_BUILD:-$FORGE_ROOT/build}"
    # PyTorch's own kernels (Debian's 1.13) run AVX2 code on AVX-512 CPUs unless asked: the
    # medium GPT bench measured 1523 tok/s for it so, 1837 with AVX-512. scripts/bench runs
    # PyTorch at its best.
    if grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo &&
      grep -qw avx512dq /proc/cpuinfo; then
      export ATEN_CPU_CAPABILITY="${ATEN_CPU_CAPABILITY:-avx512}"
    fi
    ;;
  avx2)
    FORGE_BUILD="${FORGE_BUILD:-$FORGE_ROOT/build-avx2}"
    export ONEDNN_MAX_CPU_ISA="${ONEDNN_MAX_CPU_ISA:-AVX2}"
    export ATEN_CPU_CAPABILITY="${ATEN_CPU_CAPABILITY:-avx2}"
    export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
    ;;
  *) echo "forge: FORGE_ISA must be avx512 or avx2, got '$FORGE_ISA'" >&2; exit 2 ;;
esac

# Oniguruma is the regex engine Hugging Face's tokenizers runs tokenizer.json's Split patterns on,
# so Forge's pre-tokenisation matches it by construction; utf8proc does NFC/NFKC; libsentencepiece
# reads and runs SentencePiece models (data/tokenizer_json.cpp, data/sentencepiece.cpp).
forge_packages=(g++ cmake make pkg-config libdnnl-dev libyaml-cpp-dev libhdf5-dev zlib1g-dev libgtest-dev
                nlohmann-json3-dev libopenmpi-dev openmpi-bin libonig-dev libutf8proc-dev
                libsentencepiece-dev)

forge_install_missing() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "forge: installing Debian packages: ${missing[*]}" >&2
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq >&2 || true
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >&2 ||
    { echo "forge: apt-get install failed for: ${missing[*]}" >&2; exit 1; }
}

# The checking build (scripts/test_sanitized, scripts/fuzz): clang (libFuzzer, and a libstdc++ 12
# that clang 14's ranges support cannot compile), ASan+UBSan, and the fuzz targets, in one
# directory so the two share one compile of the whole tree.
FORGE_CHECK_BUILD="${FORGE_CHECK_BUILD:-$FORGE_ROOT/build-san}"
forge_check_packages=(clang-16 libclang-rt-16-dev libomp-16-dev)

forge_build_checking() {
  forge_install_missing "${forge_packages[@]}" "${forge_check_packages[@]}"
  if [ ! -f "$FORGE_CHECK_BUILD/CMakeCache.txt" ]; then
    local launcher=()
    command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    cmake -S "$FORGE_ROOT" -B "$FORGE_CHECK_BUILD" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_C_COMPILER=clang-16 -DCMAKE_CXX_COMPILER=clang++-16 -DFORGE_SANITIZE=ON \
      -DFORGE_FUZZ=ON "${launcher[@]}" >&2 || { echo "forge: cmake configure failed" >&2; exit 1; }
  fi
  cmake --build "$FORGE_CHECK_BUILD" -j "$(nproc)" -- --no-print-directory "$@" >&2 ||
    { echo "forge: build failed" >&2; exit 1; }
}

forge_build() {
  # `mpirun -np N scripts/forge ...` starts N of these at once: one installs and builds while the
  # others wait, then find the build up to date.
  mkdir -p "$FORGE_BUILD"
  exec 9>"$FORGE_BUILD/.setup.lock"
  flock 9
  forge_install_missing "${forge_packages[@]}"
  if ! grep -qx "FORGE_MAX_ISA:STRING=$FORGE_ISA" "$FORGE_BUILD/CMakeCache.txt" 2>/dev/null; then
    cmake -S "$FORGE_ROOT" -B "$FORGE_BUILD" -DCMAKE_BUILD_TYPE=Release \
      -DFORGE_MAX_ISA="$FORGE_ISA" >&2 || { echo "forge: cmake configure failed" >&2; exit 1; }
  fi
  # make's own dependency tracking decides what is out of date; an up-to-date build costs ~0.2 s.
  cmake --build "$FORGE_BUILD" -j "$(nproc)" -- --no-print-directory "$@" >&2 ||
    { echo "forge: build failed" >&2; exit 1; }
  exec 9>&-
}
