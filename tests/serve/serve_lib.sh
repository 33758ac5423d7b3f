# Shared by the serve tests: start `megatron serve` on a free port and stop it.
#   start_server LOG ARGS...   sets SERVER_PID and URL
#   stop_server                SIGTERM, waits, checks it exited 0
start_server() {
  local log=$1; shift
  rm -f port.txt
  "$M" serve --port 0 --port-file port.txt "$@" >"$log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 300); do
    [ -s port.txt ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$log"; fail "the server exited at start"; }
    sleep 0.1
  done
  [ -s port.txt ] || { cat "$log"; fail "the server did not start"; }
  URL="http://127.0.0.1:$(cat port.txt)"
}
stop_server() {
  kill -TERM "$SERVER_PID"
  local rc=0
  wait "$SERVER_PID" || rc=$?
  [ "$rc" -eq 0 ] || fail "the server exited with $rc after SIGTERM"
}
fail() { echo "FAIL: $*"; [ -n "${SERVER_PID:-}" ] && kill "$SERVER_PID" 2>/dev/null; exit 1; }
# JSON field of stdin: jf 'python expression over j'
jf() { python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"; }
