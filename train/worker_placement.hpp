#pragma once
// Which process runs each logical worker when the round modes run across
// processes (docs/plans/rounds-across-processes.md, section 1). Pure logic:
// nothing here knows of actors or sockets. Not used by the engine yet: the
// round modes run in one process, whose store holds every worker.
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

#include <cstddef>
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

}  // namespace dpactor
