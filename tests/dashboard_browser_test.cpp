// The dashboard in a real browser (label `browser`): headless Chromium loads
// the page from a run that trains, a device fails and one joins, and the
// test reads the page as the browser drew it: loss and accuracy curves with
// points, a row per member in the device table, the failure in the
// timeline, the run shown running. Skips, saying why, without Chromium.
//
// DPACTOR_DASHBOARD_SCREENSHOT=FILE also saves a screenshot there (the one
// in docs/ was made so).

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <regex>

#include <dpactor/engine.hpp>
#include "config/config_file.hpp"
#include "service/event_feed.hpp"
#include "service/http_service.hpp"
#include "service/metrics_board.hpp"
#include "test_support.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;

std::string find_chromium() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"})
    if (std::filesystem::exists(p)) return p;
  return "";
}

// Runs the command, returns its standard output.
std::string output_of(const std::string& command) {
  std::string out;
  if (FILE* p = ::popen(command.c_str(), "r")) {
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    ::pclose(p);
  }
  return out;
}

int attribute_number(const std::string& dom, const std::string& id, const std::string& attribute) {
  std::smatch m;
  const std::regex re("id=\"" + id + "\"[^>]*" + attribute + "=\"(\\d+)\"");
  return std::regex_search(dom, m, re) ? std::stoi(m[1]) : -1;
}

// Trains `c` with the service in front of it until `epochs` epochs are
// done, loads the dashboard in headless Chromium (`budget_ms` of virtual
// time; DPACTOR_DASHBOARD_SCREENSHOT with `screenshot`), stops the run and
// returns the page as the browser drew it ("" if the job did not train).
std::string page_while_training(const job_config& c, int epochs, const std::string& chromium,
                                const std::filesystem::path& profile, int budget_ms, bool screenshot) {
  auto board = std::make_shared<metrics_board>();
  auto feed = std::make_shared<event_feed>();
  http_service_options o;
  o.events = feed;
  // Headless Chromium's virtual time waits while a request is open: a
  // stream that ends every second lets it go on (the page reconnects).
  o.events_max_duration = 1000ms;
  http_service service(board, o);
  std::atomic<int> done{0};
  Engine engine(c);
  engine.on_event([&](const event& e) {
    board->on_event(e);
    feed->on_event(e);
    if (std::holds_alternative<epoch_event>(e)) ++done;
  });
  engine.start();
  std::string dom;
  if (testing::eventually([&] { return done >= epochs; }, 120s)) {
    const std::string url = "http://127.0.0.1:" + std::to_string(service.port()) + "/";
    const std::string browser = "timeout 120 " + chromium + " --headless --no-sandbox --disable-gpu --hide-scrollbars " +
                                "--user-data-dir=" + profile.string() + " --window-size=1280,900 --virtual-time-budget=" +
                                std::to_string(budget_ms) + " ";
    dom = output_of(browser + "--dump-dom " + url + " 2>/dev/null");
    if (const char* shot = std::getenv("DPACTOR_DASHBOARD_SCREENSHOT"); shot && screenshot)
      output_of(browser + "--screenshot=" + std::string(shot) + " " + url + " 2>/dev/null");
  } else {
    ADD_FAILURE() << "the job did not train";
  }
  engine.stop();
  testing::wait_or_exit(engine, 120s, "the dashboard's run");
  return dom;
}

TEST(DashboardBrowser, ThePageDrawsTheRunLiveFromItsEvents) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "Chromium is not installed (apt-get install chromium): the dashboard is not tested in a browser";
  testing::scratch_dir dir;
  job_config c = load_job_config(std::string(DPACTOR_SOURCE_DIR) + "/configs/mlp.cfg",
                                 {"train.epochs=200", "train.checkpoint_dir=\"\"", "cluster.cpus=2",
                                  "train.log_every=25", "optimizer.schedule=\"constant\"",
                                  "faults.inject=[\"fail:1@900\", \"join:cpu@1400\"]"});
  const std::string dom = page_while_training(c, 4, chromium, dir / "profile", 5000, true);
  ASSERT_FALSE(dom.empty()) << "Chromium gave no page";
  EXPECT_GT(attribute_number(dom, "loss", "data-points"), 20) << dom.substr(0, 2000);
  EXPECT_GT(attribute_number(dom, "accuracy", "data-points"), 20);
  EXPECT_GT(attribute_number(dom, "throughput", "data-points"), 10);
  for (const char* device : {"cpu:0", "cpu:2"})
    EXPECT_NE(dom.find(std::string("data-device=\"") + device + "\""), std::string::npos) << device << " is a member";
  EXPECT_EQ(dom.find("data-device=\"cpu:1\""), std::string::npos) << "cpu:1 failed and left the table";
  EXPECT_NE(dom.find("cpu:1 failed"), std::string::npos) << "the failure is on the timeline";
  EXPECT_NE(dom.find("cpu:2 joined"), std::string::npos) << "the join is on the timeline";
  EXPECT_NE(dom.find("id=\"state\" class=\"running\">running"), std::string::npos) << "the run shows as running";
}

// sync.mode = "async": a table of the logical workers, each with its
// rounds contributed, drops, staleness and inner steps (docs/async.md).
TEST(DashboardBrowser, AnAsyncRunShowsItsLogicalWorkers) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "Chromium is not installed (apt-get install chromium): the dashboard is not tested in a browser";
  testing::scratch_dir dir;
  job_config c = load_job_config(std::string(DPACTOR_SOURCE_DIR) + "/configs/mlp.cfg",
                                 {"train.epochs=200", "train.checkpoint_dir=\"\"", "cluster.cpus=3",
                                  "sync.mode=\"async\"", "sync.workers=2", "train.log_every=5",
                                  "faults.inject=[\"slow:1:3\"]"});
  const std::string dom = page_while_training(c, 2, chromium, dir / "profile", 3000, false);
  ASSERT_FALSE(dom.empty()) << "Chromium gave no page";
  EXPECT_NE(dom.find("<section id=\"workers-section\">"), std::string::npos) << "the workers' table is shown";
  for (const char* worker : {"0", "1"})
    EXPECT_NE(dom.find(std::string("data-worker=\"") + worker + "\""), std::string::npos) << "worker " << worker;
  EXPECT_EQ(dom.find("data-worker=\"2\""), std::string::npos) << "2 logical workers on 3 devices";
}

}  // namespace
}  // namespace dpactor
