// The 16-byte vector paths of the memory-bound CUDA ops (activations, dropout, RoPE,
// elementwise) and their scalar fallbacks, each against the CPU op, and against each
// other bit for bit: the vector kernels only change how memory is accessed, so the same
// data through either path must give the same bits. A tensor is steered onto the scalar
// path by starting it one element past an aligned address (misaligned()), or by a shape
// whose rows are not whole 16-byte packs.
#include <cmath>
#include <cstring>
#include <vector>

#include "gpu_test_util.h"

namespace mcpp::test {
namespace vector_paths_gpu_test {

class GpuVec : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { MCPP_REQUIRE_GPU(); }
  DType dt() const { return GetParam(); }
};

std::string dtype_param_name(const ::testing::TestParamInfo<DType>& i) {
  return std::string(dtype_name(i.param));
}

// A GPU tensor of `shape` whose data starts one element past the allocator's 256-byte
// alignment: no vector path takes it.
Tensor misaligned(const Shape& shape, DType dt) {
  int64_t n = shape_numel(shape);
  return Tensor::empty({n + 1}, dt, Device::CUDA).narrow(1, n).view(shape);
}
// The CPU tensor c on the GPU in dtype dt, aligned or not.
Tensor upload(const Tensor& c, DType dt, bool aligned) {
  Tensor g = aligned ? Tensor::empty(c.shape(), dt, Device::CUDA) : misaligned(c.shape(), dt);
  gpu::copy(c, g, GS());
  return g;
}
// A GPU tensor poisoned with NaN, aligned or not.
Tensor nans(const Shape& shape, DType dt, bool aligned) {
  Tensor g = aligned ? Tensor::empty(shape, dt, Device::CUDA) : misaligned(shape, dt);
  gpu::fill(g, std::nan(""), GS());
  return g;
}

bool is_aligned(const Tensor& t) { return (reinterpret_cast<uintptr_t>(t.raw()) & 15) == 0; }

// Two GPU tensors hold the same values bit for bit (compared as f32 images: exact for
// bf16/f16, and NaN-free data is assumed).
#define EXPECT_SAME_BITS(g1, g2)                                         \
  do {                                                                   \
    Tensor a_ = ::mcpp::test::to_cpu(g1), b_ = ::mcpp::test::to_cpu(g2); \
    ASSERT_EQ(a_.numel(), b_.numel());                                   \
    EXPECT_EQ(std::memcmp(a_.raw(), b_.raw(), a_.nbytes()), 0)           \
        << #g1 << " and " << #g2 << " differ in bits";                   \
  } while (0)

TEST(GpuVecHelpers, MisalignedIsMisaligned) {
  MCPP_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    EXPECT_FALSE(is_aligned(misaligned({4, 64}, dt)));
    EXPECT_TRUE(is_aligned(Tensor::empty({4, 64}, dt, Device::CUDA)));
  }
}

// ---- GELU ------------------------------------------------------------------------------

TEST_P(GpuVec, GeluVectorTailAndScalar) {
  // 64 x 520: whole packs; 37 x 129: packs and a tail; each also misaligned (scalar).
  for (Shape sh : {Shape{64, 520}, Shape{37, 129}}) {
    Tensor x = rand_in(sh, 200, dt(), -4.f, 4.f), dy = rand_in(sh, 201, dt());
    Tensor y = Tensor::empty(sh, DType::F32), dx = Tensor::empty(sh, DType::F32);
    cpu::gelu_forward(x, y, CS());
    cpu::gelu_backward(dy, x, dx, CS());
    Tensor gy[2], gdx[2];
    for (int al = 0; al < 2; ++al) {
      Tensor gx = upload(x, dt(), al), gdy = upload(dy, dt(), al);
      gy[al] = nans(sh, dt(), al), gdx[al] = nans(sh, dt(), al);
      gpu::gelu_forward(gx, gy[al], GS());
      gpu::gelu_backward(gdy, gx, gdx[al], GS());
      EXPECT_CLOSE(gy[al], y, dt()) << "aligned=" << al << " " << shape_str(sh);
      EXPECT_CLOSE(gdx[al], dx, dt()) << "aligned=" << al << " " << shape_str(sh);
    }
    EXPECT_SAME_BITS(gy[0], gy[1]);
    EXPECT_SAME_BITS(gdx[0], gdx[1]);
  }
}

