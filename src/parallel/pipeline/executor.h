// Runs one pipeline stage's action list (schedule.h) for one training step: the
// compute actions through callbacks (the executor knows no model), the transfers over
// two point-to-point communicators of the pipeline group -- one carrying activations,
// one carrying gradients, so the two directions between a pair of stages can never
// pair up wrongly, whatever the backend (NCCL has no tags).
//
// Transfers sharing an Action::batch are posted together -- one
// Communicator::batch_isend_irecv per communicator, so NCCL runs them as one group -- and
// all waited for before the next action, as Megatron's batch_isend_irecv. A received activation is handed to the
// forward of its (micro-batch, chunk) and a received gradient to the backward; a
// tensor to send comes from the forward's output / the backward's input gradient and
// stays referenced until its batch completes.
#pragma once
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "parallel/pipeline/schedule.h"
#include "tensor/tensor.h"

namespace mcpp::parallel::pipeline {

struct StageCallbacks {
  // Runs the forward of (microbatch, chunk). `input`: the received activation, or
  // undefined where the stage starts the model (chunk 0 of stage 0). Returns the
  // output activation to send (undefined on the model's last chunk).
  std::function<Tensor(int microbatch, int chunk, const Tensor& input)> forward;
  // Runs the backward. `output_grad`: the received gradient, or undefined on the
  // model's last chunk. Returns the input gradient to send (undefined on chunk 0 of
  // stage 0).
  std::function<Tensor(int microbatch, int chunk, const Tensor& output_grad)> backward;
};

struct ExecutorOptions {
  Shape activation_shape;  // what flows between stages: [S/TP(SP) * B, H]
  DType dtype = DType::F32;
  Device device = Device::CPU;
  // Megatron's level-2 pipeline timers around each posted batch of transfers, named by
  // what it holds: "forward-send", "forward-recv", "backward-send-forward-recv", ...
  std::function<void(std::string_view, bool)> timer;
};

// acts / grads: the pipeline group (same ranks, group rank = pipeline stage), twice.
// Throws mcpp::Error when an action finds nothing to consume (a received tensor
// missing, an output to send missing): a schedule/executor mismatch, never a hang.
void run_stage(const std::vector<Action>& actions, comm::Communicator& acts,
               comm::Communicator& grads, const ExecutorOptions& opts, StageCallbacks& cb,
               Stream& stream);

}  // namespace mcpp::parallel::pipeline
