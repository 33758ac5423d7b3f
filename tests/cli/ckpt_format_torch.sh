#!/usr/bin/env bash
# ckpt_format_torch.sh MEGATRON MPIRUN...: `megatron train --ckpt-format torch` (Megatron-LM's
# legacy layout as the run's own checkpoint format) at TP2 x PP2 under mpirun -np 4:
#   * U trains 8 iterations saving at 4 and 8; P stops at 4: iter_0000004/ holds
#     mp_rank_{00,01}_{000,001}/model_optim_rng.pt, the tracker says 4, no temporary folder
#     is left;
#   * resumed from P with --load, iterations 5-8 log exactly as U's (lm loss, grad norm, LR);
#   * --no-load-optim and --finetune load it too (the weights: iteration 5's loss is U's; the
#     Adam moments restart: iteration 6's is not; finetune starts at iteration 1);
#   * `megatron convert --from-megatron` of U's iteration 8 holds the weights and Adam
#     moments of O, the same run saved in megatron.cpp's own format, bit for bit;
#   * --save-retain-interval 8 with saves every 4 deletes iteration 4 once 8 is saved;
#   * a --squared-relu run's checkpoint records the activation (args.squared_relu): it
#     resumes with the flag and is refused as another model without it;
#   * a --qk-layernorm run (TP2, the norms decayed) resumes exactly from its legacy files, in
#     both forms (RMSNorm; LayerNorm, whose q/k norm biases the files hold, with SP);
#   * a CP2 x TP2 run writes TP's folders alone and resumes exactly; so does a run with
#     virtual pipeline stages (model0, model1 in each file), and one with an uneven split.
set -euo pipefail
M=$1; shift
MPI=("$@")
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
F=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 32
   --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
   --global-batch-size 8 --lr 1e-3 --train-iters 8 --log-interval 1 --threads 1 --device cpu
   --hidden-dropout 0.1 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2)
source "$(dirname "$0")/train_log_lib.sh"  # run, lines
T=(--ckpt-format torch)
run "$W/u.log" "${MPI[@]}" -np 4 "$M" train "${F[@]}" "${T[@]}" --save "$W/U" --save-interval 4
run "$W/p.log" "${MPI[@]}" -np 4 "$M" train "${F[@]}" "${T[@]}" --save "$W/P" --save-interval 4 \
    --exit-interval 4
[ "$(cat "$W/P/latest_checkpointed_iteration.txt")" = 4 ] || { echo "P: tracker"; exit 1; }
for r in 00_000 00_001 01_000 01_001; do
  [ -s "$W/P/iter_0000004/mp_rank_$r/model_optim_rng.pt" ] ||
    { echo "P: no mp_rank_$r/model_optim_rng.pt"; find "$W/P"; exit 1; }
done
[ "$(ls "$W/P" | sort | tr '\n' ' ')" = "iter_0000004 latest_checkpointed_iteration.txt " ] ||
  { echo "P: unexpected entries"; ls "$W/P"; exit 1; }
[ "$(ls "$W/U")" = "$(printf 'iter_0000004\niter_0000008\nlatest_checkpointed_iteration.txt')" ] ||
  { echo "U: expected iterations 4 and 8"; ls "$W/U"; exit 1; }

# The resume: iterations 5-8 as U's.
run "$W/r.log" "${MPI[@]}" -np 4 "$M" train "${F[@]}" "${T[@]}" --load "$W/P" --save "$W/P" \
    --save-interval 4
[ "$(lines "$W/r.log" 5 8 | wc -l)" -eq 4 ] || { echo "resume: not 4 iterations"; exit 1; }
diff <(lines "$W/u.log" 5 8) <(lines "$W/r.log" 5 8) ||
  { echo "the resume from the legacy checkpoint differs from the uninterrupted run"; exit 1; }
cmp "$W/U/iter_0000008/mp_rank_01_001/model_optim_rng.pt" \
    "$W/P/iter_0000008/mp_rank_01_001/model_optim_rng.pt" ||
  { echo "the resumed run's iteration 8 file differs from U's"; exit 1; }
