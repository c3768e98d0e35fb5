#pragma once
// Which process runs each logical worker when the round modes run across
// processes (docs/plans/rounds-across-processes.md, section 1). Pure logic:
// nothing here knows of actors or sockets. The reducer places the workers
// on nodes at each generation, the loader splits each node's workers over
// its members at each round (worker_slices); in one process there is one
// node, whose store holds every worker.
//
// Note [Worker placement]
// In one process any device can run any logical worker, because the
// workers' states live in the process's store (Note [Logical workers]).
// Across processes a worker's state is where its process is, and moving it
// costs its bytes on the wire, so a worker stays on its process (node) for
// as long as that node lives, and moves only when membership changes:
// - the first placement cuts the workers into contiguous runs, one a node,
//   in node order: one worker each, the rest by the nodes' devices
//   (split_by_weight, the loader's split);
// - a worker whose node left or died goes, in worker order, to the live node
//   with the fewest workers per device (ties: the first in node order);
// - then each node below its share (the first placement's sizes over the
//   live nodes) takes workers from the node with the most workers per
//   device above its share, that node's highest-numbered worker first,
//   until it has its share or no node is above its own.
// The same inputs give the same placement on every process.
// Inside a node the workers move freely, since its devices share its store:
// each round, the node's workers (those the round has: a short round may
// have fewer slices than workers) are split over the node's members in
// contiguous runs by throughput, the loader's split, rotated by the step
// inside the node (worker_slices). With one node this is the split of every
// round's slices over the members that the loader makes in every_step.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dpactor {

struct placement_node {
  std::string name;          // the process, as membership names it
  std::size_t devices = 1;   // its devices: a node's share is proportional
};

struct worker_move {
  std::size_t worker = 0;
  std::string from;  // "": the worker had no node (the first placement)
  std::string to;
};

struct worker_placement {
  std::vector<std::string> owner;  // worker k's node
  std::vector<worker_move> moves;  // the workers whose node changed, in worker order
};

// `workers` logical workers over the live `nodes` (in membership order),
// given each worker's previous node in `previous` (empty: none placed yet;
// otherwise one name a worker, "" for none). Throws std::invalid_argument
// without nodes or with a node of no devices.
worker_placement place_workers(std::size_t workers, std::span<const placement_node> nodes,
                               std::span<const std::string> previous);

// Each member's logical workers in a round of `slices` slices (See Note
// [Worker placement]): member r is on node node_of_member[r], worker k on
// node node_of_worker[k]; `weights` are the members' shares (rank order),
// `rotation` the step. Throws std::invalid_argument when a node holding
// one of the round's workers has no member, or the sizes disagree.
std::vector<std::vector<std::uint32_t>> worker_slices(std::span<const std::int32_t> node_of_member,
                                                      std::span<const std::int32_t> node_of_worker,
                                                      std::span<const double> weights, std::size_t rotation,
                                                      std::size_t slices);

}  // namespace dpactor