// ---- squared ReLU -----------------------------------------------------------------------

TEST_P(GpuVec, SquaredReluVectorTailScalarAndCpuBits) {
  // As GELU's shapes. relu(x)^2 and dy * 2 relu(x) are one f32 rounding each from inputs the
  // dtype holds exactly, so the GPU gives the CPU's f32 result rounded to the dtype, bit for
  // bit; x = 0 and negative zero included (gradient 0).
  for (Shape sh : {Shape{64, 520}, Shape{37, 129}}) {
    Tensor x = rand_in(sh, 205, dt(), -4.f, 4.f), dy = rand_in(sh, 206, dt());
    x.data<float>()[3] = 0.f, x.data<float>()[4] = -0.f;
    Tensor y = Tensor::empty(sh, DType::F32), dx = Tensor::empty(sh, DType::F32);
    cpu::squared_relu_forward(x, y, CS());
    cpu::squared_relu_backward(dy, x, dx, CS());
    const Tensor y_dt = rounded(y, dt()), dx_dt = rounded(dx, dt());
    Tensor gy[2], gdx[2];
    for (int al = 0; al < 2; ++al) {
      Tensor gx = upload(x, dt(), al), gdy = upload(dy, dt(), al);
      gy[al] = nans(sh, dt(), al), gdx[al] = nans(sh, dt(), al);
      gpu::squared_relu_forward(gx, gy[al], GS());
      gpu::squared_relu_backward(gdy, gx, gdx[al], GS());
      EXPECT_CLOSE(gy[al], y, dt()) << "aligned=" << al << " " << shape_str(sh);
      EXPECT_CLOSE(gdx[al], dx, dt()) << "aligned=" << al << " " << shape_str(sh);
      const Tensor hy = to_cpu(gy[al]), hdx = to_cpu(gdx[al]);
      EXPECT_EQ(std::memcmp(hy.raw(), y_dt.raw(), hy.nbytes()), 0) << "aligned=" << al;
      EXPECT_EQ(std::memcmp(hdx.raw(), dx_dt.raw(), hdx.nbytes()), 0) << "aligned=" << al;
    }
    EXPECT_SAME_BITS(gy[0], gy[1]);
    EXPECT_SAME_BITS(gdx[0], gdx[1]);
  }
}

// ---- SwiGLU ----------------------------------------------------------------------------

TEST_P(GpuVec, SwigluVectorAndScalar) {
  // F = 256: whole packs (vector path when aligned); F = 203: odd (scalar path always).
  const int64_t T = 33;
  for (int64_t F : {int64_t(256), int64_t(203)}) {
    Tensor x = rand_in({T, 2 * F}, 210, dt(), -4.f, 4.f), dy = rand_in({T, F}, 211, dt());
    Tensor y = Tensor::empty({T, F}, DType::F32), dx = Tensor::empty({T, 2 * F}, DType::F32);
    cpu::swiglu_forward(x, y, CS());
    cpu::swiglu_backward(dy, x, dx, CS());
    Tensor gy[2], gdx[2];
    for (int al = 0; al < 2; ++al) {
      Tensor gx = upload(x, dt(), al), gdy = upload(dy, dt(), al);
      gy[al] = nans({T, F}, dt(), al), gdx[al] = nans({T, 2 * F}, dt(), al);
      gpu::swiglu_forward(gx, gy[al], GS());
      gpu::swiglu_backward(gdy, gx, gdx[al], GS());
      EXPECT_CLOSE(gy[al], y, dt()) << "aligned=" << al << " F=" << F;
      EXPECT_CLOSE(gdx[al], dx, dt()) << "aligned=" << al << " F=" << F;
    }
    EXPECT_SAME_BITS(gy[0], gy[1]);
    EXPECT_SAME_BITS(gdx[0], gdx[1]);
  }
}

