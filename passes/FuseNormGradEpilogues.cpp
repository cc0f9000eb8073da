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
// sums and the norm's accumulate per block like the norm's own.
//
// Invariants: every value is the one the two kernels computed (dx is f32,
// kept as such); the region goes where the norm's operands and the reader's
// other inputs all exist and before every reader of its results: at the norm
// when the reader's other inputs come before it, else at the reader when no
// reader of the norm's other results comes between them. Only norms over the
// last axis in f32 with dx asked for. After forge-fuse-column-sums (whose
// column_reduce regions it takes) and before placement.
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

/// The region reading `lng`'s dx that can take it as an epilogue, or null.
FusionOp epilogueOf(LayerNormGradOp lng) {
  auto x = tensorOf(lng->getOperand(0));
  if (!x || !x.hasStaticShape() || x.getRank() < 2 || !x.getElementType().isF32() ||
      !lng->getAttrOfType<BoolAttr>("input_grad").getValue())
    return nullptr;
  int64_t axis = lng->getAttrOfType<IntegerAttr>("axis").getInt();
  if (axis < 0)
    axis += x.getRank();
  Value dx = lng->getResult(0);
  if (axis != x.getRank() - 1 || !dx.hasOneUse() || !tensorOf(dx).getElementType().isF32() ||
      tensorOf(lng->getOperand(2)) != x)
    return nullptr;
  auto reader = dyn_cast<FusionOp>(*dx.getUsers().begin());
  if (!reader || reader->getBlock() != lng->getBlock() ||
      (reader.getKind() != "loop" && reader.getKind() != "column_reduce") ||
      reader.isViewRegion() || llvm::count(reader.getInputs(), dx) != 1 ||
      llvm::any_of(lng->getResults().drop_front(),
                   [&](Value r) { return llvm::is_contained(reader.getInputs(), r); }))
    return nullptr;
  ArrayRef<int64_t> shape = x.getShape();
  // The kernel keeps a row in registers: at most kRowCache (8) columns for
  // each of its 128 threads. Wider rows keep two kernels.
  if (shape.back() > 1024)
    return nullptr;
  if (!llvm::all_of(reader.getInputs(), [&](Value v) { return readable(v, shape); }))
    return nullptr;
  // dx itself is never yielded (the kernel keeps it in registers).
  Block &block = reader.getBlock();
  Value dxArg = block.getArgument(
      static_cast<unsigned>(llvm::find(reader.getInputs(), dx) - reader.getInputs().begin()));
  if (llvm::is_contained(block.getTerminator()->getOperands(), dxArg))
    return nullptr;
  // Every value of the body is per element at the shape, or a column sum of one.
  for (Operation &op : reader.getBlock().without_terminator()) {
    if (isa<ReduceSumOp>(op)) { // a column_reduce region's sums (its verifier's form), in f32
      if (!tensorOf(op.getResult(0)).getElementType().isF32())
        return nullptr;
      continue;
    }
    auto iface = dyn_cast<ForgeOpInterface>(&op);
    if (!iface || iface.getFusionClass() != FusionClass::Elementwise ||
        tensorOf(op.getResult(0)).getShape() != shape)
      return nullptr;
    // An integer division reports a zero divisor through a fault flag, which
    // the fused kernel has not (it would run as kernels of its own).
    if (isa<DivOp, ModOp>(op) && isa<IntegerType>(tensorOf(op.getResult(0)).getElementType()))
      return nullptr;
  }
  return reader;
}

struct FuseNormGradEpiloguesPass
    : public mlir::forge::impl::FuseNormGradEpiloguesBase<FuseNormGradEpiloguesPass> {
  void runOnOperation() override {
    int fused = 0;
    getOperation().walk([&](func::FuncOp func) {
      for (auto lng : llvm::to_vector(func.getBody().front().getOps<LayerNormGradOp>()))
        if (FusionOp reader = epilogueOf(lng))
          fused += rewrite(lng, reader);
    });
    if (fused)
      getOperation().emitRemark() << "forge-fuse-norm-grad-epilogues: " << fused
                                  << " layer norm gradient(s) with the region reading dx";
    else
      markAllAnalysesPreserved();
  }

  /// One norm_grad region for `lng` and `reader`; whether it was made.
  bool rewrite(LayerNormGradOp lng, FusionOp reader) {
    Value dx = lng->getResult(0);
    SmallVector<Value> others; // the reader's inputs but dx
    for (Value v : reader.getInputs())
      if (v != dx)
        others.push_back(v);
    // Where: at the norm when the reader's other inputs exist there, else at
    // the reader when the norm's other results are not read before it.
    Operation *at = nullptr;
    if (llvm::all_of(others, [&](Value v) {
          Operation *def = v.getDefiningOp();
          return !def || def->getBlock() != lng->getBlock() || def->isBeforeInBlock(lng);
        })) {
      at = lng;
    } else if (llvm::all_of(lng->getResults().drop_front(), [&](Value r) {
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
    in.create<YieldOp>(loc, yielded);
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
