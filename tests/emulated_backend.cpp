#include "tests/emulated_backend.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <string>

#include "comms/driver_group.hpp"

namespace dpactor::testing {
namespace {

struct pending_call {
  char kind = 'r';
  std::size_t n = 0;
  int root = 0;
  int arrived = 0;
  bool mismatch = false;
  std::vector<float*> data;                             // per rank ('r', 'b')
  std::vector<std::vector<std::span<float>>> buffers;   // per rank ('g')
  std::vector<std::pair<std::size_t, std::size_t>> chunks;  // buffer-major ('g')
};

// One communicator: calls matched across ranks by their sequence number.
struct world {
  world(int ranks, std::shared_ptr<emulated_log> log) : ranks(ranks), log(std::move(log)) {}
  const int ranks;
  std::shared_ptr<emulated_log> log;
  std::mutex mutex;
  std::deque<pending_call> calls;  // calls[0] is call number `completed`
  std::size_t completed = 0;
  std::optional<std::size_t> failed;  // the number of the first call the ranks disagreed on
  bool aborted = false;  // once any driver is aborted, no call is carried out

  // Adds this rank's part of call `seq`; the last rank to arrive carries it out.
  void arrive(std::size_t seq, int rank, const std::function<void(pending_call&)>& fill, char kind, std::size_t n) {
    std::lock_guard lock(mutex);
    while (calls.size() <= seq - completed) {
      calls.emplace_back();
      calls.back().data.assign(static_cast<std::size_t>(ranks), nullptr);
      calls.back().buffers.resize(static_cast<std::size_t>(ranks));
    }
    pending_call& c = calls[seq - completed];
    if (c.arrived == 0) {
      c.kind = kind;
      c.n = n;
    } else if (c.kind != kind || c.n != n) {
      c.mismatch = true;
    }
    fill(c);
    (void)rank;
    if (++c.arrived < ranks) return;
    // Calls complete in order: every rank enqueued the earlier ones first.
    // An aborted rank may have freed its memory: nothing is carried out.
    if (aborted) return;
    if (c.mismatch && !failed) failed = completed;
    else carry_out(c);
    {
      std::lock_guard log_lock(log->mutex);
      log->calls.emplace_back(c.kind, c.n);
    }
    calls.pop_front();
    ++completed;
  }

  void carry_out(pending_call& c) {
    const auto r = static_cast<std::size_t>(ranks);
    if (c.kind == 'r') {
      std::vector<float> sum(c.n, 0.0f);
      for (std::size_t k = 0; k < r; ++k)
        for (std::size_t i = 0; i < c.n; ++i) sum[i] += c.data[k][i];
      for (std::size_t k = 0; k < r; ++k) std::copy(sum.begin(), sum.end(), c.data[k]);
    } else if (c.kind == 'b') {
      for (std::size_t k = 0; k < r; ++k)
        if (static_cast<int>(k) != c.root) std::copy_n(c.data[static_cast<std::size_t>(c.root)], c.n, c.data[k]);
    } else {
      for (std::size_t b = 0; b < c.n; ++b)
        for (std::size_t from = 0; from < r; ++from) {
          const auto [begin, end] = c.chunks[b * r + from];
          for (std::size_t to = 0; to < r; ++to)
            if (to != from && end > begin)
              std::memcpy(c.buffers[to][b].data() + begin, c.buffers[from][b].data() + begin, (end - begin) * sizeof(float));
        }
    }
  }
};

class emulated_driver final : public collective_driver {
 public:
  emulated_driver(std::shared_ptr<world> w, int rank) : world_(std::move(w)), rank_(rank) {}

  void all_reduce_sum(float* data, std::size_t n) override { reduce(data, n); }
  void all_reduce_sum_after(float* data, std::size_t n, void* after) override {
    if (after != nullptr) throw std::logic_error("emulated backend: CPU replicas have no stream");
    reduce(data, n);
  }
  void broadcast(float* data, std::size_t n, int root) override {
    world_->arrive(seq_++, rank_, [&](pending_call& c) {
      c.data[static_cast<std::size_t>(rank_)] = data;
      if (c.arrived == 0) c.root = root;
      else if (c.root != root) c.mismatch = true;
    }, 'b', n);
  }
  void all_gather_chunks(std::span<const std::span<float>> buffers,
                         std::span<const std::pair<std::size_t, std::size_t>> chunks) override {
    world_->arrive(seq_++, rank_, [&](pending_call& c) {
      c.buffers[static_cast<std::size_t>(rank_)].assign(buffers.begin(), buffers.end());
      if (c.arrived == 0) c.chunks.assign(chunks.begin(), chunks.end());
      else if (!std::equal(chunks.begin(), chunks.end(), c.chunks.begin(), c.chunks.end())) c.mismatch = true;
    }, 'g', buffers.size());
  }
  // Work that completed before an abort stands, as with NCCL (the driver
  // notes whether its work was done when it is aborted).
  state poll(std::string& error) override {
    std::lock_guard lock(world_->mutex);
    // A call the ranks disagreed on is not carried out, and breaks the
    // group: it and every later one fail.
    if (world_->failed && seq_ > *world_->failed) {
      error = "ranks called with different arguments";
      return state::failed;
    }
    if (world_->completed >= seq_) return state::done;
    if (aborted_ || world_->aborted) {
      error = "aborted";
      return state::failed;
    }
    return state::pending;
  }
  // Under the world's lock: no call is being carried out on return, and none
  // will be (See Note [Posted memory outlives an abort]).
  void abort() noexcept override {
    std::lock_guard lock(world_->mutex);
    aborted_ = true;
    world_->aborted = true;
  }

 private:
  void reduce(float* data, std::size_t n) {
    world_->arrive(seq_++, rank_, [&](pending_call& c) { c.data[static_cast<std::size_t>(rank_)] = data; }, 'r', n);
  }

  std::shared_ptr<world> world_;
  int rank_;
  std::size_t seq_ = 0;  // calls this rank has enqueued
  std::atomic<bool> aborted_{false};
};

}  // namespace

std::function<std::shared_ptr<collective_group>(int)> emulated_backend(std::shared_ptr<emulated_log> log) {
  return [log](int ranks) {
    ++log->groups;
    auto w = std::make_shared<world>(ranks, log);
    return make_driver_group(ranks, [w](int rank, int, const std::atomic<bool>&) { return std::make_unique<emulated_driver>(w, rank); });
  };
}

}  // namespace dpactor::testing
