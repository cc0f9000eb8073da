//===- AssignPrecision.cpp - storage precision of the training step -------===//
//
// forge-assign-precision: which tensors of @train_step (and then of @eval,
// by the same decisions) are stored in bf16 (or f16) between kernels. Kernels compute in f32
// whatever they load (KernelGen's Body::load/store convert), so the decision here is one of
// storage: a value goes low when every reader takes it low; tensor-core ops
// (matmul, gemm, gemm regions) must read low operands, which get a low copy
// written where the value is made. Invariants:
//  * Kept f32: parameters and optimizer state (fp32 masters), everything the
//    optimizer, the gradient norm and the returned metrics read (parameter
//    gradients, and each micro-batch's term of their sum), operand 0 of a KeepFP32 op (logits into
//    the loss, a norm's input, i.e. the residual stream, softmax's scores), a gemm's full C and the
//    product written over it (the residual stream again), scalars, attention's lse.
//  * With low-norm-gradients (off by default), a layer norm's gradient reads
//    its grad_output (the next linear layer's dX, a GEMM's product) low, as
//    autocast stores it: 25 MB a GPT-2 layer norm not written and read again
//    in f32 (-0.20 ms a step on an H100), but the norm's bias and scale
//    gradients then sum rounded terms. Its x (the residual stream) and its
//    results stay f32 either way.
//  * Attention (cuDNN's flash attention) reads q, k, v, o and grad_output
//    low and writes o and the gradients low, whoever reads them. So do the
//    convolutions (cuDNN's legacy API: one type for every operand), the
//    weight gradient included: the optimizer reads it through a cast.
//  * A cast is never its own kernel where a neighbour can do it: a region
//    stores its result low (the cast before its yield), a region reads a low
//    input (the cast after its block argument, free in registers), a
//    parameter's low copy is one more output of its optimizer update, and
//    views follow their input's type. What has no such neighbour (a data
//    input, a library op's output read by both) gets a loop region with one
//    cast, counted in the pass's remark.
//  * precision=fp8 is bf16 plus float8 forward GEMMs: each product in the
//    layout Hopper's float8 GEMMs read (lhs [M, K], rhs [N, K]; K, N
//    multiples of 16) whose lhs and rhs are bf16 becomes a scaled_gemm of
//    E4M3 copies, each scaled per tensor by the current step's amax
//    ("current scaling": q = x * 448 / amax, the GEMM multiplies back by
//    amax / 448 each). A copy is two kernels after the value is made: a
//    multi_reduce of max(|x|, 1e-30) (read once per value, all weights in
//    one launch) and a loop region that scales and casts (saturating). The
//    loss head's matmul stays bf16 (forge-chunk-cross-entropy takes it).
//  * fp8-scaling=delayed: an activation's copy is scaled by the largest
//    amax of its last H steps instead (a state ring [H], slot (step - 1)
//    mod H written by this step, initially [448, 0, ...] so that the first
//    step scales by 1). Its cast needs no reduction of the same step first;
//    the activation's own amax only fills its slot. Histories' maxima ride
//    in the entry's multi_reduce, their slots in one horizontal region at
//    the end (after a max over the data-parallel ranks, which then keep
//    equal histories). Arguments keep current scaling (their amaxes are
//    known at the entry anyway).
//  * fp8-gradients=e5m2: each float8 product's backward GEMMs (the loose
//    GEMMs reading exactly one tensor a float8 product copied) read an E5M2
//    copy of the output gradient (max 57344) beside E4M3 copies of the
//    forward tensor; operands the K-major float8 layout reads transposed
//    (W for dX, dY and X for dW) get transposed copies scaled by the amax
//    of the tensor they copy (every view of a tensor shares its amax).
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringSet.h"

#include <map>
#include <numeric>

namespace mlir::forge {
#define GEN_PASS_DEF_ASSIGNPRECISION
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

RankedTensorType tensorOf(Value v) { return dyn_cast<RankedTensorType>(v.getType()); }

bool isF32Tensor(Value v) {
  auto t = tensorOf(v);
  return t && t.hasStaticShape() && t.getElementType().isF32();
}

/// Ops whose result is a view or copy of operand 0 in its element type: they
/// follow their input's precision.
bool followsInput(Operation *op) {
  if (isa<ReshapeOp, TransposeOp, SliceOp>(op))
    return true;
  auto fusion = dyn_cast<FusionOp>(op);
  return fusion && fusion.isViewRegion();
}

/// A tensor-core op run as one GEMM: a standalone matmul/gemm or a gemm region.
bool isGemm(Operation *op) {
  if (isa<MatMulOp, GemmOp>(op))
    return op->getParentOp() && isa<func::FuncOp>(op->getParentOp());
  auto fusion = dyn_cast<FusionOp>(op);
  return fusion && fusion.getKind() == "gemm";
}

/// A channels-last convolution (conv, conv_transpose, conv_grad_weight at
/// the top level, made by forge-assign-layout) runs on cuDNN's tensor cores:
/// its legacy API takes one type for all operands and the result, so it reads
/// every operand low and writes its result low. Channels-first ones stay f32
/// (TF32): their batch norms' kernels read f32.
bool isConvolution(Operation *op) {
  auto last = op->getAttrOfType<BoolAttr>("channels_last");
  return isa<ConvOp, ConvTransposeOp, ConvGradWeightOp>(op) && last && last.getValue() &&
         op->getParentOp() && isa<func::FuncOp>(op->getParentOp());
}

/// Operand i of an attention op that cuDNN's flash attention reads in the
/// low type: q, k, v and the bias (and o and grad_output of attention_grad),
/// not lse.
bool isAttentionLowOperand(Operation *op, unsigned i) {
  if (isa<AttentionOp>(op))
    return true;
  return isa<AttentionGradOp>(op) && i != 4;
}

/// A result cuDNN's flash attention writes in the low type (all but lse), or
/// a convolution's.
bool isAttentionLowResult(Value v) {
  auto r = dyn_cast<OpResult>(v);
  if (!r)
    return false;
  if (isConvolution(r.getOwner()))
    return true;
  if (isa<AttentionOp>(r.getOwner()))
    return r.getResultNumber() == 0;
  return isa<AttentionGradOp>(r.getOwner());
}

/// The product of a GEMM op (itself, or a gemm region's first body op).
Operation *productOf(Operation *gemm) {
  if (auto fusion = dyn_cast<FusionOp>(gemm))
    return &fusion.getBlock().front();
  return gemm;
}

/// Whether a GEMM adds a full C (the residual): its output stays f32.
bool hasFullC(Operation *gemm) {
  auto g = dyn_cast<GemmOp>(productOf(gemm));
  if (!g || !g.getC())
    return false;
  return tensorOf(g.getC()).getShape() == tensorOf(g.getResult()).getShape();
}

/// Whether a body value read at `use` must be f32 in memory: operand 0 of a
/// forward KeepFP32 op (logits into a loss, a norm's input, softmax's
/// input). Their gradients read what the forward saved, in its type.
bool sensitiveUse(OpOperand &use) {
  Operation *op = use.getOwner();
  // A micro-batch's contribution to a parameter's gradient (the sum over
  // --micro-batches, forge.accumulates from forge-build-train-step): the sum
  // is the optimizer's input, and its terms are as sensitive as it is.
  if (op->hasAttr("forge.accumulates"))
    return true;
  auto iface = dyn_cast<ForgeOpInterface>(op);
  return iface && iface.getPrecisionClass() == PrecisionClass::KeepFP32 &&
         !op->getName().getStringRef().ends_with("_grad") && use.getOperandNumber() == 0;
}

struct AssignPrecisionPass : public mlir::forge::impl::AssignPrecisionBase<AssignPrecisionPass> {
  using AssignPrecisionBase::AssignPrecisionBase;

  Type low;
  func::FuncOp func;
  /// Values stored low (decided in reverse program order).
  llvm::DenseSet<Value> lowValues;
  /// Results of view ops whose readers all take them low.
  llvm::DenseSet<Value> viewWantsLow;
  /// Low copies made for GEMM operands, by the f32 value.
  llvm::DenseMap<Value, Value> lowCopy;
  int standaloneCasts = 0;
  /// Low parameter copies the training steps update (their optimizers write
  /// them); @eval reads those and casts any other parameter itself.
  llvm::StringSet<> updatedCopies;
  bool evalRoutine = false;

