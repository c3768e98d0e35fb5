// The run's events over HTTP (issue 15): the feed keeps the newest events
// (memory is bounded) and leaves out the devices' trained records; /events
// streams every event in order as server-sent events, and a client that
// reconnects with Last-Event-ID gets only what came after. Every server
// binds 127.0.0.1 port 0.

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "service/event_feed.hpp"
#include "service/http_service.hpp"
#include "service/metrics_board.hpp"
#include "tests/service_support.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;
using testing::roundtrip;

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
  std::istringstream in(testing::body_of(response));
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

}  // namespace
}  // namespace dpactor
