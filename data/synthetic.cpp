#include "data/synthetic.hpp"

#include <cmath>
#include <numbers>
#include <vector>

#include <dpactor/error.hpp>
#include "tensors/rng.hpp"

namespace dpactor {

dataset make_synthetic(const synthetic_options& o) {
  dataset out = [&o] {
    try {
      return dataset("synthetic(seed=" + std::to_string(o.seed) + ")", o.rows, o.features, o.classes);
    } catch (const data_error& e) {
      throw data_error(std::string(e.what()) + "; data.synthetic_train and data.synthetic_test set the sample counts");
    }
  }();
  rng centre_gen(o.seed, 0xC0FFEE);
  std::vector<float> centres(static_cast<std::size_t>(o.classes) * o.features);
  for (float& c : centres) c = static_cast<float>(centre_gen.uniform(-1.0, 1.0));
  rng gen(o.seed, o.stream + 1);
  for (std::size_t r = 0; r < o.rows; ++r) {
    const auto label = static_cast<std::int32_t>(gen.below(static_cast<std::uint64_t>(o.classes)));
    out.labels[r] = label;
    for (std::size_t f = 0; f < o.features; ++f) {
      // Box-Muller: one standard normal from two uniforms.
      const double u1 = 1.0 - gen.uniform(), u2 = gen.uniform();
      const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
      out.features[r * o.features + f] =
          centres[static_cast<std::size_t>(label) * o.features + f] + o.noise * static_cast<float>(normal);
    }
  }
  return out;
}

}  // namespace dpactor
