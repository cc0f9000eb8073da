//===- OnnxOps.cpp - one import rule per ONNX op type ---------------------===//
//
// Each rule normalizes an ONNX node into forge ops: constant inputs that
// configure the op (shapes, axes, pads, ...) become attributes, defaults are
// filled in, negative axes become non-negative, opset differences (attribute
// vs. input forms) are resolved. Ops that the dialect expresses through
// others (Flatten, Squeeze, GlobalAveragePool, Einsum, SoftmaxCrossEntropyLoss,
// ...) are decomposed here.
//
//===----------------------------------------------------------------------===//
#include "ImportContext.h"

#include "forge/Conversion/Conversion.h"
#include "mlir/IR/TypeUtilities.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/MathExtras.h"

using namespace mlir;
using namespace mlir::forge;
using namespace mlir::forge::onnx_import;

namespace {

using Rule = OpRule;


} // namespace

FailureOr<int64_t> onnx_import::normAxis(NodeImporter &n, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank || rank == 0)
    return n.error() << "axis " << axis << " out of range for rank " << rank;
  return axis < 0 ? axis + rank : axis;
}

namespace {

LogicalResult output(NodeImporter &n, FailureOr<Value> v, int64_t index = 0) {
  if (failed(v))
    return failure();
  return n.setOutput(index, *v);
}

/// Rule for an op whose operands and attributes map one to one.
Rule direct(StringRef op) {
  std::string name = op.str();
  return [name](NodeImporter &n) {
    SmallVector<Value> operands;
    for (int64_t i = 0; i < n.numInputs(); ++i)
      operands.push_back(n.input(i));
    return output(n, n.create1(name, operands));
  };
}

Rule unaryWith(StringRef op, std::function<SmallVector<NamedAttribute>(NodeImporter &)> attrs) {
  std::string name = op.str();
  return [name, attrs](NodeImporter &n) {
    return output(n, n.create1(name, {n.input(0)}, attrs(n)));
  };
}

/// Variadic Sum/Min/Max/Mean as a chain of binary ops.
Rule variadic(StringRef op, bool mean = false) {
  std::string name = op.str();
  return [name, mean](NodeImporter &n) -> LogicalResult {
    if (n.numInputs() < 1)
      return n.error() << "needs at least one input";
    Value acc = n.input(0);
    for (int64_t i = 1; i < n.numInputs(); ++i) {
      auto next = n.create1(name, {acc, n.input(i)});
      if (failed(next))
        return failure();
      acc = *next;
    }
    if (mean && n.numInputs() > 1) {
      auto element = cast<RankedTensorType>(acc.getType()).getElementType();
      auto div = n.create1("div", {acc, n.scalar(element, double(n.numInputs()))});
      if (failed(div))
        return failure();
      acc = *div;
    }
    return n.setOutput(0, acc);
  };
}

} // namespace

/// Resolves ONNX auto_pad / pads for a sliding window op into explicit pads.
FailureOr<SmallVector<int64_t>> onnx_import::resolvePads(NodeImporter &n, ArrayRef<int64_t> inSpatial,
                                            ArrayRef<int64_t> kernel, ArrayRef<int64_t> strides,
                                            ArrayRef<int64_t> dilations) {
  size_t spatial = inSpatial.size();
  std::string autoPad = n.stringAttr("auto_pad", "NOTSET");
  SmallVector<int64_t> pads(2 * spatial, 0);
  if (autoPad == "NOTSET") {
    if (auto p = n.intsAttr("pads")) {
      if (p->size() != 2 * spatial)
        return n.error() << "pads needs " << 2 * spatial << " entries";
      pads = *p;
    }
    return pads;
  }
  if (autoPad == "VALID")
    return pads;
  if (autoPad != "SAME_UPPER" && autoPad != "SAME_LOWER")
    return n.error() << "unknown auto_pad '" << autoPad << "'";
  for (size_t i = 0; i < spatial; ++i) {
    int64_t out = (inSpatial[i] + strides[i] - 1) / strides[i];
    int64_t total = std::max<int64_t>(
        0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - inSpatial[i]);
    int64_t small = total / 2, large = total - small;
    pads[i] = autoPad == "SAME_UPPER" ? small : large;
    pads[i + spatial] = autoPad == "SAME_UPPER" ? large : small;
  }
  return pads;
}

SmallVector<int64_t> onnx_import::intsOr(NodeImporter &n, StringRef name, size_t count, int64_t def) {
  if (auto v = n.intsAttr(name); v && !v->empty())
    return *v;
  return SmallVector<int64_t>(count, def);
}

namespace {

LogicalResult importConv(NodeImporter &n) {
  auto x = n.inputType(0), w = n.inputType(1);
  if (!x || !w || x.getRank() < 3 || w.getRank() != x.getRank())
    return n.error() << "expects N-d input and weight of equal rank >= 3";
  size_t spatial = x.getRank() - 2;
  SmallVector<int64_t> kernel(w.getShape().drop_front(2));
  if (auto k = n.intsAttr("kernel_shape"); k && ArrayRef<int64_t>(*k) != ArrayRef<int64_t>(kernel))
    return n.error() << "kernel_shape disagrees with the weight shape";
  auto strides = intsOr(n, "strides", spatial, 1), dilations = intsOr(n, "dilations", spatial, 1);
  if (strides.size() != spatial || dilations.size() != spatial)
    return n.error() << "strides/dilations need " << spatial << " entries";
  auto pads = resolvePads(n, x.getShape().drop_front(2), kernel, strides, dilations);
  if (failed(pads))
    return failure();
  return output(n, n.create1("conv", {n.input(0), n.input(1), n.input(2)},
                             {n.ints("strides", strides), n.ints("pads", *pads),
                              n.ints("dilations", dilations), n.i64("group", n.intAttr("group", 1))}));
}

LogicalResult importConvTranspose(NodeImporter &n) {
  auto x = n.inputType(0), w = n.inputType(1);
  if (!x || !w || x.getRank() < 3 || w.getRank() != x.getRank())
    return n.error() << "expects N-d input and weight of equal rank >= 3";
  size_t spatial = x.getRank() - 2;
  int64_t group = n.intAttr("group", 1);
  SmallVector<int64_t> kernel(w.getShape().drop_front(2));
  auto strides = intsOr(n, "strides", spatial, 1), dilations = intsOr(n, "dilations", spatial, 1);
  auto outputPadding = intsOr(n, "output_padding", spatial, 0);
  if (strides.size() != spatial || dilations.size() != spatial || outputPadding.size() != spatial)
    return n.error() << "strides/dilations/output_padding need " << spatial << " entries";
  SmallVector<int64_t> pads(2 * spatial, 0);
  std::string autoPad = n.stringAttr("auto_pad", "NOTSET");
  auto outputShape = n.intsAttr("output_shape");
  if (outputShape || autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER") {
    SmallVector<int64_t> target;
    if (outputShape) {
      target.assign(outputShape->end() - std::min<size_t>(outputShape->size(), spatial), outputShape->end());
      if (target.size() != spatial)
        return n.error() << "output_shape needs " << spatial << " spatial entries";
    } else {
      for (size_t i = 0; i < spatial; ++i)
        target.push_back(x.getDimSize(i + 2) * strides[i]);
    }
    for (size_t i = 0; i < spatial; ++i) {
      int64_t total = strides[i] * (x.getDimSize(i + 2) - 1) + outputPadding[i] +
                      ((kernel[i] - 1) * dilations[i] + 1) - target[i];
      if (total < 0) {
        // The ONNX reference grows the output through output_padding.
        outputPadding[i] -= total;
        total = 0;
      }
      int64_t small = total / 2, large = total - small;
      pads[i] = autoPad == "SAME_LOWER" ? large : small;
      pads[i + spatial] = autoPad == "SAME_LOWER" ? small : large;
    }
  } else if (auto p = n.intsAttr("pads")) {
    if (p->size() != 2 * spatial)
      return n.error() << "pads needs " << 2 * spatial << " entries";
    pads = *p;
  }
  return output(n, n.create1("conv_transpose", {n.input(0), n.input(1), n.input(2)},
                             {n.ints("strides", strides), n.ints("pads", pads),
                              n.ints("dilations", dilations), n.ints("output_padding", outputPadding),
                              n.i64("group", group)}));
}

} // namespace

