// Word and learned position embeddings, forward above backward.
// ids[B, S] (i32/i64, the data loader's layout); table[Vl, H] (f32/bf16/f16) holds vocab
// rows [vocab_start, vocab_start + Vl); y[S, B, H] activation dtype (sequence-first);
// dtable, dpos: f32, accumulated (+=).
// The word-embedding backward is deterministic: token rows are sorted by id (stable
// radix sort, so equal ids keep token order) and each id's rows are summed in that
// order by one block; no atomics.
#include <cub/device/device_radix_sort.cuh>

#include "ops/cuda/common.cuh"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

namespace {

template <typename I>
__device__ __forceinline__ int64_t load_id(const I* ids, int64_t i) {
  return int64_t(ids[i]);
}

template <typename I, typename TW, typename T>
static __global__ void embed_fwd_kernel(const I* __restrict__ ids, const TW* __restrict__ table,
                                        int64_t vs, int64_t Vl, T* __restrict__ y, int64_t S,
                                        int64_t B, int64_t H) {
  int64_t n = S * B * H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t h = i % H, row = i / H;
    int64_t s = row / B, b = row - s * B;
    int64_t id = load_id(ids, b * S + s) - vs;
    y[i] = (id >= 0 && id < Vl) ? from_f<T>(to_f(table[id * H + h])) : from_f<T>(0.f);
  }
}

// keys[row] = local id (Vl when outside the slice), vals[row] = row (= s * B + b).
template <typename I>
static __global__ void embed_keys_kernel(const I* __restrict__ ids, int64_t vs, int64_t Vl,
                                         int64_t S, int64_t B, int32_t* keys, int32_t* vals) {
  int64_t n = S * B;
  for (int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; row < n;
       row += int64_t(gridDim.x) * blockDim.x) {
    int64_t s = row / B, b = row - s * B;
    int64_t id = load_id(ids, b * S + s) - vs;
    keys[row] = (id >= 0 && id < Vl) ? int32_t(id) : int32_t(Vl);
    vals[row] = int32_t(row);
  }
}

// One block per sorted position that starts a run of equal ids.
template <typename T>
static __global__ void embed_bwd_kernel(const T* __restrict__ dy, const int32_t* __restrict__ keys,
                                        const int32_t* __restrict__ vals, int64_t n, int64_t Vl,
                                        int64_t H, float* __restrict__ dtable) {
  int64_t p = blockIdx.x;
  int32_t k = keys[p];
  if (k >= Vl || (p > 0 && keys[p - 1] == k)) return;
  int64_t end = p + 1;
  while (end < n && keys[end] == k) ++end;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    float acc = 0.f;
    for (int64_t q = p; q < end; ++q) acc += to_f(dy[int64_t(vals[q]) * H + h]);
    dtable[int64_t(k) * H + h] += acc;
  }
}

template <typename T, typename TP>
static __global__ void pos_fwd_kernel(const TP* __restrict__ pos, int64_t off, T* y, int64_t S,
                                      int64_t B, int64_t H) {
  int64_t n = S * B * H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t h = i % H, s = i / (B * H);
    y[i] = from_f<T>(to_f(y[i]) + to_f(pos[(s + off) * H + h]));
  }
}

template <typename T>
static __global__ void pos_bwd_kernel(const T* __restrict__ dy, int64_t off, float* dpos,
                                      int64_t S, int64_t B, int64_t H) {
  int64_t n = S * H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t h = i % H, s = i / H;
    float acc = 0.f;
    for (int64_t b = 0; b < B; ++b) acc += to_f(dy[(s * B + b) * H + h]);
    dpos[(s + off) * H + h] += acc;
  }
}

void check_ids(const Tensor& ids, const char* op) {
  check_cuda(ids, op, "ids");
  MCPP_CHECK(ids.dtype() == DType::I32 || ids.dtype() == DType::I64,
             "{}: ids is {}; i32 or i64 expected", op, ids.str());
  MCPP_CHECK(ids.dim() == 2, "{}: ids is {}; [B, S] expected", op, ids.str());
}

}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& table, int64_t vocab_start, Tensor& y,
                       Stream& s) {
  const char* op = "embedding_forward";
  check_ids(ids, op);
  check_cuda(table, op, "table");
  check_cuda(y, op, "y");
  int64_t B = ids.size(0), S = ids.size(1), Vl = table.size(0), H = table.size(-1);
  MCPP_CHECK(y.numel() == S * B * H, "{}: y is {}; [S={}, B={}, H={}] expected", op, y.str(), S,
             B, H);
  int64_t n = S * B * H;
  if (n == 0) return;
  cudaStream_t cs = stream_of(s);
  auto run = [&](auto idp) {
    using I = std::remove_cv_t<std::remove_pointer_t<decltype(idp)>>;
    MCPP_DISPATCH_ACT(table.dtype(), op, MCPP_DISPATCH_ACT2(y.dtype(), op, {
      embed_fwd_kernel<I, T, T2><<<grid_for(n, 256), 256, 0, cs>>>(
          idp, static_cast<const T*>(table.raw()), vocab_start, Vl, static_cast<T2*>(y.raw()), S,
          B, H);
    }));
  };
  if (ids.dtype() == DType::I32)
    run(static_cast<const int32_t*>(ids.raw()));
  else
    run(static_cast<const int64_t*>(ids.raw()));
  MCPP_LAUNCH_CHECK();
}