// The MLP backward's fused op against swiglu_forward + swiglu_backward, bit for bit, on
// every path: all aligned (vector kernels), all misaligned (scalar), y alone misaligned
// (the fused op scalar, the two ops vector), and F = 203 (scalar always).
TEST_P(GpuVec, SwigluBackwardRecomputeEqualsTheTwoOps) {
  const int64_t T = 33;
  for (int64_t F : {int64_t(256), int64_t(203)}) {
    Tensor x = rand_in({T, 2 * F}, 212, dt(), -4.f, 4.f), dy = rand_in({T, F}, 213, dt());
    for (int mode = 0; mode < 3; ++mode) {
      const bool al = mode != 1, y_al = mode == 0;
      Tensor gx = upload(x, dt(), al), gdy = upload(dy, dt(), al);
      Tensor y = nans({T, F}, dt(), al), dx = nans({T, 2 * F}, dt(), al);
      gpu::swiglu_forward(gx, y, GS());
      gpu::swiglu_backward(gdy, gx, dx, GS());
      Tensor y2 = nans({T, F}, dt(), y_al), dx2 = nans({T, 2 * F}, dt(), al);
      gpu::swiglu_backward_recompute(gdy, gx, dx2, y2, GS());
      SCOPED_TRACE("F=" + std::to_string(F) + " mode=" + std::to_string(mode));
      EXPECT_SAME_BITS(y, y2);
      EXPECT_SAME_BITS(dx, dx2);
    }
  }
}

// ---- RoPE ------------------------------------------------------------------------------

TEST_P(GpuVec, RopeVectorAndScalarInPlaceAndNot) {
  struct Case {
    int64_t HD, rot;
  };
  // (64, 64), (64, 32): packs for every dtype; (72, 72): half = 36, packs for f32 only;
  // (64, 20): half = 10, never packs.
  for (Case c : {Case{64, 64}, Case{64, 32}, Case{72, 72}, Case{64, 20}}) {
    ops::AttentionDims d;
    d.S = 37, d.B = 3, d.NH = 6, d.NG = 2, d.HD = c.HD;
    Tensor qkv = rand_in({d.S, d.B, d.qkv_width()}, 220, dt());
    Tensor out = Tensor::empty(qkv.shape(), DType::F32),
           din = Tensor::empty(qkv.shape(), DType::F32);
    cpu::rope_forward(qkv, d, c.rot, 10000.0, 500, out, CS());
    cpu::rope_backward(qkv, d, c.rot, 10000.0, 500, din, CS());
    Tensor fwd[2], bwd[2];
    for (int al = 0; al < 2; ++al) {
      // Forward out of place, backward in place (as the model calls it).
      fwd[al] = nans(qkv.shape(), dt(), al);
      gpu::rope_forward(upload(qkv, dt(), al), d, c.rot, 10000.0, 500, fwd[al], GS());
      bwd[al] = upload(qkv, dt(), al);
      gpu::rope_backward(bwd[al], d, c.rot, 10000.0, 500, bwd[al], GS());
      EXPECT_CLOSE(fwd[al], out, dt()) << "aligned=" << al << " HD=" << c.HD << " rot=" << c.rot;
      EXPECT_CLOSE(bwd[al], din, dt()) << "aligned=" << al << " HD=" << c.HD << " rot=" << c.rot;
    }
    EXPECT_SAME_BITS(fwd[0], fwd[1]);
    EXPECT_SAME_BITS(bwd[0], bwd[1]);
    // In place forward equals out of place.
    Tensor ip = upload(qkv, dt(), true);
    gpu::rope_forward(ip, d, c.rot, 10000.0, 500, ip, GS());
    EXPECT_SAME_BITS(ip, fwd[0]);
  }
}

// ---- dropout ---------------------------------------------------------------------------

