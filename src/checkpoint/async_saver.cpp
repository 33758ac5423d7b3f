#include "checkpoint/async_saver.h"

#include <vector>

#include "base/error.h"
#include "base/log.h"

namespace mcpp::checkpoint {

AsyncSaver::~AsyncSaver() {
  try {
    wait();
  } catch (const std::exception& e) {
    log::error("asynchronous checkpoint save failed: {}", e.what());
  }
}

void AsyncSaver::join_and_rethrow() {
  if (worker_.joinable()) worker_.join();
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> g(mu_);
    std::swap(e, error_);
  }
  if (e) std::rethrow_exception(e);
}

bool AsyncSaver::in_flight() {
  std::lock_guard<std::mutex> g(mu_);
  return !done_;
}

bool AsyncSaver::poll() {
  if (in_flight()) return false;
  join_and_rethrow();
  return true;
}

void AsyncSaver::wait() { join_and_rethrow(); }

void AsyncSaver::save(const std::string& save_dir, const model::ParamStore& params,
                      const optim::AdamW* opt, const TrainingState& st, const SaveOptions& opts) {
  RankSnapshot r = RankSnapshot::view(params, opt);
  save(save_dir, std::span<const RankSnapshot>(&r, 1), st, opts);
}

void AsyncSaver::save(const std::string& save_dir, std::span<const RankSnapshot> ranks,
                      const TrainingState& st, const SaveOptions& opts) {
  join_and_rethrow();  // at most one in flight; surface the previous save's error first
  std::vector<RankSnapshot> snap;
  snap.reserve(ranks.size());
  for (const auto& r : ranks) snap.push_back(r.clone());
  {
    std::lock_guard<std::mutex> g(mu_);
    done_ = false;
  }
  worker_ = std::thread([this, save_dir, snap = std::move(snap), st, opts]() {
    std::exception_ptr err;
    try {
      save_checkpoint(save_dir, std::span<const RankSnapshot>(snap), st, opts);
    } catch (...) {
      err = std::current_exception();
    }
    std::lock_guard<std::mutex> g(mu_);
    error_ = err;
    done_ = true;
  });
}

void AsyncSaver::start(std::function<nlohmann::json()> write, PendingCommit commit) {
  join_and_rethrow();
  MCPP_CHECK(!pending_, "an asynchronous save is pending: finalize it before the next");
  pending_ = std::move(commit);
  records_ = nlohmann::json();
  {
    std::lock_guard<std::mutex> g(mu_);
    done_ = false;
  }
  worker_ = std::thread([this, write = std::move(write)]() {
    std::exception_ptr err;
    nlohmann::json rec;
    try {
      rec = write();
    } catch (...) {
      err = std::current_exception();
    }
    std::lock_guard<std::mutex> g(mu_);
    records_ = std::move(rec);
    error_ = err;
    done_ = true;
  });
}

std::pair<nlohmann::json, AsyncSaver::PendingCommit> AsyncSaver::take(std::string& error) {
  MCPP_CHECK(pending_, "no asynchronous save is pending");
  error.clear();
  try {
    join_and_rethrow();
  } catch (const std::exception& e) {
    error = e.what();
  }
  PendingCommit c = std::move(*pending_);
  pending_.reset();
  return {std::move(records_), std::move(c)};
}

}  // namespace mcpp::checkpoint
