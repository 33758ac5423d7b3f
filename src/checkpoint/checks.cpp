#include "checkpoint/checks.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>

#include "base/error.h"

namespace mcpp::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int64_t kMaxDim = int64_t(1) << 40;  // larger than any real tensor dimension

}  // namespace

std::optional<int64_t> parse_iteration_digits(const std::string& digits) {
  if (digits.empty() || digits.size() > 18) return std::nullopt;  // 18 digits < 2^63
  int64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

void check_shape(const Shape& s, const std::string& what) {
  MCPP_CHECK(!s.empty() && s.size() <= 2, "{}: shape {} is not 1- or 2-dimensional", what,
             shape_str(s));
  for (int64_t d : s)
    MCPP_CHECK(d >= 1 && d <= kMaxDim, "{}: shape {} has a dimension outside [1, 2^40]", what,
               shape_str(s));
}

void check_piece(const Piece& s, const Shape& g, const Shape& sh, const std::string& key) {
  // Each sum is compared as a difference of known non-negative bounds: no overflow whatever
  // the metadata holds.
  const bool ok = s.g_row >= 0 && s.g_col >= 0 && s.l_row >= 0 && s.l_col >= 0 && s.rows >= 1 &&
                  s.cols >= 1 && s.g_row <= rows_of(g) && s.rows <= rows_of(g) - s.g_row &&
                  s.g_col <= cols_of(g) && s.cols <= cols_of(g) - s.g_col &&
                  s.l_row <= rows_of(sh) && s.rows <= rows_of(sh) - s.l_row &&
                  s.l_col <= cols_of(sh) && s.cols <= cols_of(sh) - s.l_col;
  MCPP_CHECK(ok,
             "tensor {}: a shard piece ({} x {} at global [{}, {}], local [{}, {}]) lies outside "
             "the tensor {} or its shard {}",
             key, s.rows, s.cols, s.g_row, s.g_col, s.l_row, s.l_col, shape_str(g), shape_str(sh));
}

void check_pieces_disjoint(const std::vector<Piece>& p, const std::string& key) {
  for (size_t i = 0; i < p.size(); ++i)
    for (size_t j = i + 1; j < p.size(); ++j) {
      const bool apart =
          p[i].g_row + p[i].rows <= p[j].g_row || p[j].g_row + p[j].rows <= p[i].g_row ||
          p[i].g_col + p[i].cols <= p[j].g_col || p[j].g_col + p[j].cols <= p[i].g_col;
      MCPP_CHECK(apart, "tensor {}: two shard pieces overlap (at global [{}, {}] and [{}, {}])",
                 key, p[i].g_row, p[i].g_col, p[j].g_row, p[j].g_col);
    }
}

void check_model_config(const model::TransformerConfig& c, const json& md,
                        const std::string& iter_dir) {
  const std::string where = (fs::path(iter_dir) / kMetadataFile).string();
  auto size = [&](int64_t v, const char* field, int64_t lo = 1) {
    MCPP_CHECK_HINT(v >= lo && v <= kMaxDim, "the file is corrupt or was edited by hand",
                    "{}: model.{} is {}, expected a size in [{}, 2^40]", where, field, v, lo);
  };
  size(c.num_layers, "num_layers");
  MCPP_CHECK_HINT(c.mtp_num_layers >= 0 && c.mtp_num_layers <= c.num_layers &&
                      (c.mtp_num_layers == 0 || c.rope),
                  "the file is corrupt or was edited by hand",
                  "{}: model.mtp_num_layers is {}, expected 0..num_layers (with RoPE)", where,
                  c.mtp_num_layers);
  if (c.window_left >= 0) {  // sliding-window attention
    size(c.window_left, "window.left", 0);
    MCPP_CHECK_HINT(int64_t(c.window_pattern.size()) == c.num_layers,
                    "the file is corrupt or was edited by hand",
                    "{}: model.window.pattern has {} entries, expected num_layers {}", where,
                    c.window_pattern.size(), c.num_layers);
    for (int64_t x : c.window_pattern)
      MCPP_CHECK_HINT(x == 0 || x == 1, "the file is corrupt or was edited by hand",
                      "{}: model.window.pattern holds {}, expected 0 or 1", where, x);
  }
  size(c.hidden_size, "hidden_size");
  size(c.ffn_hidden_size, "ffn_hidden_size");
  size(c.num_attention_heads, "num_attention_heads");
  size(c.num_query_groups, "num_query_groups");
  size(c.kv_channels, "kv_channels");
  size(c.seq_length, "seq_length");
  size(c.max_position_embeddings, "max_position_embeddings");
  size(c.padded_vocab_size, "padded_vocab_size");
  MCPP_CHECK(c.padded_vocab_size < (int64_t(1) << 31),
             "{}: model.padded_vocab_size {} exceeds int32", where, c.padded_vocab_size);
  MCPP_CHECK(c.num_attention_heads % c.num_query_groups == 0,
             "{}: model.num_attention_heads {} is not a multiple of model.num_query_groups {}",
             where, c.num_attention_heads, c.num_query_groups);
  auto positive = [&](double v, const char* field) {
    MCPP_CHECK_HINT(std::isfinite(v) && v > 0, "the file is corrupt or was edited by hand",
                    "{}: model.{} is {}, expected a positive finite number", where, field, v);
  };
  positive(c.norm_epsilon, "norm_epsilon");
  positive(c.rotary_base, "rotary_base");
  MCPP_CHECK(c.rotary_percent > 0 && c.rotary_percent <= 1,
             "{}: model.rotary_percent {} is "
             "outside (0, 1]",
             where, c.rotary_percent);
  if (c.rope_scaling) {  // Llama 3.x RoPE scaling
    positive(c.rope_scaling_factor, "rope_scaling.factor");
    positive(c.rope_low_freq_factor, "rope_scaling.low_freq_factor");
    positive(c.rope_high_freq_factor, "rope_scaling.high_freq_factor");
    size(c.rope_original_max_positions, "rope_scaling.original_max_position_embeddings");
    MCPP_CHECK(c.rope && c.rope_low_freq_factor < c.rope_high_freq_factor,
               "{}: model.rope_scaling needs rope and low_freq_factor {} < high_freq_factor {}",
               where, c.rope_low_freq_factor, c.rope_high_freq_factor);
  }
  if (c.yarn.on) {  // --position-embedding-type yarn
    positive(c.yarn.factor, "yarn.factor");
    size(c.yarn.original_max_positions, "yarn.original_max_position_embeddings");
    positive(c.yarn.beta_fast, "yarn.beta_fast");
    positive(c.yarn.beta_slow, "yarn.beta_slow");
    MCPP_CHECK(std::isfinite(c.yarn.mscale) && std::isfinite(c.yarn.mscale_all_dim),
               "{}: model.yarn.mscale {} / mscale_all_dim {} must be finite", where,
               c.yarn.mscale, c.yarn.mscale_all_dim);
    MCPP_CHECK(c.rope && !c.rope_scaling && c.rotary_base > 1,
               "{}: model.yarn needs rope, no rope_scaling and rotary_base > 1 (got {})", where,
               c.rotary_base);
  }
  if (c.seq_len_interpolation_factor != 1.0) {  // RoPE position interpolation
    positive(c.seq_len_interpolation_factor, "rotary_seq_len_interpolation_factor");
    MCPP_CHECK(c.rope, "{}: model.rotary_seq_len_interpolation_factor {} needs rope", where,
               c.seq_len_interpolation_factor);
  }
  for (auto [v, field] : {std::pair{c.hidden_dropout, "hidden_dropout"},
                          std::pair{c.attention_dropout, "attention_dropout"}})
    MCPP_CHECK(v >= 0 && v < 1, "{}: model.{} {} is outside [0, 1)", where, field, v);
  MCPP_CHECK(std::isfinite(c.init_method_std) && c.init_method_std >= 0,
             "{}: model.init_method_std {} is not a non-negative number", where, c.init_method_std);

  // The tensors must describe this model; their sizes then bound what it allocates.
  const json& tensors = md.at("tensors");
  MCPP_CHECK(tensors.is_object(), "{}: 'tensors' is not an object", where);
  auto shape_of = [&](const std::string& key) -> std::optional<Shape> {
    if (!tensors.contains(key)) return std::nullopt;
    Shape s = tensors[key].at("global_shape").get<Shape>();
    check_shape(s, where + ": tensor " + key);
    return s;
  };
  auto expect = [&](const std::string& key, const Shape& want) {
    auto s = shape_of(key);
    MCPP_CHECK_HINT(s.has_value(), "the file is corrupt or was edited by hand",
                    "{}: the model config needs tensor {}, which the metadata does not list", where,
                    key);
    MCPP_CHECK_HINT(*s == want, "the file is corrupt or was edited by hand",
                    "{}: tensor {} has global shape {}, the model config implies {}", where, key,
                    shape_str(*s), shape_str(want));
  };
  const int64_t H = c.hidden_size;
  expect("embedding.word_embeddings.weight", {c.padded_vocab_size, H});
  if (c.learned_positions())
    expect("embedding.position_embeddings.weight", {c.max_position_embeddings, H});
  std::set<int64_t> layers;
  static const std::string prefix = "decoder.layers.";
  for (auto& [key, v] : tensors.items()) {
    if (key.rfind(prefix, 0) != 0) continue;
    const size_t dot = key.find('.', prefix.size());
    auto l = parse_iteration_digits(key.substr(prefix.size(), dot - prefix.size()));
    MCPP_CHECK(l.has_value(), "{}: tensor {} has no layer number", where, key);
    layers.insert(*l);
  }
  MCPP_CHECK_HINT(int64_t(layers.size()) == c.num_layers &&
                      (layers.empty() || *layers.rbegin() == c.num_layers - 1),
                  "the file is corrupt or was edited by hand",
                  "{}: model.num_layers is {}, the metadata lists tensors of {} layers", where,
                  c.num_layers, layers.size());
  const std::string l0 = prefix + "0.";
  if (c.mla.on) {  // multi-latent attention: the key/value latent's two projections
    const auto& m = c.mla;
    size(m.kv_lora_rank, "mla.kv_lora_rank");
    size(m.qk_head_dim, "mla.qk_head_dim");
    size(m.qk_pos_emb_head_dim, "mla.qk_pos_emb_head_dim");
    size(m.v_head_dim, "mla.v_head_dim");
    size(m.q_lora_rank, "mla.q_lora_rank", 0);
    MCPP_CHECK_HINT(c.kv_channels == m.q_head_dim() &&
                        c.num_query_groups == c.num_attention_heads &&
                        m.qk_pos_emb_head_dim % 2 == 0 && m.v_head_dim <= m.q_head_dim(),
                    "the file is corrupt or was edited by hand",
                    "{}: model.mla does not fit model.kv_channels {} / num_query_groups {}",
                    where, c.kv_channels, c.num_query_groups);
    expect(l0 + "self_attention.linear_kv_down_proj.weight",
           {m.kv_lora_rank + m.qk_pos_emb_head_dim, H});
    expect(l0 + "self_attention.linear_kv_up_proj.weight",
           {c.num_attention_heads * (m.qk_head_dim + m.v_head_dim), m.kv_lora_rank});
  } else {
    expect(l0 + "self_attention.linear_qkv.weight",
           {(c.num_attention_heads + 2 * c.num_query_groups) * c.kv_channels, H});
  }
  if (c.is_moe_layer(0)) {  // mixture of experts: the router and expert 0, by global index
    expect(l0 + "mlp.router.weight", {c.moe.num_experts, H});
    const int64_t glu = c.gated_linear_unit() ? 2 : 1;
    expect(l0 + "mlp.experts.linear_fc1.weight0", {glu * c.moe.ffn_hidden_size, H});
  } else {
    expect(l0 + "mlp.linear_fc1.weight", {(c.gated_linear_unit() ? 2 : 1) * c.ffn_hidden_size, H});
  }

  // Bytes: the model's tensors (global numel x their dtype) must be in the shard files.
  int64_t need = 0;
  for (auto& [key, v] : tensors.items()) {
    if (key.rfind("optimizer.", 0) == 0) continue;
    const Shape s = v.at("global_shape").get<Shape>();
    check_shape(s, where + ": tensor " + key);
    // The stored element size (a lower bound of 1 for names this check does not know).
    const json dn = v.value("dtype", json("F32"));
    const int64_t es = dn == "F64" || dn == "I64"                   ? 8
                       : dn == "F32" || dn == "I32"                 ? 4
                       : dn == "BF16" || dn == "F16" || dn == "U16" ? 2
                                                                    : 1;
    // Each dimension is at most 2^40 (check_shape), so rows x columns is bounded by division
    // before it is multiplied.
    const int64_t r = s[0], cols = s.size() > 1 ? s[1] : 1;
    MCPP_CHECK(r <= ((int64_t(1) << 50) / es) / cols && need <= (int64_t(1) << 52) - r * cols * es,
               "{}: tensor {} ({}) is larger than any model", where, key, shape_str(s));
    need += r * cols * es;
  }
  int64_t have = 0;
  for (auto& [file, v] : md.at("files").items()) {
    std::error_code ec;
    const auto bytes = fs::file_size(fs::path(iter_dir) / file, ec);
    if (!ec) have += int64_t(bytes);
  }
  MCPP_CHECK_HINT(need <= have, "the file is corrupt, or shard files are missing",
                  "{}: the model's tensors need {} bytes, the shard files hold {}", where, need,
                  have);
}

void check_state(const TrainingState& st, const std::string& where) {
  for (auto [v, field] : {std::pair{st.iteration, "iteration"},
                          std::pair{st.consumed_train_samples, "consumed_train_samples"},
                          std::pair{st.consumed_valid_samples, "consumed_valid_samples"},
                          std::pair{st.optimizer_steps, "optimizer_steps"},
                          std::pair{st.rng_iteration, "rng.iteration"}})
    MCPP_CHECK_HINT(v >= 0, "the file is corrupt or was edited by hand",
                    "{}: state.{} is {}, expected a non-negative count", where, field, v);
}

void check_save_dir_writable(const std::string& save_dir) {
  std::error_code ec;
  fs::create_directories(save_dir, ec);
  MCPP_CHECK_HINT(!ec && fs::is_directory(save_dir), "give --save a folder you can write to",
                  "--save {}: cannot create the folder: {}", save_dir,
                  ec ? ec.message() : "a file of that name exists");
  std::random_device rd;
  const std::string probe =
      (fs::path(save_dir) / fmt::format(".write-test-{}-{:08x}", ::getpid(), rd())).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  const int err = errno;
  MCPP_CHECK_HINT(fd >= 0, "give --save a folder you can write to (checkpoints go there)",
                  "--save {} is not writable: {}", save_dir, std::strerror(err));
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace mcpp::checkpoint
