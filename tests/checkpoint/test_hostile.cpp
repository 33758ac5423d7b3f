// Hostile checkpoints and Hugging Face folders (issue 23, part B): each case below crashed,
// allocated without bound, loaded heap bytes or silently started from scratch before it
// became an Error naming the file and field.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <functional>

#include "checkpoint/checks.h"
#include "checkpoint/fs.h"
#include "checkpoint/hf.h"
#include "ckpt_test_util.h"

using namespace mcpp;
using namespace mcpp::testing;
namespace fs = std::filesystem;
namespace ck = mcpp::checkpoint;
using json = nlohmann::json;

namespace hostile_test {

// One checkpoint (iteration 10) of the gpt model; returns the save folder.
std::string one_checkpoint() {
  const std::string dir = scratch_dir();
  model::GPTModel m(tiny_config("gpt"));
  fill_global(m.params(), m.params().flat_params(), 10);
  ck::save_checkpoint(dir, m, nullptr, sample_state(10));
  return dir;
}

std::string md_path(const std::string& dir) { return dir + "/iter_0000010/metadata.json"; }
json read_md(const std::string& dir) { return json::parse(read_bytes(md_path(dir))); }
void write_md(const std::string& dir, const json& md) { write_bytes(md_path(dir), md.dump(1)); }

std::string load_error(const std::string& dir) {
  return error_of([&] {
    model::GPTModel m(tiny_config("gpt"));
    ck::load_checkpoint(dir, std::nullopt, m, nullptr);
  });
}


// local_offsets -100 loaded the heap bytes before the shard into the weights (and inspect
// said "all checksums verified"); a huge one segfaulted.
TEST(HostileCheckpoint, NegativeOrHugeLocalOffsetsAreErrors) {
  const std::string dir = one_checkpoint();
  const json good = read_md(dir);
  for (int64_t off : {int64_t(-100), int64_t(1) << 60, int64_t(-1) << 62}) {
    json md = good;
    md["tensors"]["embedding.word_embeddings.weight"]["shards"][0]["pieces"][0]["local_offsets"] = {
        off, 0};
    write_md(dir, md);
    const std::string err = load_error(dir);
    expect_has(err, "embedding.word_embeddings.weight");
    expect_has(err, "lies outside");
    int bad = 0;
    ck::describe_checkpoint(dir, &bad);
    EXPECT_GT(bad, 0) << off;
  }
  // Two pieces covering the same rows (the element count still adding up) are refused too.
  json md = good;
  json& sh = md["tensors"]["decoder.final_layernorm.weight"]["shards"][0];
  sh["pieces"] = {{{"offsets", {0}}, {"shape", {8}}, {"local_offsets", {0}}},
                  {{"offsets", {0}}, {"shape", {8}}, {"local_offsets", {8}}}};
  write_md(dir, md);
  expect_has(load_error(dir), "overlap");
  write_md(dir, good);
  EXPECT_EQ(load_error(dir), "");
}

// Model fields of metadata.json were allocated before anything checked them against the
// shards: num_layers 2^40 grew memory until killed; hidden_size 2^20 asked for gigabytes.
TEST(HostileCheckpoint, ModelFieldsAreCheckedBeforeAllocating) {
  const std::string dir = one_checkpoint();
  const json good = read_md(dir);
  auto config_error = [&](const char* field, json value) {
    json md = good;
    md["model"][field] = value;
    write_md(dir, md);
    return error_of([&] { ck::model_config_from_metadata(ck::read_metadata(dir)); });
  };
  expect_has(config_error("num_layers", int64_t(1) << 40), "num_layers");
  expect_has(config_error("num_layers", 3), "tensors of 2 layers");
  expect_has(config_error("hidden_size", int64_t(1) << 20), "embedding.word_embeddings.weight");
  expect_has(config_error("padded_vocab_size", 0), "padded_vocab_size");
  expect_has(config_error("norm_epsilon", -1), "norm_epsilon");
  expect_has(config_error("rotary_base", 0), "rotary_base");
  const json scaling = {{"factor", 8.0},
                        {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0},
                        {"original_max_position_embeddings", 8192}};
  expect_has(config_error("rope_scaling", scaling), "needs rope");  // this model has none
  json bad_scaling = scaling;
  bad_scaling["factor"] = -1.0;
  expect_has(config_error("rope_scaling", bad_scaling), "rope_scaling.factor");
  bad_scaling = scaling;
  bad_scaling.erase("high_freq_factor");
  expect_has(config_error("rope_scaling", bad_scaling), "malformed 'model' field");
  expect_has(config_error("num_layers", "2"), "malformed 'model' field");
  // A tensor listed larger than the files hold.
  json md = good;
  md["tensors"]["embedding.word_embeddings.weight"]["global_shape"] = {int64_t(1) << 30, 16};
  md["model"]["padded_vocab_size"] = int64_t(1) << 30;
  write_md(dir, md);
  expect_has(error_of([&] { ck::model_config_from_metadata(ck::read_metadata(dir)); }),
             "the shard files hold");
  // Two dimensions whose product is 2^64: multiplied before the check, it wrapped to 0 bytes.
  md = good;
  md["tensors"]["decoder.extra.weight"] = good["tensors"]["embedding.word_embeddings.weight"];
  md["tensors"]["decoder.extra.weight"]["global_shape"] = {int64_t(1) << 40, int64_t(1) << 24};
  write_md(dir, md);
  expect_has(error_of([&] { ck::model_config_from_metadata(ck::read_metadata(dir)); }),
             "decoder.extra.weight ([1099511627776, 16777216]) is larger than any model");
  write_md(dir, good);
  EXPECT_NO_THROW(ck::model_config_from_metadata(ck::read_metadata(dir)));
}

// A metadata.json that is a FIFO or a link to /dev/zero was read without limit (a hang).
TEST(HostileCheckpoint, MetadataMustBeARegularFile) {
  const std::string dir = one_checkpoint();
  fs::remove(md_path(dir));
  fs::create_symlink("/dev/zero", md_path(dir));
  expect_has(error_of([&] { ck::read_metadata(dir); }), "not a regular file");
  fs::remove(md_path(dir));
  ASSERT_EQ(::mkfifo(md_path(dir).c_str(), 0644), 0);
  expect_has(error_of([&] { ck::read_metadata(dir); }), "not a regular file");
  // Oversized text files are refused without reading them.
  write_bytes(dir + "/big.txt", std::string(5000, ' '));
  expect_has(error_of([&] { ck::read_text_file(dir + "/big.txt", 4096); }), "5000 bytes");
}

// "format_version": "1" gave a JSON type error; a tracker that is a directory gave
// "basic_filebuf::underflow"; iter_99999999999999999999/ gave "stoll".
TEST(HostileCheckpoint, MessagesNameTheFileAndField) {
  const std::string dir = one_checkpoint();
  json md = read_md(dir);
  md["format_version"] = "1";
  write_md(dir, md);
  std::string err = load_error(dir);
  expect_has(err, "metadata.json");
  expect_has(err, "format_version");
  md["format_version"] = 1;
  md["state"]["iteration"] = -5;
  md["iteration"] = 10;
  write_md(dir, md);
  expect_has(load_error(dir), "state.iteration is -5");
  md["state"]["iteration"] = 10;
  write_md(dir, md);
  EXPECT_EQ(load_error(dir), "");

  fs::create_directories(dir + "/iter_99999999999999999999");
  write_bytes(dir + "/iter_99999999999999999999/metadata.json", "{}");
  EXPECT_EQ(ck::list_iterations(dir), (std::vector<int64_t>{10}));

  fs::remove(dir + "/" + ck::kTrackerFile);
  fs::create_directory(dir + "/" + ck::kTrackerFile);
  err = error_of([&] { ck::latest_iteration(dir); });
  expect_has(err, ck::kTrackerFile);
  expect_has(err, "is a directory");
}

// The metadata inside iter_0000010/ claiming iteration 20: convert exported "iteration 20"
// while the tracker named 10.
TEST(HostileCheckpoint, MetadataIterationMustMatchItsFolder) {
  const std::string dir = one_checkpoint();
  json md = read_md(dir);
  md["iteration"] = 20;
  md["state"]["iteration"] = 20;
  write_md(dir, md);
  const std::string err = error_of([&] { ck::read_metadata(dir); });
  expect_has(err, "says iteration 20");
  expect_has(err, "iter_0000010");
}

// The tracker naming iteration 10 with no iter_* folder left: train --load started from
// random weights with a warning and exit 0. Megatron stops; so do we.
TEST(HostileCheckpoint, TrackerNamingAMissingFolderIsAnError) {
  const std::string dir = one_checkpoint();
  fs::rename(dir + "/iter_0000010", dir + "/iter_0000010.old-4242");
  std::string err = error_of([&] { ck::latest_iteration(dir); });
  expect_has(err, "names iteration 10");
  expect_has(err, "iter_0000010.old-4242");  // the hint: where the previous copy is
  fs::remove_all(dir + "/iter_0000010.old-4242");
  err = error_of([&] { ck::latest_iteration(dir); });
  expect_has(err, "holds no other complete checkpoint");
  // No tracker and no checkpoint at all is still "nothing to load".
  fs::remove(dir + "/" + ck::kTrackerFile);
  EXPECT_EQ(ck::latest_iteration(dir), std::nullopt);
}

// An unwritable --save was found only at the first save, after the first interval.
TEST(HostileCheckpoint, UnwritableSaveIsFoundAtStartUp) {
  const std::string dir = scratch_dir();
  write_bytes(dir + "/file", "x");
  const std::string err = error_of([&] { ck::check_save_dir_writable(dir + "/file/ckpt"); });
  expect_has(err, "--save " + dir + "/file/ckpt");
  EXPECT_NO_THROW(ck::check_save_dir_writable(dir + "/new/ckpt"));
  EXPECT_TRUE(fs::is_directory(dir + "/new/ckpt"));
  EXPECT_TRUE(fs::is_empty(dir + "/new/ckpt"));  // the probe file is gone
}

// HF config.json sizes of zero or below: SIGFPE (n_head 0) or narrow(..., -64) errors.
TEST(HostileHf, ConfigSizesAndRangesAreChecked) {
  const json gpt2 = ck::hf_config(tiny_config("gpt"));
  const json llama = ck::hf_config(tiny_config("llama"));
  auto err_with = [&](const json& base, const char* field, json v) {
    json j = base;
    j[field] = v;
    return error_of([&] { ck::model_config_from_hf(j); });
  };
  for (const char* f : {"n_head", "n_embd", "n_layer", "n_inner", "vocab_size", "n_positions"})
    for (json v : {json(0), json(-1)}) expect_has(err_with(gpt2, f, v), f);
  for (const char* f :
       {"num_attention_heads", "intermediate_size", "vocab_size", "num_key_value_heads"})
    for (json v : {json(0), json(-64)}) expect_has(err_with(llama, f, v), f);
  expect_has(err_with(gpt2, "layer_norm_epsilon", -1), "layer_norm_epsilon");
  expect_has(err_with(llama, "rope_theta", 0), "rope_theta");
  expect_has(err_with(llama, "rope_theta", -1), "rope_theta");
  expect_has(err_with(llama, "rms_norm_eps", -1), "rms_norm_eps");
  expect_has(err_with(gpt2, "n_head", 5), "not a multiple");
  EXPECT_NO_THROW(ck::model_config_from_hf(gpt2));
  EXPECT_NO_THROW(ck::model_config_from_hf(llama));
}

// n_layer 2^30 in a 1 MB folder: bad_alloc (or the OOM killer) instead of an error.
TEST(HostileHf, ModelLargerThanItsFilesIsRefused) {
  const std::string dir = scratch_dir();
  model::GPTModel m(tiny_config("gpt"));
  ck::export_hf(dir, tiny_config("gpt"), m.params());
  auto c = ck::model_config_from_hf(ck::read_hf_config(dir), 1);
  EXPECT_NO_THROW(ck::check_hf_fits_files(dir, c));
  c.num_layers = int64_t(1) << 30;
  expect_has(error_of([&] { ck::check_hf_fits_files(dir, c); }), "weight files hold only");
}

// An index.json's weight_map could name any file on the machine.
TEST(HostileHf, WeightMapStaysInsideTheModelFolder) {
  const std::string dir = scratch_dir();
  model::GPTModel m(tiny_config("gpt"));
  ck::export_hf(dir + "/model", tiny_config("gpt"), m.params());
  write_bytes(dir + "/outside.safetensors", read_bytes(dir + "/model/model.safetensors"));
  fs::create_symlink(dir + "/outside.safetensors", dir + "/model/link.safetensors");
  for (const std::string& target :
       {std::string("../outside.safetensors"), dir + "/outside.safetensors",
        std::string("link.safetensors"), std::string("a/../../outside.safetensors")}) {
    write_bytes(dir + "/model/model.safetensors.index.json",
                json{{"weight_map", {{"transformer.wte.weight", target}}}}.dump());
    const std::string err = error_of([&] { ck::hf_weight_files(dir + "/model"); });
    expect_has(err, "outside the model folder");
  }
  write_bytes(dir + "/model/model.safetensors.index.json",
              json{{"weight_map", {{"transformer.wte.weight", "model.safetensors"}}}}.dump());
  EXPECT_EQ(ck::hf_weight_files(dir + "/model"), (std::vector<std::string>{"model.safetensors"}));
}

}  // namespace hostile_test
