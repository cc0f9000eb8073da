//===- AugmentInputs.cpp - image inputs as pixels, normalized in the graph --===//
//
// forge-augment-inputs (forgec --augment): the named rank-4 float input
// [B, C, H, W] becomes, with `pixels`, a u8 [B, H, W, C] argument followed by
//   cast -> mul by 1/(255 std) -> add (-mean / std) -> transpose [0, 3, 1, 2]
// (one multiply-add with [C] coefficients, the channels last so that they
// broadcast), and without `pixels` the float input itself is normalized with
// [C, 1, 1] coefficients; `flip` mirrors training samples along the width
// (randomFlip). With a canvas, the u8 argument is [B, Hc, Wc, C] and a new
// argument INPUT.crop [B, 6] follows it: forge.resized_crop makes the [B, H, W, C]
// pixels the rest then normalizes. Invariants: the uses of the old argument see a value
// of its type; the argument keeps its forge.name (the data pipeline feeds it by
// name); nothing is folded here (the pipeline's graph cleanup does).
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "forge/Dialect/ForgeBuilder.h"
#include "mlir/IR/Builders.h"

namespace mlir::forge {
#define GEN_PASS_DEF_AUGMENTINPUTS
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

/// where(draw > 1, x mirrored along `widthAxis`, x), draw = dropout(ones[B, 1, 1, 1],
/// ratio 1/2): 2 or 0 per sample in train_step (Philox, keyed by the step), 1 in eval.
Value randomFlip(OpBuilder &b, Location loc, Value x, int64_t widthAxis) {
  auto type = cast<RankedTensorType>(x.getType());
  auto drawType = RankedTensorType::get({type.getDimSize(0), 1, 1, 1}, b.getF32Type());
  Value ones = b.create<ConstantOp>(loc, DenseElementsAttr::get(drawType, 1.0f));
  constexpr int64_t kFlipSeed = 0x466c6970; // "Flip": the draws' own Philox key
  auto draw = b.create<DropoutOp>(loc, ones, b.getF64FloatAttr(0.5), b.getI64IntegerAttr(kFlipSeed));
  Value half = b.create<ConstantOp>(
      loc, DenseElementsAttr::get(RankedTensorType::get({}, b.getF32Type()), 1.5f));
  Value mirror = b.create<GreaterOp>(loc, draw.getResult(), half);
  SmallVector<int64_t> starts(4, 0), ends(type.getShape()), steps(4, 1);
  starts[widthAxis] = type.getDimSize(widthAxis) - 1;
  ends[widthAxis] = -1;
  steps[widthAxis] = -1;
  Value mirrored = b.create<SliceOp>(loc, type, x, b.getDenseI64ArrayAttr(starts),
                                     b.getDenseI64ArrayAttr(ends), b.getDenseI64ArrayAttr(steps));
  return b.create<WhereOp>(loc, mirror, mirrored, x);
}

struct AugmentInputsPass : public mlir::forge::impl::AugmentInputsBase<AugmentInputsPass> {
  using AugmentInputsBase::AugmentInputsBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (input.empty())
      return;
    int index = -1;
    for (unsigned i = 0; i < func.getNumArguments(); ++i)
      if (auto name = func.getArgAttrOfType<StringAttr>(i, "forge.name");
          name && name.getValue() == input)
        index = static_cast<int>(i);
    if (index < 0)
      return;
    Value arg = func.getArgument(static_cast<unsigned>(index));
    auto type = dyn_cast<RankedTensorType>(arg.getType());
    auto fail = [&](const Twine &why) {
      func.emitError() << "--augment: input '" << input << "' " << why;
      signalPassFailure();
    };
    if (!type || type.getRank() != 4 || !type.hasStaticShape() ||
        !isa<FloatType>(type.getElementType()))
      return fail("must be a static rank-4 float tensor [B, C, H, W], not " +
                  (type ? Twine("a tensor of rank ") + Twine(type.getRank()) : Twine("that")));
    const int64_t channels = type.getDimSize(1);
    const SmallVector<double> means(mean.begin(), mean.end()), stds(stddev.begin(), stddev.end());
    for (const auto &[what, list] : {std::pair<const char *, ArrayRef<double>>{"mean", means},
                                     std::pair<const char *, ArrayRef<double>>{"std", stds}})
      if (!list.empty() && static_cast<int64_t>(list.size()) != channels)
        return fail(Twine("has ") + Twine(channels) + " channels but " + what + " has " +
                    Twine(list.size()) + " values");
    for (double s : stds)
      if (!(s > 0))
        return fail("std values must be positive");
    const bool canvas = canvasHeight != 0 || canvasWidth != 0;
    if (canvas && (!pixels || canvasHeight < 1 || canvasWidth < 1))
      return fail("canvas=HxW needs pixels and a positive height and width");
    if (!pixels && means.empty() && stds.empty() && !flip)
      return;

