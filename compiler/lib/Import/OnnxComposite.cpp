//===- OnnxComposite.cpp - ONNX ops imported as compositions ---------------===//
//
// ONNX ops that Forge imports as a few forge primitives rather than as ops of
// their own: the rarer reductions, ArgMin, Hardmax, TopK (on forge.top_k),
// DepthToSpace/SpaceToDepth, GatherND, ScatterElements/ScatterND (on
// forge.scatter_elements), Resize and Upsample (constant interpolation
// matrices), small activations (Softsign, Mish, Celu, Shrink, Sign, PRelu),
// normalizations (MeanVarianceNormalization, LpNormalization, LRN), Lp pools,
// CenterCropPad, EyeLike, ReverseSequence, and opset 23's RMSNormalization,
// RotaryEmbedding and Attention.
//
// Invariants: every rule builds existing forge ops through NodeImporter (type
// inference and verification per op, errors naming the node), so its gradient
// is the chain of the primitives' checked rules and every device runs it with
// the primitives' kernels. A composite follows the ONNX function body or
// reference where one exists (RMSNormalization's stash type, for instance), so
// the `_expanded` conformance tests and the plain ones agree.
//
//===----------------------------------------------------------------------===//

#include "ImportContext.h"

#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/STLExtras.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

using namespace mlir;
using namespace mlir::forge;
using namespace mlir::forge::onnx_import;

namespace {

RankedTensorType typeOf(Value v) { return cast<RankedTensorType>(v.getType()); }

/// An element type from an ONNX TensorProto.DataType code (the float and common
/// integer types), null when Forge has no such type.
Type onnxElementType(NodeImporter &n, int64_t code) {
  switch (code) {
  case 1: return n.b.getF32Type();
  case 10: return n.b.getF16Type();
  case 11: return n.b.getF64Type();
  case 16: return n.b.getBF16Type();
  case 6: return n.b.getI32Type();
  case 7: return n.b.getI64Type();
  default: return Type();
  }
}

/// Sets output `index` from `v`, propagating a failure.
LogicalResult out(NodeImporter &n, FailureOr<Value> v, int64_t index = 0) {
  if (failed(v))
    return failure();
  return n.setOutput(index, *v);
}

/// Chains creates: each step's failure (already reported on the node) ends it.
#define FORGE_TRY(var, expr)                                                                       \
  auto var##OrFailure = (expr);                                                                    \
  if (failed(var##OrFailure))                                                                      \
    return failure();                                                                              \
  Value var = *var##OrFailure

/// A reduction's axes as ReduceX defines them (input 1 from opset 18, else the
/// attribute; none: all axes, or no reduction with noop_with_empty_axes).
struct ReduceSpec {
  SmallVector<int64_t> axes;
  bool keepdims = true;
  bool noop = false; // noop_with_empty_axes and no axes: the input, transformed
};

FailureOr<ReduceSpec> reduceSpec(NodeImporter &n, RankedTensorType x) {
  ReduceSpec s;
  auto axesOpt = axesOf(n, 1);
  if (failed(axesOpt))
    return failure();
  s.keepdims = n.intAttr("keepdims", 1) != 0;
  if (*axesOpt && !(*axesOpt)->empty()) {
    auto norm = normAxes(n, **axesOpt, std::max<int64_t>(x.getRank(), 1));
    if (failed(norm))
      return failure();
    s.axes = *norm;
  } else if (n.intAttr("noop_with_empty_axes", 0)) {
    s.noop = true;
  } else {
    for (int64_t d = 0; d < x.getRank(); ++d)
      s.axes.push_back(d);
  }
  return s;
}

FailureOr<Value> reduce(NodeImporter &n, StringRef op, Value x, ArrayRef<int64_t> axes,
                        bool keepdims) {
  return n.create1(op, {x}, {n.ints("axes", axes), n.flag("keepdims", keepdims)});
}

/// ReduceSumSquare, ReduceL1, ReduceLogSum: sum(transform(x)), then `post`.
OpRule sumOf(StringRef pre, StringRef post) {
  std::string preOp = pre.str(), postOp = post.str();
  return [preOp, postOp](NodeImporter &n) -> LogicalResult {
    auto x = n.inputType(0);
    if (!x)
      return n.error() << "missing input";
    auto spec = reduceSpec(n, x);
    if (failed(spec))
      return failure();
    Value t = n.input(0);
    if (preOp == "square") {
      FORGE_TRY(sq, n.create1("mul", {t, t}));
      t = sq;
    } else if (!preOp.empty()) {
      FORGE_TRY(v, n.create1(preOp, {t}));
      t = v;
    }
    if (!spec->noop) {
      FORGE_TRY(sum, reduce(n, "reduce_sum", t, spec->axes, spec->keepdims));
      t = sum;
    }
    if (!postOp.empty())
      return out(n, n.create1(postOp, {t}));
    return n.setOutput(0, t);
  };
}

/// ReduceLogSumExp = m + log(sum(exp(x - m))), m = max over the axes: no
/// overflow for large x. The gradient through m cancels (it is softmax).
LogicalResult importReduceLogSumExp(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x)
    return n.error() << "missing input";
  if (!isa<FloatType>(x.getElementType()))
    return n.error() << "ReduceLogSumExp needs a float input";
  auto spec = reduceSpec(n, x);
  if (failed(spec))
    return failure();
  if (spec->noop) // log(exp(x)) over no axes
    return n.setOutput(0, n.input(0));
  FORGE_TRY(mRaw, reduce(n, "reduce_max", n.input(0), spec->axes, true));
  // An infinite maximum shifts by 0 (inf - inf would be NaN): the result is
  // then log(sum(exp(x))) = +-inf, as the reference and PyTorch give.
  FORGE_TRY(infinite, n.create1("isinf", {mRaw}, {n.flag("detect_positive", true),
                                                  n.flag("detect_negative", true)}));
  FORGE_TRY(m, n.create1("where", {infinite, n.scalar(x.getElementType(), 0.0), mRaw}));
  FORGE_TRY(shifted, n.create1("sub", {n.input(0), m}));
  FORGE_TRY(e, n.create1("exp", {shifted}));
  FORGE_TRY(s, reduce(n, "reduce_sum", e, spec->axes, spec->keepdims));
  FORGE_TRY(l, n.create1("log", {s}));
  Value mk = m;
  if (!spec->keepdims) {
    FORGE_TRY(r, n.reshape(m, typeOf(l).getShape()));
    mk = r;
  }
  return out(n, n.create1("add", {l, mk}));
}

/// ArgMin = ArgMax of an order-reversing map: -x for floats, -1 - x (= ~x) for
/// signed and MAX - x for unsigned integers (neither overflows); ties keep
/// their order, so select_last_index carries over.
LogicalResult importArgMin(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x)
    return n.error() << "missing input";
  auto axis = normAxis(n, n.intAttr("axis", 0), x.getRank());
  if (failed(axis))
    return failure();
  Type elem = x.getElementType();
  FailureOr<Value> reversed;
  if (isa<FloatType>(elem)) {
    reversed = n.create1("neg", {n.input(0)});
  } else if (auto it = dyn_cast<IntegerType>(elem); it && it.getWidth() > 1) {
    // Constants in the tensor's own (signless/unsigned) type; -1 and MAX share their bits.
    auto t = RankedTensorType::get({}, elem);
    Value c = n.constant(DenseElementsAttr::get(t, APInt::getAllOnes(it.getWidth())));
    reversed = n.create1("sub", {c, n.input(0)});
  } else {
    return n.error() << "ArgMin of " << elem << " is unsupported";
  }
  if (failed(reversed))
    return failure();
  return out(n, n.create1("argmax", {*reversed},
                          {n.i64("axis", *axis), n.flag("keepdims", n.intAttr("keepdims", 1)),
                           n.flag("select_last_index", n.intAttr("select_last_index", 0))}));
}

/// Hardmax: one_hot(argmax(x, axis)) in x's type (the first maximum wins).
/// Before opset 13 the input is coerced to 2-d at `axis` (default 1).
LogicalResult importHardmax(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x)
    return n.error() << "missing input";
  Value in = n.input(0);
  int64_t rank = x.getRank();
  auto axis = normAxis(n, n.intAttr("axis", n.opset < 13 ? 1 : -1), rank);
  if (failed(axis))
    return failure();
  int64_t a = *axis;
  if (n.opset < 13) {
    int64_t rows = 1, cols = 1;
    for (int64_t d = 0; d < rank; ++d)
      (d < a ? rows : cols) *= x.getDimSize(d);
    FORGE_TRY(flat, n.reshape(in, {rows, cols}));
    in = flat;
    a = 1;
  }
  auto inType = typeOf(in);
  FORGE_TRY(am, n.create1("argmax", {in}, {n.i64("axis", a), n.flag("keepdims", false),
                                           n.flag("select_last_index", false)}));
  FORGE_TRY(hot, n.create1("one_hot", {am},
                           {n.i64("depth", inType.getDimSize(a)), n.i64("axis", a),
                            n.f64("off_value", 0.0), n.f64("on_value", 1.0),
                            n.named("dtype", TypeAttr::get(x.getElementType()))}));
  return out(n, n.reshape(hot, x.getShape()));
}

/// TopK: k is the attribute before opset 10, then input 1, which must be a
/// constant (the outputs' shape depends on it); largest/sorted from opset 11.
LogicalResult importTopK(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x)
    return n.error() << "missing input";
  auto axis = normAxis(n, n.intAttr("axis", -1), x.getRank());
  if (failed(axis))
    return failure();
  int64_t k = n.intAttr("k", -1);
  if (n.opset >= 10) {
    auto ks = n.constantInts(1, "K");
    if (failed(ks))
      return failure();
    if (ks->size() != 1)
      return n.error() << "input 1 (K) must hold one value, got " << ks->size();
    k = (*ks)[0];
  } else if (!n.attr("k")) {
    return n.error() << "missing attribute k";
  }
  int64_t extent = x.getDimSize(*axis);
  if (k < 0 || k > extent)
    return n.error() << "K = " << k << " is outside [0, " << extent << "] (the size of axis "
                     << *axis << ")";
  auto results = n.create("top_k", {n.input(0)},
                          {n.i64("axis", *axis), n.i64("k", k),
                           n.flag("largest", n.intAttr("largest", 1) != 0),
                           n.flag("sorted", n.intAttr("sorted", 1) != 0)});
  if (failed(results))
    return failure();
  for (int64_t i = 0; i < 2; ++i)
    if (n.outputUsed(i))
      (void)n.setOutput(i, (*results)[i]);
  return success();
}

/// DepthToSpace (DCR or CRD) and SpaceToDepth: reshape, transpose, reshape.
LogicalResult importDepthToSpace(NodeImporter &n) {
  auto x = n.inputType(0);
  int64_t b = n.intAttr("blocksize", 0);
  if (!x || x.getRank() != 4 || b <= 0 || x.getDimSize(1) % (b * b))
    return n.error() << "DepthToSpace needs a 4-d input whose channels divide by blocksize^2";
  int64_t N = x.getDimSize(0), C = x.getDimSize(1), H = x.getDimSize(2), W = x.getDimSize(3);
  bool crd = n.stringAttr("mode", "DCR") == "CRD";
  FORGE_TRY(split, n.reshape(n.input(0), crd ? SmallVector<int64_t>{N, C / (b * b), b, b, H, W}
                                             : SmallVector<int64_t>{N, b, b, C / (b * b), H, W}));
  FORGE_TRY(moved, n.transpose(split, crd ? SmallVector<int64_t>{0, 1, 4, 2, 5, 3}
                                          : SmallVector<int64_t>{0, 3, 4, 1, 5, 2}));
  return out(n, n.reshape(moved, {N, C / (b * b), H * b, W * b}));
}

LogicalResult importSpaceToDepth(NodeImporter &n) {
  auto x = n.inputType(0);
  int64_t b = n.intAttr("blocksize", 0);
  if (!x || x.getRank() != 4 || b <= 0 || x.getDimSize(2) % b || x.getDimSize(3) % b)
    return n.error() << "SpaceToDepth needs a 4-d input whose height and width divide by "
                        "blocksize";
  int64_t N = x.getDimSize(0), C = x.getDimSize(1), H = x.getDimSize(2), W = x.getDimSize(3);
  FORGE_TRY(split, n.reshape(n.input(0), {N, C, H / b, b, W / b, b}));
  FORGE_TRY(moved, n.transpose(split, {0, 3, 5, 1, 2, 4}));
  return out(n, n.reshape(moved, {N, C * b * b, H / b, W / b}));
}

/// The k components on the last dim of `index` ([..., k], int32/int64) as one
/// linear int64 index into the k dims of `data` after its first `batchDims`
/// ([..., ] = the index's shape without its last dim): negative components
/// count from their dim's end, and with batch dims each batch's block of
/// prod(indexed dims) follows the previous one. A component outside its own
/// range makes the linear index leave the tensor, so the gather's or scatter's
/// bounds check reports it.
FailureOr<Value> linearIndex(NodeImporter &n, RankedTensorType data, Value index,
                             int64_t batchDims) {
  auto idx = typeOf(index);
  int64_t q = idx.getRank(), k = idx.getShape().back(), b = batchDims;
  Type i64 = n.b.getI64Type();
  FORGE_TRY(wide, n.cast(index, i64));
  SmallVector<int64_t> dims, strides(k, 1);
  for (int64_t j = 0; j < k; ++j)
    dims.push_back(data.getDimSize(b + j));
  for (int64_t j = k - 2; j >= 0; --j)
    strides[j] = strides[j + 1] * dims[j + 1];
  auto vec = [&](ArrayRef<int64_t> v) {
    return n.constant(DenseElementsAttr::get(RankedTensorType::get({k}, i64), v));
  };
  FORGE_TRY(negative, n.create1("less", {wide, n.scalar(i64, 0)}));
  FORGE_TRY(wrapped, n.create1("add", {wide, vec(dims)}));
  FORGE_TRY(wrappedOrNot, n.create1("where", {negative, wrapped, wide}));
  // A component outside its own [-dim, dim) becomes the total row count, so
  // the linear index leaves [0, rows) and the gather's or scatter's bounds
  // check reports it (folded, it could land on another, valid element).
  int64_t rows = 1;
  for (int64_t d = 0; d < b + k; ++d)
    rows *= data.getDimSize(d);
  FORGE_TRY(low, n.create1("less", {wrappedOrNot, n.scalar(i64, 0)}));
  FORGE_TRY(high, n.create1("greater_equal", {wrappedOrNot, vec(dims)}));
  FORGE_TRY(outside, n.create1("or", {low, high}));
  FORGE_TRY(norm, n.create1("where", {outside, n.scalar(i64, static_cast<double>(rows)),
                                      wrappedOrNot}));
  FORGE_TRY(weighted, n.create1("mul", {norm, vec(strides)}));
  // Sum of the k components: slices and adds (elementwise integer kernels; an
  // integer reduce_sum would run on the host), k being small.
  SmallVector<int64_t> rowShape(idx.getShape().drop_back());
  Value linear;
  for (int64_t j = 0; j < k; ++j) {
    SmallVector<int64_t> starts(q, 0), ends(idx.getShape()), steps(q, 1);
    starts.back() = j;
    ends.back() = j + 1;
    FORGE_TRY(part, n.create1("slice", {weighted}, {n.ints("starts", starts), n.ints("ends", ends),
                                                    n.ints("steps", steps)}));
    FORGE_TRY(flat, n.reshape(part, rowShape));
    if (!linear) {
      linear = flat;
      continue;
    }
    FORGE_TRY(sum, n.create1("add", {linear, flat}));
    linear = sum;
  }
  if (!linear) // k == 0: every index tuple addresses the whole (batch's) data
    linear = n.constant(DenseElementsAttr::get(RankedTensorType::get(rowShape, i64),
                                               n.b.getI64IntegerAttr(0).getValue()));
  if (b == 0)
    return linear;
  int64_t batch = 1, indexed = 1;
  for (int64_t d = 0; d < b; ++d)
    batch *= data.getDimSize(d);
  for (int64_t d : dims)
    indexed *= d;
  // + (flat batch position) * indexed, broadcast over the index dims.
  SmallVector<int64_t> offShape(idx.getShape().take_front(b));
  offShape.append(q - 1 - b, 1);
  SmallVector<int64_t> offsets(batch);
  for (int64_t i = 0; i < batch; ++i)
    offsets[i] = i * indexed;
  Value off = n.constant(
      DenseElementsAttr::get(RankedTensorType::get(offShape, i64), ArrayRef<int64_t>(offsets)));
  return n.create1("add", {linear, off});
}

