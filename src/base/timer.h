// Wall-clock timers, named as Megatron's (`forward-backward`, `optimizer`, ...).
#pragma once
#include <chrono>
#include <map>
#include <string>

namespace mcpp {

class Timer {
 public:
  void start() { t0_ = clock::now(), running_ = true; }
  void stop() {
    if (running_) elapsed_ += std::chrono::duration<double>(clock::now() - t0_).count();
    running_ = false;
  }
  // Seconds accumulated since the last reset; reset=true clears it.
  double elapsed(bool reset = true) {
    bool was = running_;
    stop();
    double e = elapsed_;
    if (reset) elapsed_ = 0;
    if (was) start();
    return e;
  }

 private:
  using clock = std::chrono::steady_clock;
  clock::time_point t0_{};
  double elapsed_ = 0;
  bool running_ = false;
};

class Timers {
 public:
  Timer& operator()(const std::string& name) { return timers_[name]; }
  const std::map<std::string, Timer>& all() const { return timers_; }

 private:
  std::map<std::string, Timer> timers_;
};

}  // namespace mcpp
