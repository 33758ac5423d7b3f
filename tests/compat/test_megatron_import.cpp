// Issue 23 A.5: Megatron-LM's own checkpoints, read without executing code.
//   * the fixtures of tests/golden/make_megatron_ckpt.py (PyTorch 2.11: tiny GPT and Llama
//     models, legacy TP2 x PP2 and torch_dist layouts) convert and reproduce the logits of
//     the script's independent float64 forward;
//   * a pickle asking for any other global, or for code through REDUCE / INST / OBJ, is
//     refused with the global's name and the file;
//   * truncated and corrupted zip and pickle files give mcpp::Error, never a crash;
//   * --load (latest_iteration / load_model_weights) of a Megatron folder stops with a HINT
//     naming the convert command.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "../checkpoint/ckpt_test_util.h"
#include "checkpoint/megatron/megatron_import.h"
#include "checkpoint/megatron/torch_pickle.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "golden_fixture.h"

namespace mcpp {
namespace megatron_import_test {

namespace fs = std::filesystem;
namespace mg = checkpoint::megatron;
using testing::read_bytes;
using testing::scratch_dir;
using testing::write_bytes;

using compat_fixture::fixture;

// A string literal with its NUL bytes (pickles are binary).
#define BIN(lit) std::string(lit, sizeof(lit) - 1)

uint32_t crc32_of(const char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= uint8_t(p[i]);
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return c ^ 0xFFFFFFFFu;
}

std::span<const uint8_t> span_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Converts a fixture, loads the saved checkpoint back, runs the model in f64 and returns
// max |logits - reference| / max |reference|.
double logits_error(const std::string& fam, const std::string& layout) {
  const std::string out = scratch_dir() + "/" + fam + "_" + layout;
  mg::convert_to_checkpoint(fixture(fam + "_" + layout), std::nullopt, out);
  auto w = checkpoint::load_model_weights(out, std::nullopt);
  model::TransformerConfig c = w.config;
  c.dtype = DType::F64;
  model::GPTModel m(c);
  for (size_t i = 0; i < m.params().infos().size(); ++i) {
    Tensor src = w.params.param(m.params().infos()[i].name);
    Tensor dst = m.params().param(i);
    for (int64_t e = 0; e < src.numel(); ++e) dst.data<double>()[e] = src.data<float>()[e];
  }
  // a bf16 run's legacy checkpoint converts with its fp32 main params: their logits
  const std::string own = fixture(fam + "_" + layout + "_logits.safetensors");
  auto ref = checkpoint::load_safetensors(fs::exists(own) ? own : fixture(fam + "_logits.safetensors"));
  const Tensor& tokens = ref.at("tokens");  // [B, S]
  model::MicroBatch mb;
  mb.tokens = tokens;
  mb.labels = Tensor::zeros(tokens.shape(), DType::I64);
  mb.loss_mask = Tensor::zeros(tokens.shape(), DType::F32);
  for (int64_t i = 0; i < mb.loss_mask.numel(); ++i) mb.loss_mask.data<float>()[i] = 1;
  model::StepKeys keys;
  keys.training = false;
  m.forward(mb, keys);
  const Tensor& got = m.logits();         // [S*B, Vp], row s*B + b
  const Tensor& want = ref.at("logits");  // [S, B, Vp], float64
  EXPECT_EQ(got.numel(), want.numel());
  if (got.numel() != want.numel()) return 1e30;
  double num = 0, den = 1e-30;
  for (int64_t i = 0; i < want.numel(); ++i) {
    num = std::max(num, std::abs(got.data<double>()[i] - want.data<double>()[i]));
    den = std::max(den, std::abs(want.data<double>()[i]));
  }
  return num / den;
}

// The weights are stored in float32 (GPT) and bfloat16 (Llama) and imported exactly, so the
// f64 forward agrees with the reference's f64 forward to rounding.
TEST(MegatronImport, GptLegacyTp2Pp2ReproducesLogits) { EXPECT_LT(logits_error("gpt", "legacy"), 1e-10); }
TEST(MegatronImport, LlamaLegacyTp2Pp2ReproducesLogits) { EXPECT_LT(logits_error("llama", "legacy"), 1e-10); }
TEST(MegatronImport, GptTorchDistReproducesLogits) { EXPECT_LT(logits_error("gpt", "dist"), 1e-10); }
TEST(MegatronImport, LlamaTorchDistReproducesLogits) { EXPECT_LT(logits_error("llama", "dist"), 1e-10); }

// Both layouts of one model give bit-identical tensors (TP/PP merge against DCP's global ones).
TEST(MegatronImport, LegacyAndTorchDistAgreeBitwise) {
  for (const char* fam : {"gpt", "llama"}) {
    auto a = mg::read(*mg::detect(fixture(std::string(fam) + "_legacy")));
    auto b = mg::read(*mg::detect(fixture(std::string(fam) + "_dist")));
    EXPECT_TRUE(a.had_optimizer) << fam;  // the legacy fixture carries Adam state
    EXPECT_EQ(a.source_tp, 2);
    EXPECT_EQ(a.source_pp, 2);
    ASSERT_EQ(a.tensors.size(), b.tensors.size()) << fam;
    for (const auto& [k, t] : a.tensors) {
      ASSERT_TRUE(b.tensors.count(k)) << k;
      const Tensor& u = b.tensors.at(k);
      ASSERT_EQ(t.shape(), u.shape()) << k;
      EXPECT_EQ(0, std::memcmp(t.data<float>(), u.data<float>(), size_t(t.numel()) * 4)) << k;
    }
  }
}

TEST(MegatronImport, DetectsLayoutsAndNothingElse) {
  auto l = mg::detect(fixture("gpt_legacy"));
  ASSERT_TRUE(l);
  EXPECT_EQ(l->layout, mg::Layout::Legacy);
  EXPECT_EQ(l->iteration, "10");
  EXPECT_EQ(l->files.size(), 4u);
  auto d = mg::detect(fixture("llama_dist/iter_0000010"));  // an iteration folder itself
  ASSERT_TRUE(d);
  EXPECT_EQ(d->layout, mg::Layout::TorchDist);
  EXPECT_FALSE(mg::detect(fixture("gpt_legacy"), 20));   // no iter_0000020
  EXPECT_FALSE(mg::detect(fixture("")));                 // the fixtures folder itself
  // a megatron.cpp checkpoint is not taken for Megatron's
  const std::string out = scratch_dir() + "/ours";
  mg::convert_to_checkpoint(fixture("gpt_legacy"), 10, out);
  EXPECT_FALSE(mg::detect(out));
  EXPECT_TRUE(checkpoint::latest_iteration(out).has_value());
}

TEST(MegatronImport, LoadOfAMegatronFolderStopsWithTheConvertHint) {
  for (const char* d : {"gpt_legacy", "llama_dist", "llama_dist/iter_0000010"}) {
    try {
      checkpoint::load_model_weights(fixture(d), std::nullopt);
      ADD_FAILURE() << d << " loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is a Megatron-LM checkpoint"), std::string::npos)
          << e.what();
      EXPECT_NE(e.hint().find("megatron convert --from-megatron"), std::string::npos) << e.hint();
    }
  }
  EXPECT_THROW(checkpoint::latest_iteration(fixture("gpt_dist")), Error);
}