/// GatherND: one gather on the data flattened to [batch * prod(indexed dims),
/// rest...] at the linear index.
LogicalResult importGatherND(NodeImporter &n) {
  auto data = n.inputType(0), idx = n.inputType(1);
  if (!data || !idx || idx.getRank() < 1)
    return n.error() << "GatherND needs data and indices of rank >= 1";
  int64_t b = n.intAttr("batch_dims", 0), r = data.getRank(), q = idx.getRank();
  int64_t k = idx.getShape().back();
  if (b < 0 || b >= q || b >= r || k < 0 || b + k > r)
    return n.error() << "GatherND: batch_dims " << b << " and index depth " << k
                     << " do not fit data of rank " << r << " and indices of rank " << q;
  for (int64_t d = 0; d < b; ++d)
    if (data.getDimSize(d) != idx.getDimSize(d))
      return n.error() << "GatherND: batch dim " << d << " differs between data and indices";
  FORGE_TRY(linear, linearIndex(n, data, n.input(1), b));
  int64_t rows = 1;
  for (int64_t d = 0; d < b + k; ++d)
    rows *= data.getDimSize(d);
  SmallVector<int64_t> flatShape = {rows};
  flatShape.append(data.getShape().begin() + b + k, data.getShape().end());
  FORGE_TRY(flat, n.reshape(n.input(0), flatShape));
  return out(n, n.create1("gather", {flat, linear}, {n.i64("axis", 0)}));
}

/// ONNX's reduction attribute of the scatters (opset 16+; none before).
FailureOr<std::string> scatterReduction(NodeImporter &n) {
  std::string r = n.stringAttr("reduction", "none");
  if (r != "none" && r != "add" && r != "mul" && r != "max" && r != "min")
    return n.error() << "unsupported reduction '" << r << "'";
  return r;
}

LogicalResult importScatterElements(NodeImporter &n) {
  auto data = n.inputType(0);
  if (!data)
    return n.error() << "missing input";
  auto axis = normAxis(n, n.intAttr("axis", 0), data.getRank());
  auto reduction = scatterReduction(n);
  if (failed(axis) || failed(reduction))
    return failure();
  return out(n, n.create1("scatter_elements", {n.input(0), n.input(1), n.input(2)},
                          {n.i64("axis", *axis), n.str("reduction", *reduction)}));
}

/// ScatterND as scatter_elements on the data flattened to [prod(indexed dims),
/// rest]: update row m goes to row linear[m] (the index broadcast over the row).
LogicalResult importScatterND(NodeImporter &n) {
  auto data = n.inputType(0), idx = n.inputType(1), upd = n.inputType(2);
  if (!data || !idx || !upd || idx.getRank() < 1)
    return n.error() << "ScatterND needs data, indices of rank >= 1 and updates";
  int64_t k = idx.getShape().back(), r = data.getRank();
  if (k < 1 || k > r)
    return n.error() << "ScatterND: index depth " << k << " does not fit data of rank " << r;
  auto reduction = scatterReduction(n);
  if (failed(reduction))
    return failure();
  int64_t rows = 1, rest = 1, m = idx.getNumElements() / k;
  for (int64_t d = 0; d < r; ++d)
    (d < k ? rows : rest) *= data.getDimSize(d);
  if (upd.getNumElements() != m * rest)
    return n.error() << "ScatterND: updates hold " << upd.getNumElements() << " values, the "
                     << "indices address " << m * rest;
  FORGE_TRY(linear, linearIndex(n, data, n.input(1), 0));
  FORGE_TRY(column, n.reshape(linear, {m, 1}));
  FORGE_TRY(index, n.create1("broadcast", {column}, {n.ints("shape", {m, rest})}));
  FORGE_TRY(flatData, n.reshape(n.input(0), {rows, rest}));
  FORGE_TRY(flatUpd, n.reshape(n.input(2), {m, rest}));
  FORGE_TRY(scattered, n.create1("scatter_elements", {flatData, index, flatUpd},
                                 {n.i64("axis", 0), n.str("reduction", *reduction)}));
  return out(n, n.reshape(scattered, data.getShape()));
}

/// RMSNormalization (opset 23) as its function body: in the stash type (f32 by
/// default), X / sqrt(mean(X^2 over [axis, rank)) + epsilon), cast back to X's
/// type, times scale.
LogicalResult importRMSNormalization(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x || !n.input(1))
    return n.error() << "RMSNormalization needs X and scale";
  auto axis = normAxis(n, n.intAttr("axis", -1), x.getRank());
  if (failed(axis))
    return failure();
  int64_t stash = n.intAttr("stash_type", 1);
  if (stash != 1)
    return n.error() << "RMSNormalization stash_type " << stash << " is unsupported (1: float)";
  SmallVector<int64_t> axes;
  for (int64_t d = *axis; d < x.getRank(); ++d)
    axes.push_back(d);
  Type f32 = n.b.getF32Type();
  FORGE_TRY(xs, n.cast(n.input(0), f32));
  FORGE_TRY(sq, n.create1("mul", {xs, xs}));
  FORGE_TRY(ms, reduce(n, "reduce_mean", sq, axes, true));
  FORGE_TRY(mse, n.create1("add", {ms, n.scalar(f32, n.floatAttr("epsilon", 1e-5))}));
  FORGE_TRY(rms, n.create1("sqrt", {mse}));
  FORGE_TRY(normalized, n.create1("div", {xs, rms}));
  FORGE_TRY(back, n.cast(normalized, x.getElementType()));
  return out(n, n.create1("mul", {back, n.input(1)}));
}

/// A strided slice of the last dim (the others whole).
FailureOr<Value> sliceLast(NodeImporter &n, Value v, int64_t start, int64_t end,
                           int64_t step = 1) {
  auto t = typeOf(v);
  SmallVector<int64_t> starts(t.getRank(), 0), ends(t.getShape()), steps(t.getRank(), 1);
  starts.back() = start;
  ends.back() = end;
  steps.back() = step;
  return n.create1("slice", {v}, {n.ints("starts", starts), n.ints("ends", ends),
                                  n.ints("steps", steps)});
}

/// RotaryEmbedding (opset 23), as ONNX's reference: in [batch, seq, heads, head]
/// layout, the first rotary_embedding_dim channels of each head rotate by the
/// cached angles (halves, or even/odd channels when interleaved), the rest pass.
LogicalResult importRotaryEmbedding(NodeImporter &n) {
  auto x = n.inputType(0), cosType = n.inputType(1);
  if (!x || !cosType || !n.input(2) || (x.getRank() != 3 && x.getRank() != 4))
    return n.error() << "RotaryEmbedding needs a 3-d or 4-d input and cos/sin caches";
  bool interleaved = n.intAttr("interleaved", 0) != 0;
  int64_t batch = x.getDimSize(0);
  Value in = n.input(0);
  if (x.getRank() == 4) { // [B, H, S, D] -> [B, S, H, D]
    FORGE_TRY(t, n.transpose(in, {0, 2, 1, 3}));
    in = t;
  } else {
    int64_t heads = n.intAttr("num_heads", 0);
    if (heads <= 0 || x.getDimSize(2) % heads)
      return n.error() << "RotaryEmbedding of a 3-d input needs num_heads dividing its hidden size";
    FORGE_TRY(r, n.reshape(in, {batch, x.getDimSize(1), heads, x.getDimSize(2) / heads}));
    in = r;
  }
  auto t4 = typeOf(in);
  int64_t seq = t4.getDimSize(1), head = t4.getDimSize(3);
  int64_t rd = n.intAttr("rotary_embedding_dim", 0);
  if (rd == 0)
    rd = head;
  if (rd % 2 || rd > head)
    return n.error() << "RotaryEmbedding: rotary_embedding_dim " << rd << " must be even and at "
                     << "most the head size " << head;
  Value cos = n.input(1), sin = n.input(2);
  if (n.input(3)) { // caches [max_position, rd/2] indexed by position_ids [B, S]
    FORGE_TRY(c, n.create1("gather", {cos, n.input(3)}, {n.i64("axis", 0)}));
    FORGE_TRY(s2, n.create1("gather", {sin, n.input(3)}, {n.i64("axis", 0)}));
    cos = c;
    sin = s2;
  }
  if (typeOf(cos).getRank() != 3)
    return n.error() << "RotaryEmbedding: the cos/sin caches must give [batch, seq, dim/2]";
  FORGE_TRY(cosH, sliceLast(n, cos, 0, rd / 2));
  FORGE_TRY(sinH, sliceLast(n, sin, 0, rd / 2));
  FORGE_TRY(cos4, n.reshape(cosH, {batch, seq, 1, rd / 2}));
  FORGE_TRY(sin4, n.reshape(sinH, {batch, seq, 1, rd / 2}));
  FORGE_TRY(x1, interleaved ? sliceLast(n, in, 0, rd, 2) : sliceLast(n, in, 0, rd / 2));
  FORGE_TRY(x2, interleaved ? sliceLast(n, in, 1, rd, 2) : sliceLast(n, in, rd / 2, rd));
  FORGE_TRY(c1, n.create1("mul", {cos4, x1}));
  FORGE_TRY(s2v, n.create1("mul", {sin4, x2}));
  FORGE_TRY(real, n.create1("sub", {c1, s2v}));
  FORGE_TRY(s1, n.create1("mul", {sin4, x1}));
  FORGE_TRY(c2, n.create1("mul", {cos4, x2}));
  FORGE_TRY(imag, n.create1("add", {s1, c2}));
  Value rotated;
  if (interleaved) { // channel 2i = real i, 2i+1 = imag i
    SmallVector<int64_t> pairShape(typeOf(real).getShape());
    pairShape.push_back(1);
    FORGE_TRY(re, n.reshape(real, pairShape));
    FORGE_TRY(im, n.reshape(imag, pairShape));
    FORGE_TRY(pairs, n.create1("concat", {re, im}, {n.i64("axis", 4)}));
    FORGE_TRY(flat, n.reshape(pairs, {batch, seq, t4.getDimSize(2), rd}));
    rotated = flat;
  } else {
    FORGE_TRY(cat, n.create1("concat", {real, imag}, {n.i64("axis", 3)}));
    rotated = cat;
  }
  if (rd < head) {
    FORGE_TRY(pass, sliceLast(n, in, rd, head));
    FORGE_TRY(whole, n.create1("concat", {rotated, pass}, {n.i64("axis", 3)}));
    rotated = whole;
  }
  if (x.getRank() == 4)
    return out(n, n.transpose(rotated, {0, 2, 1, 3}));
  return out(n, n.reshape(rotated, x.getShape()));
}

