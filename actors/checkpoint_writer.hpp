#pragma once
// The checkpoint writer: a detached actor, so that file I/O and fsync never
// hold up the reducer, whose commits keep the loader's window moving.

#include <filesystem>
#include <memory>
#include <string>

#include <caf/all.hpp>

#include "actors/messages.hpp"
#include "tensors/replica.hpp"

namespace dpactor {

struct checkpoint_writer_setup {
  std::filesystem::path root;
  state_layout layout;
  std::uint64_t seed = 0;
  bool shuffle = true;
  std::uint64_t train_samples = 0;
  std::string config_toml;
  std::int64_t keep = 0;
};

// Handles write_checkpoint_msg; sends checkpoint_written_msg back to the sender.
caf::behavior checkpoint_writer_actor(caf::event_based_actor* self, std::shared_ptr<const checkpoint_writer_setup> setup);

}  // namespace dpactor
