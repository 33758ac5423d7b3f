#!/usr/bin/env bash
# tcp_port_taken.sh MODE LAUNCH DRIVER: another process listens on MASTER_PORT, as torchrun's
# agent does with its own store.
#   taken  the job is not told: rank 0 must stop at once, naming the port (exit non-zero)
#   agent  TORCHELASTIC_USE_AGENT_STORE=True: the ranks meet on MASTER_PORT + 1 and run
#          every collective (the driver prints "all checks passed")
set -uo pipefail
mode=$1 launch=$2 driver=$3
holder=$(mktemp); trap 'kill $hp 2>/dev/null; rm -f "$holder"' EXIT
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("0.0.0.0", 0)); s.listen(8)
print(s.getsockname()[1], flush=True); time.sleep(120)' > "$holder" &
hp=$!
for _ in $(seq 50); do [ -s "$holder" ] && break; sleep 0.1; done
port=$(cat "$holder")
[ -n "$port" ] || { echo "FAIL: could not hold a port"; exit 1; }
case $mode in
taken) TCP_LAUNCH_PORT=$port "$launch" 2 "$driver" timeout-recv 2 ;;
agent) TORCHELASTIC_USE_AGENT_STORE=True TCP_LAUNCH_PORT=$port "$launch" 2 "$driver" collectives 2 1 ;;
esac
