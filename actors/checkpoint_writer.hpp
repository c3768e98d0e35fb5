#pragma once
// The checkpoint writer: a detached actor, so that file I/O and fsync never
// hold up the reducer, whose commits keep the loader's window moving.

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <caf/all.hpp>

#include "actors/protocol.hpp"
#include "train/checkpoint_directory.hpp"
#include "train/powersgd.hpp"
#include "tensors/replica.hpp"

namespace dpactor {

struct checkpoint_writer_setup {
  std::shared_ptr<checkpoint_directory> directory;  // locked for the run; taken before any actor starts
  state_layout layout;
  std::uint64_t seed = 0;
  bool shuffle = true;
  std::uint64_t train_samples = 0;
  std::string data_fingerprint;
  std::string config_toml;
  std::int64_t keep = 0;
  // The round modes: a state to write holds the replica's state, then the
  // logical workers' (See Note [Logical workers]), laid out by this.
  std::optional<state_layout> inner;
  bool residual = false;      // the workers' states hold a codec's residual
  std::size_t fragments = 1;  // and with fragments their parameters (See Note [A logical worker's state])
  bool delayed = false;       // and with sync.delay their progress
  // every_step with sync.codec = "powersgd" in reproducible mode: after the
  // replica's state, each slice's residual and the basis (See Note [PowerSGD
  // steps], powersgd_states).
  std::optional<powersgd_plan> powersgd;
};

// Answers each write_checkpoint_msg with a checkpoint_written_msg.
checkpoint_writer_actor::behavior_type checkpoint_writer_behavior(std::shared_ptr<const checkpoint_writer_setup> setup);

}  // namespace dpactor
