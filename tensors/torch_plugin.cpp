#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include <dpactor/error.hpp>
#include "tensors/torch_model.hpp"

namespace dpactor {
namespace {

constexpr const char* plugin_name = "libdpactor_torch.so";
constexpr const char* entry_point = "dpactor_torch_open_v1";

std::filesystem::path program_directory() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : exe.parent_path();
}

// See Note [The libtorch plugin].
dpactor_torch_open_fn load_plugin() {
  static std::once_flag once;
  static dpactor_torch_open_fn open = nullptr;
  static std::string failure;
  std::call_once(once, [] {
    std::string why;
    const std::string file = find_torch_plugin(why);
    if (file.empty()) {
      failure = why;
      return;
    }
    ::setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/0);
    // Never closed: libtorch's static state does not survive an unload.
    void* handle = ::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* e = ::dlerror();
      failure = "model.kind = \"torchscript\": cannot load the libtorch plugin " + file + ": " +
                (e != nullptr ? e : "unknown error") + " (is libtorch-dev, or the libtorch it was built with, installed?)";
      return;
    }
    open = reinterpret_cast<dpactor_torch_open_fn>(::dlsym(handle, entry_point));
    if (open == nullptr)
      failure = "model.kind = \"torchscript\": " + file + " is not dpactor's libtorch plugin (no " + entry_point +
                "); rebuild dpactor";
  });
  if (open == nullptr) throw config_error(failure);
  return open;
}

}  // namespace

std::string find_torch_plugin(std::string& why) {
#if !DPACTOR_HAS_TORCH
  if (std::getenv("DPACTOR_TORCH_PLUGIN") == nullptr) {
    why = "model.kind = \"torchscript\": this build of dpactor has no libtorch replica: install libtorch-dev "
          "(apt-get install libtorch-dev) and build again with -DDPACTOR_WITH_TORCH=ON (or AUTO, the default)";
    return {};
  }
#endif
  std::vector<std::filesystem::path> candidates;
  if (const char* env = std::getenv("DPACTOR_TORCH_PLUGIN"); env != nullptr && *env != '\0') {
    if (!std::filesystem::exists(env)) {
      why = std::string("DPACTOR_TORCH_PLUGIN = ") + env + ": no such file";
      return {};
    }
    return env;
  }
  if (const auto dir = program_directory(); !dir.empty()) candidates.push_back(dir / "../lib/dpactor" / plugin_name);
#ifdef DPACTOR_TORCH_PLUGIN_INSTALLED
  candidates.emplace_back(DPACTOR_TORCH_PLUGIN_INSTALLED);
#endif
#ifdef DPACTOR_TORCH_PLUGIN_BUILT
  candidates.emplace_back(DPACTOR_TORCH_PLUGIN_BUILT);
#endif
  std::string looked;
  for (const auto& c : candidates) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(c, ec)) return std::filesystem::weakly_canonical(c, ec).string();
    looked += (looked.empty() ? "" : ", ") + c.lexically_normal().string();
  }
  why = "model.kind = \"torchscript\": the libtorch plugin " + std::string(plugin_name) + " was not found (looked in " +
        looked + "); build it (libtorch-dev, -DDPACTOR_WITH_TORCH=ON) and install it with dpactor, or set "
        "DPACTOR_TORCH_PLUGIN to its path";
  return {};
}

std::unique_ptr<torch_model> open_torch_model(const torch_model_options& options) {
  const dpactor_torch_open_fn open = load_plugin();
  std::array<char, 2048> error{};
  torch_model* model = open(&options, error.data(), error.size());
  if (model == nullptr) throw config_error(error.data());
  return std::unique_ptr<torch_model>(model);
}

}  // namespace dpactor