// ---- hostile pickles --------------------------------------------------------------------

std::string refusal(const std::string& pickle) {
  try {
    mg::unpickle(span_of(pickle), "evil.pkl");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TorchPickle, RefusesGlobalsOffTheAllowList) {
  // protocol 2: GLOBAL os.system, ('ls',), REDUCE
  const std::string os_system = BIN("\x80\x02" "cos\nsystem\nX\x02\x00\x00\x00" "ls\x85R.");
  std::string m = refusal(os_system);
  EXPECT_NE(m.find("'os.system'"), std::string::npos) << m;
  EXPECT_NE(m.find("evil.pkl"), std::string::npos) << m;
  // protocol 4: STACK_GLOBAL builtins.eval
  const std::string eval = BIN("\x80\x04\x8c\x08" "builtins" "\x8c\x04" "eval" "\x93\x8c\x01" "1" "\x85R.");
  m = refusal(eval);
  EXPECT_NE(m.find("'builtins.eval'"), std::string::npos) << m;
  m = refusal("\x80\x02" "csubprocess\nPopen\n)R.");
  EXPECT_NE(m.find("'subprocess.Popen'"), std::string::npos) << m;
  m = refusal("\x80\x02" "ctorch._utils\n_rebuild_device_tensor_from_numpy\n)R.");
  EXPECT_NE(m.find("_rebuild_device_tensor_from_numpy"), std::string::npos) << m;
}

TEST(TorchPickle, RefusesCodeThroughOtherOpcodes) {
  // REDUCE on something that is no allow-listed global (a string)
  EXPECT_NE(refusal(BIN("\x80\x02X\x02\x00\x00\x00" "hi)R.")).find("only allow-listed globals"),
            std::string::npos);
  // an allow-listed global that is a value, not a callable
  EXPECT_NE(refusal("\x80\x02" "ctorch\nFloatStorage\n)R.").find("not callable"), std::string::npos);
  // INST and OBJ instantiate classes by name; EXT uses the copyreg registry
  EXPECT_NE(refusal("(ios\nsystem\nS'ls'\n.").find("INST"), std::string::npos);
  EXPECT_NE(refusal("\x80\x02(cos\nsystem\no.").find("os.system"), std::string::npos);
  EXPECT_NE(refusal("\x80\x02\x82\x01.").find("EXT"), std::string::npos);
  EXPECT_NE(refusal("\x80\x02P1\n.").find("PERSID"), std::string::npos);
}

TEST(TorchPickle, ReadsWhatAStateDictHolds) {
  // OrderedDict([('a', 1.5), ('b', [True, None, b'xy'])]) with protocol 2's latin-1 bytes
  const std::string p = BIN(
      "\x80\x02" "ccollections\nOrderedDict\n)R("
      "X\x01\x00\x00\x00" "a" "G?\xf8\x00\x00\x00\x00\x00\x00"
      "X\x01\x00\x00\x00" "b" "](\x88N"
      "c_codecs\nencode\nX\x02\x00\x00\x00" "xy" "X\x06\x00\x00\x00" "latin1\x86R"
      "eu.");
  auto v = mg::unpickle(span_of(p), "ok.pkl");
  ASSERT_TRUE(v->is(mg::Value::Kind::Dict));
  ASSERT_TRUE(v->get("a"));
  EXPECT_EQ(v->get("a")->f, 1.5);
  const mg::Value* b = v->get("b");
  ASSERT_TRUE(b && b->is(mg::Value::Kind::List));
  ASSERT_EQ(b->items.size(), 3u);
  EXPECT_TRUE(b->items[0]->b);
  EXPECT_TRUE(b->items[1]->is(mg::Value::Kind::None));
  EXPECT_EQ(b->items[2]->s, "xy");
}

// A hostile model_optim_rng.pt inside a Megatron layout: convert names the global and file.
TEST(TorchPickle, HostileCheckpointFileIsRefusedByConvert) {
  const std::string dir = scratch_dir();
  fs::create_directories(dir + "/iter_0000001/mp_rank_00");
  write_bytes(dir + "/latest_checkpointed_iteration.txt", "1");
  // take a real torch.save file and replace its data.pkl by one asking for os.system, same
  // length so the zip stays consistent except for the CRC: then fix the CRC too.
  std::string f = read_bytes(fixture("llama_dist/iter_0000010/common.pt"));
  const std::string evil = BIN("\x80\x02" "cos\nsystem\nX\x02\x00\x00\x00" "ls\x85R.");
  mg::ZipArchive z(span_of(f), "common.pt");
  std::string pkl_name;
  for (const auto& [n, _] : z.entries())
    if (n.ends_with("/data.pkl")) pkl_name = n;
  auto pkl = z.entry(pkl_name);
  const size_t at = size_t(pkl.data() - reinterpret_cast<const uint8_t*>(f.data()));
  const size_t len = pkl.size();
  ASSERT_GT(len, evil.size());
  const uint32_t old_crc = crc32_of(f.data() + at, len);
  f.replace(at, len, evil + std::string(len - evil.size(), '.'));  // after STOP: never read
  const uint32_t new_crc = crc32_of(f.data() + at, len);
  std::string oldb(4, '\0'), newb(4, '\0');
  for (int k = 0; k < 4; ++k)
    oldb[size_t(k)] = char(old_crc >> (8 * k)), newb[size_t(k)] = char(new_crc >> (8 * k));
  int fixed = 0;  // the CRC in the local and the central header
  for (size_t q = f.find(oldb); q != std::string::npos; q = f.find(oldb, q + 4), ++fixed)
    f.replace(q, 4, newb);
  ASSERT_GE(fixed, 2);
  write_bytes(dir + "/iter_0000001/mp_rank_00/model_optim_rng.pt", f);
  try {
    mg::convert_to_checkpoint(dir, std::nullopt, dir + "/out");
    ADD_FAILURE() << "a pickle asking for os.system was read";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("refusing global 'os.system'"), std::string::npos) << m;
    EXPECT_NE(m.find("model_optim_rng.pt"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(dir + "/out/latest_checkpointed_iteration.txt"));
}

// ---- truncated and corrupt files: errors, never crashes ----------------------------------

TEST(TorchPickle, TruncatedAndCorruptZipFilesGiveErrors) {
  const std::string f =
      read_bytes(fixture("gpt_legacy/iter_0000010/mp_rank_01_001/model_optim_rng.pt"));
  ASSERT_GT(f.size(), 10000u);
  int errors = 0;
  for (size_t n = 0; n < f.size(); n += 1 + n / 7) {  // prefixes of every scale
    try {
      mg::TorchFile t(span_of(f).subspan(0, n), "cut.pt");
      ADD_FAILURE() << "a " << n << "-byte prefix parsed";
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 50);
  // byte flips everywhere: either refused with an Error or (flips in unchecked padding)
  // read; tensors of what is read stay in bounds
  uint64_t x = 12345;
  for (int trial = 0; trial < 600; ++trial) {
    std::string g = f;
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const size_t at = size_t(x >> 20) % g.size();
    g[at] = char(uint8_t(g[at]) ^ uint8_t(1u << (x & 7)));
    try {
      mg::TorchFile t(span_of(g), "flip.pt");
      const mg::Value* m = t.root()->get("model");
      if (m)
        for (const auto& [k, v] : m->entries)
          if (v->is(mg::Value::Kind::Tensor)) t.tensor(*v, DType::F32, k->s);
    } catch (const Error&) {
    }
  }
}

TEST(TorchPickle, TruncatedAndCorruptPicklesGiveErrors) {
  const std::string f = read_bytes(fixture("gpt_dist/iter_0000010/.metadata"));
  for (size_t n = 0; n + 1 < f.size(); ++n)  // every proper prefix lacks its STOP
    EXPECT_THROW(mg::unpickle(span_of(f).subspan(0, n), "cut.metadata"), Error) << n;
  uint64_t x = 777;
  int refused = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string g = f;
    for (int k = 0; k < 3; ++k) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      g[size_t(x >> 24) % g.size()] = char(x >> 56);
    }
    try {
      mg::unpickle(span_of(g), "flip.metadata");
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 1000);  // most random damage is detected
  // a million nested lists is freed without recursion
  std::string deep = "\x80\x02";
  for (int k = 0; k < 1000000; ++k) deep += "]";
  for (int k = 0; k < 999999; ++k) deep += "a";
  deep += ".";
  EXPECT_NO_THROW(mg::unpickle(span_of(deep), "deep.pkl"));
}

}  // namespace megatron_import_test
}  // namespace mcpp

