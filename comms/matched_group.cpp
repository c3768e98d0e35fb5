#include "comms/matched_group.hpp"

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

namespace dpactor {
namespace {

// The calls of one group: matched across ranks by their sequence number.
struct world {
  world(int ranks, std::shared_ptr<call_carrier> carrier) : ranks(ranks), carrier(std::move(carrier)) {}
  const int ranks;
  std::shared_ptr<call_carrier> carrier;
  std::mutex mutex;
  std::deque<matched_call> calls;  // calls[0] is call number `completed`
  std::size_t completed = 0;       // calls carried out (or failed)
  std::optional<std::size_t> failed;  // the number of the first call the ranks disagreed on
  bool aborted = false;  // once any driver is aborted, no call is carried out

  // Adds this rank's part of call `seq`; the last rank to arrive hands it
  // to the carrier.
  void arrive(std::size_t seq, const std::function<void(matched_call&)>& fill, char kind, std::size_t n) {
    std::lock_guard lock(mutex);
    while (calls.size() <= seq - completed) {
      calls.emplace_back();
      matched_call& c = calls.back();
      c.data.assign(static_cast<std::size_t>(ranks), nullptr);
      c.after.assign(static_cast<std::size_t>(ranks), nullptr);
      c.buffers.resize(static_cast<std::size_t>(ranks));
      c.own.resize(static_cast<std::size_t>(ranks));
    }
    matched_call& c = calls[seq - completed];
    if (c.arrived == 0) {
      c.kind = kind;
      c.n = n;
    } else if (c.kind != kind || c.n != n) {
      c.mismatch = true;
    }
    fill(c);
    if (++c.arrived < ranks) return;
    // Calls complete in order: every rank enqueued the earlier ones first.
    // An aborted rank may have freed its memory: nothing is carried out.
    if (aborted) return;
    if (c.mismatch && !failed) failed = completed;
    else if (!failed) carrier->carry_out(completed, c);
    calls.pop_front();
    ++completed;
  }
};

class matched_driver final : public collective_driver {
 public:
  matched_driver(std::shared_ptr<world> w, int rank) : world_(std::move(w)), rank_(rank) {}

  void all_reduce_sum(float* data, std::size_t n) override { all_reduce_sum_after(data, n, nullptr); }
  void all_reduce_sum_after(float* data, std::size_t n, void* after) override {
    world_->arrive(seq_++, [&](matched_call& c) {
      c.data[r()] = data;
      c.after[r()] = after;
    }, 'r', n);
  }
  void broadcast(float* data, std::size_t n, int root) override {
    world_->arrive(seq_++, [&](matched_call& c) {
      c.data[r()] = data;
      if (c.arrived == 0) c.root = root;
      else if (c.root != root) c.mismatch = true;
    }, 'b', n);
  }
  void all_gather_chunks(std::span<const std::span<float>> buffers,
                         std::span<const std::pair<std::size_t, std::size_t>> chunks) override {
    world_->arrive(seq_++, [&](matched_call& c) {
      c.buffers[r()].assign(buffers.begin(), buffers.end());
      if (c.arrived == 0) c.chunks.assign(chunks.begin(), chunks.end());
      else if (!std::equal(chunks.begin(), chunks.end(), c.chunks.begin(), c.chunks.end())) c.mismatch = true;
    }, 'g', buffers.size());
  }
  void reduce_tree(std::span<const int> roots, std::span<float* const> own, std::span<const tree_step> steps,
                   float* out, std::size_t n) override {
    world_->arrive(seq_++, [&](matched_call& c) {
      c.data[r()] = out;
      c.own[r()].assign(own.begin(), own.end());
      if (c.arrived == 0) {
        c.roots.assign(roots.begin(), roots.end());
        c.steps.assign(steps.begin(), steps.end());
      } else if (!std::equal(roots.begin(), roots.end(), c.roots.begin(), c.roots.end()) ||
                 steps.size() != c.steps.size()) {
        c.mismatch = true;
      }
      for (std::size_t i = 0; i < own.size() && n > 0; ++i)  // an empty part may have no address
        if ((own[i] != nullptr) != (roots[i] == rank_)) c.mismatch = true;
    }, 't', n);
  }
  // Work carried out before an abort stands, as with NCCL (the driver notes
  // whether its work was done when it is aborted).
  state poll(std::string& error) override {
    std::lock_guard lock(world_->mutex);
    // A call the ranks disagreed on is not carried out, and breaks the
    // group: it and every later one fail.
    if (world_->failed && seq_ > *world_->failed) {
      error = "ranks called with different arguments";
      return state::failed;
    }
    if (world_->completed >= seq_) {
      try {
        return seq_ == 0 || world_->carrier->finished(seq_ - 1) ? state::done : state::pending;
      } catch (const std::exception& e) {  // the device failed: the endpoint aborts the group
        error = e.what();
        return state::failed;
      }
    }
    if (aborted_ || world_->aborted) {
      error = "aborted";
      return state::failed;
    }
    return state::pending;
  }
  // Under the world's lock: no call is being carried out on return, none
  // will be, and the carrier's work in flight has drained (See Note [Posted
  // memory outlives an abort]).
  void abort() noexcept override {
    std::lock_guard lock(world_->mutex);
    aborted_ = true;
    world_->aborted = true;
    world_->carrier->drain();
  }

 private:
  std::size_t r() const noexcept { return static_cast<std::size_t>(rank_); }

  std::shared_ptr<world> world_;
  int rank_;
  std::size_t seq_ = 0;  // calls this rank has enqueued
  std::atomic<bool> aborted_{false};
};

}  // namespace

std::shared_ptr<collective_group> make_matched_group(int ranks, std::shared_ptr<call_carrier> carrier) {
  auto w = std::make_shared<world>(ranks, std::move(carrier));
  return make_driver_group(ranks, [w](int rank, int, const std::atomic<bool>&) {
    return std::make_unique<matched_driver>(w, rank);
  });
}

}  // namespace dpactor