  void runOnOperation() override {
    if (precision == "fp32" || precision == "tf32") {
      markAllAnalysesPreserved();
      return;
    }
    if (precision != "bf16" && precision != "fp16" && precision != "fp8") {
      getOperation().emitError() << "forge-assign-precision: unknown precision '" << precision
                                 << "' (fp32, tf32, bf16, fp16, fp8)";
      return signalPassFailure();
    }
    if (fp8Scaling != "current" && fp8Scaling != "delayed") {
      getOperation().emitError() << "forge-assign-precision: unknown fp8-scaling '" << fp8Scaling
                                 << "' (current, delayed)";
      return signalPassFailure();
    }
    if (fp8Gradients != "bf16" && fp8Gradients != "e5m2") {
      getOperation().emitError() << "forge-assign-precision: unknown fp8-gradients '"
                                 << fp8Gradients << "' (bf16, e5m2)";
      return signalPassFailure();
    }
    if (fp8History < 1 || fp8History > (1u << 16)) {
      getOperation().emitError() << "forge-assign-precision: fp8-history must be 1..65536, not "
                                 << std::to_string(fp8History);
      return signalPassFailure();
    }
    Builder b(&getContext());
    low = precision == "fp16" ? Type(b.getF16Type()) : Type(b.getBF16Type());
    // The training step, or each pipeline stage's (train_step@pp<s>, with its
    // eval@pp<s>): each is assigned on its own.
    SmallVector<std::pair<func::FuncOp, func::FuncOp>> steps;
    for (auto f : getOperation().getOps<func::FuncOp>()) {
      StringRef name = f.getSymName();
      if (name == "train_step" || name.starts_with("train_step@"))
        steps.push_back({f, getOperation().lookupSymbol<func::FuncOp>(
                                ("eval" + name.drop_front(StringRef("train_step").size())).str())});
    }
    if (steps.empty()) {
      markAllAnalysesPreserved();
      return;
    }
    for (auto [train, eval] : steps) {
      for (func::FuncOp f : {train, eval}) {
        if (!f)
          continue;
        func = f;
        evalRoutine = f == eval;
        lowValues.clear();
        viewWantsLow.clear();
        lowCopy.clear();
        quantized.clear();
        transposedCopies.clear();
        histories.clear();
        entryAmaxes.clear();
        historyNames.clear();
        standaloneCasts = scaledGemms = gradientGemms = 0;
        forwardCopies = 0;
        e4m3Max = e5m2Max = amaxFloor = Value();
        if (failed(assign()))
          return signalPassFailure();
      }
    }
    if (failed(matchMessageTypes()))
      return signalPassFailure();
  }

  /// A pipeline message travels in the type its sender holds: where a stage
  /// decided to read a received value in another type, the recv takes the
  /// sender's and a cast follows it.
  LogicalResult matchMessageTypes() {
    // (the receiving routine, tag) -> the type sent
    std::map<std::pair<std::string, int64_t>, Type> sent;
    for (auto f : getOperation().getOps<func::FuncOp>()) {
      auto [name, stage] = f.getSymName().rsplit("@pp");
      if (stage.empty())
        continue;
      f.walk([&, name = name](SendOp op) {
        sent[{name.str() + "@" + std::to_string(op.getPeer()), op.getTag()}] =
            op.getInput().getType();
      });
    }
    for (auto f : getOperation().getOps<func::FuncOp>()) {
      auto [name, stage] = f.getSymName().rsplit("@pp");
      if (stage.empty())
        continue;
      for (RecvOp op : llvm::to_vector(f.getOps<RecvOp>())) {
        auto it = sent.find({name.str() + "@" + stage.str(), op.getTag()});
        if (it == sent.end())
          return op.emitError("forge-assign-precision: internal: no send for this recv");
        if (it->second == op.getResult().getType())
          continue;
        Type wanted = op.getResult().getType();
        OpBuilder b(op->getContext());
        b.setInsertionPointAfter(op);
        op.getResult().setType(mlir::cast<RankedTensorType>(it->second));
        Type element = cast<RankedTensorType>(wanted).getElementType();
        auto convert = b.create<CastOp>(op.getLoc(), wanted, op.getResult(),
                                        TypeAttr::get(element), b.getBoolAttr(true));
        op.getResult().replaceAllUsesExcept(convert.getResult(), convert);
      }
    }
    return success();
  }

  /// The training step, or @eval after it: the same decisions (its forward
  /// runs like the step's, bf16 GEMMs reading the parameters' low copies that
  /// the step's optimizer writes); no float8 in @eval.
  LogicalResult assign() {
    Builder b(&getContext());
    decide();
    materialize();
    if (failed(fixGemmOperands()))
      return failure();
    if (precision == "fp8" && !evalRoutine)
      quantizeGemms();
    syncFunctionType();
    func->setAttr("forge.precision", b.getStringAttr(precision));
    if (standaloneCasts)
      func.emitRemark() << "forge-assign-precision: " << standaloneCasts
                        << " cast(s) have no neighbouring kernel yet (a layer norm gradient's "
                           "may still take one: forge-fuse-norm-grad-epilogues)";
    if (precision == "fp8" && !evalRoutine)
      func.emitRemark() << "forge-assign-precision: " << scaledGemms
                        << " GEMM(s) run in float8 (E4M3) from " << forwardCopies
                        << " scaled copies"
                        << (fp8Gradients == "e5m2"
                                ? ", " + std::to_string(gradientGemms) +
                                      " gradient GEMM(s) read E5M2 (" +
                                      std::to_string(quantized.size() + transposedCopies.size() -
                                                     forwardCopies) +
                                      " more copies)"
                                : std::string())
                        << (histories.empty()
                                ? std::string()
                                : ", " + std::to_string(histories.size()) +
                                      " of them with delayed scaling (amax histories of " +
                                      std::to_string(fp8History) + " steps)");
    return success();
  }

  //===--------------------------------------------------------------------===//
  // 1. Decision
  //===--------------------------------------------------------------------===//

  /// The ops that make a parameter's update (the optimizer's regions, whatever their
  /// kind): what they read stays f32, the gradients above all. (The gradient norm, a
  /// multi_reduce, kept them f32 too, but it exists only where clipping or loss scaling
  /// reads it: without it, a tied weight's two gradient GEMMs fed its update's loop
  /// region low.)
  llvm::DenseSet<Operation *> updaters;

  void findUpdaters() {
    updaters.clear();
    llvm::StringSet<> params;
    for (unsigned i = 0; i < func.getNumArguments(); ++i) {
      StringAttr kind = argAttr(i, "forge.kind"), name = argAttr(i, "forge.name");
      if (kind && name && kind.getValue() == "parameter")
        params.insert(name.getValue());
    }
    Operation *ret = func.front().getTerminator();
    for (auto [i, v] : llvm::enumerate(ret->getOperands())) {
      auto updates = func.getResultAttrOfType<StringAttr>(i, "forge.updates");
      if (!updates || !params.contains(updates.getValue()))
        continue;
      // Past a skipped step's select (where(finite, new, old)) and ZeRO's gather.
      Operation *op = v.getDefiningOp();
      while (op && isa<WhereOp, AllGatherOp>(op))
        op = op->getOperand(isa<WhereOp>(op) ? 1 : 0).getDefiningOp();
      if (op)
        updaters.insert(op);
    }
  }

  /// Whether `use`'s owner takes the value low.
  bool accepts(OpOperand &use) {
    Operation *user = use.getOwner();
    unsigned i = use.getOperandNumber();
    if (updaters.contains(user))
      return false;
    if (followsInput(user))
      return i == 0 && viewWantsLow.contains(user->getResult(0));
    if (isGemm(user))
      return i < 2; // lhs and rhs; never C or an epilogue's row
    if (isa<AttentionOp, AttentionGradOp>(user))
      return isAttentionLowOperand(user, i);
    if (isConvolution(user))
      return true;
    if (isa<ReduceSumOp>(user))
      return true; // sums in f32 and keeps its result's type (a bias gradient)
    if (isa<LayerNormGradOp>(user))
      return lowNormGradients && i == 2; // grad_output (dX of the next linear layer) only; x
                                         // (the residual stream) stays f32
    if (isa<MaxPoolOp>(user))
      return i == 0; // the pooled image: the kernel loads any float type
    if (isa<MaxPoolGradOp>(user))
      return true; // the image and the gradient in any float types; the result stays f32
                   // (producerStoresLow: the GPU kernel adds into it with f32 atomics)
    if (isa<SplitOp, ConcatOp>(user)) // copies: low in when every part goes out low
      return llvm::all_of(user->getResults(), [&](Value r) { return lowValues.contains(r); });
    auto fusion = dyn_cast<FusionOp>(user);
    if (!fusion || (fusion.getKind() != "loop" && fusion.getKind() != "row" &&
                    fusion.getKind() != "column_reduce"))
      return false; // return, the optimizer's and norm's regions, loose ops
    // The body reads it through casts of the iteration shape (the region's
    // verifier wants every body value to have it): no broadcast inputs.
    BlockArgument arg = fusion.getBlock().getArgument(i);
    ArrayRef<int64_t> iteration = fusion.getIterationShape();
    if (fusion.getKind() == "column_reduce") // the shape its sums read
      for (Operation &op : fusion.getBlock().without_terminator())
        if (isa<ReduceSumOp>(op)) {
          iteration = tensorOf(op.getOperand(0)).getShape();
          break;
        }
    if (tensorOf(arg).getShape() != iteration)
      return false;
    // A column sum reads a low input as a loose reduce_sum does: summing in f32.
    bool sums = fusion.getKind() == "column_reduce";
    return llvm::none_of(arg.getUses(), [&](OpOperand &inner) {
      return sensitiveUse(inner) && !(sums && isa<ReduceSumOp>(inner.getOwner()));
    });
  }

