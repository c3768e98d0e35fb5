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

TEST(Http, TheCliServesARunningJob) {
  testing::scratch_dir dir;
  testing::cli_process run({"--model", std::string(DPACTOR_SOURCE_DIR) + "/configs/mlp.cfg", "--cpus", "2", "--serve",
                            "127.0.0.1:0", "--epochs", "3", "--set", "train.log_every=20", "--set",
                            "train.checkpoint_dir=\"\""},
                           dir.path());
  std::smatch m;
  std::string out;
  ASSERT_TRUE(testing::eventually([&] {
    out = run.output_so_far();
    static const std::regex serving(R"(serving HTTP on 127\.0\.0\.1:(\d+))");
    return std::regex_search(out, m, serving);
  }, 60000ms)) << out;
  const auto port = static_cast<std::uint16_t>(std::stoi(m[1]));
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
