#include "cli/metrics_file.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include <dpactor/error.hpp>
#include "train/checkpoint.hpp"

namespace dpactor::cli {
namespace {

namespace fs = std::filesystem;

// The absolute path with symlinks of its existing part resolved, and no
// trailing separator; the lexical absolute path if even that fails.
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(path, ec);
  if (ec) p = fs::absolute(path, ec).lexically_normal();
  if (p.has_filename() || !p.has_parent_path() || p == p.root_path()) return p;
  return p.parent_path();  // "/runs/ckpt/" -> "/runs/ckpt"
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  const bool same = fs::equivalent(a, b, ec);
  if (!ec) return same;  // both exist
  return resolved(a) == resolved(b);
}

bool inside(const fs::path& file, const fs::path& dir) {
  auto f = file.begin();
  for (auto d = dir.begin(); d != dir.end(); ++d, ++f)
    if (f == file.end() || *f != *d) return false;
  return true;  // `file` is `dir` or below it
}

// Whether `file` is a path the checkpoints in `dir` own: the directory, its
// lock, `latest`, a checkpoint (step-*) or a temporary one (.tmp-*), or
// anything inside those. Other files in the directory are the user's.
bool owned_by_checkpoints(const fs::path& file, const fs::path& dir) {
  if (!inside(file, dir)) return false;
  const fs::path rest = file.lexically_relative(dir);
  if (rest.empty() || rest == ".") return true;
  const std::string first = rest.begin()->string();
  const std::string own = dir.filename().string();
  return own.starts_with("step-") || first == "latest" || first == ".lock" || first.starts_with("step-") ||
         first.starts_with(checkpoint_tmp_prefix);
}

}  // namespace

void refuse_metrics_on_inputs(const std::string& metrics, const std::vector<run_input>& inputs) {
  const fs::path target = resolved(metrics);
  for (const run_input& in : inputs) {
    const bool clash = in.directory ? same_file(metrics, in.path) || owned_by_checkpoints(target, resolved(in.path))
                                    : same_file(metrics, in.path);
    if (!clash) continue;
    const std::string named = in.what + " (" + in.source + (in.source.starts_with("--") ? " " : " = ") + in.path + ")";
    if (in.directory)
      throw config_error("--metrics " + metrics + ": is a path the checkpoints in " + named +
                         " own (latest, .lock, step-*, .tmp-*): choose another file");
    throw config_error("--metrics " + metrics + ": is " + named +
                       ", an input of this run that the metrics file would overwrite: choose another file");
  }
}

metrics_file::metrics_file(const std::string& path) : path_(path), file_(std::fopen(path.c_str(), "w")) {
  if (file_ == nullptr) throw std::runtime_error("--metrics " + path + ": cannot create: " + std::strerror(errno));
}

metrics_file::~metrics_file() {
  if (file_ != nullptr) std::fclose(file_);
}

void metrics_file::fail(const char* doing, int err) {
  if (!error_) error_ = "--metrics " + path_ + ": " + doing + ": " + std::strerror(err);
}

bool metrics_file::write(const json& record) {
  const std::string line = record.dump() + "\n";
  std::lock_guard lock(mutex_);
  if (error_ || file_ == nullptr) return false;
  errno = 0;
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size()) fail("cannot write", errno != 0 ? errno : EIO);
  else if (std::fflush(file_) != 0) fail("cannot write", errno != 0 ? errno : EIO);
  return !error_;
}

bool metrics_file::close() {
  std::lock_guard lock(mutex_);
  if (file_ == nullptr) return !error_;
  errno = 0;
  const int rc = std::fclose(file_);  // the stream is gone whatever it returns
  file_ = nullptr;
  if (rc != 0) fail("cannot close", errno != 0 ? errno : EIO);
  return !error_;
}

std::optional<std::string> metrics_file::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

}  // namespace dpactor::cli
