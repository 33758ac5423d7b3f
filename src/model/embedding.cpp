#include "model/embedding.h"

#include "ops/ops.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mcpp::model {

namespace {
// --reset-position-ids: the ids of this rank's rows [s0, s0 + Sl) of cx.position_ids (the
// SP shard; all of them without SP), sequence-first, as [1, Sl*B] against rows
// [Sl*B, 1, H]: embedding_forward/backward's [B, S] ids for one "sequence" of all the rows.
Tensor shard_ids(const StepContext& cx, int64_t Sl) {
  return cx.position_ids.narrow(cx.s0, Sl).view({1, Sl * cx.B});
}
}  // namespace

void Embedding::add_params(const TransformerConfig& c, std::vector<ParamInfo>& params) {
  const int64_t H = c.hidden_size;
  params.push_back(make_param("embedding.word_embeddings.weight", {c.padded_vocab_size, H},
                              TpSplit::Rows, Init::Normal, c.embedding_init_std(), true, -1,
                              c.tp_size));
  params.back().embedding_or_output = true;  // --decoupled-lr's group
  if (c.learned_positions())
    params.push_back(make_param("embedding.position_embeddings.weight",
                                {c.max_position_embeddings, H}, TpSplit::None, Init::Normal,
                                c.embedding_init_std(), true, -1, c.tp_size, /*sp=*/true));
}

Embedding::Embedding(const TransformerConfig& c, const ParamStore* store)
    : cfg_(&c),
      word_(ParamStore::view(store, "embedding.word_embeddings.weight")),
      pos_(ParamStore::view(store, "embedding.position_embeddings.weight")) {}

void Embedding::saved_specs(const Dims& d, bool copy_batch, Saved& s, const TensorVisitor& v) {
  v(s.tokens, {d.B, d.S}, DType::I64, copy_batch);
  v(s.emb, {d.Sl, d.B, d.H}, d.dt, true);
  v(s.emb_full, {d.S, d.B, d.H}, d.dt, d.sp);
}

void Embedding::scratch_specs(const Dims& d, Workspace& ws, const TensorVisitor& v) {
  v(ws.dx, {d.Tl, d.H}, d.dt, true);
  v(ws.dtmp, {d.Tl, d.H}, d.dt, true);
  v(ws.dtmp_full, {d.T, d.H}, d.dt, d.sp);
}

void Embedding::forward(const Tensor& tokens_in, Saved& s, Tensor& h0_out, const StepContext& cx,
                        int64_t dropout_layer) const {
  const auto& c = *cfg_;
  Stream& st = cx.stream();
  MCPP_CHECK(tokens_in.dim() == 2 && tokens_in.dtype() == DType::I64,
             "tokens must be i64 [B, S], got {}", tokens_in.str());
  const Tensor& tokens = on_device(tokens_in, s.tokens, cx.dev, st);
  const int64_t Sl = cx.Sl, B = cx.B, H = cx.H;
  Tensor emb3 = s.emb;
  Tensor& word = cx.sp ? s.emb_full : emb3;
  ops::embedding_forward(tokens, word_.w, c.tp_rank * c.vocab_local(), word, st);
  if (cx.tp_comm) {
    if (cx.sp)
      parallel::reduce_scatter_to_sp(word, emb3, *cx.tp_comm, st);
    else
      parallel::reduce_from_tp(emb3, *cx.tp_comm, st);
  }
  // each token at its place in its document
  if (c.learned_positions() && cx.position_ids.defined()) {
    Tensor pos = Tensor::empty({Sl, B, H}, emb3.dtype(), emb3.device());
    Tensor rows = pos.view({Sl * B, 1, H});
    ops::embedding_forward(shard_ids(cx, Sl), pos_.w, 0, rows, st);
    ops::add(emb3, pos, emb3, st);
  } else if (c.learned_positions() && cx.uniform_pos)  // under CP: two runs of positions
    for_each_global_run(cx, cx.s0, Sl, [&](int64_t r0, int64_t n, int64_t pos) {
      Tensor rows = emb3.narrow(r0, n);
      ops::position_embedding_forward(pos_.w, pos, rows, st);
    });
  if (c.learned_positions() && !cx.uniform_pos) {  // generation: a row per sequence, own place
    Tensor rows = emb3.view({B, H});
    for (int64_t b = 0; b < B; ++b) {
      Tensor row = rows.narrow(b, 1).view({1, 1, H});
      ops::position_embedding_forward(pos_.w, cx.pos[b], row, st);
    }
  }
  // muP's embedding multiplier (Megatron: after the position embeddings, before dropout).
  if (c.mup.on && c.mup.embedding_mult != 1.0) ops::scale(emb3, c.mup.embedding_mult, st);
  Tensor h0 = h0_out.view({Sl, B, H});
  const int64_t dl = dropout_layer < 0 ? c.num_layers : dropout_layer;
  ops::dropout_add_forward(emb3, Tensor(), cx.p_hidden,
                           dropout_key(c, cx.keys, dl, DropoutSite::Embedding), cx.g, h0, st);
}

// The word embedding's dual: identity after an all-reduce, all-gather after the SP
// reduce-scatter.
void Embedding::backward(const Tensor& tokens_in, Saved& s, Workspace& ws, const StepContext& cx,
                         int64_t dropout_layer) {
  const auto& c = *cfg_;
  Stream& st = cx.stream();
  const int64_t Sl = cx.Sl, B = cx.B, H = cx.H, S = cx.S;
  Tensor dx3 = ws.dx.view({Sl, B, H}), dtmp3 = ws.dtmp.view({Sl, B, H});
  const int64_t dl = dropout_layer < 0 ? c.num_layers : dropout_layer;
  ops::dropout_backward(dx3, cx.p_hidden, dropout_key(c, cx.keys, dl, DropoutSite::Embedding),
                        cx.g, dtmp3, st);
  if (c.mup.on && c.mup.embedding_mult != 1.0) ops::scale(dtmp3, c.mup.embedding_mult, st);
  if (c.learned_positions() && cx.position_ids.defined())
    ops::embedding_backward(dtmp3.view({Sl * B, 1, H}), shard_ids(cx, Sl), 0, pos_.g, st);
  else if (c.learned_positions())
    for_each_global_run(cx, cx.s0, Sl, [&](int64_t r0, int64_t n, int64_t pos) {
      ops::position_embedding_backward(dtmp3.narrow(r0, n), pos, pos_.g, st);
    });
  Tensor dword = dtmp3;
  if (cx.tp_comm) {
    if (cx.sp) {
      dword = ws.dtmp_full.view({S, B, H});
      parallel::reduce_scatter_to_sp_backward(dtmp3, dword, *cx.tp_comm, st);
    } else {
      parallel::reduce_from_tp_backward(dtmp3, *cx.tp_comm, st);
    }
  }
  const Tensor& tokens = tokens_in.device() == cx.dev ? tokens_in : s.tokens;
  ops::embedding_backward(dword, tokens, c.tp_rank * c.vocab_local(), word_.g, st);
}

}  // namespace mcpp::model
