#include "data/record_puller.hpp"

#include <chrono>
#include <span>
#include <vector>

namespace dpactor {

void record_puller::start(std::shared_ptr<record_source> source, std::shared_ptr<record_queue> queue,
                          std::size_t batch, std::int64_t committed,
                          std::function<void(const std::string& why)> on_error) {
  stop();
  source_ = std::move(source);
  queue_ = std::move(queue);
  batch_ = batch;
  on_error_ = std::move(on_error);
  pulling_ = true;
  thread_ = std::thread(&record_puller::run, this, committed);
}

void record_puller::stop() {
  pulling_ = false;
  if (queue_) queue_->shut();
  if (thread_.joinable()) thread_.join();
}

void record_puller::run(std::int64_t committed) {
  try {
    source_->seek(committed);
    std::vector<record> got;
    while (pulling_) {
      got.clear();
      const bool more = source_->pull(got, batch_);
      std::span<const record> rest(got);
      while (!rest.empty() && pulling_) {
        const feed_result r = queue_->push(rest, std::chrono::milliseconds(100));
        rest = rest.subspan(r.taken);
        if (r.status == feed_result::outcome::closed) return;
      }
      if (!more) {
        queue_->close();
        return;
      }
    }
  } catch (const std::exception& e) {
    if (on_error_) on_error_(e.what());
    queue_->close();
  }
}

}  // namespace dpactor