# --no-load-optim: the weights and counters, fresh Adam moments; --finetune: from iteration 1.
run "$W/n.log" "${MPI[@]}" -np 4 "$M" train "${F[@]}" --load "$W/U" --ckpt-step 4 --no-load-optim
# Iteration 5's loss comes from the loaded weights (U's); 6's from a step with fresh moments.
diff <(lines "$W/u.log" 5 5) <(lines "$W/n.log" 5 5) ||
  { echo "--no-load-optim: iteration 5 is not U's (weights not loaded?)"; exit 1; }
! diff -q <(lines "$W/u.log" 6 6) <(lines "$W/n.log" 6 6) >/dev/null ||
  { echo "--no-load-optim: iteration 6 equals U's (moments loaded?)"; exit 1; }
run "$W/f.log" "${MPI[@]}" -np 4 "$M" train "${F[@]}" --load "$W/U" --finetune --train-iters 2
grep -q "for finetuning" "$W/f.log" && [ "$(lines "$W/f.log" 1 2 | wc -l)" -eq 2 ] ||
  { echo "--finetune: not loaded from iteration 0"; exit 1; }

# The same run in our own format; the legacy checkpoint converted back holds its tensors.
run "$W/o.log" "${MPI[@]}" -np 4 "$M" train "${F[@]}" --save "$W/O" --save-interval 8
diff <(lines "$W/u.log") <(lines "$W/o.log") || { echo "O differs from U"; exit 1; }
run "$W/c.log" "$M" convert --from-megatron "$W/U" --save "$W/C"
python3 - "$W/O/iter_0000008" "$W/C/iter_0000008" <<'PY'
import json, struct, sys
def tensors(d):
    md = json.load(open(d + "/metadata.json"))
    files, out = {}, {}
    for key, t in md["tensors"].items():
        g = t["global_shape"]; cols = g[1] if len(g) > 1 else 1
        buf = bytearray(4 * (g[0] if g else 1) * cols)
        for s in t["shards"]:
            if s["file"] not in files:
                raw = open(d + "/" + s["file"], "rb").read()
                n = struct.unpack("<Q", raw[:8])[0]
                files[s["file"]] = (json.loads(raw[8:8 + n]), raw[8 + n:])
            hdr, data = files[s["file"]]
            b, _ = hdr[s["name"]]["data_offsets"]
            lcols = s["shape"][1] if len(s["shape"]) > 1 else 1
            for p in s["pieces"]:
                o, lo, sh = p["offsets"], p["local_offsets"], p["shape"]
                pc = sh[1] if len(sh) > 1 else 1
                for r in range(sh[0]):
                    src = b + 4 * ((lo[0] + r) * lcols + (lo[1] if len(lo) > 1 else 0))
                    dst = 4 * ((o[0] + r) * cols + (o[1] if len(o) > 1 else 0))
                    buf[dst:dst + 4 * pc] = data[src:src + 4 * pc]
        out[key] = bytes(buf)
    return out, md["state"]
o, so = tensors(sys.argv[1])
c, sc = tensors(sys.argv[2])
if set(o) != set(c):
    sys.exit(f"different tensors: {sorted(set(o) ^ set(c))}")
bad = [k for k in o if o[k] != c[k]]
if bad:
    sys.exit(f"{len(bad)} tensors differ, e.g. {bad[:3]}")
if so["optimizer_steps"] != sc["optimizer_steps"] or so["iteration"] != sc["iteration"]:
    sys.exit(f"step/iteration differ: {so['optimizer_steps']} {so['iteration']} vs "
             f"{sc['optimizer_steps']} {sc['iteration']}")
print(f"{len(o)} tensors equal")
PY

# --save-retain-interval: iteration 4 goes once 8 is saved.
run "$W/k.log" "${MPI[@]}" -np 4 "$M" train "${F[@]}" "${T[@]}" --save "$W/K" --save-interval 4 \
    --save-retain-interval 8
[ "$(ls "$W/K" | tr '\n' ' ')" = "iter_0000008 latest_checkpointed_iteration.txt " ] ||
  { echo "retention: expected iteration 8 alone"; ls "$W/K"; exit 1; }
