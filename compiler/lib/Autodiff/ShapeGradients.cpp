//===- ShapeGradients.cpp - rules of reductions, scans and data movement --===//
//
//   * reductions broadcast the (keepdims-shaped) gradient back over the
//     reduced dims; reduce_max/min split a tie evenly among the maxima (as
//     PyTorch's amax/amin), reduce_prod is exact with zeros in the input,
//     reduce_l2 gives 0 where the norm is 0;
//   * cumsum's gradient is the cumsum in the other direction; top_k's is the
//     values' gradient scattered into zeros at the selected indices;
//   * data movement is inverted with data movement: slices/pads of the
//     gradient, inverse permutations, scatters into zeros (gather_grad,
//     gather_elements_grad, slice_grad for strided slices, pad_grad for
//     reflect/edge pads).
//
//===----------------------------------------------------------------------===//
#include "RuleUtils.h"

using namespace mlir;
using namespace mlir::forge;
using namespace mlir::forge::autodiff;

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

namespace {
/// The pieces every reduction rule needs: the input, the reduced axes, and
/// the result gradient with the reduced dims kept as size 1 (`keep`), ready
/// to broadcast against the input.
struct Reduced {
  Value x, gKeep;
  SmallVector<int64_t> axes, keep;
};

template <typename Op> Reduced reduced(GradientBuilder &gb, Op op, Value g) {
  Reduced r;
  r.x = op.getInput();
  r.axes.assign(op.getAxes().begin(), op.getAxes().end());
  r.keep.assign(shapeOf(r.x).begin(), shapeOf(r.x).end());
  for (int64_t a : r.axes)
    r.keep[a] = 1;
  r.gKeep = gb.reshape(g, r.keep);
  return r;
}
} // namespace

FORGE_GRADIENT(ReduceSumOp) {
  GradientBuilder gb(builder, getLoc());
  Reduced r = reduced(gb, *this, resultGrads[0]);
  operandGrads.push_back(gb.broadcastTo(r.gKeep, shapeOf(r.x)));
  return gb.status();
}

FORGE_GRADIENT(ReduceMeanOp) {
  GradientBuilder gb(builder, getLoc());
  Reduced r = reduced(gb, *this, resultGrads[0]);
  int64_t count = 1;
  for (int64_t a : r.axes)
    count *= shapeOf(r.x)[a];
  // Scale the small tensor, then broadcast.
  operandGrads.push_back(
      gb.broadcastTo(gb.mulScalar(r.gKeep, 1.0 / std::max<int64_t>(count, 1)), shapeOf(r.x)));
  return gb.status();
}

/// reduce_max/min: the gradient goes to the positions equal to the result,
/// split evenly among ties.
template <typename Op>
static LogicalResult extremeRule(Op op, OpBuilder &builder, ValueRange resultGrads,
                                 SmallVectorImpl<Value> &operandGrads) {
  GradientBuilder gb(builder, op.getLoc());
  Reduced r = reduced(gb, op, resultGrads[0]);
  Value yKeep = gb.reshape(op.getResult(), r.keep);
  Value hit = gb.castTo(gb.equal(r.x, yKeep), elementOf(r.x));
  Value count = gb.reduceSum(hit, r.axes, /*keepdims=*/true);
  operandGrads.push_back(gb.mul(hit, gb.div(r.gKeep, count)));
  return gb.status();
}

FORGE_GRADIENT(ReduceMaxOp) { return extremeRule(*this, builder, resultGrads, operandGrads); }
FORGE_GRADIENT(ReduceMinOp) { return extremeRule(*this, builder, resultGrads, operandGrads); }

FORGE_GRADIENT(ReduceProdOp) {
  // d prod / d x_i = product of the others. With p = product of the nonzero
  // entries and z = number of zeros in the group:
  //   x_i != 0: p / x_i if z == 0, else 0;   x_i == 0: p if z == 1, else 0.
  GradientBuilder gb(builder, getLoc());
  Reduced r = reduced(gb, *this, resultGrads[0]);
  Value x = r.x;
  Type e = elementOf(x);
  Value zero = gb.scalar(e, 0.0), one = gb.scalar(e, 1.0);
  Value isZero = gb.equal(x, zero);
  Value nonZero = gb.where(isZero, one, x); // never divides by zero below
  Value p = gb.create1("reduce_prod", {nonZero},
                       {gb.attr("axes", ArrayRef<int64_t>(r.axes)), gb.attr("keepdims", true)});
  Value z = gb.reduceSum(gb.castTo(isZero, e), r.axes, /*keepdims=*/true);
  Value atNonZero = gb.where(gb.equal(z, zero), gb.div(p, nonZero), zero);
  Value atZero = gb.where(gb.equal(z, one), p, zero);
  operandGrads.push_back(gb.mul(gb.where(isZero, atZero, atNonZero), r.gKeep));
  return gb.status();
}