namespace mcpp {
namespace megatron_import_test {

// Copies a torch_dist fixture and rewrites a 12-character string of its .metadata pickle
// (same length: the pickle stays well-formed) to `to`.
std::string hostile_dist(const std::string& from, const std::string& to) {
  const std::string dir = testing::scratch_dir() + "/dist";
  fs::create_directories(dir + "/iter_0000010");
  fs::copy(fixture("gpt_dist/iter_0000010"), dir + "/iter_0000010",
           fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  testing::write_bytes(dir + "/latest_checkpointed_iteration.txt", "10");
  std::string md = testing::read_bytes(dir + "/iter_0000010/.metadata");
  EXPECT_EQ(from.size(), to.size());
  int n = 0;
  for (size_t p = md.find(from); p != std::string::npos; p = md.find(from, p + 1), ++n)
    md.replace(p, from.size(), to);
  EXPECT_GT(n, 0);
  testing::write_bytes(dir + "/iter_0000010/.metadata", md);
  return dir;
}

std::string read_error(const std::string& dir) {
  try {
    mg::read(*mg::detect(dir));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MegatronImport, TorchDistStorageOutsideTheFolderIsRefused) {
  const std::string m = read_error(hostile_dist("__0_0.distcp", "../0_0.distc"));
  EXPECT_NE(m.find("is not a file name inside the folder"), std::string::npos) << m;
}

TEST(MegatronImport, TorchDistMissingOrTruncatedShardFileIsAnError) {
  std::string m = read_error(hostile_dist("__0_0.distcp", "__9_9.distcp"));
  EXPECT_NE(m.find("__9_9.distcp"), std::string::npos) << m;
  const std::string dir = hostile_dist("__0_0.distcp", "__0_0.distcp");
  const std::string shard = dir + "/iter_0000010/__0_0.distcp";
  const std::string b = testing::read_bytes(shard);
  testing::write_bytes(shard, b.substr(0, b.size() / 2));
  m = read_error(dir);
  EXPECT_NE(m.find("lie outside"), std::string::npos) << m;
}

// Megatron's args as an argparse.Namespace: the Llama-style model of tiny_config, with
// add_bias_linear / add_qkv_bias as given (a missing one: absent from args).
mg::ValuePtr llama_args(std::optional<bool> add_bias_linear, std::optional<bool> add_qkv_bias) {
  using K = mg::Value::Kind;
  auto ns = std::make_shared<mg::Value>();
  ns->kind = K::Object, ns->s = "argparse.Namespace";
  auto put = [&](const std::string& k, auto set) {
    auto key = std::make_shared<mg::Value>(), v = std::make_shared<mg::Value>();
    key->kind = K::Str, key->s = k;
    set(*v);
    ns->entries.emplace_back(key, v);
  };
  auto num = [&](const std::string& k, int64_t x) {
    put(k, [&](mg::Value& v) { v.kind = K::Int, v.i = x; });
  };
  auto flag = [&](const std::string& k, bool b) {
    put(k, [&](mg::Value& v) { v.kind = K::Bool, v.b = b; });
  };
  auto str = [&](const std::string& k, const std::string& s) {
    put(k, [&](mg::Value& v) { v.kind = K::Str, v.s = s; });
  };
  num("num_layers", 2), num("hidden_size", 16), num("num_attention_heads", 4);
  num("ffn_hidden_size", 24), num("kv_channels", 4), num("num_query_groups", 2);
  num("seq_length", 8), num("max_position_embeddings", 12), num("padded_vocab_size", 64);
  flag("group_query_attention", true), flag("swiglu", true);
  flag("untie_embeddings_and_output_weights", true);
  str("normalization", "RMSNorm"), str("position_embedding_type", "rope");
  if (add_bias_linear) flag("add_bias_linear", *add_bias_linear);
  if (add_qkv_bias) flag("add_qkv_bias", *add_qkv_bias);
  return ns;
}

// args.add_qkv_bias (Megatron's --add-qkv-bias) with add_bias_linear False: linear_qkv.bias
// is a parameter of the imported model, merged and checked like every other.
TEST(MegatronImport, AddQkvBiasArgs) {
  std::vector<std::string> notes;
  auto c = mg::config_from_args(*llama_args(false, true), "args", notes);
  EXPECT_TRUE(c.add_qkv_bias);
  EXPECT_FALSE(c.add_bias_linear);
  EXPECT_TRUE(c.qkv_bias());
  mg::Imported im;
  im.config = c;
  model::GPTModel m(c);
  for (const auto& p : m.params().infos()) im.tensors[p.name] = m.params().param(p.name).clone();
  EXPECT_TRUE(im.tensors.count("decoder.layers.1.self_attention.linear_qkv.bias"));
  EXPECT_NO_THROW(mg::check_against_model(im, "ckpt"));
  // The same tensors under args without it: the bias has no counterpart.
  im.config = mg::config_from_args(*llama_args(false, false), "args", notes);
  EXPECT_FALSE(im.config.qkv_bias());
  try {
    mg::check_against_model(im, "ckpt");
    FAIL() << "an unexpected linear_qkv.bias was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear_qkv.bias' has no counterpart"), std::string::npos)
        << e.what();
  }
  // Without the bias tensor where args ask for it: missing.
  im.config = c;
  im.tensors.erase("decoder.layers.0.self_attention.linear_qkv.bias");
  EXPECT_THROW(mg::check_against_model(im, "ckpt"), Error);
  // Older args without the field: no QKV bias unless every linear has one.
  EXPECT_FALSE(mg::config_from_args(*llama_args(false, std::nullopt), "args", notes).qkv_bias());
  EXPECT_TRUE(mg::config_from_args(*llama_args(true, std::nullopt), "args", notes).qkv_bias());
}

TEST(MegatronImport, InspectDescribesTheCheckpoint) {
  auto lines = mg::describe(*mg::detect(fixture("llama_legacy")));
  std::string all;
  for (auto& l : lines) all += l + "\n";
  EXPECT_NE(all.find("legacy (torch) layout, iteration 10"), std::string::npos) << all;
  EXPECT_NE(all.find("TP 2 x PP 2"), std::string::npos) << all;
  EXPECT_NE(all.find("query groups 2"), std::string::npos) << all;
  EXPECT_NE(all.find("Llama-style"), std::string::npos) << all;
  EXPECT_NE(all.find("megatron convert --from-megatron"), std::string::npos) << all;
}

}  // namespace megatron_import_test
}  // namespace mcpp

