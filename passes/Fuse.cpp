//===- Fuse.cpp - group ops into forge.fusion regions ----------------------===//
//
// Loop fusion (see Passes.td). Invariants of the result:
//  * every region is a valid forge.fusion "loop" (FusionOp::verify): pointwise
//    ops, one iteration shape, broadcastable inputs;
//  * no cycles: a region's inputs never depend on its results;
//  * each op outside regions keeps its relative order; the block stays in
//    dominance order, so later passes and the bundle emitter see program order;
//  * no region takes ops from both sides of a forge.accumulated cut (CutSides).
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include <optional>

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/EquivalenceClasses.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::forge {
#define GEN_PASS_DEF_FUSE
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

/// A pointwise op that a loop region can evaluate per element.
bool isLoopFusible(Operation *op) {
  auto iface = dyn_cast<ForgeOpInterface>(op);
  if (!iface || iface.getFusionClass() != FusionClass::Elementwise || op->getNumResults() != 1)
    return false;
  auto type = dyn_cast<RankedTensorType>(op->getResult(0).getType());
  return type && type.hasStaticShape() && type.getNumElements() > 0;
}

ArrayRef<int64_t> shapeOf(Operation *op) {
  return cast<RankedTensorType>(op->getResult(0).getType()).getShape();
}

/// forge.accumulated (gradient accumulation in a loop) cuts a training step
/// in two: what its sums depend on (one micro-batch's forward and backward)
/// and the rest, which forge-split-accumulation makes two routines. No region
/// may take ops of both sides. An op of the first that the rest reads too (a
/// scalar such as 1 / forge.micro_count) is a side of its own: the split
/// recomputes it in the rest, which it can only if no region mixed it with
/// the micro-batch's ops. Without a cut every op is on one side.
class CutSides {
public:
  explicit CutSides(Block &block) : micro(accumulationPart(block)) {
    for (Operation *op : micro)
      for (Operation *user : op->getUsers()) {
        user = block.findAncestorOpInBlock(*user);
        if (user && !micro.contains(user) && !isa<AccumulatedOp, func::ReturnOp>(user)) {
          shared.insert(op);
          break;
        }
      }
  }
  /// Whether `a` and `b` are on different sides.
  bool apart(Operation *a, Operation *b) const { return side(a) != side(b); }

private:
  int side(Operation *op) const {
    return shared.contains(op) ? 2 : micro.contains(op) ? 1 : 0;
  }
  llvm::DenseSet<Operation *> micro, shared;
};

class LoopGrouper {
public:
  explicit LoopGrouper(Block &block) : sides(block) {
    int64_t i = 0;
    for (Operation &op : block)
      position[&op] = i++;
  }

  /// Assigns every fusible op to a group (its own or a producer's).
  void run(Block &block) {
    for (Operation &op : block) {
      if (!isLoopFusible(&op))
        continue;
      Operation *leader = nullptr;
      for (Value v : op.getOperands()) {
        Operation *def = v.getDefiningOp();
        if (!def || !groupOf.count(def) || shapeOf(def) != shapeOf(&op))
          continue;
        Operation *g = groupOf[def];
        if (g == leader || !canJoin(&op, g) || staysApart(&op, g) || sides.apart(&op, g))
          continue;
        if (!leader) {
          leader = g;
          continue;
        }
        // A second producer group: merge it too when that makes no cycle.
        if (canMerge(leader, g))
          merge(leader, g);
      }
      if (!leader) {
        groupOf[&op] = &op;
        members[&op].push_back(&op);
        firstPos[&op] = position[&op];
        continue;
      }
      groupOf[&op] = leader;
      members[leader].push_back(&op);
    }
  }

  /// Groups of two or more ops, each in program order.
  SmallVector<SmallVector<Operation *>> groups() const {
    SmallVector<SmallVector<Operation *>> out;
    for (const auto &[leader, ops] : members)
      if (ops.size() > 1) {
        SmallVector<Operation *> sorted(ops);
        llvm::sort(sorted, [&](Operation *a, Operation *b) {
          return position.lookup(a) < position.lookup(b);
        });
        out.push_back(std::move(sorted));
      }
    llvm::sort(out, [&](const auto &a, const auto &b) {
      return position.lookup(a.front()) < position.lookup(b.front());
    });
    return out;
  }

private:
  /// Whether `op` should stay out of its producer group `g` although it may
  /// join: `g` is a region without it (two ops or more), every value `op`
  /// reads from `g` is written anyway (another reader is no pointwise op: a
  /// convolution, a pool), and its readers are pointwise ops of its shape that
  /// cannot join `g` (each also reads a value made after `g`: the backward
  /// pass), whose region takes `op` in. Joining would make `g` write `op`'s
  /// result too, kept until those readers run (a ReLU's mask beside the ReLU's
  /// output that a convolution reads); apart, the readers' region computes it
  /// from the value kept anyway: as many bytes moved, none kept.
  bool staysApart(Operation *op, Operation *g) {
    if (members[g].size() < 2)
      return false; // joining makes the region (a lone op is no region)
    bool fromG = false;
    for (Value v : op->getOperands()) {
      Operation *def = v.getDefiningOp();
      if (!def || groupOf.lookup(def) != g)
        continue;
      fromG = true;
      if (llvm::none_of(v.getUsers(), [&](Operation *u) { return u != op && !isLoopFusible(u); }))
        return false; // written for `op` alone (or for pointwise readers)
    }
    if (!fromG || op->getResult(0).use_empty())
      return false;
    return llvm::all_of(op->getResult(0).getUsers(), [&](Operation *u) {
      return isLoopFusible(u) && shapeOf(u) == shapeOf(op) &&
             llvm::any_of(u->getOperands(), [&](Value w) {
               Operation *def = w.getDefiningOp();
               return w != op->getResult(0) && def && groupOf.lookup(def) != g &&
                      dependsOn(def, g);
             });
    });
  }

  /// Whether `op` may join group `g`: none of its operands from outside `g`
  /// depends on `g` (that path would become a cycle through the region).
  bool canJoin(Operation *op, Operation *g) {
    for (Value v : op->getOperands()) {
      Operation *def = v.getDefiningOp();
      if (!def || groupOf.lookup(def) == g)
        continue;
      if (dependsOn(def, g))
        return false;
    }
    return true;
  }

  /// Whether groups `a` and `b` may become one: no op outside both lies on a
  /// path from one to the other.
  bool canMerge(Operation *a, Operation *b) { return !reaches(a, b) && !reaches(b, a); }

  /// Whether a member of `to` reads a value from outside `to` and `from` that
  /// depends on `from`.
  bool reaches(Operation *from, Operation *to) {
    for (Operation *m : members[to])
      for (Value v : m->getOperands()) {
        Operation *def = v.getDefiningOp();
        if (def && groupOf.lookup(def) != to && groupOf.lookup(def) != from && dependsOn(def, from))
          return true;
      }
    return false;
  }

  void merge(Operation *into, Operation *from) {
    for (Operation *m : members[from]) {
      groupOf[m] = into;
      members[into].push_back(m);
    }
    members.erase(from);
    firstPos[into] = std::min(firstPos[into], firstPos[from]);
    firstPos.erase(from);
  }

  /// Whether `op` (outside `g`) transitively uses a value of group `g`. Only
  /// ops after the group's first op can; the search stops there.
  bool dependsOn(Operation *op, Operation *g) {
    int64_t floor = firstPos[g];
    SmallVector<Operation *> stack{op};
    llvm::DenseSet<Operation *> seen{op};
    while (!stack.empty()) {
      Operation *cur = stack.pop_back_val();
      if (position.lookup(cur) < floor)
        continue;
      for (Value v : cur->getOperands()) {
        Operation *def = v.getDefiningOp();
        if (!def)
          continue;
        if (groupOf.lookup(def) == g)
          return true;
        if (seen.insert(def).second)
          stack.push_back(def);
      }
    }
    return false;
  }

  CutSides sides;
  llvm::DenseMap<Operation *, int64_t> position;
  llvm::DenseMap<Operation *, Operation *> groupOf;            // op -> group leader
  llvm::MapVector<Operation *, SmallVector<Operation *>> members; // leader -> ops
  llvm::DenseMap<Operation *, int64_t> firstPos;               // leader -> first position
};

/// Whether an op of `starts` transitively reads a result of an op in
/// `members`, in the current IR. Only ops after `floor` can; the search stops
/// there.
bool readsAny(ArrayRef<Operation *> starts, const llvm::SmallPtrSetImpl<Operation *> &members,
              Operation *floor) {
  SmallVector<Operation *> stack(starts);
  llvm::DenseSet<Operation *> seen(starts.begin(), starts.end());
  while (!stack.empty()) {
    Operation *cur = stack.pop_back_val();
    for (Value v : cur->getOperands()) {
      Operation *def = v.getDefiningOp();
      if (!def || def->isBeforeInBlock(floor))
        continue;
      if (members.count(def))
        return true;
      if (seen.insert(def).second)
        stack.push_back(def);
    }
  }
  return false;
}

/// Whether an op of `starts` transitively reads a result of `op` (readsAny
/// with `op` alone as member and floor).
bool readsOp(ArrayRef<Operation *> starts, Operation *op) {
  llvm::SmallPtrSet<Operation *, 1> member;
  member.insert(op);
  return readsAny(starts, member, op);
}

/// Whether a value defined outside `group` depends on one defined inside it, in
/// the current IR (earlier regions already outlined). The grouper avoids such
/// groups; this check on the real graph is what guarantees that contracting
/// the group into one op keeps the block acyclic.
bool feedsItself(ArrayRef<Operation *> group, const llvm::SmallPtrSetImpl<Operation *> &inGroup) {
  llvm::SetVector<Operation *> producers; // of the group's operands, outside it
  for (Operation *op : group)
    for (Value v : op->getOperands())
      if (Operation *def = v.getDefiningOp(); def && !inGroup.count(def))
        producers.insert(def);
  return readsAny(producers.getArrayRef(), inGroup, group.front());
}

/// The ops strictly between `first` and `last`, outside `members`, that use
/// a value of a member or of an op already listed, in order: when the
/// members become one op at `last`'s place, these move after it (none of
/// them feeds a member; the callers checked).
SmallVector<Operation *> usersToMove(Operation *first, Operation *last,
                                     const llvm::SmallPtrSetImpl<Operation *> &members) {
  llvm::SmallPtrSet<Operation *, 16> tainted(members.begin(), members.end());
  SmallVector<Operation *> toMove;
  if (first == last) // one member: nothing between
    return toMove;
  for (Operation *op = first->getNextNode(); op != last; op = op->getNextNode()) {
    if (members.count(op))
      continue;
    if (llvm::any_of(op->getOperands(), [&](Value v) {
          Operation *def = v.getDefiningOp();
          return def && tainted.count(def);
        })) {
      tainted.insert(op);
      toMove.push_back(op);
    }
  }
  return toMove;
}

/// Moves `ops` right after `anchor`, keeping their order.
void moveAfter(ArrayRef<Operation *> ops, Operation *anchor) {
  for (Operation *op : ops) {
    op->moveAfter(anchor);
    anchor = op;
  }
}

/// A forge.fusion of `kind` at `b`'s insertion point over `inputs`, its body
/// an empty block with one argument per input; `argOf` maps each input to it.
FusionOp createRegion(OpBuilder &b, Location loc, TypeRange results, ValueRange inputs,
                      StringRef kind, IRMapping &argOf) {
  auto fusion = b.create<FusionOp>(loc, results, inputs, b.getStringAttr(kind));
  Block *body = new Block();
  fusion.getBody().push_back(body);
  for (Value v : inputs)
    argOf.map(v, body->addArgument(v.getType(), v.getLoc()));
  return fusion;
}

/// Replaces the ops of `ops` with one forge.fusion "loop"; false (and nothing
/// changed) when the group would feed itself.
bool outline(ArrayRef<Operation *> ops) {
  // Current program order (outlining earlier groups moved ops).
  SmallVector<Operation *> group(ops);
  llvm::sort(group, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
  llvm::SmallPtrSet<Operation *, 16> inGroup(group.begin(), group.end());
  if (feedsItself(group, inGroup))
    return false;
  llvm::SetVector<Value> inputs;
  SmallVector<Value> outputs;
  for (Operation *op : group) {
    for (Value v : op->getOperands())
      if (!inGroup.count(v.getDefiningOp()))
        inputs.insert(v);
    for (Value r : op->getResults())
      if (llvm::any_of(r.getUsers(), [&](Operation *u) { return !inGroup.count(u); }))
        outputs.push_back(r);
  }
  Operation *last = group.back();
  MLIRContext *ctx = last->getContext();

  // Outside users of the group's values that sit between its first and last
  // op move after the region (with everything after them that uses them);
  // none of them feeds the group (the grouper checked), so this keeps dominance.
  SmallVector<Operation *> toMove = usersToMove(group.front(), last, inGroup);

  SmallVector<Location> locs;
  for (Operation *op : group)
    locs.push_back(op->getLoc());
  OpBuilder b(last);
  SmallVector<Type> resultTypes;
  for (Value v : outputs)
    resultTypes.push_back(v.getType());
  IRMapping map;
  auto fusion = createRegion(b, FusedLoc::get(ctx, locs), resultTypes, inputs.getArrayRef(), "loop",
                             map);
  Block *body = &fusion.getBlock();
  OpBuilder inner = OpBuilder::atBlockEnd(body);
  for (Operation *op : group)
    inner.clone(*op, map);
  SmallVector<Value> yielded;
  for (Value v : outputs)
    yielded.push_back(map.lookup(v));
  inner.create<YieldOp>(fusion.getLoc(), yielded);

  for (auto [v, r] : llvm::zip(outputs, fusion.getResults()))
    v.replaceUsesWithIf(r, [&](OpOperand &use) { return !inGroup.count(use.getOwner()); });
  moveAfter(toMove, fusion);
  for (Operation *op : llvm::reverse(group))
    op->erase();
  return true;
}

/// Bytes of a tensor value (bool: one byte).
int64_t bytesOf(Value v) {
  auto type = cast<RankedTensorType>(v.getType());
  int64_t bits = type.getElementType().getIntOrFloatBitWidth();
  return type.getNumElements() * std::max<int64_t>(1, bits / 8);
}

/// Erases the body ops of `fusion` whose results are unused (its ops are
/// pure), then the inputs nothing reads any more.
void pruneBody(FusionOp fusion) {
  Block &body = fusion.getBlock();
  // A snapshot: erasing through a reverse iterator of without_terminator()
  // would invalidate it.
  SmallVector<Operation *> ops;
  for (Operation &op : body.without_terminator())
    ops.push_back(&op);
  for (Operation *op : llvm::reverse(ops))
    if (op->use_empty())
      op->erase();
  for (int i = static_cast<int>(body.getNumArguments()) - 1; i >= 0; --i)
    if (body.getArgument(i).use_empty()) {
      body.eraseArgument(i);
      fusion->eraseOperand(i);
    }
}

/// Replaces `fusion` by a region without its unused results (or erases it
/// when none is used); false when every result is used.
bool dropUnusedResults(FusionOp fusion) {
  SmallVector<unsigned> used;
  for (OpResult r : fusion.getResults())
    if (!r.use_empty())
      used.push_back(r.getResultNumber());
  if (used.size() == fusion.getNumResults())
    return false;
  if (used.empty()) {
    fusion.erase();
    return true;
  }
  Operation *yield = fusion.getBlock().getTerminator();
  SmallVector<Value> yielded;
  for (unsigned i : used)
    yielded.push_back(yield->getOperand(i));
  FusionOp trimmed = fusion.rebuild(fusion.getInputs(), yielded);
  for (auto [n, i] : llvm::enumerate(used))
    fusion.getResult(i).replaceAllUsesWith(trimmed.getResult(n));
  fusion.erase();
  pruneBody(trimmed);
  return true;
}

/// Rematerialization: when the loop region `consumer` reads results of the
/// earlier loop region `producer` (same iteration shape; `indices` are those
/// inputs), it computes them itself from the producer's inputs if that reads
/// fewer bytes (e.g. a GELU's backward recomputes tanh from the GELU's input
/// instead of reading four saved intermediates). Returns the new consumer, or
/// null when it does not pay.
FusionOp rematerialize(FusionOp consumer, FusionOp producer, ArrayRef<unsigned> indices) {
  Block &pBody = producer.getBlock();
  Operation *pYield = pBody.getTerminator();
  // The producer's results that stay written (another reader needs them),
  // by body value: the consumer reads such a value rather than recompute it
  // (a masked gradient g that the residual path reads: the consumer of g *
  // scale reads g, and the producer no longer writes the product).
  llvm::DenseSet<unsigned> removedResults;
  for (unsigned i : indices)
    removedResults.insert(cast<OpResult>(consumer.getInputs()[i]).getResultNumber());
  llvm::DenseMap<Value, unsigned> keptResult;
  for (auto [j, y] : llvm::enumerate(pYield->getOperands()))
    if (!removedResults.contains(j) &&
        llvm::any_of(producer.getResult(j).getUsers(),
                     [&](Operation *u) { return u != consumer.getOperation(); }))
      keptResult.try_emplace(y, static_cast<unsigned>(j));
  // The producer's ops those results need, its arguments and the kept
  // results they read.
  llvm::SmallPtrSet<Operation *, 16> slice;
  llvm::SetVector<unsigned> pArgs, pResults;
  SmallVector<Value> worklist;
  for (unsigned i : indices)
    worklist.push_back(
        pYield->getOperand(cast<OpResult>(consumer.getInputs()[i]).getResultNumber()));
  llvm::DenseSet<Value> starts(worklist.begin(), worklist.end());
  while (!worklist.empty()) {
    Value v = worklist.pop_back_val();
    if (auto kept = keptResult.find(v); kept != keptResult.end() && !starts.contains(v)) {
      pResults.insert(kept->second);
      continue;
    }
    if (auto arg = dyn_cast<BlockArgument>(v)) {
      pArgs.insert(arg.getArgNumber());
      continue;
    }
    if (slice.insert(v.getDefiningOp()).second)
      llvm::append_range(worklist, v.getDefiningOp()->getOperands());
  }
  llvm::DenseSet<unsigned> removed(indices.begin(), indices.end());
  llvm::SetVector<Value> inputs; // the new consumer's: kept ones, then the producer's it needs
  for (auto [i, v] : llvm::enumerate(consumer.getInputs()))
    if (!removed.contains(i))
      inputs.insert(v);
  // Reads removed, and the producer's writes of results only this consumer
  // reads (dropped afterwards), against the producer's inputs read instead
  // (a GELU's derivative saved by the forward: recomputing it from x reads x
  // instead of it, and the forward no longer writes it).
  int64_t removedBytes = 0, addedBytes = 0;
  for (unsigned i : indices) {
    Value v = consumer.getInputs()[i];
    removedBytes += bytesOf(v);
    if (llvm::all_of(v.getUsers(), [&](Operation *u) { return u == consumer.getOperation(); }))
      removedBytes += bytesOf(v);
  }
  for (unsigned a : pArgs) {
    Value v = producer.getInputs()[a];
    if (inputs.insert(v))
      addedBytes += bytesOf(v);
  }
  for (unsigned j : pResults) {
    Value v = producer.getResult(j);
    if (inputs.insert(v))
      addedBytes += bytesOf(v);
  }
  if (addedBytes >= removedBytes)
    return nullptr;

  OpBuilder b(consumer);
  IRMapping map, argOf; // argOf: input value -> the new body's argument
  auto remat = createRegion(b, consumer.getLoc(), consumer.getResultTypes(), inputs.getArrayRef(),
                            consumer.getKind(), argOf);
  Block *body = &remat.getBlock();
  for (unsigned a : pArgs)
    map.map(pBody.getArgument(a), argOf.lookupOrNull(producer.getInputs()[a]));
  for (unsigned j : pResults)
    map.map(pYield->getOperand(j), argOf.lookupOrNull(producer.getResult(j)));
  OpBuilder inner = OpBuilder::atBlockEnd(body);
  for (Operation &op : pBody.without_terminator())
    if (slice.contains(&op))
      inner.clone(op, map);
  Block &cBody = consumer.getBlock();
  for (auto [i, v] : llvm::enumerate(consumer.getInputs())) {
    BlockArgument arg = cBody.getArgument(i);
    if (removed.contains(i))
      map.map(arg, map.lookup(pYield->getOperand(cast<OpResult>(v).getResultNumber())));
    else
      map.map(arg, argOf.lookupOrNull(v));
  }
  for (Operation &op : cBody)
    inner.clone(op, map);
  consumer.replaceAllUsesWith(remat.getResults());
  consumer.erase();
  return remat;
}

/// Rematerialization over a function's loop regions (see rematerialize), then
/// the producers' results nobody reads any more are dropped.
bool rematerializeRegions(func::FuncOp func) {
  bool changed = false;
  for (Block &block : func.getBody()) {
    // A lone pointwise op reading a loop region's result of its shape (a
    // GELU's gradient applied to the incoming gradient) is a consumer too: as
    // a loop region of its own, kept only when the rematerialization below
    // takes it (else it becomes the op again).
    SmallVector<FusionOp> wrapped;
    for (Operation &op : llvm::make_early_inc_range(block)) {
      if (isa<FusionOp>(op) || !isLoopFusible(&op) ||
          llvm::none_of(op.getOperands(), [&](Value v) {
            auto producer = v.getDefiningOp<FusionOp>();
            return producer && producer.getKind() == "loop" && !producer.isViewRegion() &&
                   producer.getIterationShape() == shapeOf(&op);
          }))
        continue;
      OpBuilder b(&op);
      IRMapping map;
      llvm::SetVector<Value> inputs(op.getOperands().begin(), op.getOperands().end());
      FusionOp region = createRegion(b, op.getLoc(), op.getResultTypes(), inputs.getArrayRef(),
                                     "loop", map);
      OpBuilder inner = OpBuilder::atBlockEnd(&region.getBlock());
      inner.create<YieldOp>(op.getLoc(), inner.clone(op, map)->getResults());
      op.replaceAllUsesWith(region->getResults());
      op.erase();
      wrapped.push_back(region);
    }
    llvm::DenseSet<Operation *> lone(wrapped.begin(), wrapped.end());
    for (FusionOp consumer : llvm::to_vector(block.getOps<FusionOp>())) {
      if (consumer.getKind() != "loop")
        continue;
      for (bool progress = true; progress;) {
        progress = false;
        llvm::MapVector<Operation *, SmallVector<unsigned>> byProducer;
        for (auto [i, v] : llvm::enumerate(consumer.getInputs())) {
          auto producer = v.getDefiningOp<FusionOp>();
          if (producer && producer.getKind() == "loop" &&
              producer.getIterationShape() == consumer.getIterationShape())
            byProducer[producer].push_back(static_cast<unsigned>(i));
        }
        for (auto &[producer, indices] : byProducer)
          if (FusionOp remat = rematerialize(consumer, cast<FusionOp>(producer), indices)) {
            lone.erase(consumer.getOperation());
            consumer = remat;
            progress = changed = true;
            break;
          }
      }
    }
    // The wrapped ops that nothing rematerialized into: ops again.
    for (FusionOp region : wrapped)
      if (lone.contains(region.getOperation()))
        region.inlineBody();
    for (FusionOp fusion : llvm::to_vector(block.getOps<FusionOp>()))
      changed |= dropUnusedResults(fusion);
  }
  return changed;
}

/// A loop region or lone pointwise op with one result of `shape`.
bool isPointwiseStage(Operation *op, ArrayRef<int64_t> shape) {
  if (!op || op->getNumResults() != 1 ||
      cast<RankedTensorType>(op->getResult(0).getType()).getShape() != shape)
    return false;
  if (auto fusion = dyn_cast<FusionOp>(op))
    return fusion.getKind() == "loop";
  return isLoopFusible(op);
}

/// Clones `stage` (a loop region's body or a pointwise op) into `inner`, its
/// inputs looked up in `map` through `argOf`; returns its result's clone.
Value cloneStage(OpBuilder &inner, Operation *stage, IRMapping &map,
                 function_ref<Value(Value)> argOf) {
  if (auto fusion = dyn_cast<FusionOp>(stage)) {
    Block &body = fusion.getBlock();
    for (auto [arg, v] : llvm::zip(body.getArguments(), fusion.getInputs()))
      map.map(arg, argOf(v));
    for (Operation &op : body.without_terminator())
      inner.clone(op, map);
    return map.lookup(body.getTerminator()->getOperand(0));
  }
  for (Value v : stage->getOperands())
    map.map(v, argOf(v));
  return inner.clone(*stage, map)->getResult(0);
}

/// Row fusion (see Passes.td): a row op with its prologue stages (producers of
/// its operands that only it reads) and its epilogue stage (the only reader of
/// its result) becomes one forge.fusion "row" at the last member's place. The
/// members between the row op and the epilogue have no other readers, so
/// moving them there keeps dominance, and an epilogue input cannot depend on
/// the row op but through the row op's result, which only the epilogue reads.
bool fuseRowRegions(func::FuncOp func) {
  bool changed = false;
  SmallVector<Operation *> rowOps;
  func.walk([&](Operation *op) {
    if (isInnermostRowOp(op) && !op->getParentOfType<FusionOp>())
      rowOps.push_back(op);
  });
  for (Operation *row : rowOps) {
    ArrayRef<int64_t> shape = cast<RankedTensorType>(row->getResult(0).getType()).getShape();
    SmallVector<Operation *> prologue; // one per operand, or null
    for (Value v : row->getOperands()) {
      Operation *def = v.getDefiningOp();
      bool only = def && isPointwiseStage(def, shape) &&
                  llvm::all_of(def->getUsers(), [&](Operation *u) { return u == row; }) &&
                  def->getBlock() == row->getBlock();
      prologue.push_back(only ? def : nullptr);
    }
    Operation *epilogue = nullptr;
    if (row->getResult(0).hasOneUse()) {
      Operation *user = *row->getResult(0).getUsers().begin();
      if (isPointwiseStage(user, shape) && user->getBlock() == row->getBlock())
        epilogue = user;
    }
    if (!epilogue && llvm::all_of(prologue, [](Operation *p) { return !p; }))
      continue;

    // Inputs: the stages' and the row op's operands from outside the region.
    llvm::SetVector<Value> inputs;
    llvm::SmallPtrSet<Operation *, 4> members;
    for (Operation *p : prologue)
      if (p)
        members.insert(p);
    auto addInputs = [&](Operation *op) {
      for (Value v : op->getOperands())
        if (!members.count(v.getDefiningOp()) && v != row->getResult(0))
          inputs.insert(v);
    };
    for (Operation *p : prologue)
      if (p)
        addInputs(p);
    addInputs(row);
    if (epilogue)
      addInputs(epilogue);

    Operation *last = epilogue ? epilogue : row;
    Value result = last->getResult(0);
    SmallVector<Location> locs;
    for (Operation *p : prologue)
      if (p)
        locs.push_back(p->getLoc());
    locs.push_back(row->getLoc());
    if (epilogue)
      locs.push_back(epilogue->getLoc());
    OpBuilder b(last);
    IRMapping argOf;
    auto fusion = createRegion(b, FusedLoc::get(func.getContext(), locs),
                               TypeRange{result.getType()}, inputs.getArrayRef(), "row", argOf);
    OpBuilder inner = OpBuilder::atBlockEnd(&fusion.getBlock());
    IRMapping map;
    SmallVector<Value> rowOperands;
    llvm::DenseMap<Operation *, Value> cloned; // a stage feeding two operands is cloned once
    for (auto [v, p] : llvm::zip(row->getOperands(), prologue)) {
      if (!p) {
        rowOperands.push_back(argOf.lookupOrNull(v));
        continue;
      }
      if (!cloned.count(p))
        cloned[p] = cloneStage(inner, p, map, [&](Value x) { return argOf.lookupOrNull(x); });
      rowOperands.push_back(cloned[p]);
    }
    IRMapping rowMap;
    rowMap.map(row->getOperands(), rowOperands);
    Value rowResult = inner.clone(*row, rowMap)->getResult(0);
    Value yielded = rowResult;
    if (epilogue) {
      IRMapping epiMap;
      yielded = cloneStage(inner, epilogue, epiMap, [&](Value x) {
        return x == row->getResult(0) ? rowResult : argOf.lookupOrNull(x);
      });
    }
    inner.create<YieldOp>(fusion.getLoc(), yielded);
    result.replaceAllUsesWith(fusion.getResult(0));
    if (epilogue)
      epilogue->erase();
    row->erase();
    for (Operation *p : members)
      p->erase();
    changed = true;
  }
  return changed;
}

/// The ops of type OpT in `func` that no region holds yet, in program order
/// (collected first: the caller rewrites them).
template <typename OpT> SmallVector<OpT> unfusedOps(func::FuncOp func) {
  SmallVector<OpT> ops;
  func.walk([&](OpT op) {
    if (!op->template getParentOfType<FusionOp>())
      ops.push_back(op);
  });
  return ops;
}

/// Batch-norm fusion (see Passes.td). Forward: a batch_norm_training whose normalized
/// output only one loop region (or pointwise op) of its shape reads, whose
/// other inputs have that shape or one element, becomes one forge.fusion
/// "batch_norm" at that reader's place: the ReLU (and a residual add) after a
/// convolution net's batch norms run in the norm's output pass. The running
/// statistics come last among the region's results; their readers (the
/// step's returned state) follow the region or move after it. Gradient: a
/// batch_norm_training_grad with the pointwise stage that alone computes its
/// dy, at the gradient's place.
bool fuseBatchNorms(func::FuncOp func) {
  bool changed = false;
  for (BatchNormTrainingOp norm : unfusedOps<BatchNormTrainingOp>(func)) {
    Value y = norm->getResult(0);
    auto type = cast<RankedTensorType>(y.getType());
    if (!y.hasOneUse() || !type.hasStaticShape() || type.getNumElements() == 0)
      continue;
    Operation *epilogue = *y.getUsers().begin();
    if (epilogue->getBlock() != norm->getBlock())
      continue;
    auto fusion = dyn_cast<FusionOp>(epilogue);
    if (fusion ? fusion.getKind() != "loop" || fusion.isViewRegion() : !isLoopFusible(epilogue))
      continue;
    bool fits = llvm::all_of(epilogue->getResultTypes(), [&](Type t) {
      return cast<RankedTensorType>(t).getShape() == type.getShape();
    });
    for (Value v : epilogue->getOperands()) {
      auto t = cast<RankedTensorType>(v.getType());
      fits &= t.getShape() == type.getShape() || (t.hasStaticShape() && t.getNumElements() == 1);
    }
    if (!fits)
      continue;
    // Readers of the running statistics before the epilogue move after it.
    SmallVector<Operation *> early;
    for (Value stat : norm->getResults().drop_front())
      for (Operation *user : stat.getUsers()) {
        Operation *at = norm->getBlock()->findAncestorOpInBlock(*user);
        if (!at || at->isBeforeInBlock(epilogue))
          early.push_back(at);
      }
    if (llvm::any_of(early, [](Operation *op) { return !op; }))
      continue;
    SmallVector<Operation *> toMove;
    if (!early.empty()) {
      llvm::SmallPtrSet<Operation *, 2> members{norm.getOperation(), epilogue};
      toMove = usersToMove(norm, epilogue, members);
      llvm::SmallPtrSet<Operation *, 8> moving(toMove.begin(), toMove.end());
      if (llvm::any_of(epilogue->getOperands(),
                       [&](Value v) { return moving.count(v.getDefiningOp()); }))
        continue; // the statistics feed the epilogue: not one pass
    }

    llvm::SetVector<Value> inputs;
    for (Value v : norm->getOperands())
      inputs.insert(v);
    for (Value v : epilogue->getOperands())
      if (v != y)
        inputs.insert(v);
    SmallVector<Type> resultTypes(epilogue->getResultTypes());
    resultTypes.push_back(norm->getResult(1).getType());
    resultTypes.push_back(norm->getResult(2).getType());
    OpBuilder b(epilogue);
    IRMapping argOf;
    auto region = createRegion(
        b, FusedLoc::get(func.getContext(), {norm->getLoc(), epilogue->getLoc()}), resultTypes,
        inputs.getArrayRef(), "batch_norm", argOf);
    OpBuilder inner = OpBuilder::atBlockEnd(&region.getBlock());
    IRMapping normMap;
    for (Value v : norm->getOperands())
      normMap.map(v, argOf.lookupOrNull(v));
    Operation *normClone = inner.clone(*norm, normMap);
    SmallVector<Value> yielded;
    IRMapping epiMap;
    if (auto loop = dyn_cast<FusionOp>(epilogue)) {
      Block &loopBody = loop.getBlock();
      for (auto [arg, v] : llvm::zip(loopBody.getArguments(), loop.getInputs()))
        epiMap.map(arg, v == y ? normClone->getResult(0) : argOf.lookupOrNull(v));
      for (Operation &op : loopBody.without_terminator())
        inner.clone(op, epiMap);
      for (Value v : loopBody.getTerminator()->getOperands())
        yielded.push_back(epiMap.lookupOrDefault(v));
    } else {
      for (Value v : epilogue->getOperands())
        epiMap.map(v, v == y ? normClone->getResult(0) : argOf.lookupOrNull(v));
      yielded.push_back(inner.clone(*epilogue, epiMap)->getResult(0));
    }
    yielded.push_back(normClone->getResult(1));
    yielded.push_back(normClone->getResult(2));
    inner.create<YieldOp>(region.getLoc(), yielded);
    for (auto [i, r] : llvm::enumerate(epilogue->getResults()))
      r.replaceAllUsesWith(region.getResult(i));
    unsigned n = epilogue->getNumResults();
    norm->getResult(1).replaceAllUsesWith(region.getResult(n));
    norm->getResult(2).replaceAllUsesWith(region.getResult(n + 1));
    moveAfter(toMove, region);
    epilogue->erase();
    norm->erase();
    changed = true;
  }
  // Gradients: the pointwise stage that alone computes dy (a ReLU's mask
  // applied to the incoming gradient), evaluated in both of the kernel's passes.
  for (BatchNormTrainingGradOp grad : unfusedOps<BatchNormTrainingGradOp>(func)) {
    Value dy = grad->getOperand(2);
    auto type = cast<RankedTensorType>(dy.getType());
    Operation *prologue = dy.getDefiningOp();
    if (!type.hasStaticShape() || type.getNumElements() == 0 || !prologue ||
        !isPointwiseStage(prologue, type.getShape()) || !dy.hasOneUse() ||
        prologue->getBlock() != grad->getBlock() ||
        (isa<FusionOp>(prologue) && cast<FusionOp>(prologue).isViewRegion()))
      continue;
    if (!llvm::all_of(prologue->getOperands(), [&](Value v) {
          auto t = cast<RankedTensorType>(v.getType());
          return t.getShape() == type.getShape() || (t.hasStaticShape() && t.getNumElements() == 1);
        }))
      continue;
    llvm::SetVector<Value> inputs;
    inputs.insert(grad->getOperand(0));
    inputs.insert(grad->getOperand(1));
    for (Value v : prologue->getOperands())
      inputs.insert(v);
    OpBuilder b(grad);
    IRMapping argOf;
    auto region = createRegion(
        b, FusedLoc::get(func.getContext(), {prologue->getLoc(), grad->getLoc()}),
        grad->getResultTypes(), inputs.getArrayRef(), "batch_norm", argOf);
    OpBuilder inner = OpBuilder::atBlockEnd(&region.getBlock());
    IRMapping map;
    Value innerDy = cloneStage(inner, prologue, map, [&](Value v) { return argOf.lookupOrNull(v); });
    IRMapping gradMap;
    gradMap.map(grad->getOperand(0), argOf.lookupOrNull(grad->getOperand(0)));
    gradMap.map(grad->getOperand(1), argOf.lookupOrNull(grad->getOperand(1)));
    Operation *gradClone = inner.clone(*grad, gradMap);
    gradClone->setOperand(2, innerDy);
    inner.create<YieldOp>(region.getLoc(), gradClone->getResults());
    grad->replaceAllUsesWith(region.getResults());
    grad->erase();
    prologue->erase();
    changed = true;
  }
  return changed;
}

/// The region "gemm" of `product` and `epilogue` at `at` (one of them); the
/// region's arguments are the product's operands and the body clones both ops
/// (the epilogue reading `epilogueInput`'s clone), yielding `yielded`'s clones.
FusionOp createGemmRegion(Operation *product, Operation *epilogue, Operation *at,
                          ArrayRef<Value> yielded) {
  OpBuilder b(at);
  IRMapping map;
  SmallVector<Type> types;
  for (Value v : yielded)
    types.push_back(v.getType());
  FusionOp region = createRegion(b, FusedLoc::get(at->getContext(), {product->getLoc(), epilogue->getLoc()}),
                                 types, product->getOperands(), "gemm", map);
  OpBuilder inner = OpBuilder::atBlockEnd(&region.getBlock());
  inner.clone(*product, map);
  inner.clone(*epilogue, map);
  inner.create<YieldOp>(region.getLoc(), llvm::map_to_vector(yielded, [&](Value v) {
                          return map.lookup(v);
                        }));
  return region;
}

/// Whether `values` are pairwise distinct: a gemm region binds one argument
/// to each (x @ x^T would need one value bound to two arguments).
bool distinct(ValueRange values) {
  llvm::SmallPtrSet<void *, 4> seen;
  return llvm::all_of(values, [&](Value v) { return seen.insert(v.getAsOpaquePointer()).second; });
}

/// A ReLU that alone reads `product`: one gemm region yielding the ReLU.
bool fuseReluEpilogue(Operation *product) {
  Value y = product->getResult(0);
  if (!y.hasOneUse() || !isa<ReluOp>(*y.getUsers().begin()) ||
      !distinct(product->getOperands()))
    return false;
  Operation *relu = *y.getUsers().begin();
  if (relu->getBlock() != product->getBlock())
    return false;
  FusionOp region = createGemmRegion(product, relu, relu, {relu->getResult(0)});
  relu->getResult(0).replaceAllUsesWith(region.getResult(0));
  relu->erase();
  product->erase();
  return true;
}

/// A product that one 2-D GEMM computes: P = matmul(A, W) (W a matrix, A not
/// transposed; A's batch dims fold into M) or a gemm without C.
struct FlatProduct {
  int64_t m = 0, k = 0, n = 0;
};
std::optional<FlatProduct> flatProduct(Operation *product) {
  auto type = cast<RankedTensorType>(product->getResult(0).getType());
  auto gemm = dyn_cast<GemmOp>(product);
  auto matmul = dyn_cast<MatMulOp>(product);
  Value lhs = product->getOperand(0), rhs = product->getOperand(1);
  auto lhsType = cast<RankedTensorType>(lhs.getType());
  if (type.getRank() < 2 || cast<RankedTensorType>(rhs.getType()).getRank() != 2 ||
      (gemm && gemm.getC()) || (matmul && (matmul.getTransA() || lhsType.getRank() < 2)))
    return std::nullopt;
  FlatProduct f;
  f.n = type.getShape().back();
  f.m = type.getNumElements() / f.n;
  f.k = gemm && gemm.getTransA() ? lhsType.getDimSize(0) : lhsType.getShape().back();
  return f;
}

/// `v` viewed as `shape` (itself when it has that shape).
Value viewAs(OpBuilder &b, Location loc, Value v, ArrayRef<int64_t> shape) {
  auto t = cast<RankedTensorType>(v.getType());
  if (t.getShape() == shape)
    return v;
  return b.create<ReshapeOp>(loc, RankedTensorType::get(shape, t.getElementType()), v,
                             b.getDenseI64ArrayAttr(shape));
}

/// The flat product's 2-D GEMM in a region body, on the region's arguments
/// `a` (the lhs as [M, K]) and `w`, with C = `c` (or none) scaled by `beta`.
Value cloneAsGemm(OpBuilder &inner, Location loc, Operation *product, const FlatProduct &f,
                  Value a, Value w, Value c, double beta) {
  auto gemm = dyn_cast<GemmOp>(product);
  auto matrix = RankedTensorType::get({f.m, f.n}, inner.getF32Type());
  return inner.create<GemmOp>(
      loc, matrix, a, w, c, inner.getBoolAttr(gemm ? gemm.getTransA() : false),
      inner.getBoolAttr(gemm ? gemm.getTransB() : cast<MatMulOp>(product).getTransB()),
      gemm ? gemm.getAlphaAttr() : inner.getF64FloatAttr(1.0), inner.getF64FloatAttr(beta));
}

/// Residual linear layers: add(add(P, b), r), P a flat product, b a row of
/// P's columns, r of P's shape: gemm(A, W, C = r, beta 1) with b as the BIAS
/// epilogue, one call instead of the product and a kernel reading it, b and
/// r (GPT-2's attention and MLP outputs). cuBLASLt adds C before the bias:
/// the body does too (fp32 reassociation of the two adds).
bool fuseResidualEpilogue(func::FuncOp func, Operation *product) {
  Value y = product->getResult(0);
  auto type = cast<RankedTensorType>(y.getType());
  std::optional<FlatProduct> f = flatProduct(product);
  if (!f || !y.hasOneUse())
    return false;
  auto addBias = dyn_cast<AddOp>(*y.getUsers().begin());
  if (!addBias || addBias->getBlock() != product->getBlock() ||
      !addBias.getResult().hasOneUse() || addBias.getType() != type)
    return false;
  Value bias = addBias.getLhs() == y ? addBias.getRhs() : addBias.getLhs();
  auto biasType = cast<RankedTensorType>(bias.getType());
  if (biasType.getRank() != 1 || biasType.getDimSize(0) != f->n ||
      !biasType.getElementType().isF32())
    return false;
  auto addResidual = dyn_cast<AddOp>(*addBias.getResult().getUsers().begin());
  if (!addResidual || addResidual->getBlock() != product->getBlock() ||
      addResidual.getType() != type)
    return false;
  Value residual =
      addResidual.getLhs() == addBias.getResult() ? addResidual.getRhs() : addResidual.getLhs();
  Value lhs = product->getOperand(0), rhs = product->getOperand(1);
  if (residual.getType() != type || residual == addBias.getResult() ||
      !distinct({lhs, rhs, residual, bias}))
    return false;
  OpBuilder b(addResidual);
  Location loc = FusedLoc::get(func.getContext(),
                               {product->getLoc(), addBias.getLoc(), addResidual.getLoc()});
  Value a = isa<GemmOp>(product) ? lhs : viewAs(b, loc, lhs, {f->m, f->k});
  Value c = viewAs(b, loc, residual, {f->m, f->n});
  auto matrix = RankedTensorType::get({f->m, f->n}, type.getElementType());
  IRMapping map;
  FusionOp region = createRegion(b, loc, matrix, ValueRange{a, rhs, c, bias}, "gemm", map);
  OpBuilder inner = OpBuilder::atBlockEnd(&region.getBlock());
  Value p = cloneAsGemm(inner, loc, product, *f, map.lookup(a), map.lookup(rhs), map.lookup(c), 1.0);
  Value sum = inner.create<AddOp>(loc, matrix, p, map.lookup(bias));
  inner.create<YieldOp>(loc, sum);
  b.setInsertionPointAfter(region);
  addResidual.getResult().replaceAllUsesWith(viewAs(b, loc, region.getResult(0), type.getShape()));
  addResidual->erase();
  addBias->erase();
  product->erase();
  return true;
}

/// The tanh GELU of a linear layer: gelu(add(P, b)) or gelu(P), P a flat
/// product, b a row of P's columns: one gemm region whose GEMM adds b as C
/// and applies the GELU (cuBLASLt's GELU_BIAS / GELU). When anything else
/// reads the GELU's input (the backward pass's gelu_grad), the region also
/// yields it as the epilogue's aux output (GELU_AUX_BIAS / GELU_AUX), so the
/// pre-activation is written by the GEMM instead of by a kernel of its own.
bool fuseGeluEpilogue(func::FuncOp func, Operation *product) {
  Value y = product->getResult(0);
  auto type = cast<RankedTensorType>(y.getType());
  std::optional<FlatProduct> f = flatProduct(product);
  if (!f || !distinct(product->getOperands()))
    return false;
  auto isTanhGelu = [&](Operation *op, Value x) {
    auto gelu = dyn_cast<GeluOp>(op);
    return gelu && gelu.getInput() == x && gelu.getApproximate() == "tanh" &&
           gelu->getBlock() == product->getBlock();
  };
  AddOp addBias;
  Value bias, pre = y;
  if (y.hasOneUse() && (addBias = dyn_cast<AddOp>(*y.getUsers().begin()))) {
    bias = addBias.getLhs() == y ? addBias.getRhs() : addBias.getLhs();
    auto biasType = cast<RankedTensorType>(bias.getType());
    if (addBias->getBlock() != product->getBlock() || addBias.getType() != type ||
        biasType.getRank() != 1 || biasType.getDimSize(0) != f->n ||
        !biasType.getElementType().isF32() || !distinct({product->getOperand(0), product->getOperand(1), bias}))
      return false;
    pre = addBias.getResult();
  }
  GeluOp gelu;
  for (Operation *user : pre.getUsers())
    if (isTanhGelu(user, pre))
      gelu = cast<GeluOp>(user);
  if (!gelu || (!addBias && llvm::any_of(pre.getUsers(), [&](Operation *u) {
                  return u != gelu && u->isBeforeInBlock(gelu);
                })))
    return false; // without a bias the region replaces P at the GELU: readers before it stay unfused
  bool aux = !pre.hasOneUse();
  Operation *at = addBias ? addBias.getOperation() : gelu.getOperation();
  OpBuilder b(at);
  SmallVector<Location> locs{product->getLoc(), gelu.getLoc()};
  if (addBias)
    locs.push_back(addBias.getLoc());
  Location loc = FusedLoc::get(func.getContext(), locs);
  Value lhs = product->getOperand(0), rhs = product->getOperand(1);
  Value a = isa<GemmOp>(product) ? lhs : viewAs(b, loc, lhs, {f->m, f->k});
  SmallVector<Value> inputs{a, rhs};
  if (bias)
    inputs.push_back(bias);
  auto matrix = RankedTensorType::get({f->m, f->n}, type.getElementType());
  SmallVector<Type> results(aux ? 2 : 1, matrix);
  IRMapping map;
  FusionOp region = createRegion(b, loc, results, inputs, "gemm", map);
  OpBuilder inner = OpBuilder::atBlockEnd(&region.getBlock());
  Value p = cloneAsGemm(inner, loc, product, *f, map.lookup(a), map.lookup(rhs),
                        bias ? map.lookup(bias) : Value(), 1.0);
  Value g = inner.create<GeluOp>(loc, matrix, p, inner.getStringAttr("tanh"));
  SmallVector<Value> yielded{g};
  if (aux)
    yielded.push_back(p);
  inner.create<YieldOp>(loc, yielded);
  b.setInsertionPointAfter(region);
  Value out = viewAs(b, loc, region.getResult(0), type.getShape());
  if (aux)
    pre.replaceAllUsesExcept(viewAs(b, loc, region.getResult(1), type.getShape()), gelu);
  gelu.getResult().replaceAllUsesWith(out);
  gelu->erase();
  if (addBias)
    addBias->erase();
  product->erase();
  return true;
}

/// The tanh GELU's gradient after the GEMM that produces its grad_output:
/// gelu_grad(P, X), P a flat product that only it reads: one gemm region
/// with cuBLASLt's DGELU epilogue reading X (the forward's aux output). When
/// a reduce_sum over all but the last axis reads the gradient (a bias
/// gradient), it joins as DGELU_BGRAD.
bool fuseGeluGradEpilogue(func::FuncOp func, Operation *product) {
  Value y = product->getResult(0);
  std::optional<FlatProduct> f = flatProduct(product);
  if (!f || !y.hasOneUse())
    return false;
  // The product itself or its one reshape (a 2-D gemm's [M, N] viewed as the
  // activation's [B, T, N]).
  auto view = dyn_cast<ReshapeOp>(*y.getUsers().begin());
  if (view && (view->getBlock() != product->getBlock() || !view.getResult().hasOneUse()))
    return false;
  if (view)
    y = view.getResult();
  auto type = cast<RankedTensorType>(y.getType());
  auto grad = dyn_cast<GeluGradOp>(*y.getUsers().begin());
  Value lhs = product->getOperand(0), rhs = product->getOperand(1);
  if (!grad || grad.getGradOutput() != y || grad.getApproximate() != "tanh" ||
      grad->getBlock() != product->getBlock() || grad.getInput().getType() != type ||
      !distinct({lhs, rhs, grad.getInput()}))
    return false;
  // A bias gradient of the result: reduce_sum over every axis but the last.
  ReduceSumOp biasGrad;
  SmallVector<int64_t> leading = llvm::to_vector(llvm::seq<int64_t>(0, type.getRank() - 1));
  for (Operation *user : grad.getResult().getUsers())
    if (auto sum = dyn_cast<ReduceSumOp>(user);
        sum && sum->getBlock() == grad->getBlock() &&
        ArrayRef<int64_t>(sum.getAxes()) == ArrayRef<int64_t>(leading))
      biasGrad = sum;
  OpBuilder b(grad);
  SmallVector<Location> locs{product->getLoc(), grad.getLoc()};
  if (biasGrad)
    locs.push_back(biasGrad.getLoc());
  Location loc = FusedLoc::get(func.getContext(), locs);
  Value a = isa<GemmOp>(product) ? lhs : viewAs(b, loc, lhs, {f->m, f->k});
  Value x = viewAs(b, loc, grad.getInput(), {f->m, f->n});
  auto matrix = RankedTensorType::get({f->m, f->n}, type.getElementType());
  auto row = RankedTensorType::get({1, f->n}, type.getElementType());
  SmallVector<Type> results{matrix};
  if (biasGrad)
    results.push_back(row);
  IRMapping map;
  FusionOp region = createRegion(b, loc, results, ValueRange{a, rhs, x}, "gemm", map);
  OpBuilder inner = OpBuilder::atBlockEnd(&region.getBlock());
  Value p = cloneAsGemm(inner, loc, product, *f, map.lookup(a), map.lookup(rhs), Value(), 0.0);
  Value dx = inner.create<GeluGradOp>(loc, matrix, p, map.lookup(x), inner.getStringAttr("tanh"));
  SmallVector<Value> yielded{dx};
  if (biasGrad)
    yielded.push_back(inner.create<ReduceSumOp>(loc, row, dx, inner.getDenseI64ArrayAttr({0}),
                                                inner.getBoolAttr(true)));
  inner.create<YieldOp>(loc, yielded);
  b.setInsertionPointAfter(region);
  if (biasGrad) {
    biasGrad.getResult().replaceAllUsesWith(viewAs(
        b, loc, region.getResult(1), cast<RankedTensorType>(biasGrad.getType()).getShape()));
    biasGrad->erase();
  }
  grad.getResult().replaceAllUsesWith(viewAs(b, loc, region.getResult(0), type.getShape()));
  grad->erase();
  if (view)
    view->erase();
  product->erase();
  return true;
}

/// Bias gradients: reduce_sum(X) over all but X's last axis beside a GEMM
/// whose transposed lhs (or plain rhs) is X viewed as [K, M]: the same sum
/// over the contraction, which the GEMM's BGRAD epilogue computes as it
/// reads the operand.
bool fuseBiasGradients(func::FuncOp func, llvm::SmallPtrSetImpl<Operation *> &taken) {
  bool changed = false;
  for (ReduceSumOp sum : unfusedOps<ReduceSumOp>(func)) {
    auto in = cast<RankedTensorType>(sum.getInput().getType());
    if (!in.hasStaticShape() || in.getRank() < 2 || !in.getElementType().isF32() ||
        in.getNumElements() == 0)
      continue;
    SmallVector<int64_t> leading = llvm::to_vector(llvm::seq<int64_t>(0, in.getRank() - 1));
    if (ArrayRef<int64_t>(sum.getAxes()) != ArrayRef<int64_t>(leading))
      continue;
    // X itself (2-D) or its reshapes to [K, M].
    SmallVector<Value> views{sum.getInput()};
    for (Operation *user : sum.getInput().getUsers())
      if (auto reshape = dyn_cast<ReshapeOp>(user);
          reshape && reshape->getBlock() == sum->getBlock() &&
          cast<RankedTensorType>(reshape.getType()).getRank() == 2 &&
          cast<RankedTensorType>(reshape.getType()).getShape().back() == in.getShape().back())
        views.push_back(reshape.getResult());
    Operation *product = nullptr;
    for (Value view : views) {
      if (cast<RankedTensorType>(view.getType()).getRank() != 2)
        continue;
      for (Operation *user : view.getUsers()) {
        if (!isa<GemmOp, MatMulOp>(user) || taken.count(user) || !isStaticNonEmptyF32(user) ||
            user->getBlock() != sum->getBlock())
          continue;
        auto gemm = dyn_cast<GemmOp>(user);
        auto matmul = dyn_cast<MatMulOp>(user);
        if (gemm && (gemm.getC() || gemm.getAlpha().convertToDouble() != 1.0))
          continue;
        bool transA = gemm ? gemm.getTransA() : matmul.getTransA();
        bool transB = gemm ? gemm.getTransB() : matmul.getTransB();
        Value lhs = user->getOperand(0), rhs = user->getOperand(1);
        if (cast<RankedTensorType>(lhs.getType()).getRank() != 2 ||
            cast<RankedTensorType>(rhs.getType()).getRank() != 2)
          continue;
        if (!((lhs == view && transA && rhs != view) || (rhs == view && !transB && lhs != view)))
          continue;
        // Only when the product's tiles fill the GPU without splitting k:
        // cuBLASLt's bias-gradient epilogue runs without split-K, so a weight
        // gradient over many rows (GPT-2's: k = 16384 tokens, 768 x 768 to
        // 768 x 3072 products) ran ~1.5x slower than the plain GEMM and its
        // separate column sum together (bench/RESULTS.md, 2026-12-02). A
        // small product (under 2^28 FLOPs: a fraction of a microsecond of
        // tensor-core time) costs its launch whatever its split, so there
        // the epilogue saves the column sum's launch (the MLP's layers).
        auto out = cast<RankedTensorType>(user->getResult(0).getType());
        int64_t k = cast<RankedTensorType>(view.getType()).getDimSize(0);
        int64_t m = out.getDimSize(0), n = out.getDimSize(1);
        bool small = 2 * m * n * k < (int64_t(1) << 28);
        if (!small && k > std::max(m, n))
          continue;
        product = user;
        break;
      }
      if (product)
        break;
    }
    if (!product)
      continue;
    Value operand = product->getOperand(0) == sum.getInput() ||
                            llvm::is_contained(views, product->getOperand(0))
                        ? product->getOperand(0)
                        : product->getOperand(1);
    if (!llvm::is_contained(views, operand))
      continue;
    // The region goes where the later of the two is; readers of the earlier
    // one in between move after it (unless they feed the later one).
    bool sumFirst = sum->isBeforeInBlock(product);
    Operation *first = sumFirst ? sum.getOperation() : product;
    Operation *last = sumFirst ? product : sum.getOperation();
    llvm::SmallPtrSet<Operation *, 2> members{first, last};
    SmallVector<Operation *> toMove = usersToMove(first, last, members);
    llvm::SmallPtrSet<Operation *, 8> moving(toMove.begin(), toMove.end());
    if (llvm::any_of(last->getOperands(), [&](Value v) { return moving.count(v.getDefiningOp()); }))
      continue;
    // The sum over the 2-D operand's rows, [1, M]; viewed back as the sum's type.
    OpBuilder b(last);
    auto rowType = RankedTensorType::get({1, in.getShape().back()}, in.getElementType());
    auto rows = b.create<ReduceSumOp>(sum.getLoc(), rowType, operand, b.getDenseI64ArrayAttr({0}),
                                      b.getBoolAttr(true));
    FusionOp region = createGemmRegion(product, rows, last, {product->getResult(0), rows});
    rows->erase();
    b.setInsertionPointAfter(region);
    Value grad = region.getResult(1);
    if (grad.getType() != sum.getType())
      grad = b.create<ReshapeOp>(sum.getLoc(), sum.getType(), grad,
                                 b.getDenseI64ArrayAttr(cast<RankedTensorType>(sum.getType()).getShape()));
    product->getResult(0).replaceAllUsesWith(region.getResult(0));
    sum.getResult().replaceAllUsesWith(grad);
    moveAfter(toMove, grad.getDefiningOp());
    taken.insert(product);
    sum->erase();
    product->erase();
    changed = true;
  }
  return changed;
}

/// Whether `v` is a constant 0 of one element (a gradient rule's scalarLike 0).
bool isScalarZero(Value v) {
  auto c = v.getDefiningOp<ConstantOp>();
  auto attr = c ? dyn_cast<DenseElementsAttr>(c.getValue()) : DenseElementsAttr();
  return attr && attr.getNumElements() == 1 && isa<FloatType>(attr.getElementType()) &&
         attr.getSplatValue<APFloat>().isZero();
}

/// A ReLU's gradient after a GEMM: where(greater(R, 0), P, 0) with R a gemm
/// region's ReLU and P a 2-D product of R's shape that only it reads. The
/// forward region also yields R's bit mask (cuBLASLt's RELU_AUX[_BIAS]) and
/// P joins a region that masks it as it is written (DRELU): the backward
/// reads 1 bit per element instead of R's 4 bytes, and its kernel is gone.
bool fuseReluGradEpilogue(func::FuncOp func, WhereOp where) {
  auto greater = where.getCondition().getDefiningOp<GreaterOp>();
  if (!greater || !isScalarZero(greater.getRhs()) || !isScalarZero(where.getY()))
    return false;
  auto forward = greater.getLhs().getDefiningOp<FusionOp>();
  Operation *product = where.getX().getDefiningOp();
  if (!forward || forward.getKind() != "gemm" || forward.getNumResults() != 1 ||
      forward->hasAttr("forge.library") || !product || !isa<GemmOp, MatMulOp>(product) ||
      product->getParentOp() != func || !product->getResult(0).hasOneUse() ||
      !isStaticNonEmptyF32(product))
    return false;
  Block &body = forward.getBlock();
  auto relu = dyn_cast<ReluOp>(*std::next(body.begin()));
  auto type = cast<RankedTensorType>(where.getType());
  std::optional<FlatProduct> f = flatProduct(product);
  if (!relu || !f || type.getRank() != 2 || greater.getLhs().getType() != type ||
      product->getResult(0).getType() != type || where->getBlock() != forward->getBlock() ||
      !distinct({product->getOperand(0), product->getOperand(1)}))
    return false;
  // The forward region again, yielding the mask too.
  OpBuilder b(forward);
  IRMapping map;
  auto maskType =
      RankedTensorType::get({f->m, ReluBitmaskOp::rowBytes(f->n)}, b.getI8Type());
  FusionOp withMask = createRegion(b, forward.getLoc(), {type, maskType}, forward.getInputs(),
                                   "gemm", map);
  for (auto [arg, input] : llvm::zip(body.getArguments(), forward.getInputs()))
    map.map(arg, map.lookup(input)); // the old body's arguments are the new body's
  OpBuilder inner = OpBuilder::atBlockEnd(&withMask.getBlock());
  for (Operation &op : body.without_terminator())
    inner.clone(op, map);
  Value y = map.lookup(relu.getResult());
  Value mask = inner.create<ReluBitmaskOp>(relu.getLoc(), maskType, y);
  inner.create<YieldOp>(forward.getLoc(), ValueRange{y, mask});
  forward.getResult(0).replaceAllUsesWith(withMask.getResult(0));
  forward->erase();
  // The gradient's region, at the where.
  b.setInsertionPoint(where);
  Location loc = FusedLoc::get(func.getContext(), {product->getLoc(), where.getLoc()});
  IRMapping bmap;
  FusionOp backward =
      createRegion(b, loc, type, ValueRange{product->getOperand(0), product->getOperand(1),
                                           withMask.getResult(1)},
                   "gemm", bmap);
  OpBuilder binner = OpBuilder::atBlockEnd(&backward.getBlock());
  Value p = binner.clone(*product, bmap)->getResult(0);
  Value dx = binner.create<ReluGradBitmaskOp>(loc, type, p, bmap.lookup(withMask.getResult(1)));
  binner.create<YieldOp>(loc, dx);
  where.getResult().replaceAllUsesWith(backward.getResult(0));
  where->erase();
  product->erase();
  if (greater->use_empty())
    greater->erase();
  return true;
}

/// GEMM epilogues (see Passes.td): a ReLU that alone reads an f32 product, a
/// residual linear layer's bias and residual, and a bias gradient
/// (reduce_sum over all but the last axis) of the tensor that a weight
/// gradient's GEMM contracts over its rows, join the product in a
/// forge.fusion "gemm". Before loop fusion, which would otherwise take the
/// ReLU and the adds into loop regions.
bool fuseGemmEpilogues(func::FuncOp func, bool auxEpilogues, bool reluAuxEpilogues) {
  SmallVector<Operation *> products;
  func.walk([&](Operation *op) {
    if (isa<GemmOp, MatMulOp>(op) && !op->getParentOfType<FusionOp>() && isStaticNonEmptyF32(op))
      products.push_back(op);
  });
  bool changed = false;
  llvm::SmallPtrSet<Operation *, 16> taken; // erased: their products are in regions
  for (Operation *product : products)
    if (fuseReluEpilogue(product) || fuseResidualEpilogue(func, product) ||
        (auxEpilogues &&
         (fuseGeluEpilogue(func, product) || fuseGeluGradEpilogue(func, product)))) {
      taken.insert(product);
      changed = true;
    }
  changed |= fuseBiasGradients(func, taken);
  // After the ReLU regions (forward) and bias gradients, which may take the
  // backward's product first (its region then already has its epilogue).
  if (reluAuxEpilogues)
    for (WhereOp where : llvm::to_vector(func.getBody().front().getOps<WhereOp>()))
      changed |= fuseReluGradEpilogue(func, where);
  return changed;
}

/// A reduce_sum of a whole static f32 tensor to a scalar.
template <typename ReduceOpT> bool isWholeReduction(Operation *op) {
  auto r = dyn_cast<ReduceOpT>(op);
  if (!r || r.getKeepdims())
    return false;
  auto in = dyn_cast<RankedTensorType>(r.getInput().getType());
  return in && in.hasStaticShape() && in.getNumElements() > 0 && in.getElementType().isF32() &&
         static_cast<int64_t>(r.getAxes().size()) == in.getRank() && in.getRank() > 0;
}
bool isWholeSum(Operation *op) { return isWholeReduction<ReduceSumOp>(op); }
/// A reduce_mean of a whole static f32 tensor to a scalar (a loss's mean).
bool isWholeMean(Operation *op) { return isWholeReduction<ReduceMeanOp>(op); }

/// mean(x) = sum(x) / n: the sum can join a multi_reduce region and the
/// division a scalar region (a loss's mean costs no launch of its own).
/// Returns the sum.
Operation *splitMean(Operation *mean) {
  auto m = cast<ReduceMeanOp>(mean);
  OpBuilder b(mean);
  auto in = cast<RankedTensorType>(m.getInput().getType());
  auto sum = b.create<ReduceSumOp>(m.getLoc(), m.getType(), m.getInput(), m.getAxesAttr(),
                                   m.getKeepdimsAttr());
  auto scalar = RankedTensorType::get({}, in.getElementType());
  auto n = b.create<ConstantOp>(
      m.getLoc(), DenseElementsAttr::get(scalar, b.getFloatAttr(in.getElementType(),
                                                                static_cast<double>(in.getNumElements()))));
  auto div = b.create<DivOp>(m.getLoc(), sum.getResult(), n.getResult());
  m.getResult().replaceAllUsesWith(div.getResult());
  mean->erase();
  return sum;
}

/// Sums (program order) of one reduction region, each with the pointwise
/// ops that compute its input in the region (program order).
using SumsWithPrologues = SmallVector<std::pair<Operation *, SmallVector<Operation *>>>;

/// Replaces the sums of `group` by one forge.fusion of `kind` reading
/// `inputs`, at the last sum's place: each sum's prologue ops are cloned into
/// the region (once when sums share them), the originals erased when no one
/// else reads them. `toMove` (outside users of earlier sums that sit before
/// the last one) moves after the region.
FusionOp outlineSums(const SumsWithPrologues &group, ArrayRef<Value> inputs, StringRef kind,
                     ArrayRef<Operation *> toMove) {
  Operation *last = group.back().first;
  SmallVector<Type> resultTypes;
  SmallVector<Location> locs;
  for (auto &[sum, prologue] : group) {
    resultTypes.push_back(sum->getResult(0).getType());
    locs.push_back(sum->getLoc());
  }
  OpBuilder b(last);
  IRMapping map;
  auto region = createRegion(b, FusedLoc::get(last->getContext(), locs), resultTypes, inputs,
                             kind, map);
  OpBuilder inner = OpBuilder::atBlockEnd(&region.getBlock());
  SmallVector<Value> yielded;
  for (auto &[sum, prologue] : group) {
    for (Operation *op : prologue)
      if (!map.contains(op->getResult(0)))
        inner.clone(*op, map);
    yielded.push_back(inner.clone(*sum, map)->getResult(0));
  }
  inner.create<YieldOp>(region.getLoc(), yielded);
  for (auto [i, member] : llvm::enumerate(group))
    member.first->getResult(0).replaceAllUsesWith(region.getResult(i));
  moveAfter(toMove, region);
  SmallVector<Operation *> dead;
  for (auto &[sum, prologue] : llvm::reverse(group)) {
    sum->erase();
    dead.append(prologue.begin(), prologue.end());
  }
  // Readers before producers; each op once.
  llvm::sort(dead, [](Operation *a, Operation *c) { return c->isBeforeInBlock(a); });
  dead.erase(std::unique(dead.begin(), dead.end()), dead.end());
  for (Operation *op : dead)
    if (op->use_empty())
      op->erase();
  return region;
}

/// Replaces the independent whole-tensor sums `group` (program order), each
/// with its prologue (a pointwise op that only it reads, or none), by one
/// forge.fusion "multi_reduce" at the last one's place. Outside users of an
/// earlier sum that sit before the last one move after the region (none of
/// them feeds a member: the caller checked).
void outlineMultiReduce(ArrayRef<std::pair<Operation *, Operation *>> group) {
  Operation *last = group.back().first;
  llvm::SmallPtrSet<Operation *, 16> members; // ops that move into the region
  for (auto [sum, pro] : group) {
    members.insert(sum);
    if (pro && pro->hasOneUse())
      members.insert(pro);
  }
  Operation *first = group.front().first;
  if (Operation *pro = group.front().second; pro && members.count(pro))
    first = pro;
  SmallVector<Operation *> toMove = usersToMove(first, last, members);
  llvm::SetVector<Value> inputs;
  SumsWithPrologues sums;
  for (auto [sum, pro] : group) {
    for (Value v : (pro ? pro : sum)->getOperands())
      inputs.insert(v);
    sums.push_back({sum, pro ? SmallVector<Operation *>{pro} : SmallVector<Operation *>{}});
  }
  outlineSums(sums, inputs.getArrayRef(), "multi_reduce", toMove);
}

/// A column sum: reduce_sum of a static f32 tensor [..., C] over every dim
/// but the last, to [C] (a batch norm's statistics and gradients, a bias
/// gradient).
bool isColumnSum(Operation *op) {
  auto r = dyn_cast<ReduceSumOp>(op);
  if (!r || r.getKeepdims())
    return false;
  auto in = dyn_cast<RankedTensorType>(r.getInput().getType());
  if (!in || !in.hasStaticShape() || in.getRank() < 2 || in.getNumElements() == 0 ||
      !in.getElementType().isF32())
    return false;
  return llvm::equal(r.getAxes(), llvm::seq<int64_t>(0, in.getRank() - 1));
}

/// Whether `op` is a poor op to recompute in a column sum's prologue when
/// the plain cone grew too large (a residual network's gradient chain, which
/// reaches back through every block's residual add): its result is written
/// to memory anyway, because a reader that no loop or reduction region takes
/// needs it (a convolution reads a ReLU's output), or because several ops
/// read it and recomputing it reads more tensors than reading it (a
/// gradient masked by a ReLU, which the residual path also reads).
bool isLeafWhenPruned(Operation *op, ArrayRef<int64_t> shape) {
  Value r = op->getResult(0);
  if (llvm::any_of(r.getUsers(),
                   [](Operation *u) { return !isLoopFusible(u) && !isa<ReduceSumOp, ReshapeOp>(u); }))
    return true;
  int64_t full = llvm::count_if(op->getOperands(), [&](Value o) {
    return cast<RankedTensorType>(o.getType()).getShape() == shape;
  });
  return !r.hasOneUse() && full >= 2;
}

/// The pointwise ops that compute a column sum's input from values that are
/// not themselves recomputed (its leaves): ops at the iteration shape whose
/// operands are at it, per column (C elements, all other dims 1) or one
/// element. At most `limit` ops; program order. Null when the input is no
/// such op or the cone is larger. Values in `stop` are leaves (the region
/// reads them anyway); with `pruned`, so are those isLeafWhenPruned says.
std::optional<SmallVector<Operation *>> columnCone(Operation *sum, int64_t limit,
                                                    bool pruned = false,
                                                    const llvm::SetVector<Value> *stop = nullptr) {
  auto shape = cast<RankedTensorType>(sum->getOperand(0).getType()).getShape();
  int64_t columns = shape.back();
  auto perColumn = [&](Value v) {
    auto t = cast<RankedTensorType>(v.getType());
    if (t.getNumElements() == 1)
      return true;
    return t.getRank() >= 1 && t.getShape().back() == columns && t.getNumElements() == columns &&
           t.getRank() <= static_cast<int64_t>(shape.size());
  };
  llvm::SetVector<Operation *> cone;
  SmallVector<Value> stack{sum->getOperand(0)};
  while (!stack.empty()) {
    Value v = stack.pop_back_val();
    Operation *def = v.getDefiningOp();
    auto t = cast<RankedTensorType>(v.getType());
    if (t.getShape() != shape)
      continue; // a per-column or scalar leaf
    if (!def || !isLoopFusible(def) || def->getBlock() != sum->getBlock())
      continue; // a leaf at the iteration shape
    if (stop && stop->contains(v))
      continue;
    if (pruned && v != sum->getOperand(0) && isLeafWhenPruned(def, shape))
      continue;
    if (cone.contains(def))
      continue;
    if (!llvm::all_of(def->getOperands(), [&](Value o) {
          return cast<RankedTensorType>(o.getType()).getShape() == shape || perColumn(o);
        }))
      continue;
    cone.insert(def);
    if (static_cast<int64_t>(cone.size()) > limit)
      return std::nullopt;
    llvm::append_range(stack, def->getOperands());
  }
  SmallVector<Operation *> ordered(cone.begin(), cone.end());
  llvm::sort(ordered, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
  return ordered;
}

/// Column sums over one iteration shape that read a common leaf (a batch
/// norm's sum of x - k and of its square; its gradient's sum of dy and of dy *
/// (x - k)) become one forge.fusion "column_reduce" at the last one's place:
/// one pass over their inputs instead of one per sum, and no pointwise
/// prologue written to memory (the region recomputes it per element; the
/// originals stay for their other readers). Before loop fusion, which would
/// take the prologues into loop regions.
bool fuseColumnReductions(func::FuncOp func) {
  constexpr int64_t kConeLimit = 12, kMaxSums = 4;
  bool changed = false;
  for (Block &block : func.getBody()) {
    CutSides sides(block);
    SmallVector<Operation *> sums;
    for (Operation &op : block)
      if (isColumnSum(&op))
        sums.push_back(&op);
    llvm::DenseSet<Operation *> done;
    for (Operation *seed : sums) {
      if (done.contains(seed))
        continue;
      // The full cone; when that is too large, the pruned one (isLeafWhenPruned).
      llvm::DenseSet<Operation *> pruned;
      auto coneOf = [&](Operation *sum) {
        if (auto cone = columnCone(sum, kConeLimit))
          return cone;
        auto cone = columnCone(sum, kConeLimit, /*pruned=*/true);
        if (cone)
          pruned.insert(sum);
        return cone;
      };
      auto seedCone = coneOf(seed);
      if (!seedCone)
        continue;
      auto leavesOf = [](Operation *sum, ArrayRef<Operation *> cone) {
        llvm::SetVector<Value> leaves;
        llvm::SmallPtrSet<Operation *, 16> in(cone.begin(), cone.end());
        for (Operation *op : cone)
          for (Value v : op->getOperands())
            if (!in.count(v.getDefiningOp()))
              leaves.insert(v);
        if (cone.empty())
          leaves.insert(sum->getOperand(0));
        return leaves;
      };
      auto shape = cast<RankedTensorType>(seed->getOperand(0).getType()).getShape();
      SumsWithPrologues group{{seed, *seedCone}};
      llvm::SetVector<Value> leaves = leavesOf(seed, *seedCone);
      for (Operation *other : sums) {
        if (other == seed || done.contains(other) || !seed->isBeforeInBlock(other) ||
            sides.apart(seed, other) || static_cast<int64_t>(group.size()) >= kMaxSums ||
            cast<RankedTensorType>(other->getOperand(0).getType()).getShape() != shape)
          continue;
        auto cone = coneOf(other);
        if (!cone)
          continue;
        llvm::SetVector<Value> mine = leavesOf(other, *cone);
        // It shares a full-size value with the group: a leaf, or a value one
        // cone computes that the other reads (a masked gradient).
        llvm::SetVector<Value> theirs = leaves, ours = mine;
        for (auto &m : group)
          for (Operation *op : m.second)
            theirs.insert(op->getResult(0));
        for (Operation *op : *cone)
          ours.insert(op->getResult(0));
        bool shares = llvm::any_of(ours, [&](Value v) {
          return cast<RankedTensorType>(v.getType()).getShape() == shape && theirs.contains(v);
        });
        if (!shares)
          continue;
        // Its leaves must not depend on an earlier member (they are the region's inputs).
        llvm::SmallPtrSet<Operation *, 8> members;
        for (auto &m : group)
          members.insert(m.first);
        SmallVector<Operation *> heads;
        for (Value v : mine)
          if (Operation *def = v.getDefiningOp())
            heads.push_back(def);
        if (!heads.empty() && readsAny(heads, members, seed))
          continue;
        group.push_back({other, *cone});
        leaves.insert(mine.begin(), mine.end());
      }
      if (group.size() < 2)
        continue;
      // A value that one member reads as a leaf the region reads anyway: no
      // member recomputes it (a masked gradient that a pruned cone reads is
      // not recomputed beside it from the mask and the incoming gradient).
      // Cones only shrink, so this ends.
      for (bool shrunk = true; shrunk;) {
        shrunk = false;
        llvm::SetVector<Value> next;
        for (auto &[sum, cone] : group) {
          auto fewer = columnCone(sum, kConeLimit, pruned.contains(sum), &leaves);
          if (fewer->size() != cone.size())
            shrunk = true;
          cone = std::move(*fewer);
          llvm::SetVector<Value> mine = leavesOf(sum, cone);
          next.insert(mine.begin(), mine.end());
        }
        if (shrunk)
          leaves.insert(next.begin(), next.end());
        else
          leaves = std::move(next);
      }
      Operation *last = group.back().first;
      llvm::SmallPtrSet<Operation *, 8> members;
      for (auto &m : group)
        members.insert(m.first);
      SmallVector<Operation *> toMove = usersToMove(seed, last, members);
      llvm::SmallPtrSet<Operation *, 16> moving(toMove.begin(), toMove.end());
      if (llvm::any_of(leaves, [&](Value v) { return moving.count(v.getDefiningOp()); }))
        continue;
      outlineSums(group, leaves.getArrayRef(), "column_reduce", toMove);
      for (auto &m : group)
        done.insert(m.first);
      changed = true;
    }
  }
  return changed;
}

/// Multi-tensor reduction (before loop fusion, which would otherwise take
/// the squares into the optimizer's regions as extra results): the
/// whole-tensor sums of a block, with a pointwise prologue that only they
/// read (g * g for the global gradient norm), become "multi_reduce" regions
/// of at most `maxOperands` operands and results, one launch for all. In a
/// training step a lone sum (the loss's, where no gradient norm is computed)
/// forms a region too: forge-merge-reductions then takes it into the
/// optimizer's kernel, where a loose sum would be a launch of its own.
bool fuseMultiReductions(func::FuncOp func, int64_t maxOperands) {
  bool changed = false;
  const size_t least = func.getSymName().starts_with("train_step") ? 1 : 2;
  for (Block &block : func.getBody()) {
    CutSides sides(block);
    SmallVector<std::pair<Operation *, Operation *>> group; // sum, prologue
    llvm::SmallPtrSet<Operation *, 16> members;
    int64_t operands = 0;
    auto flush = [&] {
      if (group.size() >= least) {
        for (auto &[op, pro] : group)
          if (isWholeMean(op))
            op = splitMean(op);
        outlineMultiReduce(group);
        changed = true;
      }
      group.clear();
      members.clear();
      operands = 0;
    };
    for (Operation &op : llvm::make_early_inc_range(block)) {
      if (!isWholeSum(&op) && !isWholeMean(&op))
        continue;
      Operation *pro = op.getOperand(0).getDefiningOp();
      auto shape = cast<RankedTensorType>(op.getOperand(0).getType()).getShape();
      // A prologue read elsewhere too (AdamW's g * g, merged by CSE with the
      // norm's) is recomputed in the region: reading g costs what reading
      // g * g would, and the optimizer's region then need not write it.
      if (!(pro && isLoopFusible(pro) && shapeOf(pro) == shape &&
            llvm::all_of(pro->getOperandTypes(), [&](Type t) {
              auto tt = cast<RankedTensorType>(t);
              return tt.getShape() == shape || tt.getNumElements() == 1;
            })))
        pro = nullptr;
      Operation *head = pro ? pro : &op;
      // A member may not depend on an earlier one (e.g. through a clipped
      // gradient, or a data-parallel all_reduce that averaged the loss with
      // the gradients): such a sum starts the next group.
      if (!group.empty() && (sides.apart(&op, group.front().first) ||
                             readsAny({head}, members, group.front().second
                                                           ? group.front().second
                                                           : group.front().first)))
        flush();
      int64_t n = static_cast<int64_t>(head->getNumOperands()) + 1;
      if (!group.empty() && operands + n > maxOperands)
        flush();
      group.push_back({&op, pro});
      members.insert(&op);
      if (pro && pro->hasOneUse())
        members.insert(pro);
      operands += n;
    }
    flush();
  }
  return changed;
}

/// View chains: transpose(reshape*(piece)) where the piece is a split's
/// result or a slice (with unit steps), each link read by the next alone,
/// becomes a view region reading the piece's source: one strided copy
/// instead of the piece's copy and the transpose's (GPT-2's q, k and v head
/// splits read the qkv projection directly; the split goes).
bool collapseViewChains(func::FuncOp func) {
  bool changed = false;
  SmallVector<TransposeOp> transposes;
  for (Block &block : func.getBody())
    for (TransposeOp t : block.getOps<TransposeOp>())
      transposes.push_back(t);
  for (TransposeOp t : transposes) {
    auto staticType = [](Value v) { return cast<RankedTensorType>(v.getType()).hasStaticShape(); };
    SmallVector<ReshapeOp> reshapes; // from the transpose up
    Value cur = t.getInput();
    while (auto r = cur.getDefiningOp<ReshapeOp>()) {
      if (!cur.hasOneUse())
        break;
      reshapes.push_back(r);
      cur = r.getInput();
    }
    if (!cur.hasOneUse() || !staticType(cur) || !staticType(t.getResult()))
      continue;
    Value source;
    SmallVector<int64_t> starts, ends;
    if (auto split = cur.getDefiningOp<SplitOp>()) {
      source = split.getInput();
      auto in = cast<RankedTensorType>(source.getType());
      int64_t axis = static_cast<int64_t>(split.getAxis()); // I64Attr reads back unsigned
      if (axis < 0)
        axis += in.getRank();
      unsigned piece = cast<OpResult>(cur).getResultNumber();
      int64_t begin = 0;
      for (unsigned i = 0; i < piece; ++i)
        begin += split.getSizes()[i];
      starts.assign(in.getRank(), 0);
      ends.assign(in.getShape().begin(), in.getShape().end());
      starts[axis] = begin;
      ends[axis] = begin + split.getSizes()[piece];
    } else if (auto slice = cur.getDefiningOp<SliceOp>()) {
      if (llvm::any_of(slice.getSteps(), [](int64_t s) { return s != 1; }))
        continue;
      source = slice.getInput();
      starts.assign(slice.getStarts().begin(), slice.getStarts().end());
      SmallVector<int64_t> shape(cast<RankedTensorType>(cur.getType()).getShape());
      for (auto [st, n] : llvm::zip(starts, shape))
        ends.push_back(st + n);
    } else {
      continue;
    }
    if (!staticType(source))
      continue;
    OpBuilder b(t);
    Location loc = t.getLoc();
    IRMapping argOf;
    auto region = createRegion(b, loc, TypeRange{t.getType()}, ValueRange{source}, "loop", argOf);
    OpBuilder inner = OpBuilder::atBlockEnd(&region.getBlock());
    Value v = argOf.lookup(source);
    SmallVector<int64_t> ones(starts.size(), 1);
    v = inner.create<SliceOp>(loc, cur.getType(), v, inner.getDenseI64ArrayAttr(starts),
                              inner.getDenseI64ArrayAttr(ends), inner.getDenseI64ArrayAttr(ones));
    for (ReshapeOp r : llvm::reverse(reshapes))
      v = inner.create<ReshapeOp>(r.getLoc(), r.getType(), v, r.getShapeAttr());
    v = inner.create<TransposeOp>(loc, t.getType(), v, t.getPermAttr());
    inner.create<YieldOp>(loc, v);
    t.replaceAllUsesWith(region.getResult(0));
    t.erase();
    for (ReshapeOp r : reshapes)
      r.erase();
    Operation *def = cur.getDefiningOp();
    if (def->use_empty())
      def->erase();
    changed = true;
  }
  return changed;
}


/// Horizontal fusion of the optimizer: the loop regions that update
/// persistent state (a result returned with forge.updates), when independent
/// of each other, become forge.fusion "horizontal" regions of at most
/// `maxOperands` operands and results each (a kernel's pointer arguments must
/// fit CUDA's 4 KiB parameter space): one launch for many parameters' updates.
bool fuseOptimizerRegions(func::FuncOp func, int64_t maxOperands) {
  Block &block = func.getBody().front();
  auto ret = dyn_cast<func::ReturnOp>(block.getTerminator());
  if (!ret)
    return false;
  auto updatesState = [&](FusionOp f) {
    for (OpOperand &use : f->getUses())
      if (use.getOwner() == ret &&
          func.getResultAttr(use.getOperandNumber(), "forge.updates"))
        return true;
    return false;
  };
  // Members are chosen from the last update back: a state update that a
  // later one reads (a batch norm's region that also updates its running
  // statistics, read by the rest of the step) stays out. In program order
  // such a region, as the first member, kept every later update out
  // (ResNet-50 had no horizontal optimizer region: 53 weight updates, 53
  // launches).
  SmallVector<FusionOp> candidates;
  for (Operation &op : block)
    if (auto f = dyn_cast<FusionOp>(op); f && f.getKind() == "loop" && updatesState(f))
      candidates.push_back(f);
  // Only on the side of the cut (CutSides) where the last update is: the
  // optimizer's (a batch norm's running statistics are updated before it).
  CutSides sides(block);
  SmallVector<Operation *> later; // members, last first
  for (FusionOp f : llvm::reverse(candidates))
    if (!readsOp(later, f) && // else a later member depends on it (e.g. a clipped norm)
        !sides.apart(f, candidates.back()))
      later.push_back(f);
  SmallVector<FusionOp> group;
  for (Operation *f : llvm::reverse(later))
    group.push_back(cast<FusionOp>(f));
  if (group.size() < 2)
    return false;
  bool changed = false;
  SmallVector<FusionOp> chunk;
  int64_t operands = 0;
  auto flush = [&] {
    if (chunk.size() > 1) {
      outlineHorizontal(chunk);
      changed = true;
    }
    chunk.clear();
    operands = 0;
  };
  for (FusionOp f : group) {
    int64_t n = f->getNumOperands() + f->getNumResults();
    if (!chunk.empty() && operands + n > maxOperands)
      flush();
    chunk.push_back(f);
    operands += n;
  }
  flush();
  return changed;
}

/// One loop region in place of `a` and the later `b` (b does not depend on
/// a): inputs of both (once each), a's body then b's, yielding a's results
/// then b's, at b's place; a's readers before b move after it.
void mergeSiblings(FusionOp a, FusionOp b) {
  llvm::SmallPtrSet<Operation *, 2> members;
  members.insert(a);
  members.insert(b);
  SmallVector<Operation *> toMove = usersToMove(a, b, members);
  llvm::SetVector<Value> inputs;
  inputs.insert(a.getInputs().begin(), a.getInputs().end());
  inputs.insert(b.getInputs().begin(), b.getInputs().end());
  SmallVector<Type> types(a.getResultTypes());
  llvm::append_range(types, b.getResultTypes());
  OpBuilder builder(b);
  IRMapping argOf;
  auto region = createRegion(builder, FusedLoc::get(b.getContext(), {a.getLoc(), b.getLoc()}),
                             types, inputs.getArrayRef(), "loop", argOf);
  OpBuilder inner = OpBuilder::atBlockEnd(&region.getBlock());
  SmallVector<Value> yielded;
  for (FusionOp f : {a, b}) {
    IRMapping map;
    for (auto [arg, v] : llvm::zip(f.getBlock().getArguments(), f.getInputs()))
      map.map(arg, argOf.lookup(v));
    for (Operation &op : f.getBlock().without_terminator())
      inner.clone(op, map);
    for (Value y : f.getBlock().getTerminator()->getOperands())
      yielded.push_back(map.lookupOrDefault(y));
  }
  inner.create<YieldOp>(region.getLoc(), yielded);
  unsigned r = 0;
  for (FusionOp f : {a, b})
    for (Value v : f.getResults())
      v.replaceAllUsesWith(region.getResult(r++));
  moveAfter(toMove, region);
  b.erase();
  a.erase();
}

/// Sibling fusion of small loop regions: two loop regions of one iteration
/// shape of at most kSmall elements that read a common input, neither
/// depending on the other, become one region at the later one's place (a
/// batch norm's backward computes its [C] coefficients for the input
/// gradient and, beside them, its parameters' update: two launches of a few
/// microseconds each for 53 batch norms in ResNet-50). Their launches cost
/// more than their bytes; large regions stay apart (their kernels are
/// bandwidth-bound either way, and merging would only move code).
bool fuseSiblingLoops(func::FuncOp func, int64_t maxOperands) {
  constexpr int64_t kSmall = 1 << 16;
  bool changed = false;
  // At most two parameters' updates (AdamW: parameter and moments, 6 state
  // results) in one merged region: more go to the optimizer's horizontal
  // regions (fuseOptimizerRegions), which give each its own blocks, where one
  // merged loop region does them in turn over a small shape (GPT-2's 15 norm
  // parameters of [768]: 6 blocks, 28 us a launch). A batch norm's scale and
  // shift updates still join its coefficients' region (ResNet-50: 14 launches).
  constexpr int64_t kMergedStateResults = 6;
  auto stateResults = [&](FusionOp f) {
    int64_t n = 0;
    for (OpOperand &use : f->getUses())
      if (isa<func::ReturnOp>(use.getOwner()) &&
          func.getResultAttr(use.getOperandNumber(), "forge.updates"))
        ++n;
    return n;
  };
  for (Block &block : func.getBody()) {
    std::optional<CutSides> sides;
    auto small = [&](FusionOp f) {
      return f.getKind() == "loop" && !f.isViewRegion() &&
             ShapedType::getNumElements(f.getIterationShape()) <= kSmall;
    };
    for (bool merged = true; merged;) {
      merged = false;
      sides.emplace(block);
      SmallVector<FusionOp> regions;
      for (auto f : block.getOps<FusionOp>())
        if (small(f))
          regions.push_back(f);
      for (auto [i, a] : llvm::enumerate(regions)) {
        llvm::SmallPtrSet<Value, 8> reads(a.getInputs().begin(), a.getInputs().end());
        for (FusionOp b : ArrayRef<FusionOp>(regions).drop_front(i + 1)) {
          if (b.getIterationShape() != a.getIterationShape() ||
              llvm::none_of(b.getInputs(), [&](Value v) { return reads.contains(v); }))
            continue;
          int64_t n = a->getNumOperands() + a->getNumResults() + b->getNumOperands() +
                      b->getNumResults();
          if (n > maxOperands || readsOp({b.getOperation()}, a) || sides->apart(a, b) ||
              stateResults(a) + stateResults(b) > kMergedStateResults)
            continue;
          mergeSiblings(a, b);
          merged = changed = true;
          break;
        }
        if (merged)
          break;
      }
    }
  }
  return changed;
}

/// A one-element constant that the function returns (a fixed learning rate
/// as a metric) needs a buffer of its own, which forge-plan-memory would fill
/// with a copy, a launch of its own; written by a loop region instead (at the
/// constant, so no reader of a scalar region sits between them), it joins the
/// step's scalar horizontal region (fuseScalarRegions) and costs nothing.
bool materializeReturnedScalars(func::FuncOp func) {
  auto ret = cast<func::ReturnOp>(func.getBody().front().getTerminator());
  bool changed = false;
  for (OpOperand &use : ret->getOpOperands()) {
    auto constant = use.get().getDefiningOp<ConstantOp>();
    auto type = dyn_cast<RankedTensorType>(use.get().getType());
    if (!constant || !type || !type.hasStaticShape() || type.getNumElements() != 1 ||
        !isa<FloatType>(type.getElementType()))
      continue;
    // Constants stay outside regions (their arguments): the body yields it.
    OpBuilder b(constant->getBlock(), std::next(Block::iterator(constant)));
    IRMapping map;
    FusionOp region =
        createRegion(b, constant.getLoc(), type, ValueRange{constant.getResult()}, "loop", map);
    OpBuilder inner = OpBuilder::atBlockEnd(&region.getBlock());
    inner.create<YieldOp>(constant.getLoc(), map.lookup(constant.getResult()));
    use.set(region.getResult(0));
    changed = true;
  }
  return changed;
}

/// Scalar regions side by side: loop regions whose results have one element
/// (a clipped gradient norm's scale, a learning-rate schedule) and that do not
/// read each other become one horizontal region, one launch instead of one
/// each (a launch is all such a region costs). Only when nothing between the
/// first and the last reads an earlier one: the group then takes the last
/// one's place without moving any other op.
bool fuseScalarRegions(func::FuncOp func) {
  Block &block = func.getBody().front();
  auto oneElement = [](Type t) {
    auto r = cast<RankedTensorType>(t);
    return r.hasStaticShape() && r.getNumElements() == 1;
  };
  // Loop regions, and lone pointwise ops (a loss's mean: sum / n), of one element.
  auto scalar = [&](Operation &op) {
    if (auto f = dyn_cast<FusionOp>(op))
      return f.getKind() == "loop" && !f.isViewRegion() &&
             llvm::all_of(f.getResultTypes(), oneElement);
    return isLoopFusible(&op) && oneElement(op.getResult(0).getType());
  };
  SmallVector<Operation *> group;
  llvm::SmallPtrSet<Operation *, 8> members;
  CutSides sides(block);
  for (Operation &op : block) {
    if (!scalar(op) ||
        (!group.empty() && (sides.apart(&op, group.front()) ||
                            readsAny({&op}, members, group.front()))))
      continue;
    group.push_back(&op);
    members.insert(&op);
  }
  if (group.size() < 2 || !usersToMove(group.front(), group.back(), members).empty())
    return false;
  // A lone op becomes a loop region of its own first (at its place).
  SmallVector<FusionOp> regions;
  for (Operation *op : group) {
    if (auto f = dyn_cast<FusionOp>(op)) {
      regions.push_back(f);
      continue;
    }
    FusionOp region = cloneIntoLoopRegion(op);
    op->replaceAllUsesWith(region->getResults());
    op->erase();
    regions.push_back(region);
  }
  outlineHorizontal(regions);
  return true;
}

} // namespace

void mlir::forge::outlineHorizontal(ArrayRef<FusionOp> group) {
  llvm::SmallPtrSet<Operation *, 16> members;
  for (FusionOp f : group)
    members.insert(f);
  FusionOp last = group.back();
  // Outside users of earlier members sitting before the last member move
  // after the new region, with what uses them (none feeds a member).
  SmallVector<Operation *> toMove = usersToMove(group.front(), last, members);
  SmallVector<Value> inputs;
  SmallVector<Type> resultTypes;
  SmallVector<Location> locs;
  for (FusionOp f : group) {
    llvm::append_range(inputs, f.getInputs());
    llvm::append_range(resultTypes, f.getResultTypes());
    locs.push_back(f.getLoc());
  }
  OpBuilder b(last);
  MLIRContext *ctx = last.getContext();
  IRMapping unused; // inputs repeat (each member's in turn): members map their own
  auto horizontal = createRegion(b, FusedLoc::get(ctx, locs), resultTypes, inputs, "horizontal",
                                 unused);
  Block *body = &horizontal.getBlock();
  OpBuilder inner = OpBuilder::atBlockEnd(body);
  SmallVector<Value> yielded;
  unsigned next = 0;
  for (FusionOp f : group) {
    IRMapping map; // per member: a value two members share maps to each one's own argument
    for (Value v : f.getInputs())
      map.map(v, body->getArgument(next++));
    Operation *clone = inner.clone(*f, map);
    llvm::append_range(yielded, clone->getResults());
  }
  inner.create<YieldOp>(horizontal.getLoc(), yielded);
  unsigned r = 0;
  for (FusionOp f : group)
    for (Value v : f.getResults())
      v.replaceAllUsesWith(horizontal.getResult(r++));
  moveAfter(toMove, horizontal);
  for (FusionOp f : llvm::reverse(group))
    f.erase();
}

namespace {

/// The loss of a classifier, nll_loss(log_softmax(x, axis 1), t) over [N, C]
/// logits, and its gradient log_softmax_grad(y, nll_loss_grad(g, t)) become
/// cross_entropy (the loss and each row's log-sum-exp) and cross_entropy_grad:
/// the [N, C] log-softmax and the one-hot gradient are never materialized.
struct FuseCrossEntropy : public OpRewritePattern<NllLossOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(NllLossOp loss, PatternRewriter &rewriter) const override {
    auto logSoftmax = loss.getInput().getDefiningOp<LogSoftmaxOp>();
    if (!logSoftmax)
      return rewriter.notifyMatchFailure(loss, "the input is not a log_softmax");
    auto logits = cast<RankedTensorType>(logSoftmax.getInput().getType());
    if (logits.getRank() != 2 || logSoftmax.getAxis() != 1)
      return rewriter.notifyMatchFailure(loss, "not a log_softmax over dim 1 of [N, C] logits");
    if (loss.getWeight() || loss.getIgnoreIndex())
      return rewriter.notifyMatchFailure(loss, "class weights or an ignore_index");
    Value target = loss.getTarget();
    if (Operation *def = target.getDefiningOp(); def && !def->isBeforeInBlock(logSoftmax))
      return rewriter.notifyMatchFailure(loss, "the target is defined after the log_softmax");
    // Every other user of the log-softmax is this loss's gradient.
    SmallVector<std::pair<LogSoftmaxGradOp, NllLossGradOp>> grads;
    for (Operation *user : logSoftmax->getUsers()) {
      if (user == loss)
        continue;
      auto grad = dyn_cast<LogSoftmaxGradOp>(user);
      auto nllGrad = grad ? grad->getOperand(1).getDefiningOp<NllLossGradOp>() : nullptr;
      if (!grad || grad->getOperand(0) != logSoftmax.getResult() || grad.getAxis() != 1 ||
          !nllGrad || nllGrad.getTarget() != target || nllGrad.getWeight() ||
          nllGrad.getIgnoreIndex() || nllGrad.getReduction() != loss.getReduction())
        return rewriter.notifyMatchFailure(
            loss, "the log_softmax has a user other than the loss and its gradient");
      grads.push_back({grad, nllGrad});
    }
    rewriter.setInsertionPoint(logSoftmax);
    auto fused = rewriter.create<CrossEntropyOp>(loss.getLoc(), logSoftmax.getInput(), target,
                                                 /*classes=*/IntegerAttr());
    for (auto [grad, nllGrad] : grads) {
      rewriter.setInsertionPoint(grad);
      auto d = rewriter.create<CrossEntropyGradOp>(grad.getLoc(), logSoftmax.getInput(),
                                                   fused.getLse(), target,
                                                   nllGrad.getGradOutput(),
                                                   loss.getReductionAttr(),
                                                   /*classes=*/IntegerAttr());
      rewriter.replaceOp(grad, d.getResult());
      if (nllGrad->use_empty())
        rewriter.eraseOp(nllGrad);
    }
    // The per-row losses reduced as nll_loss did (no weights: the mean
    // divides by N).
    Value reduced = fused.getLoss();
    StringRef reduction = loss.getReduction();
    if (reduction == "mean" || reduction == "sum") {
      rewriter.setInsertionPoint(loss);
      auto axes = rewriter.getDenseI64ArrayAttr({0});
      auto keep = rewriter.getBoolAttr(false);
      if (reduction == "mean")
        reduced = rewriter.create<ReduceMeanOp>(loss.getLoc(), loss.getType(), fused.getLoss(),
                                                axes, keep);
      else
        reduced = rewriter.create<ReduceSumOp>(loss.getLoc(), loss.getType(), fused.getLoss(),
                                               axes, keep);
    }
    rewriter.replaceOp(loss, reduced);
    rewriter.eraseOp(logSoftmax);
    return success();
  }
};

/// The tensor `v` is the leading columns of: v = reshape*(slice(p)) with the
/// slice taking a prefix of the last dim and the reshapes keeping it. Returns
/// p reshaped to v's shape with p's last dim (built at `b`), or null.
Value paddedSource(OpBuilder &b, Value v) {
  Value cur = v;
  while (auto reshape = cur.getDefiningOp<ReshapeOp>()) {
    auto in = cast<RankedTensorType>(reshape.getInput().getType());
    if (in.getRank() == 0 ||
        in.getShape().back() != cast<RankedTensorType>(cur.getType()).getShape().back())
      return nullptr;
    cur = reshape.getInput();
  }
  auto slice = cur.getDefiningOp<SliceOp>();
  if (!slice)
    return nullptr;
  auto in = cast<RankedTensorType>(slice.getInput().getType());
  auto out = cast<RankedTensorType>(slice.getType());
  int64_t rank = in.getRank();
  for (int64_t d = 0; d < rank; ++d)
    if (slice.getStarts()[d] != 0 || slice.getSteps()[d] != 1 ||
        (d < rank - 1 && out.getDimSize(d) != in.getDimSize(d)))
      return nullptr;
  if (out.getShape().back() >= in.getShape().back())
    return nullptr;
  SmallVector<int64_t> shape(cast<RankedTensorType>(v.getType()).getShape());
  shape.back() = in.getShape().back();
  if (ArrayRef<int64_t>(shape) == in.getShape())
    return slice.getInput();
  return b.create<ReshapeOp>(v.getLoc(), RankedTensorType::get(shape, in.getElementType()),
                             slice.getInput(), b.getDenseI64ArrayAttr(shape));
}

/// Logits padded for an aligned GEMM (forge-pad-contractions slices its
/// result back): cross_entropy and its gradient read the padded rows
/// themselves (`classes` = the real columns), so the [N, C] logits are never
/// copied out of the padded product, and the gradient comes out padded with
/// exact zeros, which is what the padded backward GEMMs read: a pad of it
/// back to the padded width becomes the gradient itself.
struct AbsorbLogitPadding : public OpRewritePattern<CrossEntropyOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(CrossEntropyOp ce, PatternRewriter &rewriter) const override {
    if (ce.getClasses())
      return rewriter.notifyMatchFailure(ce, "reads padded logits already");
    Value logits = ce.getLogits();
    int64_t classes = cast<RankedTensorType>(logits.getType()).getShape().back();
    rewriter.setInsertionPoint(ce);
    Value padded = paddedSource(rewriter, logits);
    if (!padded)
      return rewriter.notifyMatchFailure(ce, "the logits are not the leading columns of a "
                                             "padded tensor");
    auto wide = cast<RankedTensorType>(padded.getType());
    auto fused = rewriter.create<CrossEntropyOp>(ce.getLoc(), ce->getResultTypes(), padded,
                                                 ce.getTarget(),
                                                 rewriter.getI64IntegerAttr(classes));
    for (Operation *user : llvm::to_vector(logits.getUsers())) {
      auto grad = dyn_cast<CrossEntropyGradOp>(user);
      if (!grad || grad.getLogits() != logits || grad.getLse() != ce.getLse() ||
          grad.getTarget() != ce.getTarget() || grad.getClasses())
        continue;
      rewriter.setInsertionPoint(grad);
      auto d = rewriter.create<CrossEntropyGradOp>(
          grad.getLoc(), wide, padded, fused.getLse(), grad.getTarget(), grad.getGradOutput(),
          grad.getReductionAttr(), rewriter.getI64IntegerAttr(classes));
      Value narrow = createLeadingSlice(rewriter, grad.getLoc(), d.getResult(),
                                        cast<RankedTensorType>(grad.getType()).getShape());
      rewriter.replaceOp(grad, narrow);
      // pad(reshape*(narrow)) back to the padded width with zeros: the padded
      // gradient itself.
      SmallVector<Value> worklist{narrow};
      SmallVector<Operation *> views{narrow.getDefiningOp()}; // erased below if unused
      while (!worklist.empty()) {
        Value v = worklist.pop_back_val();
        for (Operation *u : llvm::to_vector(v.getUsers())) {
          if (auto reshape = dyn_cast<ReshapeOp>(u)) {
            if (cast<RankedTensorType>(reshape.getType()).getShape().back() == classes) {
              worklist.push_back(reshape.getResult());
              views.push_back(reshape);
            }
            continue;
          }
          auto pad = dyn_cast<PadOp>(u);
          auto padType = pad ? cast<RankedTensorType>(pad.getType()) : nullptr;
          if (!pad || pad.getMode() != "constant" || pad.getValue().convertToDouble() != 0.0 ||
              padType.getShape().back() != wide.getShape().back())
            continue;
          ArrayRef<int64_t> pads = pad.getPads();
          int64_t rank = padType.getRank();
          bool tailOnly = true;
          for (int64_t i = 0; i < 2 * rank; ++i)
            tailOnly &= pads[i] == 0 || i == 2 * rank - 1;
          if (!tailOnly)
            continue;
          rewriter.setInsertionPoint(pad);
          Value same = d.getResult();
          if (padType != wide)
            same = rewriter.create<ReshapeOp>(pad.getLoc(), padType, same,
                                              rewriter.getDenseI64ArrayAttr(padType.getShape()));
          rewriter.replaceOp(pad, same);
        }
      }
      for (Operation *view : llvm::reverse(views))
        if (view->use_empty())
          rewriter.eraseOp(view);
    }
    rewriter.replaceOp(ce, fused->getResults());
    // The narrow logits (reshapes of the slice) when nothing else reads them.
    for (Operation *op = logits.getDefiningOp();
         op && isa<ReshapeOp, SliceOp>(op) && op->use_empty();) {
      Operation *next = op->getOperand(0).getDefiningOp();
      rewriter.eraseOp(op);
      op = next;
    }
    return success();
  }
};

struct FusePass : public mlir::forge::impl::FuseBase<FusePass> {
  using FuseBase::FuseBase;
  void runOnOperation() override {
    bool changed = false;
    // Row fusion of the loss first: its ops are then no longer candidates.
    RewritePatternSet patterns(&getContext());
    patterns.add<FuseCrossEntropy>(&getContext());
    FrozenRewritePatternSet frozen(std::move(patterns));
    SmallVector<Operation *> losses;
    getOperation().walk([&](NllLossOp op) { losses.push_back(op); });
    GreedyRewriteConfig config;
    config.strictMode = GreedyRewriteStrictness::ExistingOps;
    bool rewritten = false;
    if (!losses.empty() && failed(applyOpPatternsAndFold(losses, frozen, config, &rewritten)))
      return signalPassFailure();
    changed |= rewritten;
    // Then the losses over padded logits read the padding in place.
    SmallVector<Operation *> entropies;
    getOperation().walk([&](CrossEntropyOp op) { entropies.push_back(op); });
    RewritePatternSet padding(&getContext());
    padding.add<AbsorbLogitPadding>(&getContext());
    FrozenRewritePatternSet frozenPadding(std::move(padding));
    rewritten = false;
    if (!entropies.empty() &&
        failed(applyOpPatternsAndFold(entropies, frozenPadding, config, &rewritten)))
      return signalPassFailure();
    changed |= rewritten;
    // GEMM epilogues before loop fusion, which would take their ReLUs, and
    // before the multi-reductions (a bias gradient is no whole-tensor sum).
    if (gemmEpilogues)
      for (auto func : getOperation().getOps<func::FuncOp>())
        changed |= fuseGemmEpilogues(func, auxEpilogues, reluAuxEpilogues);
    // Column sums side by side before the multi-reductions and loop fusion,
    // which would take their prologues.
    for (auto func : getOperation().getOps<func::FuncOp>())
      changed |= fuseColumnReductions(func);
    for (auto func : getOperation().getOps<func::FuncOp>())
      changed |= fuseMultiReductions(func, maxHorizontalOperands);
    for (auto func : getOperation().getOps<func::FuncOp>())
      for (Block &block : func.getBody()) {
        LoopGrouper grouper(block);
        grouper.run(block);
        for (const SmallVector<Operation *> &group : grouper.groups())
          changed |= outline(group);
      }
    // Rematerialization between loop regions: before the horizontal grouping,
    // which freezes the optimizer's regions.
    if (rematerialize)
      for (auto func : getOperation().getOps<func::FuncOp>())
        changed |= rematerializeRegions(func);
    // Row fusion takes loop regions as prologues and epilogues: after they
    // formed and after rematerialization changed which inputs they read.
    if (fuseRows)
      for (auto func : getOperation().getOps<func::FuncOp>())
        changed |= fuseRowRegions(func);
    // Batch-norm epilogues, like row regions, take formed loop regions.
    if (fuseNorms)
      for (auto func : getOperation().getOps<func::FuncOp>())
        changed |= fuseBatchNorms(func);
    // View chains after the regions that take loop regions as stages (a view
    // region is no pointwise stage).
    for (auto func : getOperation().getOps<func::FuncOp>())
      changed |= collapseViewChains(func);
    // Small sibling loop regions as one (after rematerialization and the
    // regions that take loop regions as stages, which want them apart; before
    // the optimizer's horizontal regions, which would freeze them).
    for (auto func : getOperation().getOps<func::FuncOp>())
      changed |= fuseSiblingLoops(func, maxHorizontalOperands);
    // Then the optimizer's regions side by side (needs the loop regions), and
    // the scalar regions that feed it (after it: state-updating scalars, such
    // as a step counter, join the optimizer's region first).
    for (auto func : getOperation().getOps<func::FuncOp>())
      changed |= fuseOptimizerRegions(func, maxHorizontalOperands);
    // A returned scalar constant becomes a scalar region first, so that it joins them.
    for (auto func : getOperation().getOps<func::FuncOp>()) {
      changed |= materializeReturnedScalars(func);
      changed |= fuseScalarRegions(func);
    }
    if (!changed)
      markAllAnalysesPreserved();
  }
};

} // namespace

FusionOp mlir::forge::cloneIntoLoopRegion(Operation *op) {
  OpBuilder b(op);
  IRMapping map;
  llvm::SetVector<Value> inputs(op->getOperands().begin(), op->getOperands().end());
  FusionOp region =
      createRegion(b, op->getLoc(), op->getResultTypes(), inputs.getArrayRef(), "loop", map);
  OpBuilder inner = OpBuilder::atBlockEnd(&region.getBlock());
  Operation *clone = inner.clone(*op, map);
  inner.create<YieldOp>(op->getLoc(), clone->getResults());
  return region;
}
