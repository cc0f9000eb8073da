//===- MergeReductions.cpp - sums ride in the kernel of their scalar readers -===//
//
// A multi_reduce region (the loss's sum and the gradients' squared norms)
// costs a launch of its own, and its readers are often scalars that
// forge-merge-scalar-regions put late into the optimizer's horizontal
// region (the loss's mean, the gradient norm's square root: metrics). When
// those one-element loop members of one later horizontal region are all
// that read the sums, the multi_reduce region joins that region as its first
// member and the readers read the sums inside it. The kernel (Codegen
// Pointwise.cpp, horizontalFusionKernel) gives each sum its blocks beside the
// updates' and evaluates the readers in the block that completes the last
// sum: blocks count their arrival with an integer atomic in the bits of one
// f32 result of the readers, zeroed with the sums before the launch and
// overwritten by its final value.
//
// Invariants: values are unchanged (the sums are the same reductions, read
// once complete); nothing moves but the region (its inputs dominate the
// host, which comes later in the block); the host's members keep their
// order after the new first member. Not merged: a sum read by anything else
// (a clip scale the updates read, an all-reduce of --dp), readers without an
// f32 result, a host that would pass `max-horizontal-operands`.
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "mlir/IR/IRMapping.h"

namespace mlir::forge {
#define GEN_PASS_DEF_MERGEREDUCTIONS
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

bool oneElement(Type t) {
  auto r = dyn_cast<RankedTensorType>(t);
  return r && r.hasStaticShape() && r.getNumElements() == 1;
}

struct MergeReductionsPass : public mlir::forge::impl::MergeReductionsBase<MergeReductionsPass> {
  using MergeReductionsBase::MergeReductionsBase;

  void runOnOperation() override {
    bool changed = false;
    SmallVector<FusionOp> reduces; // collected first: a merge erases its host
    getOperation().walk([&](FusionOp f) {
      if (f.getKind() == "multi_reduce" && isa<func::FuncOp>(f->getParentOp()))
        reduces.push_back(f);
    });
    for (FusionOp reduce : reduces)
      changed |= merge(reduce);
    if (!changed)
      markAllAnalysesPreserved();
  }

  /// The horizontal region whose scalar loop members alone read every sum of
  /// `reduce`, or null.
  FusionOp hostOf(FusionOp reduce) {
    FusionOp host;
    for (Value sum : reduce.getResults())
      for (Operation *user : sum.getUsers()) {
        auto h = dyn_cast<FusionOp>(user);
        if (!h || h.getKind() != "horizontal" || (host && h != host) ||
            h->getBlock() != reduce->getBlock())
          return nullptr;
        host = h;
      }
    if (!host)
      return nullptr;
    Block &body = host.getBlock();
    bool counter = false; // an f32 result of a reader: the arrival count's bits
    for (Operation &op : body.without_terminator()) {
      auto member = dyn_cast<FusionOp>(op);
      if (!member || member.getKind() != "loop")
        return nullptr; // members of other kinds: merged already
      bool readsSum = llvm::any_of(member.getInputs(), [&](Value v) {
        auto arg = dyn_cast<BlockArgument>(v);
        return arg && arg.getOwner() == &body &&
               host.getInputs()[arg.getArgNumber()].getDefiningOp() == reduce;
      });
      if (!readsSum)
        continue;
      if (!llvm::all_of(member->getResultTypes(), oneElement))
        return nullptr; // a sum a kernel-wide member reads: it must be complete first
      counter |= llvm::any_of(member->getResultTypes(), [](Type t) {
        return cast<RankedTensorType>(t).getElementType().isF32();
      });
    }
    return counter ? host : nullptr;
  }

  bool merge(FusionOp reduce) {
    FusionOp host = hostOf(reduce);
    if (!host)
      return false;
    SmallVector<Value> inputs(reduce.getInputs());
    SmallVector<bool> fromSum;
    for (Value v : host.getInputs()) {
      fromSum.push_back(v.getDefiningOp() == reduce);
      if (!fromSum.back())
        inputs.push_back(v);
    }
    SmallVector<Type> types(reduce->getResultTypes());
    llvm::append_range(types, host->getResultTypes());
    if (static_cast<int64_t>(inputs.size() + types.size()) > maxHorizontalOperands)
      return false;

    OpBuilder b(host);
    auto merged = b.create<FusionOp>(host.getLoc(), types, inputs, b.getStringAttr("horizontal"));
    for (NamedAttribute a : host->getDiscardableAttrs())
      merged->setAttr(a.getName(), a.getValue());
    Block *body = new Block();
    merged.getBody().push_back(body);
    OpBuilder inner = OpBuilder::atBlockEnd(body);
    // The reductions first, reading block arguments of their own (an input
    // may repeat: set by position, not through a map).
    Operation *sums = inner.clone(*reduce);
    SmallVector<Value> own;
    for (Value v : reduce.getInputs())
      own.push_back(body->addArgument(v.getType(), v.getLoc()));
    sums->setOperands(own);
    // Then the host's members: a sum read by position of its result.
    Block &old = host.getBlock();
    IRMapping map;
    for (auto [i, arg] : llvm::enumerate(old.getArguments())) {
      Value outside = host.getInputs()[i];
      if (fromSum[i])
        map.map(arg, sums->getResult(cast<OpResult>(outside).getResultNumber()));
      else
        map.map(arg, body->addArgument(arg.getType(), arg.getLoc()));
    }
    SmallVector<Value> yielded(sums->getResults());
    for (Operation &op : old.without_terminator())
      inner.clone(op, map);
    for (Value v : old.getTerminator()->getOperands())
      yielded.push_back(map.lookup(v));
    inner.create<YieldOp>(host.getLoc(), yielded);

    unsigned first = reduce->getNumResults();
    for (auto [i, r] : llvm::enumerate(host->getResults()))
      r.replaceAllUsesWith(merged.getResult(first + i));
    host->erase();
    for (auto [i, r] : llvm::enumerate(reduce->getResults()))
      r.replaceAllUsesWith(merged.getResult(i)); // no users left but the old host
    reduce->erase();
    return true;
  }
};

} // namespace
