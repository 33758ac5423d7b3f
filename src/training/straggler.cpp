#include "training/straggler.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <set>

#include "base/log.h"
#include "parallel/host_collectives.h"

namespace mcpp::training {

namespace {

constexpr size_t kFields = 7;  // StragglerRank's doubles, in declaration order

std::vector<double> to_vector(const StragglerRank& r) {
  return {r.rtt_ms, r.data_ms, r.power_w, r.temp_c, r.util_pct, r.clock_mhz, r.etpt_tflops};
}

StragglerRank from_vector(const std::vector<double>& v) {
  return {v.at(0), v.at(1), v.at(2), v.at(3), v.at(4), v.at(5), v.at(6)};
}

// Megatron's two decimals; four below 1 (a CPU run's TFLOP/s would otherwise all read 0.00).
std::string number(double v) {
  return std::abs(v) < 1 ? fmt::format("{:.4f}", v) : fmt::format("{:.2f}", v);
}

std::string now_string() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

// The request's head up to its blank line (or 8 KiB, the client closing, or a second of
// silence). Answering after the first segment would leave a request sent in several writes
// unread, and closing a socket with unread bytes resets the connection: the client loses
// the answer.
void read_request(int c) {
  const timeval second{1, 0};
  (void)::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &second, sizeof second);
  std::string head;
  char buf[1024];
  while (head.size() < 8192 && head.find("\r\n\r\n") == std::string::npos &&
         head.find("\n\n") == std::string::npos) {
    const ssize_t n = ::recv(c, buf, sizeof buf, 0);
    if (n > 0) {
      head.append(buf, size_t(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return;
    }
  }
}

// Half-closes after the answer and reads until the client closes (a second at most), so
// that nothing the client still sends turns the close into a reset.
void close_gracefully(int c) {
  (void)::shutdown(c, SHUT_WR);
  char buf[1024];
  ssize_t n;
  while ((n = ::recv(c, buf, sizeof buf, 0)) > 0 || (n < 0 && errno == EINTR)) {
  }
  ::close(c);
}

}  // namespace

std::vector<std::string> format_straggler_report(const std::vector<StragglerRank>& ranks,
                                                 int64_t minmax_count,
                                                 const std::string& timestamp) {
  struct Field {
    const char* name;
    double StragglerRank::*value;
    const char* unit;
  };
  // Megatron's order: time, power, temperature, utilisation, clock, data time, throughput.
  const Field fields[] = {{"Rtt", &StragglerRank::rtt_ms, "ms"},
                          {"Pwr", &StragglerRank::power_w, "W"},
                          {"Tmp", &StragglerRank::temp_c, "C"},
                          {"Utl", &StragglerRank::util_pct, "%"},
                          {"Clk", &StragglerRank::clock_mhz, "MHz"},
                          {"DRtt", &StragglerRank::data_ms, "ms"},
                          {"Etpt", &StragglerRank::etpt_tflops, "TF"}};
  std::string line = "[" + timestamp + "]";
  for (const Field& f : fields) {
    int lo = -1, hi = -1;  // the first rank holding the minimum / maximum, NaN skipped
    for (size_t r = 0; r < ranks.size(); ++r) {
      const double v = ranks[r].*f.value;
      if (std::isnan(v)) continue;
      if (lo < 0 || v < ranks[size_t(lo)].*f.value) lo = int(r);
      if (hi < 0 || v > ranks[size_t(hi)].*f.value) hi = int(r);
    }
    if (lo < 0) continue;  // no rank can measure it
    line += fmt::format(" | Mn{}/Rnk: {}{}/{} | Mx{}/Rnk: {}{}/{}", f.name,
                        number(ranks[size_t(lo)].*f.value), f.unit, lo, f.name,
                        number(ranks[size_t(hi)].*f.value), f.unit, hi);
  }
  std::vector<std::string> out{line};
  const int64_t world = int64_t(ranks.size());
  if (minmax_count > 1 && minmax_count < world) {
    std::vector<int> order(ranks.size());
    for (size_t r = 0; r < order.size(); ++r) order[r] = int(r);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return ranks[size_t(a)].etpt_tflops < ranks[size_t(b)].etpt_tflops;
    });
    std::string bottom = fmt::format("^^^^ Bottom {} Ranks with lowest  Etpt(TF):", minmax_count);
    std::string top = fmt::format("^^^^ Top    {} Ranks with highest Etpt(TF):", minmax_count);
    for (int64_t i = 0; i < minmax_count; ++i) {
      const int b = order[size_t(i)], t = order[size_t(world - minmax_count + i)];
      bottom += fmt::format(" {}/{},", number(ranks[size_t(b)].etpt_tflops), b);
      top += fmt::format(" {}/{},", number(ranks[size_t(t)].etpt_tflops), t);
    }
    out.push_back(bottom);
    out.push_back(top);
  }
  return out;
}

