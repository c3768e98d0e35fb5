#pragma once
// Interrupts a wait on a Gloo buffer at a given time (See Note [Gloo waits
// look up every health_slice], comms/gloo_connect.cpp): UnboundBuffer's own wait
// timeout would break the connections instead. One thread, started on first
// use, woken by arm() only when the new time is earlier than the one it
// sleeps until: a wait that completes before its alarm costs two lock
// acquisitions, not a thread switch. One alarm per rank; used by that rank's
// thread only.

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace gloo::transport {
class UnboundBuffer;
}

namespace dpactor {

class wait_alarm {
 public:
  using clock = std::chrono::steady_clock;
  enum class kind { recv, send };

  wait_alarm() = default;
  wait_alarm(const wait_alarm&) = delete;
  wait_alarm& operator=(const wait_alarm&) = delete;
  ~wait_alarm();

  // At `at`, interrupts the wait of kind `k` on `buffer`.
  void arm(clock::time_point at, gloo::transport::UnboundBuffer* buffer, kind k);
  // Whether the alarm went off since arm().
  bool fired();
  // On return the alarm no longer touches the buffer.
  void disarm();

 private:
  void run();
  std::mutex mutex_;
  std::condition_variable changed_;
  clock::time_point at_{};
  clock::time_point sleeping_until_ = clock::time_point::max();
  gloo::transport::UnboundBuffer* buffer_ = nullptr;
  kind kind_ = kind::recv;
  bool fired_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dpactor