  /// Whether the op making `v` may store it low.
  bool producerStoresLow(Value v) {
    Operation *def = v.getDefiningOp();
    if (!def || isa<ConstantOp>(def))
      return false; // arguments: masters and inputs keep their type
    if (isa<MaxPoolGradOp, GatherGradOp, GatherElementsGradOp, PadGradOp, SliceGradOp,
            ScatterElementsOp>(def))
      return false; // their kernels add (or store) into the result with f32 atomics: an
                    // embedding's gradient, a window's
    if (isa<LayerNormGradOp>(def) && cast<OpResult>(v).getResultNumber() > 0)
      return false; // the scale and bias gradients: column sums its kernel adds with f32
                    // atomics (gpt_dynamo in fp16 stored them low and failed to compile)
    if (isa<ReduceSumOp, ReduceMeanOp>(def))
      return false; // sums stay f32 (and their kernels split rows over blocks that add
                    // atomically into an f32 result: a batch norm's column sums)
    if (isa<ConvOp, ConvTransposeOp, ConvGradWeightOp>(def))
      return isConvolution(def); // cuDNN: the operands' type (f32 when channels-first)
    if (isGemm(def))
      return cast<OpResult>(v).getResultNumber() == 0 && !hasFullC(def);
    if (auto fusion = dyn_cast<FusionOp>(def))
      return fusion.getKind() == "loop" || fusion.getKind() == "row";
    // Loose ops store any float type (isStorageCompatible); views follow.
    return isa<ForgeOpInterface>(def);
  }

  void decide() {
    findUpdaters();
    Block &body = func.front();
    for (Operation &op : llvm::reverse(body.without_terminator())) {
      for (Value v : op.getResults()) {
        if (isF32Tensor(v) && isAttentionLowResult(v)) { // cuDNN writes it low, read or not
          lowValues.insert(v);
          continue;
        }
        if (!isF32Tensor(v) || tensorOf(v).getNumElements() < 2 || v.use_empty())
          continue;
        bool all = llvm::all_of(v.getUses(), [&](OpOperand &u) { return accepts(u); });
        if (!all)
          continue;
        if (followsInput(&op))
          viewWantsLow.insert(v);
        else if (producerStoresLow(v))
          lowValues.insert(v);
      }
    }
  }

  //===--------------------------------------------------------------------===//
  // 2. Materialization (program order: operands are final when an op is seen)
  //===--------------------------------------------------------------------===//

  Type withElement(Value v, Type elem) { return tensorOf(v).clone(elem); }

  /// forge.cast of `v` to element type `elem`, at b's insertion point.
  Value castOf(OpBuilder &b, Location loc, Value v, Type elem) {
    return b.create<CastOp>(loc, withElement(v, elem), v, TypeAttr::get(elem),
                            b.getBoolAttr(true));
  }

  /// A region input that became low: its block argument takes the new type,
  /// and (but in a gemm region, whose product reads it as an operand, and a
  /// view region) each reader gets a cast back to f32 right before it, free
  /// in registers. One cast per reader keeps a row region's prologue (read
  /// by its row op alone) and epilogue apart.
  void retypeRegionInput(FusionOp fusion, unsigned i) {
    Value input = fusion.getInputs()[i];
    BlockArgument arg = fusion.getBlock().getArgument(i);
    Type old = arg.getType();
    if (old == input.getType())
      return;
    arg.setType(input.getType());
    if (fusion.getKind() == "gemm" || fusion.isViewRegion())
      return;
    if (fusion.getKind() == "horizontal") { // its readers are loop regions: each casts inside
      for (OpOperand &use : llvm::make_early_inc_range(arg.getUses()))
        retypeRegionInput(cast<FusionOp>(use.getOwner()), use.getOperandNumber());
      return;
    }
    castEachRead(arg, cast<RankedTensorType>(old).getElementType(), fusion.getLoc());
  }

  /// Every reader of `arg` reads it through its own cast to `elem`, made
  /// right before the reader.
  void castEachRead(BlockArgument arg, Type elem, Location loc) {
    for (OpOperand *use : llvm::map_to_vector(arg.getUses(), [](OpOperand &u) { return &u; })) {
      OpBuilder b(use->getOwner());
      use->set(castOf(b, loc, arg, elem));
    }
  }

  /// Stores result `r` of a loop/row region low: a cast before the yield.
  void storeRegionResultLow(FusionOp fusion, unsigned r) {
    Operation *yield = fusion.getBlock().getTerminator();
    OpBuilder b(yield);
    Value lowered = castOf(b, fusion.getLoc(), yield->getOperand(r), low);
    yield->setOperand(r, lowered);
    fusion.getResult(r).setType(lowered.getType());
  }

  /// A gemm region's output 0 low: the product and the epilogue op it
  /// yields (relu, bias add) take the type; cuBLASLt writes D low (and an
  /// aux output, D's type too).
  void storeGemmRegionLow(FusionOp fusion) {
    Operation *yield = fusion.getBlock().getTerminator();
    Operation *product = &fusion.getBlock().front();
    Value out = yield->getOperand(0);
    product->getResult(0).setType(withElement(product->getResult(0), low));
    if (out != product->getResult(0))
      out.setType(withElement(out, low));
    // Every result takes its yielded value's type: an aux epilogue's saved
    // pre-activation (GELU_AUX) is the product itself, which cuBLASLt stores
    // in D's type.
    for (auto [r, yielded] : llvm::enumerate(yield->getOperands()))
      fusion.getResult(r).setType(yielded.getType());
  }

  /// A DGELU region reads the GELU's saved input (its last argument) in its
  /// product's type (cuBLASLt's aux matrix has D's type). The aux is low when
  /// its GELU_AUX region's output is; where this product is not (or the other
  /// way round), the aux is converted before the region: a kernel of its own,
  /// only where readers disagree.
  void matchAuxInput(FusionOp fusion) {
    Operation *product = &fusion.getBlock().front();
    if (!isa_and_nonnull<GeluGradOp>(product->getNextNode()))
      return;
    unsigned last = fusion.getInputs().size() - 1;
    BlockArgument arg = fusion.getBlock().getArgument(last);
    Type want = tensorOf(product->getResult(0)).getElementType();
    if (tensorOf(arg).getElementType() == want)
      return;
    OpBuilder b(fusion);
    Value converted = castOf(b, fusion.getLoc(), fusion.getInputs()[last], want);
    fusion->setOperand(last, converted);
    arg.setType(converted.getType());
  }

  /// A view region's body follows its (now low) input.
  void followViewRegion(FusionOp fusion) {
    Type elem = tensorOf(fusion.getInputs()[0]).getElementType();
    for (Operation &op : fusion.getBlock().without_terminator())
      op.getResult(0).setType(withElement(op.getResult(0), elem));
    fusion.getResult(0).setType(withElement(fusion.getResult(0), elem));
  }

  void materialize() {
    for (Operation &op : llvm::make_early_inc_range(func.front().without_terminator())) {
      auto fusion = dyn_cast<FusionOp>(&op);
      if (fusion)
        for (unsigned i = 0; i < fusion.getInputs().size(); ++i)
          retypeRegionInput(fusion, i);
      if (followsInput(&op)) {
        if (fusion)
          followViewRegion(fusion);
        else if (isa<SliceOp, TransposeOp>(op) && !viewWantsLow.contains(op.getResult(0)))
          ; // a copy kernel (no view) keeps its f32 result for readers that want
            // f32 (a batch norm's shift, read broadcast by a loop region; a
            // pool's input beside its f32 gradient), converting as it copies
        else
          op.getResult(0).setType(
              withElement(op.getResult(0), tensorOf(op.getOperand(0)).getElementType()));
        continue;
      }
      for (Value v : op.getResults()) {
        if (!lowValues.contains(v))
          continue;
        if (fusion && fusion.getKind() == "gemm")
          storeGemmRegionLow(fusion);
        else if (fusion)
          storeRegionResultLow(fusion, cast<OpResult>(v).getResultNumber());
        else
          v.setType(withElement(v, low));
      }
      if (fusion && fusion.getKind() == "gemm")
        matchAuxInput(fusion);
      if (!fusion && isLoosePointwise(&op) && hasMixedFloatOperands(&op))
        readLowInLoop(wrapInLoop(&op));
      // A collective's result i is operand i reduced over the ranks, in one type:
      // an operand stored low (a channels-last conv's weight gradient, which cuDNN
      // writes low) is converted to its result's type first (an f32 sum).
      if (auto ar = dyn_cast<AllReduceOp>(&op)) {
        OpBuilder b(&op);
        for (OpOperand &use : ar->getOpOperands()) {
          Type want = tensorOf(ar.getResult(use.getOperandNumber())).getElementType();
          if (tensorOf(use.get()).getElementType() != want)
            use.set(castOf(b, op.getLoc(), use.get(), want));
        }
      }
    }
  }

