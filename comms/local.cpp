#include "comms/local.hpp"

#include <algorithm>
#include <array>
#include <span>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "comms/spin_barrier.hpp"
#include "tensors/simd.hpp"

namespace dpactor {
namespace {

// Chunk boundaries fall on cache lines so that two ranks never write one line.
constexpr std::size_t chunk_alignment = 16;  // floats
// Floats summed per block: the block's partial sums stay in registers/L1.
constexpr std::size_t reduce_block = 512;

// See collective::chunk: cache-line-aligned parts of ceil(size / ranks).
std::pair<std::size_t, std::size_t> chunk_of(std::size_t size, int ranks, int rank) {
  const auto n = static_cast<std::size_t>(ranks);
  const std::size_t share = (size + n - 1) / n;
  const std::size_t per = (share + chunk_alignment - 1) / chunk_alignment * chunk_alignment;
  const std::size_t begin = std::min(size, per * static_cast<std::size_t>(rank));
  return {begin, std::min(size, begin + per)};
}

// sum[i] = bufs_0[i] + bufs_1[i] + ... in rank order, over [begin, end),
// written to `dst` or, when dst is null, to every buffer.
DPACTOR_MULTIVERSION void sum_in_rank_order(float* const* bufs, int ranks, std::size_t begin, std::size_t end, float* dst) {
  std::array<float, reduce_block> acc;
  for (std::size_t b = begin; b < end; b += reduce_block) {
    const std::size_t len = std::min(reduce_block, end - b);
    std::memcpy(acc.data(), bufs[0] + b, len * sizeof(float));
    for (int k = 1; k < ranks; ++k) {
      const float* src = bufs[k] + b;
      for (std::size_t i = 0; i < len; ++i) acc[i] += src[i];
    }
    if (dst != nullptr) {
      std::memcpy(dst + b, acc.data(), len * sizeof(float));
    } else {
      for (int k = 0; k < ranks; ++k) std::memcpy(bufs[k] + b, acc.data(), len * sizeof(float));
    }
  }
}

struct shared_state {
  shared_state(int n, const local_group_options& o)
      : ranks(n), barrier(n, o.spin_time, o.oversubscribed), buffers(static_cast<std::size_t>(n)), sizes(static_cast<std::size_t>(n)),
                                 roots(static_cast<std::size_t>(n)), gathers(static_cast<std::size_t>(n)) {}
  const int ranks;
  spin_barrier barrier;
  std::vector<float*> buffers;
  std::vector<std::size_t> sizes;
  std::vector<int> roots;
  std::vector<std::span<const std::span<float>>> gathers;  // all_gather's buffer lists
  std::atomic<int> broken{-1};  // collective_errc of the first failure, or -1
};

class local_endpoint final : public collective {
 public:
  local_endpoint(std::shared_ptr<shared_state> state, int rank) : state_(std::move(state)), rank_(rank) {}

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return state_->ranks; }

  std::pair<std::size_t, std::size_t> chunk(std::size_t size, int rank) const noexcept override {
    return chunk_of(size, state_->ranks, rank);
  }

  void all_reduce_sum(std::span<float> data, const collective_options& options) override {
    if (alone()) return;
    const auto deadline = spin_barrier::clock::now() + options.timeout;
    post(data.data(), data.size(), 0);
    wait(deadline, "all_reduce", &options);
    check_uniform(data.size(), "all_reduce");
    const int n = state_->ranks;
    // This rank owns chunk rank_: it sums the chunk in rank order and writes
    // the sum straight into every rank's buffer (only the owner reads or
    // writes a chunk, so no rank waits between the two halves).
    const auto [begin, end] = chunk(data.size(), rank_);
    sum_in_rank_order(state_->buffers.data(), n, begin, end, nullptr);
    // Nobody may return, and reuse its buffer, while another rank still writes it.
    wait(deadline, "all_reduce");
  }

  void reduce_scatter_sum(std::span<float> data, const collective_options& options) override {
    if (alone()) return;
    const auto deadline = spin_barrier::clock::now() + options.timeout;
    post(data.data(), data.size(), 0);
    wait(deadline, "reduce_scatter", &options);
    check_uniform(data.size(), "reduce_scatter");
    const auto [begin, end] = chunk(data.size(), rank_);
    sum_in_rank_order(state_->buffers.data(), state_->ranks, begin, end, data.data());
    wait(deadline, "reduce_scatter");
  }

