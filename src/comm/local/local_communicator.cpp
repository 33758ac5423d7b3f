#include "comm/local/local_communicator.h"

#include <cstdlib>

#include "ops/ops.h"

namespace mcpp::comm {

struct LocalCommunicator::Pending : WorkImpl {
  Tensor buf;  // send: the source; recv: the destination
  OpDesc desc;
  bool done = false;
  bool test() override { return done; }
  void wait() override {
    // One thread owns a communicator, so an unmatched send/recv to oneself can
    // never complete: say so now instead of waiting for the timeout.
    MCPP_CHECK_HINT(done, "post the matching send_async/recv_async before waiting",
                    "{} #{} ({}) to itself in a group of one has no matching call and would "
                    "never complete",
                    op_name(desc.kind), desc.seq, desc.detail);
  }
};

LocalCommunicator::LocalCommunicator(std::string name, int world_rank, Duration timeout,
                                     std::function<void()> abort)
    : Communicator(std::move(name), {world_rank}, 0, timeout), abort_(std::move(abort)) {}

Work LocalCommunicator::start_all_reduce(Tensor&, ReduceOp, const OpDesc&, Stream&) { return {}; }
Work LocalCommunicator::start_all_gather(const Tensor& in, Tensor& out, const OpDesc&, Stream& s) {
  if (!gathers_in_place(in, out)) ops::copy(in, out, s);  // in place: out already is in
  return {};
}
Work LocalCommunicator::start_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp, const OpDesc&,
                                             Stream& s) {
  ops::copy(in, out, s);
  return {};
}
Work LocalCommunicator::start_all_to_all(const Tensor& in, Tensor& out, const OpDesc&, Stream& s) {
  ops::copy(in, out, s);
  return {};
}
Work LocalCommunicator::start_all_to_allv(const Tensor& in, std::vector<int64_t>,
                                          std::vector<int64_t>, Tensor& out, std::vector<int64_t>,
                                          std::vector<int64_t>, const OpDesc&, Stream& s) {
  ops::copy(in, out, s);  // the base checked that both counts cover the whole tensors
  return {};
}
Work LocalCommunicator::start_broadcast(Tensor&, int, const OpDesc&, Stream&) { return {}; }
Work LocalCommunicator::start_barrier(const OpDesc&, Stream&) { return {}; }

Work LocalCommunicator::start_send(const Tensor& t, int, const OpDesc& d, Stream& s) {
  auto p = std::make_shared<Pending>();
  p->buf = t, p->desc = d;
  if (!recvs_.empty()) {
    auto r = recvs_.front();
    recvs_.pop_front();
    MCPP_CHECK(r->buf.nbytes() == t.nbytes(), "send of {} bytes matched a recv of {} bytes",
               t.nbytes(), r->buf.nbytes());
    ops::copy(t, r->buf, s);
    r->done = p->done = true;
  } else {
    sends_.push_back(p);
  }
  return Work(p);
}

Work LocalCommunicator::start_recv(Tensor& t, int, const OpDesc& d, Stream& s) {
  auto p = std::make_shared<Pending>();
  p->buf = t, p->desc = d;
  if (!sends_.empty()) {
    auto snd = sends_.front();
    sends_.pop_front();
    MCPP_CHECK(snd->buf.nbytes() == t.nbytes(), "recv of {} bytes matched a send of {} bytes",
               t.nbytes(), snd->buf.nbytes());
    ops::copy(snd->buf, t, s);
    snd->done = p->done = true;
  } else {
    recvs_.push_back(p);
  }
  return Work(p);
}

void LocalCommunicator::abort_job() const {
  if (abort_) abort_();
  std::abort();
}

}  // namespace mcpp::comm
