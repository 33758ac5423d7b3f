#!/usr/bin/env bash
# example_scripts.sh MEGATRON GPT2_DIR MPIRUN...: the flag sets of Megatron-LM's
# own example scripts train on the CPU under mpirun, sizes scaled down, every other flag as
# the script writes it:
#   * examples/gpt3/train_gpt3_175b_distributed.sh (the version with
#     --rampup-batch-size 16 16 5859375): TP2 x PP2 here (TP8 x PP16 there), the ramp
#     2 2 24, GPT-2 BPE on real preprocessed data, --save = --load; launched twice, the
#     second launch resumes from the first's checkpoint;
#   * examples/llama/train_llama3_8b_h100_fp8.sh (MOCK data branch): DP2 with the
#     distributed optimizer and both overlaps, decoupled LR, --apply-layernorm-1p,
#     --no-mmap-bin-files, --empty-unused-memory-level 1, sample-based schedule.
# Left out, and why:
#   precision (the brief's one exception): --fp16; --bf16 --grad-reduce-in-bf16, and the
#     fp8 block (--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max
#     --fp8-param-gather);
#   GPU-only by their nature: --attention-backend fused (a cuDNN kernel; the CPU has one
#     attention kernel) and --profile --profile-step-start 4 --profile-step-end 6 (CUDA
#     event timing) -- both errors on the CPU that name the flag;
#   other helpers' flags, to be added here when their branches land: --tensorboard-dir
#     (TensorBoard writer) and --calculate-per-token-loss (loss normalisation).
set -euo pipefail
M=$1; G=$2; shift 2
MPI=("$@")
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
run() { local log=$1; shift; "$@" >"$log" 2>&1 || { echo "FAILED: $*"; tail -30 "$log"; exit 1; }; }

# ---- GPT-3 175B ---------------------------------------------------------------------------
python3 - "$W" <<'PY'
import json, random, sys
random.seed(5)
words = "the of and to in a is that for it as was with be by on not he this are or his".split()
with open(f"{sys.argv[1]}/c.jsonl", "w") as f:
    for _ in range(2000):  # the script's --split 949,50,1 leaves the test split 1/1000
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(random.randrange(20, 80)))}) + "\n")
PY
"$M" preprocess --input "$W/c.jsonl" --output-prefix "$W/c" --tokenizer-type GPT2BPETokenizer \
  --vocab-file "$G/encoder.json" --merge-file "$G/vocab.bpe" --append-eod --workers 1 > /dev/null
CHECKPOINT_PATH=$W/gpt3_ckpt
GPT_MODEL_ARGS=(--num-layers 4 --hidden-size 64 --num-attention-heads 8 --seq-length 64
  --max-position-embeddings 64 --attention-backend auto)
TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size 8 --rampup-batch-size 2 2 24
  --train-iters 12 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006
  --clip-grad 1.0 --lr 6.0e-5 --lr-decay-style cosine --min-lr 6.0e-6 --lr-warmup-fraction .001
  --lr-decay-iters 10)
MODEL_PARALLEL_ARGS=(--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2)
DATA_ARGS=(--data-path "$W/c_text_document" --vocab-file "$G/encoder.json"
  --merge-file "$G/vocab.bpe" --split 949,50,1)
EVAL_AND_LOGGING_ARGS=(--log-interval 2 --save-interval 5 --eval-interval 5
  --save "$CHECKPOINT_PATH" --load "$CHECKPOINT_PATH" --eval-iters 2)
GPT3=("${GPT_MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" "${MODEL_PARALLEL_ARGS[@]}" "${DATA_ARGS[@]}"
  "${EVAL_AND_LOGGING_ARGS[@]}" --threads 1)
run "$W/gpt3.log" "${MPI[@]}" -np 4 "$M" train "${GPT3[@]}"
# The ramp as Megatron computes it: one increment per 24 / 3 = 8 samples.
python3 - "$W/gpt3.log" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
got = [(int(m[1]), int(m[2]), int(m[3])) for m in re.finditer(
    r"iteration +(\d+)/ +12 \| consumed samples: +(\d+) .*?global batch size: +(\d+) \|", text)]
consumed, want = 0, {}
for it in range(1, 13):
    b = 8 if consumed > 24 else 2 + int(consumed / 8.0) * 2
    consumed += b
    want[it] = (it, consumed, b)
assert [g[0] for g in got] == [2, 4, 6, 8, 10, 12], got
for g in got:
    assert g == want[g[0]], f"log {g} != formula {want[g[0]]}"
assert "validation loss at iteration 10" in text
print("GPT-3 175B flags (TP2 x PP2, ramp-up): logged", got)
PY
grep -q "successfully saved checkpoint from iteration       12" "$W/gpt3.log" ||
  { echo "no final checkpoint"; exit 1; }
