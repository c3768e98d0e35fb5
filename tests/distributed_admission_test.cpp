// Who makes up a distributed job, with real processes on 127.0.0.1 (See Note
// [Coordinator and workers]): roles from a launcher's environment without
// flags; a worker of another config or other data is refused naming the
// difference; under mutual TLS only peers certified by the CA join, and
// every refusal is clear on both sides; bad TLS files and bad addresses are
// usage errors before anything listens. Each refused worker changes nothing:
// the job still waits for, and trains with, a good one.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/cluster_support.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;
using testing::cluster;
using testing::mlp_config;
using testing::tls_dir;
using testing::tls_on;

TEST(Distributed, RolesComeFromTheLaunchersEnvironmentWithoutFlags) {
  cluster job;
  // What torchrun or Kubeflow set for rank 0 of a world of 3 (port 0: any
  // free one, read back from the output), and DPACTOR_COORDINATOR for the
  // others; every other launcher variable unset.
  const testing::environment_changes clean = {
      {"TORCHELASTIC_USE_AGENT_STORE", std::nullopt}, {"DPACTOR_PORT", std::nullopt}, {"GROUP_RANK", std::nullopt},
      {"SLURM_PROCID", std::nullopt}, {"LOCAL_WORLD_SIZE", std::nullopt}};
  testing::environment_changes rank0 = clean;
  rank0.insert(rank0.end(), {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "0"}, {"WORLD_SIZE", "3"}, {"RANK", "0"},
                             {"DPACTOR_COORDINATOR", std::nullopt}});
  const std::vector<std::string> same = {"--model", mlp_config, "--gpus", "0", "--cpus", "1", "--set", "train.max_steps=200"};
  auto coordinator = job.start("c", same, rank0);
  const std::string port = testing::listening_port(*coordinator, "127.0.0.1", 30s);
  ASSERT_FALSE(port.empty()) << coordinator->output_so_far();
  EXPECT_NE(coordinator->output_so_far().find("waiting for 2 workers (from the environment: RANK=0, WORLD_SIZE=3"),
            std::string::npos) << coordinator->output_so_far();
  auto worker_env = [&] {
    testing::environment_changes e = clean;
    e.insert(e.end(), {{"DPACTOR_COORDINATOR", "127.0.0.1:" + port}, {"MASTER_ADDR", std::nullopt},
                       {"MASTER_PORT", std::nullopt}, {"WORLD_SIZE", std::nullopt}, {"RANK", std::nullopt}});
    return e;
  };
  auto a = job.start("a", same, worker_env());
  ASSERT_TRUE(testing::eventually([&] { return coordinator->output_so_far().find("node ") != std::string::npos; }, 60s))
      << coordinator->output_so_far();
  // Two devices are there, but the world has three processes: it waits.
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(coordinator->output_so_far().find("generation 0"), std::string::npos) << coordinator->output_so_far();
  auto b = job.start("b", same, worker_env());
  const auto c = coordinator->wait(120s);
  const auto wa = a->wait(60s);
  const auto wb = b->wait(60s);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(wa.exit_code, 0) << wa.output;
  EXPECT_EQ(wb.exit_code, 0) << wb.output;
  EXPECT_NE(c.output.find("generation 0: 3 members"), std::string::npos) << c.output;
  EXPECT_NE(wa.output.find("joining 127.0.0.1:" + port + " (from the environment: DPACTOR_COORDINATOR="),
            std::string::npos) << wa.output;
}

