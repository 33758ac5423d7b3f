// torch_dist (PyTorch Distributed Checkpoint) reading for megatron_import.h.
//
// .metadata is a pickle of torch.distributed.checkpoint.metadata.Metadata:
//   state_dict_metadata: {key: TensorStorageMetadata(properties(dtype, ...), size,
//                               chunks [ChunkStorageMetadata(offsets, sizes)])
//                              | BytesStorageMetadata()}
//   storage_data: {MetadataIndex(fqn, offset, index): _StorageInfo(relative_path, offset,
//                                                                  length)}
// A chunk's bytes are a torch.save archive of the chunk tensor (what FileSystemWriter
// writes), or, failing the zip signature, its raw little-endian elements. Chunks are placed
// at their offsets in the global tensor; every element must be covered exactly once.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "base/error.h"
#include "checkpoint/megatron/megatron_import.h"
#include "checkpoint/megatron/torch_pickle.h"
#include "model/module.h"

namespace mcpp::checkpoint::megatron {

namespace fs = std::filesystem;
using K = Value::Kind;

namespace {

std::vector<int64_t> int_tuple(const Value* v, const std::string& what, const std::string& field) {
  MCPP_CHECK(v && (v->is(K::Tuple) || v->is(K::List)), "{}: {} is not a tuple", what, field);
  std::vector<int64_t> out;
  for (const auto& x : v->items) {
    MCPP_CHECK(x->is(K::Int) && x->i >= 0 && x->i < (int64_t(1) << 40),
               "{}: {} holds {} (expected sizes)", what, field, x->describe());
    out.push_back(x->i);
  }
  return out;
}

struct Place {
  std::string file;
  int64_t offset = 0, length = 0;
};

// Copies a chunk (row-major, `sizes`) into the global tensor at `offsets`, marking coverage.
void place(const Tensor& chunk, const std::vector<int64_t>& offsets, Tensor& global,
           std::vector<uint8_t>& covered, const std::string& what) {
  const Shape& g = global.shape();
  const Shape& c = chunk.shape();
  const size_t nd = g.size();
  if (nd == 0) {
    MCPP_CHECK(!covered[0], "{}: chunks overlap", what);
    global.data<float>()[0] = chunk.data<float>()[0], covered[0] = 1;
    return;
  }
  std::vector<int64_t> gstride(nd, 1);
  for (size_t d = nd - 1; d-- > 0;) gstride[d] = gstride[d + 1] * g[d + 1];
  const int64_t inner = c[nd - 1];
  const int64_t rows = inner ? chunk.numel() / inner : 0;
  std::vector<int64_t> idx(nd, 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t rem = r, at = offsets[nd - 1];
    for (size_t d = nd - 1; d-- > 0;) {
      idx[d] = rem % c[d], rem /= c[d];
      at += (offsets[d] + idx[d]) * gstride[d];
    }
    for (int64_t k = 0; k < inner; ++k) {
      MCPP_CHECK(!covered[size_t(at + k)], "{}: chunks overlap", what);
      covered[size_t(at + k)] = 1;
    }
    std::copy(chunk.data<float>() + r * inner, chunk.data<float>() + (r + 1) * inner,
              global.data<float>() + at);
  }
}

}  // namespace

void read_torch_dist(const Detected& d, Imported& im) {
  const fs::path dir(d.iter_dir);
  {  // common.pt: the args
    const std::string common = (dir / "common.pt").string();
    MCPP_CHECK_HINT(fs::is_regular_file(common),
                    "copy the iteration folder whole; a checkpoint of a newer Megatron that keeps "
                    "its common state inside the .distcp files is not read yet",
                    "{} is missing (it holds the run's args)", common);
    MappedFile f(common);
    TorchFile tf(f.bytes(), common);
    MCPP_CHECK(tf.root()->is(K::Dict), "{}: the state is a {}", common, tf.root()->describe());
    const Value* args = tf.root()->get("args");
    MCPP_CHECK(args, "{}: no 'args' in the common state", common);
    im.config = config_from_args(*args, common, im.notes);
    im.args_given = recorded_args(*args);
  }
  const std::string mpath = (dir / ".metadata").string();
  MappedFile mf(mpath);
  ValuePtr md = unpickle(mf.bytes(), mpath);
  MCPP_CHECK(md->is(K::Object) && md->s == "torch.distributed.checkpoint.metadata.Metadata",
             "{}: holds a {}, not a torch.distributed.checkpoint Metadata", mpath, md->describe());
  const Value* sdm = md->get("state_dict_metadata");
  const Value* storage = md->get("storage_data");
  MCPP_CHECK(sdm && sdm->is(K::Dict) && storage && storage->is(K::Dict),
             "{}: lacks state_dict_metadata or storage_data", mpath);
  // (fqn, chunk offsets) -> where its bytes are
  std::map<std::pair<std::string, std::vector<int64_t>>, Place> where;
  for (const auto& [k, v] : storage->entries) {
    MCPP_CHECK(k->is(K::Object) && v->is(K::Object), "{}: a storage_data entry is a {} -> {}",
               mpath, k->describe(), v->describe());
    const Value* fqn = k->get("fqn");
    MCPP_CHECK(fqn && fqn->is(K::Str), "{}: a MetadataIndex lacks its fqn", mpath);
    const Value* off = k->get("offset");
    std::vector<int64_t> o = off && !off->is(K::None) ? int_tuple(off, mpath, "offset")
                                                      : std::vector<int64_t>{};
    const Value* rp = v->get("relative_path");
    const Value* bo = v->get("offset");
    const Value* bl = v->get("length");
    MCPP_CHECK(rp && rp->is(K::Str) && bo && bo->is(K::Int) && bl && bl->is(K::Int) &&
                   bo->i >= 0 && bl->i >= 0,
               "{}: the storage entry of '{}' lacks relative_path/offset/length", mpath, fqn->s);
    const Value* tdesc = v->get("transform_descriptors");
    MCPP_CHECK_HINT(!tdesc || tdesc->is(K::None) || tdesc->items.empty(),
                    "save without compression or other storage transforms",
                    "{}: '{}' is stored through transforms, which megatron.cpp does not read",
                    mpath, fqn->s);
    // the file must be a plain name inside the folder (a hostile metadata file could name
    // ../../etc/passwd)
    MCPP_CHECK(!rp->s.empty() && rp->s.find('/') == std::string::npos && rp->s != "." &&
                   rp->s != "..",
               "{}: storage file '{}' of '{}' is not a file name inside the folder", mpath, rp->s,
               fqn->s);
    where[{fqn->s, o}] = Place{rp->s, bo->i, bl->i};
  }
  std::map<std::string, std::unique_ptr<MappedFile>> files;
  for (const auto& [kv, meta] : sdm->entries) {
    MCPP_CHECK(kv->is(K::Str), "{}: a key is a {}", mpath, kv->describe());
    const std::string& key = kv->s;
    if (key.rfind("optimizer.", 0) == 0) {
      im.had_optimizer = true;
      continue;
    }
    if (!meta->is(K::Object) || meta->s != "torch.distributed.checkpoint.metadata.TensorStorageMetadata")
      continue;  // BytesStorageMetadata: ShardedObjects (rng state, extra state)
    const std::string name = canonical_name(key);
    if (name.empty()) continue;
    const std::string what = mpath + " '" + key + "'";
    const std::vector<int64_t> size = int_tuple(meta->get("size"), what, "size");
    const Value* chunks = meta->get("chunks");
    MCPP_CHECK(chunks && chunks->is(K::List), "{}: no chunk list", what);
    int64_t numel = 1;
    for (auto s : size) {
      numel *= s;
      MCPP_CHECK(numel < (int64_t(1) << 40), "{}: global shape is implausibly large", what);
    }
    Tensor global = Tensor::zeros(Shape(size.begin(), size.end()), DType::F32);
    std::vector<uint8_t> covered(size_t(numel), 0);
    for (const auto& ch : chunks->items) {
      MCPP_CHECK(ch->is(K::Object), "{}: a chunk is a {}", what, ch->describe());
      auto off = int_tuple(ch->get("offsets"), what, "chunk offsets");
      auto sz = int_tuple(ch->get("sizes"), what, "chunk sizes");
      MCPP_CHECK(off.size() == size.size() && sz.size() == size.size(),
                 "{}: a chunk's rank differs from the tensor's", what);
      for (size_t k = 0; k < size.size(); ++k)
        MCPP_CHECK(off[k] <= size[k] && sz[k] <= size[k] - off[k],
                   "{}: chunk at {} of sizes {} leaves the global shape in dim {}", what,
                   shape_str(Shape(off.begin(), off.end())), shape_str(Shape(sz.begin(), sz.end())),
                   k);
      auto it = where.find({key, off});
      MCPP_CHECK_HINT(it != where.end(), "the .metadata file and the .distcp files disagree",
                      "{}: no storage entry for the chunk at {}", what,
                      shape_str(Shape(off.begin(), off.end())));
      const Place& p = it->second;
      auto& mfp = files[p.file];
      if (!mfp) mfp = std::make_unique<MappedFile>((dir / p.file).string());
      auto all = mfp->bytes();
      MCPP_CHECK_HINT(uint64_t(p.offset) <= all.size() && uint64_t(p.length) <= all.size() - uint64_t(p.offset),
                      "the .distcp file is truncated: copy it again",
                      "{}: bytes [{}, +{}) of {} lie outside its {} bytes", what, p.offset,
                      p.length, p.file, all.size());
      auto bytes = all.subspan(size_t(p.offset), size_t(p.length));
      Tensor chunk;
      const std::string in = fmt::format("{}[{}..{})", (dir / p.file).string(), p.offset,
                                         p.offset + p.length);
      if (bytes.size() >= 4 && bytes[0] == 'P' && bytes[1] == 'K' && bytes[2] == 3 && bytes[3] == 4) {
        TorchFile tf(bytes, in);
        chunk = tf.tensor(*tf.root(), DType::F32, key);
      } else {  // raw elements in the dtype the metadata names
        const Value* props = meta->get("properties");
        const Value* dt = props ? props->get("dtype") : nullptr;
        DType t;
        MCPP_CHECK(dt && dt->is(K::Global) && torch_dtype_from_global(dt->s, t),
                   "{}: raw chunk of an unknown dtype", what);
        int64_t n = 1;
        for (auto s : sz) n *= s;
        MCPP_CHECK(int64_t(bytes.size()) == n * torch_dtype_size(t),
                   "{}: {} holds {} bytes, the chunk needs {}", what, in, bytes.size(),
                   n * torch_dtype_size(t));
        chunk = Tensor::empty(Shape(sz.begin(), sz.end()), DType::F32);
        convert_elements(bytes.data(), t, n, chunk, 0);
      }
      MCPP_CHECK(chunk.shape() == Shape(sz.begin(), sz.end()),
                 "{}: the stored chunk has shape {}, the metadata says {}", what,
                 shape_str(chunk.shape()), shape_str(Shape(sz.begin(), sz.end())));
      place(chunk, off, global, covered, what);
    }
    MCPP_CHECK_HINT(std::all_of(covered.begin(), covered.end(), [](uint8_t c) { return c; }),
                    "a rank's .distcp file or metadata entry is missing",
                    "{}: the chunks do not cover the whole tensor", what);
    // decoder.layers.<rest>: one global tensor per name, layers stacked along dim 0
    static const std::string pre = "decoder.layers.";
    const std::string rest = name.rfind(pre, 0) == 0 ? name.substr(pre.size()) : "";
    if (!rest.empty() && !std::isdigit(uint8_t(rest[0]))) {
      const int64_t L = im.config.num_layers;
      MCPP_CHECK(!size.empty() && size[0] == L,
                 "{}: stacked layer tensor of shape {}, but the args say {} layers", what,
                 shape_str(global.shape()), L);
      Shape one(size.begin() + 1, size.end());
      const int64_t per = numel / L;
      for (int64_t l = 0; l < L; ++l) {
        Tensor t = Tensor::empty(one, DType::F32);
        std::copy(global.data<float>() + l * per, global.data<float>() + (l + 1) * per,
                  t.data<float>());
        im.tensors[model::layer_param_name(int(l), rest)] = t;
      }
    } else {
      im.tensors[name] = global;
    }
  }
}

}  // namespace mcpp::checkpoint::megatron
