// --dist-ckpt-strictness: what a load does when the model's keys and the checkpoint's differ
// (Megatron's StrictHandling, megatron/core/dist_checkpointing/validation.py). In Megatron's
// words an "unexpected" key is one the model asks for and the checkpoint lacks; a "missing"
// key is one the checkpoint holds and the model does not ask for. A key present in both with
// different shapes is an error in every mode. docs/checkpoint.md, "Mismatched keys".
#pragma once

#include <string>
#include <vector>

namespace mcpp::checkpoint {

enum class Strictness {
  AssumeOkUnexpected,  // Megatron's default: unexpected keys fail the load (so do missing ones)
  LogUnexpected,       // unexpected: warned, not loaded (initial values); missing: ignored
  LogAll,              // both warned; unexpected not loaded
  RaiseUnexpected,     // unexpected: an error before anything loads; missing: ignored
  RaiseAll,            // any mismatch: an error before anything loads
  IgnoreAll,           // both ignored silently; unexpected not loaded
};

// Megatron's value names. return_unexpected / return_all are refused with a HINT (Megatron's
// loader hands the keys back to a caller; a training run has none to hand them to).
Strictness parse_strictness(const std::string& s);
const char* to_string(Strictness s);

enum class KeyAction { Raise, Warn, Ignore };
// Parameters and buffers the model asks for that the checkpoint lacks.
KeyAction unexpected_action(Strictness s);
// Tensors of the checkpoint this model does not have.
KeyAction missing_action(Strictness s);
// Whether the model may differ from the checkpoint's by switches that only add or remove keys
// (layers, biases, q/k norms, tied output, expert bias, shared-expert gate): every mode but
// the two that raise on both kinds; the keys themselves are then checked by the mode's rule.
inline bool key_set_may_differ(Strictness s) {
  return s != Strictness::AssumeOkUnexpected && s != Strictness::RaiseAll;
}

// Raises or warns about `keys` (unexpected ones when `unexpected`) loading `where`: the first
// few names and a count, the flag and what to pass instead. `what` says what they are
// ("parameter", "buffer").
void report_keys(Strictness s, bool unexpected, const std::vector<std::string>& keys,
                 const std::string& what, const std::string& where);

}  // namespace mcpp::checkpoint
