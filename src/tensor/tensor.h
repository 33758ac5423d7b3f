// Tensor = device, dtype, shape, storage, offset. Always contiguous (row-major);
// views are reshapes and slices of the outermost dimension, which is all that a
// sequence-first [S, B, H] model needs. Storage is shared between views.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "tensor/dtype.h"

namespace mcpp {

enum class Device : uint8_t { CPU, CUDA };

// An execution stream. CPU: synchronous, handle unused. CUDA: a cudaStream_t.
struct Stream {
  Device device = Device::CPU;
  void* handle = nullptr;
  static Stream& cpu();  // the process-wide CPU stream
};

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

struct Storage {
  void* ptr = nullptr;
  size_t bytes = 0;
  Device device = Device::CPU;
  std::function<void(void*)> release;
  ~Storage();
};

// Device allocators are pluggable so that the core library needs no CUDA.
struct DeviceAllocator {
  std::function<void*(size_t)> alloc;
  std::function<void(void*)> free;
};
void set_device_allocator(Device d, DeviceAllocator a);

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::CPU);
  // Wraps memory owned elsewhere (not freed by the tensor).
  static Tensor wrap(void* ptr, const Shape& shape, DType dtype, Device device = Device::CPU);
  template <typename T>
  static Tensor from(const std::vector<T>& v, const Shape& shape);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t size(int64_t d) const { return shape_.at(d < 0 ? d + dim() : d); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  int64_t offset() const { return offset_; }

  void* raw() const;
  template <typename T>
  T* data() const {
    MCPP_CHECK(dtype_of<T>() == dtype_, "tensor holds {}, accessed as {}", dtype_name(dtype_),
               dtype_name(dtype_of<T>()));
    return static_cast<T*>(raw());
  }

  Tensor view(const Shape& shape) const;               // same numel, -1 allowed once
  Tensor narrow(int64_t start, int64_t length) const;  // slice of dim 0
  Tensor flat() const { return view({numel()}); }
  Tensor clone() const;                                // CPU deep copy
  std::string str() const;                             // "f32[4, 8] cpu"

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  int64_t offset_ = 0;  // elements
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

// Element i (flat) of a CPU float tensor (f32, f64, bf16, f16) as a double, and its
// store with rounding to nearest even. For format conversion, not for hot loops.
double get_float(const Tensor& t, int64_t i);
void set_float(const Tensor& t, int64_t i, double v);

template <typename T>
Tensor Tensor::from(const std::vector<T>& v, const Shape& shape) {
  Tensor t = empty(shape, dtype_of<T>());
  MCPP_CHECK(int64_t(v.size()) == t.numel(), "Tensor::from: {} values for shape {}", v.size(),
             shape_str(shape));
  std::copy(v.begin(), v.end(), t.data<T>());
  return t;
}

}  // namespace mcpp
