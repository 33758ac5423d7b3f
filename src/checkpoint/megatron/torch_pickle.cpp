#include "checkpoint/megatron/torch_pickle.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <map>
#include <set>
#include <unordered_map>

#include "base/error.h"

namespace mcpp::checkpoint::megatron {

using K = Value::Kind;

Value::~Value() {
  std::vector<ValuePtr> work;
  auto take = [&](Value& v) {
    for (auto& c : v.items) work.push_back(std::move(c));
    for (auto& [a, b] : v.entries) work.push_back(std::move(a)), work.push_back(std::move(b));
    if (v.state) work.push_back(std::move(v.state));
    if (v.storage) work.push_back(std::move(v.storage));
    v.items.clear(), v.entries.clear();
  };
  take(*this);
  while (!work.empty()) {
    ValuePtr v = std::move(work.back());
    work.pop_back();
    if (v && v.use_count() == 1) take(*v);  // v's children leave before v dies: no recursion
  }
}

const Value* Value::get(const std::string& key) const {
  for (const auto& [k, v] : entries)
    if (k && k->kind == K::Str && k->s == key) return v.get();
  return nullptr;
}

std::string Value::describe() const {
  switch (kind) {
    case K::None: return "None";
    case K::Bool: return "bool";
    case K::Int: return "int";
    case K::Float: return "float";
    case K::Str: return "str";
    case K::Bytes: return "bytes";
    case K::List: return "list";
    case K::Tuple: return "tuple";
    case K::Dict: return "dict";
    case K::Set: return "set";
    case K::Global: return "global " + s;
    case K::Object: return s;
    case K::Storage: return "storage";
    case K::Tensor: return "tensor";
  }
  return "?";
}

namespace {

struct StorageClass {
  DType dtype;
  int64_t size;
  bool supported;
};
const std::map<std::string, StorageClass>& storage_classes() {
  static const std::map<std::string, StorageClass> m = {
      {"torch.FloatStorage", {DType::F32, 4, true}},
      {"torch.DoubleStorage", {DType::F64, 8, true}},
      {"torch.HalfStorage", {DType::F16, 2, true}},
      {"torch.BFloat16Storage", {DType::BF16, 2, true}},
      {"torch.LongStorage", {DType::I64, 8, true}},
      {"torch.IntStorage", {DType::I32, 4, true}},
      {"torch.ByteStorage", {DType::U8, 1, true}},
      {"torch.BoolStorage", {DType::U8, 1, true}},
      {"torch.storage.UntypedStorage", {DType::U8, 1, true}},
      {"torch.CharStorage", {DType::U8, 1, false}},
      {"torch.ShortStorage", {DType::U16, 2, false}},
      {"torch.ComplexFloatStorage", {DType::F64, 8, false}},
      {"torch.ComplexDoubleStorage", {DType::F64, 16, false}},
  };
  return m;
}

const std::map<std::string, DType>& dtype_globals() {
  static const std::map<std::string, DType> m = {
      {"torch.float32", DType::F32}, {"torch.float", DType::F32},     {"torch.float64", DType::F64},
      {"torch.double", DType::F64},  {"torch.bfloat16", DType::BF16}, {"torch.float16", DType::F16},
      {"torch.half", DType::F16},    {"torch.int64", DType::I64},     {"torch.long", DType::I64},
      {"torch.int32", DType::I32},   {"torch.int", DType::I32},       {"torch.uint8", DType::U8},
      {"torch.bool", DType::U8}};
  return m;
}

// Globals that are only ever values (never called here).
const std::set<std::string>& value_globals() {
  static const std::set<std::string> s = {
      "torch.Tensor", "torch.nn.parameter.Parameter", "torch.strided", "torch.sparse_coo",
      "torch.contiguous_format", "torch.preserve_format", "torch.channels_last",
      "torch.int8", "torch.int16", "torch.float8_e4m3fn", "torch.float8_e5m2"};
  return s;
}

// Classes that become inert Object records: constructed by no code, BUILD state stored.
bool inert_class(const std::string& n) {
  static const std::set<std::string> s = {
      "argparse.Namespace",
      "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct",
      "numpy.ndarray", "numpy.dtype", "numpy.core.multiarray.scalar",
      "numpy._core.multiarray.scalar", "_io.BytesIO", "torch.serialization._get_layout",
      "torch.distributed.checkpoint.metadata.Metadata",
      "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
      "torch.distributed.checkpoint.metadata.TensorProperties",
      "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
      "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
      "torch.distributed.checkpoint.metadata.MetadataIndex",
      "torch.distributed.checkpoint.metadata.StorageMeta",
      "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
      "torch.distributed.checkpoint.filesystem._StorageInfo",
      "torch.distributed.checkpoint.planner.WriteItemType",
      // StorageMeta.checkpoint_id: the folder the checkpoint was written to
      "pathlib.PosixPath", "pathlib.PurePosixPath", "pathlib._local.PosixPath",
      "pathlib._local.PurePosixPath"};
  // Megatron's args hold its enums (e.g. AttnBackend): recorded, never imported.
  return s.count(n) || n.rfind("megatron.core.", 0) == 0 || n.rfind("megatron.training.", 0) == 0;
}

const std::set<std::string>& callable_globals() {
  static const std::set<std::string> s = {
      "collections.OrderedDict", "builtins.set", "builtins.frozenset", "builtins.slice",
      "builtins.bytearray", "__builtin__.set", "__builtin__.frozenset", "__builtin__.slice",
      "__builtin__.bytearray", "_codecs.encode", "torch.Size", "torch.device",
      "torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v2",
      "torch._utils._rebuild_parameter", "torch._tensor._rebuild_from_type_v2"};
  return s;
}

ValuePtr mk(K k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  return v;
}

class Unpickler {
 public:
  Unpickler(std::span<const uint8_t> d, const std::string& what) : d_(d), what_(what) {}

