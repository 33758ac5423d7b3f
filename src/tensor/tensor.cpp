#include "tensor/tensor.h"

#include <cstdlib>
#include <cstring>
#include <fmt/ranges.h>

namespace mcpp {

Stream& Stream::cpu() {
  static Stream s;
  return s;
}

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Storage::~Storage() {
  if (release && ptr) release(ptr);
}

static DeviceAllocator g_device_alloc[2];

void set_device_allocator(Device d, DeviceAllocator a) { g_device_alloc[int(d)] = std::move(a); }

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    MCPP_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  Tensor t;
  t.shape_ = shape, t.dtype_ = dtype, t.device_ = device;
  auto st = std::make_shared<Storage>();
  st->bytes = std::max<size_t>(t.nbytes(), 1);
  st->device = device;
  if (device == Device::CPU) {
    // 64-byte alignment: full cache lines and aligned AVX-512 loads.
    size_t bytes = (st->bytes + 63) / 64 * 64;
    st->ptr = std::aligned_alloc(64, bytes);
    MCPP_CHECK_HINT(st->ptr, "reduce --micro-batch-size or the model size",
                    "out of host memory allocating {} bytes for {} {}", bytes, dtype_name(dtype),
                    shape_str(shape));
    st->release = [](void* p) { std::free(p); };
  } else {
    auto& a = g_device_alloc[int(device)];
    MCPP_CHECK_HINT(a.alloc, "build with CUDA (nvcc found at configure time) and run on a GPU",
                    "no allocator for device CUDA: this binary has no CUDA backend");
    st->ptr = a.alloc(st->bytes);
    st->release = a.free;
  }
  t.storage_ = std::move(st);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  MCPP_CHECK(device == Device::CPU, "Tensor::zeros on a device tensor: use ops::fill");
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}

Tensor Tensor::wrap(void* ptr, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape, t.dtype_ = dtype, t.device_ = device;
  t.storage_ = std::make_shared<Storage>();
  t.storage_->ptr = ptr;
  t.storage_->bytes = t.nbytes();
  t.storage_->device = device;
  return t;
}

void* Tensor::raw() const {
  MCPP_CHECK(storage_, "access to an undefined tensor");
  return static_cast<char*>(storage_->ptr) + offset_ * int64_t(dtype_size(dtype_));
}

Tensor Tensor::view(const Shape& shape) const {
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      MCPP_CHECK(infer < 0, "view: more than one -1 in {}", shape_str(shape));
      infer = int64_t(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) s[infer] = known ? numel() / known : 0;
  MCPP_CHECK(shape_numel(s) == numel(), "view: cannot view {} as {}", shape_str(shape_),
             shape_str(shape));
  Tensor t = *this;
  t.shape_ = s;
  return t;
}

Tensor Tensor::narrow(int64_t start, int64_t length) const {
  MCPP_CHECK(dim() >= 1 && start >= 0 && length >= 0 && start + length <= shape_[0],
             "narrow({}, {}) out of range for {}", start, length, shape_str(shape_));
  Tensor t = *this;
  t.shape_[0] = length;
  t.offset_ += start * (numel() / std::max<int64_t>(shape_[0], 1));
  return t;
}

Tensor Tensor::clone() const {
  MCPP_CHECK(device_ == Device::CPU, "Tensor::clone is CPU-only; use ops::copy on devices");
  Tensor t = empty(shape_, dtype_, device_);
  std::memcpy(t.raw(), raw(), nbytes());
  return t;
}

double get_float(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::F32: return t.data<float>()[i];
    case DType::F64: return t.data<double>()[i];
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(t.raw())[i]);
    case DType::F16: return f16_to_float(static_cast<const uint16_t*>(t.raw())[i]);
    default: MCPP_FAIL("tensor of dtype {} is not a float tensor", dtype_name(t.dtype()));
  }
}

void set_float(const Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::F32: t.data<float>()[i] = float(v); return;
    case DType::F64: t.data<double>()[i] = v; return;
    case DType::BF16: static_cast<uint16_t*>(t.raw())[i] = float_to_bf16(float(v)); return;
    case DType::F16: static_cast<uint16_t*>(t.raw())[i] = float_to_f16(float(v)); return;
    default: MCPP_FAIL("cannot store a float into a {} tensor", dtype_name(t.dtype()));
  }
}

std::string Tensor::str() const {
  return fmt::format("{}{} {}", dtype_name(dtype_), shape_str(shape_),
                     device_ == Device::CPU ? "cpu" : "cuda");
}

}  // namespace mcpp
