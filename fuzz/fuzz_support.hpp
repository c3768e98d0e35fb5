#pragma once
// What every fuzz target shares: the verdict on one input, and a scratch file
// for the readers that take a path.
//
// A reader given any bytes either loads them or throws its documented error
// (dpactor/error.hpp: data_error for data files, checkpoint_error for
// safetensors, config_error for configs). Anything else is a finding and
// aborts, so that libFuzzer saves the input: another exception type (a
// std::bad_alloc, std::length_error, a JSON or TOML exception that got
// through), a crash, undefined behaviour or a leak (the sanitizers), a huge
// allocation (-malloc_limit_mb), or a load that breaks the reader's own
// promises (the checks each target runs on what it loaded).

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <typeinfo>

#include <dpactor/error.hpp>

namespace dpactor::fuzz {

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "\n== fuzz finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

inline void require(bool ok, const std::string& what) {
  if (!ok) finding("a load broke a promise: " + what);
}

// Runs `load`; its documented error `Expected` is a clear refusal, any other
// exception a finding.
template <class Expected, class Load>
void expect_clear_error(Load&& load) {
  try {
    load();
  } catch (const Expected& e) {
    if (std::string_view(e.what()).empty()) finding("an error without a message");
  } catch (const error& e) {
    finding(std::string("an error of the wrong kind (") + typeid(e).name() + "): " + e.what());
  } catch (const std::exception& e) {
    finding(std::string("uncaught ") + typeid(e).name() + ": " + e.what());
  } catch (...) {
    finding("an exception that is not a std::exception");
  }
}

// A file under a directory of this process's own (in /dev/shm when there is
// one, so no disk is touched), removed when the process exits.
class scratch_file {
 public:
  explicit scratch_file(const std::string& name) {
    const std::filesystem::path shm = "/dev/shm";
    const std::filesystem::path root = std::filesystem::is_directory(shm) ? shm : std::filesystem::temp_directory_path();
    dir_ = root / ("dpactor-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    path_ = dir_ / name;
  }
  ~scratch_file() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  scratch_file(const scratch_file&) = delete;
  scratch_file& operator=(const scratch_file&) = delete;

  // Replaces the file's contents with `bytes`.
  const std::filesystem::path& write(std::string_view bytes) const {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) finding("cannot write the scratch file " + path_.string());
    return path_;
  }
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path dir_;
  std::filesystem::path path_;
};

}  // namespace dpactor::fuzz