namespace mcpp {
namespace megatron_import_test {

// A protocol-2 pickle written by hand: a torch.distributed.checkpoint Metadata whose tensors
// come in several chunks (what a TP x PP Megatron save writes), for the chunk placement.
struct PickleWriter {
  std::string b = BIN("\x80\x02");
  void u32(uint32_t v) {
    for (int k = 0; k < 4; ++k) b += char(v >> (8 * k));
  }
  void str(const std::string& s) { b += 'X', u32(uint32_t(s.size())), b += s; }
  void num(int64_t v) { b += 'J', u32(uint32_t(int32_t(v))); }
  void glob(const std::string& m, const std::string& n) { b += "c" + m + "\n" + n + "\n"; }
  void size(const std::vector<int64_t>& v) {
    glob("torch", "Size");
    b += '(';
    for (auto x : v) num(x);
    b += "t\x85R";
  }
  void obj_begin(const std::string& m, const std::string& n) { glob(m, n), b += ")\x81}("; }
  void obj_end() { b += "ub"; }
};

struct Chunk {
  std::vector<int64_t> off, sz;
};
struct DistTensor {
  std::string key;
  std::vector<int64_t> shape;
  std::vector<Chunk> chunks;
};

// Writes iter_0000010/{.metadata, __0_0.distcp (raw f32), common.pt, metadata.json}; element
// e of each global tensor holds the value e.
std::string write_chunked_dist(const std::vector<DistTensor>& ts) {
  const std::string dir = testing::scratch_dir() + "/iter_0000010";
  fs::create_directories(dir);
  fs::copy_file(fixture("gpt_dist/iter_0000010/common.pt"), dir + "/common.pt");
  fs::copy_file(fixture("gpt_dist/iter_0000010/metadata.json"), dir + "/metadata.json");
  const std::string M = "torch.distributed.checkpoint.metadata";
  PickleWriter p;
  std::string data;
  struct Where {
    std::string key;
    Chunk c;
    int64_t offset, length;
  };
  std::vector<Where> where;
  p.obj_begin(M, "Metadata");
  p.str("state_dict_metadata");
  p.b += "}(";
  for (const auto& t : ts) {
    p.str(t.key);
    p.obj_begin(M, "TensorStorageMetadata");
    p.str("properties");
    p.obj_begin(M, "TensorProperties");
    p.str("dtype");
    p.glob("torch", "float32");
    p.obj_end();
    p.str("size");
    p.size(t.shape);
    p.str("chunks");
    p.b += "](";
    for (const auto& c : t.chunks) {
      p.obj_begin(M, "ChunkStorageMetadata");
      p.str("offsets");
      p.size(c.off);
      p.str("sizes");
      p.size(c.sz);
      p.obj_end();
      // the chunk's elements, row-major, each the flat index of its global position
      const size_t nd = t.shape.size();
      int64_t n = 1;
      for (auto s : c.sz) n *= s;
      const int64_t start = int64_t(data.size());
      for (int64_t e = 0; e < n; ++e) {
        int64_t rem = e, g = 0, stride = 1;
        for (size_t d = nd; d-- > 0;) {
          g += (c.off[d] + rem % c.sz[d]) * stride;
          rem /= c.sz[d], stride *= t.shape[d];
        }
        float v = float(g);
        data.append(reinterpret_cast<const char*>(&v), 4);
      }
      where.push_back({t.key, c, start, int64_t(data.size()) - start});
    }
    p.b += "e";
    p.obj_end();
  }
  p.b += "u";
  p.str("storage_data");
  p.b += "}(";
  for (const auto& w : where) {
    p.obj_begin(M, "MetadataIndex");
    p.str("fqn");
    p.str(w.key);
    p.str("offset");
    p.size(w.c.off);
    p.str("index");
    p.num(0);
    p.obj_end();
    p.obj_begin("torch.distributed.checkpoint.filesystem", "_StorageInfo");
    p.str("relative_path");
    p.str("__0_0.distcp");
    p.str("offset");
    p.num(w.offset);
    p.str("length");
    p.num(w.length);
    p.obj_end();
  }
  p.b += "u";
  p.obj_end();
  p.b += ".";
  testing::write_bytes(dir + "/.metadata", p.b);
  testing::write_bytes(dir + "/__0_0.distcp", data);
  return dir;
}

const DistTensor kEmbedding{"embedding.word_embeddings.weight", {64, 16},
                            {{{0, 0}, {32, 16}}, {{32, 0}, {32, 16}}}};  // TP2 rows
const DistTensor kFc2{"decoder.layers.mlp.linear_fc2.weight", {4, 16, 64},  // PP2 x TP2 cols
                      {{{0, 0, 0}, {2, 16, 32}}, {{0, 0, 32}, {2, 16, 32}},
                       {{2, 0, 0}, {2, 16, 32}}, {{2, 0, 32}, {2, 16, 32}}}};

TEST(MegatronImport, TorchDistChunksArePlacedAndLayersSplit) {
  const std::string dir = write_chunked_dist({kEmbedding, kFc2});
  auto d = mg::detect(dir);
  ASSERT_TRUE(d);
  mg::Imported im;
  mg::read_torch_dist(*d, im);  // (only two tensors: no check against the whole model)
  const Tensor& e = im.tensors.at("embedding.word_embeddings.weight");
  ASSERT_EQ(e.shape(), (Shape{64, 16}));
  for (int64_t i = 0; i < e.numel(); ++i) ASSERT_EQ(e.data<float>()[i], float(i)) << i;
  for (int l = 0; l < 4; ++l) {
    const Tensor& w = im.tensors.at("decoder.layers." + std::to_string(l) + ".mlp.linear_fc2.weight");
    ASSERT_EQ(w.shape(), (Shape{16, 64}));
    for (int64_t i = 0; i < w.numel(); ++i)
      ASSERT_EQ(w.data<float>()[i], float(l * 16 * 64 + i)) << l << " " << i;
  }
}

TEST(MegatronImport, TorchDistOverlappingOrMissingChunksAreErrors) {
  DistTensor overlap = kEmbedding;
  overlap.chunks[1].off = {31, 0};  // rows 31..62: row 31 twice, row 63 never
  mg::Imported a;
  try {
    mg::read_torch_dist(*mg::detect(write_chunked_dist({overlap})), a);
    ADD_FAILURE() << "overlapping chunks were read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chunks overlap"), std::string::npos) << e.what();
  }
  DistTensor gap = kEmbedding;
  gap.chunks.pop_back();
  mg::Imported b;
  try {
    mg::read_torch_dist(*mg::detect(write_chunked_dist({gap})), b);
    ADD_FAILURE() << "a tensor with a missing chunk was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not cover the whole tensor"), std::string::npos)
        << e.what();
  }
  DistTensor outside = kEmbedding;
  outside.chunks[1].off = {40, 0};  // rows 40..71 of 64
  mg::Imported c;
  EXPECT_THROW(mg::read_torch_dist(*mg::detect(write_chunked_dist({outside})), c), Error);
}

