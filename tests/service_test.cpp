// The run's HTTP face (issue 15, first part): /metrics parses as Prometheus
// text and says what the events said; the endpoints answer as documented;
// bad requests get a 4xx and slow or surplus clients are cut off; the CLI
// serves a real run. Every server binds 127.0.0.1 port 0.

#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <chrono>
#include <cmath>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "service/control_routes.hpp"
#include "service/event_feed.hpp"
#include "service/feature_body.hpp"
#include "service/http_service.hpp"
#include "service/metrics_board.hpp"
#include "test_support.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// A small checker of Prometheus' text format 0.0.4: every sample belongs to
// a family announced by # HELP and # TYPE (once each, before its samples);
// names and labels are well formed; counters end in _total; values parse.
// Returns the samples by their "name{labels}" and fails the test on a
// malformed line.
std::map<std::string, double> parse_prometheus(const std::string& text) {
  static const std::regex help(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+)");
  static const std::regex type(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped))");
  static const std::regex sample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*\})? (\S+))");
  std::map<std::string, double> out;
  std::set<std::string> helped, typed;
  std::map<std::string, std::string> types;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    std::smatch m;
    if (std::regex_match(line, m, help)) {
      EXPECT_TRUE(helped.insert(m[1]).second) << "line " << n << ": a second HELP for " << m[1];
    } else if (std::regex_match(line, m, type)) {
      EXPECT_TRUE(typed.insert(m[1]).second) << "line " << n << ": a second TYPE for " << m[1];
      types[m[1]] = m[2];
      if (m[2] == "counter") {
        EXPECT_TRUE(std::string(m[1]).ends_with("_total")) << m[1] << ": a counter's name ends in _total";
      }
    } else if (std::regex_match(line, m, sample)) {
      const std::string name = m[1];
      EXPECT_TRUE(typed.count(name) && helped.count(name)) << "line " << n << ": " << name << " has no HELP and TYPE before it";
      const std::string value = m[3];
      double v = 0;
      if (value == "NaN") v = std::nan("");
      else if (value == "+Inf") v = INFINITY;
      else if (value == "-Inf") v = -INFINITY;
      else {
        std::size_t used = 0;
        EXPECT_NO_THROW(v = std::stod(value, &used)) << "line " << n << ": " << value;
        EXPECT_EQ(used, value.size()) << "line " << n << ": " << value;
      }
      EXPECT_TRUE(out.emplace(name + std::string(m[2]), v).second) << "line " << n << ": a repeated series";
    } else {
      ADD_FAILURE() << "line " << n << " is not Prometheus text: [" << line << "]";
    }
  }
  EXPECT_TRUE(text.empty() || text.back() == '\n') << "the last line ends with a newline";
  return out;
}

std::shared_ptr<metrics_board> a_board_after_a_fault() {
  auto board = std::make_shared<metrics_board>();
  board->on_event(membership_event{0, 0, {"cpu:0", "cpu:1"}, {1, 2}, "start"});
  step_event s;
  s.step = 100;
  s.loss = 0.5;
  s.accuracy = 0.8;
  s.lr = 0.1;
  s.samples_per_s = 90000;
  s.cuts = 2;
  s.shares = {0.6, 0.4};
  s.throughput = {60000, 40000};
  board->on_event(s);
  board->on_event(membership_event{1, 150, {"cpu:0"}, {1}, "cpu:1 failed: injected"});
  board->on_event(membership_event{2, 160, {"cpu:0", "cpu:2"}, {1, 3}, "cpu:2 joined"});
  board->on_event(recovery_event{1, 151, 12.5, 64});
  s.step = 200;
  s.cuts = 1;
  s.generation = 2;
  board->on_event(s);
  board->on_event(epoch_event{0, 469, 0.4, 0.85, 0.45, 0.84, 80000, 2.0, 60000, 64});
  board->on_event(checkpoint_event{200, "/tmp/x/step-200"});
  return board;
}