  /// Whether `op` reads low and f32 float tensors side by side (a low value
  /// that must be low, attention's dk, beside an f32 one).
  bool hasMixedFloatOperands(Operation *op) {
    bool anyLow = false, anyF32 = false;
    for (Value v : op->getOperands()) {
      anyLow |= isLow(v);
      anyF32 |= isF32Tensor(v);
    }
    return anyLow && anyF32;
  }

  /// A loop region's body reads its low inputs through casts back to f32
  /// (operand types never mix inside a body).
  void readLowInLoop(FusionOp region) {
    for (BlockArgument arg : region.getBlock().getArguments())
      if (isLow(arg))
        castEachRead(arg, Float32Type::get(region.getContext()), region.getLoc());
  }

  //===--------------------------------------------------------------------===//
  // 3. GEMM operands that are still f32 get a low copy
  //===--------------------------------------------------------------------===//

  bool isLow(Value v) { return tensorOf(v) && tensorOf(v).getElementType() == low; }

  StringAttr argAttr(unsigned i, StringRef name) {
    return func.getArgAttrOfType<StringAttr>(i, name);
  }

  /// A loop region with one cast, right after `v` is made.
  Value standaloneCast(Value v) {
    OpBuilder b(func.getContext());
    if (auto arg = dyn_cast<BlockArgument>(v))
      b.setInsertionPointToStart(arg.getOwner());
    else
      b.setInsertionPointAfter(v.getDefiningOp());
    ++standaloneCasts;
    return wrapInLoop(castOf(b, v.getLoc(), v, low).getDefiningOp()).getResult(0);
  }

  /// Rebuilds `fusion` with one more result: the low cast of `yielded` (a
  /// value of its body), made before the yield. Returns the new region (the
  /// old is erased).
  FusionOp addLowOutput(FusionOp fusion, Value yielded) {
    Operation *yield = fusion.getBlock().getTerminator();
    OpBuilder b(yield);
    Value lowered = castOf(b, fusion.getLoc(), yielded, low);
    SmallVector<Value> values(yield->getOperands());
    values.push_back(lowered);
    FusionOp grown = fusion.rebuild(fusion.getInputs(), values);
    for (unsigned r = 0; r < fusion.getNumResults(); ++r)
      fusion.getResult(r).replaceAllUsesWith(grown.getResult(r));
    // Copies already made of (or by) the old region's results.
    auto moved = [&](Value v) {
      auto r = dyn_cast<OpResult>(v);
      return r && r.getOwner() == fusion.getOperation() ? grown.getResult(r.getResultNumber()) : v;
    };
    llvm::DenseMap<Value, Value> remapped;
    for (auto [from, to] : lowCopy)
      remapped[moved(from)] = moved(to);
    lowCopy = std::move(remapped);
    fusion.erase();
    return grown;
  }

  /// The low copy of result `r` of a horizontal region's member: one more
  /// member output, and the horizontal region rebuilt to yield its members'
  /// results in member order.
  Value lowFromHorizontal(FusionOp horizontal, unsigned r) {
    Operation *hYield = horizontal.getBlock().getTerminator();
    auto memberResult = cast<OpResult>(hYield->getOperand(r));
    auto member = cast<FusionOp>(memberResult.getOwner());
    unsigned mr = memberResult.getResultNumber();
    Value inner = member.getBlock().getTerminator()->getOperand(mr);
    FusionOp grown = addLowOutput(member, inner);
    // The horizontal region's results in member order again.
    SmallVector<Value> yielded;
    for (Operation &m : horizontal.getBlock().without_terminator())
      llvm::append_range(yielded, m.getResults());
    // Old result k is the old yield's operand k (now a grown member's result).
    SmallVector<Value> oldYield(hYield->getOperands());
    FusionOp rebuilt = horizontal.rebuild(horizontal.getInputs(), yielded);
    for (auto [k, v] : llvm::enumerate(oldYield)) {
      unsigned at = llvm::find(yielded, v) - yielded.begin();
      horizontal.getResult(k).replaceAllUsesWith(rebuilt.getResult(at));
    }
    horizontal.erase();
    Value copy = grown.getResults().back();
    return rebuilt.getResult(llvm::find(yielded, copy) - yielded.begin());
  }

  /// A parameter's low copy: a state argument the optimizer's update writes
  /// each step (one more output of the member that updates the master) and
  /// that the runtime derives from the master on load (forge.copy_of).
  Value lowParameter(BlockArgument param) {
    unsigned i = param.getArgNumber();
    StringAttr name = argAttr(i, "forge.name");
    // fp8 keeps bf16 copies (the float8 ones are made each step).
    StringRef suffix = precision == "fp8" ? StringRef("bf16") : StringRef(precision);
    std::string copyName = (name.getValue() + "." + suffix).str();
    // @eval reads a copy only where a training step keeps it current.
    if (evalRoutine && !updatedCopies.contains(copyName))
      return standaloneCast(param);
    MLIRContext *ctx = func.getContext();
    Builder b(ctx);
    NamedAttrList attrs;
    attrs.set("forge.kind", b.getStringAttr("state"));
    attrs.set("forge.name", b.getStringAttr(copyName));
    attrs.set("forge.role", b.getStringAttr("low_precision_copy"));
    attrs.set("forge.copy_of", name);
    unsigned at = func.getNumArguments();
    (void)func.insertArgument(at, withElement(param, low), attrs.getDictionary(ctx),
                              param.getLoc());
    Value copy = func.getArgument(at);
    // Its update: the low cast of the master's new value.
    auto ret = cast<func::ReturnOp>(func.front().getTerminator());
    for (unsigned r = 0; r < ret.getNumOperands(); ++r) {
      auto updates = func.getResultAttrOfType<StringAttr>(r, "forge.updates");
      if (!updates || updates != name)
        continue;
      Value master = ret.getOperand(r);
      Value next;
      auto def = master.getDefiningOp<FusionOp>();
      if (def && def.getKind() == "horizontal")
        next = lowFromHorizontal(def, cast<OpResult>(master).getResultNumber());
      else if (def && def.getKind() == "loop" && !def.isViewRegion())
        next = addLowOutput(def, def.getBlock().getTerminator()->getOperand(
                                     cast<OpResult>(master).getResultNumber()))
                   .getResults()
                   .back();
      else
        next = standaloneCast(master);
      ret = cast<func::ReturnOp>(func.front().getTerminator());
      SmallVector<Value> values(ret.getOperands());
      values.push_back(next);
      ret->setOperands(values);
      unsigned resultIndex = values.size() - 1;
      (void)func.insertResult(resultIndex, next.getType(),
                              b.getDictionaryAttr(b.getNamedAttr("forge.updates",
                                                                 b.getStringAttr(copyName))));
      updatedCopies.insert(copyName);
      break;
    }
    return copy;
  }

  /// Whether a GEMM or a channels-last convolution reads `u` as an operand
  /// (in the low type once its operands are fixed).
  static bool lowOperandUse(OpOperand &u) {
    return (isGemm(u.getOwner()) && u.getOperandNumber() < 2) || isConvolution(u.getOwner());
  }

  /// Whether every reader of data input `arg` takes it low directly: a GEMM
  /// operand, or a view copy (a channels-last transpose of an image) that
  /// only GEMM and convolution operands read. Then the input itself becomes
  /// low and the view copies low: no cast kernel, half the view's bytes.
  bool inputReadLowOnly(BlockArgument arg) {
    StringAttr kind = argAttr(arg.getArgNumber(), "forge.kind");
    if (!kind || kind.getValue() != "input")
      return false;
    return llvm::all_of(arg.getUses(), [&](OpOperand &u) {
      Operation *user = u.getOwner();
      if (lowOperandUse(u))
        return true;
      return followsInput(user) && !isa<FusionOp>(user) && u.getOperandNumber() == 0 &&
             viewWantsLow.contains(user->getResult(0)) &&
             llvm::all_of(user->getResult(0).getUses(), lowOperandUse);
    });
  }

  /// A data input that only GEMMs and convolutions read (inputReadLowOnly):
  /// the input itself becomes low (the runtime's data loader converts f32
  /// arrays to it), so no kernel casts it.
  Value lowInput(BlockArgument arg) {
    arg.setType(withElement(arg, low));
    regionsFollow(arg);
    return arg;
  }

  /// The block arguments of the regions reading `v` take its (new) type: a
  /// gemm region's product reads it as an operand.
  static void regionsFollow(Value v) {
    for (OpOperand &u : v.getUses())
      if (auto fusion = dyn_cast<FusionOp>(u.getOwner()))
        fusion.getBlock().getArgument(u.getOperandNumber()).setType(v.getType());
  }

