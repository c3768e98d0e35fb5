#include "tensors/file_io.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <dpactor/error.hpp>

namespace dpactor {
namespace {

[[noreturn]] void fail(file_role role, const std::string& what) {
  if (role == file_role::data) throw data_error(what);
  throw checkpoint_error(what);
}

}  // namespace

std::string read_file(const std::filesystem::path& path, file_role role) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail(role, path.string() + ": no such file");
  if (std::filesystem::is_directory(path, ec)) fail(role, path.string() + ": is a directory, expected a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(role, path.string() + ": cannot open: " + std::strerror(errno));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) fail(role, path.string() + ": read error: " + std::strerror(errno));
  return std::move(buffer).str();
}

void write_file_synced(const std::filesystem::path& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw checkpoint_error("cannot create " + path.string() + ": " + std::strerror(errno));
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw checkpoint_error("cannot write " + path.string() + ": " + std::strerror(err));
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0)
    throw checkpoint_error("cannot flush " + path.string() + ": " + std::strerror(errno));
}

void sync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some filesystems refuse directory fds
  ::fsync(fd);
  ::close(fd);
}

}  // namespace dpactor