// Values of Megatron's saved args (an unpickled argparse.Namespace), and the args of a tiny
// model (RoPE or learned positions) with `extra` entries.
mg::ValuePtr value(mg::Value::Kind k) {
  auto v = std::make_shared<mg::Value>();
  v->kind = k;
  return v;
}
mg::ValuePtr int_value(int64_t x) {
  auto v = value(mg::Value::Kind::Int);
  v->i = x;
  return v;
}
mg::ValuePtr float_value(double x) {
  auto v = value(mg::Value::Kind::Float);
  v->f = x;
  return v;
}
mg::ValuePtr bool_value(bool x) {
  auto v = value(mg::Value::Kind::Bool);
  v->b = x;
  return v;
}
mg::ValuePtr tiny_args(bool rope,
                       const std::vector<std::pair<const char*, mg::ValuePtr>>& extra = {}) {
  auto a = value(mg::Value::Kind::Object);
  a->s = "argparse.Namespace";
  auto put = [&](const char* k, mg::ValuePtr v) {
    auto key = value(mg::Value::Kind::Str);
    key->s = k;
    a->entries.emplace_back(key, v);
  };
  put("num_layers", int_value(2)), put("hidden_size", int_value(32));
  put("num_attention_heads", int_value(4));
  put("padded_vocab_size", int_value(64)), put("seq_length", int_value(16));
  auto pos = value(mg::Value::Kind::Str);
  pos->s = rope ? "rope" : "learned_absolute";
  put("position_embedding_type", pos);
  for (const auto& [k, v] : extra) put(k, v);
  return a;
}