  /// lowInput for an input that inputReadLowOnly accepts: its view copies
  /// follow it, and so do the regions reading them (a weight gradient's gemm
  /// region reading the input's [rows, features] view).
  Value lowInputAndViews(BlockArgument arg) {
    lowInput(arg);
    for (Operation *user : arg.getUsers())
      if (followsInput(user) && !isa<FusionOp>(user)) {
        user->getResult(0).setType(withElement(user->getResult(0), low));
        regionsFollow(user->getResult(0));
      }
    return arg;
  }

  /// The low copy of f32 value `v` for a GEMM operand.
  Value lowCopyOf(Value v) {
    if (auto it = lowCopy.find(v); it != lowCopy.end())
      return it->second;
    Value copy;
    if (auto arg = dyn_cast<BlockArgument>(v)) {
      StringAttr kind = argAttr(arg.getArgNumber(), "forge.kind");
      if (kind && kind.getValue() == "parameter")
        copy = lowParameter(arg);
      else if (inputReadLowOnly(arg))
        copy = lowInputAndViews(arg);
      else
        copy = standaloneCast(v);
    } else if (Operation *def = v.getDefiningOp();
               def && followsInput(def) && !isa<FusionOp>(def) &&
               isa<BlockArgument>(def->getOperand(0)) &&
               inputReadLowOnly(cast<BlockArgument>(def->getOperand(0)))) {
      // A view of a data input that only low readers read: the input and its
      // views become low in place (the data loader converts the f32 array).
      lowInputAndViews(cast<BlockArgument>(def->getOperand(0)));
      copy = v;
    } else if (Operation *def = v.getDefiningOp(); def && followsInput(def) && !isa<FusionOp>(def)) {
      // A view of a master (a reshaped or transposed weight): the same view
      // of its low copy.
      Value source = lowCopyOf(def->getOperand(0)); // made next to its own source
      OpBuilder b(def);
      Operation *view = b.clone(*def);
      view->setOperand(0, source);
      view->getResult(0).setType(withElement(v, low));
      copy = view->getResult(0);
    } else if (auto fusion = v.getDefiningOp<FusionOp>();
               fusion && fusion.getKind() == "loop" && !fusion.isViewRegion()) {
      unsigned r = cast<OpResult>(v).getResultNumber();
      FusionOp grown = addLowOutput(fusion, fusion.getBlock().getTerminator()->getOperand(r));
      copy = grown.getResults().back();
      v = grown.getResult(r);
    } else if (Operation *def = v.getDefiningOp(); def && isLoosePointwise(def)) {
      // A loose pointwise op (a residual gradient's add) becomes a loop
      // region that writes its result and the low copy.
      FusionOp region = wrapInLoop(def);
      FusionOp grown = addLowOutput(region, region.getBlock().getTerminator()->getOperand(0));
      copy = grown.getResults().back();
      v = grown.getResult(0);
    } else {
      copy = standaloneCast(v);
    }
    lowCopy[v] = copy;
    return copy;
  }

  /// A top-level pointwise op of one float result at the shape every operand
  /// broadcasts to.
  static bool isLoosePointwise(Operation *op) {
    auto iface = dyn_cast<ForgeOpInterface>(op);
    if (!iface || iface.getFusionClass() != FusionClass::Elementwise ||
        op->getNumResults() != 1 || !isa<func::FuncOp>(op->getParentOp()) || isa<FusionOp>(op))
      return false;
    auto shape = tensorOf(op->getResult(0)).getShape();
    return llvm::all_of(op->getOperands(), [&](Value v) {
      auto t = tensorOf(v);
      auto joint = t ? broadcastShapes(t.getShape(), shape) : FailureOr<SmallVector<int64_t>>();
      return succeeded(joint) && ArrayRef<int64_t>(*joint) == shape;
    });
  }

  /// `op` as the one op of a loop region (its operands the region's inputs).
  FusionOp wrapInLoop(Operation *op) {
    FusionOp region = cloneIntoLoopRegion(op);
    op->getResult(0).replaceAllUsesWith(region.getResult(0));
    op->erase();
    return region;
  }

  /// Operand i of a GEMM (and, in a gemm region, the block argument its
  /// product reads) becomes `v`.
  static void setGemmOperand(Operation *gemm, unsigned i, Value v) {
    gemm->setOperand(i, v);
    if (auto fusion = dyn_cast<FusionOp>(gemm))
      fusion.getBlock().getArgument(i).setType(v.getType());
  }

  LogicalResult fixGemmOperands() {
    SmallVector<Operation *> gemms;
    for (Operation &op : func.front().without_terminator())
      if (isGemm(&op))
        gemms.push_back(&op);
    for (Operation *gemm : gemms) {
      for (unsigned i = 0; i < 2; ++i) {
        Value v = gemm->getOperand(i);
        if (isLow(v) || !isF32Tensor(v))
          continue;
        setGemmOperand(gemm, i, lowCopyOf(v));
      }
      // A bias row beside a low output has the output's type (cuBLASLt's
      // RELU_BIAS takes no f32 bias beside a bf16 D): its low copy.
      Operation *product = productOf(gemm);
      if (isLow(product->getResult(0)) && gemm->getNumOperands() > 2 &&
          product->getNumOperands() > 2 && isF32Tensor(gemm->getOperand(2)))
        setGemmOperand(gemm, 2, lowCopyOf(gemm->getOperand(2)));
      // Copies are made next to their sources, before their readers; checked.
      for (Value v : gemm->getOperands())
        if (Operation *def = v.getDefiningOp(); def && !def->isBeforeInBlock(gemm))
          return gemm->emitError("forge-assign-precision: an operand's low copy comes after "
                                 "its GEMM");
    }
    // Attention's and the convolutions' operands: cuDNN reads them low.
    for (Operation &op : func.front().without_terminator()) {
      if (!isa<AttentionOp, AttentionGradOp>(op) && !isConvolution(&op))
        continue;
      for (unsigned i = 0; i < op.getNumOperands(); ++i)
        if ((isConvolution(&op) || isAttentionLowOperand(&op, i)) &&
            isF32Tensor(op.getOperand(i)))
          op.setOperand(i, lowCopyOf(op.getOperand(i)));
    }
    // A loose add of a product (read by it alone) and a bias row, stored
    // low, becomes the product's BIAS epilogue in forge-select-library when
    // all three share a type (the add's operands must anyway): the product
    // is stored low (the epilogue adds in f32 before it rounds) and the row
    // is its low copy.
    for (auto add : llvm::to_vector(func.front().getOps<AddOp>())) {
      if (!isLow(add.getResult()))
        continue;
      for (unsigned i = 0; i < 2; ++i) {
        Value row = add->getOperand(i), product = add->getOperand(1 - i);
        auto t = tensorOf(row);
        Operation *def = product.getDefiningOp();
        if (!t || t.getRank() != 1 || !isF32Tensor(row) || !isF32Tensor(product) || !def ||
            !isa<MatMulOp, GemmOp>(def) || !product.hasOneUse() || !isLow(def->getOperand(0)))
          continue;
        product.setType(withElement(product, low));
        add->setOperand(i, lowCopyOf(row));
        break;
      }
    }
    return success();
  }

  //===--------------------------------------------------------------------===//
  // 4. Float8 GEMMs (precision=fp8)
  //===--------------------------------------------------------------------===//

  /// E4M3FN's largest finite value, and the floor of an amax (an all-zero
  /// tensor still divides by it: its copy is zeros).
  static constexpr double kE4M3Max = 448.0, kE5M2Max = 57344.0, kAmaxFloor = 1e-30;
  Value e4m3Max, e5m2Max, amaxFloor; // f32 scalars at the function's entry
  struct Quantized {
    Value q, amax;
  };
  /// Float8 copies by (the value they copy, seen through reshapes; E5M2):
  /// every view of one tensor shares its amax and its copy.
  llvm::MapVector<std::pair<Value, unsigned>, Quantized> quantized;
  /// Transposed copies of 2-d values, by (value, E5M2).
  llvm::MapVector<std::pair<Value, unsigned>, Quantized> transposedCopies;
  int scaledGemms = 0, gradientGemms = 0; // forward products, their gradient GEMMs
  size_t forwardCopies = 0;

  static double float8Max(bool e5m2) { return e5m2 ? kE5M2Max : kE4M3Max; }

  /// The f32 scalar of a format's largest value, made at the entry once.
  Value float8MaxValue(bool e5m2) {
    if (!e5m2)
      return e4m3Max;
    if (!e5m2Max) {
      OpBuilder b(func.getContext());
      b.setInsertionPointAfter(e4m3Max.getDefiningOp());
      e5m2Max = scalarConstant(b, func.getLoc(), kE5M2Max);
    }
    return e5m2Max;
  }

  /// `v` seen through reshapes (the tensor whose bytes they view).
  static Value viewRoot(Value v) {
    while (auto r = v.getDefiningOp<ReshapeOp>())
      v = r.getInput();
    return v;
  }

  RankedTensorType scalarF32() { return RankedTensorType::get({}, Float32Type::get(func.getContext())); }

