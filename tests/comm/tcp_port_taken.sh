#!/usr/bin/env bash
# tcp_port_taken.sh MODE LAUNCH DRIVER: another process listens on MASTER_PORT, as torchrun's
# agent does with its own store.
#   taken  the job is not told: rank 0 must stop at once, naming the port (exit non-zero)
#   agent  TORCHELASTIC_USE_AGENT_STORE=True: the ranks meet on MASTER_PORT + 1 and run
#          every collective (the driver prints "all checks passed")
set -uo pipefail
mode=$1 launch=$2 driver=$3
holder=$(mktemp); trap 'kill $hp 2>/dev/null; rm -f "$holder"' EXIT
# The held port P, chosen so that P + 1 (where the agent-store mode meets) is free too: a
# port the kernel hands out next to one a concurrent test holds would fail the run for a
# reason that is not the one tested.
python3 -c '
import socket, sys, time
for _ in range(100):
    s = socket.socket(); s.bind(("0.0.0.0", 0)); s.listen(8)
    p = s.getsockname()[1]
    try:
        t = socket.socket(); t.bind(("0.0.0.0", p + 1)); t.close()
        break
    except OSError:
        s.close()
print(p, flush=True); time.sleep(120)' > "$holder" &
hp=$!
for _ in $(seq 50); do [ -s "$holder" ] && break; sleep 0.1; done
port=$(cat "$holder")
[ -n "$port" ] || { echo "FAIL: could not hold a port"; exit 1; }
case $mode in
taken) TCP_LAUNCH_PORT=$port "$launch" 2 "$driver" timeout-recv 2 ;;
agent) TORCHELASTIC_USE_AGENT_STORE=True TCP_LAUNCH_PORT=$port "$launch" 2 "$driver" collectives 2 1 ;;
esac
