#include "comms/driver_group.hpp"

#include "comms/rank_order.hpp"
#include "comms/summation_tree.hpp"

#include <chrono>
#include <thread>

namespace dpactor {
namespace {

struct group_state {
  explicit group_state(int n) : ranks(n) {}
  const int ranks;
  std::atomic<bool> aborted{false};
  std::mutex mutex;
  std::vector<collective_driver*> drivers;  // for abort() from outside

  // Returns once every driver of the group is aborted.
  void abort_all() {
    aborted = true;
    std::lock_guard lock(mutex);
    for (auto* d : drivers) d->abort();
  }
};

class driver_endpoint final : public collective {
 public:
  driver_endpoint(std::shared_ptr<group_state> group, int rank, std::unique_ptr<collective_driver> driver)
      : group_(std::move(group)), rank_(rank), driver_(std::move(driver)) {
    std::lock_guard lock(group_->mutex);
    group_->drivers.push_back(driver_.get());
    if (group_->aborted) driver_->abort();
  }
  ~driver_endpoint() override {
    std::lock_guard lock(group_->mutex);
    std::erase(group_->drivers, driver_.get());
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return group_->ranks; }
  std::pair<std::size_t, std::size_t> chunk(std::size_t size, int rank) const noexcept override {
    return rank_chunk(size, group_->ranks, rank);
  }

  void all_reduce_sum(std::span<float> data, const collective_options& options) override {
    run("all_reduce", options, [&] { driver_->all_reduce_sum(data.data(), data.size()); });
  }
  // A reduce-scatter whose non-owned chunks are also summed: NCCL's own
  // reduce-scatter needs equal chunks, and the result is the same.
  void reduce_scatter_sum(std::span<float> data, const collective_options& options) override {
    run("reduce_scatter", options, [&] { driver_->all_reduce_sum(data.data(), data.size()); });
  }
  // See Note [Gradient buckets]: enqueued without waiting; the next call waits.
  bool overlaps_compute() const noexcept override { return true; }
  void start_reduce_scatter(std::span<float> data, void* after) override {
    enqueue("reduce_scatter", [&] { driver_->all_reduce_sum_after(data.data(), data.size(), after); });
  }
  void all_gather(std::span<const std::span<float>> buffers, const collective_options& options) override {
    chunks_.clear();  // keeps its capacity: no allocation in steady state
    for (const auto& b : buffers)
      for (int k = 0; k < group_->ranks; ++k) chunks_.push_back(chunk(b.size(), k));
    run("all_gather", options, [&] { driver_->all_gather_chunks(buffers, chunks_); });
  }
  void broadcast(std::span<float> data, int root, const collective_options& options) override {
    run("broadcast", options, [&] { driver_->broadcast(data.data(), data.size(), root); });
  }
  void barrier(const collective_options& options) override {
    run("barrier", options, [&] { driver_->all_reduce_sum(&token_, 1); });
  }

  // See Note [The tree on a device]: who holds which node goes round in one
  // small all-reduce of host memory; then the driver moves the parts and
  // evaluates the whole root where they live, so every rank holds all of
  // it (its chunk included, as the contract asks).
  void reduce_scatter_tree(std::size_t slices, std::span<const tree_part> parts, std::span<float> out,
                           const collective_options& options) override {
    const summation_tree tree(slices);
    const std::size_t bound = tree.node_bound();
    // [0, bound): the holder's rank + 1; [bound, 2 bound): how many hold it.
    holders_.assign(2 * bound, 0.0f);
    for (const tree_part& p : parts) {
      if (p.node >= bound || p.data.size() != out.size()) {
        group_->abort_all();  // the others would wait for this rank's parts
        throw collective_error(collective_errc::mismatch,
                               what("reduce_scatter_tree", "a part does not fit the tree or the output"));
      }
      holders_[p.node] = static_cast<float>(rank_ + 1);
      holders_[bound + p.node] += 1.0f;
    }
    run("reduce_scatter_tree", options, [&] { driver_->all_reduce_sum(holders_.data(), holders_.size()); });
    nodes_.clear();
    roots_.clear();
    own_.clear();
    for (std::uint32_t n = 0; n < bound; ++n) {
      const float holders = holders_[bound + n];
      if (holders == 0.0f) continue;
      if (holders != 1.0f)  // every rank sees the same table: all of them stop here
        throw collective_error(collective_errc::mismatch,
                               what("reduce_scatter_tree", "node " + std::to_string(n) + " is held by " +
                                                               std::to_string(static_cast<int>(holders)) + " ranks"));
      const int from = static_cast<int>(holders_[n]) - 1;
      nodes_.push_back(n);
      roots_.push_back(from);
      float* mine = nullptr;
      if (from == rank_)
        for (const tree_part& p : parts)
          if (p.node == n) mine = p.data.data();
      own_.push_back(mine);
    }
    try {
      plan_.build(tree, nodes_);
    } catch (const std::invalid_argument& e) {
      throw collective_error(collective_errc::mismatch, what("reduce_scatter_tree", e.what()));
    }
    run("reduce_scatter_tree", options,
        [&] { driver_->reduce_tree(roots_, own_, plan_.steps(), out.data(), out.size()); });
  }