// Megatron's saved args with --use-rope-scaling: the switch and its factor reach the config
// (the other three values stay Megatron's constants); on a model without RoPE, where
// Megatron ignores the switch, it is dropped with a note.
TEST(MegatronImport, RopeScalingFromArgs) {
  auto args = [&](bool rope, bool scaling, double factor) {
    return tiny_args(rope, {{"use_rope_scaling", bool_value(scaling)},
                            {"rope_scaling_factor", float_value(factor)}});
  };
  std::vector<std::string> notes;
  auto c = mg::config_from_args(*args(true, true, 32.0), "test", notes);
  EXPECT_TRUE(c.rope_scaling);
  EXPECT_EQ(c.rope_scaling_factor, 32.0);
  EXPECT_EQ(c.rope_low_freq_factor, 1.0);
  EXPECT_EQ(c.rope_high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_original_max_positions, 8192);
  EXPECT_FALSE(mg::config_from_args(*args(true, false, 32.0), "test", notes).rope_scaling);
  notes.clear();
  EXPECT_FALSE(mg::config_from_args(*args(false, true, 32.0), "test", notes).rope_scaling);
  ASSERT_EQ(notes.size(), 1u);  // the ignored switch
  EXPECT_NE(notes[0].find("use_rope_scaling is set but the model has no RoPE"), std::string::npos);
  EXPECT_THROW(mg::config_from_args(*args(true, true, 0.0), "test", notes), Error);
}

