// A long-running service that trains in-process with dpactor::Engine and
// serves predictions from consistent parameter snapshots while it trains.
//
//   embed_service CONFIG [STEPS]
//
// It trains CONFIG for STEPS optimizer steps (default 300), and meanwhile a
// "serving" thread takes a snapshot of the parameters every few steps and
// classifies a fixed input with them, as a model server would.

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "config/config_file.hpp"
#include "actors/engine.hpp"
#include "tensors/mlp.hpp"

namespace {

// Logits of one input under a snapshot, through the same MLP code the
// engine trains with.
std::vector<float> predict(const dpactor::mlp_spec& spec, const dpactor::parameter_snapshot& snap,
                           const std::vector<float>& input) {
  dpactor::mlp model(spec, 1);
  std::vector<float> logits(static_cast<std::size_t>(spec.outputs()));
  model.predict(snap.values.data(), input.data(), 1, logits.data());
  return logits;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CONFIG [STEPS]\n", argv[0]);
    return 2;
  }
  const std::string steps = argc > 2 ? argv[2] : "300";
  try {
    // The service decides where checkpoints go and how long to train.
    dpactor::job_config config =
        dpactor::load_job_config(argv[1], {"train.max_steps=" + steps, "train.checkpoint_dir=\"\""});

    dpactor::Engine engine(config);
    std::atomic<std::int64_t> latest_step{0};
    engine.on_event([&](const dpactor::event& e) {
      if (const auto* s = std::get_if<dpactor::step_event>(&e)) latest_step = s->step;
      if (const auto* m = std::get_if<dpactor::membership_event>(&e))
        std::printf("membership: generation %lld, %zu members (%s)\n", static_cast<long long>(m->generation),
                    m->members.size(), m->reason.c_str());
    });

    engine.start();

    // Serving thread: reads parameters at step boundaries while training runs.
    std::atomic<bool> done{false};
    std::thread server([&] {
      const std::vector<float> input(static_cast<std::size_t>(config.model.inputs()), 0.5f);
      std::int64_t served_step = -1;
      while (!done) {
        if (latest_step <= served_step) {
          std::this_thread::yield();
          continue;
        }
        try {
          const dpactor::parameter_snapshot snap = engine.snapshot();
          const std::vector<float> logits = predict(config.model, snap, input);
          std::size_t best = 0;
          for (std::size_t c = 1; c < logits.size(); ++c)
            if (logits[c] > logits[best]) best = c;
          std::printf("served with parameters of step %lld: class %zu\n", static_cast<long long>(snap.step), best);
          served_step = snap.step + 100;  // next snapshot a hundred steps on
        } catch (const std::runtime_error&) {
          break;  // training ended between the check and the request
        }
      }
    });

    const dpactor::run_summary summary = engine.wait();
    done = true;
    server.join();
    std::printf("trained %lld steps: test accuracy %.4f, %.0f samples/s\n", static_cast<long long>(summary.steps),
                summary.test_accuracy, summary.samples_per_s);
    return 0;
  } catch (const dpactor::error& e) {
    std::fprintf(stderr, "embed_service: %s\n", e.what());
    return 1;
  }
}