/// Attention (opset 23) in primitives: [B, H, S, D] layout (3-d inputs
/// [B, S, H*D] are split into heads and transposed, as the spec defines; see
/// onnx/onnx#7118 on the reference's missing transpose), past key/value
/// concatenated on the sequence, kv heads tiled for grouped queries (as the
/// reference), Q and K scaled by sqrt(scale) each, boolean/additive mask or
/// the upper-left causal mask, softcap, softmax over the keys, times V. The
/// fused-attention work recognizes this pattern (the node name stays the location).
LogicalResult importAttention(NodeImporter &n) {
  auto qT = n.inputType(0), kT = n.inputType(1), vT = n.inputType(2);
  if (!qT || !kT || !vT || qT.getRank() != kT.getRank() || qT.getRank() != vT.getRank() ||
      (qT.getRank() != 3 && qT.getRank() != 4))
    return n.error() << "Attention needs Q, K and V of the same rank, 3 or 4";
  Type elem = qT.getElementType();
  int64_t batch = qT.getDimSize(0);
  bool threeD = qT.getRank() == 3;
  int64_t qHeads = n.intAttr("q_num_heads", 0), kvHeads = n.intAttr("kv_num_heads", 0);
  auto toHeads = [&](Value v, int64_t heads) -> FailureOr<Value> {
    auto t = typeOf(v);
    if (heads <= 0 || t.getDimSize(2) % heads)
      return n.error() << "Attention of 3-d inputs needs q_num_heads and kv_num_heads dividing "
                          "the hidden sizes";
    auto r = n.reshape(v, {batch, t.getDimSize(1), heads, t.getDimSize(2) / heads});
    if (failed(r))
      return failure();
    return n.transpose(*r, {0, 2, 1, 3});
  };
  Value q = n.input(0), k = n.input(1), v = n.input(2);
  if (threeD) {
    FORGE_TRY(q4, toHeads(q, qHeads));
    FORGE_TRY(k4, toHeads(k, kvHeads));
    FORGE_TRY(v4, toHeads(v, kvHeads));
    q = q4, k = k4, v = v4;
  }
  if (n.input(4)) {
    FORGE_TRY(kc, n.create1("concat", {n.input(4), k}, {n.i64("axis", 2)}));
    k = kc;
  }
  if (n.input(5)) {
    FORGE_TRY(vc, n.create1("concat", {n.input(5), v}, {n.i64("axis", 2)}));
    v = vc;
  }
  if (n.outputUsed(1))
    (void)n.setOutput(1, k);
  if (n.outputUsed(2))
    (void)n.setOutput(2, v);
  int64_t hq = typeOf(q).getDimSize(1), hk = typeOf(k).getDimSize(1);
  if (hq != hk) {
    if (hq % hk || typeOf(v).getDimSize(1) != hk)
      return n.error() << "Attention: " << hq << " query heads cannot share " << hk
                       << " key/value heads";
    FORGE_TRY(kt, n.create1("tile", {k}, {n.ints("repeats", {1, hq / hk, 1, 1})}));
    FORGE_TRY(vt, n.create1("tile", {v}, {n.ints("repeats", {1, hq / hk, 1, 1})}));
    k = kt, v = vt;
  }
  int64_t sq = typeOf(q).getDimSize(2), skv = typeOf(k).getDimSize(2);
  double scale = n.attr("scale") ? n.floatAttr("scale", 1.0)
                                 : 1.0 / std::sqrt(static_cast<double>(typeOf(q).getDimSize(3)));
  Value rootScale = n.scalar(elem, std::sqrt(scale));
  FORGE_TRY(qs, n.create1("mul", {q, rootScale}));
  FORGE_TRY(ks, n.create1("mul", {k, rootScale}));
  FORGE_TRY(kTr, n.transpose(ks, {0, 1, 3, 2}));
  FORGE_TRY(qk, n.create1("matmul", {qs, kTr}));
  Value scores = qk;
  int64_t mode = n.intAttr("qk_matmul_output_mode", 0);
  if (n.intAttr("is_causal", 0)) { // query i sees keys j <= i (upper-left aligned)
    if (n.input(3))
      return n.error() << "Attention: is_causal and attn_mask together";
    SmallVector<bool> allowed(sq * skv);
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t j = 0; j < skv; ++j)
        allowed[i * skv + j] = j <= i;
    Value mask = n.constant(DenseElementsAttr::get(
        RankedTensorType::get({sq, skv}, n.b.getI1Type()), ArrayRef<bool>(allowed)));
    FORGE_TRY(masked, n.create1("where", {mask, scores, n.scalar(elem, -INFINITY)}));
    scores = masked;
  } else if (n.input(3)) {
    auto maskType = n.inputType(3);
    FORGE_TRY(masked, maskType.getElementType().isInteger(1)
                          ? n.create1("where", {n.input(3), scores, n.scalar(elem, -INFINITY)})
                          : n.create1("add", {scores, n.input(3)}));
    scores = masked;
  }
  Value qkOut = mode == 0 ? qk : scores;
  if (double softcap = n.floatAttr("softcap", 0.0); softcap > 0) {
    FORGE_TRY(d, n.create1("div", {scores, n.scalar(elem, softcap)}));
    FORGE_TRY(th, n.create1("tanh", {d}));
    FORGE_TRY(capped, n.create1("mul", {th, n.scalar(elem, softcap)}));
    scores = capped;
    if (mode == 2)
      qkOut = scores;
  }
  FORGE_TRY(probs, n.create1("softmax", {scores}, {n.i64("axis", 3)}));
  if (mode == 3)
    qkOut = probs;
  if (n.outputUsed(3))
    (void)n.setOutput(3, qkOut);
  FORGE_TRY(y, n.create1("matmul", {probs, v}));
  if (!threeD)
    return n.setOutput(0, y);
  auto yT = typeOf(y);
  FORGE_TRY(yt, n.transpose(y, {0, 2, 1, 3}));
  return out(n, n.reshape(yt, {batch, sq, yT.getDimSize(1) * yT.getDimSize(3)}));
}

//===----------------------------------------------------------------------===//
// Resize / Upsample: separable, one axis at a time, as ONNX's reference. Each
// output coordinate along an axis is a weighted sum of (edge-clamped) input
// positions; shapes are static, so the weights are a constant [out, in] matrix
// (plus a constant for tf_crop_and_resize's extrapolation) and the axis
// becomes one matmul, or one gather for nearest (exact for every dtype).
//===----------------------------------------------------------------------===//

struct ResizeSpec {
  std::string mode = "nearest", coord = "half_pixel", nearest = "round_prefer_floor";
  double cubicA = -0.75, extrapolation = 0.0;
  bool excludeOutside = false, antialias = false;
};

/// Weights of one output coordinate along an axis: (input index, weight)
/// pairs, or nullopt where tf_crop_and_resize extrapolates.
std::optional<SmallVector<std::pair<int64_t, double>>>
resizeWeights(const ResizeSpec &s, int64_t inSize, int64_t outSize, double scale, double roiStart,
              double roiEnd, int64_t x) {
  double outWidth = scale * static_cast<double>(inSize), xo = 0, in = static_cast<double>(inSize);
  const std::string &m = s.coord;
  if (m == "align_corners") {
    xo = outWidth == 1 ? 0.0 : x * (in - 1) / (outWidth - 1);
  } else if (m == "asymmetric") {
    xo = x / scale;
  } else if (m == "tf_crop_and_resize") {
    xo = outWidth == 1 ? (roiEnd - roiStart) * (in - 1) / 2
                       : x * (roiEnd - roiStart) * (in - 1) / (outWidth - 1);
    xo += roiStart * (in - 1);
    if (xo < 0 || xo > in - 1)
      return std::nullopt;
  } else if (m == "tf_half_pixel_for_nn") { // deprecated (Resize-11/13)
    xo = (x + 0.5) / scale;
  } else if (m == "pytorch_half_pixel") {
    xo = outWidth == 1 ? -0.5 : (x + 0.5) / scale - 0.5;
  } else if (m == "half_pixel_symmetric") {
    double adjustment = static_cast<double>(outSize) / outWidth;
    xo = in / 2 * (1 - adjustment) + (x + 0.5) / scale - 0.5;
  } else { // half_pixel
    xo = (x + 0.5) / scale - 0.5;
  }
  double floorX = std::floor(xo);
  double ratio = xo == floorX ? 1.0 : xo - floorX;
  SmallVector<double> coeffs;
  double a = s.cubicA, sc = std::min(scale, 1.0);
  auto cubic = [&](double t) {
    t = std::fabs(t);
    if (t <= 1)
      return (a + 2) * t * t * t - (a + 3) * t * t + 1;
    if (t < 2)
      return a * t * t * t - 5 * a * t * t + 8 * a * t - 4 * a;
    return 0.0;
  };
  auto normalize = [&] {
    double sum = 0;
    for (double c : coeffs)
      sum += c;
    for (double &c : coeffs)
      c /= sum;
  };
  if (s.mode == "nearest") {
    bool integral = ratio == 1.0;
    const std::string &nm = s.nearest;
    bool second = integral || nm == "ceil" ||
                  (nm == "round_prefer_floor" && ratio > 0.5) ||
                  (nm == "round_prefer_ceil" && ratio >= 0.5);
    coeffs = {second ? 0.0 : 1.0, second ? 1.0 : 0.0};
  } else if (s.mode == "linear" && !s.antialias) {
    coeffs = {1 - ratio, ratio};
  } else if (s.mode == "linear") {
    int64_t start = static_cast<int64_t>(std::floor(-1 / sc) + 1);
    for (int64_t i = start; i < start + 2 - 2 * start; ++i)
      coeffs.push_back(std::clamp(1 - std::fabs((i - ratio) * sc), 0.0, 1.0));
    normalize();
  } else if (!s.antialias) { // cubic
    double r = ratio;
    coeffs = {((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
              ((a + 2) * r - (a + 3)) * r * r + 1,
              ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
              ((a * ((1 - r) + 1) - 5 * a) * ((1 - r) + 1) + 8 * a) * ((1 - r) + 1) - 4 * a};
  } else {
    int64_t start = static_cast<int64_t>(std::floor(-2 / sc) + 1);
    for (int64_t i = start; i < 2 - start; ++i)
      coeffs.push_back(cubic(sc * (i - ratio)));
    normalize();
  }
  // The n nearest positions of the edge-padded axis (ties to the smaller), as
  // the reference's _get_neighbor; positions outside [0, in) read the edge.
  int64_t n = static_cast<int64_t>(coeffs.size()), pad = (n + 1) / 2, limit = inSize + 2 * pad;
  double xp = xo + pad;
  SmallVector<int64_t> cand;
  for (int64_t i = static_cast<int64_t>(std::floor(xp)) - n - 1;
       i <= static_cast<int64_t>(std::floor(xp)) + n + 1; ++i)
    if (i >= 0 && i < limit)
      cand.push_back(i);
  llvm::sort(cand, [&](int64_t l, int64_t r) {
    double dl = std::fabs(xp - l), dr = std::fabs(xp - r);
    return dl != dr ? dl < dr : l < r;
  });
  cand.resize(std::min<size_t>(cand.size(), n));
  llvm::sort(cand);
  if (s.excludeOutside) {
    double sum = 0;
    for (auto [i, c] : llvm::zip(cand, coeffs))
      if (i - pad < 0 || i - pad >= inSize)
        c = 0;
    for (double c : coeffs)
      sum += c;
    for (double &c : coeffs)
      c /= sum;
  }
  SmallVector<std::pair<int64_t, double>> w;
  for (auto [i, c] : llvm::zip(cand, coeffs))
    w.push_back({std::clamp<int64_t>(i - pad, 0, inSize - 1), c});
  return w;
}

/// Resizes `v` along `axis` to `outSize`.
FailureOr<Value> resizeAxis(NodeImporter &n, const ResizeSpec &s, Value v, int64_t axis,
                            int64_t outSize, double scale, double roiStart, double roiEnd) {
  auto t = typeOf(v);
  int64_t in = t.getDimSize(axis), rank = t.getRank();
  SmallVector<double> matrix(outSize * in, 0.0), bias(outSize, 0.0);
  SmallVector<int64_t> nearestIndex(outSize, 0);
  SmallVector<bool> inside(outSize, true);
  bool identity = outSize == in, extrapolates = false;
  for (int64_t x = 0; x < outSize; ++x) {
    auto w = resizeWeights(s, in, outSize, scale, roiStart, roiEnd, x);
    if (!w) {
      inside[x] = false;
      bias[x] = s.extrapolation;
      identity = false;
      extrapolates = true;
      continue;
    }
    for (auto [i, c] : *w) {
      matrix[x * in + i] += c;
      if (c != 0)
        nearestIndex[x] = i;
    }
    for (int64_t i = 0; i < in && identity; ++i)
      identity = matrix[x * in + i] == (i == x ? 1.0 : 0.0);
  }
  if (identity)
    return v;
  Type elem = t.getElementType();
  SmallVector<int64_t> outShape(t.getShape());
  outShape[axis] = outSize;
  auto biasShape = [&] {
    SmallVector<int64_t> b(rank, 1);
    b[axis] = outSize;
    return b;
  };
  if (s.mode == "nearest") {
    Value idx = n.constant(DenseElementsAttr::get(
        RankedTensorType::get({outSize}, n.b.getI64Type()), ArrayRef<int64_t>(nearestIndex)));
    auto g = n.create1("gather", {v, idx}, {n.i64("axis", axis)});
    if (failed(g) || !extrapolates)
      return g;
    Value keep = n.constant(DenseElementsAttr::get(
        RankedTensorType::get(biasShape(), n.b.getI1Type()), ArrayRef<bool>(inside)));
    return n.create1("where", {keep, *g, n.scalar(elem, s.extrapolation)});
  }
  if (!isa<FloatType>(elem))
    return n.error() << s.mode << " Resize needs a float input";
  // out = M x along the axis: move it last, times M^T [in, out], move it back.
  SmallVector<int64_t> perm;
  for (int64_t d = 0; d < rank; ++d)
    if (d != axis)
      perm.push_back(d);
  perm.push_back(axis);
  SmallVector<int64_t> inverse(rank);
  for (int64_t d = 0; d < rank; ++d)
    inverse[perm[d]] = d;
  SmallVector<APFloat> mt;
  for (int64_t i = 0; i < in; ++i)
    for (int64_t x = 0; x < outSize; ++x) {
      APFloat f(matrix[x * in + i]);
      bool lost;
      f.convert(cast<FloatType>(elem).getFloatSemantics(), APFloat::rmNearestTiesToEven, &lost);
      mt.push_back(f);
    }
  Value weights =
      n.constant(DenseElementsAttr::get(RankedTensorType::get({in, outSize}, elem), mt));
  FORGE_TRY(moved, n.transpose(v, perm));
  FORGE_TRY(mixed, n.create1("matmul", {moved, weights}));
  FORGE_TRY(back, n.transpose(mixed, inverse));
  if (!extrapolates)
    return back;
  SmallVector<APFloat> bv;
  for (double b : bias) {
    APFloat f(b);
    bool lost;
    f.convert(cast<FloatType>(elem).getFloatSemantics(), APFloat::rmNearestTiesToEven, &lost);
    bv.push_back(f);
  }
  Value b = n.constant(DenseElementsAttr::get(RankedTensorType::get(biasShape(), elem), bv));
  return n.create1("add", {back, b});
}

/// Resize (opset 10 to 19) and Upsample (opset 7 to 9).
LogicalResult importResize(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x)
    return n.error() << "missing input";
  int64_t rank = x.getRank();
  bool legacy = n.node.op_type() == "Upsample" || n.opset < 11; // (X, scales), asymmetric
  ResizeSpec s;
  s.mode = n.stringAttr("mode", "nearest");
  if (s.mode == "bilinear") // Upsample-7's name for linear
    s.mode = "linear";
  if (s.mode != "nearest" && s.mode != "linear" && s.mode != "cubic")
    return n.error() << "unsupported mode '" << s.mode << "'";
  s.coord = legacy ? "asymmetric" : n.stringAttr("coordinate_transformation_mode", "half_pixel");
  // Before opset 11 the nearest input position is floor(x / scale).
  s.nearest = legacy ? "floor" : n.stringAttr("nearest_mode", "round_prefer_floor");
  s.cubicA = n.floatAttr("cubic_coeff_a", -0.75);
  s.excludeOutside = n.intAttr("exclude_outside", 0) != 0;
  s.extrapolation = n.floatAttr("extrapolation_value", 0.0);
  s.antialias = n.intAttr("antialias", 0) != 0;
  if (s.antialias && s.mode == "nearest")
    return n.error() << "antialias needs linear or cubic mode";
  std::string policy = n.stringAttr("keep_aspect_ratio_policy", "stretch");
  SmallVector<int64_t> axes;
  if (auto a = n.intsAttr("axes")) {
    auto norm = normAxes(n, *a, rank);
    if (failed(norm))
      return failure();
    // Keep the attribute's order (scales/sizes follow it).
    for (int64_t ax : *a)
      axes.push_back(ax < 0 ? ax + rank : ax);
  } else {
    for (int64_t d = 0; d < rank; ++d)
      axes.push_back(d);
  }
  auto floats = [&](int64_t i) -> FailureOr<SmallVector<double>> {
    DenseElementsAttr c = n.constantInput(i);
    if (!c)
      return n.error() << "input " << i << " must be a constant (static shapes)";
    SmallVector<double> v;
    for (APFloat f : c.getValues<APFloat>())
      v.push_back(f.convertToDouble());
    return v;
  };
  SmallVector<double> scales(rank, 1.0), roi;
  SmallVector<int64_t> sizes(x.getShape());
  int64_t scalesInput = legacy ? 1 : 2, sizesInput = legacy ? -1 : 3;
  if (legacy && n.opset < 9 && n.node.op_type() == "Upsample") {
    const auto *attr = n.attr("scales"); // Upsample-7: a float attribute
    if (!attr || attr->floats_size() != rank)
      return n.error() << "Upsample-7 needs a scales attribute with one value per dim";
    for (int64_t d = 0; d < rank; ++d)
      scales[d] = attr->floats(d);
    for (int64_t d = 0; d < rank; ++d)
      sizes[d] = static_cast<int64_t>(std::floor(scales[d] * x.getDimSize(d)));
  } else if (sizesInput >= 0 && n.input(sizesInput) &&
             typeOf(n.input(sizesInput)).getNumElements() > 0) {
    auto sz = n.constantInts(sizesInput, "sizes");
    if (failed(sz))
      return failure();
    if (sz->size() != axes.size())
      return n.error() << "sizes has " << sz->size() << " values for " << axes.size() << " axes";
    for (auto [i, ax] : llvm::enumerate(axes)) {
      sizes[ax] = (*sz)[i];
      scales[ax] = static_cast<double>((*sz)[i]) / x.getDimSize(ax);
    }
    if (policy != "stretch") {
      double sc = policy == "not_larger" ? INFINITY : 0;
      for (int64_t ax : axes)
        sc = policy == "not_larger" ? std::min(sc, scales[ax]) : std::max(sc, scales[ax]);
      for (int64_t ax : axes) {
        scales[ax] = sc;
        sizes[ax] = static_cast<int64_t>(sc * x.getDimSize(ax) + 0.5);
      }
    }
  } else if (n.input(scalesInput)) {
    auto sc = floats(scalesInput);
    if (failed(sc))
      return failure();
    if (sc->size() != axes.size())
      return n.error() << "scales has " << sc->size() << " values for " << axes.size() << " axes";
    for (auto [i, ax] : llvm::enumerate(axes)) {
      scales[ax] = (*sc)[i];
      sizes[ax] = static_cast<int64_t>(std::floor(scales[ax] * x.getDimSize(ax)));
    }
  } else {
    return n.error() << "needs scales or sizes";
  }
  if (!legacy && n.input(1) && typeOf(n.input(1)).getNumElements() > 0) {
    auto r = floats(1);
    if (failed(r))
      return failure();
    roi = *r;
    if (roi.size() != 2 * axes.size())
      return n.error() << "roi has " << roi.size() << " values for " << axes.size() << " axes";
  }
  Value v = n.input(0);
  // The innermost axis first, as the reference's recursion.
  SmallVector<int64_t> order(axes);
  llvm::sort(order, std::greater<int64_t>());
  for (int64_t ax : order) {
    if (sizes[ax] <= 0)
      return n.error() << "output size " << sizes[ax] << " along axis " << ax;
    size_t i = llvm::find(axes, ax) - axes.begin();
    double r0 = roi.empty() ? 0.0 : roi[i], r1 = roi.empty() ? 1.0 : roi[axes.size() + i];
    FORGE_TRY(next, resizeAxis(n, s, v, ax, sizes[ax], scales[ax], r0, r1));
    v = next;
  }
  return n.setOutput(0, v);
}

//===----------------------------------------------------------------------===//
// Small activations and normalizations (their ONNX function bodies)
//===----------------------------------------------------------------------===//

/// Elementwise activations built from primitives: f(n, x) -> value.
OpRule unaryComposite(std::function<FailureOr<Value>(NodeImporter &, Value, Type)> f) {
  return [f](NodeImporter &n) -> LogicalResult {
    auto x = n.inputType(0);
    if (!x)
      return n.error() << "missing input";
    return out(n, f(n, n.input(0), x.getElementType()));
  };
}

FailureOr<Value> softsign(NodeImporter &n, Value x, Type elem) { // x / (1 + |x|)
  FORGE_TRY(a, n.create1("abs", {x}));
  FORGE_TRY(d, n.create1("add", {a, n.scalar(elem, 1.0)}));
  return n.create1("div", {x, d});
}

FailureOr<Value> mish(NodeImporter &n, Value x, Type) { // x * tanh(softplus(x))
  FORGE_TRY(sp, n.create1("softplus", {x}));
  FORGE_TRY(t, n.create1("tanh", {sp}));
  return n.create1("mul", {x, t});
}

FailureOr<Value> celu(NodeImporter &n, Value x, Type elem) { // alpha * elu(x / alpha)
  double alpha = n.floatAttr("alpha", 1.0);
  FORGE_TRY(d, n.create1("div", {x, n.scalar(elem, alpha)}));
  FORGE_TRY(e, n.create1("elu", {d}, {n.f64("alpha", 1.0)}));
  return n.create1("mul", {e, n.scalar(elem, alpha)});
}

/// Shrink: x + bias below -lambd, x - bias above lambd, else 0.
FailureOr<Value> shrink(NodeImporter &n, Value x, Type elem) {
  double lambd = n.floatAttr("lambd", 0.5), bias = n.floatAttr("bias", 0.0);
  FORGE_TRY(below, n.create1("less", {x, n.scalar(elem, -lambd)}));
  FORGE_TRY(above, n.create1("greater", {x, n.scalar(elem, lambd)}));
  FORGE_TRY(up, n.create1("add", {x, n.scalar(elem, bias)}));
  FORGE_TRY(down, n.create1("sub", {x, n.scalar(elem, bias)}));
  FORGE_TRY(hi, n.create1("where", {above, down, n.scalar(elem, 0.0)}));
  return n.create1("where", {below, up, hi});
}

/// Sign: 1, -1, or x itself where it is zero or NaN (so -0 and NaN carry over).
FailureOr<Value> sign(NodeImporter &n, Value x, Type elem) {
  FORGE_TRY(pos, n.create1("greater", {x, n.scalar(elem, 0.0)}));
  FORGE_TRY(neg, n.create1("less", {x, n.scalar(elem, 0.0)}));
  FORGE_TRY(lo, n.create1("where", {neg, n.scalar(elem, -1.0), x}));
  return n.create1("where", {pos, n.scalar(elem, 1.0), lo});
}

LogicalResult importPRelu(NodeImporter &n) { // x < 0 ? slope * x : x (slope broadcast)
  auto x = n.inputType(0);
  if (!x || !n.input(1))
    return n.error() << "PRelu needs X and slope";
  FORGE_TRY(negative, n.create1("less", {n.input(0), n.scalar(x.getElementType(), 0.0)}));
  FORGE_TRY(scaled, n.create1("mul", {n.input(0), n.input(1)}));
  return out(n, n.create1("where", {negative, scaled, n.input(0)}));
}

/// MeanVarianceNormalization as its function body: (X - E[X]) / sqrt(E[X^2] -
/// E[X]^2) over `axes` (default 0, 2, 3); ONNX's reference adds 1e-9 to the
/// standard deviation.
LogicalResult importMeanVarianceNormalization(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x)
    return n.error() << "missing input";
  auto axes = normAxes(n, n.intsAttr("axes").value_or(SmallVector<int64_t>{0, 2, 3}),
                       x.getRank());
  if (failed(axes))
    return failure();
  Type elem = x.getElementType();
  Value in = n.input(0);
  FORGE_TRY(mean, reduce(n, "reduce_mean", in, *axes, true));
  FORGE_TRY(sq, n.create1("mul", {in, in}));
  FORGE_TRY(meanSq, reduce(n, "reduce_mean", sq, *axes, true));
  FORGE_TRY(mean2, n.create1("mul", {mean, mean}));
  FORGE_TRY(var, n.create1("sub", {meanSq, mean2}));
  FORGE_TRY(stdev, n.create1("sqrt", {var}));
  FORGE_TRY(stdEps, n.create1("add", {stdev, n.scalar(elem, 1e-9)}));
  FORGE_TRY(centered, n.create1("sub", {in, mean}));
  return out(n, n.create1("div", {centered, stdEps}));
}

