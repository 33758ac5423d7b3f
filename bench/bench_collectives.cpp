// Bus bandwidth of megatron.cpp's collectives, as nccl-tests measures NCCL's (issue 8: ours
// must reach >= 90% of NCCL's at the same sizes; two H200s over NV18 give 326 GB/s bus
// bandwidth at 1 GiB and 243 GB/s at 64 MiB with nccl-tests' all_reduce_perf).
//
//   mpirun -np N build/bench/bench_collectives [--device cpu|cuda] [--dtype f32|bf16]
//                                              [--min-mib 1] [--max-mib 1024] [--iters 20]
//
// For all_reduce, all_gather and reduce_scatter over a group of every rank (an NCCL
// communicator on --device cuda, MPI on the CPU), sizes doubling from min to max: the
// time per call (the slowest rank's mean over --iters calls after 5 warm-up calls, the
// stream synchronised once at the end), algbw = bytes / time and busbw = algbw x
// 2(n-1)/n for all_reduce, (n-1)/n for all_gather and reduce_scatter, where bytes is the
// reduced or gathered size (nccl-tests' definitions). Prints one Markdown table on rank 0.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/world.h"
#include "ops/ops.h"
#ifdef MCPP_HAVE_CUDA
#include "ops/cuda/device.h"
#endif

using namespace mcpp;

namespace {

struct Options {
  Device device = Device::CPU;
  DType dtype = DType::F32;
  int64_t min_mib = 1, max_mib = 1024;
  int iters = 20;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      MCPP_CHECK_HINT(i + 1 < argc, "give the flag a value", "{} needs a value", a);
      return argv[++i];
    };
    if (a == "--device") {
      const std::string v = value();
      MCPP_CHECK_HINT(v == "cpu" || v == "cuda", "use cpu or cuda", "--device {}?", v);
      o.device = v == "cuda" ? Device::CUDA : Device::CPU;
    } else if (a == "--dtype") {
      const std::string v = value();
      MCPP_CHECK_HINT(v == "f32" || v == "bf16", "use f32 or bf16", "--dtype {}?", v);
      o.dtype = v == "bf16" ? DType::BF16 : DType::F32;
    } else if (a == "--min-mib") {
      o.min_mib = std::stoll(value());
    } else if (a == "--max-mib") {
      o.max_mib = std::stoll(value());
    } else if (a == "--iters") {
      o.iters = std::stoi(value());
    } else {
      throw Error(fmt::format("unknown flag {}", a),
                  "flags: --device cpu|cuda --dtype f32|bf16 --min-mib N --max-mib N --iters N");
    }
  }
  MCPP_CHECK_HINT(o.min_mib >= 1 && o.max_mib >= o.min_mib && o.iters >= 1,
                  "give 1 <= --min-mib <= --max-mib and --iters >= 1", "bad sizes");
  return o;
}

void sync(Stream& st) {
#ifdef MCPP_HAVE_CUDA
  if (st.device == Device::CUDA) ops::cuda::synchronize(st);
#else
  (void)st;
#endif
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  auto world = comm::init({.device = o.device});
  comm::Communicator& host = world->world();
  std::vector<int> all;
  for (int r = 0; r < world->size(); ++r) all.push_back(r);
  auto group = world->split({all}, "bench");
  comm::Communicator& c = *group;
  const int n = c.size();
  Stream& st = ops::default_stream(o.device);
  Stream& cpu = ops::default_stream(Device::CPU);
  const size_t es = dtype_size(o.dtype);
  if (world->rank() == 0)
    std::printf("## Collectives over %d ranks (%s, backend %s, %s), %d calls a size\n\n"
                "| op | MiB | time (us) | algbw (GB/s) | busbw (GB/s) |\n"
                "|---|---:|---:|---:|---:|\n",
                n, o.device == Device::CUDA ? "GPU tensors" : "host tensors",
                std::string(c.backend()).c_str(), std::string(dtype_name(o.dtype)).c_str(),
                o.iters);
  for (int op = 0; op < 3; ++op) {
    for (int64_t mib = o.min_mib; mib <= o.max_mib; mib *= 2) {
      const int64_t bytes = mib << 20, elems = bytes / int64_t(es);
      const int64_t per_rank = elems / n;  // all_gather input / reduce_scatter output
      Tensor full = Tensor::empty({per_rank * n}, o.dtype, o.device);
      Tensor part = Tensor::empty({per_rank}, o.dtype, o.device);
      ops::fill(full, 1.0, st);
      ops::fill(part, 1.0, st);
      auto call = [&] {
        if (op == 0) c.all_reduce(full, comm::ReduceOp::Sum, st);
        else if (op == 1) c.all_gather(part, full, st);
        else c.reduce_scatter(full, part, st);
      };
      for (int k = 0; k < 5; ++k) call();
      sync(st);
      host.barrier(cpu);
      const auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < o.iters; ++k) call();
      sync(st);
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                    o.iters;
      Tensor t = Tensor::empty({1}, DType::F64);
      t.data<double>()[0] = secs;
      host.all_reduce(t, comm::ReduceOp::Max, cpu);
      secs = t.data<double>()[0];
      const double moved = double(per_rank * n) * double(es);
      const double algbw = moved / secs / 1e9;
      const double factor = op == 0 ? 2.0 * (n - 1) / n : double(n - 1) / n;
      if (world->rank() == 0)
        std::printf("| %s | %lld | %.1f | %.1f | %.1f |\n",
                    op == 0 ? "all_reduce" : op == 1 ? "all_gather" : "reduce_scatter",
                    (long long)mib, secs * 1e6, algbw, algbw * factor);
    }
  }
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "ERROR: %s\n", e.what());
  return 2;
}
