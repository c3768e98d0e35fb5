#include "service/http_service.hpp"

#include "service/dashboard_page.hpp"
#include <dpactor/error.hpp>

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <optional>
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <stdexcept>
#include <thread>

namespace dpactor {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct shared_state {
  std::shared_ptr<const metrics_board> board;
  http_service_options options;
  std::atomic<std::size_t> connections{0};
  asio::thread_pool* workers = nullptr;  // route handlers run here
};

// Note [Serving beside training]
// A synchronous data-parallel step is as slow as its slowest replica. On a
// machine whose cores the replicas fill, every time a request's thread
// preempts a replica, the others wait for it at the collective: a request
// costs up to its CPU time once per replica, and the wake-ups more than the
// work. Measured on 2 cores at 500 requests/s (bench/service_load_bench.cpp,
// docs/PERFORMANCE.md): the requests and their client take 7% of one core,
// and training loses a median 9% with 2 replicas on the 2 cores, 2% with 1
// replica and a core to spare. So the server keeps its own cost small (a
// prediction's body is read without a general JSON parser, quick routes run
// on the server's thread without a hand-off) and runs its threads at a
// lower priority (thread_nice, 10 by default: a mild preference for the
// replicas, whose effect was within the noise of the measurement).
// thread_nice = 20 runs them as SCHED_IDLE: training is never
// preempted by a request, and requests wait for idle CPU (at 500/s on 2
// full cores: no loss of training throughput, p99 latency 65 ms, and
// requests queued). Where serving matters, leave a core to it.
void lower_thread_priority(int nice) {
  if (nice >= 20) {
    sched_param p{};
    ::sched_setscheduler(::gettid(), SCHED_IDLE, &p);
  } else if (nice != 0) {
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), nice);
  }
}

bool builtin_path(const std::string& path) {
  return path == "/metrics" || path == "/status" || path == "/healthz" || path == "/readyz" || path == "/events" ||
         path == "/";
}

// How often an event stream looks for new events, and how long it may stay
// silent before a comment line keeps proxies (and the check for a client
// that went away) going.
constexpr auto events_poll = std::chrono::milliseconds(200);
constexpr auto events_keepalive = std::chrono::seconds(15);
// A client that takes longer than this to take one write is dropped.
constexpr auto events_write_timeout = std::chrono::seconds(10);
constexpr std::size_t events_per_write = 256;

bool route_matches(const http_route& r, const std::string& path) {
  if (!r.path.empty() && r.path.back() == '/') return path.size() > r.path.size() && path.starts_with(r.path);
  return path == r.path;
}

// Equal tokens, in a time that does not depend on where they differ.
bool same_token(std::string_view given, std::string_view expected) {
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (std::size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i] ^ expected[i % std::max<std::size_t>(1, expected.size())]);
  return diff == 0 && !expected.empty();
}

