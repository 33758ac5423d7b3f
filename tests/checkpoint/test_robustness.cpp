// A checkpoint is never lost: corrupt, truncated or half-written checkpoints are clear
// errors (naming file, tensor and the iterations that do load) or a correct fallback.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "checkpoint/async_saver.h"
#include "ckpt_test_util.h"

using namespace mcpp;
using namespace mcpp::testing;
namespace fs = std::filesystem;
namespace ck = mcpp::checkpoint;

namespace robustness_test {

struct Fixture {
  std::string dir;
  std::unique_ptr<model::GPTModel> m;
  std::unique_ptr<optim::AdamW> opt;
};

// Two good checkpoints (10 and 20) of the gpt model.
Fixture two_checkpoints() {
  Fixture f;
  f.dir = scratch_dir();
  f.m = std::make_unique<model::GPTModel>(tiny_config("gpt"));
  f.opt = std::make_unique<optim::AdamW>(f.m->params(), optim::OptimizerConfig{});
  fill_global(f.m->params(), f.m->params().flat_params(), 10);
  ck::save_checkpoint(f.dir, *f.m, f.opt.get(), sample_state(10));
  fill_global(f.m->params(), f.m->params().flat_params(), 20);
  ck::save_checkpoint(f.dir, *f.m, f.opt.get(), sample_state(20));
  return f;
}

// Loads the latest into a fresh model; returns the error text ("" on success).
std::string load_error(const std::string& dir, const model::TransformerConfig& c,
                       std::optional<int64_t> it = {}) {
  model::GPTModel m(c);
  optim::AdamW opt(m.params(), {});
  try {
    ck::load_checkpoint(dir, it, m, &opt);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The hint every load error carries: which iterations exist and which one to load.
void expect_points_to_10(const std::string& err) {
  expect_has(err, "complete checkpoints in");
  expect_has(err, "10, 20");
  expect_has(err, "--ckpt-step 10");
}


TEST(CheckpointRobustness, TruncatedShard) {
  auto f = two_checkpoints();
  const std::string file = f.dir + "/iter_0000020/model_tp00_pp00.safetensors";
  fs::resize_file(file, fs::file_size(file) - 100);
  std::string err = load_error(f.dir, tiny_config("gpt"));
  expect_has(err, "model_tp00_pp00.safetensors");
  expect_has(err, "truncated");
  expect_points_to_10(err);
  EXPECT_EQ(load_error(f.dir, tiny_config("gpt"), 10), "");
}

TEST(CheckpointRobustness, TruncatedShardHeader) {
  auto f = two_checkpoints();
  const std::string file = f.dir + "/iter_0000020/optim_tp00_pp00_dp00.safetensors";
  fs::resize_file(file, 20);
  std::string err = load_error(f.dir, tiny_config("gpt"));
  expect_has(err, "optim_tp00_pp00_dp00.safetensors");
  expect_points_to_10(err);
}

TEST(CheckpointRobustness, FlippedByteIsChecksumError) {
  auto f = two_checkpoints();
  const std::string file = f.dir + "/iter_0000020/model_tp00_pp00.safetensors";
  std::string b = read_bytes(file);
  b[b.size() - 3] ^= 0x01;  // last tensor in name order: position_embeddings? any tensor
  write_bytes(file, b);
  std::string err = load_error(f.dir, tiny_config("gpt"));
  expect_has(err, "checksum mismatch for tensor");
  expect_has(err, "model_tp00_pp00.safetensors");
  expect_points_to_10(err);
}

TEST(CheckpointRobustness, FlippedHeaderByte) {
  auto f = two_checkpoints();
  const std::string file = f.dir + "/iter_0000020/model_tp00_pp00.safetensors";
  std::string b = read_bytes(file);
  // Every byte of the header and a few of the data: either a clear error, or (a flip inside
  // the informational __metadata__ string) a load that yields exactly the saved weights.
  uint64_t hlen = 0;
  std::memcpy(&hlen, b.data(), 8);
  int errors = 0, tried = 0;
  for (size_t pos = 0; pos < 8 + hlen + 64; pos += (pos < 8 + hlen ? 3 : 7)) {
    std::string c = b;
    c[pos] ^= 0x5a;
    ++tried;
    write_bytes(file, c);
    model::GPTModel m(tiny_config("gpt"));
    try {
      ck::load_checkpoint(f.dir, std::nullopt, m, nullptr);
      ASSERT_EQ(count_mismatches(m.params(), m.params().flat_params(), 20), 0) << "byte " << pos;
    } catch (const Error& e) {
      ++errors;
      expect_points_to_10(e.what());
    }
  }
  EXPECT_GT(errors, tried / 2);
}

TEST(CheckpointRobustness, DeletedMetadata) {
  auto f = two_checkpoints();
  fs::remove(f.dir + "/iter_0000020/metadata.json");
  std::string err = load_error(f.dir, tiny_config("gpt"));
  expect_has(err, "metadata.json is missing");
  expect_has(err, "complete checkpoints in");
  expect_has(err, "--ckpt-step 10");
  EXPECT_EQ(ck::list_iterations(f.dir), (std::vector<int64_t>{10}));
}

TEST(CheckpointRobustness, GarbageMetadata) {
  auto f = two_checkpoints();
  write_bytes(f.dir + "/iter_0000020/metadata.json", "{\"format\": \"megatron.cpp chec");
  std::string err = load_error(f.dir, tiny_config("gpt"));
  expect_has(err, "not valid JSON");
  expect_points_to_10(err);
  write_bytes(f.dir + "/iter_0000020/metadata.json",
              R"({"format": "megatron.cpp checkpoint", "format_version": 1, "tensors": 3,
                  "files": {}, "state": {}, "iteration": 20})");
  err = load_error(f.dir, tiny_config("gpt"));
  EXPECT_FALSE(err.empty());
  expect_points_to_10(err);
}

TEST(CheckpointRobustness, MissingShardFile) {
  auto f = two_checkpoints();
  fs::remove(f.dir + "/iter_0000020/optim_tp00_pp00_dp00.safetensors");
  std::string err = load_error(f.dir, tiny_config("gpt"));
  expect_has(err, "optim_tp00_pp00_dp00.safetensors");
  expect_has(err, "missing");
  expect_points_to_10(err);
}

TEST(CheckpointRobustness, MismatchedHiddenSize) {
  auto f = two_checkpoints();
  auto c = tiny_config("gpt");
  c.hidden_size = 32, c.kv_channels = 8;
  std::string err = load_error(f.dir, c);
  expect_has(err, "different model");
  expect_has(err, "hidden_size: checkpoint 16 vs this run 32");
  // Without the config check, the tensor check still names the tensor.
  model::GPTModel m(c);
  try {
    ck::load_checkpoint(f.dir, std::nullopt, m.params(), nullptr);
    FAIL();
  } catch (const Error& e) {
    expect_has(e.what(), "embedding.word_embeddings.weight: checkpoint global shape [64, 16]");
  }
}

TEST(CheckpointRobustness, OtherArchitecture) {
  auto f = two_checkpoints();
  std::string err = load_error(f.dir, tiny_config("llama"));
  expect_has(err, "different model");
  expect_has(err, "swiglu");
  model::GPTModel m(tiny_config("llama"));
  try {
    ck::load_checkpoint(f.dir, std::nullopt, m.params(), nullptr);
    FAIL();
  } catch (const Error& e) {
    expect_has(e.what(), "checkpoint global shape [48, 16], model [32, 16]");
  }
}

TEST(CheckpointRobustness, NoCheckpointAtAll) {
  const std::string dir = scratch_dir();
  std::string err = load_error(dir, tiny_config("gpt"));
  expect_has(err, "no checkpoint found");
  EXPECT_EQ(ck::latest_iteration(dir), std::nullopt);
  EXPECT_EQ(ck::latest_iteration(dir + "/does-not-exist"), std::nullopt);
}

TEST(CheckpointRobustness, AskedForMissingIteration) {
  auto f = two_checkpoints();
  std::string err = load_error(f.dir, tiny_config("gpt"), 15);
  expect_has(err, "iter_0000015 does not exist");
  expect_has(err, "10, 20");
}

// A save killed before the rename leaves iter_X.tmp-<pid>; the tracker still names 20.
TEST(CheckpointRobustness, KilledSaveLeavesTempDir) {
  auto f = two_checkpoints();
  fs::copy(f.dir + "/iter_0000020", f.dir + "/iter_0000030.tmp-99999");
  fs::resize_file(f.dir + "/iter_0000030.tmp-99999/model_tp00_pp00.safetensors", 64);
  EXPECT_EQ(ck::latest_iteration(f.dir), 20);
  EXPECT_EQ(ck::list_iterations(f.dir), (std::vector<int64_t>{10, 20}));
  model::GPTModel m(tiny_config("gpt"));
  EXPECT_EQ(ck::load_checkpoint(f.dir, std::nullopt, m, nullptr).iteration, 20);
  EXPECT_EQ(count_mismatches(m.params(), m.params().flat_params(), 20), 0);
  // The next save removes the leftover.
  ck::save_checkpoint(f.dir, *f.m, nullptr, sample_state(30));
  EXPECT_FALSE(fs::exists(f.dir + "/iter_0000030.tmp-99999"));
  EXPECT_EQ(ck::latest_iteration(f.dir), 30);
}

// Killed after the rename, before the tracker update: the tracker (20) still rules.
TEST(CheckpointRobustness, KilledBeforeTrackerUpdate) {
  auto f = two_checkpoints();
  ck::save_checkpoint(f.dir, *f.m, f.opt.get(), sample_state(30));
  write_bytes(f.dir + "/latest_checkpointed_iteration.txt", "20");
  EXPECT_EQ(ck::latest_iteration(f.dir), 20);
  // Lost or garbled tracker: the newest complete checkpoint, with a warning.
  fs::remove(f.dir + "/latest_checkpointed_iteration.txt");
  EXPECT_EQ(ck::latest_iteration(f.dir), 30);
  write_bytes(f.dir + "/latest_checkpointed_iteration.txt", "\x01garbage");
  EXPECT_EQ(ck::latest_iteration(f.dir), 30);
  EXPECT_EQ(load_error(f.dir, tiny_config("gpt")), "");
}

// kill -9 at random moments of a save: the latest checkpoint always loads.
TEST(CheckpointRobustness, KillDuringSave) {
  auto f = two_checkpoints();
  const auto t0 = std::chrono::steady_clock::now();
  ck::save_checkpoint(f.dir, *f.m, f.opt.get(), sample_state(20));
  const double save_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  for (int trial = 0; trial < 16; ++trial) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (int64_t it = 21;; ++it) {
        try {
          ck::save_checkpoint(f.dir, *f.m, f.opt.get(), sample_state(it));
        } catch (...) {
          ::_exit(1);
        }
      }
    }
    // Kill points spread over the first three saves of the child.
    std::this_thread::sleep_for(
        std::chrono::microseconds(int64_t(save_us * 3.0 * (trial + 0.5) / 16)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    auto latest = ck::latest_iteration(f.dir);
    ASSERT_TRUE(latest.has_value());
    EXPECT_EQ(load_error(f.dir, tiny_config("gpt")), "")
        << "trial " << trial << " latest " << *latest;
  }
}

// ---- asynchronous save -------------------------------------------------------------------

TEST(AsyncSaver, WritesTheSnapshot) {
  const std::string dir = scratch_dir();
  model::GPTModel m(tiny_config("llama"));
  optim::AdamW opt(m.params(), {});
  fill_global(m.params(), m.params().flat_params(), 5);
  ck::AsyncSaver saver;
  saver.save(dir, m.params(), &opt, sample_state(1));
  // Training continues: the weights change while the save is in flight.
  fill_global(m.params(), m.params().flat_params(), 6);
  saver.save(dir, m.params(), &opt, sample_state(2));  // waits for the first
  fill_global(m.params(), m.params().flat_params(), 7);
  saver.wait();
  EXPECT_TRUE(saver.poll());
  EXPECT_FALSE(saver.in_flight());
  EXPECT_EQ(ck::latest_iteration(dir), 2);
  model::GPTModel r(tiny_config("llama"));
  ck::load_checkpoint(dir, 1, r, nullptr);
  EXPECT_EQ(count_mismatches(r.params(), r.params().flat_params(), 5), 0);
  ck::load_checkpoint(dir, 2, r, nullptr);
  EXPECT_EQ(count_mismatches(r.params(), r.params().flat_params(), 6), 0);
}

TEST(AsyncSaver, ErrorSurfacesOnNextCall) {
  const std::string dir = scratch_dir();
  write_bytes(dir + "/not_a_dir", "x");
  model::GPTModel m(tiny_config("gpt"));
  ck::AsyncSaver saver;
  saver.save(dir + "/not_a_dir/sub", m.params(), nullptr, sample_state(1));
  bool threw = false;
  try {
    while (!saver.poll()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } catch (const Error& e) {
    threw = true;
    expect_has(e.what(), "not_a_dir");
  }
  EXPECT_TRUE(threw);
  saver.wait();  // the error is reported once
  saver.save(dir + "/ok", m.params(), nullptr, sample_state(2));
  saver.wait();
  EXPECT_EQ(ck::latest_iteration(dir + "/ok"), 2);
}

}  // namespace robustness_test
