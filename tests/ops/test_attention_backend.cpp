// ops::choose_attention_backend: which attention kernel a training call gets, and the
// reason the start-up log line gives. The CUDA dispatch routes by this function, so these
// are the routing decisions themselves (the GPU test GpuFlashDropout.* checks that calls
// with dropout really run the flash kernel).
#include <gtest/gtest.h>

#include "ops/attention_backend.h"

using namespace mcpp;
using ops::AttentionBackend;

namespace {
ops::AttentionBackendChoice pick(DType dt, int64_t hd, double p, bool cudnn = true,
                                 bool forced = false, Device dev = Device::CUDA) {
  ops::AttentionBackendQuery q;
  q.device = dev, q.dtype = dt, q.head_dim = hd, q.dropout_p = p;
  q.cudnn_available = cudnn, q.fallback_forced = forced;
  return ops::choose_attention_backend(q);
}
bool has(const std::string& s, const char* w) { return s.find(w) != std::string::npos; }
}  // namespace

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
  auto c = pick(DType::BF16, 96, 0.0, false);
  EXPECT_EQ(c.backend, AttentionBackend::CudaCore);
  EXPECT_TRUE(c.slow());
  EXPECT_TRUE(has(c.reason, "head dim 96 unsupported")) << c.reason;
  // cuDNN takes multiples of 8 up to 128 only.
  EXPECT_EQ(pick(DType::BF16, 100, 0.0).backend, AttentionBackend::CudaCore);
  EXPECT_EQ(pick(DType::BF16, 256, 0.0).backend, AttentionBackend::CudaCore);
}

TEST(AttentionBackend, DropoutGoesToTheFlashKernelNeverToCudnn) {
  for (DType dt : {DType::BF16, DType::F16})
    for (int64_t hd : {64, 128})
      for (bool cudnn : {true, false}) {
        auto c = pick(dt, hd, 0.1, cudnn);
        EXPECT_EQ(c.backend, AttentionBackend::Flash) << hd << " " << cudnn;
        EXPECT_TRUE(has(c.reason, "with dropout")) << c.reason;
      }
  // Head dims the flash kernel lacks: cuDNN cannot draw our mask, so the CUDA cores.
  for (int64_t hd : {32, 80, 96}) {
    auto c = pick(DType::BF16, hd, 0.1);
    EXPECT_EQ(c.backend, AttentionBackend::CudaCore) << hd;
    EXPECT_TRUE(has(c.reason, "cannot draw the dropout mask")) << c.reason;
  }
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
}
