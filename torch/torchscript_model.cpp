// The libtorch plugin's entry point (See Note [The libtorch plugin],
// tensors/torch_model.hpp): a TorchScript file, checked and bound onto
// dpactor's flat buffers (torch/bound_module.hpp). Exports one function.

#include <torch/version.h>

#include <ATen/Parallel.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <regex>

#include "torch/bound_module.hpp"

namespace dpactor {
namespace {

// Loads the file, with a message naming it for each way it can be wrong.
std::shared_ptr<torch::jit::Module> load(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw open_error("model.path = " + path + ": cannot open the file: " + std::strerror(errno));
  char magic[4] = {};
  file.read(magic, 4);
  if (file.gcount() < 4 || std::memcmp(magic, "PK\x03\x04", 4) != 0)
    throw open_error(path + " is not a TorchScript file (not a zip archive; torch.jit.script(model).save(path) "
                     "writes one)");
  try {
    return std::make_shared<torch::jit::Module>(torch::jit::load(path));
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    // "Attempted to read a PyTorch file with version 11, but the maximum
    // supported version for reading is 10."
    static const std::regex newer(R"(file with version (\d+), but the maximum supported version for reading is (\d+))");
    std::smatch m;
    if (std::regex_search(what, m, newer))
      throw open_error(path + " was saved by a newer PyTorch (file format version " + m[1].str() +
                       ") than this libtorch " + TORCH_VERSION + " reads (up to version " + m[2].str() +
                       "): export it with PyTorch " + TORCH_VERSION + " (Debian's python3-torch)");
    throw open_error(path + " is not a TorchScript module (torch.jit.script(model).save(path) writes one; a "
                     "torch.save'd state_dict or pickled model is not): " + first_line(what));
  }
}

torch_model* open_torchscript(const torch_model_options& options) {
  return new bound_module(script_parts(load(options.path), options.path), options);
}

}  // namespace
}  // namespace dpactor

extern "C" __attribute__((visibility("default"))) dpactor::torch_model* dpactor_torch_open_v1(
    const dpactor::torch_model_options* options, char* error, std::size_t error_size) {
  auto fail = [&](const std::string& what) -> dpactor::torch_model* {
    if (error_size > 0) {
      const std::size_t n = std::min(what.size(), error_size - 1);
      std::memcpy(error, what.data(), n);
      error[n] = '\0';
    }
    return nullptr;
  };
  static std::once_flag interop;
  try {
    // One inter-op thread: dpactor runs one replica per core.
    std::call_once(interop, [] { at::set_num_interop_threads(1); });
    return dpactor::open_torchscript(*options);
  } catch (const dpactor::open_error& e) {
    return fail(e.what());
  } catch (const c10::Error& e) {
    return fail(options->path + ": " + dpactor::first_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return fail(options->path + ": " + e.what());
  }
}