FailureOr<onnx_import::PoolWindow> onnx_import::poolWindow(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x || x.getRank() < 3)
    return n.error() << "expects an N-d input of rank >= 3";
  size_t spatial = x.getRank() - 2;
  auto kernel = n.intsAttr("kernel_shape");
  if (!kernel || kernel->size() != spatial)
    return n.error() << "kernel_shape needs " << spatial << " entries";
  PoolWindow w{*kernel, intsOr(n, "strides", spatial, 1), intsOr(n, "dilations", spatial, 1), {}};
  auto pads = resolvePads(n, x.getShape().drop_front(2), w.kernel, w.strides, w.dilations);
  if (failed(pads))
    return failure();
  w.pads = *pads;
  return w;
}

namespace {

LogicalResult importPool(NodeImporter &n, bool isMax) {
  auto w = poolWindow(n);
  if (failed(w))
    return failure();
  SmallVector<NamedAttribute> attrs = {n.ints("kernel_shape", w->kernel), n.ints("strides", w->strides),
                                       n.ints("pads", w->pads), n.ints("dilations", w->dilations),
                                       n.flag("ceil_mode", n.intAttr("ceil_mode", 0))};
  if (!isMax)
    attrs.push_back(n.flag("count_include_pad", n.intAttr("count_include_pad", 0)));
  auto pooled = n.create1(isMax ? "max_pool" : "avg_pool", {n.input(0)}, attrs);
  if (failed(pooled) || failed(output(n, pooled)))
    return failure();
  if (isMax && n.outputUsed(1))
    return importMaxPoolIndices(n, *w, cast<RankedTensorType>(pooled->getType()));
  return success();
}

LogicalResult importGlobalPool(NodeImporter &n, StringRef reduce) {
  auto x = n.inputType(0);
  if (!x || x.getRank() < 3)
    return n.error() << "expects an N-d input of rank >= 3";
  SmallVector<int64_t> axes;
  for (int64_t d = 2; d < x.getRank(); ++d)
    axes.push_back(d);
  return output(n, n.create1(reduce, {n.input(0)}, {n.ints("axes", axes), n.flag("keepdims", true)}));
}

LogicalResult importBatchNorm(NodeImporter &n) {
  double eps = n.floatAttr("epsilon", 1e-5), momentum = n.floatAttr("momentum", 0.9);
  bool training = n.intAttr("training_mode", 0) != 0;
  SmallVector<Value> operands;
  for (int i = 0; i < 5; ++i)
    operands.push_back(n.input(i));
  if (!training) {
    if (n.outputUsed(1) || n.outputUsed(2))
      return n.error() << "running statistics outputs need training_mode=1";
    return output(n, n.create1("batch_norm", operands,
                               {n.f64("epsilon", eps), n.f64("momentum", momentum)}));
  }
  auto results = n.create("batch_norm_training", operands,
                          {n.f64("epsilon", eps), n.f64("momentum", momentum)});
  if (failed(results))
    return failure();
  for (int i = 0; i < 3; ++i)
    (void)n.setOutput(i, (*results)[i]);
  return success();
}

LogicalResult importLayerNorm(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x)
    return n.error() << "missing input";
  auto axis = normAxis(n, n.intAttr("axis", -1), x.getRank());
  if (failed(axis))
    return failure();
  double eps = n.floatAttr("epsilon", 1e-5);
  if (failed(output(n, n.create1("layer_norm", {n.input(0), n.input(1), n.input(2)},
                                 {n.i64("axis", *axis), n.f64("epsilon", eps)}))))
    return failure();
  if (!n.outputUsed(1) && !n.outputUsed(2))
    return success();
  // The optional Mean / InvStdDev outputs (reduced dims kept as 1) are
  // recomputed with primitives; the fused op stays the common path.
  SmallVector<int64_t> axes;
  for (int64_t d = *axis; d < x.getRank(); ++d)
    axes.push_back(d);
  SmallVector<NamedAttribute> reduceAttrs = {n.ints("axes", axes), n.flag("keepdims", true)};
  auto mean = n.create1("reduce_mean", {n.input(0)}, reduceAttrs);
  if (failed(mean))
    return failure();
  auto centered = n.create1("sub", {n.input(0), *mean});
  if (failed(centered))
    return failure();
  auto squared = n.create1("mul", {*centered, *centered});
  if (failed(squared))
    return failure();
  auto var = n.create1("reduce_mean", {*squared}, reduceAttrs);
  if (failed(var))
    return failure();
  auto shifted = n.create1("add", {*var, n.scalar(x.getElementType(), eps)});
  if (failed(shifted))
    return failure();
  auto root = n.create1("sqrt", {*shifted});
  if (failed(root))
    return failure();
  if (failed(output(n, n.create1("reciprocal", {*root}), 2)))
    return failure();
  return n.setOutput(1, *mean);
}

LogicalResult importGroupNorm(NodeImporter &n, bool instance) {
  auto x = n.inputType(0);
  if (!x || x.getRank() < 3)
    return n.error() << "expects an input [N, C, ...]";
  int64_t channels = x.getDimSize(1);
  int64_t groups = instance ? channels : n.intAttr("num_groups", 0);
  if (groups <= 0 || channels % groups != 0)
    return n.error() << "num_groups " << groups << " does not divide " << channels << " channels";
  Value scale = n.input(1), bias = n.input(2);
  // Before opset 21, scale and bias hold one entry per group.
  if (!instance && n.opset < 21 && groups != channels) {
    for (Value *v : {&scale, &bias}) {
      auto shaped = n.reshape(*v, {groups, 1});
      if (failed(shaped))
        return failure();
      auto wide = n.create1("broadcast", {*shaped}, {n.ints("shape", {groups, channels / groups})});
      if (failed(wide))
        return failure();
      auto flat = n.reshape(*wide, {channels});
      if (failed(flat))
        return failure();
      *v = *flat;
    }
  }
  return output(n, n.create1("group_norm", {n.input(0), scale, bias},
                             {n.i64("num_groups", groups), n.f64("epsilon", n.floatAttr("epsilon", 1e-5))}));
}

/// Softmax-like ops; before opset 13 they flatten to 2-D around `axis`.
Rule softmaxLike(StringRef op) {
  std::string name = op.str();
  return [name](NodeImporter &n) -> LogicalResult {
    auto x = n.inputType(0);
    if (!x)
      return n.error() << "missing input";
    int64_t rank = x.getRank();
    if (n.opset >= 13) {
      auto axis = normAxis(n, n.intAttr("axis", -1), rank);
      if (failed(axis))
        return failure();
      return output(n, n.create1(name, {n.input(0)}, {n.i64("axis", *axis)}));
    }
    auto axis = normAxis(n, n.intAttr("axis", 1), rank);
    if (failed(axis))
      return failure();
    auto flat = n.reshape(n.input(0), {ShapedType::getNumElements(x.getShape().take_front(*axis)),
                                       ShapedType::getNumElements(x.getShape().drop_front(*axis))});
    if (failed(flat))
      return failure();
    auto y = n.create1(name, {*flat}, {n.i64("axis", 1)});
    if (failed(y))
      return failure();
    return output(n, n.reshape(*y, x.getShape()));
  };
}

