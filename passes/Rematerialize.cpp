//===- Rematerialize.cpp - recompute activations in the backward pass ------===//
//
// The train step keeps every forward value that a backward op reads until
// that read. Some are large and cheap to make again from values the backward
// pass keeps anyway: an unfused attention's probabilities softmax(Q K^T *
// scale + mask), [B, H, T, T] per layer (GPT-2 B16 T1024 f32: 768 MiB per
// layer, 9 GiB of its 19 GiB arena), from Q and K, which the backward pass
// reads for dK and dQ. This pass clones such a value's producers (its cone)
// right before its first backward reader and gives every backward reader the
// clone, so that the forward value dies with its last forward reader
// (Megatron-LM's "selective activation recomputation").
//
// Forward and backward: the forward ops are those the loss (the result named
// "loss") depends on; a forward value's readers outside that set are its
// backward readers (gradient ops, and with micro-batches a later micro-batch's
// backward), wherever they are in the block.
//
// Invariants: every value is computed by the same ops from the same inputs
// (results are bit-identical); a cone's leaves are block arguments,
// constants, or values that some reader at or after the insertion point keeps
// live anyway, so no leaf lives longer; cones hold only pure ops of the
// elementwise, shape and reduction classes and at most one library op (the
// scores' matmul), never an opaque one (random masks, gathers of state). A
// value that the routine returns is kept. Before forge-fuse (the recomputed
// chain fuses into a row region as in the forward) and after the last CSE
// (which would merge the clone back into the original).
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/Support/FormatVariadic.h"

namespace mlir::forge {
#define GEN_PASS_DEF_REMATERIALIZE
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

/// The largest cone recomputed for one value (GPT-2's attention: matmul,
/// mul, where, softmax).
constexpr size_t kMaxConeOps = 12;

uint64_t bytesOf(Value v) {
  auto type = dyn_cast<RankedTensorType>(v.getType());
  if (!type || !type.hasStaticShape())
    return 0;
  return static_cast<uint64_t>(type.getNumElements()) *
         std::max<uint64_t>(1, type.getElementTypeBitWidth() / 8);
}

struct RematerializePass : public mlir::forge::impl::RematerializeBase<RematerializePass> {
  using RematerializeBase::RematerializeBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (recompute != "none" && recompute != "attention") {
      func.emitError() << "forge-rematerialize: unknown recompute policy '" << recompute
                       << "' (none | attention)";
      return signalPassFailure();
    }
    if (recompute == "none" || !func.getBody().hasOneBlock())
      return;
    Block &block = func.getBody().front();
    auto ret = dyn_cast<func::ReturnOp>(block.getTerminator());
    // A train step updates state (results marked forge.updates); @eval and
    // forward routines keep nothing for a backward pass.
    Value loss;
    bool updates = false;
    for (unsigned i = 0; ret && i < func.getNumResults(); ++i) {
      if (auto name = func.getResultAttrOfType<StringAttr>(i, "forge.name");
          name && name.getValue() == "loss")
        loss = ret.getOperand(i);
      updates |= static_cast<bool>(func.getResultAttr(i, "forge.updates"));
    }
    if (!loss || !updates)
      return;

    // The forward ops: those the loss depends on.
    llvm::DenseSet<Operation *> forward;
    SmallVector<Operation *> worklist;
    if (Operation *def = loss.getDefiningOp())
      worklist.push_back(def);
    while (!worklist.empty()) {
      Operation *op = worklist.pop_back_val();
      if (op->getBlock() != &block || !forward.insert(op).second)
        continue;
      for (Value operand : op->getOperands())
        if (Operation *def = operand.getDefiningOp())
          worklist.push_back(def);
    }
    llvm::DenseMap<Operation *, int64_t> position;
    int64_t n = 0;
    for (Operation &op : block)
      position[&op] = n++;

    int64_t recomputed = 0, clonedOps = 0;
    uint64_t freed = 0;
    SmallVector<Operation *> candidates;
    for (Operation &op : block)
      if (isa<SoftmaxOp>(op) && forward.contains(&op))
        candidates.push_back(&op);
    for (Operation *op : candidates) {
      Value value = op->getResult(0);
      // Its backward readers, and the first of them: where the clone goes.
      SmallVector<OpOperand *> late;
      Operation *first = nullptr;
      bool returned = false;
      for (OpOperand &use : value.getUses()) {
        Operation *user = use.getOwner();
        if (user == ret) {
          returned = true;
          break;
        }
        if (user->getBlock() != &block || forward.contains(user))
          continue;
        late.push_back(&use);
        if (!first || position[user] < position[first])
          first = user;
      }
      if (returned || late.empty())
        continue;
      // A leaf is live at `first` anyway: a block argument, a constant, or a
      // value read at or after `first`.
      auto liveAtFirst = [&](Value v) {
        Operation *def = v.getDefiningOp();
        if (!def || isa<ConstantOp>(def))
          return true;
        for (Operation *user : v.getUsers())
          if (user->getBlock() == &block && position[user] >= position[first])
            return true;
        return false;
      };
      llvm::SetVector<Operation *> cone;
      bool ok = true;
      int64_t libraryOps = 0;
      SmallVector<Operation *> pending{op};
      while (ok && !pending.empty()) {
        Operation *c = pending.pop_back_val();
        if (cone.contains(c))
          continue;
        auto iface = dyn_cast<ForgeOpInterface>(c);
        if (!iface || !isMemoryEffectFree(c) || c->getNumRegions() != 0 ||
            iface.getFusionClass() == FusionClass::Opaque || cone.size() == kMaxConeOps) {
          ok = false;
          break;
        }
        if (iface.getFusionClass() == FusionClass::Library && ++libraryOps > 1) {
          ok = false;
          break;
        }
        cone.insert(c);
        for (Value operand : c->getOperands())
          if (!liveAtFirst(operand))
            pending.push_back(operand.getDefiningOp());
      }
      // The attention policy: probabilities of scores that a matmul makes.
      if (!ok || libraryOps != 1)
        continue;
      SmallVector<Operation *> ordered(cone.begin(), cone.end());
      llvm::sort(ordered, [&](Operation *a, Operation *b) { return position[a] < position[b]; });
      OpBuilder builder(first);
      IRMapping map;
      for (Operation *c : ordered)
        builder.clone(*c, map);
      // Positions again (the clones sit before `first`): a later candidate's
      // first reader may be one of them.
      n = 0;
      for (Operation &o : block)
        position[&o] = n++;
      Value clone = map.lookup(value);
      for (OpOperand *use : late)
        use->set(clone);
      ++recomputed;
      clonedOps += static_cast<int64_t>(ordered.size());
      freed += bytesOf(value);
    }
    if (recomputed == 0) {
      emitRemark(func.getLoc())
          << "forge-rematerialize: nothing to recompute for --recompute " << recompute
          << " (no unfused attention keeps its probabilities for the backward pass; a fused "
             "attention recomputes them itself)";
      return;
    }
    emitRemark(func.getLoc()) << llvm::formatv(
        "forge-rematerialize: {0} attention probabilit{1} recomputed in the backward pass "
        "({2} ops cloned); {3} of forward values no longer kept until their backward reader",
        recomputed, recomputed == 1 ? "y" : "ies", clonedOps, formatBytes(freed));
  }
};

} // namespace