FORGE_GRADIENT(ReduceL2Op) {
  // y = sqrt(sum x^2): dx = x * g / y, 0 where y == 0.
  GradientBuilder gb(builder, getLoc());
  Reduced r = reduced(gb, *this, resultGrads[0]);
  Value zero = gb.scalarLike(r.x, 0.0);
  Value yKeep = gb.reshape(getResult(), r.keep);
  Value ratio = gb.where(gb.equal(yKeep, zero), zero, gb.div(r.gKeep, yKeep));
  operandGrads.push_back(gb.mul(r.x, ratio));
  return gb.status();
}

FORGE_GRADIENT(CumSumOp) {
  // An inclusive (exclusive) scan's adjoint is the inclusive (exclusive)
  // scan in the opposite direction.
  GradientBuilder gb(builder, getLoc());
  operandGrads.push_back(
      gb.create1("cumsum", {resultGrads[0]},
                 {gb.attr("axis", (int64_t)getAxis()), gb.attr("exclusive", getExclusive()),
                  gb.attr("reverse", !getReverse())}));
  return gb.status();
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

FORGE_GRADIENT(ReshapeOp) {
  GradientBuilder gb(builder, getLoc());
  operandGrads.push_back(gb.reshape(resultGrads[0], shapeOf(getInput())));
  return gb.status();
}

FORGE_GRADIENT(TransposeOp) {
  GradientBuilder gb(builder, getLoc());
  ArrayRef<int64_t> perm = getPerm();
  SmallVector<int64_t> inverse(perm.size());
  for (auto [i, p] : llvm::enumerate(perm))
    inverse[p] = i;
  operandGrads.push_back(gb.transpose(resultGrads[0], inverse));
  return gb.status();
}

FORGE_GRADIENT(BroadcastOp) {
  GradientBuilder gb(builder, getLoc());
  operandGrads.push_back(gb.sumToType(resultGrads[0], getInput().getType()));
  return gb.status();
}

FORGE_GRADIENT(ConcatOp) {
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0];
  const int64_t axis = getAxis(), rank = tensorType(g).getRank();
  int64_t offset = 0;
  for (Value in : getInputs()) {
    int64_t extent = shapeOf(in)[axis];
    operandGrads.push_back(gradientFor(gb, in, [&] {
      SmallVector<int64_t> starts(rank, 0), ends(shapeOf(g)), steps(rank, 1);
      starts[axis] = offset;
      ends[axis] = offset + extent;
      return gb.slice(g, starts, ends, steps);
    }));
    offset += extent;
  }
  return gb.status();
}

FORGE_GRADIENT(SplitOp) {
  GradientBuilder gb(builder, getLoc());
  // A result that does not reach the loss contributes zeros.
  SmallVector<Value> parts;
  for (auto [r, g] : llvm::zip(getResults(), resultGrads))
    parts.push_back(g ? g : gb.splat(tensorType(r), 0.0));
  operandGrads.push_back(gb.concat(parts, getAxis()));
  return gb.status();
}

FORGE_GRADIENT(SliceOp) {
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0];
  ArrayRef<int64_t> in = shapeOf(getInput());
  ArrayRef<int64_t> starts = getStarts(), ends = getEnds(), steps = getSteps();
  if (llvm::all_of(steps, [](int64_t s) { return s == 1; })) {
    // A unit-step slice is undone by zero padding: a fusible elementwise op.
    SmallVector<int64_t> pads(starts);
    for (auto [d, e] : llvm::enumerate(ends))
      pads.push_back(in[d] - e);
    operandGrads.push_back(gb.padConstant(g, pads));
  } else {
    operandGrads.push_back(gb.create1("slice_grad", {g},
                                      {gb.attr("input_shape", in), gb.attr("starts", starts),
                                       gb.attr("ends", ends), gb.attr("steps", steps)}));
  }
  return gb.status();
}

FORGE_GRADIENT(PadOp) {
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0];
  ArrayRef<int64_t> pads = getPads(), out = shapeOf(g);
  const int64_t rank = out.size();
  if (getMode() != "constant") {
    // reflect/edge/wrap copy an input element to several outputs: scatter-add.
    operandGrads.push_back(
        gb.create1("pad_grad", {g}, {gb.attr("pads", pads), gb.attr("mode", getMode())}));
    return gb.status();
  }
  // Constant pads: crop what positive pads added, re-add (as zeros) what
  // negative pads cropped.
  SmallVector<int64_t> starts(rank), ends(rank), steps(rank, 1), regrow(2 * rank);
  bool crop = false, grow = false;
  for (int64_t d = 0; d < rank; ++d) {
    starts[d] = std::max<int64_t>(pads[d], 0);
    ends[d] = out[d] - std::max<int64_t>(pads[d + rank], 0);
    regrow[d] = std::max<int64_t>(-pads[d], 0);
    regrow[d + rank] = std::max<int64_t>(-pads[d + rank], 0);
    crop |= pads[d] > 0 || pads[d + rank] > 0;
    grow |= pads[d] < 0 || pads[d + rank] < 0;
  }
  Value dx = crop ? gb.slice(g, starts, ends, steps) : g;
  operandGrads.push_back(grow ? gb.padConstant(dx, regrow) : dx);
  return gb.status();
}