 private:
  // Enqueues through the driver, then waits for it; a driver that throws
  // breaks the group like any other failure.
  template <class Enqueue>
  void run(const char* op, const collective_options& options, Enqueue enqueue_call) {
    enqueue(op, enqueue_call);
    finish(op, options);
  }

  template <class Enqueue>
  void enqueue(const char* op, Enqueue enqueue_call) {
    if (group_->aborted) throw collective_error(collective_errc::aborted, what(op, "aborted"));
    try {
      enqueue_call();
    } catch (const std::exception& e) {
      group_->abort_all();
      throw collective_error(collective_errc::aborted, what(op, std::string("failed: ") + e.what()));
    }
  }

  // See Note [Never block on a GPU collective]. A driver cannot tell which
  // ranks are missing: the late observer hears an empty list.
  void finish(const char* op, const collective_options& options) {
    const auto deadline = std::chrono::steady_clock::now() + options.timeout;
    bool told_late = options.observer == nullptr;
    std::string error;
    for (;;) {
      switch (driver_->poll(error)) {
        case collective_driver::state::done: return;
        case collective_driver::state::failed:
          group_->abort_all();
          throw collective_error(collective_errc::aborted, what(op, "failed: " + error));
        case collective_driver::state::pending: break;
      }
      if (group_->aborted) {
        // Every rank's driver is aborted before this rank leaves: none still
        // works on this rank's memory (See Note [Posted memory outlives an
        // abort]). The abort may have come just after this rank's work
        // finished: the driver, once aborted, says whether it had (work done
        // stands).
        group_->abort_all();
        if (driver_->poll(error) == collective_driver::state::done) return;
        throw collective_error(collective_errc::aborted, what(op, "aborted"));
      }
      const auto now = std::chrono::steady_clock::now();
      if (!told_late && now >= options.late_at) {
        told_late = true;
        options.observer->on_late({});
      }
      if (now > deadline) {
        group_->abort_all();
        throw collective_error(collective_errc::timeout, what(op, "timed out; the group is aborted"));
      }
      std::this_thread::yield();
    }
  }

  std::string what(const char* op, const std::string& how) const {
    return "collective, rank " + std::to_string(rank_) + ": " + op + " " + how;
  }

  std::shared_ptr<group_state> group_;
  int rank_;
  std::unique_ptr<collective_driver> driver_;
  std::vector<std::pair<std::size_t, std::size_t>> chunks_;
  float token_ = 0.0f;
  // reduce_scatter_tree's, kept with their capacity.
  std::vector<float> holders_;
  std::vector<std::uint32_t> nodes_;
  std::vector<int> roots_;
  std::vector<float*> own_;
  tree_plan plan_;
};

class driver_group final : public collective_group {
 public:
  driver_group(int ranks, driver_factory factory, bool spans_processes)
      : state_(std::make_shared<group_state>(ranks)), factory_(std::move(factory)), spans_processes_(spans_processes) {}
  int size() const noexcept override { return state_->ranks; }
  // A rank that cannot set up its communicator breaks the group: the others
  // would wait for it.
  std::unique_ptr<collective> endpoint(int rank) override {
    std::unique_ptr<collective_driver> driver;
    try {
      driver = factory_(rank, state_->ranks, state_->aborted);
    } catch (const std::exception& e) {
      state_->abort_all();
      throw collective_error(collective_errc::aborted,
                             "collective, rank " + std::to_string(rank) + ": set-up failed: " + e.what());
    }
    return std::make_unique<driver_endpoint>(state_, rank, std::move(driver));
  }
  void abort() override { state_->abort_all(); }
  bool aborted() const noexcept override { return state_->aborted; }
  bool spans_processes() const noexcept override { return spans_processes_; }

 private:
  std::shared_ptr<group_state> state_;
  driver_factory factory_;
  bool spans_processes_;
};

}  // namespace

std::shared_ptr<collective_group> make_driver_group(int ranks, driver_factory factory, bool spans_processes) {
  return std::make_shared<driver_group>(ranks, std::move(factory), spans_processes);
}

}  // namespace dpactor
