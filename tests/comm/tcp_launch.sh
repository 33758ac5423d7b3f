#!/usr/bin/env bash
# tcp_launch.sh NP CMD ARGS...: starts NP copies of CMD as torchrun would, without MPI:
# RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free
# MASTER_PORT in each one's environment. Output of rank r goes to stdout/stderr as is.
# Exit status: the first non-zero status of any rank, else 0.
#   TCP_LAUNCH_RANKS="0 2"  start only these ranks (a job with missing peers)
#   TCP_LAUNCH_PORT=N       use this port instead of a free one
set -uo pipefail
np=$1; shift
free_port() {  # a port nobody listens on now: bind port 0 and read what the kernel gave
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' \
    2>/dev/null || echo $(( 20000 + $$ % 20000 ))
}
port=${TCP_LAUNCH_PORT:-$(free_port)}
ranks=${TCP_LAUNCH_RANKS:-$(seq 0 $((np - 1)))}
pids=()
for r in $ranks; do
  RANK=$r WORLD_SIZE=$np LOCAL_RANK=$r LOCAL_WORLD_SIZE=$np MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$port "$@" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do
  wait "$p"; rc=$?
  [ $status -eq 0 ] && status=$rc
done
exit $status