StragglerDetector::StragglerDetector(const Options& o, comm::Communicator& world,
                                     std::vector<comm::Communicator*> groups)
    : o_(o), world_(world), on_(o.enabled_on_startup) {
  std::set<comm::Communicator*> seen;  // a group of one may share its communicator
  for (comm::Communicator* c : groups)
    if (c && seen.insert(c).second) groups_.push_back(c);
  for (comm::Communicator* c : groups_) c->set_exposed_timing(true);
  if (!o.gpu_pci_bus_id.empty()) {
    std::string why;
    gpu_ = GpuTelemetry::open(o.gpu_pci_bus_id, &why);
    if (!gpu_) log::warn("--log-straggler: no GPU power/temperature/clock readings: {}", why);
  }
  if (world_.rank() == 0 && o.port > 0) listen(o.port);
  restart();
}

StragglerDetector::~StragglerDetector() {
  stopping_ = true;
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  if (controller_.joinable()) controller_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

// Megatron's controller: a TCP listener on every interface of rank 0's host, answering any
// request with a one-line HTTP response. A port that cannot be bound costs only the
// control: the detector runs on, as Megatron's does.
void StragglerDetector::listen(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(uint16_t(port));
  if (fd < 0 || ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(fd, 16) != 0) {
    log::warn("--log-straggler: the detector cannot be switched on and off: port {}: {} "
              "(choose a free one with --straggler-ctrlr-port)",
              port, std::strerror(errno));
    if (fd >= 0) ::close(fd);
    return;
  }
  listen_fd_ = fd, bound_port_ = port;
  log::info("straggler detector: controller ready to receive commands on port {}. Current "
            "state {}",
            port, on_ ? "ON" : "OFF");
  controller_ = std::thread([this] { serve(); });
}

void StragglerDetector::serve() {
  while (!stopping_) {
    const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR) continue;
      return;  // shut down (or the socket failed: the control ends, training goes on)
    }
    read_request(c);
    // Several requests before the next log line make one toggle, as in Megatron.
    toggle_ = true;
    const bool will_be_on = !on_;
    const std::string msg = fmt::format("Will turn StragglerDetector {} at next logging interval",
                                        will_be_on ? "ON" : "OFF");
    const std::string resp = fmt::format(
        "HTTP/1.0 200 OK\r\nConnection: Close\r\nContent-length: {}\r\n\r\n{}", msg.size(), msg);
    (void)::send(c, resp.data(), resp.size(), MSG_NOSIGNAL);
    close_gracefully(c);
    log::info("straggler detector: {}", msg);
  }
}

double StragglerDetector::blocked_seconds() {
  double s = 0;
  for (comm::Communicator* c : groups_) {
    c->collect_timing();  // NCCL: the stalls measured by CUDA events
    for (double b : c->stats().blocked_seconds) s += b;
  }
  return s;
}

void StragglerDetector::data_section(bool start) {
  if (start)
    data_.start();
  else
    data_.stop();
}

void StragglerDetector::restart() {
  blocked_at_start_ = blocked_seconds();
  data_.elapsed(true);
}

void StragglerDetector::interval(double elapsed_s, int64_t iterations,
                                 double flops_per_iteration) {
  const double blocked = blocked_seconds() - blocked_at_start_;
  const double iters = double(std::max<int64_t>(1, iterations));
  if (on_) {
    StragglerRank me;
    me.rtt_ms = std::max(0.0, elapsed_s - blocked) * 1e3 / iters;
    me.data_ms = data_.elapsed(false) * 1e3 / iters;
    const double nan = std::nan("");
    const auto g = gpu_ ? gpu_->sample() : std::nullopt;
    me.power_w = g ? g->power_w : nan, me.temp_c = g ? g->temp_c : nan;
    me.util_pct = g ? g->util_pct : nan, me.clock_mhz = g ? g->clock_mhz : nan;
    me.etpt_tflops = me.rtt_ms > 0 ? flops_per_iteration / double(world_.size()) /
                                         (me.rtt_ms * 1e-3) / 1e12
                                   : 0.0;
    std::vector<uint64_t> bits;
    for (double v : to_vector(me)) bits.push_back(std::bit_cast<uint64_t>(v));
    const auto all = parallel::all_gather_u64(world_, bits);
    if (world_.rank() == 0) {
      std::vector<StragglerRank> ranks;
      for (const auto& r : all) {
        MCPP_CHECK(r.size() == kFields, "internal: a rank sent {} straggler numbers, not {}",
                   r.size(), kFields);
        std::vector<double> v;
        for (uint64_t b : r) v.push_back(std::bit_cast<double>(b));
        ranks.push_back(from_vector(v));
      }
      for (const auto& line : format_straggler_report(ranks, o_.minmax_count, now_string()))
        log::info("{}", line);
    }
  }
  // Rank 0's state after a toggle from its control port reaches every rank here.
  const bool on = on_;
  const uint64_t mine = world_.rank() == 0 && toggle_.exchange(false) ? !on : on;
  const bool next = parallel::all_gather_u64(world_, std::span<const uint64_t>(&mine, 1))
                        .at(0)
                        .at(0) != 0;
  if (next != on && world_.rank() == 0)
    log::info("Toggling StragglerDetector State {}", next ? "ON" : "OFF");
  on_ = next;
  blocked_at_start_ += blocked;
  data_.elapsed(true);
}

}  // namespace mcpp::training