FORGE_GRADIENT(TileOp) {
  // Output dim d is repeats[d] copies of input dim d: view the gradient as
  // [r0, d0, r1, d1, ...] and sum over the copies.
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0];
  ArrayRef<int64_t> in = shapeOf(getInput()), repeats = getRepeats();
  if (llvm::all_of(repeats, [](int64_t r) { return r == 1; })) {
    operandGrads.push_back(g);
    return gb.status();
  }
  SmallVector<int64_t> split, axes;
  for (auto [d, r] : llvm::enumerate(repeats)) {
    axes.push_back(split.size());
    split.push_back(r);
    split.push_back(in[d]);
  }
  Value sum = gb.reduceSum(gb.reshape(g, split), axes, /*keepdims=*/false);
  operandGrads.push_back(gb.reshape(sum, in));
  return gb.status();
}

FORGE_GRADIENT(GatherOp) {
  GradientBuilder gb(builder, getLoc());
  Value x = getInput();
  operandGrads.push_back(gradientFor(gb, x, [&] {
    return gb.create1("gather_grad", {resultGrads[0], getIndices()},
                      {gb.attr("axis", (int64_t)getAxis()), gb.attr("input_shape", shapeOf(x))});
  }));
  operandGrads.push_back(Value()); // indices
  return gb.status();
}

FORGE_GRADIENT(GatherElementsOp) {
  GradientBuilder gb(builder, getLoc());
  Value x = getInput();
  operandGrads.push_back(gradientFor(gb, x, [&] {
    return gb.create1("gather_elements_grad", {resultGrads[0], getIndices()},
                      {gb.attr("axis", (int64_t)getAxis()), gb.attr("input_shape", shapeOf(x))});
  }));
  operandGrads.push_back(Value()); // indices
  return gb.status();
}

FORGE_GRADIENT(ScatterElementsOp) {
  // none: written positions take the update, so the input's gradient is zero
  // there (a scatter of ones marks them); add: the input passes through. Each
  // update's gradient is the cotangent where it landed.
  GradientBuilder gb(builder, getLoc());
  StringRef reduction = getReduction();
  if (reduction != "none" && reduction != "add")
    return emitError() << "no gradient for scatter_elements with reduction '" << reduction
                       << "' (none and add have one)";
  Value g = resultGrads[0];
  auto axis = gb.attr("axis", (int64_t)getAxis());
  operandGrads.push_back(gradientFor(gb, getInput(), [&] {
    if (reduction == "add")
      return g;
    Value zeros = gb.splat(tensorType(g), 0.0);
    Value ones = gb.splat(RankedTensorType::get(shapeOf(getUpdates()), elementOf(g)), 1.0);
    Value written = gb.create1("scatter_elements", {zeros, getIndices(), ones},
                               {axis, gb.attr("reduction", StringRef("none"))});
    return gb.mul(g, gb.sub(gb.scalarLike(g, 1.0), written));
  }));
  operandGrads.push_back(Value()); // indices
  operandGrads.push_back(gradientFor(gb, getUpdates(), [&] {
    return gb.create1("gather_elements", {g, getIndices()}, {axis});
  }));
  return gb.status();
}

FORGE_GRADIENT(TopKOp) {
  // Each value is one input element: its cotangent goes back to that element,
  // zero elsewhere. A row's indices are distinct, so reduction none is exact
  // (and needs no atomics on the GPU). The indices have no gradient.
  GradientBuilder gb(builder, getLoc());
  Value g = resultGrads[0];
  if (!g) { // only the indices are requested
    operandGrads.push_back(Value());
    return success();
  }
  operandGrads.push_back(gradientFor(gb, getInput(), [&] {
    Value zeros = gb.splat(tensorType(getInput()), 0.0);
    return gb.create1("scatter_elements", {zeros, getIndices(), g},
                      {gb.attr("axis", (int64_t)getAxis()), gb.attr("reduction", StringRef("none"))});
  }));
  return gb.status();
}

FORGE_GRADIENT(TriluOp) {
  // A mask: the gradient keeps the same triangle.
  GradientBuilder gb(builder, getLoc());
  operandGrads.push_back(gb.create1("trilu", {resultGrads[0]},
                                    {gb.attr("upper", getUpper()), gb.attr("k", (int64_t)getK())}));
  return gb.status();
}