TEST(Metrics, TheTextParsesAndSaysWhatTheEventsSaid) {
  auto board = a_board_after_a_fault();
  const auto m = parse_prometheus(board->prometheus_text(metrics_board::clock::now() + 3s));
  EXPECT_EQ(m.at("dpactor_running"), 1.0);
  EXPECT_EQ(m.at("dpactor_steps_total"), 200.0);
  EXPECT_EQ(m.at("dpactor_cuts_total"), 3.0) << "cuts add up over step events";
  EXPECT_EQ(m.at("dpactor_membership_changes_total"), 2.0);
  EXPECT_EQ(m.at("dpactor_faults_total"), 1.0) << "a join is a membership change, not a fault";
  EXPECT_EQ(m.at("dpactor_recoveries_total"), 1.0);
  EXPECT_DOUBLE_EQ(m.at("dpactor_last_recovery_seconds"), 0.0125);
  EXPECT_EQ(m.at("dpactor_generation"), 2.0);
  EXPECT_EQ(m.at("dpactor_members"), 2.0);
  EXPECT_DOUBLE_EQ(m.at("dpactor_test_accuracy_ratio"), 0.84);
  EXPECT_DOUBLE_EQ(m.at("dpactor_device_share_ratio{device=\"cpu:2\"}"), 0.4);
  EXPECT_DOUBLE_EQ(m.at("dpactor_device_samples_per_second{device=\"cpu:0\"}"), 60000);
  EXPECT_EQ(m.at("dpactor_checkpoint_step"), 200.0);
  EXPECT_GE(m.at("dpactor_checkpoint_age_seconds"), 2.9);
  EXPECT_EQ(m.at("dpactor_requeued_samples_total"), 64.0);
}

TEST(Metrics, StatusIsTheSameStateAsJson) {
  auto board = a_board_after_a_fault();
  const json s = board->status(metrics_board::clock::now() + 3s);
  EXPECT_EQ(s.at("step"), 200);
  EXPECT_EQ(s.at("generation"), 2);
  EXPECT_EQ(s.at("faults"), 1);
  EXPECT_EQ(s.at("cuts"), 3);
  ASSERT_EQ(s.at("members").size(), 2u);
  EXPECT_EQ(s.at("members")[1].at("name"), "cpu:2");
  EXPECT_DOUBLE_EQ(s.at("members")[1].at("share").get<double>(), 0.4);
  EXPECT_DOUBLE_EQ(s.at("test_accuracy").get<double>(), 0.84);
  EXPECT_EQ(s.at("checkpoint").at("step"), 200);
  EXPECT_GE(s.at("checkpoint").at("age_s").get<double>(), 2.9);
}

TEST(Metrics, LabelValuesAreEscaped) {
  metrics_board board;
  board.on_event(membership_event{0, 0, {"node \"a\"\\b\nc/cpu:0"}, {1}, "start"});
  step_event s;
  s.shares = {1.0};
  s.throughput = {1.0};
  board.on_event(s);
  const auto m = parse_prometheus(board.prometheus_text());
  EXPECT_EQ(m.count(R"(dpactor_device_share_ratio{device="node \"a\"\\b\nc/cpu:0"})"), 1u);
}