# The MLP's activation travels in the args: a --squared-relu run's legacy checkpoint
# resumes with --squared-relu and is refused as another model without it.
S=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 32
   --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
   --global-batch-size 8 --lr 1e-3 --log-interval 1 --threads 1 --device cpu --ckpt-format torch)
run "$W/s.log" "$M" train "${S[@]}" --squared-relu --train-iters 3 --save "$W/S" --save-interval 2 \
    --exit-interval 2
run "$W/s2.log" "$M" train "${S[@]}" --squared-relu --train-iters 3 --load "$W/S"
if "$M" train "${S[@]}" --train-iters 3 --load "$W/S" >"$W/s3.log" 2>&1; then
  echo "a --squared-relu checkpoint loaded into a GELU model"; exit 1
fi
grep -q "squared_relu.*: checkpoint true vs this run false" "$W/s3.log" ||
  { echo "squared ReLU mismatch not named"; tail -5 "$W/s3.log"; exit 1; }
# resumes_exactly TAG NP ARGS...: with --ckpt-format torch, a run of 4 iterations saved at
# 2 and resumed from its legacy files logs iterations 3-4 as the uninterrupted run; the
# saved iteration is left in $W/TAG.
resumes_exactly() {
  local tag=$1 np=$2; shift 2
  local a=("${S[@]}" --hidden-dropout 0 --train-iters 4 "$@")
  run "$W/$tag.u.log" "${MPI[@]}" -np "$np" "$M" train "${a[@]}"
  run "$W/$tag.p.log" "${MPI[@]}" -np "$np" "$M" train "${a[@]}" --save "$W/$tag" \
      --save-interval 2 --exit-interval 2
  run "$W/$tag.r.log" "${MPI[@]}" -np "$np" "$M" train "${a[@]}" --load "$W/$tag"
  diff <(lines "$W/$tag.u.log" 3 4) <(lines "$W/$tag.r.log" 3 4) ||
    { echo "$tag: the legacy resume differs"; exit 1; }
  [ "$(lines "$W/$tag.r.log" 3 4 | wc -l)" -eq 2 ] ||
    { echo "$tag: expected 2 resumed lines"; exit 1; }
}
# --qk-layernorm (with --apply-wd-to-qk-layernorm: the q/k norm weights in the decayed
# group) at TP2: the norms go into the legacy files after linear_qkv.
resumes_exactly qk 2 --normalization RMSNorm --qk-layernorm --apply-wd-to-qk-layernorm \
  --weight-decay 0.1 --tensor-model-parallel-size 2
# The LayerNorm form (GPT's default --normalization): a weight and a bias per norm, both
# decayed, with SP.
resumes_exactly qkln 2 --qk-layernorm --apply-wd-to-qk-layernorm --weight-decay 0.1 \
  --tensor-model-parallel-size 2 --sequence-parallel
for r in 00 01; do
  grep -qa "self_attention.k_layernorm.bias" "$W/qkln/iter_0000002/mp_rank_$r/model_optim_rng.pt" ||
    { echo "qkln: no k_layernorm.bias in mp_rank_$r"; exit 1; }
done
# Context parallelism (CP2 x TP2, -np 4): CP ranks hold the same weights, so the files are
# TP x PP's, written by CP rank 0.
resumes_exactly cp 4 --position-embedding-type rope --context-parallel-size 2 \
  --tensor-model-parallel-size 2
[ "$(ls "$W/cp/iter_0000002" | tr '\n' ' ')" = "mp_rank_00 mp_rank_01 " ] ||
  { echo "CP: expected the TP rank folders alone"; ls "$W/cp/iter_0000002"; exit 1; }
# Virtual pipeline stages (PP2 x 2 chunks of one layer): each rank file holds model0, model1.
resumes_exactly vp 2 --num-layers 4 --pipeline-model-parallel-size 2 \
  --num-layers-per-virtual-pipeline-stage 1
# An uneven split (3 layers over PP2 as 1 | 2): each file numbers its stage's layers from 0
# and the args name the split.
resumes_exactly uneven 2 --num-layers 3 --pipeline-model-parallel-size 2 \
  --decoder-first-pipeline-num-layers 1
echo "ckpt_format_torch: OK"
