#include "parallel/pipeline/executor.h"

#include "base/error.h"

namespace mcpp::parallel::pipeline {

void run_stage(const std::vector<Action>& actions, comm::Communicator& acts,
               comm::Communicator& grads, const ExecutorOptions& o, StageCallbacks& cb,
               Stream& st) {
  MCPP_CHECK(acts.size() == grads.size() && acts.rank() == grads.rank(),
             "pipeline executor: the activation and gradient communicators differ ({} vs {})",
             acts.describe(), grads.describe());
  using Key = std::pair<int, int>;  // (microbatch, chunk)
  std::map<Key, Tensor> recv_act, recv_grad;  // received, not consumed yet
  std::map<Key, Tensor> out_act, out_grad;    // produced, not sent yet
  std::vector<comm::Work> pending;
  std::vector<comm::P2POp> on_acts, on_grads;  // the batch being collected, per communicator
  auto take = [](std::map<Key, Tensor>& m, Key k, const char* what) {
    auto it = m.find(k);
    MCPP_CHECK(it != m.end(), "pipeline executor: no {} for micro-batch {} chunk {}", what,
               k.first, k.second);
    Tensor t = it->second;
    m.erase(it);
    return t;
  };
  auto wait_all = [&] {
    for (auto& w : pending) w.wait();
    pending.clear();
  };
  // Posts the collected batch (one batch_isend_irecv per communicator), then waits for it.
  auto post = [&] {
    std::string name;
    if (o.timer) {  // Megatron's names: forward-send-backward-recv, ...
      bool has[4] = {};  // forward-send, backward-send, forward-recv, backward-recv
      for (auto& op : on_acts) has[op.send ? 0 : 2] = true;
      for (auto& op : on_grads) has[op.send ? 1 : 3] = true;
      const char* part[4] = {"forward-send", "backward-send", "forward-recv", "backward-recv"};
      for (int k = 0; k < 4; ++k)
        if (has[k]) {
          if (!name.empty()) name += '-';
          name += part[k];
        }
      if (has[0] && has[1] && has[2] && has[3]) name = "forward-backward-send-forward-backward-recv";
      o.timer(name, true);
    }
    for (auto [c, ops] : {std::pair{&acts, &on_acts}, std::pair{&grads, &on_grads}}) {
      if (ops->empty()) continue;
      for (auto& w : c->batch_isend_irecv(*ops, st)) pending.push_back(std::move(w));
      ops->clear();
    }
    wait_all();
    if (o.timer) o.timer(name, false);
  };
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const Key k{a.microbatch, a.chunk};
    switch (a.op) {
      case Op::Forward: {
        Tensor in;
        if (auto it = recv_act.find(k); it != recv_act.end()) in = take(recv_act, k, "activation");
        Tensor out = cb.forward(a.microbatch, a.chunk, in);
        if (out.defined()) out_act[k] = out;
        break;
      }
      case Op::Backward: {
        Tensor g;
        if (auto it = recv_grad.find(k); it != recv_grad.end()) g = take(recv_grad, k, "gradient");
        Tensor dx = cb.backward(a.microbatch, a.chunk, g);
        if (dx.defined()) out_grad[k] = dx;
        break;
      }
      case Op::SendActivation:
        on_acts.push_back({true, take(out_act, k, "output activation to send"), a.peer_stage});
        break;
      case Op::SendGrad:
        on_grads.push_back({true, take(out_grad, k, "input gradient to send"), a.peer_stage});
        break;
      case Op::RecvActivation: {
        Tensor t = Tensor::empty(o.activation_shape, o.dtype, o.device);
        recv_act[k] = t;
        on_acts.push_back({false, t, a.peer_stage});
        break;
      }
      case Op::RecvGrad: {
        Tensor t = Tensor::empty(o.activation_shape, o.dtype, o.device);
        recv_grad[k] = t;
        on_grads.push_back({false, t, a.peer_stage});
        break;
      }
    }
    // A lone transfer, or the last of its batch: post it and wait before the next action.
    const bool batch_ends = a.batch < 0 || i + 1 == actions.size() ||
                            actions[i + 1].batch != a.batch;
    if (a.op != Op::Forward && a.op != Op::Backward && batch_ends) post();
  }
  wait_all();
  MCPP_CHECK(recv_act.empty() && recv_grad.empty() && out_act.empty() && out_grad.empty(),
             "pipeline executor: the step ended with {} received and {} produced tensors "
             "unconsumed (schedule and model disagree)",
             recv_act.size() + recv_grad.size(), out_act.size() + out_grad.size());
}

}  // namespace mcpp::parallel::pipeline
