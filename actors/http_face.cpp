#include <dpactor/http.hpp>

#include <algorithm>

#include <dpactor/error.hpp>
#include <dpactor/snapshot.hpp>
#include "actors/engine_controls.hpp"
#include "config/launcher_env.hpp"
#include "service/control_routes.hpp"
#include "service/feature_body.hpp"
#include "service/http_service.hpp"
#include "service/service_token.hpp"

namespace dpactor {
namespace {

// POST /predict: {"features": [...]} -> the class under the latest parameters.
http_reply predict_route(const Engine& engine, const http_request_view& req) {
  const auto snap = engine.latest_snapshot();
  if (!snap) return json_error(503, "no parameters yet (service.snapshot_every_s = 0 turns the copies off)");
  std::vector<float> x;
  try {
    x = parse_feature_body(req.body);
  } catch (const std::invalid_argument& e) {
    return json_error(400, e.what());
  }
  const auto& spec = engine.config().model;
  if (x.size() != static_cast<std::size_t>(spec.inputs()))
    return json_error(400, "expected " + std::to_string(spec.inputs()) + " features, got " + std::to_string(x.size()));
  std::vector<float> scores;
  try {
    scores = predict(engine.config(), *snap, x);
  } catch (const error& e) {
    return json_error(e.code() == error_kind::config ? 501 : 400, e.what());
  }
  const auto best = std::max_element(scores.begin(), scores.end()) - scores.begin();
  return {200, json{{"class", best}, {"logits", scores}, {"version", snap->step}}.dump() + "\n"};
}

}  // namespace

struct http_face::impl {
  std::shared_ptr<metrics_board> board = std::make_shared<metrics_board>();
  std::shared_ptr<event_feed> events = std::make_shared<event_feed>();
  bool control = false;
  std::unique_ptr<http_service> service;
};

http_face::http_face(Engine& engine, http_options options) : impl_(std::make_unique<impl>()) {
  const job_config& config = engine.config();
  const std::string listen = options.listen.empty() ? config.service.listen : options.listen;
  if (listen.empty())
    throw config_error("http_face: no address to listen on (service.listen, or http_options::listen)");
  http_service_options o;
  try {
    std::tie(o.address, o.port) = split_host_port(listen, options.listen.empty() ? "service.listen" : "http_options::listen");
  } catch (const std::invalid_argument& e) {
    throw config_error(e.what());
  }
  o.token = options.token.empty() ? read_service_token(config.service.token_file) : options.token;
  o.thread_nice = static_cast<int>(config.service.thread_nice);
  o.events = impl_->events;
  o.routes = control_routes(engine_controls(engine));
  if (options.predict)
    o.routes.push_back({"POST", "/predict", false, [&engine](const http_request_view& r) { return predict_route(engine, r); },
                        true});
  impl_->control = !o.token.empty();
  impl_->board->set_running_probe([&engine] { return engine.running(); });
  engine.on_event([board = impl_->board, events = impl_->events](const event& e) {
    board->on_event(e);
    events->on_event(e);
  });
  impl_->service = std::make_unique<http_service>(impl_->board, std::move(o));
}

http_face::~http_face() = default;

std::string http_face::address() const { return impl_->service->address(); }
std::uint16_t http_face::port() const { return impl_->service->port(); }
bool http_face::control() const noexcept { return impl_->control; }

}  // namespace dpactor
