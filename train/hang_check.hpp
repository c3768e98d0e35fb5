#pragma once
// Whether a run has stopped making progress, and who is to blame: a pure
// function of the members' progress (train/device_progress.hpp), tested
// without threads.
//
// Note [Progress-based hang detection]
// Every device marks each phase change and each micro-batch or evaluation
// batch it finishes (device_progress). The run is stalled when neither a
// commit nor any member's mark has happened for longer than the hang
// timeout; a device's first step (where its CUDA context, cuBLAS handles,
// buffers and pages are set up: the first step of the run, or of a device
// that joins) and the first batch of every evaluation get the first-step
// bound instead. A generation formed after a fault or a change is not a
// warm-up for the devices that trained before: their first step in it is
// as long as any other, and a hang there is found within the timeout; but
// forming the generation's group (the state broadcast's rendezvous across
// processes, seconds with dozens of them) is set-up for every member and
// gets the first-step bound. A stalled run blames the members
// stuck in their own work (forward, backward, optimizer, evaluation) past
// their limit; failing that, those the others reported waiting for in the
// collective (late_msg). A blamed member is removed and the run recovers
// without it. If nobody can be blamed, or everyone would be (a single
// device, or all of them stuck), removing members cannot help. The reducer
// then starts one new generation from the last committed step (a machine
// that stalled as a whole, descheduled or swapping, recovers), and if the
// run stalls again before another step commits, it ends the run with a
// checkpoint of the last committed step and an error naming each device and
// the phase it is stuck in. One retry per committed step: it never loops.

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "train/device_progress.hpp"

namespace dpactor {

struct member_progress {
  std::size_t rank = 0;
  std::string name;  // "cpu:0"
  device_progress::snapshot progress;
};

struct hang_limits {
  double timeout_s = 5.0;     // since the last sign of progress
  double first_step_s = 300;  // the same, in a first step (at least timeout_s)
};

struct hang_verdict {
  bool stalled = false;               // nobody progressed for longer than allowed
  double stalled_s = 0.0;             // since the last progress of any member or commit
  double allowed_s = 0.0;             // the limit that applied
  std::vector<std::size_t> suspects;  // ranks to remove; empty when nobody can be blamed
  bool blameable = false;             // removing `suspects` leaves members to go on with
  std::string where;                  // "cpu:0 in forward of step 12 for 31.2 s, ..."
};

// `members`: the live members; `last_commit`: the last commit or evaluation
// result; `late_suspects`: ranks the others reported waiting for.
hang_verdict find_hang(std::span<const member_progress> members, device_progress::clock::time_point now,
                       device_progress::clock::time_point last_commit, const hang_limits& limits,
                       std::span<const std::size_t> late_suspects);

// Whether find_hang could find a stall at `now`: only when the last commit
// is older than the hang timeout, since every limit is at least that. The
// reducer's tick asks this first and reads no member's progress while steps
// commit: at thousands of members that read is its largest cost (docs/scale.md).
bool stall_possible(device_progress::clock::time_point now, device_progress::clock::time_point last_commit,
                    const hang_limits& limits);

// sync.mode = "async" (See Note [Async faults]): each device is judged on
// its own, since the others go on committing rounds: one in its own work
// (not waiting for its next round) without progress for longer than its
// limit (the first-step bound while warming) is hung. Returns the seconds
// since its last progress then, else 0.
double stalled_alone_s(const device_progress::snapshot& s, device_progress::clock::time_point now,
                       const hang_limits& limits);

// The hang timeout in seconds: the configured one, or max(5 s, 20 x the
// median step time).
double hang_timeout(double configured_s, double median_step_s);

}  // namespace dpactor
