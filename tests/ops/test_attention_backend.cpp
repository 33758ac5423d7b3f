// ops::choose_attention_backend: which attention kernel a training call gets, and the
// reason the start-up log line gives. The CUDA dispatch routes by this function, so these
// are the routing decisions themselves (the GPU test GpuFlashDropout.* checks that calls
// with dropout really run the flash kernel).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <tuple>

#include "base/error.h"
#include "ops/attention_backend.h"

using namespace mcpp;
using ops::AttentionBackend;

namespace attention_backend_test {
ops::AttentionBackendChoice pick(DType dt, int64_t hd, double p, bool cudnn = true,
                                 bool forced = false, Device dev = Device::CUDA) {
  ops::AttentionBackendQuery q;
  q.device = dev, q.dtype = dt, q.head_dim = hd, q.dropout_p = p;
  q.cudnn_available = cudnn, q.fallback_forced = forced;
  return ops::choose_attention_backend(q);
}
bool has(const std::string& s, const char* w) { return s.find(w) != std::string::npos; }

TEST(AttentionBackend, DropoutFreeBf16GoesToCudnnWhenAvailable) {
  for (DType dt : {DType::BF16, DType::F16})
    for (int64_t hd : {32, 64, 96, 128}) {
      auto c = pick(dt, hd, 0.0);
      EXPECT_EQ(c.backend, AttentionBackend::Cudnn) << hd;
      EXPECT_FALSE(c.slow());
    }
  // Without cuDNN the own flash kernel takes 64 and 128, the rest falls back.
  EXPECT_EQ(pick(DType::BF16, 64, 0.0, false).backend, AttentionBackend::Flash);
  EXPECT_TRUE(has(pick(DType::BF16, 128, 0.0, false).reason, "cuDNN not available"));
  auto c = pick(DType::BF16, 32, 0.0, false);
  EXPECT_EQ(c.backend, AttentionBackend::CudaCore);
  EXPECT_TRUE(c.slow());
  EXPECT_TRUE(has(c.reason, "head dim 32 unsupported")) << c.reason;
  // cuDNN takes multiples of 8 up to 256 (multi-latent attention's 192 among them).
  for (int64_t hd : {192, 256}) EXPECT_EQ(pick(DType::BF16, hd, 0.0).backend, AttentionBackend::Cudnn);
  // A head dim no kernel takes is a start-up error naming the ways out, not a failure at the
  // first step (the CUDA-core kernel takes 32, 64 and 128).
  for (auto [hd, p, cudnn] : {std::tuple{96, 0.0, false}, std::tuple{100, 0.0, true},
                              std::tuple{264, 0.0, true}, std::tuple{192, 0.1, true}}) {
    try {
      pick(DType::BF16, hd, p, cudnn);
      ADD_FAILURE() << "head dim " << hd << " accepted";
    } catch (const Error& e) {
      EXPECT_TRUE(has(e.what(), "has no CUDA kernel in this configuration")) << e.what();
      EXPECT_TRUE(has(e.hint(), "--attention-dropout 0")) << e.hint();
    }
  }
}

TEST(AttentionBackend, DropoutGoesToTheFlashKernelNeverToCudnn) {
  for (DType dt : {DType::BF16, DType::F16})
    for (int64_t hd : {64, 128})
      for (bool cudnn : {true, false}) {
        auto c = pick(dt, hd, 0.1, cudnn);
        EXPECT_EQ(c.backend, AttentionBackend::Flash) << hd << " " << cudnn;
        EXPECT_TRUE(has(c.reason, "with dropout")) << c.reason;
      }
  // Head dims the flash kernel lacks: cuDNN cannot draw our mask, so the CUDA cores (32; 80
  // and 96 they do not take: errors, above).
  auto c = pick(DType::BF16, 32, 0.1);
  EXPECT_EQ(c.backend, AttentionBackend::CudaCore);
  EXPECT_TRUE(has(c.reason, "cannot draw the dropout mask")) << c.reason;
}

TEST(AttentionBackend, F32ForcedFallbackAndCpu) {
  auto c = pick(DType::F32, 64, 0.0);
  EXPECT_EQ(c.backend, AttentionBackend::CudaCore);
  EXPECT_TRUE(has(c.reason, "f32")) << c.reason;
  c = pick(DType::BF16, 64, 0.1, true, /*forced=*/true);
  EXPECT_EQ(c.backend, AttentionBackend::CudaCore);
  EXPECT_TRUE(has(c.reason, "MCPP_ATTENTION_FALLBACK")) << c.reason;
  EXPECT_EQ(pick(DType::F32, 96, 0.1, false, false, Device::CPU).backend, AttentionBackend::Cpu);
}

TEST(AttentionBackend, DescribeNamesLayersAndSlowPath) {
  // This process's query (a CPU model here): the line a trainer logs at start-up.
  const std::string s = ops::describe_attention_backend(Device::CPU, DType::F32, 64, 0.1, 12);
  EXPECT_TRUE(has(s, "all 12 layers")) << s;
  EXPECT_TRUE(has(s, "CPU backend")) << s;
  EXPECT_FALSE(has(s, "--window-size")) << s;
  // Window layers and documents are named, with the path they take on each device.
  const std::string w = ops::describe_attention_backend(Device::CPU, DType::F32, 64, 0.1, 12, 6);
  EXPECT_TRUE(has(w, "6 of the 12 layers (--window-size)")) << w;
  EXPECT_TRUE(has(w, "masked")) << w;
  const std::string d =
      ops::masked_layers(Device::CUDA, 12, 6, /*documents=*/true);
  EXPECT_TRUE(has(d, "all 12 layers (--reset-attention-mask)")) << d;
  EXPECT_TRUE(has(d, "document-mask kernels")) << d;
}

// --attention-backend: fused -> cuDNN, flash -> the own flash kernel, unfused / local -> the
// CUDA-core kernel, auto -> the order above; a request the call cannot honour is an error
// naming the flag, never a silent substitute.
ops::AttentionBackendChoice ask(ops::AttentionRequest r, DType dt, int64_t hd, double p,
                                bool cudnn = true, bool forced = false,
                                Device dev = Device::CUDA) {
  ops::AttentionBackendQuery q;
  q.device = dev, q.dtype = dt, q.head_dim = hd, q.dropout_p = p;
  q.cudnn_available = cudnn, q.fallback_forced = forced, q.request = r;
  return ops::choose_attention_backend(q);
}
std::string error_of(ops::AttentionRequest r, DType dt, int64_t hd, double p, bool cudnn = true,
                     bool forced = false, Device dev = Device::CUDA) {
  try {
    ask(r, dt, hd, p, cudnn, forced, dev);
  } catch (const Error& e) {
    EXPECT_FALSE(e.hint().empty());
    return e.what();
  }
  return "";
}

TEST(AttentionBackend, AutoRequestIsTodaysChoice) {
  using R = ops::AttentionRequest;
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (int64_t hd : {32, 64, 96, 128, 256})
      for (double p : {0.0, 0.1})
        for (bool cudnn : {true, false})
          for (bool forced : {true, false}) {
            // The same choice, or the same error (head dims no kernel takes).
            auto outcome = [&](auto f) {
              try {
                auto c = f();
                return fmt::format("{} {}", int(c.backend), c.reason);
              } catch (const Error& e) {
                return std::string("error: ") + e.what();
              }
            };
            EXPECT_EQ(outcome([&] { return ask(R::Auto, dt, hd, p, cudnn, forced); }),
                      outcome([&] { return pick(dt, hd, p, cudnn, forced); }))
                << hd << " " << p;
          }
}

TEST(AttentionBackend, RequestsMapToKernels) {
  using R = ops::AttentionRequest;
  // fused = cuDNN (head dim 96, which the flash kernel does not take).
  EXPECT_EQ(ask(R::Fused, DType::BF16, 96, 0.0).backend, AttentionBackend::Cudnn);
  // flash = the own kernel, also where auto would take cuDNN.
  auto c = ask(R::Flash, DType::BF16, 64, 0.0);
  EXPECT_EQ(c.backend, AttentionBackend::Flash);
  EXPECT_TRUE(has(c.reason, "--attention-backend flash")) << c.reason;
  EXPECT_EQ(ask(R::Flash, DType::F16, 128, 0.1).backend, AttentionBackend::Flash);
  // unfused and local = the CUDA-core kernel, for any shape and dtype.
  for (R r : {R::Unfused, R::Local})
    for (DType dt : {DType::BF16, DType::F32}) {
      auto u = ask(r, dt, 64, 0.1);
      EXPECT_EQ(u.backend, AttentionBackend::CudaCore);
      EXPECT_TRUE(u.slow());
    }
}

TEST(AttentionBackend, ImpossibleRequestsAreErrors) {
  using R = ops::AttentionRequest;
  EXPECT_TRUE(has(error_of(R::Fused, DType::BF16, 64, 0.1), "--attention-dropout 0.1"));
  EXPECT_TRUE(has(error_of(R::Fused, DType::BF16, 64, 0.0, false), "cuDNN is not available"));
  EXPECT_TRUE(has(error_of(R::Fused, DType::BF16, 100, 0.0), "head dim 100"));
  EXPECT_TRUE(has(error_of(R::Flash, DType::BF16, 96, 0.0), "head dim 96"));
  EXPECT_TRUE(has(error_of(R::Flash, DType::F32, 64, 0.0), "f32"));
  EXPECT_TRUE(has(error_of(R::Fused, DType::BF16, 64, 0.0, true, /*forced=*/true),
                  "MCPP_ATTENTION_FALLBACK"));
  EXPECT_TRUE(
      has(error_of(R::Flash, DType::BF16, 64, 0.0, true, false, Device::CPU), "CPU backend"));
  const std::string e = error_of(R::Fused, DType::BF16, 64, 0.1);
  EXPECT_TRUE(has(e, "--attention-backend fused")) << e;
  // The CPU backend has one kernel: auto only.
  EXPECT_EQ(ask(R::Auto, DType::F32, 64, 0.1, false, false, Device::CPU).backend,
            AttentionBackend::Cpu);
}

TEST(AttentionBackend, ProcessRequestFeedsTheQuery) {
  const auto before = ops::attention_request();
  ops::set_attention_request(ops::AttentionRequest::Unfused);
  EXPECT_EQ(ops::attention_backend_query(Device::CUDA, DType::BF16, 64, 0.0).request,
            ops::AttentionRequest::Unfused);
  ops::set_attention_request(before);
  EXPECT_EQ(ops::attention_backend_query(Device::CUDA, DType::BF16, 64, 0.0).request, before);
}

// The flash backward's dropout-mask buffer (one bit per score, rows padded to 64 keys so a
// 64-key tile is one aligned 8-byte word): what the CUDA op allocates and a memory plan can
// count without CUDA.
TEST(AttentionBackend, FlashDropoutMaskBytes) {
  // Row q of query tile t keeps 8 (t + 1) bytes (keys up to its own tile's end): tile t's 64
  // rows 512 (t + 1) bytes, a head's nt tiles 256 nt (nt + 1).
  EXPECT_EQ(mcpp::ops::flash_dropout_mask_bytes(1, 1, 64), 64 * 8);
  EXPECT_EQ(mcpp::ops::flash_dropout_mask_bytes(2, 3, 100), 2 * 3 * (64 * 8 + 64 * 16));
  EXPECT_EQ(mcpp::ops::flash_dropout_mask_bytes(64, 12, 1024), 64 * 12 * 69632);  // GPT-2 124M
  EXPECT_EQ(mcpp::ops::flash_dropout_mask_bytes(16, 32, 2048), 16 * 32 * 270336);  // Llama 1B
  // About half of a bit per score of the square.
  EXPECT_NEAR(double(mcpp::ops::flash_dropout_mask_bytes(1, 1, 8192)) / (8192.0 * 8192 / 8), 0.5,
              0.01);
}

}  // namespace attention_backend_test