  Value scalarConstant(OpBuilder &b, Location loc, double v) {
    return b.create<ConstantOp>(loc, scalarF32(),
                                DenseElementsAttr::get(scalarF32(), static_cast<float>(v)));
  }

  /// v (bf16 or f32) in f32, inside a region body.
  Value inF32(OpBuilder &b, Location loc, Value v) {
    return isF32Tensor(v) ? v : castOf(b, loc, v, Float32Type::get(v.getContext()));
  }

  /// A multi_reduce region at b's point: max(|x|, floor) over all of `x`
  /// (an amax; of a history: its largest entry). b moves after it.
  Value amaxOf(OpBuilder &b, Location loc, Value x) {
    auto type = tensorOf(x);
    SmallVector<int64_t> axes(type.getRank());
    std::iota(axes.begin(), axes.end(), 0);
    auto region = b.create<FusionOp>(loc, TypeRange{scalarF32()}, ValueRange{x, amaxFloor},
                                     b.getStringAttr("multi_reduce"));
    Block *body = b.createBlock(&region.getBody(), {}, {x.getType(), scalarF32()}, {loc, loc});
    OpBuilder in = OpBuilder::atBlockEnd(body);
    Value f = inF32(in, loc, body->getArgument(0));
    Value abs = in.create<AbsOp>(loc, f.getType(), f);
    Value floored = in.create<MaxOp>(loc, f.getType(), abs, body->getArgument(1));
    Value amax = in.create<ReduceMaxOp>(loc, scalarF32(), floored, in.getDenseI64ArrayAttr(axes),
                                        in.getBoolAttr(false));
    in.create<YieldOp>(loc, ValueRange{amax});
    b.setInsertionPointAfter(region);
    return region.getResult(0);
  }

  /// A loop region at b's point writing saturate(v * max / amax) in E4M3
  /// (max 448) or E5M2 (57344). b moves after it.
  Value castFloat8(OpBuilder &b, Location loc, Value v, Value amax, bool e5m2) {
    auto type = tensorOf(v);
    Type f8 = e5m2 ? Type(Float8E5M2Type::get(func.getContext()))
                   : Type(Float8E4M3FNType::get(func.getContext()));
    auto region = b.create<FusionOp>(loc, TypeRange{type.clone(f8)},
                                     ValueRange{v, amax, float8MaxValue(e5m2)},
                                     b.getStringAttr("loop"));
    Block *body = b.createBlock(&region.getBody(), {}, {v.getType(), scalarF32(), scalarF32()},
                                {loc, loc, loc});
    OpBuilder in = OpBuilder::atBlockEnd(body);
    Value x = inF32(in, loc, body->getArgument(0));
    Value scaled = in.create<MulOp>(loc, x.getType(), x, body->getArgument(2));
    Value unit = in.create<DivOp>(loc, x.getType(), scaled, body->getArgument(1));
    in.create<YieldOp>(loc, ValueRange{castOf(in, loc, unit, f8)});
    b.setInsertionPointAfter(region);
    return region.getResult(0);
  }

  /// The E4M3 (or E5M2) copy of `v` and the amax it is scaled by. Current
  /// scaling (and every argument): v's own amax, a multi_reduce right after
  /// v (at the entry for an argument), then the cast. Delayed scaling (an
  /// activation or a gradient): the largest amax of v's history, read at the
  /// entry, so the cast follows v at once; v's own amax comes after the cast
  /// and only fills this step's slot of the history (updateHistories).
  /// Views of one tensor share its copy (reshaped to the view's shape).
  Quantized quantize(Value v, bool e5m2 = false) {
    auto key = std::make_pair(viewRoot(v), unsigned(e5m2));
    if (auto it = quantized.find(key); it != quantized.end()) {
      Quantized known = it->second;
      auto want = tensorOf(v);
      if (tensorOf(known.q).getShape() == want.getShape())
        return known;
      // Another view of the same tensor: the copy viewed alike, after both.
      OpBuilder b(func.getContext());
      Operation *qDef = known.q.getDefiningOp(), *vDef = v.getDefiningOp();
      b.setInsertionPointAfter(vDef && qDef->isBeforeInBlock(vDef) ? vDef : qDef);
      Value view = b.create<ReshapeOp>(v.getLoc(), want.clone(tensorOf(known.q).getElementType()),
                                       known.q, b.getDenseI64ArrayAttr(want.getShape()));
      return Quantized{view, known.amax};
    }
    OpBuilder b(func.getContext());
    Location loc = v.getLoc();
    if (Operation *def = v.getDefiningOp())
      b.setInsertionPointAfter(def);
    else
      b.setInsertionPointAfter(amaxFloor.getDefiningOp());
    if (fp8Scaling == "delayed" && stepArg && !isa<BlockArgument>(v)) {
      BlockArgument history = historyArgument(v, e5m2);
      OpBuilder entry(func.getContext());
      entry.setInsertionPointAfter(amaxFloor.getDefiningOp());
      Value scale = amaxOf(entry, loc, history);
      entryAmaxes.push_back(scale);
      Value q = castFloat8(b, loc, v, scale, e5m2);
      histories.push_back({history, amaxOf(b, loc, v)});
      return quantized[key] = Quantized{q, scale};
    }
    Value amax = amaxOf(b, loc, v);
    if (isa<BlockArgument>(v))
      entryAmaxes.push_back(amax);
    Value q = castFloat8(b, loc, v, amax, e5m2);
    return quantized[key] = Quantized{q, amax};
  }

  /// The float8 copy of 2-d `v` transposed ([cols, rows]): the transpose
  /// of v's copy (bytes moved, 1 + 1 per element: cheaper than transposing
  /// v and casting again), with its amax.
  Quantized quantizeTransposed(Value v, bool e5m2) {
    auto key = std::make_pair(v, unsigned(e5m2));
    if (auto it = transposedCopies.find(key); it != transposedCopies.end())
      return it->second;
    Quantized plain = quantize(v, e5m2);
    OpBuilder b(func.getContext());
    b.setInsertionPointAfter(plain.q.getDefiningOp());
    auto t = tensorOf(plain.q);
    Value q = b.create<TransposeOp>(v.getLoc(), t.clone({t.getDimSize(1), t.getDimSize(0)}),
                                    plain.q, b.getDenseI64ArrayAttr({1, 0}));
    return transposedCopies[key] = Quantized{q, plain.amax};
  }

  //===--------------------------------------------------------------------===//
  // 4b. Delayed scaling (fp8-scaling=delayed)
  //===--------------------------------------------------------------------===//

  struct History {
    BlockArgument state;
    Value amax; // this step's
  };
  SmallVector<History> histories;
  SmallVector<Value> entryAmaxes; // multi_reduce results at the entry, merged at the end
  BlockArgument stepArg;          // forge.step (1 for the first step)
  llvm::StringSet<> historyNames;

  /// The name of v's history: the ONNX node that made it (its location's
  /// first name; a gradient's, the forward node's, with ".grad"), else
  /// "activation<k>"; made unique by a ".<k>" suffix. The same in every
  /// routine built from one graph (a length bucket's step shares its
  /// histories with the plain step's by name).
  std::string historyName(Value v, bool gradient) {
    std::string base;
    v.getLoc()->walk([&](Location l) {
      if (auto named = dyn_cast<NameLoc>(l); named && base.empty())
        base = named.getName().str();
      return base.empty() ? WalkResult::advance() : WalkResult::interrupt();
    });
    if (base.empty())
      base = "activation" + std::to_string(histories.size());
    if (gradient)
      base += ".grad";
    std::string name = base + ".fp8_amax_history";
    if (historyNames.contains(name))
      name = base + "." + std::to_string(histories.size()) + ".fp8_amax_history";
    historyNames.insert(name);
    return name;
  }

  /// v's amax history: a state argument [H] f32, a ring whose slot
  /// (step - 1) mod H the step writes, initially [max, 0, ...] (its maximum,
  /// the format's largest value, 448 or 57344, scales by 1 until the first
  /// step's amax replaces it).
  BlockArgument historyArgument(Value v, bool e5m2) {
    MLIRContext *ctx = func.getContext();
    Builder b(ctx);
    auto type = RankedTensorType::get({static_cast<int64_t>(fp8History)}, b.getF32Type());
    SmallVector<float> init(fp8History, 0.0f);
    init[0] = static_cast<float>(float8Max(e5m2));
    NamedAttrList attrs;
    attrs.set("forge.kind", b.getStringAttr("state"));
    attrs.set("forge.name", b.getStringAttr(historyName(v, e5m2)));
    attrs.set("forge.role", b.getStringAttr("fp8_amax_history"));
    attrs.set("forge.initial_value", DenseElementsAttr::get(type, ArrayRef<float>(init)));
    unsigned at = func.getNumArguments();
    (void)func.insertArgument(at, type, attrs.getDictionary(ctx), v.getLoc());
    return func.getArgument(at);
  }

