//===- FuseColumnSums.cpp - a bias gradient in the kernel that makes its input -===//
//
// forge-fuse-column-sums: a column sum (reduce_sum over every dim but the
// last: a bias gradient) of a loop region's result, which the region's other
// readers (the layer's data- and weight-gradient GEMMs) keep alive, read that
// whole tensor back from memory in a kernel of its own: GPT-2's MLP bias
// gradient reads its 100 MB GELU-gradient image once more per layer, and
// its attention projection's the residual gradient. The loop region becomes
// a column_reduce region that yields the sums and then, as side outputs, the
// loop's results: the kernel that computes each element adds it to its
// column's sum as it writes it.
//
// Invariants: every value is the one the loop and the sum computed (the sum
// reads the yielded value, in its stored type, as the standalone sum did);
// a loop region is taken only when every op of its body is pointwise and
// every input is at the iteration shape, a per-column vector or a scalar
// (what the column_reduce kernel reads); the sums come first among the
// results (the kernel zeroes and accumulates them). After precision, whose
// stored types it keeps, and the loss head's stages; before partition and
// placement.
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "mlir/IR/IRMapping.h"

namespace mlir::forge {
#define GEN_PASS_DEF_FUSECOLUMNSUMS
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

RankedTensorType tensorOf(Value v) { return dyn_cast<RankedTensorType>(v.getType()); }

/// A reduce_sum over every dim but the last, of rank >= 2, to f32.
bool isColumnSum(ReduceSumOp sum) {
  auto in = tensorOf(sum.getInput());
  if (!in || !in.hasStaticShape() || in.getRank() < 2 ||
      !tensorOf(sum.getResult()).getElementType().isF32())
    return false;
  SmallVector<int64_t> axes(sum.getAxes());
  llvm::sort(axes);
  return llvm::equal(axes, llvm::seq<int64_t>(0, in.getRank() - 1));
}

/// Whether the column kernel reads `v` over iteration shape `shape`: at that
/// shape, per column ([.., C], ones before) or as a scalar.
bool columnReadable(Value v, ArrayRef<int64_t> shape) {
  auto t = tensorOf(v);
  if (!t || !t.hasStaticShape())
    return false;
  int64_t n = t.getNumElements(), total = 1;
  for (int64_t d : shape)
    total *= d;
  return n == 1 || (n == total && t.getShape() == shape) ||
         (n == shape.back() && t.getRank() >= 1 && t.getShape().back() == shape.back());
}

bool isPointwise(Operation *op) {
  auto iface = dyn_cast<ForgeOpInterface>(op);
  return iface && iface.getFusionClass() == FusionClass::Elementwise;
}

/// Whether loop region `loop` can become a column_reduce region over `shape`:
/// a pointwise body, every result at `shape`, every input column-readable.
bool fusible(FusionOp loop, ArrayRef<int64_t> shape) {
  return loop.getKind() == "loop" && !loop.isViewRegion() &&
         llvm::all_of(loop.getResults(),
                      [&](Value v) { return tensorOf(v).getShape() == shape; }) &&
         llvm::all_of(loop.getInputs(), [&](Value v) { return columnReadable(v, shape); }) &&
         llvm::all_of(loop.getBlock().without_terminator(),
                      [](Operation &op) { return isPointwise(&op); });
}

/// A top-level pointwise op of one result `v` at `shape` whose operands the
/// column kernel reads (forge-fuse leaves lone ops unwrapped).
bool fusibleLoneOp(Operation *op, Value v, ArrayRef<int64_t> shape) {
  return !isa<FusionOp>(op) && isPointwise(op) && op->getNumResults() == 1 &&
         op->getResult(0) == v && op->getNumRegions() == 0 &&
         llvm::all_of(op->getOperands(), [&](Value u) { return columnReadable(u, shape); });
}

struct FuseColumnSumsPass : public mlir::forge::impl::FuseColumnSumsBase<FuseColumnSumsPass> {
  using FuseColumnSumsBase::FuseColumnSumsBase;