// A blocking client: sends `request` and reads until the server closes or
// `limit` passes. Returns what it read.
std::string roundtrip(std::uint16_t port, const std::string& request, std::chrono::milliseconds limit = 5s) {
  asio::io_context io;
  tcp::socket socket(io);
  socket.connect({asio::ip::make_address("127.0.0.1"), port});
  boost::system::error_code ec;  // a server that closed at once: what it sent is still read below
  asio::write(socket, asio::buffer(request), ec);
  timeval tv{static_cast<time_t>(limit.count() / 1000), static_cast<suseconds_t>(limit.count() % 1000 * 1000)};
  ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(socket.native_handle(), buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

std::string get(std::uint16_t port, const std::string& path, const std::string& method = "GET") {
  return roundtrip(port, method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
}

int status_of(const std::string& response) {
  return response.size() > 12 && response.rfind("HTTP/1.1 ", 0) == 0 ? std::stoi(response.substr(9, 3)) : -1;
}

TEST(Http, EndpointsAnswerAsDocumented) {
  auto board = std::make_shared<metrics_board>();
  http_service service(board, {});
  ASSERT_EQ(service.address(), "127.0.0.1") << "loopback unless told otherwise";
  const std::uint16_t port = service.port();
  ASSERT_NE(port, 0);
  EXPECT_EQ(status_of(get(port, "/healthz")), 200);
  EXPECT_EQ(status_of(get(port, "/readyz")), 503) << "not ready before the run trains";
  board->on_event(membership_event{0, 0, {"cpu:0"}, {1}, "start"});
  EXPECT_EQ(status_of(get(port, "/readyz")), 200);
  const std::string metrics = get(port, "/metrics");
  EXPECT_EQ(status_of(metrics), 200) << metrics;
  EXPECT_NE(metrics.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << metrics;
  const auto body = metrics.substr(metrics.find("\r\n\r\n") + 4);
  EXPECT_EQ(parse_prometheus(body).at("dpactor_members"), 1.0);
  const std::string status = get(port, "/status");
  EXPECT_EQ(status_of(status), 200) << status;
  EXPECT_NE(status.find("Content-Type: application/json"), std::string::npos) << status;
  const json st = json::parse(status.substr(status.find("\r\n\r\n") + 4));
  EXPECT_EQ(st.at("running"), true);
  EXPECT_EQ(st.at("members").size(), 1u);
  EXPECT_EQ(st.at("members")[0].at("name"), "cpu:0");
  EXPECT_TRUE(st.at("test_accuracy").is_null()) << "no epoch has ended";
  EXPECT_EQ(status_of(get(port, "/nothing-here")), 404);
  const std::string post = get(port, "/metrics", "POST");
  EXPECT_EQ(status_of(post), 405);
  EXPECT_NE(post.find("Allow: GET"), std::string::npos) << post;
  board->set_running(false);
  EXPECT_EQ(status_of(get(port, "/readyz")), 503) << "not ready once the run is over";
}

TEST(Http, BadRequestsGetA4xxAndChangeNothing) {
  auto board = a_board_after_a_fault();
  const std::string before = board->prometheus_text(metrics_board::clock::time_point{});
  http_service service(board, {});
  const std::uint16_t port = service.port();
  EXPECT_EQ(status_of(roundtrip(port, "HELLO\r\n\r\n")), 400);
  EXPECT_EQ(status_of(roundtrip(port, "GET /metrics HTTP/1.1\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n")), 431);
  EXPECT_EQ(status_of(roundtrip(port, "POST /metrics HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n" + std::string(1000, 'b'))),
            413);
  EXPECT_EQ(status_of(roundtrip(port, "GET /metrics HTTP/1.1\r\nContent-Length: nine\r\n\r\n")), 400);
  EXPECT_EQ(board->prometheus_text(metrics_board::clock::time_point{}), before);
  EXPECT_EQ(status_of(get(port, "/healthz")), 200) << "the server still answers";
}

TEST(Http, ASlowClientIsCutOffAtTheRequestTimeout) {
  http_service_options o;
  o.request_timeout = 300ms;
  http_service service(std::make_shared<metrics_board>(), o);
  const auto start = std::chrono::steady_clock::now();
  // Half a request line, then silence.
  const std::string got = roundtrip(service.port(), "GET /metr", 10s);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(got, "") << "no answer to half a request";
  EXPECT_GE(took, 250ms);
  EXPECT_LT(took, 3s) << "the server must close a slow client's connection";
}

TEST(Http, ConnectionsOverTheLimitAreClosedAndTheOthersServed) {
  http_service_options o;
  o.max_connections = 2;
  http_service service(std::make_shared<metrics_board>(), o);
  asio::io_context io;
  tcp::socket a(io), b(io);
  a.connect({asio::ip::make_address("127.0.0.1"), service.port()});
  b.connect({asio::ip::make_address("127.0.0.1"), service.port()});
  std::this_thread::sleep_for(100ms);  // both accepted
  EXPECT_EQ(get(service.port(), "/healthz"), "") << "a third connection is closed at once";
  a.close();
  b.close();
  EXPECT_TRUE(testing::eventually([&] { return status_of(get(service.port(), "/healthz")) == 200; }, 5000ms));
}

TEST(Http, AnAddressItCannotTakeIsAnErrorNamingIt) {
  http_service first(std::make_shared<metrics_board>(), {});
  http_service_options o;
  o.port = first.port();
  o.address = "127.0.0.1";
  // reuse_address lets a second socket bind a port in TIME_WAIT, not one that listens.
  try {
    http_service second(std::make_shared<metrics_board>(), o);
    ADD_FAILURE() << "two servers on one port";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(first.port())), std::string::npos) << e.what();
  }
}

// The port a dpactor program says it serves HTTP on; 0 if it does not say
// so within a minute.
std::uint16_t served_port(testing::cli_process& run) {
  static const std::regex serving(R"(serving HTTP on 127\.0\.0\.1:(\d+))");
  std::smatch m;
  std::string out;
  if (!testing::eventually([&] {
        out = run.output_so_far();
        return std::regex_search(out, m, serving);
      }, 60000ms))
    return 0;
  return static_cast<std::uint16_t>(std::stoi(m[1]));
}

TEST(Http, TheCliServesARunningJob) {
  testing::scratch_dir dir;
  testing::cli_process run({"--model", std::string(DPACTOR_SOURCE_DIR) + "/configs/mlp.cfg", "--cpus", "2", "--serve",
                            "127.0.0.1:0", "--epochs", "3", "--set", "train.log_every=20", "--set",
                            "train.checkpoint_dir=\"\""},
                           dir.path());
  const std::uint16_t port = served_port(run);
  ASSERT_NE(port, 0) << run.output_so_far();
  double steps = 0;
  ASSERT_TRUE(testing::eventually([&] {
    const std::string r = get(port, "/metrics");
    if (status_of(r) != 200) return false;
    const auto samples = parse_prometheus(r.substr(r.find("\r\n\r\n") + 4));
    steps = samples.at("dpactor_steps_total");
    return steps > 0;
  }, 60000ms)) << run.output_so_far();
  EXPECT_EQ(status_of(get(port, "/readyz")), 200);
  const auto result = run.wait();
  EXPECT_EQ(result.exit_code, 0) << result.output;
}

// An HTTP request with an optional bearer token and JSON body.
std::string call(std::uint16_t port, const std::string& method, const std::string& path, const std::string& token = "",
                 const std::string& body = "") {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!token.empty()) req += "Authorization: Bearer " + token + "\r\n";
  if (!body.empty() || method == "POST" || method == "PUT")
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  return roundtrip(port, req + "\r\n" + body);
}

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

struct control_call {
  std::string method, path, body;
};
const std::vector<control_call> every_control{{"POST", "/checkpoint", ""},
                                              {"POST", "/stop", ""},
                                              {"POST", "/devices", ""},
                                              {"DELETE", "/devices/cpu:1", ""},
                                              {"PUT", "/lr", R"({"lr": 0.01})"}};

TEST(Control, TheTokenGuardsEveryControlEndpoint) {
  recorded_controls rec;
  http_service_options o;
  o.token = "s3cret-token";
  o.routes = control_routes(rec.bind());
  http_service service(std::make_shared<metrics_board>(), o);
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
  recorded_controls rec;
  http_service_options o;
  o.routes = control_routes(rec.bind());
  http_service service(std::make_shared<metrics_board>(), o);
  for (const auto& c : every_control) {
    EXPECT_EQ(status_of(call(service.port(), c.method, c.path, "", c.body)), 403) << c.path;
    EXPECT_EQ(status_of(call(service.port(), c.method, c.path, "anything", c.body)), 403) << c.path;
  }
  EXPECT_EQ(rec.total(), 0);
}

TEST(Control, BadBodiesAndUnknownDevicesGetA4xxAndChangeNothing) {
  recorded_controls rec;
  http_service_options o;
  o.token = "t0ken";
  o.routes = control_routes(rec.bind());
  http_service service(std::make_shared<metrics_board>(), o);
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
  const std::uint16_t port = served_port(run);
  ASSERT_NE(port, 0) << run.output_so_far();
  const auto status = [&] {
    const std::string r = get(port, "/status");
    return status_of(r) == 200 ? json::parse(r.substr(r.find("\r\n\r\n") + 4)) : json();
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
  EXPECT_EQ(status_of(call(port, "DELETE", "/devices/cpu:0", "cli-t0ken")), 202);
  EXPECT_TRUE(testing::eventually([&] { return status().at("members").size() == 2u; }, 30000ms)) << status().dump();
  EXPECT_EQ(status_of(call(port, "POST", "/stop", "cli-t0ken")), 202);
  const auto result = run.wait();
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(std::filesystem::exists(dir / "ckpt" / "latest"));
}

TEST(Events, TheFeedKeepsTheNewestAndLeavesOutTrainedEvents) {
  event_feed feed(3);
  for (int i = 0; i < 10; ++i) feed.on_event(step_event{i + 1});
  feed.on_event(trained_event{"cpu:0", 3, 0, 32, 7, 9});
  EXPECT_EQ(feed.last_id(), 10u) << "trained events are not in the feed";
  const auto all = feed.since(0, 100);
  ASSERT_EQ(all.size(), 3u) << "memory is bounded";
  EXPECT_EQ(all.front().id, 8u);
  EXPECT_EQ(json::parse(all.back().data).at("step"), 10);
  EXPECT_EQ(all.back().type, "step");
  EXPECT_EQ(feed.since(9, 100).size(), 1u);
  EXPECT_TRUE(feed.since(10, 100).empty());
}

// The lines of an event stream's answer, as an EventSource reads them.
std::vector<std::pair<std::uint64_t, json>> sse_events(const std::string& response) {
  std::vector<std::pair<std::uint64_t, json>> out;
  std::istringstream in(response.substr(response.find("\r\n\r\n") + 4));
  std::uint64_t id = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("id: ", 0) == 0) id = std::stoull(line.substr(4));
    if (line.rfind("data: ", 0) == 0) out.emplace_back(id, json::parse(line.substr(6)));
  }
  return out;
}

