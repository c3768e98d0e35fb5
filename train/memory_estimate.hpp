#pragma once
// Note [Memory before allocating]
// A job whose sizes cannot be met (a model wider than memory, a
// train.micro_batch of a billion rows, a thousand replicas) is a user's
// mistake, not a bug: it is refused before anything is allocated, with the
// estimate of what it needs against what the machine has, instead of ending
// in std::bad_alloc. The estimate counts what the engine allocates for each
// replica (its state twice: the current one and the one an update writes;
// the gradients; reproducible mode's scratch gradients; the inputs and
// activations of a micro-batch) and once per process (the initial state, the
// data). It is an upper bound of the large allocations, not of the
// allocator's overhead; what is available is the smallest of the kernel's
// MemAvailable, the cgroup's memory limit and the process's address-space
// and data limits.

#include <cstdint>
#include <string>
#include <vector>

namespace dpactor {

struct memory_inputs {
  double parameters = 0;     // floats of the parameter section
  double state = 0;          // floats of a replica's state: parameters, optimizer slots, counter
  std::vector<double> widths;  // the native MLP's layer widths, inputs first; empty: not known (a torch module)
  double micro_batch = 1;    // rows per call (train.micro_batch)
  double scratch_gradients = 0;  // reproducible mode's extra gradient buffers per replica
  double replicas = 1;
  double data_bytes = 0;     // the training and test sets, shared by the replicas
};

struct memory_estimate {
  double per_replica = 0;  // bytes
  double shared = 0;       // bytes, once per process
  std::string detail;      // what each part takes, for the message
  double total(double replicas) const { return per_replica * replicas + shared; }
};

memory_estimate estimate_memory(const memory_inputs& in);

// What this process may allocate, in bytes, and which limit says so
// ("MemAvailable", "the cgroup's memory.max", "RLIMIT_AS", ...).
struct memory_limit {
  double bytes = 0;
  std::string source;
};
memory_limit available_memory();

// Throws config_error when the estimate does not fit in `limit`: the
// estimate and its parts against what is available.
void check_memory(const memory_inputs& in, const memory_limit& limit);

// "1.5 GiB", "812 MiB", "3.0 TiB".
std::string byte_text(double bytes);

}  // namespace dpactor
