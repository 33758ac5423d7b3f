// TcpMesh: rendezvous, connections and the mailbox (see tcp_mesh.h). POSIX sockets only.
//
// Wire formats (every field little-endian or text; all ranks run the same binary):
//   rendezvous hello, rank r -> rank 0, 128 bytes of text: "MCPP-RDZV 1 <rank> <size> <port>
//   <host>" address table, rank 0 -> rank r, size x 128 bytes of text: "<host> <port>" peer hello,
//   rank r -> rank j < r, 128 bytes of text: "MCPP-PEER 1 <rank>" frame: u32 magic, u32 0, u64
//   channel, u64 tag, u64 length, then length bytes.
#include "comm/tcp/tcp_mesh.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <sstream>

#include "base/error.h"
#include "base/log.h"

namespace mcpp::comm {
namespace {

constexpr size_t kHello = 128;
constexpr uint32_t kFrameMagic = 0x4d435050;  // "MCPP"
constexpr uint64_t kGoodbye = ~uint64_t(0);   // channel of the frame sent before closing
struct FrameHeader {
  uint32_t magic, zero;
  uint64_t channel, tag, length;
};

using Clock = TcpMesh::Clock;
std::string err_text(int e) { return std::strerror(e); }
int ms_left(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms <= 0 ? 0 : ms > 1000 ? 1000 : int(ms);  // wake at least every second
}
double seconds(std::chrono::milliseconds t) { return double(t.count()) / 1000.0; }

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // Sends give up at least once a second, so a deadline is checked (see write_all).
  timeval tv{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// Listening socket on every interface; port 0 picks a free one. Returns -1 and sets err.
int listen_on(int port, int backlog, std::string& err) {
  for (int family : {AF_INET6, AF_INET}) {
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage ss{};
    socklen_t len;
    if (family == AF_INET6) {
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // IPv4 too
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6, a->sin6_addr = in6addr_any, a->sin6_port = htons(uint16_t(port));
      len = sizeof *a;
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET, a->sin_addr.s_addr = htonl(INADDR_ANY);
      a->sin_port = htons(uint16_t(port));
      len = sizeof *a;
    }
    if (bind(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0 && listen(fd, backlog) == 0) return fd;
    err = err_text(errno);
    close(fd);
    if (err.find("in use") != std::string::npos) break;  // IPv4 would say the same
  }
  return -1;
}

int local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                  : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

// Numeric address of this end of a connected socket: the interface that reaches the peer.
std::string local_host(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  char host[NI_MAXHOST] = "";
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 ||
      getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, nullptr, 0,
                  NI_NUMERICHOST) != 0)
    return "127.0.0.1";
  std::string h = host;
  if (h.rfind("::ffff:", 0) == 0 && h.find('.') != std::string::npos) h = h.substr(7);
  return h;
}

// One attempt to connect to host:port. Returns the socket or -1 with err set.
int connect_once(const std::string& host, int port, std::string& err) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC, hints.ai_socktype = SOCK_STREAM;
  std::string h = host.size() > 2 && host.front() == '[' ? host.substr(1, host.size() - 2) : host;
  if (int rc = getaddrinfo(h.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    err = fmt::format("cannot resolve host '{}': {}", host, gai_strerror(rc));
    return -1;
  }
  int fd = -1;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
    err = err_text(errno);
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  return fd;
}

// Connects, retrying until the deadline (the listener may not be up yet).
int connect_until(const std::string& host, int port, Clock::time_point deadline, std::string& err) {
  for (auto nap = std::chrono::milliseconds(20);; nap = std::min(nap * 2, decltype(nap)(500))) {
    int fd = connect_once(host, port, err);
    if (fd >= 0) return fd;
    if (Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(nap);
  }
}

// Reads exactly n bytes; false on end of stream, an error or the deadline (err says which).
bool read_until(int fd, void* p, size_t n, Clock::time_point deadline, std::string& err) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    int rc = poll(&pf, 1, ms_left(deadline));
    if (rc == 0) {
      if (Clock::now() >= deadline) return err = "timed out", false;
      continue;
    }
    if (rc < 0 && errno == EINTR) continue;
    ssize_t got = recv(fd, c, n, 0);
    if (got == 0) return err = "the connection was closed", false;
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return err = err_text(errno), false;
    }
    c += got, n -= size_t(got);
  }
  return true;
}

