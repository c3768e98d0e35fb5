#pragma once
// Routes an http_service serves besides its own GET endpoints: the
// token-guarded control of a run (service/control_routes.hpp) and whatever a
// program embedding the engine adds (a /predict). Handlers run on a worker
// thread of the service, never on the thread that reads requests, so a slow
// one (adding a device waits for a step boundary) holds up no scrape.

#include <functional>
#include <string>

namespace dpactor {

struct http_request_view {
  std::string method;  // "POST"
  std::string path;    // "/devices/cpu:1"
  std::string rest;    // what follows a prefix route's path: "cpu:1"
  std::string body;
};

struct http_reply {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
};

struct http_route {
  std::string method;  // "POST", "PUT", "DELETE", "GET"
  // An exact path, or a prefix ending in '/' that matches what follows
  // (e.g. "/devices/" matches "/devices/cpu:1").
  std::string path;
  // Needs `Authorization: Bearer <token>` (http_service_options::token);
  // without a token configured a guarded route answers 403.
  bool guarded = false;
  std::function<http_reply(const http_request_view&)> handler;
  // The handler is quick and never blocks (a prediction): it runs on the
  // server's own thread, saving two thread hand-offs a request.
  bool inline_handler = false;
};

// A JSON error body: {"error": "..."}.
http_reply json_error(int status, const std::string& message);

}  // namespace dpactor
