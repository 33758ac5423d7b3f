// Writing torch.save files (the reverse of torch_zip.h / torch_pickle.h), for Megatron-LM's
// legacy checkpoints (megatron_export.h).
//
// A Py value is what the file's pickle holds: None, bool, int, float, str, tuple, list, dict,
// collections.OrderedDict, argparse.Namespace, a torch global (torch.bfloat16) and tensors.
// save_torch_file writes what torch.save(obj, path) writes with its zip serialization:
//   <archive>/data.pkl      the pickle (protocol 2); a tensor is
//                           torch._utils._rebuild_tensor_v2(<persistent id ('storage',
//                           torch.<Dtype>Storage, key, 'cpu', numel)>, 0, size, stride,
//                           False, OrderedDict())
//   <archive>/data/<key>    each tensor's storage, little-endian, contiguous
//   <archive>/byteorder     "little"
//   <archive>/version       "3"
// every record stored (uncompressed) with its data aligned to 64 bytes (a padding extra
// field, as PyTorch's writer adds), CRC-32 checked, and ZIP64 records where a size or offset
// passes 4 GiB. The storages are streamed to disk one at a time (the bf16 / f16 conversion
// happens per chunk), so a file may be far larger than the memory it takes to write it.
// The file appears atomically: path.tmp-<pid>, fsync, rename, fsync of the directory.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace mcpp::checkpoint::megatron {

struct Py {
  enum class Kind {
    None,
    Bool,
    Int,
    Float,
    Str,
    Tuple,
    List,
    Dict,
    OrderedDict,
    Namespace,
    Global,
    Tensor
  };
  Kind kind = Kind::None;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                           // Str; Global: "torch.bfloat16"
  std::vector<Py> items;                   // Tuple, List
  std::vector<std::pair<Py, Py>> entries;  // Dict, OrderedDict, Namespace (str keys)
  Tensor tensor;  // Tensor: contiguous CPU data (F32, F64, I64 or U8) with the stored shape
  DType dtype = DType::F32;  // Tensor: as stored (F32, BF16, F16 from F32; I64; U8)

  static Py none() { return Py{}; }
  static Py boolean(bool v);
  static Py integer(int64_t v);
  static Py real(double v);
  static Py str(std::string v);
  static Py global(std::string module_dot_name);
  static Py tuple(std::vector<Py> v);
  static Py list(std::vector<Py> v);
  static Py dict();
  static Py ordered_dict();
  static Py namespace_();
  // t is kept by reference (Tensor copies share storage) until the file is written.
  static Py tensor_of(Tensor t, DType stored);
  // A Dict / OrderedDict / Namespace: appends key -> v (keys keep their insertion order).
  Py& set(const std::string& key, Py v);
  Py& set(int64_t key, Py v);
};

// The torch dtype global of a stored dtype: "torch.bfloat16" for BF16 etc.
std::string torch_dtype_global(DType t);

// The pickle of `root` (protocol 2); `tensors` receives the tensors in storage-key order
// (key = index). Exposed for tests.
std::string pickle_py(const Py& root, std::vector<const Py*>& tensors);

// torch.save(root, path). archive: the record prefix ("model_optim_rng" for
// model_optim_rng.pt, as torch names it from the file). force_zip64: ZIP64 records on every
// entry (tests; large files get them where needed).
void save_torch_file(const std::string& path, const Py& root, bool force_zip64 = false);

}  // namespace mcpp::checkpoint::megatron
