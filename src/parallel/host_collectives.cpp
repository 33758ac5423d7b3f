#include "parallel/host_collectives.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "ops/ops.h"

namespace mcpp::parallel {

double sum_over(comm::Communicator& group, double v) {
  if (group.size() == 1) return v;
  Tensor t = Tensor::empty({1}, DType::F64);
  t.data<double>()[0] = v;
  group.all_reduce(t, comm::ReduceOp::Sum, ops::default_stream(Device::CPU));
  return t.data<double>()[0];
}

void sum_over(comm::Communicator& group, std::vector<double>& values) {
  if (group.size() == 1 || values.empty()) return;
  Tensor t = Tensor::from(values, {int64_t(values.size())});
  group.all_reduce(t, comm::ReduceOp::Sum, ops::default_stream(Device::CPU));
  const double* p = t.data<double>();
  values.assign(p, p + values.size());
}

std::vector<std::string> all_gather_strings(comm::Communicator& group, const std::string& mine) {
  Stream& st = ops::default_stream(Device::CPU);
  const int n = group.size();
  Tensor len = Tensor::empty({1}, DType::I64), lens = Tensor::empty({n}, DType::I64);
  len.data<int64_t>()[0] = int64_t(mine.size());
  group.all_gather(len, lens, st);
  int64_t longest = 1;
  for (int r = 0; r < n; ++r) longest = std::max(longest, lens.data<int64_t>()[r]);
  Tensor buf = Tensor::zeros({longest}, DType::U8), all = Tensor::empty({n * longest}, DType::U8);
  std::copy(mine.begin(), mine.end(), buf.data<uint8_t>());
  group.all_gather(buf, all, st);
  std::vector<std::string> out(n);
  for (int r = 0; r < n; ++r) {
    const char* p = reinterpret_cast<const char*>(all.data<uint8_t>()) + r * longest;
    out[r].assign(p, size_t(lens.data<int64_t>()[r]));
  }
  return out;
}

std::vector<std::vector<uint64_t>> all_gather_u64(comm::Communicator& group,
                                                  std::span<const uint64_t> mine) {
  const int n = group.size();
  if (n == 1) return {std::vector<uint64_t>(mine.begin(), mine.end())};
  Stream& st = ops::default_stream(Device::CPU);
  Tensor len = Tensor::empty({1}, DType::I64), lens = Tensor::empty({n}, DType::I64);
  len.data<int64_t>()[0] = int64_t(mine.size());
  group.all_gather(len, lens, st);
  int64_t longest = 1;
  for (int r = 0; r < n; ++r) longest = std::max(longest, lens.data<int64_t>()[r]);
  // Carried as int64 (the collectives' integer type), the same 64 bits.
  Tensor buf = Tensor::zeros({longest}, DType::I64), all = Tensor::empty({n * longest}, DType::I64);
  std::memcpy(buf.raw(), mine.data(), mine.size() * sizeof(uint64_t));
  group.all_gather(buf, all, st);
  std::vector<std::vector<uint64_t>> out(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    out[size_t(r)].resize(size_t(lens.data<int64_t>()[r]));
    std::memcpy(out[size_t(r)].data(), all.data<int64_t>() + r * longest,
                out[size_t(r)].size() * sizeof(uint64_t));
  }
  return out;
}

std::vector<std::pair<double, double>> min_max_over(comm::Communicator& group,
                                                    std::span<const double> values) {
  const int64_t n = int64_t(values.size());
  std::vector<std::pair<double, double>> out(values.size());
  if (group.size() == 1) {
    for (size_t i = 0; i < values.size(); ++i) out[i] = {values[i], values[i]};
    return out;
  }
  // One MAX reduction of [n, -n, v..., -v...]: min(x) = -max(-x). The counts first, so
  // that members disagreeing on n fail with a message instead of a mismatched collective.
  Stream& st = ops::default_stream(Device::CPU);
  Tensor c = Tensor::empty({2}, DType::F64);
  c.data<double>()[0] = double(n), c.data<double>()[1] = -double(n);
  group.all_reduce(c, comm::ReduceOp::Max, st);
  const double most = c.data<double>()[0], least = -c.data<double>()[1];
  MCPP_CHECK(most == least,
             "min_max_over {}: the members hold between {} and {} values (this "
             "rank {}); every member must reduce the same list",
             group.describe(), least, most, n);
  if (n == 0) return out;
  Tensor t = Tensor::empty({2 * n}, DType::F64);
  double* p = t.data<double>();
  for (int64_t i = 0; i < n; ++i) p[i] = values[size_t(i)], p[n + i] = -values[size_t(i)];
  group.all_reduce(t, comm::ReduceOp::Max, st);
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = {-p[n + i], p[i]};
  return out;
}

}  // namespace mcpp::parallel