// f32 on the vector path gives the CPU's bits exactly (same mask, same float math), whole
// and as a block of a global tensor, with and without residual; bf16/f16 give the scalar
// path's bits and the CPU's mask.
TEST_P(GpuVec, DropoutVectorSameMaskAsScalarAndCpu) {
  const int64_t d0 = 6, d1 = 4, d2 = 768;
  const ops::DropoutKey key{4321, 17};
  const auto g = ops::GlobalIndex3::whole(d0, d1, d2);
  const Shape sh{d0, d1, d2};
  Tensor x = rand_in(sh, 230, dt(), 0.5f, 1.5f);  // never zero: zero <=> dropped
  Tensor res = rand_in(sh, 231, dt());
  for (double p : {0.0, 0.1, 0.5, 0.9}) {
    SCOPED_TRACE("p=" + std::to_string(p));
    Tensor y = Tensor::empty(sh, DType::F32), yr = Tensor::empty(sh, DType::F32),
           dx = Tensor::empty(sh, DType::F32);
    cpu::dropout_add_forward(x, Tensor(), p, key, g, y, CS());
    cpu::dropout_add_forward(x, res, p, key, g, yr, CS());
    cpu::dropout_backward(x, p, key, g, dx, CS());
    Tensor gy[2], gyr[2], gdx[2];
    for (int al = 0; al < 2; ++al) {
      gy[al] = nans(sh, dt(), al);
      gpu::dropout_add_forward(upload(x, dt(), al), Tensor(), p, key, g, gy[al], GS());
      gyr[al] = upload(res, dt(), al);  // out aliases residual
      gpu::dropout_add_forward(upload(x, dt(), al), gyr[al], p, key, g, gyr[al], GS());
      gdx[al] = nans(sh, dt(), al);
      gpu::dropout_backward(upload(x, dt(), al), p, key, g, gdx[al], GS());
      EXPECT_CLOSE(gy[al], y, dt()) << "aligned=" << al;
      EXPECT_CLOSE(gyr[al], yr, dt()) << "aligned=" << al;
      EXPECT_CLOSE(gdx[al], dx, dt()) << "aligned=" << al;
      // The mask: zero exactly where the CPU dropped.
      Tensor cy = to_cpu(gy[al]);
      const float* a = static_cast<const float*>(cy.raw());
      const float* b = static_cast<const float*>(y.raw());
      for (int64_t i = 0; i < y.numel(); ++i)
        ASSERT_EQ(a[i] == 0.f, b[i] == 0.f) << "aligned=" << al << " element " << i;
      if (dt() == DType::F32) {  // the residual form is left to EXPECT_CLOSE: the host
                                 // compiler may fuse the CPU's x * scale + residual
        Tensor c1 = to_cpu(gy[al]), c3 = to_cpu(gdx[al]);
        EXPECT_EQ(std::memcmp(c1.raw(), y.raw(), y.nbytes()), 0) << "aligned=" << al;
        EXPECT_EQ(std::memcmp(c3.raw(), dx.raw(), dx.nbytes()), 0) << "aligned=" << al;
      }
    }
    EXPECT_SAME_BITS(gy[0], gy[1]);
    EXPECT_SAME_BITS(gyr[0], gyr[1]);
    EXPECT_SAME_BITS(gdx[0], gdx[1]);

    // Mixed dtypes: x in dt, residual and out f32 (CPU: f32 on the same values).
    Tensor resf = rand_f32(sh, 232);
    Tensor want = Tensor::empty(sh, DType::F32);
    cpu::dropout_add_forward(x, resf, p, key, g, want, CS());
    Tensor go[2];
    for (int al = 0; al < 2; ++al) {
      go[al] = upload(resf, DType::F32, al);
      gpu::dropout_add_forward(upload(x, dt(), al), go[al], p, key, g, go[al], GS());
      EXPECT_CLOSE(go[al], want, DType::F32) << "mixed, aligned=" << al;
    }
    EXPECT_SAME_BITS(go[0], go[1]);
  }
}