  ValuePtr run() {
    for (;;) {
      op_at_ = pos_;
      const uint8_t op = u8();
      switch (op) {
        case 0x80: u8(); break;                           // PROTO
        case 0x95: le(8); break;                          // FRAME (length only)
        case '.': {                                       // STOP
          MCPP_CHECK_HINT(stack_.size() == 1 && marks_.empty(), kHint,
                          "{}: pickle ends with {} values on the stack (expected 1)", what_,
                          stack_.size());
          return stack_.back();
        }
        case '(': marks_.push_back(stack_.size()); break;  // MARK
        case '0': pop(); break;                            // POP
        case '1': pop_mark(); break;                       // POP_MARK
        case '2': push(top()); break;                      // DUP
        case 'N': push(mk(K::None)); break;
        case 0x88: case 0x89: { auto v = mk(K::Bool); v->b = op == 0x88; push(v); break; }
        case 'J': push_int(int64_t(int32_t(uint32_t(le(4))))); break;
        case 'K': push_int(int64_t(le(1))); break;
        case 'M': push_int(int64_t(le(2))); break;
        case 0x8a: push_long(bytes(le(1))); break;         // LONG1
        case 0x8b: push_long(bytes(le(4))); break;         // LONG4
        case 'I': case 'L': text_int(line()); break;       // INT / LONG (protocol 0)
        case 'F': {
          const std::string t = line();
          char* end = nullptr;
          auto v = mk(K::Float);
          v->f = std::strtod(t.c_str(), &end);
          if (end == t.c_str()) bad("FLOAT '" + t + "' is not a number");
          push(v);
          break;
        }
        case 'G': {                                        // BINFLOAT: big-endian double
          uint64_t u = 0;
          for (auto c : bytes(8)) u = (u << 8) | c;
          auto v = mk(K::Float);
          std::memcpy(&v->f, &u, 8);
          push(v);
          break;
        }
        case 'X': push_str(K::Str, bytes(le(4))); break;   // BINUNICODE
        case 0x8c: push_str(K::Str, bytes(le(1))); break;  // SHORT_BINUNICODE
        case 0x8d: push_str(K::Str, bytes(le(8))); break;  // BINUNICODE8
        case 'V': { auto t = line(); push_str(K::Str, {(const uint8_t*)t.data(), t.size()}); break; }
        case 'T': push_str(K::Str, bytes(le(4))); break;   // BINSTRING (Python 2 str)
        case 'U': push_str(K::Str, bytes(le(1))); break;   // SHORT_BINSTRING
        case 'S': {                                        // STRING: a quoted repr
          std::string t = line();
          if (t.size() < 2 || (t[0] != '\'' && t[0] != '"') || t.back() != t[0])
            bad("STRING is not quoted");
          t = t.substr(1, t.size() - 2);
          push_str(K::Str, {(const uint8_t*)t.data(), t.size()});
          break;
        }
        case 'B': push_str(K::Bytes, bytes(le(4))); break;     // BINBYTES
        case 'C': push_str(K::Bytes, bytes(le(1))); break;     // SHORT_BINBYTES
        case 0x8e: push_str(K::Bytes, bytes(le(8))); break;    // BINBYTES8
        case 0x96: push_str(K::Bytes, bytes(le(8))); break;    // BYTEARRAY8
        case ']': push(mk(K::List)); break;
        case ')': push(mk(K::Tuple)); break;
        case '}': push(mk(K::Dict)); break;
        case 0x8f: push(mk(K::Set)); break;                    // EMPTY_SET
        case 'l': case 't': case 0x91: {                       // LIST, TUPLE, FROZENSET
          auto v = mk(op == 'l' ? K::List : op == 't' ? K::Tuple : K::Set);
          v->items = pop_mark();
          push(v);
          break;
        }
        case 0x85: case 0x86: case 0x87: {                     // TUPLE1..3
          const size_t n = size_t(op - 0x84);
          auto v = mk(K::Tuple);
          v->items.resize(n);
          for (size_t k = n; k-- > 0;) v->items[k] = pop();
          push(v);
          break;
        }
        case 'd': { auto v = mk(K::Dict); pairs_into(*v, pop_mark()); push(v); break; }
        case 'a': { auto x = pop(); expect(top(), K::List, "APPEND")->items.push_back(x); break; }
        case 'e': {                                            // APPENDS
          auto xs = pop_mark();
          auto& l = expect(top(), K::List, "APPENDS")->items;
          l.insert(l.end(), xs.begin(), xs.end());
          break;
        }
        case 0x90: {                                           // ADDITEMS
          auto xs = pop_mark();
          auto& l = expect(top(), K::Set, "ADDITEMS")->items;
          l.insert(l.end(), xs.begin(), xs.end());
          break;
        }
        case 's': {                                            // SETITEM
          auto v = pop(), k = pop();
          expect(top(), K::Dict, "SETITEM")->entries.emplace_back(k, v);
          break;
        }
        case 'u': { auto xs = pop_mark(); pairs_into(*expect(top(), K::Dict, "SETITEMS"), xs); break; }
        case 'c': {                                            // GLOBAL "module\nname\n"
          std::string m = line();
          std::string n = line();
          push(global(m + "." + n));
          break;
        }
        case 0x93: {                                           // STACK_GLOBAL
          auto n = pop(), m = pop();
          if (!m->is(K::Str) || !n->is(K::Str)) bad("STACK_GLOBAL needs two strings");
          push(global(m->s + "." + n->s));
          break;
        }
        case 'R': { auto args = pop(); auto f = pop(); push(call(f, args)); break; }  // REDUCE
        case 0x81: { auto args = pop(); auto f = pop(); push(call(f, args)); break; } // NEWOBJ
        case 0x92: {                                           // NEWOBJ_EX
          auto kw = pop(), args = pop(), f = pop();
          if (!kw->is(K::Dict) || !kw->entries.empty()) bad("NEWOBJ_EX with keyword arguments");
          push(call(f, args));
          break;
        }
        case 'b': { auto st = pop(); build(top(), st); break; }  // BUILD
        case 'Q': push(persistent(pop())); break;              // BINPERSID
        case 'p': memo_[std::stoull("0" + line())] = top(); break;  // PUT (digits checked below)
        case 'q': memo_[le(1)] = top(); break;
        case 'r': memo_[le(4)] = top(); break;
        case 0x94: memo_[memo_.size()] = top(); break;         // MEMOIZE
        case 'g': push(memo(std::stoull("0" + line()))); break;
        case 'h': push(memo(le(1))); break;
        case 'j': push(memo(le(4))); break;
        case 'i': bad("opcode INST (instantiate a class by name) is not allowed");
        case 'o': bad("opcode OBJ (instantiate a class from the stack) is not allowed");
        case 'P': bad("opcode PERSID (text persistent id) is not allowed");
        case 0x82: case 0x83: case 0x84: bad("opcode EXT (copyreg extension registry) is not allowed");
        case 0x97: case 0x98: bad("out-of-band buffers (NEXT_BUFFER) are not allowed");
        default: bad(fmt::format("unknown pickle opcode 0x{:02x}", op));
      }
    }
  }

