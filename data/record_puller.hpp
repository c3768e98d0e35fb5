#pragma once
// Pulls a record_source into a record_queue on a thread of its own (the
// engine's run_options::records): from the record after `committed` (the
// source's seek) until the source ends, which closes the queue and so ends
// the stream, or until stop(). A source that throws ends the stream too:
// what it gave is trained, and `on_error` is told why.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "data/record_queue.hpp"

namespace dpactor {

class record_puller {
 public:
  record_puller() = default;
  ~record_puller() { stop(); }
  record_puller(const record_puller&) = delete;
  record_puller& operator=(const record_puller&) = delete;

  void start(std::shared_ptr<record_source> source, std::shared_ptr<record_queue> queue, std::size_t batch,
             std::int64_t committed, std::function<void(const std::string& why)> on_error);
  // Shuts the queue (what it holds stays untrained) and joins the thread.
  // Idempotent.
  void stop();

 private:
  void run(std::int64_t committed);

  std::shared_ptr<record_source> source_;
  std::shared_ptr<record_queue> queue_;
  std::size_t batch_ = 1;
  std::function<void(const std::string&)> on_error_;
  std::atomic<bool> pulling_{false};
  std::thread thread_;
};

}  // namespace dpactor
