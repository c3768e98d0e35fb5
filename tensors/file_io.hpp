#pragma once
// Whole-file reads and durable writes. Errors throw the given error type's
// message with the path and the system's reason.

#include <filesystem>
#include <string>
#include <string_view>

namespace dpactor {

// Reads a whole file; throws checkpoint_error or data_error (per `kind`)
// "cannot read <path>: <reason>".
enum class file_role { data, checkpoint };
std::string read_file(const std::filesystem::path& path, file_role role);

// Writes `bytes` to `path` (created or truncated) and fsyncs it.
// Throws checkpoint_error on failure.
void write_file_synced(const std::filesystem::path& path, std::string_view bytes);

// fsyncs a directory so that renames inside it are durable.
void sync_directory(const std::filesystem::path& dir);

}  // namespace dpactor