/// LpNormalization: x / ||x||_p along `axis` (p 1 or 2).
LogicalResult importLpNormalization(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x)
    return n.error() << "missing input";
  auto axis = normAxis(n, n.intAttr("axis", -1), x.getRank());
  int64_t p = n.intAttr("p", 2);
  if (failed(axis))
    return failure();
  if (p != 1 && p != 2)
    return n.error() << "LpNormalization p must be 1 or 2, got " << p;
  Value in = n.input(0);
  FORGE_TRY(term, p == 1 ? n.create1("abs", {in}) : n.create1("mul", {in, in}));
  FORGE_TRY(sum, reduce(n, "reduce_sum", term, {*axis}, true));
  Value norm = sum;
  if (p == 2) {
    FORGE_TRY(r, n.create1("sqrt", {sum}));
    norm = r;
  }
  return out(n, n.create1("div", {in, norm}));
}

/// |x|^p, and its inverse power, for the Lp pools.
FailureOr<Value> absPow(NodeImporter &n, Value x, double p) {
  Type elem = typeOf(x).getElementType();
  FORGE_TRY(a, n.create1("abs", {x}));
  return p == 1 ? FailureOr<Value>(a) : n.create1("pow", {a, n.scalar(elem, p)});
}
FailureOr<Value> root(NodeImporter &n, Value x, double p) {
  Type elem = typeOf(x).getElementType();
  return p == 1 ? FailureOr<Value>(x) : n.create1("pow", {x, n.scalar(elem, 1.0 / p)});
}

/// LpPool: (sum over the window of |x|^p)^(1/p); the window sums are a
/// depthwise convolution with a kernel of ones (zero padding adds nothing).
LogicalResult importLpPool(NodeImporter &n) {
  auto x = n.inputType(0);
  if (x && !isa<FloatType>(x.getElementType()))
    return n.error() << "expects a float input";
  if (n.intAttr("ceil_mode", 0))
    return n.error() << "LpPool with ceil_mode=1 is unsupported";
  auto w = poolWindow(n);
  if (failed(w))
    return failure();
  double p = static_cast<double>(n.intAttr("p", 2));
  int64_t channels = x.getDimSize(1);
  SmallVector<int64_t> wShape = {channels, 1};
  wShape.append(w->kernel.begin(), w->kernel.end());
  Value ones = n.constant(DenseElementsAttr::get(RankedTensorType::get(wShape, x.getElementType()),
                                                 n.b.getFloatAttr(x.getElementType(), 1.0)));
  FORGE_TRY(powered, absPow(n, n.input(0), p));
  FORGE_TRY(sums, n.create1("conv", {powered, ones},
                            {n.ints("strides", w->strides), n.ints("pads", w->pads),
                             n.ints("dilations", w->dilations), n.i64("group", channels)}));
  return out(n, root(n, sums, p));
}

LogicalResult importGlobalLpPool(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x || x.getRank() < 3 || !isa<FloatType>(x.getElementType()))
    return n.error() << "expects a float N-d input of rank >= 3";
  SmallVector<int64_t> axes;
  for (int64_t d = 2; d < x.getRank(); ++d)
    axes.push_back(d);
  double p = static_cast<double>(n.intAttr("p", 2));
  FORGE_TRY(powered, absPow(n, n.input(0), p));
  FORGE_TRY(sums, reduce(n, "reduce_sum", powered, axes, true));
  return out(n, root(n, sums, p));
}

/// LRN across channels: x / (bias + alpha / size * sum of x^2 over the
/// channel window [c - (size-1)/2, c + size/2])^beta, the window a sum of
/// shifted slices of the zero-padded squares.
LogicalResult importLRN(NodeImporter &n) {
  auto x = n.inputType(0);
  int64_t size = n.intAttr("size", 0);
  if (!x || x.getRank() < 3 || size <= 0 || !isa<FloatType>(x.getElementType()))
    return n.error() << "LRN needs a float input of rank >= 3 and size > 0";
  Type elem = x.getElementType();
  int64_t rank = x.getRank(), c = x.getDimSize(1);
  int64_t before = (size - 1) / 2, after = size - 1 - before;
  FORGE_TRY(sq, n.create1("mul", {n.input(0), n.input(0)}));
  SmallVector<int64_t> pads(2 * rank, 0);
  pads[1] = before;
  pads[rank + 1] = after;
  FORGE_TRY(padded, n.create1("pad", {sq}, {n.ints("pads", pads), n.str("mode", "constant"),
                                            n.f64("value", 0.0)}));
  Value sum;
  for (int64_t k = 0; k < size; ++k) {
    SmallVector<int64_t> starts(rank, 0), ends(typeOf(padded).getShape()), steps(rank, 1);
    starts[1] = k;
    ends[1] = k + c;
    FORGE_TRY(part, n.create1("slice", {padded}, {n.ints("starts", starts), n.ints("ends", ends),
                                                  n.ints("steps", steps)}));
    if (!sum) {
      sum = part;
      continue;
    }
    FORGE_TRY(acc, n.create1("add", {sum, part}));
    sum = acc;
  }
  double alpha = n.floatAttr("alpha", 1e-4), beta = n.floatAttr("beta", 0.75);
  FORGE_TRY(scaled, n.create1("mul", {sum, n.scalar(elem, alpha / size)}));
  FORGE_TRY(base, n.create1("add", {scaled, n.scalar(elem, n.floatAttr("bias", 1.0))}));
  FORGE_TRY(den, n.create1("pow", {base, n.scalar(elem, beta)}));
  return out(n, n.create1("div", {n.input(0), den}));
}

//===----------------------------------------------------------------------===//
// Shape-determined ops: CenterCropPad, EyeLike, ReverseSequence
//===----------------------------------------------------------------------===//