  void runOnOperation() override {
    int fused = 0;
    getOperation().walk([&](func::FuncOp func) {
      // Loop regions with the column sums of their results, in program order.
      llvm::MapVector<FusionOp, SmallVector<ReduceSumOp>> groups;
      Block &block = func.getBody().front();
      for (ReduceSumOp sum : llvm::to_vector(block.getOps<ReduceSumOp>())) {
        if (!isColumnSum(sum))
          continue;
        Operation *def = sum.getInput().getDefiningOp();
        ArrayRef<int64_t> shape = tensorOf(sum.getInput()).getShape();
        if (!def || def->getBlock() != &block)
          continue;
        // A lone pointwise op becomes a loop region of its own first.
        if (fusibleLoneOp(def, sum.getInput(), shape)) {
          FusionOp region = cloneIntoLoopRegion(def);
          def->replaceAllUsesWith(region->getResults());
          def->erase();
          def = region;
        }
        if (auto loop = dyn_cast<FusionOp>(def); loop && fusible(loop, shape))
          groups[loop].push_back(sum);
      }
      for (auto &[loop, sums] : groups) {
        rewrite(loop, sums);
        ++fused;
      }
    });
    if (fused)
      getOperation().emitRemark() << "forge-fuse-column-sums: " << fused
                                  << " column sum kernel(s) ride in the region that makes "
                                     "their input";
    else
      markAllAnalysesPreserved();
  }

  /// `loop` as a column_reduce region yielding the sums, then its results.
  void rewrite(FusionOp loop, MutableArrayRef<ReduceSumOp> sums) {
    OpBuilder b(loop);
    Location loc = loop.getLoc();
    SmallVector<Type> types;
    for (ReduceSumOp sum : sums) // [C] f32 (a keepdims sum's readers get a view)
      types.push_back(RankedTensorType::get({tensorOf(sum.getInput()).getShape().back()},
                                            tensorOf(sum.getResult()).getElementType()));
    llvm::append_range(types, loop.getResultTypes());
    auto region = b.create<FusionOp>(loc, types, loop.getInputs(), b.getStringAttr("column_reduce"));
    Block *body = b.createBlock(&region.getBody(), {}, loop.getBlock().getArgumentTypes(),
                                SmallVector<Location>(loop.getInputs().size(), loc));
    IRMapping map;
    for (auto [from, to] : llvm::zip(loop.getBlock().getArguments(), body->getArguments()))
      map.map(from, to);
    OpBuilder in = OpBuilder::atBlockEnd(body);
    for (Operation &op : loop.getBlock().without_terminator())
      in.clone(op, map);
    Operation *yield = loop.getBlock().getTerminator();
    SmallVector<Value> yielded;
    int64_t rank = tensorOf(loop.getResult(0)).getRank();
    SmallVector<int64_t> axes = llvm::to_vector(llvm::seq<int64_t>(0, rank - 1));
    for (auto [i, sum] : llvm::enumerate(sums)) {
      unsigned r = cast<OpResult>(sum.getInput()).getResultNumber();
      Value v = map.lookup(yield->getOperand(r));
      yielded.push_back(in.create<ReduceSumOp>(sum.getLoc(), types[i], v,
                                               in.getDenseI64ArrayAttr(axes),
                                               in.getBoolAttr(false)));
    }
    for (Value v : yield->getOperands())
      yielded.push_back(map.lookup(v));
    in.create<YieldOp>(loc, yielded);
    // The loop's readers take the side outputs; each sum's, its column sum
    // in the sum's shape (a view).
    for (unsigned r = 0; r < loop.getNumResults(); ++r)
      loop.getResult(r).replaceAllUsesWith(region.getResult(sums.size() + r));
    for (auto [i, sum] : llvm::enumerate(sums)) {
      Value total = region.getResult(i);
      auto want = tensorOf(sum.getResult());
      // Reshapes of a keepdims sum read the [C] sum instead (one view, not two).
      for (Operation *user : llvm::make_early_inc_range(sum.getResult().getUsers()))
        if (auto reshape = dyn_cast<ReshapeOp>(user)) {
          if (reshape.getType() == total.getType()) {
            reshape.getResult().replaceAllUsesWith(total);
            reshape.erase();
          } else {
            reshape->setOperand(0, total);
          }
        }
      if (!sum.getResult().use_empty() && want != total.getType()) {
        OpBuilder at(sum);
        total = at.create<ReshapeOp>(sum.getLoc(), want, total,
                                     at.getDenseI64ArrayAttr(want.getShape()));
      }
      sum.getResult().replaceAllUsesWith(total);
      sum.erase();
    }
    loop.erase();
  }
};

} // namespace