  /// Each history with this step's amax in its slot: a loop region per
  /// history, all in one horizontal region before the return (one launch),
  /// returned as the histories' updates.
  void updateHistories() {
    if (histories.empty())
      return;
    MLIRContext *ctx = func.getContext();
    Location loc = func.getLoc();
    const int64_t h = fp8History;
    auto histType = RankedTensorType::get({h}, Float32Type::get(ctx));
    OpBuilder top = OpBuilder::atBlockBegin(&func.front());
    Value one = scalarConstant(top, loc, 1.0), length = scalarConstant(top, loc, double(h));
    SmallVector<float> slots(h);
    std::iota(slots.begin(), slots.end(), 0.0f);
    Value iota = top.create<ConstantOp>(loc, histType,
                                        DenseElementsAttr::get(histType, ArrayRef<float>(slots)));
    auto ret = cast<func::ReturnOp>(func.front().getTerminator());
    OpBuilder b(ret);
    // With data parallelism every rank records the largest amax of the step's
    // global batch (one collective of the scalars), so that the ranks keep
    // equal histories and scale alike (and a resume restores them all).
    SmallVector<Value> amaxes;
    for (const History &hist : histories)
      amaxes.push_back(hist.amax);
    int64_t dpSize = 0;
    func.walk([&](AllReduceOp op) {
      if (op.getGroup() == "dp")
        dpSize = op.getSize();
    });
    if (dpSize > 0) {
      auto reduced = b.create<AllReduceOp>(loc, ValueRange(amaxes).getTypes(), amaxes, "dp",
                                           "max", dpSize);
      amaxes.assign(reduced.getResults().begin(), reduced.getResults().end());
    }
    SmallVector<FusionOp> updates;
    SmallVector<Value> results(ret.getOperands());
    for (auto [hist, amax] : llvm::zip(histories, amaxes)) {
      auto region = b.create<FusionOp>(
          loc, TypeRange{histType}, ValueRange{hist.state, amax, stepArg, one, length, iota},
          b.getStringAttr("loop"));
      Type s = scalarF32();
      Block *body = b.createBlock(&region.getBody(), {},
                                  {histType, s, s, s, s, histType},
                                  SmallVector<Location>(6, loc));
      OpBuilder in = OpBuilder::atBlockEnd(body);
      auto arg = [&](unsigned i) { return body->getArgument(i); };
      // Slot i is this step's when (step - 1 - i) / H is whole (exact in f32
      // below 2^24 steps); each value at the iteration shape, as a loop
      // region's body has them.
      Value x = in.create<SubOp>(loc, histType, in.create<SubOp>(loc, histType, arg(2), arg(5)),
                                 arg(3));
      Value r = in.create<DivOp>(loc, histType, x, arg(4));
      Value here = in.create<EqualOp>(loc, histType.clone(in.getI1Type()),
                                      in.create<FloorOp>(loc, histType, r), r);
      Value next = in.create<WhereOp>(loc, histType, here, arg(1), arg(0));
      in.create<YieldOp>(loc, ValueRange{next});
      b.setInsertionPoint(ret);
      updates.push_back(region);
      results.push_back(region.getResult(0));
    }
    ret->setOperands(results);
    unsigned first = func.getNumResults();
    for (auto [i, hist] : llvm::enumerate(histories))
      (void)func.insertResult(
          first + i, histType,
          DictionaryAttr::get(ctx, {NamedAttribute(
                                       StringAttr::get(ctx, "forge.updates"),
                                       func.getArgAttr(hist.state.getArgNumber(), "forge.name"))}));
    if (updates.size() >= 2)
      outlineHorizontal(updates);
  }

  /// Whether a product of lhs [M, K] and rhs [N, K] (K-major both) in bf16
  /// suits a float8 GEMM: K and N multiples of 16, an f32 or bf16 result.
  bool float8Layout(Value lhs, Value rhs, bool transA, bool transB, Value result) {
    auto l = tensorOf(lhs), r = tensorOf(rhs);
    Type out = tensorOf(result).getElementType();
    return !transA && transB && l && r && r.getRank() == 2 && l.getRank() >= 2 &&
           l.getElementType().isBF16() && r.getElementType().isBF16() &&
           l.getShape().back() % 16 == 0 && r.getDimSize(0) % 16 == 0 &&
           (out.isF32() || out.isBF16());
  }

  /// Whether `v` reaches a loss (through views): the loss head's matmul,
  /// which forge-chunk-cross-entropy splits.
  static bool feedsLoss(Value v) {
    for (Operation *user : v.getUsers()) {
      if (isa<CrossEntropyOp, CrossEntropyGradOp, LogSoftmaxOp, SoftmaxOp>(user))
        return true;
      if (isa<ReshapeOp>(user) && feedsLoss(user->getResult(0)))
        return true;
    }
    return false;
  }

  /// alpha * (q_a * amax_a / 448) (q_b * amax_b / 448) [+ beta C].
  Value scaledProduct(OpBuilder &b, Location loc, Type result, Value lhs, Value rhs, Value c,
                      double alpha, double beta) {
    ++scaledGemms;
    Quantized a = quantize(lhs), w = quantize(rhs); // in this order: the IR's
    return scaledGemm(b, loc, result, a, false, w, false, c, alpha, beta);
  }

  /// The scaled_gemm of copies `a` (lhs [M, K]) and `w` (rhs [N, K]) in
  /// their formats: alpha / (max_a * max_w) multiplies back each operand's
  /// scale max / amax (the amaxes are the scale inputs).
  Value scaledGemm(OpBuilder &b, Location loc, Type result, Quantized a, bool aE5M2, Quantized w,
                   bool wE5M2, Value c, double alpha, double beta) {
    return b.create<ScaledGemmOp>(loc, result, a.q, w.q, a.amax, w.amax, c, b.getBoolAttr(false),
                                  b.getBoolAttr(true),
                                  b.getF64FloatAttr(alpha / (float8Max(aE5M2) * float8Max(wE5M2))),
                                  b.getF64FloatAttr(beta));
  }

  /// A standalone matmul (lhs [..., K], rhs [N, K]) as a scaled_gemm over the
  /// lhs's rows; a bf16 bias row that a loose add puts on it becomes the
  /// GEMM's bias (cuBLASLt's BIAS epilogue, bf16 beside float8).
  void quantizeMatMul(MatMulOp mm) {
    Value lhs = mm.getLhs(), rhs = mm.getRhs(), out = mm.getResult();
    auto lt = tensorOf(lhs), ot = tensorOf(out);
    int64_t k = lt.getShape().back(), m = lt.getNumElements() / k;
    int64_t n = tensorOf(rhs).getDimSize(0);
    OpBuilder b(mm);
    Location loc = mm.getLoc();
    Value rows = lhs;
    if (lt.getRank() != 2)
      rows = b.create<ReshapeOp>(loc, lt.clone({m, k}), lhs, b.getDenseI64ArrayAttr({m, k}));
    // The loose add of a bias row (fixGemmOperands made both low).
    AddOp biasAdd;
    Value row;
    if (out.hasOneUse())
      if (auto add = dyn_cast<AddOp>(*out.getUsers().begin()))
        for (Value other : add->getOperands())
          if (other != out && tensorOf(other) && tensorOf(other).getRank() == 1 &&
              tensorOf(other).getDimSize(0) == n && tensorOf(other).getElementType().isBF16() &&
              tensorOf(add.getResult()).getElementType().isBF16() &&
              other.getDefiningOp() != mm && (!other.getDefiningOp() ||
                                             other.getDefiningOp()->isBeforeInBlock(mm))) {
            biasAdd = add;
            row = other;
          }
    Type elem = ot.getElementType();
    Value product = scaledProduct(b, loc, RankedTensorType::get({m, n}, elem), rows, rhs, row,
                                  1.0, row ? 1.0 : 0.0);
    if (ot.getRank() != 2)
      product = b.create<ReshapeOp>(loc, ot, product, b.getDenseI64ArrayAttr(ot.getShape()));
    if (biasAdd) {
      biasAdd.getResult().replaceAllUsesWith(product);
      biasAdd.erase();
    } else {
      out.replaceAllUsesWith(product);
    }
    mm.erase();
  }

  /// A gemm region whose product is a gemm: the same region over the
  /// float8 copies and their amaxes (arguments 2 and 3), the product a
  /// scaled_gemm. Epilogues that read no f32 bias row (cuBLASLt takes a
  /// bf16 one only beside float8): relu, gelu (and their aux outputs).
  void quantizeGemmRegion(FusionOp region) {
    auto gemm = cast<GemmOp>(&region.getBlock().front());
    Quantized a = quantize(region.getInputs()[0]), w = quantize(region.getInputs()[1]);
    SmallVector<Value> inputs{a.q, w.q, a.amax, w.amax};
    llvm::append_range(inputs, region.getInputs().drop_front(2));
    FusionOp rebuilt = region.rebuild(inputs, region.getBlock().getTerminator()->getOperands());
    Block &body = rebuilt.getBlock();
    body.getArgument(0).setType(a.q.getType());
    body.getArgument(1).setType(w.q.getType());
    body.insertArgument(2u, scalarF32(), region.getLoc());
    body.insertArgument(3u, scalarF32(), region.getLoc());
    OpBuilder in(gemm);
    ++scaledGemms;
    Value product = scaledGemm(in, gemm.getLoc(), gemm.getType(),
                               Quantized{body.getArgument(0), body.getArgument(2)}, false,
                               Quantized{body.getArgument(1), body.getArgument(3)}, false,
                               gemm.getC(), gemm.getAlpha().convertToDouble(),
                               gemm.getBeta().convertToDouble());
    gemm.getResult().replaceAllUsesWith(product);
    gemm.erase();
    region.replaceAllUsesWith(rebuilt.getResults());
    region.erase();
  }