TEST(Events, TheStreamCarriesTheEventsInOrderAndResumesAfterLastEventId) {
  auto feed = std::make_shared<event_feed>();
  http_service_options o;
  o.events = feed;
  o.events_max_duration = 600ms;  // the stream ends, as an EventSource expects, and reconnects
  http_service service(std::make_shared<metrics_board>(), o);
  feed->on_event(membership_event{0, 0, {"cpu:0", "cpu:1"}, {1, 2}, "start"});
  feed->on_event(step_event{10});
  std::thread later([&] {
    std::this_thread::sleep_for(250ms);  // while the stream is open
    feed->on_event(checkpoint_event{10, "/tmp/x", 319});
  });
  const std::string r = roundtrip(service.port(), "GET /events HTTP/1.1\r\nHost: x\r\n\r\n", 5s);
  later.join();
  EXPECT_NE(r.find("Content-Type: text/event-stream"), std::string::npos) << r;
  const auto events = sse_events(r);
  ASSERT_EQ(events.size(), 3u) << r;
  EXPECT_EQ(events[0].second.at("event"), "membership");
  EXPECT_EQ(events[1].second.at("event"), "step");
  EXPECT_EQ(events[2].second.at("committed_sequence"), 319) << "an event that came while the stream was open";
  EXPECT_NE(r.find("event: checkpoint"), std::string::npos);
  // Reconnecting with the last id seen gives only what came after it.
  const std::string again =
      roundtrip(service.port(), "GET /events HTTP/1.1\r\nHost: x\r\nLast-Event-ID: 2\r\n\r\n", 5s);
  const auto rest = sse_events(again);
  ASSERT_EQ(rest.size(), 1u) << again;
  EXPECT_EQ(rest[0].first, 3u);
}