// args.rotary_seq_len_interpolation_factor (an int, or None): the model's position
// interpolation, with Llama 3.x scaling or without; None and absent are off; on a model
// without RoPE it is dropped with a note, as Megatron ignores it there.
TEST(MegatronImport, RotarySeqLenInterpolationFactorFromArgs) {
  std::vector<std::string> notes;
  auto c =
      mg::config_from_args(*tiny_args(true, {{"rotary_seq_len_interpolation_factor", int_value(4)},
                                             {"use_rope_scaling", bool_value(true)}}),
                           "test", notes);
  EXPECT_EQ(c.seq_len_interpolation_factor, 4.0);
  EXPECT_TRUE(c.rope_scaling);
  EXPECT_TRUE(notes.empty());
  EXPECT_EQ(mg::config_from_args(*tiny_args(true), "test", notes).seq_len_interpolation_factor,
            1.0);
  EXPECT_EQ(
      mg::config_from_args(
          *tiny_args(true, {{"rotary_seq_len_interpolation_factor", value(mg::Value::Kind::None)}}),
          "test", notes)
          .seq_len_interpolation_factor,
      1.0);
  EXPECT_TRUE(notes.empty());
  c = mg::config_from_args(
      *tiny_args(false, {{"rotary_seq_len_interpolation_factor", int_value(4)}}), "test", notes);
  EXPECT_EQ(c.seq_len_interpolation_factor, 1.0);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("rotary_seq_len_interpolation_factor is set but the model has no RoPE"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] {
              mg::config_from_args(
                  *tiny_args(true, {{"rotary_seq_len_interpolation_factor", int_value(0)}}), "test",
                  notes);
            }).find("args.rotary_seq_len_interpolation_factor 0 is not a positive number"),
            std::string::npos);
}