// Writes exactly n bytes. Returns 0, or the errno (ETIMEDOUT past the deadline).
int write_all(int fd, const void* p, size_t n, Clock::time_point deadline) {
  auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t put = ::send(fd, c, n, MSG_NOSIGNAL);
    if (put < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {  // SO_SNDTIMEO: the peer is not reading
        if (Clock::now() >= deadline) return ETIMEDOUT;
        continue;
      }
      return errno;
    }
    c += put, n -= size_t(put);
  }
  return 0;
}

std::string padded(const std::string& s) {
  MCPP_CHECK(s.size() < kHello, "internal: rendezvous message too long: {}", s);
  std::string out = s;
  out.resize(kHello, '\0');
  return out;
}
std::string unpad(const char* p) { return std::string(p, strnlen(p, kHello)); }

constexpr const char* kRdzvHint =
    "start all WORLD_SIZE processes with the same MASTER_ADDR and MASTER_PORT, rank 0 on "
    "MASTER_ADDR's host, and let the firewall pass that port and the ranks' ephemeral ports; "
    "--distributed-timeout-minutes bounds the wait (docs/launch.md)";

}  // namespace

TcpMesh::TcpMesh(int rank, int size)
    : rank_(rank),
      addrs_(size_t(size)),
      fds_(size_t(size), -1),
      lost_(size_t(size)),
      said_bye_(size_t(size), false) {
  for (int i = 0; i < size; ++i) send_mu_.push_back(std::make_unique<std::mutex>());
}

