#pragma once
// Text a user gave (a key, a value, a file name) as a message shows it: every
// character that prints as nothing or moves the cursor is written as an
// escape, so that a message about "\uFEFF[model]" or "relu\t" shows what is
// wrong instead of hiding it. Control characters become \t, \n, \r or \xNN;
// invisible and direction-changing Unicode (a byte-order mark, zero-width
// spaces and joiners, bidirectional marks and overrides, line and paragraph
// separators, soft hyphens) becomes \uXXXX; bytes that are not UTF-8 become
// \xNN. Everything else, backslashes included, is kept, so the result of
// visible() is its own visible().

#include <string>
#include <string_view>

namespace dpactor {

std::string visible(std::string_view text);

// Single-quoted and visible: 'relu\t'.
inline std::string quoted(std::string_view text) { return "'" + visible(text) + "'"; }

}  // namespace dpactor
