#pragma once
// The run's events for GET /events (Server-Sent Events): the newest
// `capacity` of them as JSON, numbered from 1, so that each client reads on
// from its own position (an EventSource resumes with Last-Event-ID), and a
// client that falls behind by more than the capacity skips ahead. Memory is
// bounded whatever the clients do. The devices' trained events (an audit
// record per device and step) are left out.

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include <dpactor/events.hpp>

namespace dpactor {

class event_feed {
 public:
  explicit event_feed(std::size_t capacity = 4096) : capacity_(capacity) {}

  void on_event(const event& e);
  struct entry {
    std::uint64_t id = 0;
    std::string type;  // "step", "epoch", "membership", "recovery", "checkpoint"
    std::string data;  // one line of JSON
  };
  // Up to `max` entries with ids above `after`, oldest first.
  std::vector<entry> since(std::uint64_t after, std::size_t max) const;
  std::uint64_t last_id() const;

 private:
  const std::size_t capacity_;
  mutable std::mutex mutex_;
  std::deque<entry> entries_;
  std::uint64_t next_id_ = 1;
};

}  // namespace dpactor
