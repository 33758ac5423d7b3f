#!/usr/bin/env bash
# plan_cli.sh MEGATRON: `megatron plan` prints the expected assignment, schedules and
# bubble for a few fixed configurations (numbers derived by hand in docs/pipeline.md).
set -u
M=$1
fail=0
expect() {  # expect "description" REGEX  (against $out)
  if ! grep -Eq -- "$2" <<<"$out"; then echo "FAIL: $1: no line matching /$2/"; fail=1; fi
}
run() { out=$("$M" plan "$@" 2>&1) || { echo "FAIL: megatron plan $* exited $?"; echo "$out"; fail=1; }; }

# megatron.md's example: 16 layers, PP 4, V 2; 8 ranks with TP 2 -> DP 1, 8 micro-batches.
run --pipeline-model-parallel-size 4 --num-layers 16 --num-virtual-stages-per-pipeline-rank 2 \
    --micro-batch-size 1 --global-batch-size 8 --world-size 8 --tensor-model-parallel-size 2
expect "kind" "interleaved 1F1B, PP 4, V 2, TP 2, CP 1, DP 1"
expect "micro-batches" "micro-batches: 8 = global batch 8 / \(micro batch 1 x DP 1\), group size 4"
expect "rank 0 layers" "rank 0 +\[0-1\] \[8-9\]"
expect "rank 3 layers" "rank 3 +\[6-7\] \[14-15\]"
expect "rank 3 schedule" "rank 3 +warm-up 4 +F0.0 F1.0 F2.0 F3.0 F0.1 B0.1 F1.1 B1.1"
expect "bubble" "bubble 15.79% \(theory \(p-1\)/\(v\*m\+p-1\) = 15.79%\)"
expect "rank 0 in-flight" "^  0 +24 +4.5 +15.79 +11 \(11\)"

# Same layers through --num-layers-per-virtual-pipeline-stage.
run --pipeline-model-parallel-size 4 --num-layers 16 --num-layers-per-virtual-pipeline-stage 2 \
    --global-batch-size 8
expect "V from K" "PP 4, V 2"

# 1F1B, PP 4, M 8: bubble 3/11; stage 0 holds 4 micro-batches, the last one 1.
run --pipeline-model-parallel-size 4 --num-layers 8 --global-batch-size 16 --micro-batch-size 2
expect "1F1B" "1F1B, PP 4, V 1"
expect "rank 0 schedule" "rank 0 +warm-up 3 +F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7$"
expect "bubble" "step time 33 .*bubble 27.27% \(theory \(p-1\)/\(m\+p-1\) = 27.27%\)"
expect "in-flight 0" "^  0 +24 +9 +27.27 +4 \(4\)"
expect "in-flight 3" "^  3 +24 +9 +27.27 +1 \(1\)"

# --pipeline-model-parallel-layout: 4 stages over PP 2 set V 2; layers numbered in stage
# order, rank r holding stages r and r + PP; the layout's rows name E, m and L.
run --pipeline-model-parallel-size 2 --num-layers 7 --mtp-num-layers 1 \
    --pipeline-model-parallel-layout "Et*2|(tt|)*2tmL" --global-batch-size 4
expect "layout V" "interleaved 1F1B, PP 2, V 2"
expect "layout rank 0" "rank 0 +\[0-1\] \[4-5\] +\(4 layers\)"
expect "layout rank 1" "rank 1 +\[2-3\] \[6\] +\(3 layers\)"
expect "layout row 0" "^  rank 0: E t0-t1 \| t4-t5$"
expect "layout row 1" "^  rank 1: t2-t3 \| t6 m L$"
run --pipeline-model-parallel-size 2 --num-layers 4 --pipeline-model-parallel-layout "E|ttttL" \
    --global-batch-size 4
expect "embedding stage" "rank 0 +\[\] +\(0 layers\)"
expect "embedding row" "^  rank 0: E$"

# Uneven stages and transfers shown.
run --pipeline-model-parallel-size 4 --num-layers 14 --decoder-first-pipeline-num-layers 2 \
    --decoder-last-pipeline-num-layers 2 --global-batch-size 4 --show-p2p
expect "uneven" "rank 1 +\[2-6\] +\(5 layers\)"
expect "p2p" "rank 1 +warm-up 2 +<a0 F0 >a0 <a1 F1 >a1 <a2 F2 \[>a2 <g0\] B0 \[>g0 <a3\]"

# GPipe holds every micro-batch.
run --pipeline-model-parallel-size 2 --num-layers 4 --global-batch-size 4 --schedule gpipe
expect "gpipe" "^  0 +12 +3 +20.00 +4 \(4\)"

[ $fail -eq 0 ] && echo "ok"
exit $fail
