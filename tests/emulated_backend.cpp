#include "tests/emulated_backend.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "comms/matched_group.hpp"
#include "comms/tree_program.hpp"

namespace dpactor::testing {
namespace {

// Carries calls out on the CPU, at once, in rank order.
class host_carrier final : public call_carrier {
 public:
  explicit host_carrier(std::shared_ptr<emulated_log> log) : log_(std::move(log)) {}

  void carry_out(std::size_t, matched_call& c) override {
    const std::size_t ranks = c.data.size();
    if (c.kind == 'r') {
      for (const void* after : c.after)
        if (after != nullptr) throw std::logic_error("emulated backend: CPU replicas have no stream");
      std::vector<float> sum(c.n, 0.0f);
      for (std::size_t k = 0; k < ranks; ++k)
        for (std::size_t i = 0; i < c.n; ++i) sum[i] += c.data[k][i];
      for (std::size_t k = 0; k < ranks; ++k) std::copy(sum.begin(), sum.end(), c.data[k]);
    } else if (c.kind == 'b') {
      for (std::size_t k = 0; k < ranks; ++k)
        if (static_cast<int>(k) != c.root) std::copy_n(c.data[static_cast<std::size_t>(c.root)], c.n, c.data[k]);
    } else if (c.kind == 't') {
      // As a device would (See Note [The tree on a device]): the result from
      // the parts as they were, then written (an out may be a part another
      // rank reads).
      std::vector<const float*> parts(c.roots.size());
      for (std::size_t i = 0; i < parts.size(); ++i) parts[i] = c.own[static_cast<std::size_t>(c.roots[i])][i];
      std::vector<float> value(c.n);
      for (std::size_t i = 0; i < c.n; ++i)
        value[i] = evaluate_tree_element(c.steps.data(), c.steps.size(), parts.data(), i);
      for (std::size_t k = 0; k < ranks; ++k) std::copy(value.begin(), value.end(), c.data[k]);
    } else {
      for (std::size_t b = 0; b < c.n; ++b)
        for (std::size_t from = 0; from < ranks; ++from) {
          const auto [begin, end] = c.chunks[b * ranks + from];
          for (std::size_t to = 0; to < ranks; ++to)
            if (to != from && end > begin)
              std::memcpy(c.buffers[to][b].data() + begin, c.buffers[from][b].data() + begin, (end - begin) * sizeof(float));
        }
    }
    std::lock_guard log_lock(log_->mutex);
    log_->calls.emplace_back(c.kind, c.n);
  }
  bool finished(std::size_t) override { return true; }

 private:
  std::shared_ptr<emulated_log> log_;
};

}  // namespace

std::function<std::shared_ptr<collective_group>(int)> emulated_backend(std::shared_ptr<emulated_log> log) {
  return [log](int ranks) {
    ++log->groups;
    return make_matched_group(ranks, std::make_shared<host_carrier>(log));
  };
}

}  // namespace dpactor::testing