LogicalResult importReshape(NodeImporter &n) {
  auto x = n.inputType(0);
  auto target = n.constantInts(1, "shape");
  if (!x || failed(target))
    return failure();
  bool allowZero = n.intAttr("allowzero", 0) != 0;
  SmallVector<int64_t> shape;
  int64_t inferIndex = -1, known = 1;
  for (auto [i, d] : llvm::enumerate(*target)) {
    if (d == 0 && !allowZero) {
      if ((int64_t)i >= x.getRank())
        return n.error() << "shape entry 0 at " << i << " copies a dim the input lacks";
      d = x.getDimSize(i);
    }
    if (d == -1) {
      if (inferIndex >= 0)
        return n.error() << "shape has more than one -1";
      inferIndex = i;
    } else if (d < 0) {
      return n.error() << "invalid shape entry " << d;
    } else if (llvm::MulOverflow(known, d, known)) {
      return n.error() << "shape entries multiply past 2^63 elements (at entry " << i << ", "
                       << d << ")";
    }
    shape.push_back(d);
  }
  if (inferIndex >= 0) {
    if (known == 0 || x.getNumElements() % known != 0)
      return n.error() << "cannot infer -1: " << x.getNumElements() << " elements";
    shape[inferIndex] = x.getNumElements() / known;
  }
  if (ShapedType::getNumElements(shape) != x.getNumElements())
    return n.error() << "reshape of " << x.getNumElements() << " elements into "
                     << ShapedType::getNumElements(shape);
  return output(n, n.reshape(n.input(0), shape));
}

LogicalResult importFlatten(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x)
    return n.error() << "missing input";
  int64_t axis = n.intAttr("axis", 1);
  if (axis < 0)
    axis += x.getRank();
  if (axis < 0 || axis > x.getRank())
    return n.error() << "axis out of range";
  return output(n, n.reshape(n.input(0), {ShapedType::getNumElements(x.getShape().take_front(axis)),
                                          ShapedType::getNumElements(x.getShape().drop_front(axis))}));
}

/// Axes from the `axes` input (newer opsets) or attribute (older ones).
} // namespace

FailureOr<std::optional<SmallVector<int64_t>>> onnx_import::axesOf(NodeImporter &n, int64_t inputIndex) {
  if (n.input(inputIndex)) {
    auto axes = n.constantInts(inputIndex, "axes");
    if (failed(axes))
      return failure();
    return std::optional<SmallVector<int64_t>>(*axes);
  }
  return n.intsAttr("axes");
}

FailureOr<SmallVector<int64_t>> onnx_import::normAxes(NodeImporter &n, ArrayRef<int64_t> axes, int64_t rank) {
  SmallVector<int64_t> out;
  for (int64_t a : axes) {
    auto norm = normAxis(n, a, rank);
    if (failed(norm))
      return failure();
    if (llvm::is_contained(out, *norm))
      return n.error() << "axis " << a << " repeated";
    out.push_back(*norm);
  }
  llvm::sort(out);
  return out;
}

namespace {

LogicalResult importSqueeze(NodeImporter &n) {
  auto x = n.inputType(0);
  auto axesOpt = axesOf(n, 1);
  if (!x || failed(axesOpt))
    return failure();
  SmallVector<int64_t> axes;
  if (*axesOpt) {
    auto norm = normAxes(n, **axesOpt, x.getRank());
    if (failed(norm))
      return failure();
    axes = *norm;
  } else {
    for (int64_t d = 0; d < x.getRank(); ++d)
      if (x.getDimSize(d) == 1)
        axes.push_back(d);
  }
  SmallVector<int64_t> shape;
  for (int64_t d = 0; d < x.getRank(); ++d) {
    if (!llvm::is_contained(axes, d))
      shape.push_back(x.getDimSize(d));
    else if (x.getDimSize(d) != 1)
      return n.error() << "cannot squeeze dim " << d << " of extent " << x.getDimSize(d);
  }
  return output(n, n.reshape(n.input(0), shape));
}

LogicalResult importUnsqueeze(NodeImporter &n) {
  auto x = n.inputType(0);
  auto axesOpt = axesOf(n, 1);
  if (!x || failed(axesOpt))
    return failure();
  if (!*axesOpt)
    return n.error() << "axes are required";
  int64_t rank = x.getRank() + (*axesOpt)->size();
  auto axes = normAxes(n, **axesOpt, rank);
  if (failed(axes))
    return failure();
  SmallVector<int64_t> shape;
  int64_t src = 0;
  for (int64_t d = 0; d < rank; ++d)
    shape.push_back(llvm::is_contained(*axes, d) ? 1 : x.getDimSize(src++));
  return output(n, n.reshape(n.input(0), shape));
}

LogicalResult importTranspose(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x)
    return n.error() << "missing input";
  SmallVector<int64_t> perm;
  if (auto p = n.intsAttr("perm")) {
    auto norm = normAxes(n, *p, x.getRank());
    if (failed(norm) || p->size() != (size_t)x.getRank())
      return n.error() << "perm is not a permutation of the input dims";
    perm = *p;
    for (int64_t &v : perm)
      v = v < 0 ? v + x.getRank() : v;
  } else {
    for (int64_t d = x.getRank() - 1; d >= 0; --d)
      perm.push_back(d);
  }
  return output(n, n.create1("transpose", {n.input(0)}, {n.ints("perm", perm)}));
}

LogicalResult importConcat(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x)
    return n.error() << "missing input";
  auto axis = normAxis(n, n.intAttr("axis", 0), x.getRank());
  if (failed(axis))
    return failure();
  SmallVector<Value> inputs;
  for (int64_t i = 0; i < n.numInputs(); ++i)
    if (Value v = n.input(i); v && cast<RankedTensorType>(v.getType()).getNumElements() > 0)
      inputs.push_back(v);
  if (inputs.empty())
    inputs.push_back(n.input(0));
  if (inputs.size() == 1 && inputs[0].getType() != n.input(0).getType())
    return output(n, FailureOr<Value>(inputs[0]));
  return output(n, n.create1("concat", inputs, {n.i64("axis", *axis)}));
}

LogicalResult importSplit(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x)
    return n.error() << "missing input";
  auto axis = normAxis(n, n.intAttr("axis", 0), x.getRank());
  if (failed(axis))
    return failure();
  int64_t extent = x.getDimSize(*axis);
  SmallVector<int64_t> sizes;
  if (n.input(1)) {
    auto s = n.constantInts(1, "split");
    if (failed(s))
      return failure();
    sizes = *s;
  } else if (auto s = n.intsAttr("split"); s && !s->empty()) {
    sizes = *s;
  } else {
    int64_t parts = n.attr("num_outputs") ? n.intAttr("num_outputs", 1) : n.numOutputs();
    if (parts <= 0)
      return n.error() << "number of outputs must be positive";
    int64_t chunk = (extent + parts - 1) / parts;
    for (int64_t i = 0; i < parts; ++i)
      sizes.push_back(std::max<int64_t>(0, std::min(chunk, extent - i * chunk)));
  }
  auto results = n.create("split", {n.input(0)}, {n.i64("axis", *axis), n.ints("sizes", sizes)});
  if (failed(results))
    return failure();
  for (auto [i, v] : llvm::enumerate(*results))
    (void)n.setOutput(i, v);
  return success();
}

