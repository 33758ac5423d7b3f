#!/usr/bin/env bash
# plan_rejects_as_train.sh MEGATRON MPIRUN...: `megatron plan` rejects exactly what
# `megatron train` rejects (issue 23 A.1). Each flag set below is a launch line that training
# refuses -- validate_args's checks, flags known but not implemented, and the trainer's own
# list (training::check_trainer_support, which plan calls too). Both commands must fail,
# and with the same first error line; a valid line must pass both (plan prints its tables).
set -uo pipefail
M=$1; shift
MPI=("$@")
B=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 32
   --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
   --lr 1e-3 --train-iters 3 --threads 1)
first_error() {  # the first error line, without mpirun's "[rank N] " prefix
  sed -E 's/^\[rank [0-9]+\] //' <<<"$1" | grep -m1 -E "^(ERROR|error):" | sed -E 's/^(ERROR|error): *//'
}
fail=0
check() {  # label, world, flags...
  local label=$1 world=$2; shift 2
  local t p rt rp
  if [ "$world" -gt 1 ]; then
    t=$("${MPI[@]}" -np "$world" "$M" train "${B[@]}" "$@" 2>&1); rt=$?
  else
    t=$("$M" train "${B[@]}" "$@" 2>&1); rt=$?
  fi
  p=$("$M" plan "${B[@]}" "$@" --world-size "$world" 2>&1); rp=$?
  if [ $rt -eq 0 ] || [ $rp -eq 0 ] || [ $rt -gt 128 ] || [ $rp -gt 128 ]; then
    echo "FAIL $label: train exit $rt, plan exit $rp"; echo "$t" | tail -3; echo "$p" | tail -3
    fail=1; return
  fi
  local et ep; et=$(first_error "$t"); ep=$(first_error "$p")
  if [ -z "$et" ] || [ "$et" != "$ep" ]; then
    echo "FAIL $label: different errors"; echo "  train: $et"; echo "  plan:  $ep"; fail=1; return
  fi
  echo "ok $label: $et"
}
check moe_with_fp8_param_gather 1 --num-experts 4 --disable-bias-linear --fp8-format hybrid --use-distributed-optimizer --fp8-param-gather
check cp_a2a_heads 1 --cp-comm-type bogus
check save_interval_without_save 1 --save-interval 5
check bf16_on_cpu 1 --bf16 --device cpu
check fp16_on_cpu 1 --fp16 --device cpu
check not_implemented 1 --megatron-fsdp-main-params-dtype bf16
check bf16_moments_without_switch 1 --exp-avg-dtype bf16
check rampup_start_too_big 1 --global-batch-size 8 --rampup-batch-size 8 2 100
check rampup_not_multiple 1 --global-batch-size 8 --rampup-batch-size 3 1 100
check decoupled_min_without_lr 1 --decoupled-min-lr 1e-5
check use_checkpoint_args_without_load 1 --use-checkpoint-args
check warmup_fraction_and_iters 1 --lr-warmup-fraction 0.1 --lr-warmup-iters 2
check async_save_without_save 1 --async-save
check pp_zero 1 --pipeline-model-parallel-size 0
check padded_vocab_below_tokenizer 1 --padded-vocab-size 512
check padded_vocab_not_divisible_by_tp 2 --tensor-model-parallel-size 2 --padded-vocab-size 641
check save_retain_without_save_interval 1 --save /dev/null/ckpt --save-retain-interval 4
check save_retain_not_multiple 1 --save /dev/null/ckpt --save-interval 3 --save-retain-interval 4
check non_persistent_without_type 1 --save /dev/null/ckpt --non-persistent-save-interval 2
check non_persistent_local 1 --save /dev/null/ckpt --non-persistent-save-interval 2 --non-persistent-ckpt-type local
check global_batch 2 --global-batch-size 6 --tensor-model-parallel-size 1
# A launch line training accepts passes the planner too.
if ! out=$("$M" plan "${B[@]}" --global-batch-size 8 --rampup-batch-size 4 4 16 --world-size 1 2>&1); then
  echo "FAIL: plan refused a valid launch line"; echo "$out" | tail -5; fail=1
fi
exit $fail