run "$W/gpt3_again.log" "${MPI[@]}" -np 4 "$M" train "${GPT3[@]}"
grep -q "successfully loaded checkpoint from $CHECKPOINT_PATH \[ iteration 12 \]" "$W/gpt3_again.log" ||
  { echo "the second launch did not resume"; tail -20 "$W/gpt3_again.log"; exit 1; }

# ---- Llama-3 8B (MOCK data) ---------------------------------------------------------------
CHECKPOINT_PATH=$W/llama_ckpt
MODEL_ARGS=(--use-mcore-models --num-layers 2 --hidden-size 64 --ffn-hidden-size 224
  --num-attention-heads 8 --group-query-attention --num-query-groups 2 --kv-channels 16
  --seq-length 64 --max-position-embeddings 64 --position-embedding-type rope
  --rotary-base 1000000 --rotary-percent 1.0 --attention-dropout 0.0 --hidden-dropout 0.0
  --swiglu --init-method-std 0.0134 --apply-layernorm-1p --untie-embeddings-and-output-weights
  --disable-bias-linear)
TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size 8 --train-samples 96
  --lr-decay-samples 90 --lr-warmup-samples 8 --lr 0.00015 --min-lr 0.00001
  --decoupled-lr 5.0e-4 --decoupled-min-lr 4.5e-5 --lr-decay-style cosine --clip-grad 1.0
  --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --cross-entropy-loss-fusion
  --manual-gc --empty-unused-memory-level 1 --exit-duration-in-mins 235
  --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather)
MODEL_PARALLEL_ARGS=(--tensor-model-parallel-size 1 --context-parallel-size 1 --sequence-parallel)
DATA_ARGS_LIST=(--mock-data --tokenizer-type NullTokenizer --vocab-size 1000
  --data-cache-path "$W/cache" --tiktoken-pattern v2 --split 99,1,0
  --no-create-attention-mask-in-dataloader --no-mmap-bin-files --num-workers 1)
EVAL_AND_LOGGING_ARGS=(--log-interval 1 --eval-iters 2 --eval-interval 5 --save-interval 6
  --log-throughput --ckpt-format torch_dist --distributed-timeout-minutes 60
  --save "$CHECKPOINT_PATH" --load "$CHECKPOINT_PATH")
run "$W/llama.log" "${MPI[@]}" -np 2 "$M" train "${MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" \
  "${MODEL_PARALLEL_ARGS[@]}" "${DATA_ARGS_LIST[@]}" "${EVAL_AND_LOGGING_ARGS[@]}" --threads 1
python3 - "$W/llama.log" <<'PY'
import math, re, sys
text = open(sys.argv[1]).read()
rows = [(int(m[1]), float(m[2]), float(m[3]), float(m[4])) for m in re.finditer(
    r"iteration +(\d+)/ +12 \|.*?learning rate: (\S+) \| decoupled learning rate: (\S+) \|.*?"
    r"lm loss: (\S+) \|", text)]
assert [r[0] for r in rows] == list(range(1, 13)), [r[0] for r in rows]
# Megatron's cosine schedule in samples (warmup 8, decay 90), for each group's max/min.
def lr(n, mx, mn):
    if n <= 8: return mx * n / 8
    if n > 90: return mn
    return mn + 0.5 * (math.cos(math.pi * (n - 8) / (90 - 8)) + 1) * (mx - mn)
for it, main, dec, loss in rows:
    n = it * 8
    assert abs(main - lr(n, 1.5e-4, 1e-5)) <= 1e-6 * main, (it, main, lr(n, 1.5e-4, 1e-5))
    assert abs(dec - lr(n, 5e-4, 4.5e-5)) <= 1e-6 * dec, (it, dec, lr(n, 5e-4, 4.5e-5))
assert rows[-1][3] < rows[0][3], "loss did not fall"
for flag in ("--no-create-attention-mask-in-dataloader", "--empty-unused-memory-level",
             "--manual-gc", "--cross-entropy-loss-fusion", "--use-mcore-models"):
    assert f"{flag} " in text and "accepted by design" in text, f"{flag}: no reason printed"
print(f"Llama-3 8B flags (DP2, dist-opt): 12 iterations, loss {rows[0][3]:.3f} -> {rows[-1][3]:.3f}, "
      "both learning rates as the schedule")