std::shared_ptr<TcpMesh> TcpMesh::connect(const Options& o) {
  std::shared_ptr<TcpMesh> m(new TcpMesh(o.rank, o.size));
  auto deadline = Clock::now() + o.timeout;
  const std::string rdzv = fmt::format("{}:{}", o.master_addr, o.port);
  std::string err;
  // This rank's own listener, for the ranks above it.
  int data = listen_on(0, o.size, err);
  MCPP_CHECK(data >= 0, "rank {}: cannot open a listening TCP socket: {}", o.rank, err);
  struct Closer {
    std::vector<int> fds;
    ~Closer() {
      for (int fd : fds) close(fd);
    }
  } temp{{data}};

  if (o.rank == 0) {
    int lst = listen_on(o.port, o.size, err);
    MCPP_CHECK_HINT(lst >= 0,
                    "choose a free MASTER_PORT (or MCPP_RENDEZVOUS_PORT), or stop the process "
                    "that holds it",
                    "rank 0 cannot listen on port {} for the rendezvous of {} ranks: {}", o.port,
                    o.size, err);
    temp.fds.push_back(lst);
    std::vector<int> peer(size_t(o.size), -1);
    int arrived = 1;
    while (arrived < o.size) {
      pollfd pf{lst, POLLIN, 0};
      if (poll(&pf, 1, ms_left(deadline)) <= 0) {
        if (Clock::now() < deadline) continue;
        std::vector<int> missing;
        for (int r = 1; r < o.size; ++r)
          if (peer[size_t(r)] < 0) missing.push_back(r);
        MCPP_FAIL(
            "rendezvous at {} (port {} on every interface of rank 0): rank(s) [{}] of {} "
            "did not connect within {:.1f} s.\n  HINT: {}",
            rdzv, o.port, fmt::join(missing, ", "), o.size, seconds(o.timeout), kRdzvHint);
      }
      int fd = accept4(lst, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      temp.fds.push_back(fd);
      char buf[kHello];
      // Our ranks say hello as soon as they connect; a silent stray connection gets a few
      // seconds, not the whole rendezvous.
      const auto hello_by = std::min(deadline, Clock::now() + std::chrono::seconds(10));
      if (!read_until(fd, buf, kHello, hello_by, err)) continue;
      std::istringstream in(unpad(buf));
      std::string magic, host;
      int version = 0, r = -1, size = -1, port = -1;
      in >> magic >> version >> r >> size >> port >> host;
      if (magic != "MCPP-RDZV" || version != 1) continue;  // not one of ours
      MCPP_CHECK_HINT(size == o.size, kRdzvHint,
                      "rendezvous at {}: rank {} (from {}) has WORLD_SIZE={}, rank 0 has {}", rdzv,
                      r, host, size, o.size);
      MCPP_CHECK_HINT(r >= 1 && r < o.size && peer[size_t(r)] < 0, kRdzvHint,
                      "rendezvous at {}: a second process (from {}) says it is rank {}: every "
                      "process needs its own RANK",
                      rdzv, host, r);
      peer[size_t(r)] = fd;
      m->addrs_[size_t(r)] = fmt::format("{}:{}", host, port);
      ++arrived;
    }
    m->addrs_[0] = fmt::format("{}:{}", o.master_addr, local_port(data));
    std::string table;
    for (const std::string& a : m->addrs_) {
      auto colon = a.rfind(':');
      table += padded(a.substr(0, colon) + " " + a.substr(colon + 1));
    }
    for (int r = 1; r < o.size; ++r) {
      int e = write_all(peer[size_t(r)], table.data(), table.size(), deadline);
      MCPP_CHECK(e == 0, "rendezvous at {}: cannot send the address table to rank {} ({}): {}",
                 rdzv, r, m->addrs_[size_t(r)], err_text(e));
    }
  } else {
    int fd = connect_until(o.master_addr, o.port, deadline, err);
    MCPP_CHECK_HINT(fd >= 0, kRdzvHint,
                    "rank {}: cannot reach rank 0's rendezvous at {} (MASTER_ADDR:port) within "
                    "{:.1f} s: {}",
                    o.rank, rdzv, seconds(o.timeout), err);
    temp.fds.push_back(fd);
    set_nodelay(fd);
    const std::string me = local_host(fd);
    std::string hello =
        padded(fmt::format("MCPP-RDZV 1 {} {} {} {}", o.rank, o.size, local_port(data), me));
    int e = write_all(fd, hello.data(), hello.size(), deadline);
    MCPP_CHECK(e == 0, "rank {}: cannot write to rank 0's rendezvous at {}: {}", o.rank, rdzv,
               err_text(e));
    std::vector<char> table(kHello * size_t(o.size));
    MCPP_CHECK_HINT(read_until(fd, table.data(), table.size(), deadline, err), kRdzvHint,
                    "rank {}: rank 0's rendezvous at {} did not complete within {:.1f} s ({}): "
                    "another rank is missing or was refused; rank 0's output says which",
                    o.rank, rdzv, seconds(o.timeout), err);
    for (int r = 0; r < o.size; ++r) {
      std::istringstream in(unpad(table.data() + kHello * size_t(r)));
      std::string host;
      int port = -1;
      in >> host >> port;
      m->addrs_[size_t(r)] = fmt::format("{}:{}", host, port);
    }
  }

  // The mesh: connect down, accept up. Everybody has arrived: a fresh deadline, so a
  // rendezvous that waited long for slow starters leaves the connections their time.
  deadline = Clock::now() + o.timeout;
  for (int j = 0; j < o.rank; ++j) {
    const std::string& a = m->addrs_[size_t(j)];
    auto colon = a.rfind(':');
    int fd = connect_until(a.substr(0, colon), std::stoi(a.substr(colon + 1)), deadline, err);
    MCPP_CHECK_HINT(fd >= 0, kRdzvHint,
                    "rank {}: cannot connect to rank {} at {} within {:.1f} s: {}", o.rank, j, a,
                    seconds(o.timeout), err);
    m->fds_[size_t(j)] = fd;
    std::string hello = padded(fmt::format("MCPP-PEER 1 {}", o.rank));
    int e = write_all(fd, hello.data(), hello.size(), deadline);
    MCPP_CHECK(e == 0, "rank {}: cannot write to rank {} at {}: {}", o.rank, j, a, err_text(e));
  }
  for (int n = o.size - 1 - o.rank; n > 0;) {
    pollfd pf{data, POLLIN, 0};
    if (poll(&pf, 1, ms_left(deadline)) <= 0) {
      if (Clock::now() < deadline) continue;
      std::vector<std::string> missing;
      for (int r = o.rank + 1; r < o.size; ++r)
        if (m->fds_[size_t(r)] < 0)
          missing.push_back(fmt::format("{} ({})", r, m->addrs_[size_t(r)]));
      MCPP_FAIL(
          "rank {}: rank(s) {} did not connect to this rank's port {} within {:.1f} s.\n  "
          "HINT: {}",
          o.rank, fmt::join(missing, ", "), local_port(data), seconds(o.timeout), kRdzvHint);
    }
    int fd = accept4(data, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    char buf[kHello];
    std::string magic;
    int version = 0, r = -1;
    if (read_until(fd, buf, kHello, std::min(deadline, Clock::now() + std::chrono::seconds(10)),
                   err))
      std::istringstream(unpad(buf)) >> magic >> version >> r;
    if (magic != "MCPP-PEER" || version != 1 || r <= o.rank || r >= o.size ||
        m->fds_[size_t(r)] >= 0) {
      close(fd);  // not one of ours
      continue;
    }
    m->fds_[size_t(r)] = fd;
    --n;
  }
  for (int fd : m->fds_)
    if (fd >= 0) set_nodelay(fd);
  MCPP_CHECK(pipe2(m->wake_, O_CLOEXEC) == 0, "pipe: {}", err_text(errno));
  m->reader_ = std::thread([p = m.get()] { p->reader_loop(); });
  log::debug("TCP mesh: rank {} of {} connected ({})", o.rank, o.size, fmt::join(m->addrs_, ", "));
  return m;
}

void TcpMesh::mark_lost(int r, std::string why) {
  std::lock_guard<std::mutex> l(mu_);
  if (lost_[size_t(r)].empty()) lost_[size_t(r)] = std::move(why);
  cv_.notify_all();
}

std::string TcpMesh::lost_reason(int r) const {
  std::lock_guard<std::mutex> l(mu_);
  return lost_[size_t(r)];
}

void TcpMesh::reader_loop() {
  const auto forever = Clock::time_point::max();
  std::vector<bool> live(fds_.size());
  for (size_t r = 0; r < fds_.size(); ++r) live[r] = fds_[r] >= 0;
  for (;;) {
    std::vector<pollfd> pf{{wake_[0], POLLIN, 0}};
    std::vector<int> who{-1};
    for (size_t r = 0; r < fds_.size(); ++r)
      if (live[r]) pf.push_back({fds_[r], POLLIN, 0}), who.push_back(int(r));
    if (poll(pf.data(), pf.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (pf[0].revents) return;
    for (size_t i = 1; i < pf.size(); ++i) {
      if (!pf[i].revents) continue;
      const int r = who[i];
      std::string err;
      FrameHeader h{};
      bool ok = read_until(pf[i].fd, &h, sizeof h, forever, err);
      if (ok && h.magic != kFrameMagic) ok = false, err = "a frame with a bad header";
      std::vector<char> body;
      if (ok) {
        body.resize(h.length);
        ok = read_until(pf[i].fd, body.data(), body.size(), forever, err);
      }
      if (!ok) {
        live[size_t(r)] = false;
        bool expected;
        {
          std::lock_guard<std::mutex> l(mu_);
          expected = closing_ || said_bye_[size_t(r)];
        }
        mark_lost(r, expected ? "it finished and closed its connection" : err);
        if (!expected) {
          // Like a launcher that ends an MPI job when one rank dies: a rank that is not
          // communicating right now would otherwise never notice and outlive the job.
          std::fprintf(stderr,
                       "[rank %d] ERROR: world rank %d (%s) closed its connection without "
                       "finishing (%s): it exited or crashed, so this rank stops too.\n",
                       rank_, r, addrs_[size_t(r)].c_str(), err.c_str());
          abort_process();
        }
        continue;
      }
      std::lock_guard<std::mutex> l(mu_);
      if (h.channel == kGoodbye) {
        said_bye_[size_t(r)] = true;
        continue;
      }
      mailbox_[Key{r, h.channel, h.tag}] = std::move(body);
      cv_.notify_all();
    }
  }
}

TcpMesh::Status TcpMesh::send(int to, uint64_t channel, uint64_t tag, const void* p, size_t n,
                              Clock::time_point deadline) {
  if (to == rank_) {
    std::lock_guard<std::mutex> l(mu_);
    auto* c = static_cast<const char*>(p);
    mailbox_[Key{to, channel, tag}] = std::vector<char>(c, c + n);
    cv_.notify_all();
    return Status::Ok;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!lost_[size_t(to)].empty()) return Status::Lost;
  }
  FrameHeader h{kFrameMagic, 0, channel, tag, n};
  std::lock_guard<std::mutex> l(*send_mu_[size_t(to)]);
  int e = write_all(fds_[size_t(to)], &h, sizeof h, deadline);
  if (e == 0) e = write_all(fds_[size_t(to)], p, n, deadline);
  if (e == 0) return Status::Ok;
  if (e == ETIMEDOUT) return Status::Timeout;
  mark_lost(to, err_text(e));
  return Status::Lost;
}

TcpMesh::Status TcpMesh::take(int from, uint64_t channel, uint64_t tag, std::vector<char>& out,
                              Clock::time_point deadline) {
  std::unique_lock<std::mutex> l(mu_);
  const Key k{from, channel, tag};
  auto ready = [&] { return mailbox_.count(k) || !lost_[size_t(from)].empty(); };
  cv_.wait_until(l, deadline, ready);
  if (auto it = mailbox_.find(k); it != mailbox_.end()) {
    out = std::move(it->second);
    mailbox_.erase(it);
    return Status::Ok;
  }
  return lost_[size_t(from)].empty() ? Status::Timeout : Status::Lost;
}

void TcpMesh::abort_process() {
  for (int fd : fds_)
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

TcpMesh::~TcpMesh() {
  // Half-close, then let the reader drain until every peer has closed too: closing a
  // socket with unread bytes would reset the connection and could destroy the last
  // message a slower peer has not read yet.
  {
    std::lock_guard<std::mutex> l(mu_);
    closing_ = true;
  }
  for (int r = 0; r < size(); ++r)
    if (fds_[size_t(r)] >= 0) {
      FrameHeader bye{kFrameMagic, 0, kGoodbye, 0, 0};
      std::lock_guard<std::mutex> l(*send_mu_[size_t(r)]);
      write_all(fds_[size_t(r)], &bye, sizeof bye, Clock::now() + std::chrono::seconds(5));
      shutdown(fds_[size_t(r)], SHUT_WR);
    }
  if (reader_.joinable()) {  // else connect() failed half-way: nothing to drain
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, std::chrono::seconds(30), [&] {
      for (size_t r = 0; r < fds_.size(); ++r)
        if (fds_[r] >= 0 && lost_[r].empty()) return false;
      return true;
    });
  }
  if (reader_.joinable()) {
    [[maybe_unused]] ssize_t w = write(wake_[1], "x", 1);
    reader_.join();
  }
  for (int fd : fds_)
    if (fd >= 0) close(fd);
  for (int fd : wake_)
    if (fd >= 0) close(fd);
}

}  // namespace mcpp::comm
