#include "ops/nvtx.h"

#ifdef MCPP_HAVE_CUDA
#include "ops/cuda/device.h"
#endif

namespace mcpp::ops {

#ifdef MCPP_HAVE_CUDA
void nvtx_range_push(const std::string& name) { cuda::nvtx_push(name); }
void nvtx_range_pop() { cuda::nvtx_pop(); }
#else
void nvtx_range_push(const std::string&) {}
void nvtx_range_pop() {}
#endif

}  // namespace mcpp::ops
