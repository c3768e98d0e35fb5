#pragma once
// Which GPUs `--gpus` selects. Built without CUDA, or when the CUDA runtime
// reports an error (as cudaGetDeviceCount does on a machine without a GPU),
// there are none.

#include <string>
#include <vector>

namespace dpactor::cli {

struct gpu_selection {
  std::vector<int> devices;  // chosen device ordinals
  std::string note;          // why none were chosen, for the warning line
};

// Throws std::invalid_argument for a malformed --gpus value or a device
// number that does not exist on a machine with GPUs.
gpu_selection select_gpus(const std::string& spec);

}  // namespace dpactor::cli
