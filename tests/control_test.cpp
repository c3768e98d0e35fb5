// Control over HTTP (issue 15): every control route needs the bearer
// token: a missing, wrong or other-scheme token gets 401 and changes nothing,
// no token configured turns control off (403); bad bodies get 400, an
// unknown device 404; the CLI is steered with the token (rate, checkpoint,
// join, leave, stop). Every server binds 127.0.0.1 port 0.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "service/control_routes.hpp"
#include "service/http_service.hpp"
#include "service/metrics_board.hpp"
#include "tests/service_support.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;
using testing::call;
using testing::get;
using testing::roundtrip;
using testing::status_of;

// Control routes bound to counters instead of an engine.
struct recorded_controls {
  std::atomic<int> checkpoints{0}, stops{0}, adds{0}, removes{0}, lr_sets{0};
  std::optional<double> lr;
  run_controls bind() {
    return {[this] { ++checkpoints; }, [this] { ++stops; },
            [this] {
              ++adds;
              return std::string("cpu:7");
            },
            [this](const std::string& name) {
              if (name != "cpu:1") return false;
              ++removes;
              return true;
            },
            [this](std::optional<double> v) {
              ++lr_sets;
              lr = v;
            }};
  }
  int total() const { return checkpoints + stops + adds + removes + lr_sets; }
};

// A service on 127.0.0.1 port 0 whose control routes count their calls in
// `rec`; an empty `token` turns control off.
struct controlled_service {
  explicit controlled_service(const std::string& token) : service(std::make_shared<metrics_board>(), options(token)) {}
  http_service_options options(const std::string& token) {
    http_service_options o;
    o.token = token;
    o.routes = control_routes(rec.bind());
    return o;
  }
  std::uint16_t port() const { return service.port(); }
  recorded_controls rec;
  http_service service;
};

struct control_call {
  std::string method, path, body;
};
const std::vector<control_call> every_control{{"POST", "/checkpoint", ""},
                                              {"POST", "/stop", ""},
                                              {"POST", "/devices", ""},
                                              {"DELETE", "/devices/cpu:1", ""},
                                              {"PUT", "/lr", R"({"lr": 0.01})"}};

TEST(Control, TheTokenGuardsEveryControlEndpoint) {
  controlled_service service("s3cret-token");
  const recorded_controls& rec = service.rec;
  for (const auto& c : every_control) {
    SCOPED_TRACE(c.method + " " + c.path);
    for (const std::string wrong : {"", "s3cret-toke", "s3cret-token2", "S3CRET-TOKEN", "s3cret-tokeN"}) {
      const std::string r = call(service.port(), c.method, c.path, wrong, c.body);
      EXPECT_EQ(status_of(r), 401) << "token \"" << wrong << "\": " << r;
      EXPECT_NE(r.find("WWW-Authenticate: Bearer"), std::string::npos) << r;
    }
    // A scheme other than Bearer is no token either.
    const std::string basic = roundtrip(service.port(), c.method + " " + c.path +
                                                            " HTTP/1.1\r\nAuthorization: Basic s3cret-token\r\n"
                                                            "Content-Length: 0\r\nConnection: close\r\n\r\n");
    EXPECT_EQ(status_of(basic), 401) << basic;
  }
  EXPECT_EQ(rec.total(), 0) << "a refused request reached the run";
  for (const auto& c : every_control) {
    const std::string r = call(service.port(), c.method, c.path, "s3cret-token", c.body);
    EXPECT_GE(status_of(r), 200) << c.path << ": " << r;
    EXPECT_LT(status_of(r), 300) << c.path << ": " << r;
  }
  EXPECT_EQ(rec.checkpoints, 1);
  EXPECT_EQ(rec.stops, 1);
  EXPECT_EQ(rec.adds, 1);
  EXPECT_EQ(rec.removes, 1);
  ASSERT_EQ(rec.lr_sets, 1);
  EXPECT_EQ(rec.lr, 0.01);
  EXPECT_NE(call(service.port(), "POST", "/devices", "s3cret-token").find(R"("device":"cpu:7")"), std::string::npos);
}

TEST(Control, WithoutATokenTheControlEndpointsAreOff) {
  controlled_service service("");
  const recorded_controls& rec = service.rec;
  for (const auto& c : every_control) {
    EXPECT_EQ(status_of(call(service.port(), c.method, c.path, "", c.body)), 403) << c.path;
    EXPECT_EQ(status_of(call(service.port(), c.method, c.path, "anything", c.body)), 403) << c.path;
  }
  EXPECT_EQ(rec.total(), 0);
}

