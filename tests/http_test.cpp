// The run's HTTP server (issue 15, first part): the endpoints answer as
// documented (/healthz, /readyz, 404, 405); a malformed request, an
// oversized header or body get 400, 431 and 413 and change nothing; a slow
// client is cut off at the request timeout; connections over the limit are
// closed; the dashboard page is served whole; the prediction body reader
// reads what a JSON parser reads; the CLI's --serve serves a real run. Every
// server binds 127.0.0.1 port 0.

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "service/feature_body.hpp"
#include "service/http_service.hpp"
#include "service/metrics_board.hpp"
#include "tests/service_support.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using testing::get;
using testing::parse_prometheus;
using testing::roundtrip;
using testing::status_of;

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
  const auto body = testing::body_of(metrics);
  EXPECT_EQ(parse_prometheus(body).at("dpactor_members"), 1.0);
  const std::string status = get(port, "/status");
  EXPECT_EQ(status_of(status), 200) << status;
  EXPECT_NE(status.find("Content-Type: application/json"), std::string::npos) << status;
  const json st = json::parse(testing::body_of(status));
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
  auto board = testing::a_board_after_a_fault();
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

// The server, not the client's patience (10 s), ends the connection: the
// client reads the end of the stream (or a reset), where a server that held
// the connection would leave it waiting until its own receive timeout.
TEST(Http, ASlowClientIsCutOffAtTheRequestTimeout) {
  http_service_options o;
  o.request_timeout = 300ms;
  http_service service(std::make_shared<metrics_board>(), o);
  const auto start = std::chrono::steady_clock::now();
  asio::io_context io;
  tcp::socket socket(io);
  socket.connect({asio::ip::make_address("127.0.0.1"), service.port()});
  asio::write(socket, asio::buffer(std::string("GET /metr")));  // half a request line, then silence
  const timeval patience{10, 0};
  ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof patience);
  std::string got;
  char buf[4096];
  ssize_t n = 0;
  while ((n = ::recv(socket.native_handle(), buf, sizeof buf, 0)) > 0) got.append(buf, static_cast<std::size_t>(n));
  const int error = n < 0 ? errno : 0;
  const auto took = std::chrono::steady_clock::now() - start;
  std::printf("[ measured ] a 300 ms request timeout: the connection ended after %.0f ms\n",
              std::chrono::duration<double, std::milli>(took).count());
  EXPECT_TRUE(n == 0 || error == ECONNRESET)
      << "the server must close a slow client's connection; the client gave up instead ("
      << std::strerror(error) << ")";
  EXPECT_EQ(got, "") << "no answer to half a request";
  EXPECT_GE(took, 250ms);
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
  const std::uint16_t port = testing::served_port(run);
  ASSERT_NE(port, 0) << run.output_so_far();
  double steps = 0;
  ASSERT_TRUE(testing::eventually([&] {
    const std::string r = get(port, "/metrics");
    if (status_of(r) != 200) return false;
    const auto samples = parse_prometheus(testing::body_of(r));
    steps = samples.at("dpactor_steps_total");
    return steps > 0;
  }, 60000ms)) << run.output_so_far();
  EXPECT_EQ(status_of(get(port, "/readyz")), 200);
  const auto result = run.wait();
  EXPECT_EQ(result.exit_code, 0) << result.output;
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

TEST(Dashboard, ThePageIsServedWholeFromTheBinary) {
  http_service service(std::make_shared<metrics_board>(), {});
  const std::string r = get(service.port(), "/");
  EXPECT_EQ(status_of(r), 200);
  EXPECT_NE(r.find("Content-Type: text/html"), std::string::npos);
  const std::string page = testing::body_of(r);
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

}  // namespace
}  // namespace dpactor
