#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "base/error.h"
#include "data/indexed_dataset.h"
#include "test_util.h"

using namespace mcpp;
using namespace mcpp::data;
using mcpp::testing::golden;
using mcpp::testing::read_bytes;
using mcpp::testing::scratch_dir;
using mcpp::testing::write_bytes;

namespace indexed_dataset_test {

// Expects an mcpp::Error whose message contains every fragment.
template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> fragments) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    std::string w = e.what();
    for (auto& frag : fragments) EXPECT_NE(w.find(frag), std::string::npos) << w;
  }
}

void write_u16_fixture(const std::string& prefix) {
  IndexedDatasetBuilder b(prefix, IndexDType::U16);
  std::vector<int32_t> d0{15496, 995, 50256}, d1{1, 2}, d2{}, d3{7, 8, 9, 10, 11, 65499};
  b.add_item(std::span<const int32_t>(d0));
  b.end_document();
  std::vector<int64_t> l1{2};
  b.add_document(d1, l1);
  b.add_item(std::span<const int32_t>(d2));
  b.end_document();
  b.add_item(std::span<const int32_t>(d3));
  b.end_document();
  b.finalize();
}


TEST(IndexedDataset, BuilderIsByteIdenticalToReferenceWriter) {
  auto dir = scratch_dir();
  write_u16_fixture(dir + "/u16");
  EXPECT_EQ(read_bytes(dir + "/u16.bin"), read_bytes(golden("indexed/u16.bin")));
  EXPECT_EQ(read_bytes(dir + "/u16.idx"), read_bytes(golden("indexed/u16.idx")));

  IndexedDatasetBuilder b(dir + "/i32", optimal_index_dtype(128256));
  std::vector<int32_t> t0{100000, 5, 128000, 1, 2}, t2{70000, 70001, 70002, 128001};
  std::vector<int64_t> l0{2, 3};
  b.add_document(t0, l0);
  std::vector<int64_t> t1{3};
  b.add_item(std::span<const int64_t>(t1));
  b.end_document();
  b.add_item(std::span<const int32_t>(t2));
  b.end_document();
  b.finalize();
  EXPECT_EQ(read_bytes(dir + "/i32.bin"), read_bytes(golden("indexed/i32.bin")));
  EXPECT_EQ(read_bytes(dir + "/i32.idx"), read_bytes(golden("indexed/i32.idx")));
  // No temporary files left behind.
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) (void)e, ++files;
  EXPECT_EQ(files, 4);
}

TEST(IndexedDataset, ReadsReferenceFiles) {
  IndexedDataset ds(golden("indexed/u16"));
  EXPECT_EQ(ds.dtype(), IndexDType::U16);
  EXPECT_EQ(ds.num_sequences(), 4);
  EXPECT_EQ(ds.num_documents(), 4);
  EXPECT_EQ(ds.num_tokens(), 11);
  EXPECT_EQ(ds.get(0), (std::vector<int64_t>{15496, 995, 50256}));
  EXPECT_EQ(ds.get(2).size(), 0u);
  EXPECT_EQ(ds.get(3, 2, 3), (std::vector<int64_t>{9, 10, 11}));
  EXPECT_EQ(ds.get(3, 4), (std::vector<int64_t>{11, 65499}));
  EXPECT_THROW(ds.get(3, 4, 3), Error);
  EXPECT_THROW(ds.get(4), Error);

  IndexedDataset ds32(golden("indexed/i32"));
  EXPECT_EQ(ds32.dtype(), IndexDType::I32);
  EXPECT_EQ(ds32.num_sequences(), 4);
  EXPECT_EQ(ds32.num_documents(), 3);
  EXPECT_EQ(ds32.get(1), (std::vector<int64_t>{128000, 1, 2}));
  EXPECT_EQ(ds32.document_indices()[1], 2);
}

TEST(IndexedDataset, MergeMatchesSingleWrite) {
  auto dir = scratch_dir();
  IndexedDatasetBuilder b(dir + "/merged", IndexDType::U16);
  b.add_index(golden("indexed/u16"));
  b.add_index(golden("indexed/u16"));
  b.finalize();
  IndexedDataset m(dir + "/merged");
  EXPECT_EQ(m.num_sequences(), 8);
  EXPECT_EQ(m.num_documents(), 8);
  EXPECT_EQ(m.get(7), (std::vector<int64_t>{7, 8, 9, 10, 11, 65499}));
  EXPECT_EQ(m.document_indices()[5], 5);
  IndexedDatasetBuilder bad(dir + "/bad", IndexDType::I32);
  expect_error([&] { bad.add_index(golden("indexed/u16")); }, {"cannot merge", "uint16"});
}

