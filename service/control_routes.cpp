#include "service/control_routes.hpp"

#include <cmath>

#include "tensors/json.hpp"

namespace dpactor {

http_reply json_error(int status, const std::string& message) {
  return {status, json{{"error", message}}.dump() + "\n", "application/json"};
}

namespace {

http_reply accepted(json body) { return {202, body.dump() + "\n", "application/json"}; }

// PUT /lr: {"lr": <finite number > 0>} or {"lr": null}.
http_reply set_lr(const run_controls& c, const http_request_view& req) {
  json doc;
  try {
    doc = json::parse(req.body);
  } catch (const json::exception& e) {
    return json_error(400, std::string("the body is not JSON: ") + e.what());
  }
  if (!doc.is_object() || !doc.contains("lr") || doc.size() != 1)
    return json_error(400, "expected {\"lr\": <number>} or {\"lr\": null}");
  const json& lr = doc.at("lr");
  if (lr.is_null()) {
    c.set_lr(std::nullopt);
    return {200, json{{"lr", nullptr}, {"schedule", true}}.dump() + "\n"};
  }
  if (!lr.is_number()) return json_error(400, "lr must be a number or null, not " + lr.dump());
  const double value = lr.get<double>();
  if (!std::isfinite(value) || value <= 0.0)
    return json_error(400, "lr must be a finite number above 0, not " + lr.dump());
  c.set_lr(value);
  return {200, json{{"lr", value}, {"schedule", false}}.dump() + "\n"};
}

}  // namespace

std::vector<http_route> control_routes(run_controls c) {
  std::vector<http_route> routes;
  routes.push_back({"POST", "/checkpoint", true, [c](const http_request_view&) {
                      c.checkpoint();
                      return accepted({{"checkpoint", "requested"}});
                    }});
  routes.push_back({"POST", "/stop", true, [c](const http_request_view&) {
                      c.stop();
                      return accepted({{"stop", "requested"}});
                    }});
  routes.push_back({"POST", "/devices", true, [c](const http_request_view&) {
                      try {
                        return http_reply{200, json{{"device", c.add_device()}}.dump() + "\n"};
                      } catch (const std::exception& e) {
                        return json_error(409, e.what());
                      }
                    }});
  routes.push_back({"DELETE", "/devices/", true, [c](const http_request_view& req) {
                      if (req.rest.empty()) return json_error(400, "DELETE /devices/{name}: no name");
                      if (!c.remove_device(req.rest)) return json_error(404, "no member named " + req.rest);
                      return accepted({{"device", req.rest}, {"remove", "requested"}});
                    }});
  routes.push_back({"PUT", "/lr", true, [c](const http_request_view& req) { return set_lr(c, req); }});
  return routes;
}

}  // namespace dpactor
