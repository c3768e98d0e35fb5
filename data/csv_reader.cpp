#include "data/csv_reader.hpp"

#include <charconv>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include <dpactor/error.hpp>
#include "tensors/file_io.hpp"

namespace dpactor {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

void split(std::string_view line, std::vector<std::string_view>& fields) {
  fields.clear();
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = line.find(',', start);
    fields.push_back(trim(line.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start)));
    if (comma == std::string_view::npos) return;
    start = comma + 1;
  }
}

// A class label in [0, classes), checked before it is narrowed to int32: a
// label that does not fit (4294967297, -1, 99999999999999999999) is refused,
// never wrapped.
std::int32_t parse_label(std::string_view field, int classes, std::size_t sample, const std::string& where) {
  long long label = 0;
  const auto [p, ec] = std::from_chars(field.data(), field.data() + field.size(), label);
  const bool too_big = ec == std::errc::result_out_of_range;
  if ((ec != std::errc() && !too_big) || p != field.data() + field.size())
    throw data_error(where + ": label '" + std::string(field) + "' is not an integer");
  if (too_big || label < 0 || label >= classes)
    throw data_error(where + ": label " + std::string(field) + " of sample " + std::to_string(sample) +
                     " is out of range: the model has " + std::to_string(classes) + " classes (labels 0.." +
                     std::to_string(classes - 1) + ")");
  return static_cast<std::int32_t>(label);
}

}  // namespace

dataset read_csv(const std::filesystem::path& path, const csv_options& options) {
  const std::string text = read_file(path, file_role::data);
  const std::string where = path.string();
  std::vector<float> features;
  std::vector<std::int32_t> labels;
  std::vector<std::string_view> fields;
  std::size_t width = 0, width_line = 0, label_index = 0;
  std::size_t line_no = 0, pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string_view line = trim(std::string_view(text).substr(pos, end - pos));
    pos = end + 1;
    ++line_no;
    if (line.empty() || (line_no == 1 && options.header)) continue;
    split(line, fields);
    if (width == 0) {
      width = fields.size();
      width_line = line_no;
      if (width < 2) throw data_error(where + ":" + std::to_string(line_no) + ": a row needs a label and at least one feature");
      const long col = options.label_column < 0 ? static_cast<long>(width) + options.label_column : options.label_column;
      if (col < 0 || col >= static_cast<long>(width))
        throw data_error(where + ": data.label_column " + std::to_string(options.label_column) + " is outside the " +
                         std::to_string(width) + " columns");
      label_index = static_cast<std::size_t>(col);
    } else if (fields.size() != width) {
      throw data_error(where + ":" + std::to_string(line_no) + ": ragged row: " + std::to_string(fields.size()) +
                       " fields, expected " + std::to_string(width) + " (as on line " + std::to_string(width_line) + ")");
    }
    for (std::size_t f = 0; f < fields.size(); ++f) {
      const std::string_view field = fields[f];
      if (f == label_index) {
        labels.push_back(parse_label(field, options.num_classes, labels.size(),
                                     where + ":" + std::to_string(line_no) + ": field " + std::to_string(f + 1)));
        continue;
      }
      float value = 0.0f;
      auto [p, ec] = std::from_chars(field.data(), field.data() + field.size(), value);
      if (ec != std::errc() || p != field.data() + field.size() || !std::isfinite(value))
        throw data_error(where + ":" + std::to_string(line_no) + ": field " + std::to_string(f + 1) + ": '" +
                         std::string(field) + "' is not a finite number");
      features.push_back(value);
    }
  }
  if (labels.empty()) throw data_error(where + ": no data rows");
  dataset out(where, labels.size(), width - 1, options.num_classes);
  std::copy(features.begin(), features.end(), out.features.data());
  std::copy(labels.begin(), labels.end(), out.labels.data());
  out.check_labels();
  return out;
}

}  // namespace dpactor
