#include "comms/local.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <span>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "comms/rank_order.hpp"
#include "comms/spin_barrier.hpp"
#include "comms/summation_tree.hpp"

namespace dpactor {
namespace {

// Pointers to [begin, end) of every rank's posted buffer (part k = rank k's),
// in rank order; a rank's own buffer is both a part and an out.
void gather_chunk(const std::vector<float*>& buffers, std::size_t begin, std::vector<const float*>& parts,
                  std::vector<float*>& outs) {
  parts.clear();
  outs.clear();
  for (float* b : buffers) {
    parts.push_back(b + begin);
    outs.push_back(b + begin);
  }
}

struct shared_state {
  shared_state(int n, local_group_options o)
      : ranks(n),
        options(std::move(o)),
        barrier(n, options.spin_time, options.oversubscribed),
        buffers(static_cast<std::size_t>(n)),
        sizes(static_cast<std::size_t>(n)),
        roots(static_cast<std::size_t>(n)),
        gathers(static_cast<std::size_t>(n)),
        tree_parts(static_cast<std::size_t>(n)),
        bf16_parts(static_cast<std::size_t>(n)) {}
  const int ranks;
  const local_group_options options;
  spin_barrier barrier;
  // What each rank posted for the current call. See Note [Posted memory
  // outlives an abort].
  std::vector<float*> buffers;
  std::vector<std::size_t> sizes;
  std::vector<int> roots;
  std::vector<std::span<const std::span<float>>> gathers;  // all_gather's buffer lists
  std::vector<std::span<const tree_part>> tree_parts;      // reduce_scatter_tree's
  std::vector<std::span<const tree_part_bf16>> bf16_parts;  // reduce_scatter_tree_bf16's
};

// See Note [Posted memory outlives an abort]. No return is safe: the caller
// would free memory a peer may still write. The thread stays here for good,
// and the engine's teardown reports it as stuck (Engine::left_threads_behind,
// then error_kind::stuck_thread): the host decides when the process ends.
[[noreturn]] void poisoned(int rank, const char* op, std::chrono::milliseconds bound) {
  std::fprintf(stderr,
               "dpactor: fatal: local collective poisoned: rank %d could not leave %s after the group was aborted: "
               "a peer rank did not leave the exchange within %lld ms and may still use this rank's memory. "
               "This thread stays in the call for good rather than corrupt the heap; end the process.\n",
               rank, op, static_cast<long long>(bound.count()));
  std::fflush(stderr);
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

class local_endpoint final : public collective {
 public:
  local_endpoint(std::shared_ptr<shared_state> state, int rank) : state_(std::move(state)), rank_(rank) {}

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return state_->ranks; }

  std::pair<std::size_t, std::size_t> chunk(std::size_t size, int rank) const noexcept override {
    return rank_chunk(size, state_->ranks, rank);
  }

  void all_reduce_sum(std::span<float> data, const collective_options& options) override {
    if (alone()) return;
    // This rank owns chunk rank_: it sums the chunk in rank order and writes
    // the sum straight into every rank's buffer (only the owner reads or
    // writes a chunk, so no rank waits between the two halves).
    exchange("all_reduce", data.data(), data.size(), 0, options, [&] {
      const auto [begin, end] = chunk(data.size(), rank_);
      gather_chunk(state_->buffers, begin, parts_, outs_);
      sum_in_rank_order(parts_, end - begin, outs_);
      return std::string();
    });
  }

  void reduce_scatter_sum(std::span<float> data, const collective_options& options) override {
    if (alone()) return;
    exchange("reduce_scatter", data.data(), data.size(), 0, options, [&] {
      const auto [begin, end] = chunk(data.size(), rank_);
      gather_chunk(state_->buffers, begin, parts_, outs_);
      outs_.assign(1, data.data() + begin);
      sum_in_rank_order(parts_, end - begin, outs_);
      return std::string();
    });
  }

  void all_gather(std::span<const std::span<float>> buffers, const collective_options& options) override {
    if (alone()) return;
    state_->gathers[static_cast<std::size_t>(rank_)] = buffers;
    exchange("all_gather", nullptr, buffers.size(), 0, options, [&] {
      // Every rank checks every list before any copies, so a mismatch
      // fails every rank with nothing copied.
      for (int k = 0; k < state_->ranks; ++k) {
        const auto& theirs = state_->gathers[static_cast<std::size_t>(k)];
        for (std::size_t b = 0; b < buffers.size(); ++b)
          if (theirs[b].size() != buffers[b].size())
            return "buffer " + std::to_string(b) + " has " + std::to_string(buffers[b].size()) + " floats on rank " +
                   std::to_string(rank_) + ", " + std::to_string(theirs[b].size()) + " on rank " + std::to_string(k);
      }
      for (int k = 0; k < state_->ranks; ++k) {
        if (k == rank_) continue;
        const auto& theirs = state_->gathers[static_cast<std::size_t>(k)];
        for (std::size_t b = 0; b < buffers.size(); ++b) {
          const auto [kb, ke] = chunk(buffers[b].size(), k);
          if (ke > kb) std::memcpy(buffers[b].data() + kb, theirs[b].data() + kb, (ke - kb) * sizeof(float));
        }
      }
      return std::string();
    });
  }

  void broadcast(std::span<float> data, int root, const collective_options& options) override {
    if (root < 0 || root >= state_->ranks) {
      state_->barrier.abort();
      throw error(collective_errc::mismatch, "broadcast: root " + std::to_string(root) + " is not a rank of a group of " +
                                                 std::to_string(state_->ranks));
    }
    if (alone()) return;
    exchange("broadcast", data.data(), data.size(), root, options, [&] {
      if (rank_ != root && !data.empty())
        std::memcpy(data.data(), state_->buffers[static_cast<std::size_t>(root)], data.size() * sizeof(float));
      return std::string();
    });
  }

  // See Note [Summation tree]: each rank evaluates the tree over its chunk,
  // reading every rank's parts in place.
  void reduce_scatter_tree(std::size_t slices, std::span<const tree_part> parts, std::span<float> out,
                           const collective_options& options) override {
    const summation_tree tree(slices);
    if (alone()) {
      if (const std::string problem = plan_tree(tree, {&parts, 1}, out.size()); !problem.empty())
        throw error(collective_errc::mismatch, "reduce_scatter_tree: " + problem);
      plan_.run(part_data_.data(), 0, out.size(), out.data());
      return;
    }
    state_->tree_parts[static_cast<std::size_t>(rank_)] = parts;
    // The slice count travels as the call's "root", so every rank checks it.
    exchange("reduce_scatter_tree", out.data(), out.size(), static_cast<int>(slices), options, [&] {
      const std::string problem = plan_tree(tree, state_->tree_parts, out.size());
      if (!problem.empty()) return problem;
      const auto [begin, end] = chunk(out.size(), rank_);
      plan_.run(part_data_.data(), begin, end, out.data());
      return std::string();
    });
  }

  void barrier(const collective_options& options) override {
    open(spin_barrier::clock::now() + options.timeout, "barrier", options);
  }

  // As all_reduce_sum, one byte a value. Its "root" is -1, which no other
  // call posts: a rank in all_reduce_sum of as many floats is a mismatch.
  void all_reduce_sum_int8(std::span<std::int8_t> data, const collective_options& options) override {
    if (alone()) return;
    exchange("all_reduce_int8", reinterpret_cast<float*>(data.data()), data.size(), -1, options, [&] {
      const auto [begin, end] = chunk(data.size(), rank_);
      bytes_in_.clear();
      bytes_out_.clear();
      for (float* b : state_->buffers) {
        bytes_in_.push_back(reinterpret_cast<const std::int8_t*>(b) + begin);
        bytes_out_.push_back(reinterpret_cast<std::int8_t*>(b) + begin);
      }
      sum_int8(bytes_in_, end - begin, bytes_out_);
      return std::string();
    });
  }
  bool moves_int8() const noexcept override { return true; }

  // As reduce_scatter_tree: each rank widens its chunk of every rank's bf16
  // parts and evaluates the tree over it. Its "root" is the slice count,
  // negated, and less one: no other call posts it.
  void reduce_scatter_tree_bf16(std::size_t slices, std::span<const tree_part_bf16> parts, std::span<float> out,
                                const collective_options& options) override {
    const summation_tree tree(slices);
    const auto evaluate = [&](std::span<const std::span<const tree_part_bf16>> ranks, std::size_t begin,
                              std::size_t end) -> std::string {
      part_nodes_.clear();
      for (const auto& rank_parts : ranks)
        for (const tree_part_bf16& p : rank_parts) {
          if (p.data.size() != out.size())
            return "a part of node " + std::to_string(p.node) + " has " + std::to_string(p.data.size()) +
                   " values, not " + std::to_string(out.size());
          part_nodes_.push_back(p.node);
        }
      try {
        plan_.build(tree, part_nodes_);
      } catch (const std::invalid_argument& e) {
        return e.what();
      }
      const std::size_t len = end - begin;
      widened_.resize(part_nodes_.size() * len);
      part_data_.clear();
      std::size_t i = 0;
      for (const auto& rank_parts : ranks)
        for (const tree_part_bf16& p : rank_parts) {
          float* to = widened_.data() + i++ * len;
          for (std::size_t j = 0; j < len; ++j)
            to[j] = std::bit_cast<float>(static_cast<std::uint32_t>(p.data[begin + j]) << 16);
          part_data_.push_back(to);
        }
      plan_.run(part_data_.data(), 0, len, out.data() + begin);
      return {};
    };
    if (alone()) {
      if (const std::string problem = evaluate({&parts, 1}, 0, out.size()); !problem.empty())
        throw error(collective_errc::mismatch, "reduce_scatter_tree_bf16: " + problem);
      return;
    }
    state_->bf16_parts[static_cast<std::size_t>(rank_)] = parts;
    exchange("reduce_scatter_tree_bf16", out.data(), out.size(), -1 - static_cast<int>(slices), options, [&] {
      const auto [begin, end] = chunk(out.size(), rank_);
      return evaluate(state_->bf16_parts, begin, end);
    });
  }

  // As all_gather of one buffer, two bytes a value; its "root" is one no
  // other call posts.
  void all_gather_bf16(std::span<std::uint16_t> data, const collective_options& options) override {
    if (alone()) return;
    exchange("all_gather_bf16", reinterpret_cast<float*>(data.data()), data.size(), std::numeric_limits<int>::min(),
             options, [&] {
      for (int k = 0; k < state_->ranks; ++k) {
        if (k == rank_) continue;
        const auto [kb, ke] = chunk(data.size(), k);
        const auto* theirs = reinterpret_cast<const std::uint16_t*>(state_->buffers[static_cast<std::size_t>(k)]);
        if (ke > kb) std::memcpy(data.data() + kb, theirs + kb, (ke - kb) * sizeof(std::uint16_t));
      }
      return std::string();
    });
  }
  bool moves_bf16() const noexcept override { return true; }

 private:
  // A group of one has nothing to exchange, but an aborted one still fails.
  bool alone() const {
    if (state_->ranks != 1) return false;
    if (state_->barrier.aborted()) throw error(collective_errc::aborted, "aborted");
    return true;
  }

  // One call that touches the other ranks' posted memory: post this rank's,
  // pass the opening barrier, run `touch` (returns a mismatch, or "") and
  // leave through the closing barrier, which no rank passes or leaves while
  // a peer may still be inside `touch`. See Note [Posted memory outlives an
  // abort].
  template <class Touch>
  void exchange(const char* op, float* data, std::size_t size, int root, const collective_options& options, Touch touch) {
    const auto deadline = spin_barrier::clock::now() + options.timeout;
    const auto r = static_cast<std::size_t>(rank_);
    state_->buffers[r] = data;
    state_->sizes[r] = size;
    state_->roots[r] = root;
    open(deadline, op, options);
    std::string mismatch = check_uniform(size, root);
    if (mismatch.empty()) {
      if (state_->options.phase_hook) state_->options.phase_hook(rank_);
      mismatch = touch();
    }
    if (!mismatch.empty()) state_->barrier.abort();  // every rank finds the same mismatch
    const auto closed = state_->barrier.arrive_and_drain(rank_, deadline, state_->options.drain_bound);
    if (closed == spin_barrier::result::stuck) poisoned(rank_, op, state_->options.drain_bound);
    if (!mismatch.empty()) throw error(collective_errc::mismatch, std::string(op) + ": " + mismatch);
    if (closed != spin_barrier::result::passed) throw failure(closed, op);
  }

  // The barrier every call opens with; throws if it does not pass (then no
  // rank has touched another's memory).
  void open(spin_barrier::clock::time_point deadline, const char* op, const collective_options& options) {
    const auto r = state_->barrier.arrive_and_wait(rank_, deadline, options.observer, options.late_at);
    if (r != spin_barrier::result::passed) throw failure(r, op);
  }

  collective_error failure(spin_barrier::result r, const char* op) const {
    if (r == spin_barrier::result::timed_out)
      return error(collective_errc::timeout, std::string(op) + " timed out waiting for the other ranks");
    if (state_->barrier.timed_out())
      return error(collective_errc::aborted, std::string(op) + " failed: another rank timed out");
    return error(collective_errc::aborted, std::string(op) + " aborted");
  }

  collective_error error(collective_errc code, const std::string& what) const {
    return collective_error(code, "local collective, rank " + std::to_string(rank_) + ": " + what);
  }

  // Every rank sees the same posted sizes and roots, so all of them find a
  // mismatch.
  std::string check_uniform(std::size_t size, int root) const {
    for (int k = 0; k < state_->ranks; ++k) {
      const auto kk = static_cast<std::size_t>(k);
      if (state_->sizes[kk] != size || state_->roots[kk] != root)
        return "rank " + std::to_string(k) + " passed " + std::to_string(state_->sizes[kk]) + " floats (root " +
               std::to_string(state_->roots[kk]) + "), rank " + std::to_string(rank_) + " passed " +
               std::to_string(size) + " (root " + std::to_string(root) + ")";
    }
    return {};
  }

  // Plans the tree from every rank's parts; a mismatch, or "".
  std::string plan_tree(const summation_tree& tree, std::span<const std::span<const tree_part>> ranks, std::size_t n) {
    part_nodes_.clear();
    part_data_.clear();
    for (const auto& parts : ranks)
      for (const tree_part& p : parts) {
        if (p.data.size() != n)
          return "a part of node " + std::to_string(p.node) + " has " + std::to_string(p.data.size()) + " floats, not " +
                 std::to_string(n);
        part_nodes_.push_back(p.node);
        part_data_.push_back(p.data.data());
      }
    try {
      plan_.build(tree, part_nodes_);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return {};
  }

  std::shared_ptr<shared_state> state_;
  int rank_;
  // reduce_scatter_tree's, kept with their capacity (no allocation per step).
  tree_plan plan_;
  std::vector<std::uint32_t> part_nodes_;
  std::vector<const float*> part_data_;
  // The chunk pointers of all_reduce_sum and reduce_scatter_sum.
  std::vector<const float*> parts_;
  std::vector<float*> outs_;
  std::vector<const std::int8_t*> bytes_in_;  // all_reduce_sum_int8's
  std::vector<std::int8_t*> bytes_out_;
  std::vector<float> widened_;  // reduce_scatter_tree_bf16's: this rank's chunk of every part, as floats
};

class local_group final : public collective_group {
 public:
  local_group(int ranks, local_group_options o) : state_(std::make_shared<shared_state>(ranks, std::move(o))) {}
  int size() const noexcept override { return state_->ranks; }
  std::unique_ptr<collective> endpoint(int rank) override { return std::make_unique<local_endpoint>(state_, rank); }
  void abort() override { state_->barrier.abort(); }
  bool aborted() const noexcept override { return state_->barrier.aborted(); }

 private:
  std::shared_ptr<shared_state> state_;
};

}  // namespace

std::shared_ptr<collective_group> make_local_group(int ranks, local_group_options options) {
  return std::make_shared<local_group>(ranks, options);
}

}  // namespace dpactor