PY
# ---- DeepSeek-V3 (examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh, its Megatron flags) ----
# The script's model and training flags outside its Megatron-FSDP block (--use-megatron-fsdp
# and the flags that go with it are not implemented), scaled down: 5 layers (2 dense, as its
# [0]*3+[1]*58), 8 experts in 4 groups, EP2 over the 2 ranks (EP${EP} there), mock data for its
# Hugging Face tokenizer's corpus. Left out: --bf16 and --log-memory-to-tensorboard (the GPU's),
# and --moe-router-pre-softmax, which Megatron ignores with sigmoid routing (an error here:
# docs/from-megatron.md). Its --moe-router-force-load-balancing routes by random logits.
CHECKPOINT_PATH=$W/dsv3_ckpt
DSV3=(--tensor-model-parallel-size 1 --expert-model-parallel-size 2 --expert-tensor-parallel-size 1
  --context-parallel-size 1 --use-distributed-optimizer --overlap-grad-reduce
  --overlap-param-gather --use-mcore-models --sequence-parallel --use-flash-attn
  --disable-bias-linear --micro-batch-size 1 --global-batch-size 4 --train-samples 40
  --exit-duration-in-mins 220 --no-check-for-nan-in-loss-and-grad --manual-gc
  --manual-gc-interval 10 --recompute-granularity selective
  --recompute-modules mlp moe mla_up_proj layernorm --transformer-impl transformer_engine
  --seq-length 64 --data-cache-path "$W/dsv3_cache" --mock-data --tokenizer-type NullTokenizer
  --vocab-size 200 --split 99,1,0 --no-mmap-bin-files --no-create-attention-mask-in-dataloader
  --num-workers 6 --num-layers 5 --hidden-size 64 --ffn-hidden-size 128
  --num-attention-heads 4 --kv-channels 16 --max-position-embeddings 64
  --position-embedding-type rope --rotary-base 10000 --make-vocab-size-divisible-by 32
  --normalization RMSNorm --norm-epsilon 1e-6 --swiglu --untie-embeddings-and-output-weights
  --multi-latent-attention --attention-dropout 0.0 --hidden-dropout 0.0 --clip-grad 1.0
  --weight-decay 0.1 --qk-layernorm --lr-decay-samples 40 --lr-warmup-samples 8
  --lr-warmup-init 3.9e-7 --lr 3.9e-3 --min-lr 3.9e-4 --lr-decay-style cosine --adam-beta1 0.9
  --adam-beta2 0.95 --num-experts 8 --moe-layer-freq "[0]*2+[1]*3" --moe-ffn-hidden-size 32
  --moe-shared-expert-intermediate-size 32 --moe-router-load-balancing-type seq_aux_loss
  --moe-router-topk 2 --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep
  --moe-grouped-gemm --moe-aux-loss-coeff 1e-4 --moe-router-group-topk 2
  --moe-router-num-groups 4 --moe-router-topk-scaling-factor 2.5
  --moe-router-score-function sigmoid --moe-router-enable-expert-bias
  --moe-router-bias-update-rate 1e-3 --moe-router-dtype fp32 --moe-permute-fusion
  --moe-router-force-load-balancing --q-lora-rank 32 --kv-lora-rank 16 --qk-head-dim 16
  --qk-pos-emb-head-dim 8 --v-head-dim 16 --rotary-scaling-factor 40 --mscale 1.0
  --mscale-all-dim 1.0 --mtp-num-layers 1 --mtp-loss-scaling-factor 0.1 --eval-iters 2
  --eval-interval 5 --auto-detect-ckpt-format --load "$CHECKPOINT_PATH"
  --save "$CHECKPOINT_PATH" --save-interval 5 --dist-ckpt-strictness log_all
  --init-method-std 0.02 --log-timers-to-tensorboard --log-num-zeros-in-grad --log-params-norm
  --log-validation-ppl-to-tensorboard --log-throughput --log-interval 1 --logging-level 20
  --tensorboard-dir "$W/dsv3_tb" --enable-experimental --threads 1)
run "$W/dsv3.log" "${MPI[@]}" -np 2 "$M" train "${DSV3[@]}"
python3 - "$W/dsv3.log" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
rows = [(int(m[1]), float(m[2]), float(m[3])) for m in re.finditer(
    r"iteration +(\d+)/ +10 \|.*?lm loss: (\S+) \| seq_load_balancing_loss: \S+ \| "
    r"mtp_1 loss: (\S+) \|", text)]
assert [r[0] for r in rows] == list(range(1, 11)), [r[0] for r in rows]
assert rows[-1][1] < rows[0][1] and rows[-1][2] < rows[0][2], f"losses did not fall: {rows}"
assert "validation loss at iteration 10" in text
assert "successfully saved checkpoint from iteration       10" in text
print(f"DeepSeek-V3 flags (EP2, flex, MLA, MTP, forced balance): 10 iterations, lm loss "
      f"{rows[0][1]:.3f} -> {rows[-1][1]:.3f}, mtp_1 {rows[0][2]:.3f} -> {rows[-1][2]:.3f}")
PY
echo "example scripts: all three trained"
