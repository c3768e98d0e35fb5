#pragma once
// Checksums that let a resume refuse a checkpoint changed after it was
// written (a flipped bit on disk, a partial copy, an edit by hand).
//
// A tensor file carries "dpactor_crc32" in its safetensors __metadata__ (a
// string, so PyTorch still loads the file): CRC-32 over its other metadata
// and its tensors' names, dtypes, shapes and bytes, each in name order.
// trainer.json carries "crc32" over its own compact JSON without that key.
// Checkpoints of format dpactor-checkpoint-2 must carry all three, so that
// damage to a checksum's own key is refused too; format 1 (written before
// checksums) loads unchecked, and so do weights files from elsewhere.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensors/safetensors.hpp"

namespace dpactor {

inline constexpr const char* tensor_checksum_key = "dpactor_crc32";

// The checksum of tensors about to be saved with `metadata` (which must not
// hold the checksum key yet), as 8 hex digits.
std::string tensor_file_checksum(const std::vector<tensor_to_save>& tensors, const string_pairs& metadata);

// Throws checkpoint_error "<origin>: checksum mismatch ..." when `file`
// carries a checksum that its contents do not match, or "<origin>: no
// checksum" when it carries none and `required`.
void verify_tensor_file(const safetensors_file& file, const std::string& origin, bool required);

// CRC-32 of `bytes` as 8 hex digits.
std::string crc32_hex(std::string_view bytes);

}  // namespace dpactor
