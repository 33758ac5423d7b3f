// A restricted reader of Python pickles (protocols 0-5) and of torch.save files, that never
// executes code. Python's own unpickler calls whatever callable a pickle names (GLOBAL +
// REDUCE): a checkpoint from the internet can run `os.system`. This one builds plain values
// and knows a fixed allow-list of globals (what a PyTorch / Megatron-LM state dict and a
// torch.distributed.checkpoint .metadata file contain):
//   * collections.OrderedDict, builtins set / frozenset / slice / bytearray, _codecs.encode
//     (protocol 2's bytes), torch.Size, torch.device, torch dtypes: become plain values;
//   * torch._utils._rebuild_tensor(_v2) / _rebuild_parameter, torch._tensor.
//     _rebuild_from_type_v2, torch.*Storage / torch.storage.UntypedStorage (in persistent
//     ids): become tensor references into the zip's data/ entries;
//   * argparse.Namespace, numpy's array reconstruction (rng states), _io.BytesIO,
//     torch.distributed.checkpoint's metadata classes, torch.serialization._get_layout,
//     pathlib's POSIX paths (the checkpoint id), and
//     the enum classes of megatron.core / megatron.training: become inert Object records
//     (class name, constructor arguments, BUILD state) that nothing ever calls.
// Any other global, and the opcodes that name classes to instantiate without going through
// the allow-list (INST, OBJ, text PERSID, the copyreg extension codes, out-of-band buffers),
// is an mcpp::Error naming module.global (or the opcode), the file and the byte offset.
// Malformed input (truncation, stack underflow, bad memo index, wrong argument types) is an
// error naming the file and offset, never a crash; deep nesting is freed without recursion.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/megatron/torch_zip.h"
#include "tensor/tensor.h"

namespace mcpp::checkpoint::megatron {

struct Value;
using ValuePtr = std::shared_ptr<Value>;

struct Value {
  enum class Kind { None, Bool, Int, Float, Str, Bytes, List, Tuple, Dict, Set, Global, Object,
                    Storage, Tensor };
  Kind kind = Kind::None;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  // Str / Bytes: the text (UTF-8) or bytes; Global: "module.name"; Object: its class's
  // "module.name"; Storage: the zip entry key.
  std::string s;
  std::vector<ValuePtr> items;                          // List, Tuple, Set; Object: arguments
  std::vector<std::pair<ValuePtr, ValuePtr>> entries;   // Dict; Object: its BUILD state
  ValuePtr state;                                       // Object: a BUILD state that is no dict
  // Storage / Tensor
  DType dtype = DType::F32;
  int64_t numel = 0;                  // Storage: elements
  std::string cls;                    // Storage: its class ("torch.FloatStorage")
  ValuePtr storage;                   // Tensor: its Storage
  int64_t storage_offset = 0;         // Tensor
  std::vector<int64_t> shape, stride; // Tensor

  Value() = default;
  Value(const Value&) = delete;
  Value& operator=(const Value&) = delete;
  ~Value();  // iterative: a pickle nesting a million lists must not overflow the stack
  bool is(Kind k) const { return kind == k; }
  // A Dict's (or an Object's state's) value under a string key, or null.
  const Value* get(const std::string& key) const;
  // Human-readable kind, for messages ("dict", "tensor", "argparse.Namespace", ...).
  std::string describe() const;
};

// Unpickles `data`; `what` names it in errors. persistent ids (torch.save's storages) are
// ('storage', <storage class>, key, location, numel) tuples and become Storage values.
ValuePtr unpickle(std::span<const uint8_t> data, const std::string& what);

// A torch.save file (a zip; a whole file or a span inside one): its data.pkl unpickled, its
// storages read on demand.
class TorchFile {
 public:
  TorchFile(std::span<const uint8_t> bytes, std::string what);
  const ValuePtr& root() const { return root_; }
  // The tensor's elements as a contiguous CPU tensor of `out` (F32 or F64), converted from
  // its stored dtype (f32, f64, bf16, f16, and the integer types); bounds checked against the
  // storage entry. `name` names the tensor in errors.
  Tensor tensor(const Value& t, DType out, const std::string& name) const;
  const std::string& what() const { return zip_.what(); }

 private:
  ZipArchive zip_;
  std::string prefix_;  // "<archive>/"
  ValuePtr root_;
};

// Elements of a DType as torch stores them (bytes per element), for storage classes.
int64_t torch_dtype_size(DType t);
// A storage class ("torch.BFloat16Storage") -> its dtype and element size; false when the
// class is unknown or its elements are of a type megatron.cpp does not read.
bool storage_class(const std::string& cls, DType& dtype, int64_t& elem_size);
// "torch.float32" -> F32 etc.; false if the global names no supported dtype.
bool torch_dtype_from_global(const std::string& name, DType& out);
// Converts n elements of raw little-endian `src` (dtype `from`) into `dst` (F32 or F64).
void convert_elements(const uint8_t* src, DType from, int64_t n, Tensor& dst, int64_t dst_offset);

}  // namespace mcpp::checkpoint::megatron