 private:
  static constexpr const char* kHint =
      "the file is truncated or corrupt, or not a PyTorch/Megatron-LM checkpoint file";
  std::span<const uint8_t> d_;
  const std::string& what_;
  size_t pos_ = 0, op_at_ = 0;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, ValuePtr> memo_;

  [[noreturn]] void bad(const std::string& msg) const {
    MCPP_FAIL("{}: pickle byte {}: {}", what_, op_at_, msg);
  }
  std::span<const uint8_t> bytes(uint64_t n) {
    if (n > d_.size() - pos_) {
      MCPP_CHECK_HINT(false, kHint, "{}: pickle byte {}: wants {} bytes, {} are left (truncated)",
                      what_, op_at_, n, d_.size() - pos_);
    }
    auto s = d_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  uint8_t u8() { return bytes(1)[0]; }
  uint64_t le(int n) {
    uint64_t v = 0;
    auto b = bytes(uint64_t(n));
    for (int k = n - 1; k >= 0; --k) v = (v << 8) | b[size_t(k)];
    return v;
  }
  std::string line() {
    const size_t start = pos_;
    while (pos_ < d_.size() && d_[pos_] != '\n') ++pos_;
    MCPP_CHECK_HINT(pos_ < d_.size(), kHint, "{}: pickle byte {}: unterminated text argument",
                    what_, op_at_);
    std::string s(reinterpret_cast<const char*>(d_.data() + start), pos_ - start);
    ++pos_;
    if (!s.empty() && s.back() == '\r') s.pop_back();
    return s;
  }
  void push(ValuePtr v) { stack_.push_back(std::move(v)); }
  ValuePtr pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back()))
      bad("stack underflow");
    auto v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  const ValuePtr& top() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back()))
      bad("stack underflow");
    return stack_.back();
  }
  std::vector<ValuePtr> pop_mark() {
    if (marks_.empty()) bad("no MARK on the stack");
    std::vector<ValuePtr> xs(std::make_move_iterator(stack_.begin() + long(marks_.back())),
                             std::make_move_iterator(stack_.end()));
    stack_.resize(marks_.back());
    marks_.pop_back();
    return xs;
  }
  const ValuePtr& expect(const ValuePtr& v, K k, const char* op) {
    if (!v->is(k)) bad(fmt::format("{} on a {}", op, v->describe()));
    return v;
  }
  void pairs_into(Value& d, const std::vector<ValuePtr>& xs) {
    if (xs.size() % 2) bad("odd number of items for a dict");
    for (size_t k = 0; k < xs.size(); k += 2) d.entries.emplace_back(xs[k], xs[k + 1]);
  }
  ValuePtr memo(uint64_t k) {
    auto it = memo_.find(k);
    if (it == memo_.end()) bad(fmt::format("memo entry {} was never stored", k));
    return it->second;
  }
  void push_int(int64_t x) {
    auto v = mk(K::Int);
    v->i = x;
    push(v);
  }
  void push_long(std::span<const uint8_t> b) {  // two's complement little-endian
    if (b.size() > 8) bad(fmt::format("integer of {} bytes is too large", b.size()));
    uint64_t u = 0;
    for (size_t k = b.size(); k-- > 0;) u = (u << 8) | b[k];
    if (!b.empty() && b.size() < 8 && (b.back() & 0x80)) u |= ~uint64_t(0) << (8 * b.size());
    push_int(int64_t(u));
  }
  void text_int(const std::string& t) {
    if (t == "01" || t == "00") {  // protocol 0's True / False
      auto v = mk(K::Bool);
      v->b = t == "01";
      push(v);
      return;
    }
    std::string s = t;
    if (!s.empty() && s.back() == 'L') s.pop_back();
    try {
      size_t n = 0;
      int64_t x = std::stoll(s, &n);
      if (n != s.size()) throw std::invalid_argument(s);
      push_int(x);
    } catch (const std::exception&) {
      bad("integer '" + t + "' is not a 64-bit integer");
    }
  }
  void push_str(K k, std::span<const uint8_t> b) {
    auto v = mk(k);
    v->s.assign(reinterpret_cast<const char*>(b.data()), b.size());
    push(v);
  }

  ValuePtr global(const std::string& name) {
    const bool ok = callable_globals().count(name) || value_globals().count(name) ||
                    dtype_globals().count(name) || storage_classes().count(name) ||
                    inert_class(name);
    MCPP_CHECK_HINT(ok,
                    "megatron.cpp reads checkpoints without running code; a state dict needs "
                    "only tensors, containers and the globals listed in docs/from-megatron.md. "
                    "Do not load this file with torch.load either unless you trust its source",
                    "{}: pickle byte {}: refusing global '{}' (not on the allow-list of a "
                    "checkpoint's state dict)",
                    what_, op_at_, name);
    auto v = mk(K::Global);
    v->s = name;
    return v;
  }

  static int64_t as_int(const Value& v) { return v.is(K::Bool) ? int64_t(v.b) : v.i; }
  bool ints(const Value& t) const {
    if (!t.is(K::Tuple) && !t.is(K::List)) return false;
    for (auto& x : t.items)
      if (!x->is(K::Int)) return false;
    return true;
  }

  ValuePtr call(const ValuePtr& f, const ValuePtr& args) {
    if (!f->is(K::Global))
      bad(fmt::format("REDUCE/NEWOBJ on a {}: only allow-listed globals are called",
                      f->describe()));
    if (!args->is(K::Tuple)) bad(fmt::format("arguments of {} are a {}", f->s, args->describe()));
    const std::string& n = f->s;
    auto& a = args->items;
    if (inert_class(n)) {
      auto o = mk(K::Object);
      o->s = n;
      o->items = a;
      return o;
    }
    if (!callable_globals().count(n)) bad(fmt::format("global '{}' is not callable here", n));
    if (n == "collections.OrderedDict") {
      auto d = mk(K::Dict);
      if (a.size() == 1 && (a[0]->is(K::List) || a[0]->is(K::Tuple)))
        for (auto& p : a[0]->items) {
          if (!p->is(K::Tuple) && !p->is(K::List)) bad("OrderedDict item is not a pair");
          if (p->items.size() != 2) bad("OrderedDict item is not a pair");
          d->entries.emplace_back(p->items[0], p->items[1]);
        }
      else if (!a.empty())
        bad("OrderedDict with unexpected arguments");
      return d;
    }
    if (n.ends_with(".set") || n.ends_with(".frozenset")) {
      auto s = mk(K::Set);
      if (a.size() == 1 && (a[0]->is(K::List) || a[0]->is(K::Tuple) || a[0]->is(K::Set)))
        s->items = a[0]->items;
      else if (!a.empty())
        bad(n + " with unexpected arguments");
      return s;
    }
    if (n.ends_with(".slice")) {
      auto t = mk(K::Tuple);
      t->items = a;
      return t;
    }
    if (n.ends_with(".bytearray") || n == "_codecs.encode") {
      auto b = mk(K::Bytes);
      if (a.empty()) return b;
      if (a[0]->is(K::Bytes) && a.size() == 1) {
        b->s = a[0]->s;
        return b;
      }
      // protocol 2 stores bytes as _codecs.encode(latin-1 text, 'latin1'): each code point < 256
      if (!a[0]->is(K::Str) || a.size() != 2 || !a[1]->is(K::Str) ||
          (a[1]->s != "latin1" && a[1]->s != "latin-1"))
        bad(n + " with arguments other than (text, 'latin1')");
      const std::string& u = a[0]->s;
      for (size_t k = 0; k < u.size(); ++k) {
        const uint8_t c = uint8_t(u[k]);
        if (c < 0x80) {
          b->s.push_back(char(c));
        } else if ((c & 0xE0) == 0xC0 && k + 1 < u.size() && c <= 0xC3) {
          b->s.push_back(char(((c & 0x1F) << 6) | (uint8_t(u[k + 1]) & 0x3F)));
          ++k;
        } else {
          bad("_codecs.encode text has a character beyond latin-1");
        }
      }
      return b;
    }
    if (n == "torch.Size") {
      if (a.size() != 1 || !ints(*a[0])) bad("torch.Size of something other than integers");
      auto t = mk(K::Tuple);
      t->items = a[0]->items;
      return t;
    }
    if (n == "torch.device") {
      if (a.empty() || !a[0]->is(K::Str)) bad("torch.device without a name");
      auto s = mk(K::Str);
      s->s = a[0]->s + (a.size() > 1 && a[1]->is(K::Int) ? ":" + std::to_string(a[1]->i) : "");
      return s;
    }
    if (n == "torch._utils._rebuild_parameter") {
      if (a.empty() || !a[0]->is(K::Tensor)) bad("_rebuild_parameter of no tensor");
      return a[0];
    }
    if (n == "torch._tensor._rebuild_from_type_v2") {
      if (a.size() < 3 || !a[2]->is(K::Tuple)) bad("_rebuild_from_type_v2 with bad arguments");
      return call(a[0], a[2]);
    }
    // torch._utils._rebuild_tensor(_v2)(storage, storage_offset, size, stride, ...)
    if (a.size() < 4 || !a[0]->is(K::Storage) || !a[1]->is(K::Int) || !ints(*a[2]) ||
        !ints(*a[3]) || a[2]->items.size() != a[3]->items.size())
      bad(n + " with arguments other than (storage, offset, size, stride)");
    auto t = mk(K::Tensor);
    t->storage = a[0];
    t->dtype = a[0]->dtype;
    t->storage_offset = a[1]->i;
    for (auto& x : a[2]->items) t->shape.push_back(x->i);
    for (auto& x : a[3]->items) t->stride.push_back(x->i);
    return t;
  }

  void build(const ValuePtr& obj, const ValuePtr& st) {
    if (obj->is(K::Dict) || obj->is(K::Tensor)) return;  // OrderedDict._metadata, tensor hooks
    if (!obj->is(K::Object)) bad(fmt::format("BUILD on a {}", obj->describe()));
    // A dataclass with __slots__ gives (dict or None, slot dict); merge both.
    if (st->is(K::Tuple) && st->items.size() == 2 && st->items[1]->is(K::Dict) &&
        (st->items[0]->is(K::None) || st->items[0]->is(K::Dict))) {
      for (int k = 0; k < 2; ++k)
        for (auto& e : st->items[size_t(k)]->entries) obj->entries.push_back(e);
      return;
    }
    if (st->is(K::Dict))
      obj->entries.insert(obj->entries.end(), st->entries.begin(), st->entries.end());
    else
      obj->state = st;
  }

  ValuePtr persistent(const ValuePtr& pid) {
    // ('storage', storage class, key, location, numel): torch.save's storage reference
    if (!pid->is(K::Tuple) || pid->items.size() != 5 || !pid->items[0]->is(K::Str) ||
        pid->items[0]->s != "storage" || !pid->items[1]->is(K::Global) ||
        !pid->items[2]->is(K::Str) || !pid->items[4]->is(K::Int))
      bad("persistent id is not ('storage', class, key, location, numel)");
    auto it = storage_classes().find(pid->items[1]->s);
    if (it == storage_classes().end())
      bad(fmt::format("persistent id names '{}', not a storage class", pid->items[1]->s));
    auto s = mk(K::Storage);
    s->s = pid->items[2]->s;
    s->cls = it->first;
    s->dtype = it->second.dtype;
    s->numel = pid->items[4]->i;
    if (s->numel < 0) bad("storage with a negative size");
    return s;
  }
};

}  // namespace

ValuePtr unpickle(std::span<const uint8_t> data, const std::string& what) {
  try {
    return Unpickler(data, what).run();
  } catch (const std::invalid_argument&) {  // stoull of a PUT/GET text argument
    MCPP_FAIL("{}: a text memo index is not a number (corrupt pickle)", what);
  } catch (const std::out_of_range&) {
    MCPP_FAIL("{}: a text memo index is out of range (corrupt pickle)", what);
  }
}

bool storage_class(const std::string& cls, DType& dtype, int64_t& elem_size) {
  auto it = storage_classes().find(cls);
  if (it == storage_classes().end()) return false;
  dtype = it->second.dtype, elem_size = it->second.size;
  return it->second.supported;
}

bool torch_dtype_from_global(const std::string& name, DType& out) {
  auto it = dtype_globals().find(name);
  if (it == dtype_globals().end()) return false;
  out = it->second;
  return true;
}

}  // namespace mcpp::checkpoint::megatron
