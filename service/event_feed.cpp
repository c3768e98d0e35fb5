#include "service/event_feed.hpp"

#include <algorithm>

#include "train/event_json.hpp"

namespace dpactor {

void event_feed::on_event(const event& e) {
  // A device's account and an async decision are records for programs, not
  // for the page.
  if (std::holds_alternative<trained_event>(e) || std::holds_alternative<round_decision_event>(e)) return;
  json j = to_json(e);
  entry x;
  x.type = j.value("event", "event");
  x.data = j.dump();
  std::lock_guard lock(mutex_);
  x.id = next_id_++;
  entries_.push_back(std::move(x));
  while (entries_.size() > capacity_) entries_.pop_front();
}

std::vector<event_feed::entry> event_feed::since(std::uint64_t after, std::size_t max) const {
  std::lock_guard lock(mutex_);
  std::vector<entry> out;
  auto it = std::upper_bound(entries_.begin(), entries_.end(), after,
                             [](std::uint64_t id, const entry& x) { return id < x.id; });
  for (; it != entries_.end() && out.size() < max; ++it) out.push_back(*it);
  return out;
}

std::uint64_t event_feed::last_id() const {
  std::lock_guard lock(mutex_);
  return next_id_ - 1;
}

}  // namespace dpactor
