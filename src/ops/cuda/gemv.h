// The kernels behind the CUDA linear_decode (ops/cuda/gemv.cu), by name, for the tests and
// bench/gpu/bench_decode.cpp that compare them: the op itself always takes Auto.
#pragma once
#include "tensor/tensor.h"

namespace mcpp::ops::cuda {

enum class DecodeGemm {
  Auto,        // Gemv up to 8 rows, TensorCore up to 64, else Library
  Gemv,        // CUDA cores, f32/bf16/f16, up to 8 rows, in a multiple of 16 bytes
  TensorCore,  // mma.sync, bf16/f16, up to 64 rows, in a multiple of 64
  Library,     // cuBLASLt (linear_residual_forward with a residual, else linear_forward)
  SplitK,      // mma.sync, K split over a thread-block cluster (ops/cuda/gemv_splitk.cu):
               // bf16/f16, up to 64 rows (meant for 9..64), in a multiple of 64, sm_90;
               // Auto takes it for 9..64 rows only with MCPP_DECODE_SPLITK=1 (for now)
};
// linear_decode through `path`; a path that does not take the shape or dtypes falls back
// to Library.
void linear_decode_with(DecodeGemm path, const Tensor& x, const Tensor& w, const Tensor& b,
                        const Tensor& residual, Tensor& y, Stream& s);

}  // namespace mcpp::ops::cuda
