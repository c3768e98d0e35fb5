#include "tests/service_support.hpp"

#include <sys/socket.h>

#include <boost/asio.hpp>
#include <cmath>
#include <regex>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

namespace dpactor::testing {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

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

std::string roundtrip(std::uint16_t port, const std::string& request, std::chrono::milliseconds limit) {
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

std::string get(std::uint16_t port, const std::string& path, const std::string& method) {
  return roundtrip(port, method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
}

int status_of(const std::string& response) {
  return response.size() > 12 && response.rfind("HTTP/1.1 ", 0) == 0 ? std::stoi(response.substr(9, 3)) : -1;
}

std::string body_of(const std::string& response) { return response.substr(response.find("\r\n\r\n") + 4); }

std::string call(std::uint16_t port, const std::string& method, const std::string& path, const std::string& token,
                 const std::string& body) {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!token.empty()) req += "Authorization: Bearer " + token + "\r\n";
  if (!body.empty() || method == "POST" || method == "PUT")
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  return roundtrip(port, req + "\r\n" + body);
}

std::uint16_t served_port(const cli_process& run) {
  const std::string port = announced_port(run, "serving HTTP on 127.0.0.1", 60s);
  return port.empty() ? 0 : static_cast<std::uint16_t>(std::stoi(port));
}

}  // namespace dpactor::testing
