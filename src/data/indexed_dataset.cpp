#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <utility>

#include "base/error.h"

namespace mcpp::data {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeader = 34;  // magic 9 + version 8 + dtype 1 + N 8 + D 8

const char* kFormatHint =
    "the file is truncated or not a Megatron MMIDIDX dataset; re-create it with `megatron "
    "preprocess` (or Megatron's tools/preprocess_data.py)";

struct Mapped {
  void* ptr = nullptr;
  size_t bytes = 0;
};

Mapped map_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw Error(fmt::format("cannot open {}: {}", path, std::strerror(errno)),
                "check the --data-path prefix: it names FILE for FILE.bin and FILE.idx");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(fmt::format("cannot stat {}: {}", path, std::strerror(errno)));
  }
  Mapped m;
  m.bytes = size_t(st.st_size);
  if (m.bytes > 0) {
    m.ptr = ::mmap(nullptr, m.bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (m.ptr == MAP_FAILED) {
      ::close(fd);
      throw Error(fmt::format("cannot memory-map {}: {}", path, std::strerror(errno)));
    }
  }
  ::close(fd);
  return m;
}

template <typename T>
T read_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // the format is little-endian, as is every host we build for
  return v;
}

template <typename Src>
void convert(const uint8_t* src, int64_t n, int64_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    Src v;
    std::memcpy(&v, src + i * int64_t(sizeof(Src)), sizeof(Src));
    out[i] = int64_t(v);
  }
}

}  // namespace

bool index_dtype_valid(uint8_t code) { return code >= 1 && code <= 8; }

int64_t index_dtype_size(IndexDType t) {
  switch (t) {
    case IndexDType::U8:
    case IndexDType::I8:
      return 1;
    case IndexDType::I16:
    case IndexDType::U16:
      return 2;
    case IndexDType::I32:
    case IndexDType::F32:
      return 4;
    case IndexDType::I64:
    case IndexDType::F64:
      return 8;
  }
  return 0;
}

const char* index_dtype_name(IndexDType t) {
  switch (t) {
    case IndexDType::U8:
      return "uint8";
    case IndexDType::I8:
      return "int8";
    case IndexDType::I16:
      return "int16";
    case IndexDType::I32:
      return "int32";
    case IndexDType::I64:
      return "int64";
    case IndexDType::F64:
      return "float64";
    case IndexDType::F32:
      return "float32";
    case IndexDType::U16:
      return "uint16";
  }
  return "?";
}

IndexDType optimal_index_dtype(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexDType::U16 : IndexDType::I32;
}

std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }

// ---- reader -------------------------------------------------------------------------