// Blocks of a global [6, 4, 768] tensor (as under SP/TP/DP): o2 = 96 keeps packs on Philox
// block boundaries (vector path), o2 = 98 does not (scalar path), o2 = 100 starts packs
// halfway into a block (f32's 4-element packs: the vector path on the second half of each
// block; bf16/f16: the scalar path); all draw the whole tensor's mask.
TEST_P(GpuVec, DropoutPartitionedBlocks) {
  const int64_t d0 = 6, d1 = 4, d2 = 768;
  const ops::DropoutKey key{99, 5};
  Tensor x = rand_in({d0, d1, d2}, 240, dt(), 0.5f, 1.5f);
  const double p = 0.3;
  Tensor y = Tensor::empty({d0, d1, d2}, DType::F32);
  cpu::dropout_add_forward(x, Tensor(), p, key, ops::GlobalIndex3::whole(d0, d1, d2), y, CS());
  for (int64_t o2 : {int64_t(96), int64_t(98), int64_t(100)}) {
    const int64_t b0 = 3, b1 = 2, w2 = 256;
    ops::GlobalIndex3 part{{2, 1, o2}, {d0, d1, d2}};
    Tensor xb = Tensor::empty({b0, b1, w2}, DType::F32);
    auto at = [&](int64_t i0, int64_t i1, int64_t i2) {
      return ((i0 + 2) * d1 + i1 + 1) * d2 + i2 + o2;
    };
    for (int64_t i0 = 0; i0 < b0; ++i0)
      for (int64_t i1 = 0; i1 < b1; ++i1)
        for (int64_t i2 = 0; i2 < w2; ++i2)
          static_cast<float*>(xb.raw())[(i0 * b1 + i1) * w2 + i2] =
              static_cast<const float*>(x.raw())[at(i0, i1, i2)];
    Tensor gyb = nans({b0, b1, w2}, dt(), true);
    gpu::dropout_add_forward(upload(xb, dt(), true), Tensor(), p, key, part, gyb, GS());
    Tensor gdb = nans({b0, b1, w2}, dt(), true);
    gpu::dropout_backward(upload(xb, dt(), true), p, key, part, gdb, GS());
    Tensor cyb = to_cpu(gyb), cdb = to_cpu(gdb);
    const float* ys = static_cast<const float*>(y.raw());
    for (int64_t i0 = 0; i0 < b0; ++i0)
      for (int64_t i1 = 0; i1 < b1; ++i1)
        for (int64_t i2 = 0; i2 < w2; ++i2) {
          int64_t l = (i0 * b1 + i1) * w2 + i2;
          float want = ys[at(i0, i1, i2)];
          // Kept values are x * 1/(1-p) rounded to dt; the CPU's is f32.
          float tolv = dt() == DType::F32 ? 0.f : 1e-2f * std::fabs(want);
          ASSERT_NEAR(static_cast<float*>(cyb.raw())[l], want, tolv) << "o2=" << o2 << " " << l;
          ASSERT_NEAR(static_cast<float*>(cdb.raw())[l], want, tolv) << "o2=" << o2 << " " << l;
          ASSERT_EQ(static_cast<float*>(cyb.raw())[l] == 0.f, want == 0.f) << "o2=" << o2;
        }
  }
}

// ---- elementwise -----------------------------------------------------------------------

TEST_P(GpuVec, CopyCastsVectorAndScalar) {
  // f32 -> dt and dt -> f32, n with a tail, aligned (vector) and misaligned (scalar); the
  // host's rounding is the reference.
  const int64_t n = 4099;
  Tensor x = rand_f32({n}, 250, -300.f, 300.f);
  Tensor xr = rounded(x, dt());
  Tensor down[2], up[2];
  for (int al = 0; al < 2; ++al) {
    Tensor gx = upload(x, DType::F32, al);
    down[al] = nans({n}, dt(), al);
    gpu::copy(gx, down[al], GS());  // f32 -> dt on the device
    up[al] = nans({n}, DType::F32, al);
    gpu::copy(down[al], up[al], GS());  // dt -> f32 on the device
    Tensor c = to_cpu(up[al]);
    EXPECT_EQ(std::memcmp(c.raw(), xr.raw(), xr.nbytes()), 0) << "aligned=" << al;
  }
  EXPECT_SAME_BITS(down[0], down[1]);
  if (dt() != DType::F32) {
    // dt -> the other 16-bit type, both paths alike.
    DType other = dt() == DType::BF16 ? DType::F16 : DType::BF16;
    Tensor o[2];
    for (int al = 0; al < 2; ++al) {
      Tensor src = upload(xr, dt(), al);
      o[al] = nans({n}, other, al);
      gpu::copy(src, o[al], GS());
    }
    EXPECT_SAME_BITS(o[0], o[1]);
  }
}

