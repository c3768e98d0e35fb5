#pragma once
// What the tests of the run's HTTP face share (metrics_test, http_test,
// control_test, event_stream_test): a checker of Prometheus text, a board
// that has seen a fault, and a raw HTTP client on 127.0.0.1.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "service/metrics_board.hpp"
#include "tests/test_support.hpp"

namespace dpactor::testing {

// A small checker of Prometheus' text format 0.0.4: every sample belongs to
// a family announced by # HELP and # TYPE (once each, before its samples);
// names and labels are well formed; counters end in _total; values parse.
// Returns the samples by their "name{labels}" and fails the test on a
// malformed line.
std::map<std::string, double> parse_prometheus(const std::string& text);

// A board after a run of two members in which cpu:1 failed and cpu:2 joined:
// steps 100 and 200, 3 cuts, a recovery, an epoch and a checkpoint.
std::shared_ptr<metrics_board> a_board_after_a_fault();

// A blocking client: sends `request` to 127.0.0.1:`port` and reads until the
// server closes or `limit` passes. Returns what it read.
std::string roundtrip(std::uint16_t port, const std::string& request,
                      std::chrono::milliseconds limit = std::chrono::seconds(5));
// `method` `path`, without a body.
std::string get(std::uint16_t port, const std::string& path, const std::string& method = "GET");
// An HTTP request with an optional bearer token and JSON body.
std::string call(std::uint16_t port, const std::string& method, const std::string& path, const std::string& token = "",
                 const std::string& body = "");
// A response's status code, -1 if it is not an HTTP/1.1 response.
int status_of(const std::string& response);
// What follows a response's headers.
std::string body_of(const std::string& response);

// The port a dpactor program says it serves HTTP on; 0 if it does not say
// so within a minute.
std::uint16_t served_port(const cli_process& run);

}  // namespace dpactor::testing