IndexedDataset::IndexedDataset(const std::string& prefix, bool multimodal, bool mmap_bin)
    : prefix_(prefix) {
  const std::string ip = idx_path(prefix), bp = bin_path(prefix);
  Mapped im = map_file(ip);
  idx_map_ = im.ptr, idx_bytes_ = im.bytes;
  auto bad = [&](const std::string& field, const std::string& detail) {
    throw Error(fmt::format("{}: invalid {}: {}", ip, field, detail), kFormatHint);
  };
  if (idx_bytes_ < kHeader)
    bad("header", fmt::format("file has {} bytes, the header alone needs {}", idx_bytes_, kHeader));
  const auto* p = static_cast<const uint8_t*>(idx_map_);
  if (std::memcmp(p, kMagic, 9) != 0) bad("magic", "expected \"MMIDIDX\\0\\0\" at byte 0");
  uint64_t version = read_le<uint64_t>(p + 9);
  if (version != 1) bad("version", fmt::format("expected 1, found {}", version));
  uint8_t code = p[17];
  if (!index_dtype_valid(code)) bad("dtype code", fmt::format("expected 1..8, found {}", code));
  dtype_ = IndexDType(code);
  itemsize_ = index_dtype_size(dtype_);
  uint64_t n = read_le<uint64_t>(p + 18), d = read_le<uint64_t>(p + 26);
  // Bound the counts by the file size before any arithmetic with them can overflow.
  if (n > idx_bytes_ / 12)
    bad("sequence count", fmt::format("{} sequences cannot fit in {} bytes", n, idx_bytes_));
  if (d > idx_bytes_ / 8)
    bad("document count", fmt::format("{} boundaries cannot fit in {} bytes", d, idx_bytes_));
  if (d < 1) bad("document count", "expected at least 1 boundary (the leading 0), found 0");
  n_ = int64_t(n), d_ = int64_t(d);
  size_t need = kHeader + 12 * n + 8 * d + (multimodal ? n : 0);
  if (idx_bytes_ != need)
    bad("file size",
        fmt::format("{} sequences and {} document boundaries need {} bytes, file has {}", n, d,
                    need, idx_bytes_));
  // The arrays are 2-byte aligned at best (offset 34), so they are accessed through
  // memcpy-safe pointers only on hosts that allow unaligned loads (x86-64, aarch64).
  lengths_ = reinterpret_cast<const int32_t*>(p + kHeader);
  pointers_ = reinterpret_cast<const int64_t*>(p + kHeader + 4 * n);
  docs_ = reinterpret_cast<const int64_t*>(p + kHeader + 12 * n);
  if (multimodal) modes_ = reinterpret_cast<const int8_t*>(p + kHeader + 12 * n + 8 * d);

  if (mmap_bin) {
    Mapped bm = map_file(bp);
    bin_map_ = bm.ptr, bin_bytes_ = bm.bytes;
    bin_ = static_cast<const uint8_t*>(bin_map_);
  } else {
    bin_fd_ = ::open(bp.c_str(), O_RDONLY | O_CLOEXEC);
    if (bin_fd_ < 0) {
      if (idx_map_) ::munmap(idx_map_, idx_bytes_);
      throw Error(fmt::format("cannot open {}: {}", bp, std::strerror(errno)),
                  "check the --data-path prefix: it names FILE for FILE.bin and FILE.idx");
    }
    struct stat st {};
    if (::fstat(bin_fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(bin_fd_);
      if (idx_map_) ::munmap(idx_map_, idx_bytes_);
      throw Error(fmt::format("{} is not a readable regular file", bp));
    }
    bin_bytes_ = size_t(st.st_size);
  }

  // Validate the arrays: lengths >= 0, pointers increasing and inside .bin, document
  // boundaries from 0 to N and non-decreasing.
  int64_t expect_ptr = 0;
  num_tokens_ = 0;
  for (int64_t i = 0; i < n_; ++i) {
    int32_t len = read_le<int32_t>(reinterpret_cast<const uint8_t*>(lengths_ + i));
    int64_t ptr = read_le<int64_t>(reinterpret_cast<const uint8_t*>(pointers_ + i));
    if (len < 0) bad("sequence_lengths", fmt::format("sequence {} has length {}", i, len));
    if (ptr < expect_ptr)
      bad("sequence_pointers", fmt::format("sequence {} starts at byte {}, before the end of the "
                                           "previous one (byte {})",
                                           i, ptr, expect_ptr));
    // Compared as differences of values already known to be in range: a pointer near
    // INT64_MAX must not wrap around and pass (the read would then leave the mapping).
    const uint64_t bytes = uint64_t(len) * uint64_t(itemsize_);  // < 2^34: no overflow
    if (uint64_t(ptr) > bin_bytes_ || bytes > bin_bytes_ - uint64_t(ptr))
      throw Error(
          fmt::format("{}: truncated or mismatched: the index {} places sequence {} ({} tokens) "
                      "at byte {}, beyond the file's {} bytes",
                      bp, ip, i, len, ptr, bin_bytes_),
          "the .bin and .idx files do not belong together or the copy was interrupted; "
          "copy or re-create both");
    expect_ptr = ptr + int64_t(bytes);
    num_tokens_ += len;
  }
  int64_t prev = 0;
  for (int64_t j = 0; j < d_; ++j) {
    int64_t v = read_le<int64_t>(reinterpret_cast<const uint8_t*>(docs_ + j));
    if ((j == 0 && v != 0) || v < prev || v > n_)
      bad("document_indices",
          fmt::format("boundary {} is {} (expected non-decreasing values from 0 "
                      "to {})",
                      j, v, n_));
    prev = v;
  }
  if (prev != n_)
    bad("document_indices", fmt::format("last boundary is {}, expected {}", prev, n_));
}

int64_t IndexedDataset::max_token_id() const {
  std::call_once(max_once_, [&] {
    int64_t mx = -1;
    std::vector<uint8_t> buf;
    auto bad = [&](int64_t seq, const std::string& what) {
      throw Error(fmt::format("{}: sequence {} holds {}, not a token id", bin_path(prefix_), seq,
                              what),
                  "the .bin file is corrupt or was not written by a tokenizer; re-create it "
                  "with `megatron preprocess`");
    };
    for (int64_t i = 0; i < n_; ++i) {
      const int64_t len = read_le<int32_t>(reinterpret_cast<const uint8_t*>(lengths_ + i));
      const uint8_t* p =
          bin_bytes_at(read_le<int64_t>(reinterpret_cast<const uint8_t*>(pointers_ + i)),
                       len * itemsize_, buf);
      switch (dtype_) {
        case IndexDType::U8:
          for (int64_t k = 0; k < len; ++k) mx = std::max<int64_t>(mx, p[k]);
          break;
        case IndexDType::U16:
          for (int64_t k = 0; k < len; ++k) mx = std::max<int64_t>(mx, read_le<uint16_t>(p + 2 * k));
          break;
        case IndexDType::I8:
        case IndexDType::I16:
        case IndexDType::I32:
        case IndexDType::I64: {
          int64_t mn = 0;
          for (int64_t k = 0; k < len; ++k) {
            int64_t v = dtype_ == IndexDType::I8    ? int64_t(int8_t(p[k]))
                        : dtype_ == IndexDType::I16 ? int64_t(read_le<int16_t>(p + 2 * k))
                        : dtype_ == IndexDType::I32 ? int64_t(read_le<int32_t>(p + 4 * k))
                                                    : read_le<int64_t>(p + 8 * k);
            mn = std::min(mn, v), mx = std::max(mx, v);
          }
          if (mn < 0) bad(i, fmt::format("the negative value {}", mn));
          break;
        }
        case IndexDType::F32:
        case IndexDType::F64:
          for (int64_t k = 0; k < len; ++k) {
            const double v = dtype_ == IndexDType::F32 ? double(read_le<float>(p + 4 * k))
                                                       : read_le<double>(p + 8 * k);
            if (!(v >= 0 && v < 9.2e18 && v == std::floor(v)))
              bad(i, fmt::format("the value {} at position {}", v, k));
            mx = std::max(mx, int64_t(v));
          }
          break;
      }
    }
    max_id_ = mx;
  });
  return max_id_;
}

void IndexedDataset::check_vocabulary(int64_t vocab_size, std::optional<int64_t> max_id) const {
  const int64_t mx = max_id ? *max_id : max_token_id();
  if (mx >= vocab_size)
    throw Error(fmt::format("{}: holds token id {}, outside the model's vocabulary of {} ids "
                            "(padded)",
                            bin_path(prefix_), mx, vocab_size),
                "the dataset was tokenised with another tokenizer than this run's; preprocess "
                "it with the run's tokenizer, or give the matching --tokenizer-type / "
                "--vocab-size");
}

IndexedDataset::~IndexedDataset() {
  if (idx_map_) ::munmap(idx_map_, idx_bytes_);
  if (bin_map_) ::munmap(bin_map_, bin_bytes_);
  if (bin_fd_ >= 0) ::close(bin_fd_);
}

const uint8_t* IndexedDataset::bin_bytes_at(int64_t offset, int64_t nbytes,
                                            std::vector<uint8_t>& buf) const {
  if (bin_) return bin_ + offset;
  buf.resize(size_t(nbytes));
  int64_t done = 0;
  while (done < nbytes) {  // pread may return less than asked (signals, large reads)
    const ssize_t r = ::pread(bin_fd_, buf.data() + done, size_t(nbytes - done), offset + done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      throw Error(fmt::format("{}: read of {} bytes at byte {} failed: {}", bin_path(prefix_),
                              nbytes, offset + done, r < 0 ? std::strerror(errno) : "end of file"));
    done += r;
  }
  return buf.data();
}

int64_t IndexedDataset::get(int64_t seq, int64_t offset, int64_t length, int64_t* out) const {
  MCPP_CHECK(seq >= 0 && seq < n_, "{}: sequence {} out of range [0, {})", prefix_, seq, n_);
  int64_t len = lengths_[seq];
  if (length < 0) length = len - offset;
  MCPP_CHECK(offset >= 0 && length >= 0 && offset + length <= len,
             "{}: read of {} items at offset {} of sequence {} (length {})", prefix_, length,
             offset, seq, len);
  thread_local std::vector<uint8_t> buf;  // --no-mmap-bin-files: get() is thread-safe
  const uint8_t* src = bin_bytes_at(pointers_[seq] + offset * itemsize_, length * itemsize_, buf);
  switch (dtype_) {
    case IndexDType::U8:
      convert<uint8_t>(src, length, out);
      break;
    case IndexDType::I8:
      convert<int8_t>(src, length, out);
      break;
    case IndexDType::I16:
      convert<int16_t>(src, length, out);
      break;
    case IndexDType::U16:
      convert<uint16_t>(src, length, out);
      break;
    case IndexDType::I32:
      convert<int32_t>(src, length, out);
      break;
    case IndexDType::I64:
      convert<int64_t>(src, length, out);
      break;
    case IndexDType::F32: {
      for (int64_t i = 0; i < length; ++i) out[i] = int64_t(read_le<float>(src + 4 * i));
      break;
    }
    case IndexDType::F64: {
      for (int64_t i = 0; i < length; ++i) out[i] = int64_t(read_le<double>(src + 8 * i));
      break;
    }
  }
  return length;
}

std::vector<int64_t> IndexedDataset::get(int64_t seq, int64_t offset, int64_t length) const {
  MCPP_CHECK(seq >= 0 && seq < n_, "{}: sequence {} out of range [0, {})", prefix_, seq, n_);
  if (length < 0) length = lengths_[seq] - offset;
  std::vector<int64_t> out(size_t(std::max<int64_t>(length, 0)));
  get(seq, offset, length, out.data());
  return out;
}

// ---- builder ------------------------------------------------------------------------

IndexedDatasetBuilder::IndexedDatasetBuilder(std::string prefix, IndexDType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype) {
  const std::string tag = fmt::format(".tmp{}", ::getpid());
  bin_tmp_ = bin_path(prefix_) + tag;
  idx_tmp_ = idx_path(prefix_) + tag;
  bin_ = std::fopen(bin_tmp_.c_str(), "wb");
  if (!bin_)
    throw Error(fmt::format("cannot create {}: {}", bin_tmp_, std::strerror(errno)),
                "check that the output folder exists and is writable");
  std::setvbuf(bin_, nullptr, _IOFBF, 1 << 20);
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (bin_) std::fclose(bin_);
  if (!finalized_) {
    std::remove(bin_tmp_.c_str());
    std::remove(idx_tmp_.c_str());
  }
}

void IndexedDatasetBuilder::write_raw(const void* p, size_t bytes) {
  if (bytes && std::fwrite(p, 1, bytes, bin_) != bytes)
    throw Error(fmt::format("write to {} failed: {}", bin_tmp_, std::strerror(errno)),
                "is the disk full?");
  bin_bytes_ += int64_t(bytes);
#ifdef __linux__
  // Start writing back every 16 MB now, without waiting, so that finalize()'s fsync finds
  // little left to do (it took 45 ms for a 50 MB .bin, serial time at the end of a run).
  constexpr int64_t kWriteback = int64_t(16) << 20;
  if (bin_bytes_ - writeback_from_ >= kWriteback && std::fflush(bin_) == 0) {
    ::sync_file_range(::fileno(bin_), writeback_from_, bin_bytes_ - writeback_from_,
                      SYNC_FILE_RANGE_WRITE);
    writeback_from_ = bin_bytes_;
  }
#endif
}

namespace {
template <typename T>
void append_as_dtype_impl(IndexDType dtype, std::span<const T> ids, std::vector<uint8_t>& out,
                          const std::string& dataset) {
  auto put = [&]<typename D>(D) {
    const size_t at = out.size();
    out.resize(at + ids.size() * sizeof(D));
    D* dst = reinterpret_cast<D*>(out.data() + at);
    for (size_t i = 0; i < ids.size(); ++i) {
      T v = ids[i];
      if constexpr (std::is_integral_v<D>) {
        if (v < T(std::numeric_limits<D>::min()) ||
            int64_t(v) > int64_t(std::numeric_limits<D>::max()))
          throw Error(fmt::format("token id {} does not fit the dataset dtype {} of {}", int64_t(v),
                                  index_dtype_name(dtype), dataset),
                      "the tokenizer's vocabulary is larger than the dtype allows; the dtype "
                      "follows the vocabulary size (uint16 below 65500, else int32)");
      }
      dst[i] = D(v);
    }
  };
  switch (dtype) {
    case IndexDType::U8:
      put(uint8_t{});
      break;
    case IndexDType::I8:
      put(int8_t{});
      break;
    case IndexDType::I16:
      put(int16_t{});
      break;
    case IndexDType::U16:
      put(uint16_t{});
      break;
    case IndexDType::I32:
      put(int32_t{});
      break;
    case IndexDType::I64:
      put(int64_t{});
      break;
    case IndexDType::F32:
      put(float{});
      break;
    case IndexDType::F64:
      put(double{});
      break;
  }
}
}  // namespace

void append_as_dtype(IndexDType dtype, std::span<const int32_t> ids, std::vector<uint8_t>& out,
                     const std::string& dataset) {
  append_as_dtype_impl(dtype, ids, out, dataset);
}
void append_as_dtype(IndexDType dtype, std::span<const int64_t> ids, std::vector<uint8_t>& out,
                     const std::string& dataset) {
  append_as_dtype_impl(dtype, ids, out, dataset);
}

template <typename T>
void IndexedDatasetBuilder::write_tokens(std::span<const T> tokens) {
  scratch_.clear();
  append_as_dtype(dtype_, tokens, scratch_, prefix_);
  write_raw(scratch_.data(), scratch_.size());
}

void IndexedDatasetBuilder::add_item(std::span<const int32_t> tokens) {
  MCPP_CHECK(!finalized_, "add_item after finalize");
  MCPP_CHECK(tokens.size() <= size_t(std::numeric_limits<int32_t>::max()), "sequence too long");
  write_tokens(tokens);
  lengths_.push_back(int32_t(tokens.size()));
}

void IndexedDatasetBuilder::add_item(std::span<const int64_t> tokens) {
  MCPP_CHECK(!finalized_, "add_item after finalize");
  MCPP_CHECK(tokens.size() <= size_t(std::numeric_limits<int32_t>::max()), "sequence too long");
  write_tokens(tokens);
  lengths_.push_back(int32_t(tokens.size()));
}

void IndexedDatasetBuilder::end_document() { docs_.push_back(int64_t(lengths_.size())); }

void IndexedDatasetBuilder::add_document(std::span<const int32_t> tokens,
                                         std::span<const int64_t> lengths) {
  MCPP_CHECK(!finalized_, "add_document after finalize");
  int64_t total = 0;
  for (int64_t l : lengths) {
    MCPP_CHECK(l >= 0 && l <= std::numeric_limits<int32_t>::max(), "bad sequence length {}", l);
    total += l;
  }
  MCPP_CHECK(total == int64_t(tokens.size()), "add_document: lengths sum to {}, {} tokens given",
             total, tokens.size());
  write_tokens(tokens);
  for (int64_t l : lengths) lengths_.push_back(int32_t(l));
  docs_.push_back(int64_t(lengths_.size()));
}

void IndexedDatasetBuilder::add_documents(std::span<const uint8_t> token_bytes,
                                          std::span<const int32_t> lengths,
                                          std::span<const int32_t> doc_nseq) {
  MCPP_CHECK(!finalized_, "add_documents after finalize");
  int64_t total = 0;
  for (int32_t l : lengths) {
    MCPP_CHECK(l >= 0, "bad sequence length {}", l);
    total += l;
  }
  MCPP_CHECK(total * index_dtype_size(dtype_) == int64_t(token_bytes.size()),
             "add_documents: lengths sum to {} tokens, {} bytes of {} given", total,
             token_bytes.size(), index_dtype_name(dtype_));
  int64_t nseq = 0;
  for (int32_t n : doc_nseq) nseq += n;
  MCPP_CHECK(nseq == int64_t(lengths.size()), "add_documents: {} sequences counted, {} given", nseq,
             lengths.size());
  write_raw(token_bytes.data(), token_bytes.size());
  lengths_.insert(lengths_.end(), lengths.begin(), lengths.end());
  int64_t end = docs_.back();
  for (int32_t n : doc_nseq) docs_.push_back(end += n);
}

void IndexedDatasetBuilder::add_index(const std::string& prefix) {
  MCPP_CHECK(!finalized_, "add_index after finalize");
  IndexedDataset other(prefix);
  if (other.dtype() != dtype_)
    throw Error(fmt::format("cannot merge {} (dtype {}) into {} (dtype {})", prefix,
                            index_dtype_name(other.dtype()), prefix_, index_dtype_name(dtype_)),
                "datasets made with different tokenizers cannot be merged");
  int64_t offset = int64_t(lengths_.size());
  for (int32_t l : other.sequence_lengths()) lengths_.push_back(l);
  auto docs = other.document_indices();
  for (size_t j = 1; j < docs.size(); ++j) docs_.push_back(offset + docs[j]);
  // Copy the token bytes the index describes.
  const int64_t bytes = other.num_tokens() * index_dtype_size(dtype_);
  std::FILE* f = std::fopen(bin_path(prefix).c_str(), "rb");
  MCPP_CHECK(f, "cannot open {}", bin_path(prefix));
  std::vector<uint8_t> buf(1 << 22);
  int64_t left = bytes;
  while (left > 0) {
    size_t want = size_t(std::min<int64_t>(left, int64_t(buf.size())));
    size_t got = std::fread(buf.data(), 1, want, f);
    if (got != want) {
      std::fclose(f);
      MCPP_FAIL("short read from {}", bin_path(prefix));
    }
    write_raw(buf.data(), got);
    left -= int64_t(got);
  }
  std::fclose(f);
}

void IndexedDatasetBuilder::finalize() {
  MCPP_CHECK(!finalized_, "finalize called twice");
  if (docs_.back() != int64_t(lengths_.size())) end_document();
  auto sync_close = [&](std::FILE* f, const std::string& path) {
    if (std::fflush(f) != 0 || ::fsync(::fileno(f)) != 0 || std::fclose(f) != 0)
      throw Error(fmt::format("cannot write {}: {}", path, std::strerror(errno)),
                  "is the disk full?");
  };
  // The .bin's fsync runs while the .idx is built and written (serial time at the end
  // of every preprocess run); both complete before anything is renamed.
  std::FILE* bin = std::exchange(bin_, nullptr);
  auto bin_synced = std::async(std::launch::async, [&] { sync_close(bin, bin_tmp_); });

  std::FILE* f = std::fopen(idx_tmp_.c_str(), "wb");
  if (!f) throw Error(fmt::format("cannot create {}: {}", idx_tmp_, std::strerror(errno)));
  std::setvbuf(f, nullptr, _IOFBF, 1 << 20);
  auto put = [&](const void* p, size_t bytes) {
    if (bytes && std::fwrite(p, 1, bytes, f) != bytes) {
      std::fclose(f);
      throw Error(fmt::format("write to {} failed: {}", idx_tmp_, std::strerror(errno)));
    }
  };
  const uint64_t version = 1, n = lengths_.size(), d = docs_.size();
  const uint8_t code = uint8_t(dtype_);
  put(kMagic, 9);
  put(&version, 8);
  put(&code, 1);
  put(&n, 8);
  put(&d, 8);
  put(lengths_.data(), 4 * n);
  std::vector<int64_t> ptrs(n);
  const int64_t itemsize = index_dtype_size(dtype_);
  int64_t cur = 0;
  for (size_t i = 0; i < n; ++i) ptrs[i] = cur, cur += int64_t(lengths_[i]) * itemsize;
  put(ptrs.data(), 8 * n);
  put(docs_.data(), 8 * d);
  sync_close(f, idx_tmp_);
  bin_synced.get();

  // Old .idx out first, then .bin in, then .idx in: at no moment does a valid-looking
  // .idx sit next to a .bin it does not describe.
  const std::string ip = idx_path(prefix_), bp = bin_path(prefix_);
  std::remove(ip.c_str());
  if (std::rename(bin_tmp_.c_str(), bp.c_str()) != 0 ||
      std::rename(idx_tmp_.c_str(), ip.c_str()) != 0)
    throw Error(fmt::format("cannot move {} into place: {}", prefix_, std::strerror(errno)));
  finalized_ = true;
}

}  // namespace mcpp::data
