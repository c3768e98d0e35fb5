// One rank of a Gloo group as its own process, for tests/gloo_process_test.
//   gloo_rank SCENARIO STORE_DIR RANK SIZE OUT_FILE TRANSPORT [RENDEZVOUS_MS]
// TRANSPORT: tcp, or shm (shared memory where the peers offer it too).
// conform: exact all-reduce sums over a sweep of sizes (exit 2 on a wrong
//          one), then the bytes of an inexact all-reduce and of a tree
//          reduce-scatter go to OUT_FILE.
// loop:    a barrier, "ready K" in OUT_FILE (K: the peers reached through
//          shared memory), then all-reduces until one fails:
//          OUT_FILE gets "failed CODE NANOSECONDS" (steady clock) and the
//          exit code is 3. loop-big: the same with 64 MB buffers.
// send-big: like loop, but broadcasts of 256 MB from rank 0: rank 0 only
//          writes to its peers, and they only read.
// Like any program, it keeps SIGPIPE's default action (the process ends):
// what the backend does about SIGPIPE must hold without help from main.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "comms/gloo.hpp"
#include "gloo_scenario.hpp"

using namespace dpactor;

namespace {

void write_floats(std::ofstream& out, const std::vector<float>& v) {
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 7 || (std::string(argv[6]) != "tcp" && std::string(argv[6]) != "shm")) {
    std::fprintf(stderr, "usage: gloo_rank SCENARIO STORE_DIR RANK SIZE OUT_FILE tcp|shm [RENDEZVOUS_MS]\n");
    return 64;
  }
  const std::string scenario = argv[1];
  const int rank = std::stoi(argv[3]);
  const int size = std::stoi(argv[4]);
  const std::string out_file = argv[5];
  gloo_group_options options;
  options.prefix = "g1";
  options.shared_memory = std::string(argv[6]) == "shm";
  if (argc > 7) options.rendezvous_timeout = std::chrono::milliseconds(std::stoi(argv[7]));
  auto group = make_gloo_group(make_directory_store(argv[2]), size, options);
  auto c = group->endpoint(rank);
  try {
    if (scenario == "conform") {
      for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4099}, std::size_t{1} << 20}) {
        std::vector<float> v(n);
        for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(rank) + static_cast<float>(i % 7);
        c->all_reduce_sum(v, {});
        for (std::size_t i = 0; i < n; ++i) {
          const float want = static_cast<float>(size * (size - 1) / 2 + size * static_cast<int>(i % 7));
          if (v[i] != want) {
            std::fprintf(stderr, "rank %d, size %zu, first bad index %zu: got %g, want %g\n", rank, n, i, v[i], want);
            return 2;
          }
        }
      }
      std::ofstream out(out_file, std::ios::binary);
      write_floats(out, testing::conform_results(*c));
      return 0;
    }
    if (scenario == "loop" || scenario == "loop-big" || scenario == "send-big") {
      // loop-big: 64 MB a call, so that a peer's death lands in the middle of
      // a message; send-big: 256 MB, several times what the two sockets
      // buffer, so that a writer stopped at random is most likely stopped
      // with part of a message still to write. Filled before "ready": the
      // calls start at once.
      const std::size_t floats = scenario == "loop" ? 235146 : scenario == "loop-big" ? std::size_t{16} << 20
                                                                                      : std::size_t{64} << 20;
      std::vector<float> v(floats, 1.0f);
      c->barrier({});
      { std::ofstream(out_file) << "ready " << gloo_shared_memory_peers(*c) << "\n"; }
      const collective_options options{std::chrono::seconds(30)};
      for (long i = 0;; ++i) {
        if (scenario == "send-big") c->broadcast(v, 0, options);
        else c->all_reduce_sum(v, options);
      }
    }
  } catch (const collective_error& e) {
    const auto now = std::chrono::steady_clock::now().time_since_epoch();
    std::ofstream(out_file) << "failed " << static_cast<int>(e.code()) << " "
                            << std::chrono::duration_cast<std::chrono::nanoseconds>(now).count() << "\n"
                            << e.what() << "\n";
    return 3;
  }
  std::fprintf(stderr, "gloo_rank: unknown scenario %s\n", scenario.c_str());
  return 64;
}
