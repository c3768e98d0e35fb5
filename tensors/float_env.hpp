#pragma once
// Floating-point environment of the threads that train.

namespace dpactor {

// Flushes denormal results to zero and reads denormal inputs as zero on the
// calling thread (x86 MXCSR FTZ and DAZ; a no-op elsewhere). Momentum
// buffers of units that stop receiving gradient decay into the denormal range,
// where x86 arithmetic is about a hundred times slower: measured, a batch-1
// SGD step went from 0.1 to 1.3 ms. TensorFlow sets the same mode by default;
// it changes only values below 1.2e-38 in magnitude.
void flush_denormals_to_zero() noexcept;

}  // namespace dpactor