// add_documents (ids already in the dtype, as preprocess workers hand them over) writes
// what add_document writes.
TEST(IndexedDataset, AddDocumentsMatchesAddDocument) {
  auto dir = scratch_dir();
  std::vector<int32_t> t0{1, 2, 3}, t1{4}, t2{5, 6, 7, 8};
  std::vector<int64_t> l0{1, 2}, l1{1}, l2{4};
  {
    IndexedDatasetBuilder b(dir + "/one", IndexDType::U16);
    b.add_document(t0, l0);
    b.add_document(t1, l1);
    b.add_document(std::span<const int32_t>(), std::span<const int64_t>());
    b.add_document(t2, l2);
    b.finalize();
  }
  std::vector<int32_t> all{1, 2, 3, 4, 5, 6, 7, 8}, lengths{1, 2, 1, 4}, doc_nseq{2, 1, 0, 1};
  std::vector<uint8_t> bytes;
  append_as_dtype(IndexDType::U16, all, bytes, "x");
  ASSERT_EQ(bytes.size(), 16u);
  {
    IndexedDatasetBuilder b(dir + "/many", IndexDType::U16);
    b.add_documents(std::span(bytes).first(6), std::span(lengths).first(2),
                    std::span(doc_nseq).first(1));
    b.add_documents(std::span(bytes).subspan(6), std::span(lengths).subspan(2),
                    std::span(doc_nseq).subspan(1));
    std::vector<int32_t> one{1}, none{};
    std::vector<uint8_t> odd(3);
    expect_error([&] { b.add_documents(odd, one, one); }, {"add_documents"});
    expect_error([&] { b.add_documents(std::span(bytes).first(2), one, none); }, {"sequences"});
    b.finalize();
  }
  EXPECT_EQ(read_bytes(dir + "/one.bin"), read_bytes(dir + "/many.bin"));
  EXPECT_EQ(read_bytes(dir + "/one.idx"), read_bytes(dir + "/many.idx"));
  std::vector<uint8_t> u16;
  std::vector<int32_t> big{65535, 65536};
  expect_error([&] { append_as_dtype(IndexDType::U16, big, u16, "prefix_x"); },
               {"65536", "uint16", "prefix_x"});
}

TEST(IndexedDataset, TokenOutOfDtypeRangeIsError) {
  auto dir = scratch_dir();
  IndexedDatasetBuilder b(dir + "/x", IndexDType::U16);
  std::vector<int32_t> t{1, 70000};
  expect_error([&] { b.add_item(std::span<const int32_t>(t)); }, {"70000", "uint16"});
}

TEST(IndexedDataset, UnfinalizedBuilderLeavesNothing) {
  auto dir = scratch_dir();
  {
    IndexedDatasetBuilder b(dir + "/x", IndexDType::U16);
    std::vector<int32_t> t{1, 2, 3};
    b.add_item(std::span<const int32_t>(t));
    b.end_document();
  }  // destroyed without finalize (as on an exception)
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

TEST(IndexedDataset, CorruptFilesAreClearErrors) {
  auto dir = scratch_dir();
  const std::string idx = read_bytes(golden("indexed/u16.idx"));
  const std::string bin = read_bytes(golden("indexed/u16.bin"));
  auto make = [&](const std::string& name, std::string i, std::string b) {
    write_bytes(dir + "/" + name + ".idx", i);
    write_bytes(dir + "/" + name + ".bin", b);
    return dir + "/" + name;
  };
  auto patch = [&](size_t at, const void* v, size_t n) {
    std::string s = idx;
    std::memcpy(s.data() + at, v, n);
    return s;
  };
  expect_error([&] { IndexedDataset d(dir + "/missing"); }, {"missing.idx", "cannot open"});
  expect_error([&] { IndexedDataset d(make("short", idx.substr(0, 20), bin)); },
               {"short.idx", "header"});
  expect_error([&] { IndexedDataset d(make("magic", patch(0, "XXIDIDX", 7), bin)); }, {"magic"});
  uint64_t v2 = 2;
  expect_error([&] { IndexedDataset d(make("ver", patch(9, &v2, 8), bin)); },
               {"version", "found 2"});
  uint8_t c9 = 9;
  expect_error([&] { IndexedDataset d(make("dt", patch(17, &c9, 1), bin)); },
               {"dtype code", "found 9"});
  uint64_t huge = ~0ull >> 4;
  expect_error([&] { IndexedDataset d(make("n", patch(18, &huge, 8), bin)); }, {"sequence count"});
  expect_error([&] { IndexedDataset d(make("d", patch(26, &huge, 8), bin)); }, {"document count"});
  expect_error([&] { IndexedDataset d(make("trunc", idx.substr(0, idx.size() - 8), bin)); },
               {"trunc.idx", "file size"});
  int32_t neg = -3;
  expect_error([&] { IndexedDataset d(make("len", patch(34, &neg, 4), bin)); },
               {"sequence_lengths"});
  int64_t back = 0;  // pointer of sequence 1 moved before the end of sequence 0
  expect_error([&] { IndexedDataset d(make("ptr", patch(34 + 16 + 8, &back, 8), bin)); },
               {"sequence_pointers"});
  int64_t bigdoc = 9;
  expect_error([&] { IndexedDataset d(make("doc", patch(34 + 48 + 16, &bigdoc, 8), bin)); },
               {"document_indices"});
  expect_error([&] { IndexedDataset d(make("tbin", idx, bin.substr(0, bin.size() - 2))); },
               {"tbin.bin", "truncated"});
}

}  // namespace indexed_dataset_test
