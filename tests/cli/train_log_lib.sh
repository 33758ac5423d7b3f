# Shell helpers for the CLI tests that compare training runs by their log lines; sourced.
#   run LOG CMD...         runs CMD with its output in LOG; on failure prints its tail, exits 1
#   lines LOG [A [B]]      the iteration lines of iterations A..B, without the time-dependent
#                          fields (time stamp, elapsed time per iteration)
#   args_line LOG DEST V   the arguments block of LOG has DEST's line reading value V
run() { local log=$1; shift; "$@" >"$log" 2>&1 || { echo "FAILED: $*"; tail -30 "$log"; exit 1; }; }
lines() {
  grep -E "iteration +[0-9]+/" "$1" |
    sed -E 's/^ \[[^]]*\]//; s/elapsed time per iteration \(ms\): [0-9.]+ \|//' |
    awk -v a="${2:-1}" -v b="${3:-99}" \
      '{ split($0, f, "/"); n = f[1]; gsub(/[^0-9]/, "", n); if (n + 0 >= a && n + 0 <= b) print }'
}
args_line() {
  local dots; dots=$(printf '%*s' $((48 - ${#2})) '' | tr ' ' '.')
  grep -qF "  $2 $dots $3" "$1" || { echo "$1: no '$2 $dots $3' in the arguments block"; exit 1; }
}