LogicalResult importSlice(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x)
    return n.error() << "missing input";
  SmallVector<int64_t> starts, ends, axes, steps;
  if (n.opset >= 10) {
    auto s = n.constantInts(1, "starts"), e = n.constantInts(2, "ends");
    if (failed(s) || failed(e))
      return failure();
    starts = *s;
    ends = *e;
    if (n.input(3)) {
      auto a = n.constantInts(3, "axes");
      if (failed(a))
        return failure();
      axes = *a;
    }
    if (n.input(4)) {
      auto st = n.constantInts(4, "steps");
      if (failed(st))
        return failure();
      steps = *st;
    }
  } else {
    starts = n.intsAttr("starts").value_or(SmallVector<int64_t>());
    ends = n.intsAttr("ends").value_or(SmallVector<int64_t>());
    axes = n.intsAttr("axes").value_or(SmallVector<int64_t>());
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i)
      axes.push_back(i);
  if (steps.empty())
    steps.assign(starts.size(), 1);
  if (starts.size() != ends.size() || axes.size() != starts.size() || steps.size() != starts.size())
    return n.error() << "starts, ends, axes and steps differ in length";
  int64_t rank = x.getRank();
  SmallVector<int64_t> fullStart(rank, 0), fullEnd(x.getShape()), fullStep(rank, 1);
  for (size_t i = 0; i < axes.size(); ++i) {
    auto axis = normAxis(n, axes[i], rank);
    if (failed(axis))
      return failure();
    int64_t dim = x.getDimSize(*axis), step = steps[i];
    if (step == 0)
      return n.error() << "step must not be 0";
    int64_t start = starts[i] < 0 ? starts[i] + dim : starts[i];
    int64_t end = ends[i] < 0 ? ends[i] + dim : ends[i];
    // Very large/small sentinels (INT64_MAX, INT64_MIN) survive the + dim above.
    if (ends[i] <= INT64_MIN / 2)
      end = -1;
    if (step > 0) {
      start = std::clamp<int64_t>(start, 0, dim);
      end = std::clamp<int64_t>(end, start, dim);
    } else {
      start = std::clamp<int64_t>(start, -1, dim - 1);
      end = std::clamp<int64_t>(end, -1, std::max<int64_t>(start, -1));
      if (start < 0) { // empty selection
        start = 0;
        end = 0;
        step = 1;
      }
    }
    fullStart[*axis] = start;
    fullEnd[*axis] = end;
    fullStep[*axis] = step;
  }
  return output(n, n.create1("slice", {n.input(0)},
                             {n.ints("starts", fullStart), n.ints("ends", fullEnd),
                              n.ints("steps", fullStep)}));
}

LogicalResult importGather(NodeImporter &n, StringRef op) {
  auto x = n.inputType(0);
  if (!x)
    return n.error() << "missing input";
  auto axis = normAxis(n, n.intAttr("axis", 0), x.getRank());
  if (failed(axis))
    return failure();
  return output(n, n.create1(op, {n.input(0), n.input(1)}, {n.i64("axis", *axis)}));
}

LogicalResult importExpand(NodeImporter &n) {
  auto x = n.inputType(0);
  auto shape = n.constantInts(1, "shape");
  if (!x || failed(shape))
    return failure();
  auto target = broadcastShapes(x.getShape(), *shape);
  if (failed(target))
    return n.error() << "input does not broadcast to the requested shape";
  return output(n, n.create1("broadcast", {n.input(0)}, {n.ints("shape", *target)}));
}

LogicalResult importTile(NodeImporter &n) {
  auto repeats = n.constantInts(1, "repeats");
  if (failed(repeats))
    return failure();
  return output(n, n.create1("tile", {n.input(0)}, {n.ints("repeats", *repeats)}));
}

LogicalResult importShape(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x)
    return n.error() << "missing input";
  int64_t rank = x.getRank();
  int64_t start = n.intAttr("start", 0), end = n.intAttr("end", rank);
  start = std::clamp<int64_t>(start < 0 ? start + rank : start, 0, rank);
  end = std::clamp<int64_t>(end < 0 ? end + rank : end, 0, rank);
  SmallVector<int64_t> dims;
  for (int64_t d = start; d < end; ++d)
    dims.push_back(x.getDimSize(d));
  auto type = RankedTensorType::get({(int64_t)dims.size()}, n.b.getI64Type());
  return n.setOutput(0, n.constant(DenseElementsAttr::get(type, ArrayRef<int64_t>(dims))));
}

LogicalResult importSize(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x)
    return n.error() << "missing input";
  return n.setOutput(0, n.scalar(n.b.getI64Type(), double(x.getNumElements())));
}

LogicalResult importConstantOfShape(NodeImporter &n) {
  auto shape = n.constantInts(0, "shape");
  if (failed(shape))
    return failure();
  Attribute fill = FloatAttr::get(n.b.getF32Type(), 0.0);
  Type element = n.b.getF32Type();
  if (const auto *value = n.attr("value")) {
    auto t = tensorFromProto(n.b.getContext(), value->t(), "", [&]() { return n.error(); });
    if (failed(t))
      return failure();
    if (t->getNumElements() != 1)
      return n.error() << "value must hold one element";
    element = t->getElementType();
    fill = *t->getValues<Attribute>().begin();
  }
  int64_t count = 1;
  for (int64_t d : *shape)
    if (d < 0 || llvm::MulOverflow(count, d, count))
      return n.error() << "shape [" << ArrayRef<int64_t>(*shape)
                       << "] has a negative dim or more than 2^63 elements";
  auto type = RankedTensorType::get(*shape, element);
  auto splat = DenseElementsAttr::get(RankedTensorType::get({}, element), fill);
  if (count <= n.graph.maxFoldElements)
    return n.setOutput(0, n.constant(splat.reshape(type)));
  // Too large to materialize at compile time: a broadcast of the scalar at run
  // time (create() lists it as not folded).
  return output(n, n.create1("broadcast", {n.constant(splat)},
                             {n.b.getNamedAttr("shape", n.b.getDenseI64ArrayAttr(*shape))}));
}

LogicalResult importConstant(NodeImporter &n) {
  MLIRContext *ctx = n.b.getContext();
  for (const auto &a : n.node.attribute()) {
    DenseElementsAttr value;
    StringRef name = a.name();
    if (name == "value") {
      auto t = tensorFromProto(ctx, a.t(), "", [&]() { return n.error(); });
      if (failed(t))
        return failure();
      value = *t;
    } else if (name == "value_float") {
      value = DenseElementsAttr::get(RankedTensorType::get({}, n.b.getF32Type()), a.f());
    } else if (name == "value_floats") {
      SmallVector<float> v(a.floats().begin(), a.floats().end());
      value = DenseElementsAttr::get(RankedTensorType::get({(int64_t)v.size()}, n.b.getF32Type()),
                                     ArrayRef<float>(v));
    } else if (name == "value_int") {
      value = DenseElementsAttr::get(RankedTensorType::get({}, n.b.getI64Type()), a.i());
    } else if (name == "value_ints") {
      SmallVector<int64_t> v(a.ints().begin(), a.ints().end());
      value = DenseElementsAttr::get(RankedTensorType::get({(int64_t)v.size()}, n.b.getI64Type()),
                                     ArrayRef<int64_t>(v));
    } else {
      return n.error() << "attribute '" << name << "' is unsupported (string and sparse constants)";
    }
    return n.setOutput(0, n.constant(value));
  }
  return n.error() << "has no value attribute";
}