/// CenterCropPad: per axis, a centered crop (start (dim - target) / 2) or a
/// centered zero pad (begin (target - dim) / 2, the rest at the end).
LogicalResult importCenterCropPad(NodeImporter &n) {
  auto x = n.inputType(0);
  auto target = n.constantInts(1, "shape");
  if (!x || failed(target))
    return failure();
  int64_t rank = x.getRank();
  SmallVector<int64_t> axes;
  if (auto a = n.intsAttr("axes")) {
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
  if (target->size() != axes.size())
    return n.error() << "shape has " << target->size() << " values for " << axes.size()
                     << " axes";
  SmallVector<int64_t> starts(rank, 0), ends(x.getShape()), steps(rank, 1), pads(2 * rank, 0);
  for (auto [i, ax] : llvm::enumerate(axes)) {
    int64_t dim = x.getDimSize(ax), t = (*target)[i];
    if (t < dim) {
      starts[ax] = (dim - t) / 2;
      ends[ax] = starts[ax] + t;
    } else {
      pads[ax] = (t - dim) / 2;
      pads[ax + rank] = t - dim - pads[ax];
    }
  }
  FORGE_TRY(cropped, n.create1("slice", {n.input(0)}, {n.ints("starts", starts),
                                                       n.ints("ends", ends),
                                                       n.ints("steps", steps)}));
  if (llvm::all_of(pads, [](int64_t p) { return p == 0; }))
    return n.setOutput(0, cropped);
  return out(n, n.create1("pad", {cropped}, {n.ints("pads", pads), n.str("mode", "constant"),
                                             n.f64("value", 0.0)}));
}

/// EyeLike: a constant with ones on diagonal k of the input's 2-d shape.
LogicalResult importEyeLike(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x || x.getRank() != 2)
    return n.error() << "EyeLike needs a 2-d input";
  Type elem = x.getElementType();
  if (const auto *a = n.attr("dtype")) {
    elem = a->i() == 9 ? n.b.getI1Type() : onnxElementType(n, a->i());
    if (!elem)
      return n.error() << "EyeLike dtype " << a->i() << " is unsupported";
  }
  int64_t rows = x.getDimSize(0), cols = x.getDimSize(1), k = n.intAttr("k", 0);
  auto type = RankedTensorType::get({rows, cols}, elem);
  SmallVector<Attribute> values;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      double v = j - i == k ? 1.0 : 0.0;
      values.push_back(isa<FloatType>(elem) ? Attribute(n.b.getFloatAttr(elem, v))
                                            : Attribute(n.b.getIntegerAttr(elem, (int64_t)v)));
    }
  return n.setOutput(0, n.constant(DenseElementsAttr::get(type, values)));
}

/// ReverseSequence: along time_axis, each batch entry's first sequence_lens[b]
/// steps in reverse, the rest in place; one gather_elements with the index
/// where(t < len, len - 1 - t, t) broadcast over the other dims.
LogicalResult importReverseSequence(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x || x.getRank() < 2 || !n.input(1))
    return n.error() << "ReverseSequence needs an input of rank >= 2 and sequence_lens";
  int64_t rank = x.getRank();
  int64_t timeAxis = n.intAttr("time_axis", 0), batchAxis = n.intAttr("batch_axis", 1);
  if ((timeAxis != 0 && timeAxis != 1) || batchAxis != 1 - timeAxis)
    return n.error() << "time_axis and batch_axis must be 0 and 1 in some order";
  int64_t steps = x.getDimSize(timeAxis), batch = x.getDimSize(batchAxis);
  Type i64 = n.b.getI64Type();
  SmallVector<int64_t> ts(steps);
  for (int64_t t = 0; t < steps; ++t)
    ts[t] = t;
  SmallVector<int64_t> tShape(rank, 1), lShape(rank, 1);
  tShape[timeAxis] = steps;
  lShape[batchAxis] = batch;
  Value t = n.constant(DenseElementsAttr::get(RankedTensorType::get(tShape, i64),
                                              ArrayRef<int64_t>(ts)));
  FORGE_TRY(lens64, n.cast(n.input(1), i64));
  FORGE_TRY(lens, n.reshape(lens64, lShape));
  FORGE_TRY(inside, n.create1("less", {t, lens}));
  FORGE_TRY(last, n.create1("sub", {lens, n.scalar(i64, 1)}));
  FORGE_TRY(mirrored, n.create1("sub", {last, t}));
  FORGE_TRY(index, n.create1("where", {inside, mirrored, t}));
  FORGE_TRY(full, n.create1("broadcast", {index}, {n.ints("shape", x.getShape())}));
  return out(n, n.create1("gather_elements", {n.input(0), full}, {n.i64("axis", timeAxis)}));
}

//===----------------------------------------------------------------------===//
// GridSample and Col2Im
//===----------------------------------------------------------------------===//

/// GridSample (opset 16 and 20, N-d) as ONNX's reference: per output point and
/// spatial dim, the denormalized coordinate (rounded half to even for
/// nearest; clamped or reflected into the borders), the 1, 2 or 4 taps of
/// nearest, linear or cubic interpolation with their weights, each tap's pixel
/// (zero outside for padding "zeros", clamped for "border", reflected for
/// "reflection"); the tap products are gathered from the flattened input.
LogicalResult importGridSample(NodeImporter &n) {
  auto x = n.inputType(0), g = n.inputType(1);
  if (!x || !g || x.getRank() < 3 || g.getRank() != x.getRank() ||
      g.getShape().back() != x.getRank() - 2 || !isa<FloatType>(x.getElementType()))
    return n.error() << "GridSample needs a float input [N, C, D...] and a grid [N, O..., rank-2]";
  std::string mode = n.stringAttr("mode", n.opset < 20 ? "bilinear" : "linear");
  mode = mode == "bilinear" ? "linear" : mode == "bicubic" ? "cubic" : mode;
  std::string padding = n.stringAttr("padding_mode", "zeros");
  bool align = n.intAttr("align_corners", 0) != 0;
  if ((mode != "nearest" && mode != "linear" && mode != "cubic") ||
      (padding != "zeros" && padding != "border" && padding != "reflection"))
    return n.error() << "unsupported mode '" << mode << "' or padding_mode '" << padding << "'";
  Type elem = x.getElementType(), i64 = n.b.getI64Type();
  int64_t k = x.getRank() - 2, batch = x.getDimSize(0), ch = x.getDimSize(1), points = 1;
  for (int64_t d = 1; d < g.getRank() - 1; ++d)
    points *= g.getDimSize(d);
  auto c = [&](double v) { return n.scalar(elem, v); };
  auto op2 = [&](StringRef name, Value a, Value b) { return n.create1(name, {a, b}); };
  // Reflect v into [lo, hi] by its near border until inside (the reference's _gs_reflect).
  auto reflect = [&](Value v, double lo, double hi) -> FailureOr<Value> {
    double range = hi - lo;
    FORGE_TRY(belowDx, op2("sub", c(lo), v));
    FORGE_TRY(aboveDx, op2("sub", v, c(hi)));
    auto fold = [&](Value dx, double nearB, double farB, bool fromBelow) -> FailureOr<Value> {
      // even passes: nearB +- r; odd: farB -+ r
      FORGE_TRY(q, op2("div", dx, c(range)));
      FORGE_TRY(nq, n.create1("floor", {q}));
      FORGE_TRY(nr, op2("mul", nq, c(range)));
      FORGE_TRY(r, op2("sub", dx, nr));
      FORGE_TRY(half, op2("mul", nq, c(0.5)));
      FORGE_TRY(fh, n.create1("floor", {half}));
      FORGE_TRY(even, op2("equal", half, fh));
      FORGE_TRY(nearV, fromBelow ? op2("add", c(nearB), r) : op2("sub", c(nearB), r));
      FORGE_TRY(farV, fromBelow ? op2("sub", c(farB), r) : op2("add", c(farB), r));
      return n.create1("where", {even, nearV, farV});
    };
    FORGE_TRY(fromLo, fold(belowDx, lo, hi, true));
    FORGE_TRY(fromHi, fold(aboveDx, hi, lo, false));
    FORGE_TRY(isBelow, op2("less", v, c(lo)));
    FORGE_TRY(isAbove, op2("greater", v, c(hi)));
    FORGE_TRY(hiOrV, n.create1("where", {isAbove, fromHi, v}));
    return n.create1("where", {isBelow, fromLo, hiOrV});
  };
  // Per spatial dim d (grid component k-1-d): taps (index [N, O] int64, weight
  // [N, O], valid [N, O] bool or null).
  struct Tap {
    Value index, weight, valid;
  };
  SmallVector<SmallVector<Tap>> taps(k);
  for (int64_t d = 0; d < k; ++d) {
    int64_t size = x.getDimSize(2 + d);
    double lo = align ? 0.0 : -0.5, hi = align ? size - 1.0 : size - 0.5;
    SmallVector<int64_t> starts(g.getRank(), 0), ends(g.getShape()), steps(g.getRank(), 1);
    starts.back() = k - 1 - d;
    ends.back() = k - d;
    FORGE_TRY(comp, n.create1("slice", {n.input(1)}, {n.ints("starts", starts),
                                                      n.ints("ends", ends),
                                                      n.ints("steps", steps)}));
    FORGE_TRY(cn, n.reshape(comp, {batch, points}));
    FORGE_TRY(plus1, op2("add", cn, c(1.0)));
    Value xd;
    if (align) {
      FORGE_TRY(v, op2("mul", plus1, c((size - 1) / 2.0)));
      xd = v;
    } else {
      FORGE_TRY(s1, op2("mul", plus1, c(static_cast<double>(size))));
      FORGE_TRY(s2, op2("sub", s1, c(1.0)));
      FORGE_TRY(v, op2("mul", s2, c(0.5)));
      xd = v;
    }
    if (mode == "nearest") {
      FORGE_TRY(r, n.create1("round", {xd}));
      xd = r;
    }
    if (padding == "border") { // outside [lo, hi]: clamped to [0, size-1]
      FORGE_TRY(out, n.create1("clip", {xd}, {n.f64("min", 0.0), n.f64("max", size - 1.0)}));
      FORGE_TRY(inside, n.create1("and", {op2("greater_equal", xd, c(lo)).value(),
                                          op2("less_equal", xd, c(hi)).value()}));
      FORGE_TRY(v, n.create1("where", {inside, xd, out}));
      xd = v;
    } else if (padding == "reflection") {
      FORGE_TRY(v, reflect(xd, lo, hi));
      xd = v;
    }
    FORGE_TRY(fl, n.create1("floor", {xd}));
    FORGE_TRY(frac, op2("sub", xd, fl));
    FORGE_TRY(base, n.cast(fl, i64));
    SmallVector<std::pair<int64_t, Value>> offsets; // (offset, weight)
    if (mode == "nearest") {
      offsets.push_back({0, c(1.0)});
    } else if (mode == "linear") {
      FORGE_TRY(w0, op2("sub", c(1.0), frac));
      offsets = {{0, w0}, {1, frac}};
    } else { // Keys' cubic, A = -0.75, at distances 1 + f, f, 1 - f, 2 - f
      const double a = -0.75;
      auto near = [&](Value t) -> FailureOr<Value> { // ((a+2)t - (a+3)) t^2 + 1
        FORGE_TRY(t1, op2("mul", t, c(a + 2)));
        FORGE_TRY(t2, op2("sub", t1, c(a + 3)));
        FORGE_TRY(tt, op2("mul", t, t));
        FORGE_TRY(t3, op2("mul", t2, tt));
        return op2("add", t3, c(1.0));
      };
      auto far = [&](Value t) -> FailureOr<Value> { // ((a t - 5a) t + 8a) t - 4a
        FORGE_TRY(t1, op2("mul", t, c(a)));
        FORGE_TRY(t2, op2("sub", t1, c(5 * a)));
        FORGE_TRY(t3, op2("mul", t2, t));
        FORGE_TRY(t4, op2("add", t3, c(8 * a)));
        FORGE_TRY(t5, op2("mul", t4, t));
        return op2("sub", t5, c(4 * a));
      };
      FORGE_TRY(f1, op2("add", frac, c(1.0)));
      FORGE_TRY(g1, op2("sub", c(1.0), frac));
      FORGE_TRY(g2, op2("sub", c(2.0), frac));
      FORGE_TRY(w0, far(f1));
      FORGE_TRY(w1, near(frac));
      FORGE_TRY(w2, near(g1));
      FORGE_TRY(w3, far(g2));
      offsets = {{-1, w0}, {0, w1}, {1, w2}, {2, w3}};
    }
    for (auto [off, weight] : offsets) {
      FORGE_TRY(i, op2("add", base, n.scalar(i64, static_cast<double>(off))));
      Value idx = i, valid;
      if (padding == "zeros") {
        FORGE_TRY(ge, op2("greater_equal", i, n.scalar(i64, 0)));
        FORGE_TRY(lt, op2("less", i, n.scalar(i64, static_cast<double>(size))));
        FORGE_TRY(v, n.create1("and", {ge, lt}));
        valid = v;
      } else if (padding == "reflection") { // the pixel's own reflection, then truncation
        FORGE_TRY(fi, n.cast(i, elem));
        FORGE_TRY(rf, reflect(fi, lo, hi));
        FORGE_TRY(ri, n.cast(rf, i64));
        idx = ri;
      }
      FORGE_TRY(lowC, n.create1("max", {idx, n.scalar(i64, 0)}));
      FORGE_TRY(clamped, n.create1("min", {lowC, n.scalar(i64, static_cast<double>(size - 1))}));
      taps[d].push_back({clamped, weight, valid});
    }
  }
  // Every combination of one tap per dim: a gather of [N, C, P] at the flat index.
  int64_t plane = 1;
  for (int64_t d = 0; d < k; ++d)
    plane *= x.getDimSize(2 + d);
  FORGE_TRY(flatX, n.reshape(n.input(0), {batch, ch, plane}));
  int64_t combos = 1;
  for (int64_t d = 0; d < k; ++d)
    combos *= static_cast<int64_t>(taps[d].size());
  Value sum;
  for (int64_t combo = 0; combo < combos; ++combo) {
    Value index, weight, valid;
    for (int64_t d = 0, rest = combo; d < k; ++d) {
      int64_t nt = static_cast<int64_t>(taps[d].size());
      const Tap &t = taps[d][rest % nt];
      rest /= nt;
      int64_t stride = 1;
      for (int64_t e = d + 1; e < k; ++e)
        stride *= x.getDimSize(2 + e);
      FORGE_TRY(scaled, op2("mul", t.index, n.scalar(i64, static_cast<double>(stride))));
      if (index) {
        FORGE_TRY(sumI, op2("add", index, scaled));
        index = sumI;
      } else {
        index = scaled;
      }
      if (weight) {
        FORGE_TRY(pw, op2("mul", weight, t.weight));
        weight = pw;
      } else {
        weight = t.weight;
      }
      if (t.valid) {
        if (valid) {
          FORGE_TRY(both, n.create1("and", {valid, t.valid}));
          valid = both;
        } else {
          valid = t.valid;
        }
      }
    }
    FORGE_TRY(idx3, n.reshape(index, {batch, 1, points}));
    FORGE_TRY(idxC, n.create1("broadcast", {idx3}, {n.ints("shape", {batch, ch, points})}));
    FORGE_TRY(pix, n.create1("gather_elements", {flatX, idxC}, {n.i64("axis", 2)}));
    // (nearest's weight is the scalar 1)
    FORGE_TRY(w3, typeOf(weight).getRank() == 0 ? FailureOr<Value>(weight)
                                                : n.reshape(weight, {batch, 1, points}));
    FORGE_TRY(term, op2("mul", pix, w3));
    Value contribution = term;
    if (valid) {
      FORGE_TRY(v3, n.reshape(valid, {batch, 1, points}));
      FORGE_TRY(masked, n.create1("where", {v3, term, c(0.0)}));
      contribution = masked;
    }
    if (sum) {
      FORGE_TRY(acc, op2("add", sum, contribution));
      sum = acc;
    } else {
      sum = contribution;
    }
  }
  SmallVector<int64_t> outShape = {batch, ch};
  outShape.append(g.getShape().begin() + 1, g.getShape().end() - 1);
  return out(n, n.reshape(sum, outShape));
}

