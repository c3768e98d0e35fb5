#pragma once
// An Engine's run over HTTP (public API; docs/service.md), so that a host
// serving a run writes no glue: GET /metrics (Prometheus' text format),
// /status (JSON), /events (Server-Sent Events), /healthz, /readyz, the
// dashboard at /, POST /predict {"features": [...]} from the latest snapshot
// (the native MLP; service.snapshot_every_s), and, with a bearer token, the
// control routes (stop, checkpoint, learning rate, devices; docs/service.md).
//
//   dpactor::Engine engine(config, options);
//   dpactor::http_face http(engine);   // before start(): it listens at once
//   engine.start();
//
// The server runs on threads of its own (at service.thread_nice); a request
// never waits for a step, and a malformed one never reaches training.

#include <cstdint>
#include <memory>
#include <string>

#include <dpactor/engine.hpp>

namespace dpactor {

struct http_options {
  std::string listen;  // "ADDR:PORT" (port 0: the system chooses); empty: the job's service.listen
  // The control routes' bearer token; empty: the job's service.token_file,
  // else $DPACTOR_SERVICE_TOKEN; none of them: the control routes answer 403.
  std::string token;
  bool predict = true;  // POST /predict
};

class http_face {
 public:
  // Listens and serves at once, and adds an event callback to `engine`,
  // which must outlive it: construct it before engine.start(). Throws
  // config_error when there is no address to listen on or it cannot listen
  // there, or the token file cannot be read.
  explicit http_face(Engine& engine, http_options options = {});
  ~http_face();  // stops serving; returns once the server's threads ended
  http_face(const http_face&) = delete;
  http_face& operator=(const http_face&) = delete;

  std::string address() const;
  std::uint16_t port() const;  // the one bound
  bool control() const noexcept;  // whether the control routes are on (a token is set)

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace dpactor
