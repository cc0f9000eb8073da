//===- FuseNormGradEpilogues.cpp - a layer norm's gradient with its reader -===//
//
// forge-fuse-norm-grad-epilogues: a transformer's backward pass adds each
// layer norm's input gradient dx to the residual stream's gradient, rounds
// the sum to bf16 for the next GEMM and sums it over the tokens (the bias
// gradient of the linear layer before: forge-fuse-column-sums). The norm's
// gradient kernel writes dx (f32) and that region's kernel reads it back:
// GPT-2 124M, 2 x 50 MB per layer norm, 24 of them a step. When dx's only
// reader is one loop or column_reduce region that reads it at its own shape,
// both become one forge.fusion "norm_grad": the layer_norm_grad on the
// region's first three arguments (x, scale, dy), then the reader's body with
// dx in place of its argument; it yields the reader's results and the norm's
// scale and bias gradients. Its kernel (forge-generate-kernels) keeps dx in
// registers and evaluates the reader's body per element; the reader's column
// sums and the norm's accumulate per block like the norm's own. When other
// ops read dx too (a final norm's dx: a bf16 cast for the next GEMM, a bias
// sum and the residual add, which waits on that GEMM), the first region among
// dx's readers that reads nothing made after the norm becomes the epilogue,
// and the region also yields dx for the others (it is written once, as the
// norm alone would; the reader's own kernel, a standalone cast in bf16, goes).
//
// Invariants: every value is the one the two kernels computed (dx is f32,
// kept as such); the region goes where the norm's operands and the reader's
// other inputs all exist and before every reader of its results: at the norm
// when the reader's other inputs come before it, else at the reader when no
// reader of the norm's other results comes between them. Only norms over the
// last axis in f32 with dx asked for (dy of x's shape in any float type: a
// low one, forge-assign-precision's low-norm-gradients, is widened as loaded). After
// forge-fuse-column-sums (whose column_reduce regions it takes) and before placement.
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "mlir/IR/IRMapping.h"

