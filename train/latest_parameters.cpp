#include "train/latest_parameters.hpp"

#include <stdexcept>

namespace dpactor {

std::span<const float> parameter_snapshot::tensor(const std::string& name) const {
  const tensor_spec* t = layout.find(name);
  if (t == nullptr) throw std::out_of_range("no tensor named " + name);
  return std::span<const float>(values).subspan(t->offset, t->numel());
}

latest_parameters::latest_parameters(flat_layout layout, std::chrono::milliseconds every)
    : layout_(std::move(layout)), every_(every) {}

bool latest_parameters::due(clock::time_point now) const noexcept {
  return !any_.load(std::memory_order_acquire) ||
         now.time_since_epoch().count() - last_.load(std::memory_order_relaxed) >= every_.count();
}

void latest_parameters::publish(std::int64_t step, std::span<const float> parameters, clock::time_point now) {
  auto snap = std::make_shared<parameter_snapshot>();
  snap->step = step;
  snap->layout = layout_;
  snap->values.assign(parameters.begin(), parameters.end());
  {
    std::lock_guard lock(mutex_);
    latest_ = std::move(snap);
  }
  last_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  any_.store(true, std::memory_order_release);
}

std::shared_ptr<const parameter_snapshot> latest_parameters::get() const {
  std::lock_guard lock(mutex_);
  return latest_;
}

}  // namespace dpactor