http::response<http::string_body> text_response(unsigned version, http::status status, std::string body,
                                                const char* content_type = "text/plain; charset=utf-8") {
  http::response<http::string_body> res{status, version};
  res.set(http::field::server, "dpactor");
  res.set(http::field::content_type, content_type);
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

// The answer to one whole request, or the route whose handler must give it.
struct answer_or_route {
  std::optional<http::response<http::string_body>> response;
  const http_route* route = nullptr;
};

answer_or_route route_request(const shared_state& s, const http::request<http::string_body>& req) {
  const std::string target(req.target());
  const std::string path = target.substr(0, target.find('?'));
  if (builtin_path(path)) return {};
  std::string allowed;
  const std::string method(req.method_string());
  for (const http_route& r : s.options.routes) {
    if (!route_matches(r, path)) continue;
    if (r.method != method) {
      allowed += (allowed.empty() ? "" : ", ") + r.method;
      continue;
    }
    if (r.guarded) {
      if (s.options.token.empty())
        return {text_response(req.version(), http::status::forbidden,
                              "the control endpoints are off: no token is configured (DPACTOR_SERVICE_TOKEN or "
                              "service.token_file)\n"),
                nullptr};
      const auto field = req[http::field::authorization];
      const std::string_view auth(field.data(), field.size());
      constexpr std::string_view bearer = "Bearer ";
      if (!auth.starts_with(bearer) || !same_token(auth.substr(bearer.size()), s.options.token)) {
        auto res = text_response(req.version(), http::status::unauthorized,
                                 "a valid \"Authorization: Bearer <token>\" header is needed\n");
        res.set(http::field::www_authenticate, "Bearer realm=\"dpactor\"");
        return {std::move(res), nullptr};
      }
    }
    return {std::nullopt, &r};
  }
  if (!allowed.empty()) {
    auto res = text_response(req.version(), http::status::method_not_allowed, path + " answers " + allowed + " only\n");
    res.set(http::field::allow, allowed);
    return {std::move(res), nullptr};
  }
  return {text_response(req.version(), http::status::not_found, "not found: " + path + "\n"), nullptr};
}

// The answer to one request for a built-in path.
http::response<http::string_body> answer(const shared_state& s, const http::request<http::string_body>& req) {
  const std::string target(req.target());
  const std::string path = target.substr(0, target.find('?'));
  if (req.method() != http::verb::get && req.method() != http::verb::head) {
    auto res = text_response(req.version(), http::status::method_not_allowed, path + " answers GET only\n");
    res.set(http::field::allow, "GET, HEAD");
    return res;
  }
  if (path == "/metrics")
    return text_response(req.version(), http::status::ok, s.board->prometheus_text(),
                         "text/plain; version=0.0.4; charset=utf-8");
  if (path == "/status")
    return text_response(req.version(), http::status::ok, s.board->status().dump() + "\n", "application/json");
  if (path == "/healthz") return text_response(req.version(), http::status::ok, "ok\n");
  if (path == "/") return text_response(req.version(), http::status::ok, std::string(dashboard_page()), "text/html; charset=utf-8");
  if (path == "/events") return text_response(req.version(), http::status::not_found, "no event stream here\n");
  return s.board->running() ? text_response(req.version(), http::status::ok, "ready\n")
                            : text_response(req.version(), http::status::service_unavailable, "not ready\n");
}

// One connection: reads requests one after another (keep-alive), each within
// the request timeout, answers each, and closes on any error.
class session : public std::enable_shared_from_this<session> {
 public:
  session(tcp::socket socket, std::shared_ptr<shared_state> s) : stream_(std::move(socket)), state_(std::move(s)) {}
  ~session() { --state_->connections; }
  void start() { read(); }

 private:
  void read() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(state_->options.max_header_bytes));
    parser_->body_limit(state_->options.max_body_bytes);
    stream_.expires_after(state_->options.request_timeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == asio::error::operation_aborted)
      return close();
    if (ec == http::error::header_limit) return fail(http::status::request_header_fields_too_large, "request header too large\n");
    if (ec == http::error::body_limit) return fail(http::status::payload_too_large, "request body too large\n");
    if (ec) return fail(http::status::bad_request, "malformed request: " + ec.message() + "\n");
    const auto& req = parser_->get();
    if (req.method() == http::verb::get && state_->options.events && req.target().starts_with("/events") &&
        (req.target().size() == 7 || req.target()[7] == '?')) {
      std::uint64_t after = 0;
      const auto last = req["Last-Event-ID"];
      try {
        if (!last.empty()) after = std::stoull(std::string(last));
      } catch (const std::exception&) {
      }
      return start_events(after);
    }
    answer_or_route routed = route_request(*state_, req);
    if (routed.route != nullptr) return run_route(*routed.route, req);
    auto res = routed.response ? std::move(*routed.response) : answer(*state_, req);
    if (req.method() == http::verb::head) res.body().clear();
    res.keep_alive(req.keep_alive());
    write(std::move(res), !req.keep_alive());
  }

  // GET /events: the header, then every event as it comes, until the
  // client goes away or the service stops.
  void start_events(std::uint64_t after) {
    events_after_ = after;
    events_until_ = std::chrono::steady_clock::now() + state_->options.events_max_duration;
    events_text_ =
        "HTTP/1.1 200 OK\r\nServer: dpactor\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        "Connection: close\r\n\r\nretry: 1000\n\n";
    last_sent_ = std::chrono::steady_clock::now();
    send_events();
  }

  void send_events() {
    stream_.expires_after(events_write_timeout);
    asio::async_write(stream_, asio::buffer(events_text_), [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return self->close();
      self->last_sent_ = std::chrono::steady_clock::now();
      self->stream_.expires_never();
      self->next_events();
    });
  }

  void next_events() {
    events_text_.clear();
    for (const auto& e : state_->options.events->since(events_after_, events_per_write)) {
      events_text_ += "id: " + std::to_string(e.id) + "\nevent: " + e.type + "\ndata: " + e.data + "\n\n";
      events_after_ = e.id;
    }
    if (events_text_.empty() && std::chrono::steady_clock::now() - last_sent_ >= events_keepalive)
      events_text_ = ": keep-alive\n\n";
    if (!events_text_.empty()) return send_events();
    if (std::chrono::steady_clock::now() >= events_until_) return close();  // the client reconnects
    timer_.expires_after(events_poll);
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec) return self->close();
      self->next_events();
    });
  }

  // A route's handler runs on a worker; its reply is written from here.
  void run_route(const http_route& route, const http::request<http::string_body>& req) {
    http_request_view view{std::string(req.method_string()), {}, {}, req.body()};
    const std::string target(req.target());
    view.path = target.substr(0, target.find('?'));
    if (!route.path.empty() && route.path.back() == '/') view.rest = view.path.substr(route.path.size());
    const unsigned version = req.version();
    const bool keep_alive = req.keep_alive();
    if (route.inline_handler) {
      http_reply reply;
      try {
        reply = route.handler(view);
      } catch (const std::exception& e) {
        reply = json_error(500, e.what());
      }
      auto res = text_response(version, static_cast<http::status>(reply.status), std::move(reply.body), reply.content_type.c_str());
      res.keep_alive(keep_alive);
      return write(std::move(res), !keep_alive);
    }
    asio::post(*state_->workers, [self = shared_from_this(), &route, view = std::move(view), version, keep_alive] {
      thread_local const bool lowered = (lower_thread_priority(self->state_->options.thread_nice), true);
      (void)lowered;
      http_reply reply;
      try {
        reply = route.handler(view);
      } catch (const std::exception& e) {
        reply = json_error(500, e.what());
      }
      asio::post(self->stream_.get_executor(), [self, reply = std::move(reply), version, keep_alive] {
        auto res = text_response(version, static_cast<http::status>(reply.status), reply.body, reply.content_type.c_str());
        res.keep_alive(keep_alive);
        self->write(std::move(res), !keep_alive);
      });
    });
  }

  // An error answer, then the connection closes once the client has had
  // the time to read it (See drain).
  void fail(http::status status, std::string body) {
    response_ = std::make_shared<http::response<http::string_body>>(text_response(11, status, std::move(body)));
    response_->keep_alive(false);
    stream_.expires_after(state_->options.request_timeout);
    http::async_write(stream_, *response_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return self->close();
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      self->stream_.expires_after(drain_time);
      self->drain();
    });
  }

  // After an error answer the client may still be sending what was not read
  // (an oversized header or body): closing at once would reset the
  // connection and could discard the answer on its way. So the rest is read
  // and dropped until the client closes or drain_time passes.
  static constexpr auto drain_time = std::chrono::seconds(1);
  void drain() {
    stream_.async_read_some(asio::buffer(scratch_), [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return self->close();
      self->drain();
    });
  }

  void write(http::response<http::string_body> res, bool then_close) {
    response_ = std::make_shared<http::response<http::string_body>>(std::move(res));
    stream_.expires_after(state_->options.request_timeout);
    http::async_write(stream_, *response_, [self = shared_from_this(), then_close](beast::error_code ec, std::size_t) {
      if (ec || then_close) return self->close();
      self->read();
    });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<http::response<http::string_body>> response_;
  std::shared_ptr<shared_state> state_;
  char scratch_[4096];
  // GET /events
  asio::steady_timer timer_{stream_.get_executor()};
  std::uint64_t events_after_ = 0;
  std::string events_text_;
  std::chrono::steady_clock::time_point last_sent_{}, events_until_{};
};

}  // namespace