LogicalResult importIdentity(NodeImporter &n) {
  Value in = n.input(0);
  auto c = in ? in.getDefiningOp<ConstantOp>() : ConstantOp();
  auto source = c ? c->getAttrOfType<StringAttr>("forge.initializer") : StringAttr();
  if (!n.graph.untieSharedInitializers || !source || !n.outputUsed(0) ||
      !isa<FloatType>(getElementTypeOrSelf(in.getType())))
    return n.setOutput(0, in);
  // An exporter-merged parameter (ImportOptions::untieSharedInitializers):
  // its own initializer again, named after the Identity's output.
  const std::string &name = n.node.output(0);
  OpBuilder::InsertionGuard guard(n.b);
  n.b.setInsertionPointAfter(c);
  auto copy = n.b.create<ConstantOp>(NameLoc::get(n.b.getStringAttr(name), c.getLoc()),
                                     c.getValue());
  copy->setAttr("forge.initializer", n.b.getStringAttr(name));
  n.graph.untied.emplace_back(name, source.str());
  return n.setOutput(0, copy);
}

LogicalResult importRange(NodeImporter &n) {
  DenseElementsAttr start = n.constantInput(0), limit = n.constantInput(1), delta = n.constantInput(2);
  if (!start || !limit || !delta)
    return n.error() << "start, limit and delta must be constants once shapes are fixed";
  auto s = n.constantScalar(0, "start"), l = n.constantScalar(1, "limit"), d = n.constantScalar(2, "delta");
  if (failed(s) || failed(l) || failed(d) || *d == 0)
    return n.error() << "invalid range";
  double steps = std::ceil((*l - *s) / *d);
  if (!(steps <= double(n.graph.maxFoldElements)))
    return n.error() << "has " << steps << " elements, more than the " << n.graph.maxFoldElements
                     << " that import-time evaluation materializes (Forge has no run-time Range)";
  int64_t count = std::max<int64_t>(0, (int64_t)steps);
  Type element = start.getElementType();
  auto type = RankedTensorType::get({count}, element);
  SmallVector<Attribute> values;
  for (int64_t i = 0; i < count; ++i) {
    double v = *s + i * *d;
    if (isa<FloatType>(element))
      values.push_back(FloatAttr::get(element, v));
    else
      values.push_back(IntegerAttr::get(element, (int64_t)v));
  }
  return n.setOutput(0, n.constant(DenseElementsAttr::get(type, values)));
}

LogicalResult importTrilu(NodeImporter &n) {
  int64_t k = 0;
  if (n.input(1)) {
    auto v = n.constantScalar(1, "k");
    if (failed(v))
      return failure();
    k = (int64_t)*v;
  }
  return output(n, n.create1("trilu", {n.input(0)},
                             {n.flag("upper", n.intAttr("upper", 1) != 0), n.i64("k", k)}));
}

LogicalResult importPad(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x)
    return n.error() << "missing input";
  int64_t rank = x.getRank();
  SmallVector<int64_t> pads;
  double value = 0;
  if (n.opset >= 11) {
    auto p = n.constantInts(1, "pads");
    if (failed(p))
      return failure();
    if (n.input(2)) {
      auto v = n.constantScalar(2, "constant_value");
      if (failed(v))
        return failure();
      value = *v;
    }
    SmallVector<int64_t> axes;
    if (n.input(3)) {
      auto a = n.constantInts(3, "axes");
      if (failed(a))
        return failure();
      for (int64_t ax : *a) {
        auto norm = normAxis(n, ax, rank);
        if (failed(norm))
          return failure();
        axes.push_back(*norm);
      }
    } else {
      for (int64_t d = 0; d < rank; ++d)
        axes.push_back(d);
    }
    if (p->size() != 2 * axes.size())
      return n.error() << "pads needs " << 2 * axes.size() << " entries";
    pads.assign(2 * rank, 0);
    for (auto [i, ax] : llvm::enumerate(axes)) {
      pads[ax] = (*p)[i];
      pads[ax + rank] = (*p)[i + axes.size()];
    }
  } else {
    pads = n.intsAttr("pads").value_or(SmallVector<int64_t>());
    value = n.floatAttr("value", 0);
  }
  std::string mode = n.stringAttr("mode", "constant");
  return output(n, n.create1("pad", {n.input(0)},
                             {n.ints("pads", pads), n.str("mode", mode), n.f64("value", value)}));
}

/// ReduceX: axes moved from attribute to input at opset 18 (ReduceSum at 13).
Rule reduce(StringRef op) {
  std::string name = op.str();
  return [name](NodeImporter &n) -> LogicalResult {
    auto x = n.inputType(0);
    if (!x)
      return n.error() << "missing input";
    auto axesOpt = axesOf(n, 1);
    if (failed(axesOpt))
      return failure();
    bool keepdims = n.intAttr("keepdims", 1) != 0;
    SmallVector<int64_t> axes;
    if (*axesOpt && !(*axesOpt)->empty()) {
      auto norm = normAxes(n, **axesOpt, std::max<int64_t>(x.getRank(), 1));
      if (failed(norm))
        return failure();
      axes = *norm;
    } else if (n.intAttr("noop_with_empty_axes", 0)) {
      return n.setOutput(0, n.input(0));
    } else {
      for (int64_t d = 0; d < x.getRank(); ++d)
        axes.push_back(d);
    }
    return output(n, n.create1(name, {n.input(0)}, {n.ints("axes", axes), n.flag("keepdims", keepdims)}));
  };
}

LogicalResult importArgMax(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x)
    return n.error() << "missing input";
  auto axis = normAxis(n, n.intAttr("axis", 0), x.getRank());
  if (failed(axis))
    return failure();
  return output(n, n.create1("argmax", {n.input(0)},
                             {n.i64("axis", *axis), n.flag("keepdims", n.intAttr("keepdims", 1)),
                              n.flag("select_last_index", n.intAttr("select_last_index", 0))}));
}

/// Dropout. Inference imports: the identity (mask all true). Training imports
/// (ImportOptions::keepFloatInitializers): a `dropout` op, which the training
/// graph turns into a Philox mask in train_step and the identity in eval,
/// unless the ratio is 0 or `training_mode` is a constant false. An absent
/// training_mode (ONNX's default: inference) still drops in a training
/// bundle: a Dropout in a model being trained is meant to drop.
LogicalResult importDropout(NodeImporter &n) {
  bool training = n.graph.keepFloatInitializers;
  if (n.input(2)) {
    auto t = n.constantScalar(2, "training_mode");
    if (failed(t))
      return failure();
    training = training && *t != 0;
  }
  double ratio = n.opset < 12 ? n.floatAttr("ratio", 0.5) : 0.5;
  if (n.input(1)) {
    auto r = n.constantScalar(1, "ratio");
    if (failed(r))
      return failure();
    ratio = *r;
  }
  if (!(ratio >= 0 && ratio < 1))
    return n.error() << "Dropout ratio " << ratio << " is outside [0, 1)";
  if (training && ratio > 0) {
    // The ONNX seed attribute, else a stable hash of the node's name (FNV-1a),
    // so each Dropout draws its own masks.
    int64_t seed = n.intAttr("seed", 0);
    if (!n.attr("seed")) {
      uint64_t h = 1469598103934665603ull;
      for (char c : n.node.name().empty() ? n.node.output(0) : n.node.name())
        h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
      seed = static_cast<int64_t>(h);
    }
    auto results = n.create("dropout", {n.input(0)}, {n.f64("ratio", ratio), n.i64("seed", seed)});
    if (failed(results))
      return failure();
    (void)n.setOutput(0, (*results)[0]);
    if (n.outputUsed(1))
      (void)n.setOutput(1, (*results)[1]);
    return success();
  }
  (void)n.setOutput(0, n.input(0));
  if (n.outputUsed(1)) {
    auto type = RankedTensorType::get(n.inputType(0).getShape(), n.b.getI1Type());
    (void)n.setOutput(1, n.constant(DenseElementsAttr::get(type, true)));
  }
  return success();
}