TEST(Distributed, AWorkerWithAnotherConfigOrOtherDataIsRefusedNamingTheDifferenceAndChangesNothing) {
  cluster job;
  ASSERT_TRUE(job.start_coordinator({"--cpus", "1", "--wait-devices", "2", "--set", "train.max_steps=200"}));
  const auto wc = job.start_worker("lr", 1, {"--set", "optimizer.lr=0.5"})->wait(60s);
  EXPECT_EQ(wc.exit_code, 7) << wc.output;
  EXPECT_NE(wc.output.find("refused this worker: its config differs: optimizer.lr = "), std::string::npos) << wc.output;
  EXPECT_NE(wc.output.find("(coordinator) against 0.5 (worker)"), std::string::npos) << wc.output;
  const auto wd = job.start_worker("synthetic", 1, {"--set", "data.format=synthetic"})->wait(60s);
  EXPECT_EQ(wd.exit_code, 7) << wd.output;
  EXPECT_NE(wd.output.find("refused this worker: its data differs: the coordinator has train 60000 x 784"),
            std::string::npos) << wd.output;
  EXPECT_NE(wd.output.find("the worker has train 4096 x 784"), std::string::npos) << wd.output;
  // The job still waits for its second device, and trains with a good one.
  const auto g = job.start_worker("good", 1)->wait(120s);
  const auto c = job.coordinator().wait(120s);
  EXPECT_EQ(g.exit_code, 0) << g.output;
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("refused node lr: its config differs"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("refused node synthetic: its data differs"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("generation 0: 2 members (cpu:0, good/cpu:0)"), std::string::npos) << c.output;
}

// A TLS handshake with the coordinator on 127.0.0.1:`port` by a peer that
// trusts the test CA and presents `name`.pem (nothing when empty), then one
// read, on which a TLS 1.3 server's refusal of the client's certificate
// arrives. Returns whether the connection was still open after it.
bool tls_peer_handshake(const std::string& port, const std::string& name) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_load_verify_locations(ctx, (tls_dir + "ca.pem").c_str(), nullptr);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  if (!name.empty()) {
    SSL_CTX_use_certificate_chain_file(ctx, (tls_dir + name + ".pem").c_str());
    SSL_CTX_use_PrivateKey_file(ctx, (tls_dir + name + ".key").c_str(), SSL_FILETYPE_PEM);
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(std::stoi(port)));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  bool open = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    if (SSL_connect(ssl) == 1) {
      char byte = 0;
      open = SSL_read(ssl, &byte, 1) > 0;
    }
    SSL_free(ssl);
  }
  ::close(fd);
  SSL_CTX_free(ctx);
  return open;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(Distributed, UnderMutualTlsOnlyPeersCertifiedByTheCaJoinAndEveryRefusalIsClearOnBothSides) {
  cluster job;
  std::vector<std::string> args = {"--cpus", "1", "--wait-devices", "2", "--set", "train.max_steps=300"};
  const auto own = tls_on("coordinator");
  args.insert(args.end(), own.begin(), own.end());
  ASSERT_TRUE(job.start_coordinator(args));
  const std::string port = job.port();

  // A worker of another CA: it refuses the coordinator, and says so; the
  // coordinator learns that the peer ended the handshake.
  const auto wr = job.start_worker("rogue", 1, tls_on("rogue", "rogue-ca"))->wait(60s);
  EXPECT_EQ(wr.exit_code, 7) << wr.output;
  EXPECT_NE(wr.output.find("refused the TLS certificate of the coordinator at 127.0.0.1:" + port + ": unknown CA"),
            std::string::npos) << wr.output;
  // Peers that trust the coordinator but hold no certificate from its CA,
  // or none at all: the coordinator refuses them, naming the reason.
  EXPECT_FALSE(tls_peer_handshake(port, "rogue"));
  EXPECT_FALSE(tls_peer_handshake(port, ""));
  // A worker without TLS: the coordinator closes the connection, the worker
  // says it may need TLS.
  const auto wp = job.start_worker("plain", 1, {"--set", "cluster.tls.mode=off"})->wait(60s);
  EXPECT_EQ(wp.exit_code, 7) << wp.output;
  EXPECT_NE(wp.output.find("closed the connection during the handshake: it may require TLS"), std::string::npos) << wp.output;

  // None of them changed the job: it still waits for its second device,
  // and trains with a certified worker.
  EXPECT_EQ(job.coordinator().output_so_far().find("generation 0"), std::string::npos) << job.coordinator().output_so_far();
  const auto g = job.start_worker("good", 1, tls_on("worker"))->wait(120s);
  const auto c = job.coordinator().wait(120s);
  EXPECT_EQ(g.exit_code, 0) << g.output;
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("mutual TLS on the control plane"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("ended the handshake: unknown CA"), std::string::npos) << c.output;
  EXPECT_TRUE(std::regex_search(c.output, std::regex("refused a TLS peer at 127\\.0\\.0\\.1:[0-9]+: unknown CA \\(unable to "
                                                     "get local issuer certificate, certificate /CN=rogue worker\\)")))
      << c.output;
  EXPECT_TRUE(std::regex_search(c.output, std::regex("refused a TLS peer at 127\\.0\\.0\\.1:[0-9]+: certificate required")))
      << c.output;
  EXPECT_EQ(count(c.output, "refused a TLS peer"), 2U) << "only the two refusals: " << c.output;
  EXPECT_EQ(count(g.output, "TLS"), 0U) << "a certified worker sees no TLS error: " << g.output;
  EXPECT_NE(c.output.find("generation 0: 2 members (cpu:0, good/cpu:0)"), std::string::npos) << c.output;
  EXPECT_EQ(c.output.find("generation 1"), std::string::npos) << c.output;
}

