// Programmatic dependent launch of the decode kernels (label gpu; ops/cuda/common.cuh's
// launch_dependent): a chain of decode steps' kernels -- the RMSNorm folded into a GEMM, a
// GEMM with the residual, each reading what the one before wrote -- (1) launched eagerly
// back to back, where they overlap (unless MCPP_DECODE_PDL=0), gives the bits of the same
// chain run with the device synchronised after every kernel, where nothing can overlap, 20
// times over: a kernel that read its input before its predecessor finished would not; (2)
// captured into a CUDA graph as the engine captures its greedy step, is joined by ordinary
// edges only (the overlap measured no faster there and 5% slower at 8 rows) and replays
// the same bits.
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "gpu_test_util.h"

namespace mcpp::test {
namespace decode_pdl_gpu_test {

TEST(GpuDecode, OverlappedStepKernelsKeepTheirBitsAndGraphsKeepOrdinaryEdges) {
  MCPP_REQUIRE_GPU();
  const DType dt = DType::BF16;
  const int64_t K = 2048, layers = 6;
  const double eps = 1e-5;
  std::vector<Tensor> nw, w1, w2;
  for (int64_t l = 0; l < layers; ++l) {
    nw.push_back(to_gpu(rand_in({K}, 10 * l + 1, dt, 0.5f, 1.5f), dt));
    w1.push_back(to_gpu(rand_in({K, K}, 10 * l + 2, dt, -0.05f, 0.05f), dt));
    w2.push_back(to_gpu(rand_in({K, K}, 10 * l + 3, dt, -0.05f, 0.05f), dt));
  }
  const Tensor x = to_gpu(rand_in({1, K}, 99, dt, -2.f, 2.f), dt);
  Tensor xn = gpu_nan({1, K}, dt), rstd = gpu_nan({1}, DType::F32), fc1 = gpu_nan({1, 2 * K}, dt);
  std::vector<Tensor> h{x}, t;
  for (int64_t l = 0; l < layers; ++l) h.push_back(gpu_nan({1, K}, dt)), t.push_back(gpu_nan({1, K}, dt));
  // t_l = (RMSNorm(h_l) folded) @ w1_l; h_{l+1} = t_l @ w2_l + h_l. sync: after every kernel.
  auto chain = [&](bool sync) {
    for (int64_t l = 0; l < layers; ++l) {
      gpu::rmsnorm_linear_decode(h[l], nw[l], eps, xn, rstd, w1[l], Tensor(), false, fc1, t[l],
                                 GS());
      if (sync) gpu::synchronize(GS());
      gpu::linear_decode(t[l], w2[l], Tensor(), h[l], h[l + 1], GS());
      if (sync) gpu::synchronize(GS());
    }
  };
  chain(true);
  const Tensor serial = to_cpu(h[layers]);
  EXPECT_TRUE(std::isfinite(serial.data<float>()[0]));
  for (int64_t l = 1; l <= layers; ++l) gpu::fill(h[l], std::nan(""), GS());

  cudaStream_t cs = static_cast<cudaStream_t>(GS().handle);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  chain(false);
  ASSERT_EQ(cudaStreamEndCapture(cs, &graph), cudaSuccess);
  size_t n = 0;
  ASSERT_EQ(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n), cudaSuccess);
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  ASSERT_EQ(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n), cudaSuccess);
  int programmatic = 0;
  for (size_t i = 0; i < n; ++i) programmatic += data[i].type == cudaGraphDependencyTypeProgrammatic;
  EXPECT_EQ(n, size_t(2 * layers - 1)) << "a chain of " << 2 * layers << " kernels";
  EXPECT_EQ(programmatic, 0) << "captured kernels wait for their predecessor the ordinary way";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 20; ++rep) {
    for (int64_t l = 1; l <= layers; ++l) gpu::fill(h[l], std::nan(""), GS());
    ASSERT_EQ(cudaGraphLaunch(exec, cs), cudaSuccess);
    const Tensor replay = to_cpu(h[layers]);
    ASSERT_EQ(std::memcmp(replay.raw(), serial.raw(), serial.nbytes()), 0)
        << "replay " << rep << " differs from the serialised chain";
  }
  // Eagerly, back to back: the kernels overlap their predecessors.
  for (int rep = 0; rep < 20; ++rep) {
    for (int64_t l = 1; l <= layers; ++l) gpu::fill(h[l], std::nan(""), GS());
    chain(false);
    const Tensor eager = to_cpu(h[layers]);
    ASSERT_EQ(std::memcmp(eager.raw(), serial.raw(), serial.nbytes()), 0)
        << "eager run " << rep << " differs from the serialised chain";
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace decode_pdl_gpu_test
}  // namespace mcpp::test
