#include "tests/test_support.hpp"

#include "tensors/torch_model.hpp"
#include "train/sample_digest.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <future>
#include <random>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <string_view>

#include "tensors/json.hpp"
#include "tensors/safetensors.hpp"

namespace dpactor::testing {
namespace fs = std::filesystem;

scratch_dir::scratch_dir() {
  std::random_device rd;
  for (int attempt = 0; attempt < 100; ++attempt) {
    path_ = fs::temp_directory_path() / ("dpactor-test-" + std::to_string(rd()));
    if (fs::create_directory(path_)) return;
  }
  throw std::runtime_error("cannot create a scratch directory");
}

scratch_dir::~scratch_dir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

run_options resume_from(const std::filesystem::path& checkpoint) {
  run_options o;
  o.resume_from = checkpoint.string();
  return o;
}

run_options init_from(const std::filesystem::path& weights) {
  run_options o;
  o.init_from = weights.string();
  return o;
}

job_config small_job(std::int64_t replicas, std::int64_t batch, std::int64_t train_rows) {
  job_config c;
  c.source = "small_job";
  c.model = mlp_spec{{16, 32, 4}, activation::relu, loss_kind::cross_entropy};
  c.data.format = data_format::synthetic;
  c.data.synthetic_train = train_rows;
  c.data.synthetic_test = 256;
  c.data.synthetic_noise = 0.8;
  c.data.scale = feature_scaling::none;
  c.optimizer.kind = optimizer_kind::sgd;
  c.optimizer.lr = 0.05;
  c.optimizer.momentum = 0.9;
  c.schedule.kind = schedule_kind::constant;
  c.train.epochs = 1;
  c.train.batch_size = batch;
  c.train.micro_batch = 32;
  c.train.checkpoint_dir = "";
  c.train.log_every = 10;
  c.cluster.cpus = replicas;
  // Shard sizes and cuts that follow timing would make the arithmetic depend on
  // the machine's load; tests of stragglers turn them on.
  c.straggler.policy = straggler_policy::none;
  c.cluster.blas_threads = 1;
  return c;
}

std::string kind_name(replica_kind kind) { return kind == replica_kind::mlp ? "mlp" : "torch"; }

void PrintTo(replica_kind kind, std::ostream* os) { *os << kind_name(kind); }

job_config small_job(replica_kind kind, std::int64_t replicas, std::int64_t batch, std::int64_t train_rows) {
  job_config c = small_job(replicas, batch, train_rows);
  if (kind == replica_kind::torch) {
    c.module.kind = model_kind::torchscript;
    c.module.path = std::string(DPACTOR_SOURCE_DIR) + "/tests/data/torch/mlp_16_32_4.pt";
    c.module.input_shape = {16};
  }
  return c;
}

bool torch_available(std::string& why) {
  if (!find_torch_plugin(why).empty()) return true;
  why = "no libtorch plugin: " + why;
  return false;
}

namespace {
replica_kind running_kind = replica_kind::mlp;
}

replica_kind current_kind() { return running_kind; }

void both_replicas::SetUp() {
  running_kind = GetParam();
  std::string why;
  if (running_kind == replica_kind::torch && !torch_available(why)) GTEST_SKIP() << why;
}

void both_replicas::TearDown() { running_kind = replica_kind::mlp; }

std::string kind_case_name(const ::testing::TestParamInfo<replica_kind>& info) { return kind_name(info.param); }

std::vector<float> checkpoint_parameters(const std::filesystem::path& checkpoint) {
  std::vector<float> params;
  for (const auto& t : load_safetensors(checkpoint / "model.safetensors").tensors)
    params.insert(params.end(), t.values.begin(), t.values.end());
  return params;
}

double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

std::string idx_bytes(std::uint8_t type, const std::vector<std::uint32_t>& dims, const std::vector<std::uint8_t>& values) {
  std::string out{'\0', '\0', static_cast<char>(type), static_cast<char>(dims.size())};
  for (auto d : dims)
    for (int s = 24; s >= 0; s -= 8) out += static_cast<char>((d >> s) & 0xFF);
  out.append(values.begin(), values.end());
  return out;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

fs::path latest_checkpoint(const fs::path& root) {
  std::string name = read_text(root / "latest");
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return root / name;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

cli_process::cli_process(const std::vector<std::string>& args, const fs::path& cwd, const environment_changes& env,
                         const std::string& netns, const std::string& program)
    : log_(cwd / ".cli-output") {
  const std::string netns_path = netns.empty() ? "" : "/run/netns/" + netns;
  std::vector<std::string> argv_store{program.empty() ? std::string(DPACTOR_CLI) : program};
  argv_store.insert(argv_store.end(), args.begin(), args.end());
  std::vector<std::string> env_store;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const auto name = entry.substr(0, entry.find('='));
    if (std::none_of(env.begin(), env.end(), [&](const auto& change) { return change.first == name; }))
      env_store.emplace_back(entry);
  }
  for (const auto& [name, value] : env)
    if (value) env_store.push_back(name + "=" + *value);
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    if (!netns_path.empty()) {
      const int fd = ::open(netns_path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) ::_exit(125);
    }
    if (::chdir(cwd.c_str()) != 0) ::_exit(126);
    std::FILE* f = std::fopen(log_.c_str(), "w");
    if (f == nullptr) ::_exit(126);
    ::dup2(::fileno(f), STDOUT_FILENO);
    ::dup2(::fileno(f), STDERR_FILENO);
    std::vector<char*> argv;
    for (auto& a : argv_store) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (auto& e : env_store) envp.push_back(e.data());
    envp.push_back(nullptr);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
}

cli_process::~cli_process() {
  if (pid_ > 0 && !status_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

void cli_process::signal(int sig) {
  if (!status_) ::kill(pid_, sig);
}

bool cli_process::running() {
  if (status_) return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) status_ = status;
  return !status_;
}

process_result cli_process::wait(std::chrono::seconds limit) {
  process_result r;
  const bool ended = eventually([this] { return !running(); }, limit);
  if (!ended) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    status_ = status;
  }
  r.exit_code = WIFEXITED(*status_) ? WEXITSTATUS(*status_) : 128 + WTERMSIG(*status_);
  r.output = read_text(log_);
  if (!ended) r.output += "\n[test: still running after " + std::to_string(limit.count()) + " s; killed]\n";
  return r;
}

bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

std::string announced_port(const cli_process& p, const std::string& announcement, std::chrono::milliseconds limit) {
  std::string escaped;
  for (const char c : announcement) escaped += (c == '.' ? "\\." : std::string(1, c));
  const std::regex said(escaped + ":([0-9]+)");
  std::string port;
  eventually([&] {
    std::smatch m;
    const std::string out = p.output_so_far();
    if (!std::regex_search(out, m, said)) return false;
    port = m[1];
    return true;
  }, limit);
  return port;
}

std::string listening_port(const cli_process& p, const std::string& host, std::chrono::milliseconds limit) {
  return announced_port(p, "listening on " + host, limit);
}

run_summary wait_or_exit(Engine& engine, std::chrono::seconds limit, const std::string& what) {
  auto outcome = std::async(std::launch::async, [&engine] { return engine.wait(); });
  if (outcome.wait_for(limit) == std::future_status::timeout) {
    std::fprintf(stderr, "%s: the run neither ended nor failed within %lld s: a hang\n", what.c_str(),
                 static_cast<long long>(limit.count()));
    if (const auto* test = ::testing::UnitTest::GetInstance()->current_test_info())
      std::printf("[  FAILED  ] %s.%s (a hang)\n", test->test_suite_name(), test->name());
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(1);
  }
  return outcome.get();
}

std::string cli_process::output_so_far() const { return read_text(log_); }

void trained_evidence::record(const event& e) {
  std::lock_guard lock(mutex_);
  if (const auto* m = std::get_if<membership_event>(&e)) generation_starts_[m->generation] = m->step;
  const auto* t = std::get_if<trained_event>(&e);
  if (t == nullptr) return;
  records_.push_back(*t);
  carried_[t->step][t->device] = t->carried;
}

void trained_evidence::record_metrics(const fs::path& metrics) {
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = json::parse(line);
    if (j.value("event", "") == "membership")
      record(membership_event{j.at("generation"), j.at("step"), {}, {}, j.value("reason", "")});
    if (j.value("event", "") != "trained") continue;
    record(trained_event{j.at("device"), j.at("step").get<std::int64_t>() - 1, j.at("epoch"), j.at("samples"),
                         j.at("digest"), j.at("carried"), j.value("generation", std::int64_t{0})});
  }
}

std::string trained_evidence::replicas_agree() const {
  std::lock_guard lock(mutex_);
  for (const auto& [step, devices] : carried_) {
    const auto& [first, checksum] = *devices.begin();
    for (const auto& [device, other] : devices)
      if (other != checksum)
        return "step " + std::to_string(step + 1) + ": " + first + " carried state " + std::to_string(checksum) +
               " into it, " + device + " carried " + std::to_string(other);
  }
  return "";
}

std::optional<std::int64_t> trained_evidence::first_step_of(const std::string& device) const {
  std::lock_guard lock(mutex_);
  for (const auto& [step, devices] : carried_)
    if (devices.count(device) != 0) return step;
  return std::nullopt;
}

std::vector<std::string> trained_evidence::members_of(std::int64_t step) const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> out;
  if (const auto it = carried_.find(step); it != carried_.end())
    for (const auto& [device, checksum] : it->second) out.push_back(device);
  return out;
}

