// Fuzz target: the CSV reader (data/csv_reader.cpp). The reader takes a
// path, so each input is written to a scratch file, then read twice: label
// first without a header, and label last after a header line; the model has
// 10 classes. A dataset that loads has rows x features finite values and
// every label in [0, 10).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "data/csv_reader.hpp"
#include "fuzz/fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dpactor;
  static const fuzz::scratch_file file("input.csv");
  constexpr int classes = 10;
  file.write(std::string_view(reinterpret_cast<const char*>(data), size));
  for (const csv_options options : {csv_options{false, 0, classes}, csv_options{true, -1, classes}}) {
    fuzz::expect_clear_error<data_error>([&] {
      const dataset d = read_csv(file.path(), options);
      fuzz::require(d.rows > 0 && d.feature_count > 0, "an empty dataset loaded");
      fuzz::require(d.features.size() == d.rows * d.feature_count && d.labels.size() == d.rows,
                    "buffer sizes differ from rows x features");
      for (std::size_t i = 0; i < d.features.size(); ++i)
        fuzz::require(std::isfinite(d.features[i]), "a non-finite feature loaded");
      for (std::size_t i = 0; i < d.rows; ++i)
        fuzz::require(d.labels[i] >= 0 && d.labels[i] < classes, "a label outside [0, 10) loaded");
    });
  }
  return 0;
}