struct http_service::impl {
  asio::io_context io{1};
  std::unique_ptr<asio::thread_pool> workers;
  tcp::acceptor acceptor{io};
  std::shared_ptr<shared_state> state = std::make_shared<shared_state>();
  std::thread thread;

  void accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) {
        if (state->connections.load() >= state->options.max_connections) {
          beast::error_code ignored;
          socket.close(ignored);  // over the limit: no session, no memory
        } else {
          ++state->connections;
          std::make_shared<session>(std::move(socket), state)->start();
        }
      }
      accept();
    });
  }
};

http_service::http_service(std::shared_ptr<const metrics_board> board, http_service_options options)
    : impl_(std::make_unique<impl>()) {
  impl_->state->board = std::move(board);
  impl_->state->options = std::move(options);
  impl_->workers = std::make_unique<asio::thread_pool>(std::max<std::size_t>(1, impl_->state->options.route_threads));
  impl_->state->workers = impl_->workers.get();
  const http_service_options& o = impl_->state->options;
  const std::string where = o.address + ":" + std::to_string(o.port);
  try {
    const tcp::endpoint endpoint{asio::ip::make_address(o.address), o.port};
    impl_->acceptor.open(endpoint.protocol());
    impl_->acceptor.set_option(asio::socket_base::reuse_address(true));
    impl_->acceptor.bind(endpoint);
    impl_->acceptor.listen();
  } catch (const std::exception& e) {
    throw config_error("cannot serve HTTP on " + where + ": " + e.what());
  }
  impl_->accept();
  impl_->thread = std::thread([this] {
    lower_thread_priority(impl_->state->options.thread_nice);
    impl_->io.run();
  });
}

http_service::~http_service() {
  impl_->workers->join();  // handlers still running finish (their replies go nowhere)
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::string http_service::address() const { return impl_->acceptor.local_endpoint().address().to_string(); }

std::uint16_t http_service::port() const { return impl_->acceptor.local_endpoint().port(); }

}  // namespace dpactor