TEST(Distributed, TlsWithoutItsFilesOrWithAKeyOfAnotherCertificateIsAConfigErrorBeforeAnythingListens) {
  cluster job;
  const auto r = job.run("coordinator", {"--coordinator", "--model", mlp_config, "--gpus", "0", "--cpus", "1", "--listen",
                                         "127.0.0.1:0", "--set", "cluster.tls.mode=on", "--set",
                                         "cluster.tls.ca=" + tls_dir + "ca.pem"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("cluster.tls.mode = \"on\", which needs cluster.tls.ca, cluster.tls.certificate and "
                          "cluster.tls.key; cluster.tls.certificate, cluster.tls.key not set"),
            std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("listening on"), std::string::npos) << r.output;
  auto mixed = tls_on("worker");
  mixed.back() = "cluster.tls.key=" + tls_dir + "coordinator.key";
  std::vector<std::string> w = {"--join", "127.0.0.1:1"};
  w.insert(w.end(), mixed.begin(), mixed.end());
  const auto wr = job.run("mixed", w);
  EXPECT_EQ(wr.exit_code, 2) << wr.output;
  EXPECT_NE(wr.output.find("coordinator.key: does not belong to cluster.tls.certificate = " + tls_dir + "worker.pem"),
            std::string::npos) << wr.output;
  auto foreign = tls_on("rogue");  // the test CA did not sign it
  w = {"--join", "127.0.0.1:1"};
  w.insert(w.end(), foreign.begin(), foreign.end());
  const auto wf = job.run("foreign", w);
  EXPECT_EQ(wf.exit_code, 2) << wf.output;
  EXPECT_NE(wf.output.find("rogue.pem: does not pass the check against cluster.tls.ca"), std::string::npos) << wf.output;
}

TEST(Distributed, AWorkerTakesNoModelAndAMalformedAddressIsAUsageError) {
  cluster job;
  const auto with_model = job.run("model", {"--join", "127.0.0.1:1", "--model", mlp_config});
  EXPECT_EQ(with_model.exit_code, 2) << with_model.output;
  EXPECT_NE(with_model.output.find("takes the job's config from the coordinator"), std::string::npos) << with_model.output;
  const auto bad = job.run("join", {"--join", "127.0.0.1"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--join '127.0.0.1' is not HOST:PORT"), std::string::npos) << bad.output;
  const auto listen = job.run("listen", {"--coordinator", "--model", mlp_config, "--listen", "127.0.0.1:99999"});
  EXPECT_EQ(listen.exit_code, 2) << listen.output;
  EXPECT_NE(listen.output.find("the port is not a number from 0 to 65535"), std::string::npos) << listen.output;
}

}  // namespace
}  // namespace dpactor