TEST(Control, BadBodiesAndUnknownDevicesGetA4xxAndChangeNothing) {
  controlled_service service("t0ken");
  const recorded_controls& rec = service.rec;
  const auto port = service.port();
  for (const std::string body : {"", "{", "lr=0.1", "[0.1]", R"({"lr": -0.1})", R"({"lr": 0})", R"({"lr": NaN})",
                                 R"({"lr": "0.1"})", R"({"lr": 1e999})", R"({"lr": 0.1, "extra": 1})", R"({"rate": 0.1})"}) {
    const std::string r = call(port, "PUT", "/lr", "t0ken", body);
    EXPECT_EQ(status_of(r), 400) << body << ": " << r;
    EXPECT_NE(r.find(R"("error")"), std::string::npos) << r;
  }
  EXPECT_EQ(status_of(call(port, "DELETE", "/devices/cpu:9", "t0ken")), 404);
  EXPECT_EQ(status_of(call(port, "DELETE", "/devices/", "t0ken")), 404) << "no name";
  const std::string get_lr = call(port, "GET", "/lr", "t0ken");
  EXPECT_EQ(status_of(get_lr), 405);
  EXPECT_NE(get_lr.find("Allow: PUT"), std::string::npos) << get_lr;
  EXPECT_EQ(rec.total(), 0) << "a bad request reached the run";
  // null returns to the schedule.
  EXPECT_EQ(status_of(call(port, "PUT", "/lr", "t0ken", R"({"lr": null})")), 200);
  EXPECT_EQ(rec.lr_sets, 1);
  EXPECT_FALSE(rec.lr.has_value());
}

// The dpactor program with the token in its environment: the rate changes,
// a checkpoint is written on demand, a device joins and one leaves, and a
// stop ends the run with a checkpoint; a wrong token changes nothing.
TEST(Control, TheCliIsSteeredWithTheToken) {
  testing::scratch_dir dir;
  testing::cli_process run({"--model", std::string(DPACTOR_SOURCE_DIR) + "/configs/mlp.cfg", "--cpus", "2", "--serve",
                            "127.0.0.1:0", "--epochs", "200", "--set", "train.log_every=5", "--set",
                            "optimizer.schedule=\"constant\"", "--set", "train.checkpoint_dir=\"ckpt\""},
                           dir.path(), {{"DPACTOR_SERVICE_TOKEN", "cli-t0ken"}});
  const std::uint16_t port = testing::served_port(run);
  ASSERT_NE(port, 0) << run.output_so_far();
  const auto status = [&] {
    const std::string r = get(port, "/status");
    return status_of(r) == 200 ? json::parse(testing::body_of(r)) : json();
  };
  ASSERT_TRUE(testing::eventually([&] { const json s = status(); return !s.is_null() && s.at("step") > 0; }, 60000ms))
      << run.output_so_far();
  EXPECT_EQ(status_of(call(port, "PUT", "/lr", "wrong", R"({"lr": 0.5})")), 401);
  EXPECT_EQ(status_of(call(port, "PUT", "/lr", "cli-t0ken", R"({"lr": 0.0125})")), 200);
  EXPECT_TRUE(testing::eventually([&] { return status().at("lr") == 0.0125; }, 30000ms)) << status().dump();
  EXPECT_EQ(status_of(call(port, "POST", "/checkpoint", "cli-t0ken")), 202);
  EXPECT_TRUE(testing::eventually([&] { return !status().at("checkpoint").is_null(); }, 30000ms)) << status().dump();
  const std::string added = call(port, "POST", "/devices", "cli-t0ken");
  EXPECT_EQ(status_of(added), 200) << added;
  EXPECT_TRUE(testing::eventually([&] { return status().at("members").size() == 3u; }, 30000ms)) << status().dump();
  EXPECT_EQ(status_of(call(port, "DELETE", "/devices/cpu:9", "cli-t0ken")), 404) << "no member: the engine's unknown_device";
  EXPECT_EQ(status_of(call(port, "DELETE", "/devices/cpu:0", "cli-t0ken")), 202);
  EXPECT_TRUE(testing::eventually([&] { return status().at("members").size() == 2u; }, 30000ms)) << status().dump();
  EXPECT_EQ(status_of(call(port, "POST", "/stop", "cli-t0ken")), 202);
  const auto result = run.wait();
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(std::filesystem::exists(dir / "ckpt" / "latest"));
}

}  // namespace
}  // namespace dpactor