LogicalResult importCumSum(NodeImporter &n) {
  auto x = n.inputType(0);
  auto axisValue = n.constantScalar(1, "axis");
  if (!x || failed(axisValue))
    return failure();
  auto axis = normAxis(n, (int64_t)*axisValue, x.getRank());
  if (failed(axis))
    return failure();
  return output(n, n.create1("cumsum", {n.input(0)},
                             {n.i64("axis", *axis), n.flag("exclusive", n.intAttr("exclusive", 0)),
                              n.flag("reverse", n.intAttr("reverse", 0))}));
}

LogicalResult importOneHot(NodeImporter &n) {
  auto idx = n.inputType(0);
  auto depth = n.constantScalar(1, "depth");
  DenseElementsAttr values = n.constantInput(2);
  if (!idx || failed(depth))
    return failure();
  auto valuesType = n.inputType(2);
  if (!valuesType || valuesType.getNumElements() != 2)
    return n.error() << "values must hold two elements [off, on]";
  int64_t axis = n.intAttr("axis", -1);
  int64_t outRank = idx.getRank() + 1;
  if (axis < 0)
    axis += outRank;
  if (axis < 0 || axis >= outRank)
    return n.error() << "axis out of range";
  if (!values) { // values computed at run time: where(one_hot == 1, on, off)
    Type elem = valuesType.getElementType();
    auto hot = n.create1("one_hot", {n.input(0)},
                         {n.i64("depth", (int64_t)*depth), n.i64("axis", axis),
                          n.f64("off_value", 0.0), n.f64("on_value", 1.0),
                          n.named("dtype", TypeAttr::get(elem))});
    auto flat = n.reshape(n.input(2), {2});
    if (failed(hot) || failed(flat))
      return failure();
    auto pick = [&](int64_t i) -> FailureOr<Value> {
      auto s = n.create1("slice", {*flat}, {n.ints("starts", {i}), n.ints("ends", {i + 1}),
                                            n.ints("steps", {1})});
      if (failed(s))
        return failure();
      return n.reshape(*s, {});
    };
    auto off = pick(0), on = pick(1);
    if (failed(off) || failed(on))
      return failure();
    auto isOn = n.create1("equal", {*hot, n.scalar(elem, 1.0)});
    if (failed(isOn))
      return failure();
    return output(n, n.create1("where", {*isOn, *on, *off}));
  }
  SmallVector<double> v;
  if (isa<FloatType>(values.getElementType()))
    for (APFloat f : values.getValues<APFloat>())
      v.push_back(f.convertToDouble());
  else
    for (APInt i : values.getValues<APInt>())
      v.push_back(double(i.getSExtValue()));
  return output(n, n.create1("one_hot", {n.input(0)},
                             {n.i64("depth", (int64_t)*depth), n.i64("axis", axis),
                              n.f64("off_value", v[0]), n.f64("on_value", v[1]),
                              n.named("dtype", TypeAttr::get(values.getElementType()))}));
}

LogicalResult importNll(NodeImporter &n, Value logProb, Value target, Value weight) {
  SmallVector<NamedAttribute> attrs = {n.str("reduction", n.stringAttr("reduction", "mean"))};
  if (n.attr("ignore_index"))
    attrs.push_back(n.i64("ignore_index", n.intAttr("ignore_index", -100)));
  return output(n, n.create1("nll_loss", {logProb, target, weight}, attrs));
}

LogicalResult importSoftmaxCrossEntropy(NodeImporter &n) {
  auto logProb = n.create1("log_softmax", {n.input(0)}, {n.i64("axis", 1)});
  if (failed(logProb))
    return failure();
  if (n.outputUsed(1))
    (void)n.setOutput(1, *logProb);
  return importNll(n, *logProb, n.input(1), n.input(2));
}

LogicalResult importClip(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x)
    return n.error() << "missing input";
  double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
  if (n.opset < 11) {
    lo = n.floatAttr("min", lo);
    hi = n.floatAttr("max", hi);
  } else {
    // Non-constant bounds become max/min ops.
    Value v = n.input(0);
    for (int i : {1, 2}) {
      if (!n.input(i))
        continue;
      if (n.constantInput(i)) {
        auto c = n.constantScalar(i, i == 1 ? "min" : "max");
        if (failed(c))
          return failure();
        (i == 1 ? lo : hi) = *c;
        continue;
      }
      auto bounded = n.create1(i == 1 ? "max" : "min", {v, n.input(i)});
      if (failed(bounded))
        return failure();
      v = *bounded;
    }
    if (v != n.input(0))
      return output(n, n.create1("clip", {v}, {n.f64("min", lo), n.f64("max", hi)}));
  }
  return output(n, n.create1("clip", {n.input(0)}, {n.f64("min", lo), n.f64("max", hi)}));
}

LogicalResult importPow(NodeImporter &n) {
  auto base = n.inputType(0);
  if (!base || !n.input(1))
    return n.error() << "missing input";
  auto exponent = n.cast(n.input(1), base.getElementType());
  if (failed(exponent))
    return failure();
  return output(n, n.create1("pow", {n.input(0), *exponent}));
}

LogicalResult importCast(NodeImporter &n) {
  Type to = elementTypeFromOnnx(n.b.getContext(), n.intAttr("to", 0));
  if (!to)
    return n.error() << "cast to unsupported type " << onnxTypeName(n.intAttr("to", 0));
  if (n.intAttr("saturate", 1) == 0 &&
      isa<Float8E4M3FNType, Float8E5M2Type, Float8E4M3FNUZType, Float8E5M2FNUZType>(to))
    return output(n, n.create1("cast", {n.input(0)},
                               {n.named("to", TypeAttr::get(to)), n.flag("saturate", false)}));
  return output(n, n.cast(n.input(0), to));
}

LogicalResult importCastLike(NodeImporter &n) {
  auto target = n.inputType(1);
  if (!target)
    return n.error() << "missing target";
  return output(n, n.cast(n.input(0), target.getElementType()));
}

//===----------------------------------------------------------------------===//
// Einsum: two-operand (and one-operand) forms, lowered to reduce_sum /
// transpose / reshape / matmul; a letter repeated within an operand takes the
// diagonal (a strided slice) first.
//===----------------------------------------------------------------------===//

FailureOr<SmallVector<std::string>> parseEinsum(NodeImporter &n, StringRef equation,
                                                ArrayRef<RankedTensorType> types,
                                                std::string &outSpec) {
  std::string eq;
  for (char c : equation)
    if (c != ' ')
      eq.push_back(c);
  size_t arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow);
  SmallVector<std::string> specs;
  for (StringRef part : llvm::split(StringRef(lhs), ','))
    specs.push_back(part.str());
  if (specs.size() != types.size())
    return n.error() << "equation has " << specs.size() << " operands, node has " << types.size();
  // Expand "..." into capital letters (unused by the lowercase convention).
  int64_t ellipsisRank = 0;
  for (auto [i, s] : llvm::enumerate(specs)) {
    size_t pos = s.find("...");
    if (pos != std::string::npos)
      ellipsisRank = std::max<int64_t>(ellipsisRank, types[i].getRank() - (int64_t)(s.size() - 3));
  }
  auto expand = [&](std::string &s, int64_t rank) {
    size_t pos = s.find("...");
    if (pos == std::string::npos)
      return;
    int64_t k = rank - (int64_t)(s.size() - 3);
    std::string letters;
    for (int64_t j = ellipsisRank - k; j < ellipsisRank; ++j)
      letters.push_back('A' + j);
    s = s.substr(0, pos) + letters + s.substr(pos + 3);
  };
  for (auto [i, s] : llvm::enumerate(specs))
    expand(s, types[i].getRank());
  if (arrow != std::string::npos) {
    outSpec = eq.substr(arrow + 2);
    std::string ell;
    for (int64_t j = 0; j < ellipsisRank; ++j)
      ell.push_back('A' + j);
    size_t pos = outSpec.find("...");
    if (pos != std::string::npos)
      outSpec = outSpec.substr(0, pos) + ell + outSpec.substr(pos + 3);
  } else {
    // Implicit output: ellipsis dims, then letters appearing once, sorted.
    std::map<char, int> count;
    for (auto &s : specs)
      for (char c : s)
        count[c]++;
    for (int64_t j = 0; j < ellipsisRank; ++j)
      outSpec.push_back('A' + j);
    for (auto [c, k] : count)
      if (k == 1 && !(c >= 'A' && c <= 'Z'))
        outSpec.push_back(c);
  }
  for (auto [i, s] : llvm::enumerate(specs)) {
    if ((int64_t)s.size() != types[i].getRank())
      return n.error() << "operand " << i << " spec '" << s << "' does not match rank "
                       << types[i].getRank();
  }
  return specs;
}