void embedding_backward(const Tensor& dy, const Tensor& ids, int64_t vocab_start, Tensor& dtable,
                        Stream& s) {
  const char* op = "embedding_backward";
  check_ids(ids, op);
  check_cuda(dy, op, "dy");
  check_f32(dtable, op, "dtable");
  int64_t B = ids.size(0), S = ids.size(1), Vl = dtable.size(0), H = dtable.size(-1);
  MCPP_CHECK(dy.numel() == S * B * H, "{}: dy is {}; [S={}, B={}, H={}] expected", op, dy.str(),
             S, B, H);
  MCPP_CHECK(Vl < (int64_t(1) << 31) && S * B < (int64_t(1) << 31),
             "{}: more than 2^31 rows or tokens", op);
  int64_t n = S * B;
  if (n == 0 || H == 0) return;
  cudaStream_t cs = stream_of(s);
  Tensor keys = Tensor::empty({2, n}, DType::I32, Device::CUDA);
  Tensor sorted = Tensor::empty({2, n}, DType::I32, Device::CUDA);
  int32_t* k_in = static_cast<int32_t*>(keys.raw());
  int32_t* v_in = k_in + n;
  int32_t* k_out = static_cast<int32_t*>(sorted.raw());
  int32_t* v_out = k_out + n;
  if (ids.dtype() == DType::I32)
    embed_keys_kernel<<<grid_for(n, 256), 256, 0, cs>>>(static_cast<const int32_t*>(ids.raw()),
                                                        vocab_start, Vl, S, B, k_in, v_in);
  else
    embed_keys_kernel<<<grid_for(n, 256), 256, 0, cs>>>(static_cast<const int64_t*>(ids.raw()),
                                                        vocab_start, Vl, S, B, k_in, v_in);
  MCPP_LAUNCH_CHECK();
  int end_bit = 1;
  while (end_bit < 32 && (int64_t(1) << end_bit) <= Vl) ++end_bit;
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, k_in, k_out, v_in, v_out,
                                             int(n), 0, end_bit, cs));
  Tensor temp = Tensor::empty({int64_t(std::max<size_t>(temp_bytes, 1))}, DType::U8,
                              Device::CUDA);
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw(), temp_bytes, k_in, k_out, v_in, v_out,
                                             int(n), 0, end_bit, cs));
  MCPP_DISPATCH_ACT(dy.dtype(), op,
                    embed_bwd_kernel<T><<<unsigned(n), 256, 0, cs>>>(
                        static_cast<const T*>(dy.raw()), k_out, v_out, n, Vl, H,
                        static_cast<float*>(dtable.raw())));
  MCPP_LAUNCH_CHECK();
}

void position_embedding_forward(const Tensor& pos, int64_t s_offset, Tensor& y, Stream& s) {
  const char* op = "position_embedding_forward";
  check_cuda(pos, op, "pos");
  check_cuda(y, op, "y");
  MCPP_CHECK(y.dim() == 3, "{}: y is {}; [S, B, H] expected", op, y.str());
  int64_t S = y.size(0), B = y.size(1), H = y.size(2);
  MCPP_CHECK(pos.size(-1) == H && pos.size(0) >= S + s_offset && s_offset >= 0,
             "{}: pos is {}, too small for positions [{}, {}) of width {}", op, pos.str(),
             s_offset, s_offset + S, H);
  int64_t n = S * B * H;
  if (n == 0) return;
  MCPP_DISPATCH_ACT(y.dtype(), op, MCPP_DISPATCH_ACT2(pos.dtype(), op, {
    pos_fwd_kernel<T, T2><<<grid_for(n, 256), 256, 0, stream_of(s)>>>(
        static_cast<const T2*>(pos.raw()), s_offset, static_cast<T*>(y.raw()), S, B, H);
  }));
  MCPP_LAUNCH_CHECK();
}

void position_embedding_backward(const Tensor& dy, int64_t s_offset, Tensor& dpos, Stream& s) {
  const char* op = "position_embedding_backward";
  check_cuda(dy, op, "dy");
  check_f32(dpos, op, "dpos");
  MCPP_CHECK(dy.dim() == 3, "{}: dy is {}; [S, B, H] expected", op, dy.str());
  int64_t S = dy.size(0), B = dy.size(1), H = dy.size(2);
  MCPP_CHECK(dpos.size(-1) == H && dpos.size(0) >= S + s_offset && s_offset >= 0,
             "{}: dpos is {}, too small for positions [{}, {}) of width {}", op, dpos.str(),
             s_offset, s_offset + S, H);
  int64_t n = S * H;
  if (n == 0) return;
  MCPP_DISPATCH_ACT(dy.dtype(), op,
                    pos_bwd_kernel<T><<<grid_for(n, 256), 256, 0, stream_of(s)>>>(
                        static_cast<const T*>(dy.raw()), s_offset,
                        static_cast<float*>(dpos.raw()), S, B, H));
  MCPP_LAUNCH_CHECK();
}

}  // namespace mcpp::ops::cuda
