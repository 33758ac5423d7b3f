// TcpMesh: the processes of a torchrun-style job, every pair joined by one TCP connection.
//
// Rendezvous (connect()): rank 0 listens on MASTER_ADDR's rendezvous port; every other
// rank connects there (retrying until the deadline, since rank 0 may start later), says
// who it is and where its own listening socket is; rank 0 checks that all WORLD_SIZE ranks
// came, each once, with the same WORLD_SIZE, and sends everybody the table of addresses.
// Then rank r connects to every rank below it and accepts every rank above it. A rank that
// never arrives, a port already taken or a peer that cannot be reached is an error naming
// the rank and the address, raised within the timeout.
//
// Messages: frames (channel, tag, length, bytes). A reader thread takes every frame off
// every connection as soon as it arrives into a mailbox keyed by (source rank, channel,
// tag), so a send never waits for the receiver's program to post its receive: two ranks
// may send to each other at once, or around a ring, without deadlocking. A connection that
// closes marks its peer lost; whoever waits for that peer fails at once rather than at the
// timeout. A rank that closes normally (the destructor) says goodbye first; a connection
// that ends without one means the peer died, and this process stops too (exit status 1),
// so that no rank of a broken job lives on, as under mpirun.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace mcpp::comm {

class TcpMesh {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    std::string master_addr;  // host of rank 0 (name or number)
    int port = 0;             // rank 0's rendezvous port
    int rank = 0, size = 1;
    std::chrono::milliseconds timeout{600000};
  };
  static std::shared_ptr<TcpMesh> connect(const Options& o);
  ~TcpMesh();  // half-closes every connection and waits (bounded) for the peers to do so
  TcpMesh(const TcpMesh&) = delete;
  TcpMesh& operator=(const TcpMesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return int(addrs_.size()); }
  const std::string& address(int r) const { return addrs_[size_t(r)]; }  // "host:port"

  enum class Status { Ok, Timeout, Lost };
  // Sends n bytes to world rank `to` (itself included) on (channel, tag). Returns once the
  // kernel holds them; Lost when the connection is gone, Timeout past `deadline`.
  Status send(int to, uint64_t channel, uint64_t tag, const void* p, size_t n,
              Clock::time_point deadline);
  // The message from `from` on (channel, tag): waits until it arrived, the peer is lost,
  // or the deadline passed (deadline = now: only looks).
  Status take(int from, uint64_t channel, uint64_t tag, std::vector<char>& out,
              Clock::time_point deadline);
  std::string lost_reason(int r) const;
  // Closes every connection at once (peers see it immediately) and ends the process with
  // exit status 1: the abort of a job without MPI.
  [[noreturn]] void abort_process();

 private:
  TcpMesh(int rank, int size);
  void reader_loop();
  void mark_lost(int r, std::string why);

  int rank_;
  std::vector<std::string> addrs_;
  std::vector<int> fds_;  // by peer rank; -1 for this rank
  std::vector<std::unique_ptr<std::mutex>> send_mu_;
  int wake_[2] = {-1, -1};  // pipe that stops the reader thread

  using Key = std::tuple<int, uint64_t, uint64_t>;  // source, channel, tag
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, std::vector<char>> mailbox_;
  std::vector<std::string> lost_;  // by rank: why the connection ended ("" while alive)
  std::vector<bool> said_bye_;     // by rank: it announced a normal close
  std::thread reader_;
  bool closing_ = false;
};

}  // namespace mcpp::comm