LogicalResult importEinsum(NodeImporter &n) {
  SmallVector<RankedTensorType> types;
  SmallVector<Value> operands;
  for (int64_t i = 0; i < n.numInputs(); ++i) {
    operands.push_back(n.input(i));
    types.push_back(n.inputType(i));
  }
  if (operands.empty() || operands.size() > 2)
    return n.error() << "only one- and two-operand einsum is supported";
  std::string outSpec;
  auto specsOr = parseEinsum(n, n.stringAttr("equation", ""), types, outSpec);
  if (failed(specsOr))
    return failure();
  SmallVector<std::string> specs = *specsOr;
  // A letter repeated within an operand takes its diagonal: the two dims moved
  // last, merged, and every (extent + 1)-th element kept.
  for (size_t i = 0; i < operands.size(); ++i) {
    for (;;) {
      std::string &spec = specs[i];
      size_t first = std::string::npos, second = std::string::npos;
      for (size_t a = 0; a < spec.size() && second == std::string::npos; ++a)
        if (size_t b = spec.find(spec[a], a + 1); b != std::string::npos)
          first = a, second = b;
      if (second == std::string::npos)
        break;
      auto t = cast<RankedTensorType>(operands[i].getType());
      int64_t e = t.getDimSize(first);
      if (t.getDimSize(second) != e)
        return n.error() << "subscript '" << spec[first] << "' repeats with extents " << e
                         << " and " << t.getDimSize(second);
      SmallVector<int64_t> perm, shape;
      std::string rest;
      for (size_t d = 0; d < spec.size(); ++d)
        if (d != first && d != second) {
          perm.push_back(d);
          shape.push_back(t.getDimSize(d));
          rest.push_back(spec[d]);
        }
      perm.push_back(first);
      perm.push_back(second);
      shape.push_back(e * e);
      auto moved = n.transpose(operands[i], perm);
      if (failed(moved))
        return failure();
      auto merged = n.reshape(*moved, shape);
      if (failed(merged))
        return failure();
      SmallVector<int64_t> starts(shape.size(), 0), ends(shape), steps(shape.size(), 1);
      steps.back() = e + 1;
      auto diag = n.create1("slice", {*merged}, {n.ints("starts", starts), n.ints("ends", ends),
                                                 n.ints("steps", steps)});
      if (failed(diag))
        return failure();
      operands[i] = *diag;
      types[i] = cast<RankedTensorType>(operands[i].getType());
      spec = rest + spec[first];
    }
  }
  std::map<char, int64_t> extent;
  for (auto [i, s] : llvm::enumerate(specs))
    for (auto [d, c] : llvm::enumerate(s)) {
      int64_t e = types[i].getDimSize(d);
      if (extent.count(c) && extent[c] != e && extent[c] != 1 && e != 1)
        return n.error() << "subscript '" << c << "' has extents " << extent[c] << " and " << e;
      extent[c] = std::max(extent.count(c) ? extent[c] : 1, e);
    }

  // Sum away letters that appear in only one operand and not in the output.
  for (size_t i = 0; i < operands.size(); ++i) {
    SmallVector<int64_t> axes;
    std::string kept;
    for (auto [d, c] : llvm::enumerate(specs[i])) {
      bool elsewhere = outSpec.find(c) != std::string::npos;
      for (size_t j = 0; j < specs.size(); ++j)
        elsewhere |= j != i && specs[j].find(c) != std::string::npos;
      if (elsewhere)
        kept.push_back(c);
      else
        axes.push_back(d);
    }
    if (!axes.empty()) {
      auto r = n.create1("reduce_sum", {operands[i]}, {n.ints("axes", axes), n.flag("keepdims", false)});
      if (failed(r))
        return failure();
      operands[i] = *r;
      specs[i] = kept;
    }
  }

  auto permuteTo = [&](Value v, const std::string &from, const std::string &to) -> FailureOr<Value> {
    SmallVector<int64_t> perm;
    for (char c : to)
      perm.push_back(from.find(c));
    return n.transpose(v, perm);
  };

  if (operands.size() == 1)
    return output(n, permuteTo(operands[0], specs[0], outSpec));

  // Classify letters: batch (both + out), contracted (both, not out), free.
  std::string batch, contract, freeA, freeB;
  for (char c : specs[0]) {
    bool inB = specs[1].find(c) != std::string::npos, inOut = outSpec.find(c) != std::string::npos;
    if (inB && inOut)
      batch.push_back(c);
    else if (inB)
      contract.push_back(c);
    else
      freeA.push_back(c);
  }
  for (char c : specs[1])
    if (specs[0].find(c) == std::string::npos)
      freeB.push_back(c);
  auto size = [&](const std::string &letters) {
    int64_t s = 1;
    for (char c : letters)
      s *= extent[c];
    return s;
  };
  // Broadcast size-1 batch/contract dims of either side to the full extent.
  auto expandTo = [&](Value v, const std::string &spec) -> FailureOr<Value> {
    SmallVector<int64_t> shape;
    for (char c : spec)
      shape.push_back(extent[c]);
    if (cast<RankedTensorType>(v.getType()).getShape() == ArrayRef<int64_t>(shape))
      return v;
    return n.create1("broadcast", {v}, {n.ints("shape", shape)});
  };
  std::string specA = batch + freeA + contract, specB = batch + contract + freeB;
  auto a = permuteTo(operands[0], specs[0], specA);
  auto bv = permuteTo(operands[1], specs[1], specB);
  if (failed(a) || failed(bv))
    return failure();
  auto a2 = expandTo(*a, specA), b2 = expandTo(*bv, specB);
  if (failed(a2) || failed(b2))
    return failure();
  auto a3 = n.reshape(*a2, {size(batch), size(freeA), size(contract)});
  auto b3 = n.reshape(*b2, {size(batch), size(contract), size(freeB)});
  if (failed(a3) || failed(b3))
    return failure();
  auto product3 = n.create1("matmul", {*a3, *b3});
  if (failed(product3))
    return failure();
  std::string resultSpec = batch + freeA + freeB;
  SmallVector<int64_t> resultShape;
  for (char c : resultSpec)
    resultShape.push_back(extent[c]);
  auto shaped = n.reshape(*product3, resultShape);
  if (failed(shaped))
    return failure();
  if (resultSpec.size() != outSpec.size())
    return n.error() << "output subscripts '" << outSpec << "' are not computable";
  return output(n, permuteTo(*shaped, resultSpec, outSpec));
}


} // namespace