std::string trained_evidence::check(std::int64_t rows, std::int64_t epochs) const {
  std::uint64_t want = 0;
  for (std::int64_t i = 0; i < rows; ++i) want += sample_digest(static_cast<std::uint32_t>(i));
  std::lock_guard lock(mutex_);
  std::map<std::int64_t, std::pair<std::int64_t, std::uint64_t>> per_epoch;  // epoch -> (samples, digest)
  for (const trained_event& t : records_) {
    const bool rolled_back = std::any_of(generation_starts_.begin(), generation_starts_.end(), [&](const auto& g) {
      return g.first > t.generation && g.second <= t.step;
    });
    if (rolled_back) continue;
    per_epoch[t.epoch].first += t.samples;
    per_epoch[t.epoch].second += t.digest;
  }
  std::string problems;
  for (std::int64_t epoch = 0; epoch < epochs; ++epoch) {
    const auto it = per_epoch.find(epoch);
    const std::int64_t samples = it == per_epoch.end() ? 0 : it->second.first;
    const std::uint64_t digest = it == per_epoch.end() ? 0 : it->second.second;
    if (samples != rows)
      problems += "epoch " + std::to_string(epoch) + ": the devices trained " + std::to_string(samples) + " samples, not " +
                  std::to_string(rows) + "; ";
    else if (digest != want)
      problems += "epoch " + std::to_string(epoch) + ": " + std::to_string(rows) +
                  " samples, but not every index once (digest mismatch); ";
  }
  return problems;
}

process_result run_cli(const std::vector<std::string>& args, const fs::path& cwd) { return cli_process(args, cwd).wait(); }

fs::path cli_program() { return DPACTOR_CLI; }

std::vector<std::pair<std::string, std::string>> tensor_bytes(const fs::path& file) {
  const safetensors_file f = load_safetensors(file);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& t : f.tensors)
    out.emplace_back(t.name, std::string(reinterpret_cast<const char*>(t.values.data()), t.values.size() * sizeof(float)));
  return out;
}

}  // namespace dpactor::testing
