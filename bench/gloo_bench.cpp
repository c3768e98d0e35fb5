// The gloo backend's all-reduce across processes against the local backend's
// across threads, side by side in one run (not a timed test).
//   gloo_bench [--floats N] [--calls K] [--ranks P] [--pin] [--step [--separate]]
//   gloo_bench --form P [--repeats R]
// The processes run twice: Gloo's TCP on 127.0.0.1 for every pair, then
// shared memory between them (See Note [Same-machine ranks share memory]).
// Prints the median, p10 and p90 of each; N defaults to the default MLP's
// gradient size (784-256-128-10: 235,146 floats). --pin puts rank r on CPU r
// (unpinned, measured 2-4x noisier).
// --form times forming a group of P processes (issue 35): from the moment P
// processes already started are told to go to the moment the last of them
// has its group and has finished a first small call, for Gloo's own full mesh
// (gloo::rendezvous::Context::connectFullMesh and an all-reduce of one float,
// what PyTorch's Gloo process group does) and for dpactor's group over TCP and
// over shared memory (its first call, a broadcast of one float, connects).
// Every form uses a directory store; medians of R runs.

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

#include <gloo/allreduce_ring.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>

#include "comms/gloo.hpp"
#include "comms/gloo_process.hpp"
#include "comms/rendezvous_store.hpp"
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

enum class form { gloo_mesh, dpactor_tcp, dpactor_shm };

// One rank's forming, in a child process; what it returns holds the group
// (its pairs close when it goes).
std::shared_ptr<void> form_group(form f, const std::filesystem::path& dir, int rank, int ranks) {
  if (f == form::gloo_mesh) {
    gloo::rendezvous::FileStore store(dir.string());
    auto device = gloo_tcp_device("127.0.0.1");
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, ranks);
    context->setTimeout(std::chrono::seconds(60));
    context->connectFullMesh(store, device);
    float one = 1.0f;
    gloo::AllreduceRing<float>(context, {&one}, 1).run();
    return context;
  }
  gloo_group_options o;
  o.prefix = "form";
  o.shared_memory = f == form::dpactor_shm;
  o.rendezvous_timeout = std::chrono::seconds(60);
  auto group = make_gloo_group(make_directory_store(dir), ranks, o);
  auto c = group->endpoint(rank);
  float one = 1.0f;
  collective_options call;
  call.timeout = std::chrono::seconds(60);
  c->broadcast({&one, 1}, 0, call);
  return std::make_shared<std::pair<std::shared_ptr<collective_group>, std::unique_ptr<collective>>>(group,
                                                                                                      std::move(c));
}

// Seconds from "go" to the last of `ranks` processes formed, or -1.
double time_forming(form f, int ranks) {
  const auto dir = std::filesystem::temp_directory_path() / ("dpactor-gloo-form-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  int go[2], done[2], release[2];
  if (::pipe(go) != 0 || ::pipe(done) != 0 || ::pipe(release) != 0) return -1;
  std::vector<pid_t> children;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      char b = 0;
      if (::read(go[0], &b, 1) != 1) ::_exit(1);
      const auto held = form_group(f, dir, r, ranks);
      b = 1;
      if (::write(done[1], &b, 1) != 1) ::_exit(1);
      // Stay until every rank is done: a rank that leaves closes its pairs.
      if (::read(release[0], &b, 1) != 1) ::_exit(1);
      ::_exit(0);
    }
    children.push_back(pid);
  }
  ::close(done[1]);  // a child that dies early ends the reads below
  std::this_thread::sleep_for(std::chrono::milliseconds(200 + 10 * ranks));  // every child waiting
  const std::vector<char> bytes(static_cast<std::size_t>(ranks), 0);
  const auto start = clock_type::now();
  if (::write(go[1], bytes.data(), bytes.size()) != ranks) return -1;
  int formed = 0;
  for (char b = 0; formed < ranks && ::read(done[0], &b, 1) == 1;) ++formed;
  const double s = std::chrono::duration<double>(clock_type::now() - start).count();
  if (::write(release[1], bytes.data(), bytes.size()) != ranks) return -1;
  for (const pid_t pid : children) ::waitpid(pid, nullptr, 0);
  for (int fd : {go[0], go[1], done[0], release[0], release[1]}) ::close(fd);
  std::filesystem::remove_all(dir);
  return formed == ranks ? s : -1;
}

int form_main(int ranks, int repeats) {
  const std::pair<form, const char*> forms[] = {{form::gloo_mesh, "gloo connectFullMesh + all-reduce"},
                                                {form::dpactor_tcp, "dpactor group, TCP"},
                                                {form::dpactor_shm, "dpactor group, shared memory"}};
  std::vector<std::vector<double>> runs(std::size(forms));
  for (int i = 0; i < repeats; ++i)  // alternated
    for (std::size_t k = 0; k < std::size(forms); ++k) {
      const double s = time_forming(forms[k].first, ranks);
      if (s < 0) {
        std::fprintf(stderr, "gloo_bench: forming %s with %d processes failed\n", forms[k].second, ranks);
        return 1;
      }
      runs[k].push_back(s);
    }
  for (std::size_t k = 0; k < std::size(forms); ++k) {
    std::vector<double> v = runs[k];
    std::sort(v.begin(), v.end());
    std::printf("%-34s %d processes: median %.3f s  (min %.3f, max %.3f, %d runs)\n", forms[k].second, ranks,
                v[v.size() / 2], v.front(), v.back(), repeats);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t floats = 235146;
  int calls = 300;
  int ranks = 2;
  bool pinned = false;
  bool step = false;
  bool separate = false;
  int form_ranks = 0;
  int repeats = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--floats" && i + 1 < argc) floats = std::stoul(argv[++i]);
    else if (a == "--calls" && i + 1 < argc) calls = std::stoi(argv[++i]);
    else if (a == "--ranks" && i + 1 < argc) ranks = std::stoi(argv[++i]);
    else if (a == "--pin") pinned = true;
    else if (a == "--step") step = true;
    else if (a == "--separate") separate = true;
    else if (a == "--form" && i + 1 < argc) form_ranks = std::stoi(argv[++i]);
    else if (a == "--repeats" && i + 1 < argc) repeats = std::stoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: gloo_bench [--floats N] [--calls K] [--ranks P] [--pin] [--step [--separate]]\n"
                           "       gloo_bench --form P [--repeats R]\n");
      return 64;
    }
  }
  if (form_ranks > 0) return form_main(form_ranks, repeats);
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
