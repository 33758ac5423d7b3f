// Muon (Megatron's --optimizer muon, through NVIDIA's emerging_optimizers package): the
// 2-D weight matrices of the transformer step with orthogonalised momentum; every other
// parameter (embeddings, the output layer, norms, biases) with the scalar rule
// (--muon-scalar-optimizer adam or lion) as AdamW steps it today.
//
// One Muon step of a matrix W with gradient G (clipped as the rest), learning rate lr:
//   W -= lr * wd * W                           (decoupled weight decay, if W decays)
//   M  = mu * M + (1 - mu) * G                  (--muon-momentum mu)
//   U  = nesterov ? (1 - mu) * G + mu * M : M   (--muon-nesterov)
//   W -= lr * s * extra * NS(U)                  (--muon-scale-mode s, --muon-extra-scale-factor)
// NS is --muon-num-ns-steps Newton-Schulz steps with the coefficient set
// --muon-coefficient-type, on U / ||U||_F, on U^T when U has more rows than columns:
//   A = X X^T;  B = b A + c A A;  X = a X + B X
// in bf16 with fp32 accumulation under --muon-fp32-matmul-prec medium (Megatron's default:
// every GEMM's output rounded to bf16), in fp32 under high. With --muon-split-qkv (the
// default) the QKV weight's query, key and value rows are orthogonalised apart.
//
// Tensor parallelism (--muon-tp-mode), for a matrix split over TP (or ETP for experts):
//   duplicated  the shards all-gathered, NS on the whole matrix, this rank's shard kept
//               (the same update as without TP);
//   blockwise   NS on the rank's own shard, scaled by the shard's shape;
//   distributed NS on the shards, the Frobenius norm and the Gram matrix A all-reduced.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model/params.h"
#include "tensor/tensor.h"

namespace mcpp::comm {
class Communicator;
}

namespace mcpp::optim {

enum class MuonScale { Spectral, UnitRmsNorm, ShapeScaling };
enum class MuonTpMode { Blockwise, Duplicated, Distributed };

struct MuonConfig {
  double momentum = 0.9;  // --muon-momentum (Megatron's flag default)
  bool nesterov = false;
  MuonScale scale = MuonScale::Spectral;
  double extra_scale = 1.0;
  std::string coefficients = "quintic";
  int ns_steps = 5;
  bool bf16_matmul = true;  // --muon-fp32-matmul-prec medium
  MuonTpMode tp_mode = MuonTpMode::Duplicated;
  // --muon-split-qkv: the rows of one query group of linear_qkv, [query, key, value]
  // (Megatron's layout); empty: QKV weights are orthogonalised whole.
  std::vector<int64_t> qkv_split;
  // --optimizer adaptive_muon (Megatron's TensorParallelAdaptiveMuon, moment2_method
  // adamuon; OptimizerConfig's adaptive_muon_beta2 / _eps, which no flag sets): after the
  // update above, a second moment per element (ops::adamuon_normalize) and the scale again,
  // of the parameter's local shape (see muon_adaptive_scale).
  bool adaptive = false;
  double adaptive_beta2 = 0.95, adaptive_eps = 1e-8;
};

// The groups a TP-split matrix is orthogonalised over: the TP group, and the expert TP group
// for experts (either may be null or of size 1: no TP).
struct MuonGroups {
  comm::Communicator* tp = nullptr;
  comm::Communicator* expert_tp = nullptr;
};

// Parses Megatron's spellings (validated at start-up: validate_optimizer.cpp).
MuonScale parse_muon_scale(const std::string& s);
MuonTpMode parse_muon_tp_mode(const std::string& s);

// The (a, b, c) of each of `steps` Newton-Schulz steps for a coefficient set: the set's
// tuples in turn, cycling, or repeating the last for polar_express, cans and deepseekv4.
std::vector<std::array<double, 3>> muon_coefficients(const std::string& type, int steps);

// The update's scale for a matrix of the whole layer's shape [out, in].
double muon_scale_factor(MuonScale mode, int64_t out, int64_t in);

// --optimizer adaptive_muon: the factor its update is multiplied by after the second-moment
// normalisation: the scale of the local (this rank's) shape of p times the extra factor, as
// emerging_optimizers' AdaptiveMuon.step applies it to the update it holds -- a TP shard
// under tensor parallelism, and on top of the scale muon_update already applied (Megatron's
// TensorParallelAdaptiveMuon orthogonalises with TensorParallelMuon's scaled function).
double muon_adaptive_scale(const model::ParamInfo& p, const MuonConfig& c);

// Whether Muon steps the parameter (a 2-D matrix that is not the word embedding or the
// output layer, as Megatron's _is_muon_excluded); the rest go to the scalar rule.
bool muon_steps(const model::ParamInfo& p);

// NS(x) for a 2-D fp32 x [r, c] (any device): returns a new fp32 [r, c]. A 3-D x [n, r, c]
// is n matrices, each orthogonalised on its own, their GEMMs batched (on the CPU each
// matrix's bits are those of its own call). dist non-null: x is this rank's shard along
// dim `dim` of a matrix split over dist (tp mode distributed).
Tensor newton_schulz(const Tensor& x, const MuonConfig& c, comm::Communicator* dist, int dim,
                     Stream& s);

// The orthogonalised, scaled update of parameter p for momentum-like u (fp32, p's local
// shape): QKV split, TP mode and scale factor applied. A new fp32 tensor.
Tensor muon_update(const model::ParamInfo& p, const Tensor& u, const MuonConfig& c,
                   const MuonGroups& g, Stream& s);

// muon_update for several parameters at once: the matrices of one shape among them (QKV
// parts and gathered TP shards included) go through Newton-Schulz as one batch, which on a
// GPU turns hundreds of small GEMM launches into a few large ones. Every rank of a TP group
// must pass the same parameters in the same order (the collectives follow it).
std::vector<Tensor> muon_updates(const std::vector<const model::ParamInfo*>& ps,
                                 const std::vector<Tensor>& us, const MuonConfig& c,
                                 const MuonGroups& g, Stream& s);

// Which of `ranks` ranks orthogonalises each matrix when the step is shared out (the
// distributed optimizer: Megatron's layer-wise distributed optimizer gives each data-parallel
// rank whole matrices): the largest Newton-Schulz cost first (rows x cols x min(rows, cols) of
// the local shape), each to the rank with the least cost so far, ties to the lower index and
// the lower rank. A pure function of the shapes and their order, so every rank computes the
// same owners.
std::vector<int> muon_owners(const std::vector<const model::ParamInfo*>& ps, int ranks);

}  // namespace mcpp::optim