  void all_gather(std::span<const std::span<float>> buffers, const collective_options& options) override {
    if (alone()) return;
    const auto deadline = spin_barrier::clock::now() + options.timeout;
    state_->gathers[static_cast<std::size_t>(rank_)] = buffers;
    post(nullptr, buffers.size(), 0);
    wait(deadline, "all_gather", &options);
    check_uniform(buffers.size(), "all_gather");
    for (int k = 0; k < state_->ranks; ++k) {
      if (k == rank_) continue;
      const auto& theirs = state_->gathers[static_cast<std::size_t>(k)];
      for (std::size_t b = 0; b < buffers.size(); ++b) {
        if (theirs[b].size() != buffers[b].size())
          fail(collective_errc::mismatch, "all_gather: buffer " + std::to_string(b) + " has " + std::to_string(buffers[b].size()) +
                                              " floats here, " + std::to_string(theirs[b].size()) + " on rank " + std::to_string(k));
        const auto [kb, ke] = chunk(buffers[b].size(), k);
        if (ke > kb) std::memcpy(buffers[b].data() + kb, theirs[b].data() + kb, (ke - kb) * sizeof(float));
      }
    }
    wait(deadline, "all_gather");
  }

  void broadcast(std::span<float> data, int root, const collective_options& options) override {
    const auto deadline = spin_barrier::clock::now() + options.timeout;
    if (root == 0 && alone()) return;
    if (root < 0 || root >= state_->ranks) {
      fail(collective_errc::mismatch, "broadcast: root " + std::to_string(root) + " is not a rank of a group of " +
                                          std::to_string(state_->ranks));
    }
    post(data.data(), data.size(), root);
    wait(deadline, "broadcast", &options);
    check_uniform(data.size(), "broadcast");
    if (rank_ != root && !data.empty())
      std::memcpy(data.data(), state_->buffers[static_cast<std::size_t>(root)], data.size() * sizeof(float));
    wait(deadline, "broadcast");
  }

  void barrier(const collective_options& options) override {
    wait(spin_barrier::clock::now() + options.timeout, "barrier", &options);
  }

 private:
  // A group of one has nothing to exchange, but an aborted one still fails.
  bool alone() const {
    if (state_->ranks != 1) return false;
    if (state_->barrier.aborted())
      throw collective_error(collective_errc::aborted, "local collective, rank 0: aborted");
    return true;
  }

  void post(float* data, std::size_t size, int root) {
    const auto r = static_cast<std::size_t>(rank_);
    state_->buffers[r] = data;
    state_->sizes[r] = size;
    state_->roots[r] = root;
  }

  [[noreturn]] void fail(collective_errc code, const std::string& what) {
    int expected = -1;
    state_->broken.compare_exchange_strong(expected, static_cast<int>(code));
    state_->barrier.abort();
    throw collective_error(code, "local collective, rank " + std::to_string(rank_) + ": " + what);
  }

  void wait(spin_barrier::clock::time_point deadline, const char* op, const collective_options* late = nullptr) {
    late_observer* observer = late != nullptr ? late->observer : nullptr;
    const auto late_at = late != nullptr ? late->late_at : spin_barrier::clock::time_point{};
    switch (state_->barrier.arrive_and_wait(rank_, deadline, observer, late_at)) {
      case spin_barrier::result::passed: return;
      case spin_barrier::result::timed_out:
        fail(collective_errc::timeout, std::string(op) + " timed out waiting for the other ranks");
      case spin_barrier::result::aborted: {
        const int why = state_->broken.load();
        if (why == static_cast<int>(collective_errc::timeout))
          throw collective_error(collective_errc::aborted,
                                 "local collective, rank " + std::to_string(rank_) + ": " + op + " failed: another rank timed out");
        throw collective_error(collective_errc::aborted,
                               "local collective, rank " + std::to_string(rank_) + ": " + op + " aborted");
      }
    }
  }

  // Every rank sees the same posted sizes, so all of them detect a mismatch.
  void check_uniform(std::size_t size, const char* op) {
    for (int k = 0; k < state_->ranks; ++k) {
      const auto kk = static_cast<std::size_t>(k);
      if (state_->sizes[kk] != size || state_->roots[kk] != state_->roots[static_cast<std::size_t>(rank_)])
        fail(collective_errc::mismatch, std::string(op) + ": rank " + std::to_string(k) + " passed " +
                                            std::to_string(state_->sizes[kk]) + " floats, rank " + std::to_string(rank_) +
                                            " passed " + std::to_string(size));
    }
  }

  std::shared_ptr<shared_state> state_;
  int rank_;
};

class local_group final : public collective_group {
 public:
  local_group(int ranks, const local_group_options& o) : state_(std::make_shared<shared_state>(ranks, o)) {}
  int size() const noexcept override { return state_->ranks; }
  std::unique_ptr<collective> endpoint(int rank) override { return std::make_unique<local_endpoint>(state_, rank); }
  void abort() override {
    int expected = -1;
    state_->broken.compare_exchange_strong(expected, static_cast<int>(collective_errc::aborted));
    state_->barrier.abort();
  }
  bool aborted() const noexcept override { return state_->barrier.aborted(); }

 private:
  std::shared_ptr<shared_state> state_;
};

}  // namespace

std::shared_ptr<collective_group> make_local_group(int ranks, local_group_options options) {
  return std::make_shared<local_group>(ranks, options);
}

}  // namespace dpactor
