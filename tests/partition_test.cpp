// A network partition (issue 12, acceptance 5): the coordinator and a worker
// each in a network namespace this test makes, joined by a veth pair; the
// worker's side is cut off with nftables mid-training. The coordinator's side
// goes on without it; the cut-off worker fences itself (See Note [A worker
// never trains alone]). Off loopback, the control plane is under mutual TLS
// by default (the test certificates of tests/data/tls). Nothing listens outside these namespaces. Skips, with
// the reason, where namespaces or nftables are not available (not root, no
// iproute2 or nftables, a container without CAP_NET_ADMIN).

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>

#include "tests/cluster_support.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;
using testing::fast_heartbeats;

bool run(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()) == 0; }

// Two namespaces, A (10.77.0.1) and B (10.77.0.2), joined by a veth pair,
// removed with everything in them when it goes.
class namespace_pair {
 public:
  namespace_pair() {
    const std::string id = std::to_string(::getpid());
    a_ = "dpa" + id;
    b_ = "dpb" + id;
    if (::geteuid() != 0) {
      why_not_ = "not root: network namespaces need CAP_SYS_ADMIN";
      return;
    }
    if (!run("command -v ip") || !run("command -v nft")) {
      why_not_ = "ip (iproute2) or nft (nftables) is not installed (scripts/setup installs both)";
      return;
    }
    const std::string va = "va" + id, vb = "vb" + id;
    made_ = run("ip netns add " + a_) && run("ip netns add " + b_);
    const bool ok = made_ && run("ip link add " + va + " netns " + a_ + " type veth peer name " + vb + " netns " + b_) &&
                    run("ip -n " + a_ + " addr add 10.77.0.1/24 dev " + va) &&
                    run("ip -n " + b_ + " addr add 10.77.0.2/24 dev " + vb) &&
                    run("ip -n " + a_ + " link set " + va + " up") && run("ip -n " + b_ + " link set " + vb + " up") &&
                    run("ip -n " + a_ + " link set lo up") && run("ip -n " + b_ + " link set lo up") &&
                    run("ip netns exec " + b_ + " nft add table inet dpactor_cut");
    if (!ok) why_not_ = "could not make two network namespaces joined by a veth pair with an nftables table in one";
  }
  ~namespace_pair() {
    if (made_) {
      run("ip netns del " + a_);
      run("ip netns del " + b_);
    }
  }
  const std::string& why_not() const { return why_not_; }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }
  // B drops every packet from and to A.
  bool cut_b_off() const {
    const std::string nft = "ip netns exec " + b_ + " nft ";
    return run(nft + "'add chain inet dpactor_cut in { type filter hook input priority 0; }'") &&
           run(nft + "'add chain inet dpactor_cut out { type filter hook output priority 0; }'") &&
           run(nft + "add rule inet dpactor_cut in ip saddr 10.77.0.1 drop") &&
           run(nft + "add rule inet dpactor_cut out ip daddr 10.77.0.1 drop");
  }

 private:
  std::string a_, b_, why_not_;
  bool made_ = false;
};

TEST(Partition, TheCoordinatorsSideGoesOnAndTheCutOffWorkerFences) {
  namespace_pair ns;
  if (!ns.why_not().empty()) GTEST_SKIP() << ns.why_not();
  // TLS is on by default off loopback: the files, mode left at auto.
  testing::cluster job("10.77.0.1");
  std::vector<std::string> cargs = {"--cpus", "1", "--wait-devices", "2", "--set", "train.max_steps=1000"};
  cargs.insert(cargs.end(), fast_heartbeats.begin(), fast_heartbeats.end());
  const auto ctls = testing::tls_files("coordinator");
  cargs.insert(cargs.end(), ctls.begin(), ctls.end());
  testing::coordinator_options in_a;
  in_a.netns = ns.a();
  ASSERT_TRUE(job.start_coordinator(cargs, in_a));
  std::vector<std::string> wargs = fast_heartbeats;
  const auto wtls = testing::tls_files("worker");
  wargs.insert(wargs.end(), wtls.begin(), wtls.end());
  auto worker = job.start_worker("B", 1, wargs, ns.b());
  ASSERT_TRUE(job.coordinator_says("generation 0: 2 members")) << worker->output_so_far();
  std::this_thread::sleep_for(1s);
  ASSERT_TRUE(ns.cut_b_off());
  const auto cut = std::chrono::steady_clock::now();
  ASSERT_TRUE(job.coordinator_says("generation 1", 30s));
  const auto removed_after = std::chrono::steady_clock::now() - cut;
  std::printf("[ measured ] the cut-off worker was removed %.0f ms after the cut\n",
              std::chrono::duration<double, std::milli>(removed_after).count());
  const auto w = worker->wait(60s);
  const auto fenced_after = std::chrono::steady_clock::now() - cut;
  const auto c = job.coordinator().wait(120s);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("mutual TLS on the control plane"), std::string::npos)
      << "TLS is on by default off loopback: " << c.output;
  EXPECT_NE(c.output.find("generation 1 from step"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("1 members (cpu:0)"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("(1000 steps"), std::string::npos) << "the coordinator's side trains every step: " << c.output;
  EXPECT_EQ(w.exit_code, 6) << "the cut-off worker must fence itself: " << w.output;
  EXPECT_NE(w.output.find("fenced: lost the coordinator"), std::string::npos) << w.output;
  // Removed at the connection timeout (500 ms): its link is reported
  // unreachable. The other ways a cut-off worker goes, the hang check (5 s at
  // the least) and the collective timeout, would say "hung" or "timed out".
  std::smatch line;
  ASSERT_TRUE(std::regex_search(c.output, line, std::regex("generation 1 from step [^\\n]*"))) << c.output;
  EXPECT_NE(line.str().find("B/cpu:0 exited: exit_reason(remote_link_unreachable)"), std::string::npos) << line.str();
  EXPECT_EQ(line.str().find("hung"), std::string::npos) << line.str();
  EXPECT_EQ(line.str().find("timed out"), std::string::npos) << line.str();
  std::printf("[ measured ] the cut-off worker exited fenced %.0f ms after the cut\n",
              std::chrono::duration<double, std::milli>(fenced_after).count());
}

}  // namespace
}  // namespace dpactor