namespace mlir::forge {
#define GEN_PASS_DEF_FUSENORMGRADEPILOGUES
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

RankedTensorType tensorOf(Value v) { return dyn_cast<RankedTensorType>(v.getType()); }

/// Whether the norm gradient kernel reads `v` beside dx of shape `shape`: at
/// that shape, per column ([C]) or as a scalar.
bool readable(Value v, ArrayRef<int64_t> shape) {
  auto t = tensorOf(v);
  if (!t || !t.hasStaticShape())
    return false;
  return t.getNumElements() == 1 || t.getShape() == shape ||
         (t.getRank() == 1 && t.getDimSize(0) == shape.back());
}

/// Whether `reader` (a region reading `lng`'s dx) can be its epilogue.
bool fitsEpilogue(LayerNormGradOp lng, FusionOp reader, ArrayRef<int64_t> shape);

/// Whether every input of `reader` but `dx` exists where `lng` is.
bool othersBefore(LayerNormGradOp lng, FusionOp reader, Value dx) {
  return llvm::all_of(reader.getInputs(), [&](Value v) {
    Operation *def = v.getDefiningOp();
    return v == dx || !def || def->getBlock() != lng->getBlock() || def->isBeforeInBlock(lng);
  });
}

/// The region reading `lng`'s dx that can take it as an epilogue, or null;
/// `alsoDx`: other ops read dx too (the region yields it for them).
FusionOp epilogueOf(LayerNormGradOp lng, bool &alsoDx) {
  auto x = tensorOf(lng->getOperand(0));
  if (!x || !x.hasStaticShape() || x.getRank() < 2 || !x.getElementType().isF32() ||
      !lng->getAttrOfType<BoolAttr>("input_grad").getValue())
    return nullptr;
  int64_t axis = lng->getAttrOfType<IntegerAttr>("axis").getInt();
  if (axis < 0)
    axis += x.getRank();
  Value dx = lng->getResult(0);
  if (axis != x.getRank() - 1 || dx.use_empty() || !tensorOf(dx).getElementType().isF32() ||
      tensorOf(lng->getOperand(2)).getShape() != x.getShape())
    return nullptr;
  ArrayRef<int64_t> shape = x.getShape();
  alsoDx = !dx.hasOneUse();
  if (!alsoDx) {
    auto reader = dyn_cast<FusionOp>(*dx.getUsers().begin());
    return reader && fitsEpilogue(lng, reader, shape) ? reader : nullptr;
  }
  // Several readers: the first region (in block order) that can go at the norm.
  FusionOp first;
  for (Operation *user : dx.getUsers()) {
    auto reader = dyn_cast<FusionOp>(user);
    if (reader && reader->getBlock() == lng->getBlock() &&
        (!first || reader->isBeforeInBlock(first)) && othersBefore(lng, reader, dx) &&
        fitsEpilogue(lng, reader, shape))
      first = reader;
  }
  return first;
}

bool fitsEpilogue(LayerNormGradOp lng, FusionOp reader, ArrayRef<int64_t> shape) {
  Value dx = lng->getResult(0);
  if (reader->getBlock() != lng->getBlock() ||
      (reader.getKind() != "loop" && reader.getKind() != "column_reduce") ||
      reader.isViewRegion() || llvm::count(reader.getInputs(), dx) != 1 ||
      llvm::any_of(lng->getResults().drop_front(),
                   [&](Value r) { return llvm::is_contained(reader.getInputs(), r); }))
    return false;
  // The kernel keeps a row in registers: at most kRowCache (8) columns for
  // each of its 128 threads. Wider rows keep two kernels.
  if (shape.back() > 1024)
    return false;
  if (!llvm::all_of(reader.getInputs(), [&](Value v) { return readable(v, shape); }))
    return false;
  // A reader yielding dx as it is stays (its dx is the norm's own).
  Block &block = reader.getBlock();
  Value dxArg = block.getArgument(
      static_cast<unsigned>(llvm::find(reader.getInputs(), dx) - reader.getInputs().begin()));
  if (llvm::is_contained(block.getTerminator()->getOperands(), dxArg))
    return false;
  // Every value of the body is per element at the shape, or a column sum of one.
  for (Operation &op : reader.getBlock().without_terminator()) {
    if (isa<ReduceSumOp>(op)) { // a column_reduce region's sums (its verifier's form), in f32
      if (!tensorOf(op.getResult(0)).getElementType().isF32())
        return false;
      continue;
    }
    auto iface = dyn_cast<ForgeOpInterface>(&op);
    if (!iface || iface.getFusionClass() != FusionClass::Elementwise ||
        tensorOf(op.getResult(0)).getShape() != shape)
      return false;
    // An integer division reports a zero divisor through a fault flag, which
    // the fused kernel has not (it would run as kernels of its own).
    if (isa<DivOp, ModOp>(op) && isa<IntegerType>(tensorOf(op.getResult(0)).getElementType()))
      return false;
  }
  return true;
}

struct FuseNormGradEpiloguesPass
    : public mlir::forge::impl::FuseNormGradEpiloguesBase<FuseNormGradEpiloguesPass> {
  void runOnOperation() override {
    int fused = 0;
    getOperation().walk([&](func::FuncOp func) {
      for (auto lng : llvm::to_vector(func.getBody().front().getOps<LayerNormGradOp>())) {
        bool alsoDx = false;
        if (FusionOp reader = epilogueOf(lng, alsoDx))
          fused += rewrite(lng, reader, alsoDx);
      }
    });
    if (fused)
      getOperation().emitRemark() << "forge-fuse-norm-grad-epilogues: " << fused
                                  << " layer norm gradient(s) with the region reading dx";
    else
      markAllAnalysesPreserved();
  }

  /// One norm_grad region for `lng` and `reader` (yielding dx last when
  /// `alsoDx`: it then goes at the norm); whether it was made.
  bool rewrite(LayerNormGradOp lng, FusionOp reader, bool alsoDx) {
    Value dx = lng->getResult(0);
    SmallVector<Value> others; // the reader's inputs but dx
    for (Value v : reader.getInputs())
      if (v != dx)
        others.push_back(v);
    // Where: at the norm when the reader's other inputs exist there, else at
    // the reader when the norm's other results are not read before it.
    Operation *at = nullptr;
    if (othersBefore(lng, reader, dx)) {
      at = lng;
    } else if (!alsoDx && llvm::all_of(lng->getResults().drop_front(), [&](Value r) {
                 return llvm::all_of(r.getUsers(), [&](Operation *user) {
                   Operation *top = lng->getBlock()->findAncestorOpInBlock(*user);
                   return !top || reader->isBeforeInBlock(top);
                 });
               })) {
      at = reader;
    } else {
      return false;
    }
    SmallVector<Value> inputs(lng->getOperands());
    llvm::append_range(inputs, others);
    SmallVector<Type> types;
    SmallVector<Value> norms; // the norm's scale and bias gradients
    for (Value r : lng->getResults().drop_front()) {
      norms.push_back(r);
      types.push_back(r.getType());
    }
    llvm::append_range(types, reader.getResultTypes());
    if (alsoDx)
      types.push_back(dx.getType());
    Location loc = FusedLoc::get(&getContext(), {lng.getLoc(), reader.getLoc()});
    OpBuilder b(at);
    auto region = b.create<FusionOp>(loc, types, inputs, b.getStringAttr("norm_grad"));
    SmallVector<Type> argTypes;
    for (Value v : inputs)
      argTypes.push_back(v.getType());
    Block *body =
        b.createBlock(&region.getBody(), {}, argTypes, SmallVector<Location>(inputs.size(), loc));
    OpBuilder in = OpBuilder::atBlockEnd(body);
    Operation *norm = in.clone(*lng);
    for (unsigned i = 0; i < 3; ++i) // (x and dy may be one value: set each)
      norm->setOperand(i, body->getArgument(i));
    IRMapping epilogue;
    unsigned next = 3;
    for (auto [arg, v] : llvm::zip(reader.getBlock().getArguments(), reader.getInputs()))
      epilogue.map(arg, v == dx ? Value(norm->getResult(0)) : Value(body->getArgument(next++)));
    for (Operation &op : reader.getBlock().without_terminator())
      in.clone(op, epilogue);
    SmallVector<Value> yielded(norm->getResults().drop_front());
    for (Value v : reader.getBlock().getTerminator()->getOperands())
      yielded.push_back(epilogue.lookupOrDefault(v));
    if (alsoDx)
      yielded.push_back(norm->getResult(0));
    in.create<YieldOp>(loc, yielded);
    if (alsoDx)
      dx.replaceUsesWithIf(region.getResults().back(),
                           [&](OpOperand &use) { return use.getOwner() != reader; });
    for (auto [i, r] : llvm::enumerate(norms))
      r.replaceAllUsesWith(region.getResult(static_cast<unsigned>(i)));
    for (auto [i, r] : llvm::enumerate(reader.getResults()))
      r.replaceAllUsesWith(region.getResult(static_cast<unsigned>(norms.size() + i)));
    reader.erase();
    lng.erase();
    return true;
  }
};

} // namespace