    // x' = x * scale[c] + shift[c]: scale = 1 / (255^pixels * std), shift = -mean / std.
    const double unit = pixels ? 1.0 / 255.0 : 1.0;
    SmallVector<float> scale, shift;
    for (int64_t c = 0; c < channels; ++c) {
      const double s = stds.empty() ? 1.0 : stds[c], m = means.empty() ? 0.0 : means[c];
      scale.push_back(static_cast<float>(unit / s));
      shift.push_back(static_cast<float>(-m / s));
    }
    SmallVector<OpOperand *> uses; // the model's, before the new ops add their own
    for (OpOperand &use : arg.getUses())
      uses.push_back(&use);
    OpBuilder b(func.getContext());
    b.setInsertionPointToStart(&func.getBody().front());
    Location loc = arg.getLoc();
    ForgeBuilder fb(b, loc);
    Type element = type.getElementType();
    Value x = arg;
    auto coefficients = [&](ArrayRef<float> values, ArrayRef<int64_t> shape) -> Value {
      auto t = RankedTensorType::get(shape, b.getF32Type());
      return fb.castTo(b.create<ConstantOp>(loc, DenseElementsAttr::get(t, values)), element);
    };
    SmallVector<int64_t> coefShape = pixels ? SmallVector<int64_t>{channels}
                                            : SmallVector<int64_t>{channels, 1, 1};
    if (pixels) {
      const int64_t batch = type.getDimSize(0), height = type.getDimSize(2),
                    width = type.getDimSize(3);
      auto u8 = RankedTensorType::get(
          {batch, canvas ? canvasHeight : height, canvas ? canvasWidth : width, channels},
          IntegerType::get(func.getContext(), 8, IntegerType::Unsigned));
      arg.setType(u8);
      auto fnType = func.getFunctionType();
      SmallVector<Type> inputs(fnType.getInputs());
      inputs[static_cast<size_t>(index)] = u8;
      func.setFunctionType(FunctionType::get(func.getContext(), inputs, fnType.getResults()));
      x = arg;
      if (canvas) { // the boxes, right after the canvas; the crop in f32 [0, 255]
        auto boxType = RankedTensorType::get({batch, 6}, b.getF32Type());
        const unsigned at = static_cast<unsigned>(index) + 1;
        func.insertArgument(
            at, boxType,
            b.getDictionaryAttr(b.getNamedAttr("forge.name", b.getStringAttr(input + ".crop"))),
            loc);
        x = b.create<ResizedCropOp>(loc, arg, func.getArgument(at), b.getI64IntegerAttr(height),
                                    b.getI64IntegerAttr(width));
      }
      x = fb.castTo(x, element);
    }
    const bool unitScale = llvm::all_of(scale, [](float v) { return v == 1.0f; });
    const bool zeroShift = llvm::all_of(shift, [](float v) { return v == 0.0f; });
    Value y = x;
    if (!unitScale) {
      Value s = coefficients(scale, coefShape);
      y = fb.mul(y, s);
    }
    if (!zeroShift) {
      Value t = coefficients(shift, coefShape);
      y = fb.add(y, t);
    }
    if (flip)
      y = randomFlip(b, loc, y, /*widthAxis=*/pixels ? 2 : 3);
    if (pixels)
      y = b.create<TransposeOp>(loc, y, b.getDenseI64ArrayAttr({0, 3, 1, 2}));
    for (OpOperand *use : uses)
      use->set(y);
  }
};

} // namespace
