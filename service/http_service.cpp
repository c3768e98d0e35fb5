#include "service/http_service.hpp"

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
};

http::response<http::string_body> text_response(unsigned version, http::status status, std::string body,
                                                const char* content_type = "text/plain; charset=utf-8") {
  http::response<http::string_body> res{status, version};
  res.set(http::field::server, "dpactor");
  res.set(http::field::content_type, content_type);
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

// The answer to one whole request.
http::response<http::string_body> answer(const shared_state& s, const http::request<http::string_body>& req) {
  const std::string target(req.target());
  const std::string path = target.substr(0, target.find('?'));
  const bool known = path == "/metrics" || path == "/status" || path == "/healthz" || path == "/readyz";
  if (!known) return text_response(req.version(), http::status::not_found, "not found: " + path + "\n");
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
    auto res = answer(*state_, req);
    if (req.method() == http::verb::head) res.body().clear();
    res.keep_alive(req.keep_alive());
    write(std::move(res), !req.keep_alive());
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
};

}  // namespace

struct http_service::impl {
  asio::io_context io{1};
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
  impl_->state->options = options;
  const std::string where = options.address + ":" + std::to_string(options.port);
  try {
    const tcp::endpoint endpoint{asio::ip::make_address(options.address), options.port};
    impl_->acceptor.open(endpoint.protocol());
    impl_->acceptor.set_option(asio::socket_base::reuse_address(true));
    impl_->acceptor.bind(endpoint);
    impl_->acceptor.listen();
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot serve HTTP on " + where + ": " + e.what());
  }
  impl_->accept();
  impl_->thread = std::thread([this] { impl_->io.run(); });
}

http_service::~http_service() {
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::string http_service::address() const { return impl_->acceptor.local_endpoint().address().to_string(); }

std::uint16_t http_service::port() const { return impl_->acceptor.local_endpoint().port(); }

}  // namespace dpactor
