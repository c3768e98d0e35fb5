#pragma once
// The HTTP face of a run (Boost.Beast on its own thread): GET /metrics in
// Prometheus' text format, GET /status (JSON), GET /healthz (the process
// serves), GET /readyz (the run trains), GET /events (the run's events as
// Server-Sent Events), GET / (the dashboard page), and the routes it is given
// (token-guarded control, a program's own), whose handlers run on worker
// threads. A guarded route without the right bearer token gets 401 and
// its handler is never called. Bad requests never reach training: a malformed one gets
// 400, an unknown path 404, another method 405, a header or body over the
// limit 431 or 413, and a client that does not send a whole request within
// request_timeout (a slowloris) is disconnected. At most max_connections are
// served at once; more are closed as they arrive. Binds to loopback unless
// told otherwise.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <vector>

#include "service/event_feed.hpp"
#include "service/http_route.hpp"
#include "service/metrics_board.hpp"

namespace dpactor {

struct http_service_options {
  std::string address = "127.0.0.1";
  std::uint16_t port = 0;  // 0: the system chooses
  std::size_t max_connections = 64;
  std::size_t max_header_bytes = 8 * 1024;
  std::size_t max_body_bytes = 64 * 1024;
  // A whole request, from its first byte or the connection's start.
  std::chrono::milliseconds request_timeout{5'000};
  // More routes (service/http_route.hpp): control, a program's own.
  std::vector<http_route> routes;
  // What guarded routes need as `Authorization: Bearer <token>`; empty:
  // guarded routes are off (403).
  std::string token;
  std::size_t route_threads = 2;  // workers that run route handlers
  // The nice value of the server's threads (Linux: per thread): on a machine
  // the replicas fill, each replica a request preempts holds up the whole
  // step (See Note [Serving beside training]). 0: as the process; 20:
  // SCHED_IDLE, only CPU the replicas leave idle.
  int thread_nice = 10;
  // GET /events streams these (Server-Sent Events); null: 404.
  std::shared_ptr<const event_feed> events;
  // One event stream ends after this long; the browser's EventSource
  // reconnects on its own and resumes after the last event it got
  // (Last-Event-ID), so no connection is held for good.
  std::chrono::milliseconds events_max_duration{60'000};
};

class http_service {
 public:
  // Listens and serves at once. Throws std::runtime_error naming the
  // address when it cannot listen there.
  http_service(std::shared_ptr<const metrics_board> board, http_service_options options);
  ~http_service();  // stops serving; returns once its thread has ended
  http_service(const http_service&) = delete;
  http_service& operator=(const http_service&) = delete;

  std::string address() const;
  std::uint16_t port() const;  // the one bound (port 0 chooses)

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace dpactor
