// MCPP_DISPATCH(name, args...): forward an op to the backend of the stream `s` in scope
// (ops::cuda::name on a CUDA stream, inside a profiler scope; ops::cpu::name otherwise; in a
// build without CUDA a CUDA stream is an error naming the op). MCPP_DISPATCH_SHAPED also
// puts `shaped`'s shape in the profiler's name (GEMMs by weight shape). For the .cpp files
// that forward ops: dispatch.cpp (the catalogue) and the ops declared outside it.
#pragma once
#include "base/error.h"

#ifdef MCPP_HAVE_CUDA
#include "ops/cuda/device.h"

#define MCPP_DISPATCH(name, ...)                                     \
  do {                                                               \
    if (s.device == Device::CUDA) {                                  \
      cuda::OpScope scope_(#name, s);                                \
      return cuda::name(__VA_ARGS__);                                \
    }                                                                \
    return cpu::name(__VA_ARGS__);                                   \
  } while (0)
#define MCPP_DISPATCH_SHAPED(name, shaped, ...)                      \
  do {                                                               \
    if (s.device == Device::CUDA) {                                  \
      cuda::OpScope scope_(#name, s, &(shaped));                     \
      return cuda::name(__VA_ARGS__);                                \
    }                                                                \
    return cpu::name(__VA_ARGS__);                                   \
  } while (0)
#else
#define MCPP_DISPATCH(name, ...)                                                      \
  do {                                                                                \
    MCPP_CHECK_HINT(s.device == Device::CPU, "rebuild with nvcc present to get CUDA", \
                    #name " called on a CUDA stream in a build without CUDA");        \
    return cpu::name(__VA_ARGS__);                                                    \
  } while (0)
#define MCPP_DISPATCH_SHAPED(name, shaped, ...) MCPP_DISPATCH(name, __VA_ARGS__)
#endif