  void quantizeGemms() {
    stepArg = nullptr;
    for (BlockArgument arg : func.getArguments())
      if (StringAttr name = argAttr(arg.getArgNumber(), "forge.name");
          name && name.getValue() == "forge.step" && isF32Tensor(arg))
        stepArg = arg;
    OpBuilder b = OpBuilder::atBlockBegin(&func.front());
    e4m3Max = scalarConstant(b, func.getLoc(), kE4M3Max);
    amaxFloor = scalarConstant(b, func.getLoc(), kAmaxFloor);
    // Collected first: a rewrite erases the loose add after its matmul.
    SmallVector<Operation *> candidates;
    for (Operation &op : func.front().without_terminator())
      if (isa<MatMulOp, GemmOp, FusionOp>(op))
        candidates.push_back(&op);
    for (Operation *opp : candidates) {
      Operation &op = *opp;
      if (auto mm = dyn_cast<MatMulOp>(&op)) {
        if (float8Layout(mm.getLhs(), mm.getRhs(), mm.getTransA(), mm.getTransB(), mm.getResult()) &&
            !feedsLoss(mm.getResult()))
          quantizeMatMul(mm);
        continue;
      }
      if (auto gemm = dyn_cast<GemmOp>(&op)) {
        // A loose gemm: its C absent, a bf16 bias row or a full C of its type.
        Value c = gemm.getC();
        bool cFits = !c || (tensorOf(c).getRank() == 1 ? tensorOf(c).getElementType().isBF16()
                                                      : tensorOf(c).getShape() ==
                                                            tensorOf(gemm.getResult()).getShape());
        if (cFits && float8Layout(gemm.getA(), gemm.getB(), gemm.getTransA(), gemm.getTransB(),
                                  gemm.getResult())) {
          OpBuilder b(gemm);
          Value product = scaledProduct(b, gemm.getLoc(), gemm.getType(), gemm.getA(), gemm.getB(),
                                        c, gemm.getAlpha().convertToDouble(),
                                        gemm.getBeta().convertToDouble());
          gemm.getResult().replaceAllUsesWith(product);
          gemm.erase();
        }
        continue;
      }
      auto region = dyn_cast<FusionOp>(&op);
      if (!region || region.getKind() != "gemm")
        continue;
      auto gemm = dyn_cast<GemmOp>(&region.getBlock().front());
      Operation *epilogue = gemm ? gemm->getNextNode() : nullptr;
      if (gemm && isa<ReluOp, GeluOp>(epilogue) &&
          float8Layout(gemm.getA(), gemm.getB(), gemm.getTransA(), gemm.getTransB(),
                       gemm.getResult()) &&
          (!gemm.getC() || tensorOf(gemm.getC()).getElementType().isBF16()))
        quantizeGemmRegion(region);
    }
    forwardCopies = quantized.size();
    if (fp8Gradients == "e5m2")
      quantizeGradientGemms();
    updateHistories();
    // The weights' amaxes and the histories' maxima (arguments, read at the
    // entry): one multi_reduce.
    mergeEntryAmaxes();
  }

  /// fp8-gradients=e5m2: the backward of each float8 product Y = X W^T,
  /// found as the loose GEMMs that read exactly one of the tensors the
  /// forward's float8 products copied (X or W, through views): dX = dY W
  /// (transB false) and dW = dY^T X (transA true). The other operand is the
  /// gradient dY: its copy is E5M2 (range: a gradient's values span more
  /// binades than 4 bits of precision would cover), the forward tensor's
  /// E4M3 with the amax the forward found. Operands the float8 layout reads
  /// otherwise than stored (W for dX; dY and X for dW) get transposed copies.
  /// E5M2 beside E5M2 (no cuBLASLt kernel) cannot arise: one operand is
  /// always a forward tensor. GEMMs with a C keep bf16 (the accumulation
  /// loop's `acc + gemm` stays a separate add, as before).
  void quantizeGradientGemms() {
    llvm::DenseSet<Value> forwardTensors;
    for (auto &[key, copy] : quantized)
      if (!key.second)
        forwardTensors.insert(key.first);
    auto bf16Matrix = [](Value v) {
      auto t = tensorOf(v);
      return t && t.getRank() == 2 && t.getElementType().isBF16();
    };
    for (auto gemm : llvm::to_vector(func.front().getOps<GemmOp>())) {
      Value a = gemm.getA(), bOp = gemm.getB();
      bool aForward = forwardTensors.contains(viewRoot(a));
      bool bForward = forwardTensors.contains(viewRoot(bOp));
      Type out = tensorOf(gemm.getResult()).getElementType();
      if (aForward == bForward || gemm.getC() || !bf16Matrix(a) || !bf16Matrix(bOp) ||
          !(out.isF32() || out.isBF16()))
        continue;
      Value grad = aForward ? bOp : a;
      if (isa<BlockArgument>(viewRoot(grad)))
        continue;
      // The product [M, N] over K, as the float8 layout reads it.
      auto at = tensorOf(a), bt = tensorOf(bOp);
      bool transA = gemm.getTransA(), transB = gemm.getTransB();
      int64_t k = transA ? at.getDimSize(0) : at.getDimSize(1);
      int64_t n = transB ? bt.getDimSize(0) : bt.getDimSize(1);
      // As the forward's: rows of K (every copy, transposed ones too, is
      // K-major) and the output's N multiples of 16.
      if (k % 16 != 0 || n % 16 != 0)
        continue;
      bool aE5M2 = !aForward, bE5M2 = !bForward;
      Quantized lhs = transA ? quantizeTransposed(a, aE5M2) : quantize(a, aE5M2);
      Quantized rhs = transB ? quantize(bOp, bE5M2) : quantizeTransposed(bOp, bE5M2);
      OpBuilder b(gemm);
      ++gradientGemms;
      Value product = scaledGemm(b, gemm.getLoc(), gemm.getType(), lhs, aE5M2, rhs, bE5M2,
                                 Value(), gemm.getAlpha().convertToDouble(), 0.0);
      gemm.getResult().replaceAllUsesWith(product);
      gemm.erase();
    }
  }

  /// The entry's multi_reduce regions (the arguments' amaxes, the
  /// histories' maxima) as one launch: their bodies side by side, right
  /// after the constants (every input is an argument), before every reader.
  void mergeEntryAmaxes() {
    if (entryAmaxes.size() < 2)
      return;
    SmallVector<FusionOp> regions;
    SmallVector<Value> inputs;
    SmallVector<Type> types;
    for (Value amax : entryAmaxes) {
      auto r = amax.getDefiningOp<FusionOp>();
      regions.push_back(r);
      inputs.push_back(r.getInputs()[0]);
      types.push_back(r.getResult(0).getType());
    }
    inputs.push_back(amaxFloor);
    OpBuilder b(func.getContext());
    b.setInsertionPointAfter(amaxFloor.getDefiningOp());
    Location loc = regions.front().getLoc();
    auto merged = b.create<FusionOp>(loc, types, inputs, b.getStringAttr("multi_reduce"));
    SmallVector<Type> argTypes(ValueRange(inputs).getTypes());
    Block *body = b.createBlock(&merged.getBody(), {}, argTypes,
                                SmallVector<Location>(inputs.size(), loc));
    OpBuilder in = OpBuilder::atBlockEnd(body);
    SmallVector<Value> yielded;
    for (auto [i, r] : llvm::enumerate(regions)) {
      IRMapping map;
      map.map(r.getBlock().getArgument(0), body->getArgument(i));
      map.map(r.getBlock().getArgument(1), body->getArguments().back());
      for (Operation &op : r.getBlock().without_terminator())
        in.clone(op, map);
      yielded.push_back(map.lookup(r.getBlock().getTerminator()->getOperand(0)));
    }
    in.create<YieldOp>(loc, yielded);
    for (auto [i, r] : llvm::enumerate(regions)) {
      r.getResult(0).replaceAllUsesWith(merged.getResult(i));
      r.erase();
    }
  }

  void syncFunctionType() {
    auto ret = cast<func::ReturnOp>(func.front().getTerminator());
    func.setType(FunctionType::get(func.getContext(), func.front().getArgumentTypes(),
                                   ret.getOperandTypes()));
  }
};

} // namespace
