#pragma once
// How float vectors cross the network: as their bytes.
//
// Note [Floats cross the network as their bytes]
// CAF 0.17 serialises a float through pack754 (caf/detail/ieee_754.hpp),
// which is not exact: a denormal comes back as a huge negative number and a
// NaN as 1 (measured: the bits 4 come back as -6.5e32). A replica's state
// holds its step counter as an int64's bits in two floats
// (write_step_counter), which are denormals, and the rounds and
// checkpoints must keep every bit. So each message that carries floats to
// another process carries them as a byte vector, which CAF copies as it is
// (apply_raw): in inspect, wire_out fills the bytes before they are
// written and wire_in fills the floats after they are read. Every process
// of a job is of one byte order (the job's replicas are of one kind).

#include <cstring>
#include <vector>

#include <caf/all.hpp>

namespace dpactor {

// Before serialising: `wire` holds the bytes of `values`.
inline auto wire_out(std::vector<char>& wire, const std::vector<float>& values) {
  return caf::meta::save_callback([&wire, &values]() -> caf::error {
    wire.resize(values.size() * sizeof(float));
    if (!values.empty()) std::memcpy(wire.data(), values.data(), wire.size());
    return caf::none;
  });
}

// After deserialising: `values` holds the floats of `wire`.
inline auto wire_in(const std::vector<char>& wire, std::vector<float>& values) {
  return caf::meta::load_callback([&wire, &values]() -> caf::error {
    if (wire.size() % sizeof(float) != 0)
      return caf::make_error(caf::sec::runtime_error, "a float vector of " + std::to_string(wire.size()) + " bytes");
    values.resize(wire.size() / sizeof(float));
    if (!wire.empty()) std::memcpy(values.data(), wire.data(), wire.size());
    return caf::none;
  });
}

}  // namespace dpactor
