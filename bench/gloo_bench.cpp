// The gloo backend's all-reduce across processes against the local backend's
// across threads, side by side in one run (not a timed test).
//   gloo_bench [--floats N] [--calls K] [--ranks P] [--pin] [--step [--separate]]
// The processes run twice: Gloo's TCP on 127.0.0.1 for every pair, then
// shared memory between them (See Note [Same-machine ranks share memory]).
// Prints the median, p10 and p90 of each; N defaults to the default MLP's
// gradient size (784-256-128-10: 235,146 floats). --pin puts rank r on CPU r
// (unpinned, measured 2-4x noisier).

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comms/gloo.hpp"
#include "comms/local.hpp"
#include "comms/summation_tree.hpp"

using namespace dpactor;
using clock_type = std::chrono::steady_clock;

namespace {

struct stats {
  double p10, median, p90;
};

stats summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))]; };
  return {at(0.1), at(0.5), at(0.9)};
}

// Times `calls` all-reduces (after 20 untimed ones) on one rank, in ms. With
// `step`, each call is instead what a reproducible training step does (See
// Note [One call a step]): a small header all-reduced, the tree reduce of the
// gradients (one part per rank) and the result gathered, in one call; with
// `separate` as three calls, as before that.
std::vector<double> time_calls(collective& c, std::size_t floats, int calls, bool step, bool separate) {
  std::vector<float> v(floats, 1.0f), header(16, 1.0f);
  std::vector<double> ms;
  for (int i = 0; i < 20 + calls; ++i) {
    c.barrier({});
    const auto start = clock_type::now();
    if (step) {
      const tree_part part{static_cast<std::uint32_t>(summation_tree(static_cast<std::size_t>(c.size())).cover(
                               [&] {
                                 std::vector<std::uint8_t> owned(static_cast<std::size_t>(c.size()), 0);
                                 owned[static_cast<std::size_t>(c.rank())] = 1;
                                 return owned;
                               }())[0]),
                           v};
      if (separate) {
        c.all_reduce_sum(header, {});
        c.reduce_scatter_tree(static_cast<std::size_t>(c.size()), {&part, 1}, v, {});
        const std::span<float> all[] = {v};
        c.all_gather(all, {});
      } else {
        c.all_reduce_tree(static_cast<std::size_t>(c.size()), {&part, 1}, v, header,
                          [](std::span<const float>) { return true; }, {}, {});
      }
    } else {
      c.all_reduce_sum(v, {});
    }
    if (i >= 20) ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - start).count());
  }
  return ms;
}

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(static_cast<unsigned>(cpu) % std::thread::hardware_concurrency(), &set);
  sched_setaffinity(0, sizeof(set), &set);
}

void print(const char* what, int ranks, std::size_t floats, const stats& s) {
  std::printf("%-34s %d ranks, %zu floats: median %.3f ms  p10 %.3f  p90 %.3f\n", what, ranks, floats, s.median, s.p10, s.p90);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t floats = 235146;
  int calls = 300;
  int ranks = 2;
  bool pinned = false;
  bool step = false;
  bool separate = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--floats" && i + 1 < argc) floats = std::stoul(argv[++i]);
    else if (a == "--calls" && i + 1 < argc) calls = std::stoi(argv[++i]);
    else if (a == "--ranks" && i + 1 < argc) ranks = std::stoi(argv[++i]);
    else if (a == "--pin") pinned = true;
    else if (a == "--step") step = true;
    else if (a == "--separate") separate = true;
    else {
      std::fprintf(stderr, "usage: gloo_bench [--floats N] [--calls K] [--ranks P] [--pin] [--step [--separate]]\n");
      return 64;
    }
  }
  // Processes first (fork before this process has any thread).
  const auto processes = [&](bool shared_memory) -> std::optional<stats> {
    const auto dir = std::filesystem::temp_directory_path() / ("dpactor-gloo-bench-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::vector<pid_t> children;
    int pipefd[2];
    if (::pipe(pipefd) != 0) return std::nullopt;
    for (int r = 0; r < ranks; ++r) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        if (pinned) pin(r);
        gloo_group_options o;
        o.prefix = "bench";
        o.shared_memory = shared_memory;
        auto group = make_gloo_group(make_directory_store(dir), ranks, o);
        auto c = group->endpoint(r);
        const auto ms = time_calls(*c, floats, calls, step, separate);
        if (r == 0) {
          const stats s = summarize(ms);
          if (::write(pipefd[1], &s, sizeof(s)) != sizeof(s)) ::_exit(1);
        }
        c->barrier({});
        ::_exit(0);
      }
      children.push_back(pid);
    }
    stats gloo{};
    const bool got = ::read(pipefd[0], &gloo, sizeof(gloo)) == sizeof(gloo);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    for (const pid_t pid : children) ::waitpid(pid, nullptr, 0);
    std::filesystem::remove_all(dir);
    if (!got) return std::nullopt;
    return gloo;
  };
  const auto tcp = processes(false);
  const auto shm = processes(true);
  if (!tcp || !shm) {
    std::fprintf(stderr, "gloo_bench: the rank processes failed\n");
    return 1;
  }
  // The same calls, ranks as threads of this process.
  auto group = make_local_group(ranks);
  std::vector<std::vector<double>> local(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      if (pinned) pin(r);
      local[static_cast<std::size_t>(r)] = time_calls(*group->endpoint(r), floats, calls, step, separate);
    });
  for (auto& t : threads) t.join();
  const stats l = summarize(local[0]);
  print("gloo TCP (processes, 127.0.0.1)", ranks, floats, *tcp);
  print("gloo shared memory (processes)", ranks, floats, *shm);
  print("local (threads of one process)", ranks, floats, l);
  std::printf("gloo TCP / local (medians): %.2fx\n", tcp->median / l.median);
  std::printf("gloo shared memory / local (medians): %.2fx\n", shm->median / l.median);
  return 0;
}
