#include "tests/cluster_support.hpp"

#include <utility>

namespace dpactor::testing {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

const std::string mlp_config = std::string(DPACTOR_SOURCE_DIR) + "/configs/mlp.cfg";
const std::string cnn_config = std::string(DPACTOR_SOURCE_DIR) + "/configs/cnn.cfg";
const std::vector<std::string> fast_heartbeats = {"--set", "cluster.heartbeat_ms=100", "--set",
                                                  "cluster.connection_timeout_ms=500"};
const std::string tls_dir = std::string(DPACTOR_SOURCE_DIR) + "/tests/data/tls/";

std::vector<std::string> tls_files(const std::string& name, const std::string& ca) {
  return {"--set", "cluster.tls.ca=" + tls_dir + ca + ".pem", "--set", "cluster.tls.certificate=" + tls_dir + name + ".pem",
          "--set", "cluster.tls.key=" + tls_dir + name + ".key"};
}

std::vector<std::string> tls_on(const std::string& name, const std::string& ca) {
  std::vector<std::string> args = {"--set", "cluster.tls.mode=on"};
  const auto files = tls_files(name, ca);
  args.insert(args.end(), files.begin(), files.end());
  return args;
}

cluster::cluster(std::string host) : host_(std::move(host)) {}

::testing::AssertionResult cluster::start_coordinator(const std::vector<std::string>& args,
                                                      const coordinator_options& options) {
  std::vector<std::string> all = {"--coordinator", "--model", options.model, "--listen", host_ + ":" + options.port,
                                  "--gpus", "0", "--set", "train.verify_replicas=true"};
  all.insert(all.end(), args.begin(), args.end());
  coordinator_ = start(options.dir, all, {}, options.netns);
  port_ = listening_port(*coordinator_, host_, 30s);
  if (port_.empty())
    return ::testing::AssertionFailure() << "the coordinator did not say it listens within 30 s:\n"
                                         << coordinator_->output_so_far();
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult cluster::coordinator_says(const std::string& text, std::chrono::milliseconds limit) {
  if (eventually([&] { return coordinator_->output_so_far().find(text) != std::string::npos; }, limit))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "the coordinator did not say \"" << text << "\" within " << limit.count()
                                       << " ms:\n"
                                       << coordinator_->output_so_far();
}

std::unique_ptr<cli_process> cluster::start_worker(const std::string& node, int cpus, const std::vector<std::string>& args,
                                                   const std::string& netns) {
  std::vector<std::string> all = {"--join", host_ + ":" + port_, "--node", node, "--cpus", std::to_string(cpus)};
  all.insert(all.end(), args.begin(), args.end());
  return start(node, all, {}, netns);
}

std::unique_ptr<cli_process> cluster::start(const std::string& name, const std::vector<std::string>& args,
                                            const environment_changes& env, const std::string& netns) {
  fs::create_directories(dir_ / name);
  return std::make_unique<cli_process>(args, dir_ / name, env, netns);
}

process_result cluster::run(const std::string& name, const std::vector<std::string>& args) {
  return start(name, args)->wait();
}

std::string latest_in(const fs::path& dir) {
  std::string name = read_text(dir / "latest");
  while (!name.empty() && name.back() == '\n') name.pop_back();
  return name;
}

void expect_same_state(const fs::path& a, const fs::path& b, const std::string& what) {
  for (const char* file : {"model.safetensors", "optimizer.safetensors", "workers.safetensors"}) {
    if (std::string(file) == "workers.safetensors" && !fs::exists(a / file) && !fs::exists(b / file))
      continue;  // only the round modes have logical workers
    const auto x = tensor_bytes(a / file);
    const auto y = tensor_bytes(b / file);
    ASSERT_FALSE(x.empty()) << a / file;
    EXPECT_TRUE(x == y) << file << " differs between " << what;
  }
}

}  // namespace dpactor::testing
