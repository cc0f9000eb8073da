//===- FuseLineReductions.cpp - a reduction over a middle axis with its reader -===//
//
// forge-fuse-line-reductions: a reduce_sum or reduce_mean of x over one axis
// that is not the innermost ([P, D, Q] around it, Q > 1), kept as [P, 1, Q],
// whose only reader is a loop region that reads x too (x minus its mean over
// the keys: attention's dk centring, LibraryGradients.cpp), ran as two
// kernels: the reduction (its partial sums added atomically into a zeroed
// output), then the loop reading x a second time from memory. GPT-2 bf16:
// 0.23 + 0.19 ms a step for 25 MB a layer. They become one forge.fusion
// "lines" region: x's only input, the reduction first in its body, then the
// loop's body reading the reduction's value; its kernel (Reduction.cpp,
// linesKernel) sums each line of D elements and then writes the body's
// values from the same block, so x comes from memory once and the reduced
// tensor is never stored.
//
// Invariants: every value is the one the two ops computed (the reduction
// accumulates in f32 as the reduce kernel, the body is the loop's own); only
// where the kernel exists for the shape (Q a multiple of 32: whole warps of
// adjacent columns) and only for a loop whose inputs are exactly x and the
// reduction and whose result is at x's shape. After precision (whose stored
// types it keeps) and the loss head's stages; before partition and placement
// (forge-fold-attention-views lets such a region write a concat's piece).
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "mlir/IR/IRMapping.h"

namespace mlir::forge {
#define GEN_PASS_DEF_FUSELINEREDUCTIONS
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

RankedTensorType tensorOf(Value v) { return dyn_cast<RankedTensorType>(v.getType()); }

/// The float types the lines kernel loads and stores.
bool isKernelFloat(Type t) { return t.isF32() || t.isBF16() || t.isF16(); }

bool isPointwise(Operation *op) {
  auto iface = dyn_cast<ForgeOpInterface>(op);
  return iface && iface.getFusionClass() == FusionClass::Elementwise;
}

/// Whether `reduce` is a keepdims reduce_sum / reduce_mean of x over one
/// non-innermost axis to f32, read once, whose lines the kernel takes.
bool isLineReduction(Operation *reduce) {
  if (!isa<ReduceSumOp, ReduceMeanOp>(reduce) || !reduce->getResult(0).hasOneUse())
    return false;
  auto in = tensorOf(reduce->getOperand(0)), out = tensorOf(reduce->getResult(0));
  auto axes = reduce->getAttrOfType<DenseI64ArrayAttr>("axes");
  auto keep = reduce->getAttrOfType<BoolAttr>("keepdims");
  if (!in || !in.hasStaticShape() || !out || !axes || axes.size() != 1 || !keep ||
      !keep.getValue() || !out.getElementType().isF32())
    return false;
  if (!isKernelFloat(in.getElementType()))
    return false;
  int64_t axis = axes[0] < 0 ? axes[0] + in.getRank() : axes[0];
  if (axis < 0 || axis >= in.getRank() || in.getDimSize(axis) < 2)
    return false;
  int64_t q = 1;
  for (int64_t d = axis + 1; d < in.getRank(); ++d)
    q *= in.getDimSize(d);
  return q % 32 == 0; // the kernel's warps take 32 adjacent columns (and Q > 1)
}

/// Whether `op` reads exactly x and r (x among them), makes one result at x's
/// shape in a float type the kernel stores, and sits in `block`. (Checked before a lone
/// op is wrapped too: every op wrapped is then fused.)
bool readsLine(Operation *op, Value x, Value r, Block *block) {
  return op->getBlock() == block && op->getNumResults() == 1 && tensorOf(op->getResult(0)) &&
         tensorOf(op->getResult(0)).getShape() == tensorOf(x).getShape() &&
         isKernelFloat(tensorOf(op->getResult(0)).getElementType()) &&
         llvm::is_contained(op->getOperands(), x) &&
         llvm::all_of(op->getOperands(), [&](Value v) { return v == x || v == r; });
}

/// The loop region line reduction `reduce` can join, or null.
FusionOp lineReader(Operation *reduce) {
  if (!isLineReduction(reduce))
    return nullptr;
  Value x = reduce->getOperand(0), r = reduce->getResult(0);
  auto loop = dyn_cast<FusionOp>(*r.getUsers().begin());
  if (!loop || !readsLine(loop, x, r, reduce->getBlock()) || loop.getKind() != "loop" ||
      loop.isViewRegion() || loop.getInputs().size() != 2 ||
      !llvm::all_of(loop.getBlock().without_terminator(),
                    [](Operation &op) { return isPointwise(&op); }))
    return nullptr;
  return loop;
}

/// A lone pointwise reader of line reduction `reduce` and its input (x minus
/// its mean in f32: forge-fuse leaves lone ops unwrapped) as a loop region.
void wrapLoneReader(Operation *reduce) {
  if (!isLineReduction(reduce))
    return;
  Value x = reduce->getOperand(0), r = reduce->getResult(0);
  Operation *user = *r.getUsers().begin();
  if (isa<FusionOp>(user) || !isPointwise(user) || user->getNumRegions() != 0 ||
      !readsLine(user, x, r, reduce->getBlock()))
    return;
  FusionOp region = cloneIntoLoopRegion(user);
  user->replaceAllUsesWith(region->getResults());
  user->erase();
}

struct FuseLineReductionsPass
    : public mlir::forge::impl::FuseLineReductionsBase<FuseLineReductionsPass> {
  using FuseLineReductionsBase::FuseLineReductionsBase;

  void runOnOperation() override {
    int fused = 0;
    getOperation().walk([&](func::FuncOp func) {
      SmallVector<Operation *> reductions;
      for (Operation &op : func.getBody().front())
        if (isa<ReduceSumOp, ReduceMeanOp>(op))
          reductions.push_back(&op);
      for (Operation *reduce : reductions)
        wrapLoneReader(reduce);
      // Pairs first: a rewrite erases the loop, which may be the next op.
      SmallVector<std::pair<Operation *, FusionOp>> pairs;
      for (Operation *reduce : reductions)
        if (FusionOp loop = lineReader(reduce))
          pairs.push_back({reduce, loop});
      for (auto [reduce, loop] : pairs)
        rewrite(reduce, loop);
      fused += static_cast<int>(pairs.size());
    });
    if (fused)
      getOperation().emitRemark() << "forge-fuse-line-reductions: " << fused
                                  << " reduction(s) over a middle axis in the region reading "
                                     "them";
    else
      markAllAnalysesPreserved();
  }

  /// One "lines" region of x: `reduce` of its argument, then `loop`'s body.
  void rewrite(Operation *reduce, FusionOp loop) {
    Value x = reduce->getOperand(0);
    OpBuilder b(loop);
    Location loc = loop.getLoc();
    auto region =
        b.create<FusionOp>(loc, loop.getResultTypes(), ValueRange{x}, b.getStringAttr("lines"));
    Block *body = b.createBlock(&region.getBody(), {}, {x.getType()}, {loc});
    OpBuilder in = OpBuilder::atBlockEnd(body);
    IRMapping map;
    map.map(x, body->getArgument(0));
    Operation *sum = in.clone(*reduce, map);
    for (auto [input, arg] : llvm::zip(loop.getInputs(), loop.getBlock().getArguments()))
      map.map(arg, input == x ? Value(body->getArgument(0)) : sum->getResult(0));
    for (Operation &op : loop.getBlock())
      in.clone(op, map);
    loop.getResult(0).replaceAllUsesWith(region.getResult(0));
    loop.erase();
    reduce->erase();
  }
};

} // namespace