// --position-embedding-type yarn: the args _apply_yarn_config_from_args reads (None or absent:
// its defaults) reach the config; what Megatron ignores with YaRN (Llama 3.x scaling,
// interpolation, --rotary-percent) is imported off with a note each; bad values are errors.
TEST(MegatronImport, YarnFromArgs) {
  auto yarn_args = [](std::vector<std::pair<const char*, mg::ValuePtr>> extra) {
    auto a = tiny_args(true, extra);
    for (auto& [k, v] : a->entries)
      if (k->s == "position_embedding_type") v->s = "yarn";
    return a;
  };
  std::vector<std::string> notes;
  auto c = mg::config_from_args(*yarn_args({}), "test", notes);
  EXPECT_TRUE(c.rope);
  EXPECT_TRUE(c.yarn.on);
  EXPECT_EQ(c.yarn, model::TransformerConfig::Yarn{.on = true});  // Megatron's defaults
  EXPECT_TRUE(notes.empty());
  c = mg::config_from_args(
      *yarn_args({{"rotary_scaling_factor", float_value(4)},
                  {"yarn_original_max_position_embeddings", int_value(32768)},
                  {"yarn_beta_fast", float_value(16)},
                  {"yarn_beta_slow", value(mg::Value::Kind::None)},
                  {"yarn_correction_range_round_to_int", bool_value(false)},
                  {"mscale", float_value(0.9)},
                  {"mscale_all_dim", float_value(0.5)}}),
      "test", notes);
  EXPECT_EQ(c.yarn.factor, 4.0);
  EXPECT_EQ(c.yarn.original_max_positions, 32768);
  EXPECT_EQ(c.yarn.beta_fast, 16.0);
  EXPECT_EQ(c.yarn.beta_slow, 1.0);
  EXPECT_FALSE(c.yarn.round_to_int);
  EXPECT_EQ(c.yarn.mscale, 0.9);
  EXPECT_EQ(c.yarn.mscale_all_dim, 0.5);
  EXPECT_NO_THROW(c.validate());
  EXPECT_TRUE(notes.empty());
  c = mg::config_from_args(*yarn_args({{"use_rope_scaling", bool_value(true)},
                                       {"rotary_seq_len_interpolation_factor", int_value(4)},
                                       {"rotary_percent", float_value(0.5)}}),
                           "test", notes);
  EXPECT_FALSE(c.rope_scaling);
  EXPECT_EQ(c.seq_len_interpolation_factor, 1.0);
  EXPECT_EQ(c.rotary_percent, 1.0);
  EXPECT_NO_THROW(c.validate());
  ASSERT_EQ(notes.size(), 3u);
  EXPECT_NE(notes[0].find("YaRN rotates the whole head"), std::string::npos) << notes[0];
  EXPECT_NE(notes[1].find("args.use_rope_scaling is set but the model's RoPE is YaRN"),
            std::string::npos);
  EXPECT_NE(notes[2].find("args.rotary_seq_len_interpolation_factor is set"), std::string::npos);
  for (const auto& [k, v] : {std::pair{"rotary_scaling_factor", float_value(0)},
                             std::pair{"yarn_beta_fast", float_value(-1)},
                             std::pair{"yarn_original_max_position_embeddings", int_value(0)}})
    EXPECT_NE(testing::error_of([&] { mg::config_from_args(*yarn_args({{k, v}}), "test", notes); })
                  .find("args give an invalid YaRN"),
              std::string::npos)
        << k;
  EXPECT_NE(
      testing::error_of([&] {
        mg::config_from_args(*yarn_args({{"yarn_correction_range_round_to_int", int_value(1)}}),
                             "test", notes);
      }).find("args.yarn_correction_range_round_to_int is a"),
      std::string::npos);
}

}  // namespace megatron_import_test
}  // namespace mcpp
