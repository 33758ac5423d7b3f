# Shell helpers for the CLI tests that compare training runs by their log lines; sourced.
#   run LOG CMD...         runs CMD with its output in LOG; on failure prints its tail, exits 1
#   lines LOG [A [B]]      the iteration lines of iterations A..B, without the time-dependent
#                          fields (time stamp, elapsed time per iteration)
#   args_line LOG DEST V   the arguments block of LOG has DEST's line reading value V
#   losses LOG             the lm loss of each logged iteration, one a line
#   refused LOG NEEDLE CMD...  CMD must fail, its output (in LOG) naming NEEDLE
#   abc_datasets M DIR     three small token datasets DIR/{a,b,c}_text_document (300, 120 and
#                          150 documents over disjoint token ranges), made by M preprocess
run() { local log=$1; shift; "$@" >"$log" 2>&1 || { echo "FAILED: $*"; tail -30 "$log"; exit 1; }; }
lines() {
  grep -E "iteration +[0-9]+/" "$1" |
    sed -E 's/^ \[[^]]*\]//; s/elapsed time per iteration \(ms\): [0-9.]+ \|//' |
    awk -v a="${2:-1}" -v b="${3:-99}" \
      '{ split($0, f, "/"); n = f[1]; gsub(/[^0-9]/, "", n); if (n + 0 >= a && n + 0 <= b) print }'
}
losses() { grep -oE "lm loss: [0-9.E+-]+" "$1" | awk '{print $3}'; }
refused() {
  local log=$1 needle=$2; shift 2
  if "$@" >"$log" 2>&1; then echo "accepted: $*"; exit 1; fi
  grep -qF -- "$needle" "$log" || { echo "expected '$needle' in:"; tail -20 "$log"; exit 1; }
}
args_line() {
  local dots; dots=$(printf '%*s' $((48 - ${#2})) '' | tr ' ' '.')
  grep -qF "  $2 $dots $3" "$1" || { echo "$1: no '$2 $dots $3' in the arguments block"; exit 1; }
}
abc_datasets() {
  local m=$1 dir=$2 n
  python3 - "$dir" <<'PY'
import json, random, sys
random.seed(11)
for name, n, base in (("a", 300, 0), ("b", 120, 200), ("c", 150, 350)):
    with open(f"{sys.argv[1]}/{name}.jsonl", "w") as f:
        for _ in range(n):
            start = random.randrange(100)
            toks = [str(base + (start + i) % 150) for i in range(random.randrange(20, 90))]
            f.write(json.dumps({"text": " ".join(toks)}) + "\n")
PY
  for n in a b c; do
    "$m" preprocess --input "$dir/$n.jsonl" --output-prefix "$dir/$n" \
      --tokenizer-type NullTokenizer --vocab-size 512 --append-eod --workers 1 > /dev/null
  done
}