/// Col2Im: every column element added into the image position its block and
/// block offset cover (scatter_elements, reduction add, at constant indices);
/// elements landing in the padding go to one extra slot, sliced off.
LogicalResult importCol2Im(NodeImporter &n) {
  auto x = n.inputType(0);
  auto image = n.constantInts(1, "image_shape");
  auto block = n.constantInts(2, "block_shape");
  if (!x || failed(image) || failed(block))
    return failure();
  int64_t sp = static_cast<int64_t>(image->size());
  if (x.getRank() != 3 || static_cast<int64_t>(block->size()) != sp)
    return n.error() << "Col2Im needs a 3-d input and image/block shapes of one length";
  auto dilations = intsOr(n, "dilations", sp, 1), strides = intsOr(n, "strides", sp, 1);
  auto pads = intsOr(n, "pads", 2 * sp, 0);
  int64_t blockSize = 1, imageSize = 1, columns = 1;
  SmallVector<int64_t> grid(sp);
  for (int64_t d = 0; d < sp; ++d) {
    blockSize *= (*block)[d];
    imageSize *= (*image)[d];
    grid[d] = ((*image)[d] + pads[d] + pads[sp + d] - dilations[d] * ((*block)[d] - 1) - 1) /
                  strides[d] + 1;
    columns *= grid[d];
  }
  int64_t batch = x.getDimSize(0), rows = x.getDimSize(1);
  if (rows % blockSize || x.getDimSize(2) != columns)
    return n.error() << "Col2Im: input " << x << " does not match blocks of " << blockSize
                     << " over " << columns << " positions";
  int64_t ch = rows / blockSize;
  SmallVector<int64_t> target; // per (c, block offset, column): image position or the spare
  for (int64_t c = 0; c < ch; ++c)
    for (int64_t b = 0; b < blockSize; ++b)
      for (int64_t l = 0; l < columns; ++l) {
        int64_t pos = 0;
        bool inside = true;
        for (int64_t d = 0, br = b, lr = l, bs = blockSize, ls = columns; d < sp; ++d) {
          bs /= (*block)[d];
          ls /= grid[d];
          int64_t kd = br / bs, od = lr / ls;
          br %= bs;
          lr %= ls;
          int64_t p = od * strides[d] - pads[d] + kd * dilations[d];
          inside &= p >= 0 && p < (*image)[d];
          pos = pos * (*image)[d] + p;
        }
        target.push_back(inside ? c * imageSize + pos : ch * imageSize);
      }
  Type elem = x.getElementType();
  int64_t total = ch * blockSize * columns;
  Value idx = n.constant(DenseElementsAttr::get(
      RankedTensorType::get({1, total}, n.b.getI64Type()), ArrayRef<int64_t>(target)));
  FORGE_TRY(idxB, n.create1("broadcast", {idx}, {n.ints("shape", {batch, total})}));
  FORGE_TRY(updates, n.reshape(n.input(0), {batch, total}));
  Value zeros = n.constant(DenseElementsAttr::get(
      RankedTensorType::get({batch, ch * imageSize + 1}, elem),
      isa<FloatType>(elem) ? Attribute(n.b.getFloatAttr(elem, 0.0))
                           : Attribute(n.b.getIntegerAttr(elem, 0))));
  FORGE_TRY(sums, n.create1("scatter_elements", {zeros, idxB, updates},
                            {n.i64("axis", 1), n.str("reduction", "add")}));
  FORGE_TRY(kept, n.create1("slice", {sums}, {n.ints("starts", {0, 0}),
                                              n.ints("ends", {batch, ch * imageSize}),
                                              n.ints("steps", {1, 1})}));
  SmallVector<int64_t> outShape = {batch, ch};
  outShape.append(image->begin(), image->end());
  return out(n, n.reshape(kept, outShape));
}

/// HannWindow, HammingWindow, BlackmanWindow: constants of the (constant)
/// size, computed in double as ONNX's reference (periodic: N = size, else size-1).
OpRule window(StringRef kind) {
  std::string name = kind.str();
  return [name](NodeImporter &n) -> LogicalResult {
    auto size = n.constantScalar(0, "size");
    if (failed(size))
      return failure();
    int64_t len = static_cast<int64_t>(*size);
    Type elem = onnxElementType(n, n.intAttr("output_datatype", 1));
    if (len < 0 || !elem)
      return n.error() << "needs a size >= 0 and a supported output_datatype";
    double period = n.intAttr("periodic", 1) ? len : len - 1;
    SmallVector<Attribute> values;
    for (int64_t i = 0; i < len; ++i) {
      double t = 2 * M_PI * i / period, v;
      if (name == "hann")
        v = std::pow(std::sin(M_PI * i / period), 2);
      else if (name == "hamming")
        v = 25.0 / 46.0 - (1 - 25.0 / 46.0) * std::cos(t);
      else
        v = 0.42 - 0.5 * std::cos(t) + 0.08 * std::cos(2 * t);
      values.push_back(isa<FloatType>(elem) ? Attribute(n.b.getFloatAttr(elem, v))
                                            : Attribute(n.b.getIntegerAttr(elem, (int64_t)v)));
    }
    return n.setOutput(0, n.constant(DenseElementsAttr::get(RankedTensorType::get({len}, elem),
                                                            values)));
  };
}

/// AffineGrid: the base grid of normalized coordinates (x fastest, then y (and
/// z), homogeneous 1; cell centers, or corners with align_corners) times
/// theta^T: [N, D..., rank] grid positions for GridSample.
LogicalResult importAffineGrid(NodeImporter &n) {
  auto theta = n.inputType(0);
  auto size = n.constantInts(1, "size");
  if (!theta || failed(size))
    return failure();
  int64_t sp = static_cast<int64_t>(size->size()) - 2;
  if ((sp != 2 && sp != 3) || theta.getRank() != 3 || theta.getDimSize(1) != sp ||
      theta.getDimSize(2) != sp + 1 || !isa<FloatType>(theta.getElementType()))
    return n.error() << "AffineGrid needs theta [N, " << sp << ", " << sp + 1
                     << "] and a size of rank 4 or 5";
  bool align = n.intAttr("align_corners", 0) != 0;
  SmallVector<int64_t> dims(size->begin() + 2, size->end());
  int64_t points = 1;
  for (int64_t d : dims)
    points *= d;
  auto coord = [&](int64_t i, int64_t len) {
    return align ? (len == 1 ? -1.0 : -1.0 + 2.0 * i / (len - 1)) : (2.0 * i + 1) / len - 1;
  };
  Type elem = theta.getElementType();
  SmallVector<Attribute> base; // [points, sp + 1]: (x, y[, z], 1)
  for (int64_t p = 0; p < points; ++p) {
    SmallVector<int64_t> at(sp);
    for (int64_t d = sp - 1, r = p; d >= 0; --d) {
      at[d] = r % dims[d];
      r /= dims[d];
    }
    for (int64_t d = sp - 1; d >= 0; --d) // x is the last (fastest) dim
      base.push_back(n.b.getFloatAttr(elem, coord(at[d], dims[d])));
    base.push_back(n.b.getFloatAttr(elem, 1.0));
  }
  Value grid = n.constant(DenseElementsAttr::get(RankedTensorType::get({points, sp + 1}, elem), base));
  FORGE_TRY(thetaT, n.transpose(n.input(0), {0, 2, 1})); // [N, sp + 1, sp]
  FORGE_TRY(moved, n.create1("matmul", {grid, thetaT}));   // [N, points, sp]
  SmallVector<int64_t> outShape = {theta.getDimSize(0)};
  outShape.append(dims.begin(), dims.end());
  outShape.push_back(sp);
  return out(n, n.reshape(moved, outShape));
}

//===----------------------------------------------------------------------===//
// Quantization (as ONNX's reference; inference semantics: rounding passes no
// gradient, so training through Q/DQ needs a straight-through rule later)
//===----------------------------------------------------------------------===//

/// A scale or zero point broadcast against x: a scalar (or one element) as is,
/// a vector along `axis`, or blocks of `block` along `axis` repeated.
FailureOr<Value> quantParam(NodeImporter &n, Value v, RankedTensorType x, int64_t rawAxis,
                            int64_t block) {
  auto t = typeOf(v);
  if (t.getNumElements() == 1) // the axis does not matter (nor need it exist)
    return n.reshape(v, {});
  int64_t rank = x.getRank();
  auto normalized = normAxis(n, rawAxis, rank);
  if (failed(normalized))
    return failure();
  int64_t axis = *normalized;
  if (block <= 0) {
    if (t.getRank() != 1 || t.getDimSize(0) != x.getDimSize(axis))
      return n.error() << "a per-axis scale/zero point needs " << x.getDimSize(axis)
                       << " values along axis " << axis;
    SmallVector<int64_t> shape(rank, 1);
    shape[axis] = t.getDimSize(0);
    return n.reshape(v, shape);
  }
  // Blocked: [..., ceil(D / block), ...] -> repeat each block entry -> crop to D.
  if (t.getRank() != rank)
    return n.error() << "a blocked scale/zero point needs the input's rank";
  SmallVector<int64_t> inserted(t.getShape()), repeated(t.getShape()), merged(t.getShape());
  inserted.insert(inserted.begin() + axis + 1, 1);
  repeated.insert(repeated.begin() + axis + 1, block);
  merged[axis] *= block;
  FORGE_TRY(r1, n.reshape(v, inserted));
  FORGE_TRY(r2, n.create1("broadcast", {r1}, {n.ints("shape", repeated)}));
  FORGE_TRY(r3, n.reshape(r2, merged));
  SmallVector<int64_t> starts(rank, 0), ends(merged), steps(rank, 1);
  ends[axis] = x.getDimSize(axis);
  return n.create1("slice", {r3}, {n.ints("starts", starts), n.ints("ends", ends),
                                   n.ints("steps", steps)});
}

/// The saturation range of an integer quantized type.
std::pair<double, double> quantRange(Type t) {
  unsigned w = t.getIntOrFloatBitWidth();
  if (t.isUnsignedInteger())
    return {0.0, std::ldexp(1.0, w) - 1};
  return {-std::ldexp(1.0, w - 1), std::ldexp(1.0, w - 1) - 1};
}

/// QuantizeLinear: saturate(round_half_even(x / scale) + zero_point) in the zero
/// point's type (uint8 without one, or output_dtype); float8 targets cast x / scale
/// with `saturate`.
LogicalResult importQuantizeLinear(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x || !n.input(1) || !isa<FloatType>(x.getElementType()))
    return n.error() << "QuantizeLinear needs a float input and a scale";
  if (n.intAttr("precision", 0))
    return n.error() << "QuantizeLinear's precision attribute is unsupported";
  int64_t ax = n.intAttr("axis", 1), block = n.intAttr("block_size", 0);
  Type target = n.input(2) ? n.inputType(2).getElementType()
                           : (n.attr("output_dtype") ? Type() : n.b.getIntegerType(8, false));
  if (!target && n.attr("output_dtype")) {
    int64_t code = n.intAttr("output_dtype", 2);
    target = code == 2 ? n.b.getIntegerType(8, false) : code == 3 ? n.b.getIntegerType(8)
             : code == 4 ? n.b.getIntegerType(16, false) : code == 5 ? n.b.getIntegerType(16)
             : (code >= 17 && code <= 20) ? elementTypeFromOnnx(n.b.getContext(), code) // float8
                          : Type();
  }
  if (!target)
    return n.error() << "unsupported quantized type";
  Type elem = x.getElementType();
  FORGE_TRY(scaleB, quantParam(n, n.input(1), x, ax, block));
  FORGE_TRY(scale, n.cast(scaleB, elem));
  FORGE_TRY(scaled, n.create1("div", {n.input(0), scale}));
  if (isa<FloatType>(target)) // float8: zero point is 0 by definition
    return out(n, n.create1("cast", {scaled}, {n.named("to", TypeAttr::get(target)),
                                               n.flag("saturate", n.intAttr("saturate", 1))}));
  FORGE_TRY(rounded, n.create1("round", {scaled}));
  Value sum = rounded;
  if (n.input(2)) {
    FORGE_TRY(zpB, quantParam(n, n.input(2), x, ax, block));
    FORGE_TRY(zp, n.cast(zpB, elem));
    FORGE_TRY(shifted, n.create1("add", {rounded, zp}));
    sum = shifted;
  }
  auto [lo, hi] = quantRange(target);
  FORGE_TRY(clipped, n.create1("clip", {sum}, {n.f64("min", lo), n.f64("max", hi)}));
  return out(n, n.cast(clipped, target));
}

/// DequantizeLinear: (x - zero_point) * scale in the scale's type (or output_dtype).
LogicalResult importDequantizeLinear(NodeImporter &n) {
  auto x = n.inputType(0), scaleT = n.inputType(1);
  if (!x || !scaleT)
    return n.error() << "DequantizeLinear needs an input and a scale";
  int64_t ax = n.intAttr("axis", 1), block = n.intAttr("block_size", 0);
  Type f32 = n.b.getF32Type();
  FORGE_TRY(xf, n.cast(n.input(0), f32));
  Value centered = xf;
  if (n.input(2) && !isa<FloatType>(n.inputType(2).getElementType())) {
    FORGE_TRY(zpB, quantParam(n, n.input(2), x, ax, block));
    FORGE_TRY(zp, n.cast(zpB, f32));
    FORGE_TRY(c, n.create1("sub", {xf, zp}));
    centered = c;
  }
  FORGE_TRY(scaleB, quantParam(n, n.input(1), x, ax, block));
  FORGE_TRY(scale, n.cast(scaleB, f32));
  FORGE_TRY(y, n.create1("mul", {centered, scale}));
  return out(n, n.cast(y, scaleT.getElementType()));
}

