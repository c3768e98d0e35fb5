#include "data/record_queue.hpp"

#include <algorithm>
#include <string>

#include <dpactor/error.hpp>
#include "tensors/finite_check.hpp"

namespace dpactor {

record_queue::record_queue(std::size_t capacity, std::size_t feature_count, int classes, const stream_position& resume)
    : capacity_(std::max<std::size_t>(1, capacity)),
      feature_count_(feature_count),
      classes_(classes),
      trained_above_(resume.trained_above),
      last_seen_(resume.committed) {}

void record_queue::check(std::span<const record> records) const {
  for (const record& r : records) {
    const std::string which = "record with sequence number " + std::to_string(r.sequence);
    if (r.sequence < 0) throw data_error(which + ": sequence numbers must not be negative");
    if (r.features.size() != feature_count_)
      throw data_error(which + ": it has " + std::to_string(r.features.size()) +
                       " features but the model's input layer (model.layers[0]) has " + std::to_string(feature_count_));
    if (r.label < 0 || r.label >= classes_)
      throw data_error(which + ": label " + std::to_string(r.label) + " is out of range: the model has " +
                       std::to_string(classes_) + " classes (labels 0.." + std::to_string(classes_ - 1) + ")");
    // See Note [Non-finite steps]: NaN in an input poisons every replica at once.
    if (const auto at = first_nonfinite(r.features))
      throw data_error(which + ": feature " + std::to_string(*at) + " is " + std::to_string(r.features[*at]) +
                       "; inputs must be finite");
  }
}

feed_result record_queue::push(std::span<const record> records, std::chrono::milliseconds wait) {
  check(records);
  feed_result result;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::unique_lock lock(mutex_);
  for (const record& r : records) {
    if (closed_ || shut_) {
      result.status = feed_result::outcome::closed;
      break;
    }
    if (r.sequence <= last_seen_ || std::binary_search(trained_above_.begin(), trained_above_.end(), r.sequence)) {
      last_seen_ = std::max(last_seen_, r.sequence);
      ++result.taken;
      ++result.skipped;
      ++skipped_;
      continue;
    }
    if (records_.size() >= capacity_) {
      fire_locked(lock);  // the loader may be waiting for fewer than a full queue
      if (!space_.wait_until(lock, deadline, [&] { return closed_ || shut_ || records_.size() < capacity_; })) {
        result.status = feed_result::outcome::full;
        break;
      }
      if (closed_ || shut_) {
        result.status = feed_result::outcome::closed;
        break;
      }
    }
    records_.push_back(r);
    last_seen_ = r.sequence;
    ++fed_;
    ++result.taken;
  }
  fire_locked(lock);
  return result;
}

void record_queue::fire_locked(std::unique_lock<std::mutex>& lock) {
  if (notify_at_ == 0 || (records_.size() < notify_at_ && !closed_)) return;
  notify_at_ = 0;
  auto notify = std::move(notify_);
  notify_ = nullptr;
  lock.unlock();
  notify();
  lock.lock();
}

std::size_t record_queue::take(std::size_t n, std::vector<record>& out) {
  std::size_t taken = 0;
  {
    std::lock_guard lock(mutex_);
    for (; taken < n && !records_.empty(); ++taken) {
      out.push_back(std::move(records_.front()));
      records_.pop_front();
    }
  }
  if (taken > 0) space_.notify_all();
  return taken;
}

void record_queue::close() {
  std::unique_lock lock(mutex_);
  closed_ = true;
  fire_locked(lock);
  lock.unlock();
  space_.notify_all();
}

void record_queue::shut() {
  {
    std::lock_guard lock(mutex_);
    shut_ = true;
  }
  space_.notify_all();
}

std::size_t record_queue::size() const {
  std::lock_guard lock(mutex_);
  return records_.size();
}

bool record_queue::closed() const {
  std::lock_guard lock(mutex_);
  return closed_;
}

std::int64_t record_queue::fed_total() const {
  std::lock_guard lock(mutex_);
  return fed_;
}

std::int64_t record_queue::skipped_total() const {
  std::lock_guard lock(mutex_);
  return skipped_;
}

bool record_queue::notify_when(std::size_t n, std::function<void()> notify) {
  std::lock_guard lock(mutex_);
  if (closed_ || records_.size() >= std::max<std::size_t>(1, n)) {
    notify_at_ = 0;
    notify_ = nullptr;
    return true;
  }
  notify_at_ = std::max<std::size_t>(1, n);
  notify_ = std::move(notify);
  return false;
}

}  // namespace dpactor