const llvm::StringMap<OpRule> &onnx_import::onnxOpRules() {
  static const llvm::StringMap<OpRule> rules = [] {
    llvm::StringMap<OpRule> r;
    for (auto [onnx, forge] : std::initializer_list<std::pair<const char *, const char *>>{
             {"Add", "add"}, {"Sub", "sub"}, {"Mul", "mul"}, {"Div", "div"},
             {"And", "and"}, {"Or", "or"}, {"Equal", "equal"}, {"Less", "less"},
             {"Greater", "greater"}, {"LessOrEqual", "less_equal"},
             {"GreaterOrEqual", "greater_equal"}, {"Neg", "neg"}, {"Abs", "abs"},
             {"Exp", "exp"}, {"Log", "log"}, {"Sqrt", "sqrt"}, {"Reciprocal", "reciprocal"},
             {"Tanh", "tanh"}, {"Sigmoid", "sigmoid"}, {"Relu", "relu"}, {"Erf", "erf"},
             {"Softplus", "softplus"}, {"HardSwish", "hard_swish"}, {"Not", "not"},
             {"IsNaN", "isnan"}, {"Where", "where"}, {"MatMul", "matmul"},
             {"Sin", "sin"}, {"Cos", "cos"}, {"Tan", "tan"}, {"Asin", "asin"},
             {"Acos", "acos"}, {"Atan", "atan"}, {"Sinh", "sinh"}, {"Cosh", "cosh"},
             {"Asinh", "asinh"}, {"Acosh", "acosh"}, {"Atanh", "atanh"}, {"Xor", "xor"},
             {"Floor", "floor"}, {"Ceil", "ceil"}, {"Round", "round"},
             {"BitwiseAnd", "bitwise_and"}, {"BitwiseOr", "bitwise_or"},
             {"BitwiseXor", "bitwise_xor"}, {"BitwiseNot", "bitwise_not"}})
      r[onnx] = direct(forge);
    r["Sum"] = variadic("add");
    r["Mean"] = variadic("add", /*mean=*/true);
    r["Min"] = variadic("min");
    r["Max"] = variadic("max");
    r["Pow"] = importPow;
    r["LeakyRelu"] = unaryWith("leaky_relu", [](NodeImporter &n) {
      return SmallVector<NamedAttribute>{n.f64("alpha", n.floatAttr("alpha", 0.01))};
    });
    r["Elu"] = unaryWith("elu", [](NodeImporter &n) {
      return SmallVector<NamedAttribute>{n.f64("alpha", n.floatAttr("alpha", 1.0))};
    });
    r["Gelu"] = unaryWith("gelu", [](NodeImporter &n) {
      return SmallVector<NamedAttribute>{n.str("approximate", n.stringAttr("approximate", "none"))};
    });
    r["HardSigmoid"] = unaryWith("hard_sigmoid", [](NodeImporter &n) {
      return SmallVector<NamedAttribute>{n.f64("alpha", n.floatAttr("alpha", 0.2)),
                                         n.f64("beta", n.floatAttr("beta", 0.5))};
    });
    r["Selu"] = unaryWith("selu", [](NodeImporter &n) {
      // ONNX's defaults are these float32 values.
      return SmallVector<NamedAttribute>{
          n.f64("alpha", n.floatAttr("alpha", 1.67326319217681884765625)),
          n.f64("gamma", n.floatAttr("gamma", 1.05070102214813232421875))};
    });
    r["ThresholdedRelu"] = unaryWith("thresholded_relu", [](NodeImporter &n) {
      return SmallVector<NamedAttribute>{n.f64("alpha", n.floatAttr("alpha", 1.0))};
    });
    r["IsInf"] = unaryWith("isinf", [](NodeImporter &n) {
      return SmallVector<NamedAttribute>{
          n.flag("detect_positive", n.intAttr("detect_positive", 1) != 0),
          n.flag("detect_negative", n.intAttr("detect_negative", 1) != 0)};
    });
    r["Mod"] = [](NodeImporter &n) {
      return output(n, n.create1("mod", {n.input(0), n.input(1)},
                                 {n.flag("fmod", n.intAttr("fmod", 0) != 0)}));
    };
    r["BitShift"] = [](NodeImporter &n) -> LogicalResult {
      std::string direction = n.stringAttr("direction", "");
      if (direction != "LEFT" && direction != "RIGHT")
        return n.error() << "direction must be LEFT or RIGHT, got '" << direction << "'";
      auto x = n.inputType(0);
      if (!x || !x.getElementType().isUnsignedInteger())
        return n.error() << "operands must be unsigned integers";
      return output(n, n.create1("bit_shift", {n.input(0), n.input(1)},
                                 {n.str("direction", direction)}));
    };
    r["Clip"] = importClip;
    r["Cast"] = importCast;
    r["CastLike"] = importCastLike;
    r["Gemm"] = [](NodeImporter &n) {
      return output(n, n.create1("gemm", {n.input(0), n.input(1), n.input(2)},
                                 {n.flag("transA", n.intAttr("transA", 0)),
                                  n.flag("transB", n.intAttr("transB", 0)),
                                  n.f64("alpha", n.floatAttr("alpha", 1.0)),
                                  n.f64("beta", n.floatAttr("beta", 1.0))}));
    };
    r["Conv"] = importConv;
    r["ConvTranspose"] = importConvTranspose;
    r["MaxPool"] = [](NodeImporter &n) { return importPool(n, true); };
    r["AveragePool"] = [](NodeImporter &n) { return importPool(n, false); };
    r["GlobalAveragePool"] = [](NodeImporter &n) { return importGlobalPool(n, "reduce_mean"); };
    r["GlobalMaxPool"] = [](NodeImporter &n) { return importGlobalPool(n, "reduce_max"); };
    r["BatchNormalization"] = importBatchNorm;
    r["LayerNormalization"] = importLayerNorm;
    r["GroupNormalization"] = [](NodeImporter &n) { return importGroupNorm(n, false); };
    r["InstanceNormalization"] = [](NodeImporter &n) { return importGroupNorm(n, true); };
    r["Softmax"] = softmaxLike("softmax");
    r["LogSoftmax"] = softmaxLike("log_softmax");
    r["Reshape"] = importReshape;
    r["Flatten"] = importFlatten;
    r["Squeeze"] = importSqueeze;
    r["Unsqueeze"] = importUnsqueeze;
    r["Transpose"] = importTranspose;
    r["Concat"] = importConcat;
    r["Split"] = importSplit;
    r["Slice"] = importSlice;
    r["Gather"] = [](NodeImporter &n) { return importGather(n, "gather"); };
    r["GatherElements"] = [](NodeImporter &n) { return importGather(n, "gather_elements"); };
    r["Expand"] = importExpand;
    r["Tile"] = importTile;
    r["Shape"] = importShape;
    r["Size"] = importSize;
    r["ConstantOfShape"] = importConstantOfShape;
    r["Constant"] = importConstant;
    r["Identity"] = importIdentity;
    r["Range"] = importRange;
    r["Trilu"] = importTrilu;
    r["Pad"] = importPad;
    r["ReduceMean"] = reduce("reduce_mean");
    r["ReduceSum"] = reduce("reduce_sum");
    r["ReduceMax"] = reduce("reduce_max");
    r["ReduceMin"] = reduce("reduce_min");
    r["ReduceProd"] = reduce("reduce_prod");
    r["ReduceL2"] = reduce("reduce_l2");
    r["ArgMax"] = importArgMax;
    r["Dropout"] = importDropout;
    r["Einsum"] = importEinsum;
    r["CumSum"] = importCumSum;
    r["OneHot"] = importOneHot;
    r["SoftmaxCrossEntropyLoss"] = importSoftmaxCrossEntropy;
    r["NegativeLogLikelihoodLoss"] = [](NodeImporter &n) {
      return importNll(n, n.input(0), n.input(1), n.input(2));
    };
    addCompositeRules(r);
    addRecurrentRules(r);
    return r;
  }();
  return rules;
}