TEST(Dashboard, ThePageIsServedWholeFromTheBinary) {
  http_service service(std::make_shared<metrics_board>(), {});
  const std::string r = get(service.port(), "/");
  EXPECT_EQ(status_of(r), 200);
  EXPECT_NE(r.find("Content-Type: text/html"), std::string::npos);
  const std::string page = r.substr(r.find("\r\n\r\n") + 4);
  for (const char* needle : {"new EventSource(\"/events\")", "fetch(\"/status\")", "id=\"loss\"", "id=\"devices\""})
    EXPECT_NE(page.find(needle), std::string::npos) << needle;
  // Self-contained: nothing from another origin (no CDN, no web fonts).
  for (const char* outside : {"http://", "https://", "//cdn", "@import", "<link", "src="})
    EXPECT_EQ(page.find(outside), std::string::npos) << outside;
}

TEST(Predict, TheFastBodyReaderReadsWhatTheJsonParserReads) {
  for (const std::string body : {R"({"features": [0.5, -1, 2e3, 0.0001, 7]})", R"({ "features" : [ ] })",
                                 "{\"features\":[1.5,\n2.25]}\n", R"({"features": [1, 2], "id": 7})",
                                 R"({"id": 7, "features": [3]})", R"({"features": [1E2, -0.0]})"}) {
    std::vector<float> expected;
    const json doc = json::parse(body);
    for (const json& v : doc.at("features")) expected.push_back(v.get<float>());
    EXPECT_EQ(parse_feature_body(body), expected) << body;
  }
  for (const std::string bad : {"", "{", "[1, 2]", R"({"features": [1, "2"]})", R"({"features": [NaN]})",
                                R"({"features": [Infinity]})", R"({"features": [1e999]})", R"({"features": 3})",
                                R"({"feature": [1]})", R"({"features": [+1]})", R"({"features": [inf]})"})
    EXPECT_THROW(parse_feature_body(bad), std::invalid_argument) << bad;
}

TEST(Http, TheCliRefusesStreamModeSayingWhatFeedsAStream) {
  testing::scratch_dir dir;
  testing::cli_process run({"--model", std::string(DPACTOR_SOURCE_DIR) + "/configs/stream.cfg"}, dir.path());
  const auto result = run.wait(60s);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("train.mode = \"stream\""), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("examples/embed_service"), std::string::npos) << result.output;
}

TEST(Http, TheCliRefusesAnAddressItCannotParse) {
  testing::scratch_dir dir;
  testing::cli_process run({"--model", std::string(DPACTOR_SOURCE_DIR) + "/configs/mlp.cfg", "--serve", "nowhere"},
                           dir.path());
  const auto result = run.wait(60s);
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("service.listen"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace dpactor
