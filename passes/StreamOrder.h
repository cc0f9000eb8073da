//===- StreamOrder.h - how a routine's ops are ordered across streams -----===//
//
// forge-schedule puts each op of a routine on a stream (`forge.stream`, an
// index into the function's `forge.streams`; absent: 0, the compute stream)
// and derives the event edges from data flow; forge-plan-memory derives them
// again after adding its copies, and bounds live ranges by them. One
// derivation serves both (deriveStreamOrder), so the plan and the edges the
// runtime executes cannot disagree.
//
// Model (what the CUDA executor does): each stream runs its ops in program
// order; every other stream starts after the routine's inputs are in the arena
// (it waits for the compute stream there); an op on stream s that reads a value
// made on stream t waits for an event recorded after the producer, unless s is
// already ordered after it (an earlier wait, directly or through another
// stream's); the compute stream waits at the end (`forge.joins`) for the last
// op of every stream it has not waited for. A view op (no instruction) records
// no event and waits for nothing: a reader of its results waits for its
// operand's producer.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"

#include <string>

namespace mlir::forge {

/// Whether `op` runs as a collective (all_reduce, reduce_scatter, all_gather,
/// rank_slice): the ops forge-schedule puts on the "collective" stream.
bool isCollectiveOp(Operation *op);

/// Whether `op` runs no instruction: `forge.placement = "view"` (a split
/// whose pieces cuDNN attention reads in place, a concat whose pieces their
/// makers write in place: forge-fold-attention-views). It keeps its position
/// in the order but is on no stream's timeline: its readers depend on what
/// its operands' producers made.
bool isViewOp(Operation *op);
/// The ops that made `v`'s bytes, appended to `out`: `v`'s producer, or
/// through view ops their operands' (none for an argument). forge-schedule's
/// stream choice and the stream order's waits both follow a view to the
/// bytes it reads.
void producersThroughViews(Value v, SmallVectorImpl<Operation *> &out);

struct StreamOrder {
  SmallVector<Operation *> ops;           // program order, constants left out
  SmallVector<std::string> streams;       // "compute" first
  SmallVector<unsigned> stream;           // per position
  SmallVector<int64_t> event;             // per position: 0 none, else its event id
  SmallVector<SmallVector<int64_t>> waits; // per position: event ids
  SmallVector<int64_t> joins;             // event ids the routine's end waits for
  int64_t events = 0;
  // Per position, for reusing bytes: `after` is the last compute position
  // the op is ordered after (-1: only the inputs' arrival), `until` the first
  // compute position ordered after the op (ops.size(): the routine's end).
  // A compute op at p has after = p - 1 and until = p.
  SmallVector<int64_t> after, until;
  // Per position, the last position whose ops may still read the op's
  // operands (they keep their bytes to here): p on the compute stream. Beside
  // it, the compute op at `until` runs after the op is done (it waited for
  // it), so its results may take them: until - 1; but only with one side
  // stream, since an op of a second one, ordered after the compute op before
  // `until` and not after this op, could write them while this op reads them.
  SmallVector<int64_t> operandsUntil;
};

/// The order of `func`'s single block: streams from the ops' forge.stream and
/// the function's forge.streams; a function without forge.streams (not
/// scheduled) has its collectives on a "collective" stream. Events are made
/// fresh from data flow (earlier forge.event/forge.waits are ignored).
/// `overwrites` adds edges that data flow does not show: an op that writes
/// over a buffer (a persistent tensor updated in place) must be ordered after
/// the listed ops, which read the buffer's old value.
StreamOrder deriveStreamOrder(
    func::FuncOp func, const llvm::DenseMap<Operation *, SmallVector<Operation *, 4>> &overwrites);
/// The arena bytes a cuDNN op's workspace takes at least (forge-plan-memory's
/// workspace-floor default): forge-schedule counts them in its estimate, since
/// a workspace on a further stream lives as long as the op may run.
constexpr int64_t kCudnnWorkspaceFloor = int64_t(64) << 20;

inline StreamOrder deriveStreamOrder(func::FuncOp func) {
  return deriveStreamOrder(func, llvm::DenseMap<Operation *, SmallVector<Operation *, 4>>());
}

/// Writes `order`'s edges: forge.event and forge.waits on the ops (removing
/// stale ones), forge.streams, forge.events and forge.joins on the function.
void writeStreamOrder(func::FuncOp func, const StreamOrder &order);

} // namespace mlir::forge