/// DynamicQuantizeLinear (uint8): scale from the range of x and 0, zero point
/// rounded from -min / scale, then QuantizeLinear; outputs y, scale, zero point.
LogicalResult importDynamicQuantizeLinear(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x || !x.getElementType().isF32())
    return n.error() << "DynamicQuantizeLinear needs a float32 input";
  SmallVector<int64_t> all;
  for (int64_t d = 0; d < x.getRank(); ++d)
    all.push_back(d);
  Type f32 = n.b.getF32Type(), u8 = n.b.getIntegerType(8, false);
  FORGE_TRY(mx, reduce(n, "reduce_max", n.input(0), all, false));
  FORGE_TRY(mn, reduce(n, "reduce_min", n.input(0), all, false));
  FORGE_TRY(hi, n.create1("max", {mx, n.scalar(f32, 0.0)}));
  FORGE_TRY(lo, n.create1("min", {mn, n.scalar(f32, 0.0)}));
  FORGE_TRY(span, n.create1("sub", {hi, lo}));
  FORGE_TRY(flat, n.create1("equal", {hi, lo}));
  FORGE_TRY(spanOr1, n.create1("where", {flat, n.scalar(f32, 1.0), span}));
  FORGE_TRY(scale, n.create1("div", {spanOr1, n.scalar(f32, 255.0)}));
  FORGE_TRY(q, n.create1("div", {lo, scale}));
  FORGE_TRY(zp0, n.create1("sub", {n.scalar(f32, 0.0), q}));
  FORGE_TRY(zpClipped, n.create1("clip", {zp0}, {n.f64("min", 0.0), n.f64("max", 255.0)}));
  FORGE_TRY(zp, n.create1("round", {zpClipped}));
  FORGE_TRY(scaled, n.create1("div", {n.input(0), scale}));
  FORGE_TRY(rounded, n.create1("round", {scaled}));
  FORGE_TRY(shifted, n.create1("add", {rounded, zp}));
  FORGE_TRY(clipped, n.create1("clip", {shifted}, {n.f64("min", 0.0), n.f64("max", 255.0)}));
  FORGE_TRY(y, n.cast(clipped, u8));
  FORGE_TRY(zpU8, n.cast(zp, u8));
  (void)n.setOutput(0, y);
  if (n.outputUsed(1))
    (void)n.setOutput(1, scale);
  if (n.outputUsed(2))
    (void)n.setOutput(2, zpU8);
  return success();
}

/// v - zero_point, both cast to `type` (just the cast without a zero point).
FailureOr<Value> castMinusZeroPoint(NodeImporter &n, Value v, Value zp, Type type) {
  FORGE_TRY(c, n.cast(v, type));
  if (!zp)
    return c;
  FORGE_TRY(z, n.cast(zp, type));
  return n.create1("sub", {c, z});
}

/// (a - a_zero_point) @ (b - b_zero_point) in int32 (zero points broadcast as
/// the reference's NumPy does).
FailureOr<Value> integerMatmul(NodeImporter &n, Value a, Value azp, Value b, Value bzp) {
  Type i32 = n.b.getI32Type();
  FORGE_TRY(lhs, castMinusZeroPoint(n, a, azp, i32));
  FORGE_TRY(rhs, castMinusZeroPoint(n, b, bzp, i32));
  return n.create1("matmul", {lhs, rhs});
}

LogicalResult importMatMulInteger(NodeImporter &n) {
  return out(n, integerMatmul(n, n.input(0), n.input(2), n.input(1), n.input(3)));
}

/// QLinearMatMul: the int32 product, times a_scale * b_scale / y_scale, plus the
/// output zero point, rounded half to even, in the zero point's type (wrapping,
/// as the reference).
LogicalResult importQLinearMatMul(NodeImporter &n) {
  auto yzp = n.inputType(7), a = n.inputType(0);
  if (!a || !n.input(3) || !n.input(6))
    return n.error() << "QLinearMatMul needs a, b and the scales";
  FORGE_TRY(acc, integerMatmul(n, n.input(0), n.input(2), n.input(3), n.input(5)));
  Type f32 = n.b.getF32Type();
  FORGE_TRY(accF, n.cast(acc, f32));
  // The factor in the scales' own type (f16 scales round it, as the reference).
  FORGE_TRY(ab, n.create1("mul", {n.input(1), n.input(4)}));
  FORGE_TRY(factorS, n.create1("div", {ab, n.input(6)}));
  FORGE_TRY(factor, n.cast(factorS, f32));
  FORGE_TRY(scaled, n.create1("mul", {accF, factor}));
  Value sum = scaled;
  if (n.input(7)) {
    FORGE_TRY(z, n.cast(n.input(7), f32));
    FORGE_TRY(shifted, n.create1("add", {scaled, z}));
    sum = shifted;
  }
  FORGE_TRY(rounded, n.create1("round", {sum}));
  // No saturation: the reference converts with NumPy's astype, which wraps
  // (through int32, as a C cast would).
  Type target = yzp ? yzp.getElementType() : a.getElementType();
  FORGE_TRY(wide, n.cast(rounded, n.b.getI32Type()));
  return out(n, n.cast(wide, target));
}

//===----------------------------------------------------------------------===//
// DFT, STFT, MaxUnpool, ConvInteger, QLinearConv
//===----------------------------------------------------------------------===//

/// The DFT of x ([..., 1] real or [..., 2] complex on the last dim) along
/// `axis`, zero-padded or cut to `len` first, as two matmuls with constant
/// cos/sin matrices ([len, bins]); inverse divides by len; onesided keeps
/// len / 2 + 1 bins. Result [..., bins, ..., 2] in x's type.
FailureOr<Value> dft(NodeImporter &n, Value x, int64_t axis, int64_t len, bool inverse,
                     bool onesided) {
  auto t = typeOf(x);
  int64_t rank = t.getRank();
  Type elem = t.getElementType();
  bool complex = t.getShape().back() == 2;
  auto part = [&](int64_t c) -> FailureOr<Value> {
    SmallVector<int64_t> starts(rank, 0), ends(t.getShape()), steps(rank, 1);
    starts.back() = c;
    ends.back() = c + 1;
    FORGE_TRY(sl, n.create1("slice", {x}, {n.ints("starts", starts), n.ints("ends", ends),
                                           n.ints("steps", steps)}));
    return n.reshape(sl, t.getShape().drop_back());
  };
  // Signal dims without the complex one; the transformed axis moved last.
  int64_t sr = rank - 1;
  SmallVector<int64_t> perm;
  for (int64_t d = 0; d < sr; ++d)
    if (d != axis)
      perm.push_back(d);
  perm.push_back(axis);
  SmallVector<int64_t> inverseP(sr);
  for (int64_t d = 0; d < sr; ++d)
    inverseP[perm[d]] = d;
  int64_t have = t.getDimSize(axis);
  auto prepare = [&](Value v) -> FailureOr<Value> { // moved last, padded or cut to len
    FORGE_TRY(moved, n.transpose(v, perm));
    auto mt = typeOf(moved);
    if (have == len)
      return moved;
    if (have > len) {
      SmallVector<int64_t> starts(sr, 0), ends(mt.getShape()), steps(sr, 1);
      ends.back() = len;
      return n.create1("slice", {moved}, {n.ints("starts", starts), n.ints("ends", ends),
                                          n.ints("steps", steps)});
    }
    SmallVector<int64_t> pads(2 * sr, 0);
    pads[2 * sr - 1] = len - have;
    return n.create1("pad", {moved}, {n.ints("pads", pads), n.str("mode", "constant"),
                                      n.f64("value", 0.0)});
  };
  int64_t bins = onesided ? len / 2 + 1 : len;
  SmallVector<Attribute> cosv, sinv;
  for (int64_t j = 0; j < len; ++j)
    for (int64_t k = 0; k < bins; ++k) {
      // jk mod len keeps the angle small, so cos/sin stay exact for long signals.
      double angle = 2 * M_PI * static_cast<double>((j * k) % len) / len;
      double scale = inverse ? 1.0 / len : 1.0;
      cosv.push_back(n.b.getFloatAttr(elem, std::cos(angle) * scale));
      sinv.push_back(n.b.getFloatAttr(elem, std::sin(angle) * scale));
    }
  auto matT = RankedTensorType::get({len, bins}, elem);
  Value cosM = n.constant(DenseElementsAttr::get(matT, cosv));
  Value sinM = n.constant(DenseElementsAttr::get(matT, sinv));
  FORGE_TRY(re0, part(0));
  FORGE_TRY(re, prepare(re0));
  FORGE_TRY(rc, n.create1("matmul", {re, cosM}));
  FORGE_TRY(rs, n.create1("matmul", {re, sinM}));
  // forward: (a + ib) e^{-i t} = (a cos + b sin) + i (b cos - a sin); inverse: e^{+i t}.
  Value yr = rc, yi;
  FORGE_TRY(negRs, n.create1("neg", {rs}));
  yi = inverse ? rs : negRs;
  if (complex) {
    FORGE_TRY(im0, part(1));
    FORGE_TRY(im, prepare(im0));
    FORGE_TRY(ic, n.create1("matmul", {im, cosM}));
    FORGE_TRY(is, n.create1("matmul", {im, sinM}));
    FORGE_TRY(r2, inverse ? n.create1("sub", {rc, is}) : n.create1("add", {rc, is}));
    FORGE_TRY(i2, n.create1("add", {ic, yi}));
    yr = r2;
    yi = i2;
  }
  auto finish = [&](Value v) -> FailureOr<Value> {
    FORGE_TRY(back, n.transpose(v, inverseP));
    SmallVector<int64_t> shape(typeOf(back).getShape());
    shape.push_back(1);
    return n.reshape(back, shape);
  };
  FORGE_TRY(fr, finish(yr));
  FORGE_TRY(fi, finish(yi));
  return n.create1("concat", {fr, fi}, {n.i64("axis", rank - 1)});
}

LogicalResult importDFT(NodeImporter &n) {
  auto x = n.inputType(0);
  if (!x || x.getRank() < 2 || (x.getShape().back() != 1 && x.getShape().back() != 2) ||
      !isa<FloatType>(x.getElementType()))
    return n.error() << "DFT needs a float input whose last dim is 1 (real) or 2 (complex)";
  int64_t axis = n.opset < 20 ? n.intAttr("axis", 1) : -2;
  if (n.opset >= 20 && n.input(2)) {
    auto a = n.constantScalar(2, "axis");
    if (failed(a))
      return failure();
    axis = static_cast<int64_t>(*a);
  }
  auto norm = normAxis(n, axis, x.getRank());
  if (failed(norm))
    return failure();
  if (*norm == x.getRank() - 1)
    return n.error() << "DFT's axis cannot be the complex dim";
  int64_t len = x.getDimSize(*norm);
  if (n.input(1)) {
    auto l = n.constantScalar(1, "dft_length");
    if (failed(l))
      return failure();
    len = static_cast<int64_t>(*l);
  }
  if (len <= 0)
    return n.error() << "dft_length must be positive";
  return out(n, dft(n, n.input(0), *norm, len, n.intAttr("inverse", 0) != 0,
                    n.intAttr("onesided", 0) != 0));
}

/// STFT: frames (a constant gather along the signal), times the window, a
/// onesided-or-full DFT of each: [batch, frames, bins, 2].
LogicalResult importSTFT(NodeImporter &n) {
  auto x = n.inputType(0);
  auto step = n.constantScalar(1, "frame_step");
  if (!x || failed(step) || x.getRank() != 3 || !isa<FloatType>(x.getElementType()))
    return n.error() << "STFT needs a float signal [batch, length, 1|2] and a constant frame_step";
  int64_t length = x.getDimSize(1), frameStep = static_cast<int64_t>(*step);
  int64_t frameLength = n.input(2) ? n.inputType(2).getDimSize(0) : 0;
  if (n.input(3)) {
    auto fl = n.constantScalar(3, "frame_length");
    if (failed(fl))
      return failure();
    frameLength = static_cast<int64_t>(*fl);
  }
  if (frameLength <= 0 || frameLength > length || frameStep <= 0)
    return n.error() << "STFT needs 0 < frame_length <= length and frame_step > 0";
  int64_t frames = (length - frameLength) / frameStep + 1;
  SmallVector<int64_t> at;
  for (int64_t f = 0; f < frames; ++f)
    for (int64_t i = 0; i < frameLength; ++i)
      at.push_back(f * frameStep + i);
  Value idx = n.constant(DenseElementsAttr::get(
      RankedTensorType::get({frames, frameLength}, n.b.getI64Type()), ArrayRef<int64_t>(at)));
  FORGE_TRY(framed, n.create1("gather", {n.input(0), idx}, {n.i64("axis", 1)}));
  Value windowed = framed; // [batch, frames, frame_length, c]
  if (n.input(2)) {
    FORGE_TRY(w, n.reshape(n.input(2), {frameLength, 1}));
    FORGE_TRY(ww, n.cast(w, x.getElementType()));
    FORGE_TRY(m, n.create1("mul", {framed, ww}));
    windowed = m;
  }
  return out(n, dft(n, windowed, 2, frameLength, false, n.intAttr("onesided", 1) != 0));
}