TEST_P(GpuVec, FillAxpyScaleAddVectorAndScalar) {
  const int64_t n = 1031;  // packs and a tail
  Tensor a = rand_in({n}, 260, dt()), b = rand_in({n}, 261, dt());
  Tensor yf = rand_f32({n}, 262);
  Tensor sum = Tensor::empty({n}, DType::F32);
  cpu::add(a, b, sum, CS());
  Tensor axpy_want = yf.clone();
  cpu::axpy(-0.75, a, axpy_want, CS());
  Tensor scale_want = a.clone();
  cpu::scale(scale_want, 1.25, CS());
  Tensor r_add[2], r_axpy[2], r_axpy_dt[2], r_scale[2];
  for (int al = 0; al < 2; ++al) {
    Tensor f = nans({n}, dt(), al);
    gpu::fill(f, -2.5, GS());
    Tensor cf = to_cpu(f);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(static_cast<float*>(cf.raw())[i], -2.5f) << i;

    Tensor ga = upload(a, dt(), al), gb = upload(b, dt(), al);
    r_add[al] = nans({n}, dt(), al);
    gpu::add(ga, gb, r_add[al], GS());
    EXPECT_CLOSE(r_add[al], sum, dt()) << "aligned=" << al;

    r_axpy[al] = upload(yf, DType::F32, al);  // dt x into an f32 accumulator
    gpu::axpy(-0.75, ga, r_axpy[al], GS());
    EXPECT_CLOSE(r_axpy[al], axpy_want, DType::F32) << "aligned=" << al;

    r_axpy_dt[al] = upload(b, dt(), al);  // same dtype
    gpu::axpy(0.5, ga, r_axpy_dt[al], GS());

    r_scale[al] = upload(a, dt(), al);
    gpu::scale(r_scale[al], 1.25, GS());
    EXPECT_CLOSE(r_scale[al], scale_want, dt()) << "aligned=" << al;
  }
  EXPECT_SAME_BITS(r_add[0], r_add[1]);
  EXPECT_SAME_BITS(r_axpy[0], r_axpy[1]);
  EXPECT_SAME_BITS(r_axpy_dt[0], r_axpy_dt[1]);
  EXPECT_SAME_BITS(r_scale[0], r_scale[1]);
}

// fill of the integer and f64 dtypes (whole words of repeated bits, then the tail).
TEST(GpuVecFill, IntegerAndF64) {
  MCPP_REQUIRE_GPU();
  const int64_t n = 77;
  for (DType dt : {DType::I32, DType::I64, DType::F64}) {
    for (bool al : {true, false}) {
      Tensor g = al ? Tensor::empty({n}, dt, Device::CUDA) : misaligned({n}, dt);
      gpu::fill(g, -7.0, GS());
      Tensor h = Tensor::empty({n}, dt);
      gpu::copy(g, h, GS());
      for (int64_t i = 0; i < n; ++i) {
        double v = dt == DType::I32   ? static_cast<int32_t*>(h.raw())[i]
                   : dt == DType::I64 ? double(static_cast<int64_t*>(h.raw())[i])
                                      : static_cast<double*>(h.raw())[i];
        ASSERT_EQ(v, -7.0) << dtype_name(dt) << " aligned=" << al << " " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuVec, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         dtype_param_name);

}  // namespace vector_paths_gpu_test
}  // namespace mcpp::test