/// MaxUnpool as the reference: the values scattered at their flat indices into
/// zeros of the pooling formula's shape (the indices refer to it), then placed
/// at the start of zeros of output_shape when that input is given.
LogicalResult importMaxUnpool(NodeImporter &n) {
  auto x = n.inputType(0), idx = n.inputType(1);
  if (!x || !idx || x.getRank() < 3 || idx.getShape() != x.getShape())
    return n.error() << "MaxUnpool needs X and indices of one shape, rank >= 3";
  int64_t sp = x.getRank() - 2;
  auto kernel = n.intsAttr("kernel_shape");
  if (!kernel || static_cast<int64_t>(kernel->size()) != sp)
    return n.error() << "kernel_shape needs " << sp << " entries";
  auto strides = intsOr(n, "strides", sp, 1), pads = intsOr(n, "pads", 2 * sp, 0);
  SmallVector<int64_t> inferred = {x.getDimSize(0), x.getDimSize(1)};
  for (int64_t d = 0; d < sp; ++d)
    inferred.push_back((x.getDimSize(2 + d) - 1) * strides[d] + (*kernel)[d] - pads[d] -
                       pads[sp + d]);
  int64_t total = 1;
  for (int64_t d : inferred)
    total *= d;
  Type elem = x.getElementType();
  Value zeros = n.constant(DenseElementsAttr::get(
      RankedTensorType::get({total}, elem),
      isa<FloatType>(elem) ? Attribute(n.b.getFloatAttr(elem, 0.0))
                           : Attribute(n.b.getIntegerAttr(elem, 0))));
  FORGE_TRY(flatIdx, n.reshape(n.input(1), {x.getNumElements()}));
  FORGE_TRY(flatX, n.reshape(n.input(0), {x.getNumElements()}));
  FORGE_TRY(placed, n.create1("scatter_elements", {zeros, flatIdx, flatX},
                              {n.i64("axis", 0), n.str("reduction", "none")}));
  FORGE_TRY(shaped, n.reshape(placed, inferred));
  if (!n.input(2))
    return n.setOutput(0, shaped);
  auto o = n.constantInts(2, "output_shape");
  if (failed(o))
    return failure();
  if (static_cast<int64_t>(o->size()) != x.getRank())
    return n.error() << "output_shape needs " << x.getRank() << " values";
  SmallVector<int64_t> padAmounts(2 * x.getRank(), 0);
  for (int64_t d = 0; d < x.getRank(); ++d) {
    if ((*o)[d] < inferred[d])
      return n.error() << "output_shape " << (*o)[d] << " in dim " << d
                       << " is below the pooling's " << inferred[d];
    padAmounts[x.getRank() + d] = (*o)[d] - inferred[d];
  }
  return out(n, n.create1("pad", {shaped}, {n.ints("pads", padAmounts),
                                            n.str("mode", "constant"), n.f64("value", 0.0)}));
}

/// The integer convolution of ConvInteger/QLinearConv: (x - x_zp) conv (w - w_zp)
/// computed in f64 (exact for 8-bit operands) and returned as i32; w_zp may be
/// per output channel.
FailureOr<Value> integerConv(NodeImporter &n, Value x, Value xzp, Value w, Value wzp) {
  auto xt = typeOf(x), wt = typeOf(w);
  if (xt.getRank() < 3 || wt.getRank() != xt.getRank())
    return n.error() << "expects N-d input and weight of equal rank >= 3";
  Type f64 = n.b.getF64Type();
  FORGE_TRY(xs, castMinusZeroPoint(n, x, xzp, f64));
  FORGE_TRY(wf, n.cast(w, f64));
  Value ws = wf;
  if (wzp) { // per output channel: broadcast along the weight's first dim
    FORGE_TRY(z0, n.cast(wzp, f64));
    Value z = z0;
    if (typeOf(z0).getRank() == 1 && typeOf(z0).getDimSize(0) == wt.getDimSize(0) &&
        wt.getDimSize(0) > 1) {
      SmallVector<int64_t> shape(wt.getRank(), 1);
      shape[0] = wt.getDimSize(0);
      FORGE_TRY(r, n.reshape(z0, shape));
      z = r;
    }
    FORGE_TRY(d, n.create1("sub", {wf, z}));
    ws = d;
  }
  size_t spatial = xt.getRank() - 2;
  SmallVector<int64_t> kernel(wt.getShape().drop_front(2));
  auto strides = intsOr(n, "strides", spatial, 1), dilations = intsOr(n, "dilations", spatial, 1);
  auto pads = resolvePads(n, xt.getShape().drop_front(2), kernel, strides, dilations);
  if (failed(pads))
    return failure();
  FORGE_TRY(conv, n.create1("conv", {xs, ws}, {n.ints("strides", strides),
                                               n.ints("pads", *pads),
                                               n.ints("dilations", dilations),
                                               n.i64("group", n.intAttr("group", 1))}));
  return n.cast(conv, n.b.getI32Type());
}

LogicalResult importConvInteger(NodeImporter &n) {
  return out(n, integerConv(n, n.input(0), n.input(2), n.input(1), n.input(3)));
}

/// QLinearConv: the integer convolution plus the int32 bias, times
/// x_scale * w_scale / y_scale (w_scale per output channel or not), plus the
/// output zero point, clipped and rounded half to even into its type.
LogicalResult importQLinearConv(NodeImporter &n) {
  auto x = n.inputType(0), w = n.inputType(3);
  if (!x || !w || !n.input(6))
    return n.error() << "QLinearConv needs x, w and the scales";
  FORGE_TRY(acc, integerConv(n, n.input(0), n.input(2), n.input(3), n.input(5)));
  Type f64 = n.b.getF64Type();
  FORGE_TRY(accD, n.cast(acc, f64));
  Value sum = accD;
  if (n.input(8)) { // bias [M], int32
    FORGE_TRY(b, n.cast(n.input(8), f64));
    SmallVector<int64_t> shape(x.getRank(), 1);
    shape[1] = typeOf(b).getNumElements();
    FORGE_TRY(br, n.reshape(b, shape));
    FORGE_TRY(withBias, n.create1("add", {accD, br}));
    sum = withBias;
  }
  FORGE_TRY(xs, n.cast(n.input(1), f64));
  FORGE_TRY(ws0, n.cast(n.input(4), f64));
  Value ws = ws0;
  if (typeOf(ws0).getNumElements() > 1) {
    SmallVector<int64_t> shape(x.getRank(), 1);
    shape[1] = typeOf(ws0).getNumElements();
    FORGE_TRY(r, n.reshape(ws0, shape));
    ws = r;
  }
  FORGE_TRY(ys, n.cast(n.input(6), f64));
  FORGE_TRY(xw, n.create1("mul", {xs, ws}));
  FORGE_TRY(factor, n.create1("div", {xw, ys}));
  FORGE_TRY(scaled, n.create1("mul", {sum, factor}));
  Value shifted = scaled;
  if (n.input(7)) {
    FORGE_TRY(z, n.cast(n.input(7), f64));
    FORGE_TRY(s2, n.create1("add", {scaled, z}));
    shifted = s2;
  }
  Type target = n.input(7) ? n.inputType(7).getElementType() : x.getElementType();
  auto [lo, hi] = quantRange(target);
  FORGE_TRY(clipped, n.create1("clip", {shifted}, {n.f64("min", lo), n.f64("max", hi)}));
  FORGE_TRY(rounded, n.create1("round", {clipped}));
  return out(n, n.cast(rounded, target));
}

} // namespace

/// MaxPool's Indices: each window's taps gathered from the input padded with
/// the lowest value (constant [windows, taps] positions), the first maximum's
/// tap (argmax), and that tap's flat index in the unpadded input (a constant
/// table, row- or column-major by storage_order) plus the plane's offset
/// n * C + c, as ONNX defines ([0, N*C*D1*...*Dn)).
LogicalResult onnx_import::importMaxPoolIndices(NodeImporter &n, const PoolWindow &w,
                                                RankedTensorType pooled) {
  auto x = n.inputType(0);
  Type elem = x.getElementType();
  int64_t rank = x.getRank(), sp = rank - 2, batch = x.getDimSize(0), ch = x.getDimSize(1);
  bool columnMajor = n.intAttr("storage_order", 0) != 0;
  SmallVector<int64_t> image(x.getShape().drop_front(2)), outDims(pooled.getShape().drop_front(2));
  // Pad so that every tap of every window (ceil_mode's last ones too) is inside.
  SmallVector<int64_t> pads(2 * rank, 0), padded(sp);
  for (int64_t d = 0; d < sp; ++d) {
    int64_t need = (outDims[d] - 1) * w.strides[d] + (w.kernel[d] - 1) * w.dilations[d] + 1;
    pads[2 + d] = w.pads[d];
    pads[rank + 2 + d] = std::max<int64_t>(w.pads[sp + d], need - image[d] - w.pads[d]);
    padded[d] = image[d] + pads[2 + d] + pads[rank + 2 + d];
  }
  double lowest = isa<FloatType>(elem) ? -INFINITY
                  : elem.isUnsignedInteger() ? 0.0
                                             : -std::ldexp(1.0, elem.getIntOrFloatBitWidth() - 1);
  FORGE_TRY(xp, n.create1("pad", {n.input(0)}, {n.ints("pads", pads), n.str("mode", "constant"),
                                                n.f64("value", lowest)}));
  int64_t paddedSize = 1, imageSize = 1, windows = 1, taps = 1;
  for (int64_t d = 0; d < sp; ++d) {
    paddedSize *= padded[d];
    imageSize *= image[d];
    windows *= outDims[d];
    taps *= w.kernel[d];
  }
  // Per (window, tap): its position in the padded plane, and its flat index in
  // the image (storage order), -1 for padding (never the maximum).
  SmallVector<int64_t> gatherAt, imageIndex;
  SmallVector<int64_t> o(sp, 0), k(sp, 0);
  for (int64_t wi = 0; wi < windows; ++wi) {
    for (int64_t d = sp - 1, t = wi; d >= 0; --d) {
      o[d] = t % outDims[d];
      t /= outDims[d];
    }
    // In-image taps first (in window order), padding taps after: the first
    // maximum is then always a real element, even when the real values equal
    // the padding's (all lowest) value.
    SmallVector<int64_t> windowAt, windowIndex, padAt;
    for (int64_t ti = 0; ti < taps; ++ti) {
      for (int64_t d = sp - 1, t = ti; d >= 0; --d) {
        k[d] = t % w.kernel[d];
        t /= w.kernel[d];
      }
      int64_t at = 0, index = 0;
      bool inside = true;
      for (int64_t d = 0; d < sp; ++d) {
        int64_t p = o[d] * w.strides[d] + k[d] * w.dilations[d]; // padded coordinate
        at = at * padded[d] + p;
        int64_t q = p - w.pads[d];
        inside &= q >= 0 && q < image[d];
      }
      if (inside) { // row-major, or column-major (the last spatial dim slowest)
        int64_t stride = 1;
        for (int64_t dd = 0; dd < sp; ++dd) {
          int64_t d = columnMajor ? dd : sp - 1 - dd;
          index += (o[d] * w.strides[d] + k[d] * w.dilations[d] - w.pads[d]) * stride;
          stride *= image[d];
        }
      }
      if (inside) {
        windowAt.push_back(at);
        windowIndex.push_back(index);
      } else {
        padAt.push_back(at);
      }
    }
    gatherAt.append(windowAt.begin(), windowAt.end());
    gatherAt.append(padAt.begin(), padAt.end());
    imageIndex.append(windowIndex.begin(), windowIndex.end());
    imageIndex.append(padAt.size(), -1);
  }
  Type i64 = n.b.getI64Type();
  auto constant = [&](ArrayRef<int64_t> shape, ArrayRef<int64_t> values) {
    return n.constant(DenseElementsAttr::get(RankedTensorType::get(shape, i64), values));
  };
  FORGE_TRY(planes, n.reshape(xp, {batch, ch, paddedSize}));
  FORGE_TRY(tapsOf, n.create1("gather", {planes, constant({windows * taps}, gatherAt)},
                              {n.i64("axis", 2)}));
  FORGE_TRY(grid, n.reshape(tapsOf, {batch, ch, windows, taps}));
  FORGE_TRY(best, n.create1("argmax", {grid}, {n.i64("axis", 3), n.flag("keepdims", false),
                                               n.flag("select_last_index", false)}));
  SmallVector<int64_t> windowBase(windows);
  for (int64_t wi = 0; wi < windows; ++wi)
    windowBase[wi] = wi * taps;
  FORGE_TRY(pick, n.create1("add", {best, constant({1, 1, windows}, windowBase)}));
  FORGE_TRY(spatial, n.create1("gather", {constant({windows * taps}, imageIndex), pick},
                               {n.i64("axis", 0)}));
  SmallVector<int64_t> planeBase(batch * ch);
  for (int64_t p = 0; p < batch * ch; ++p)
    planeBase[p] = p * imageSize;
  FORGE_TRY(flat, n.create1("add", {spatial, constant({batch, ch, 1}, planeBase)}));
  return out(n, n.reshape(flat, pooled.getShape()), 1);
}

void onnx_import::addCompositeRules(llvm::StringMap<OpRule> &r) {
  r["ReduceSumSquare"] = sumOf("square", "");
  r["ReduceL1"] = sumOf("abs", "");
  r["ReduceLogSum"] = sumOf("", "log");
  r["ReduceLogSumExp"] = importReduceLogSumExp;
  r["ArgMin"] = importArgMin;
  r["Hardmax"] = importHardmax;
  r["TopK"] = importTopK;
  r["DepthToSpace"] = importDepthToSpace;
  r["SpaceToDepth"] = importSpaceToDepth;
  r["GatherND"] = importGatherND;
  r["ScatterElements"] = importScatterElements;
  r["Scatter"] = importScatterElements; // opset 9-10 name (deprecated)
  r["ScatterND"] = importScatterND;
  r["RMSNormalization"] = importRMSNormalization;
  r["RotaryEmbedding"] = importRotaryEmbedding;
  r["Attention"] = importAttention;
  r["Resize"] = importResize;
  r["Softsign"] = unaryComposite(softsign);
  r["Mish"] = unaryComposite(mish);
  r["Celu"] = unaryComposite(celu);
  r["Shrink"] = unaryComposite(shrink);
  r["Sign"] = unaryComposite(sign);
  r["PRelu"] = importPRelu;
  r["MeanVarianceNormalization"] = importMeanVarianceNormalization;
  r["LpNormalization"] = importLpNormalization;
  r["LpPool"] = importLpPool;
  r["GlobalLpPool"] = importGlobalLpPool;
  r["LRN"] = importLRN;
  r["CenterCropPad"] = importCenterCropPad;
  r["EyeLike"] = importEyeLike;
  r["ReverseSequence"] = importReverseSequence;
  r["GridSample"] = importGridSample;
  r["Col2Im"] = importCol2Im;
  r["AffineGrid"] = importAffineGrid;
  r["HannWindow"] = window("hann");
  r["HammingWindow"] = window("hamming");
  r["BlackmanWindow"] = window("blackman");
  r["QuantizeLinear"] = importQuantizeLinear;
  r["DequantizeLinear"] = importDequantizeLinear;
  r["DynamicQuantizeLinear"] = importDynamicQuantizeLinear;
  r["MatMulInteger"] = importMatMulInteger;
  r["QLinearMatMul"] = importQLinearMatMul;
  r["DFT"] = importDFT;
  r["STFT"] = importSTFT;
  r["MaxUnpool"] = importMaxUnpool;
  r["ConvInteger"] = importConvInteger;
  r["QLinearConv"] = importQLinearConv;
  r["Upsample"] = importResize;
}
