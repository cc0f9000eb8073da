//===- RecognizeComposites.cpp - one op for what exporters decompose --------===//
//
// Exporters spell some ops as chains of elementwise ops (PyTorch below opset
// 20 writes the tanh GELU as 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
// and attention as matmul, scale, mask, softmax, matmul). One op is what later
// stages can reason about: its own gradient rule, a GEMM epilogue that
// computes the GELU, one fused kernel that never stores attention's T x T
// scores. The chain's ops are left dead (the import-cleanup stage's dead-code
// elimination follows).
//
// A match needs the exact constants (within 1e-6, relative) as one-element
// forge.constant operands, and every intermediate read by the chain alone.
// Nothing is folded: initializers are still constants here.
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "forge/Conversion/Conversion.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseSet.h"

#include <cmath>
#include <limits>

namespace mlir::forge {
#define GEN_PASS_DEF_RECOGNIZECOMPOSITES
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

/// The value of a one-element float constant.
std::optional<double> scalarOf(Value c) {
  auto op = c.getDefiningOp<ConstantOp>();
  auto dense = op ? dyn_cast<DenseElementsAttr>(op.getValue()) : DenseElementsAttr();
  if (!dense || dense.getNumElements() != 1 || !isa<FloatType>(dense.getElementType()))
    return std::nullopt;
  return (*dense.getValues<APFloat>().begin()).convertToDouble();
}

/// Whether `v` is a one-element constant equal to `want`.
bool isScalar(Value v, double want) {
  std::optional<double> got = scalarOf(v);
  return got && std::abs(*got - want) <= 1e-6 * std::max(1.0, std::abs(want));
}

/// The operand of the binary op defining `v` that is not `known` (either
/// order), or null; `v` must be read once (by the chain).
template <typename OpT> Value otherOperand(Value v, function_ref<bool(Value)> known) {
  auto op = v.getDefiningOp<OpT>();
  if (!op || !v.hasOneUse())
    return nullptr;
  if (known(op.getLhs()))
    return op.getRhs();
  if (known(op.getRhs()))
    return op.getLhs();
  return nullptr;
}

/// v = x * x * x (mul(x, mul(x, x)) in either order, or pow(x, 3)).
bool isCube(Value v, Value x) {
  if (auto pow = v.getDefiningOp<PowOp>())
    return v.hasOneUse() && pow.getLhs() == x && isScalar(pow.getRhs(), 3.0);
  Value sq = otherOperand<MulOp>(v, [&](Value u) { return u == x; });
  if (!sq)
    return false;
  auto square = sq.getDefiningOp<MulOp>();
  return square && sq.hasOneUse() && square.getLhs() == x && square.getRhs() == x;
}

/// v = 1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)), the tail of the tanh GELU.
bool isTanhTail(Value v, Value x) {
  Value t = otherOperand<AddOp>(v, [](Value u) { return isScalar(u, 1.0); });
  auto tanh = t ? t.getDefiningOp<TanhOp>() : TanhOp();
  if (!tanh || !t.hasOneUse())
    return false;
  Value inner = otherOperand<MulOp>(tanh.getInput(),
                                    [](Value u) { return isScalar(u, std::sqrt(2.0 / M_PI)); });
  if (!inner)
    return false;
  Value w = otherOperand<AddOp>(inner, [&](Value u) { return u == x; });
  if (!w)
    return false;
  Value cube = otherOperand<MulOp>(w, [](Value u) { return isScalar(u, 0.044715); });
  return cube && isCube(cube, x);
}

/// The x of a tanh GELU rooted at `root`, 0.5 * (x * tail) or (0.5 * x) * tail
/// (any operand order), or null.
Value tanhGeluInput(MulOp root) {
  Type type = root.getType();
  for (auto [a, b] : {std::pair(root.getLhs(), root.getRhs()), std::pair(root.getRhs(), root.getLhs())}) {
    // 0.5 * (x * tail)
    if (isScalar(b, 0.5))
      if (auto m = a.getDefiningOp<MulOp>(); m && a.hasOneUse())
        for (auto [x, tail] : {std::pair(m.getLhs(), m.getRhs()), std::pair(m.getRhs(), m.getLhs())})
          if (x.getType() == type && isTanhTail(tail, x))
            return x;
    // (0.5 * x) * tail
    if (auto h = a.getDefiningOp<MulOp>(); h && a.hasOneUse())
      for (auto [x, half] : {std::pair(h.getLhs(), h.getRhs()), std::pair(h.getRhs(), h.getLhs())})
        if (x.getType() == type && isScalar(half, 0.5) && isTanhTail(b, x))
          return x;
  }
  return nullptr;
}

/// Whether `v` is a one-element float constant that masks a score: -inf, or
/// a finite value so negative that exp() of it is 0 in f32.
bool isMaskFill(Value v) {
  std::optional<double> fill = scalarOf(v);
  return fill && *fill <= -1e9;
}

/// Whether `mask` is a boolean constant of shape [1..., Tq, Tk] that is the
/// top-left causal triangle: set where key j > query i (`setAbove`), or
/// set where j <= i (`!setAbove`).
bool isCausalMask(Value mask, int64_t tq, int64_t tk, bool setAbove) {
  auto c = mask.getDefiningOp<ConstantOp>();
  auto t = dyn_cast<RankedTensorType>(mask.getType());
  if (!c || !t || !t.getElementType().isInteger(1) || t.getRank() < 2 ||
      t.getDimSize(t.getRank() - 2) != tq || t.getDimSize(t.getRank() - 1) != tk)
    return false;
  for (int64_t d = 0; d + 2 < t.getRank(); ++d)
    if (t.getDimSize(d) != 1)
      return false;
  auto values = dyn_cast<ElementsAttr>(c.getValue());
  if (!values)
    return false;
  std::vector<uint8_t> bytes = elementsToBytes(values);
  for (int64_t i = 0; i < tq; ++i)
    for (int64_t j = 0; j < tk; ++j)
      if ((bytes[i * tk + j] != 0) != (setAbove ? j > i : j <= i))
        return false;
  return true;
}

/// x [B, Hk, T, D] when `r` is x with each head repeated G times in place,
/// reshape(broadcast(reshape(x, [B, Hk, 1, T, D]), [B, Hk, G, T, D]),
/// [B, Hk G, T, D]) read by the chain alone; else null.
Value unrepeatHeads(Value r) {
  auto outer = r.getDefiningOp<ReshapeOp>();
  auto bc = outer ? outer.getInput().getDefiningOp<BroadcastOp>() : BroadcastOp();
  auto inner = bc ? bc.getInput().getDefiningOp<ReshapeOp>() : ReshapeOp();
  if (!inner || !r.hasOneUse() || !outer.getInput().hasOneUse() || !bc.getInput().hasOneUse())
    return nullptr;
  auto x = cast<RankedTensorType>(inner.getInput().getType());
  auto in5 = cast<RankedTensorType>(inner.getType()), b5 = cast<RankedTensorType>(bc.getType());
  auto out = cast<RankedTensorType>(r.getType());
  if (x.getRank() != 4 || in5.getRank() != 5 || b5.getRank() != 5)
    return nullptr;
  int64_t b = x.getDimSize(0), hk = x.getDimSize(1), t = x.getDimSize(2), d = x.getDimSize(3);
  int64_t g = b5.getDimSize(2);
  if (in5.getShape() != ArrayRef<int64_t>{b, hk, 1, t, d} ||
      b5.getShape() != ArrayRef<int64_t>{b, hk, g, t, d} ||
      out.getShape() != ArrayRef<int64_t>{b, hk * g, t, d})
    return nullptr;
  return inner.getInput();
}

/// An attention chain rooted at `pv` = matmul(softmax(...), v).
struct AttentionMatch {
  Value q, v;
  /// k = transpose(kSource, kPerm) (no op when kPerm is the identity).
  Value kSource;
  SmallVector<int64_t> kPerm;
  double scale = 1.0;
  bool causal = false;
  WhereOp causalWhere; // the causal where-mask (when `causal`)
  /// An additive mask on the scaled scores (null: none), as the add read it
  /// (rank <= 4, broadcasting to the scores).
  Value bias;
  /// A boolean mask that is not the causal triangle (a padding mask):
  /// where(cond, s, fill) or where(cond, fill, s), which becomes the bias
  /// where(cond, 0, fill) or where(cond, fill, 0).
  WhereOp maskWhere;
  bool maskKeepsX = false; // the scores are the where's x (cond true keeps them)
};

/// Whether `t` (static) broadcasts to `scores` (numpy rules).
bool broadcastsTo(RankedTensorType t, RankedTensorType scores) {
  if (!t || !t.hasStaticShape())
    return false;
  FailureOr<SmallVector<int64_t>> shape = broadcastShapes(t.getShape(), scores.getShape());
  return succeeded(shape) && ArrayRef<int64_t>(*shape) == scores.getShape();
}

/// Whether a trainable initializer (a float constant of more than one
/// element with `forge.initializer`: build-train-step makes it a parameter)
/// reaches `v`: an attention bias of that kind (a learned position bias)
/// needs a gradient, which attention does not give its bias.
bool reachedByWeights(Value v) {
  SmallVector<Value> work{v};
  llvm::DenseSet<Operation *> seen;
  while (!work.empty()) {
    Operation *def = work.pop_back_val().getDefiningOp();
    if (!def || !seen.insert(def).second)
      continue;
    if (auto c = dyn_cast<ConstantOp>(def)) {
      auto t = cast<RankedTensorType>(c.getType());
      if (c->hasAttr("forge.initializer") && isa<FloatType>(t.getElementType()) &&
          t.getNumElements() > 1)
        return true;
      continue;
    }
    llvm::append_range(work, def->getOperands());
  }
  return false;
}

std::optional<AttentionMatch> matchAttention(MatMulOp pv) {
  auto rank4 = [](Value x) {
    auto t = dyn_cast<RankedTensorType>(x.getType());
    return t && t.hasStaticShape() && t.getRank() == 4 && isa<FloatType>(t.getElementType());
  };
  if (!rank4(pv.getLhs()) || !rank4(pv.getRhs()) || !rank4(pv.getResult()) ||
      pv.getTransA() || pv.getTransB())
    return std::nullopt;
  // [where(isnan(p), 0, p)]: the NaN guard torch's SDPA export puts after the
  // softmax (a row whose every key is masked is 0/0); the op's fully masked
  // rows are 0 already.
  Value probs = pv.getLhs();
  if (auto guard = probs.getDefiningOp<WhereOp>(); guard && probs.hasOneUse()) {
    auto isnan = guard.getCondition().getDefiningOp<IsNaNOp>();
    std::optional<double> zero = scalarOf(guard.getX());
    if (!isnan || isnan.getInput() != guard.getY() || !zero || *zero != 0.0 ||
        guard.getY().getType() != probs.getType() ||
        !llvm::all_of(guard.getY().getUsers(),
                      [&](Operation *u) { return u == guard || u == isnan; }))
      return std::nullopt;
    probs = guard.getY();
  } else if (!probs.hasOneUse()) {
    return std::nullopt;
  }
  auto softmax = probs.getDefiningOp<SoftmaxOp>();
  if (!softmax || softmax.getAxis() != 3)
    return std::nullopt;
  AttentionMatch m;
  m.v = pv.getRhs();
  Value s = softmax.getInput();
  auto scores = cast<RankedTensorType>(s.getType());
  int64_t tq = scores.getDimSize(2), tk = scores.getDimSize(3);
  // [s + bias | bias + s]: an additive or padding mask that broadcasts to
  // the scores (HF's extended attention mask, LLaMA's 4-d causal mask).
  if (auto add = s.getDefiningOp<AddOp>(); add && s.hasOneUse()) {
    for (auto [x, bias] : {std::pair(add.getLhs(), add.getRhs()), std::pair(add.getRhs(), add.getLhs())}) {
      auto t = dyn_cast<RankedTensorType>(bias.getType());
      if (x.getType() != scores || !broadcastsTo(t, scores) ||
          t.getElementType() != scores.getElementType() || reachedByWeights(bias))
        continue;
      m.bias = bias;
      s = x;
      break;
    }
    if (!m.bias)
      return std::nullopt;
  }
  // [where(mask, fill, s) | where(mask, s, fill)]
  if (auto where = s.getDefiningOp<WhereOp>(); where && s.hasOneUse()) {
    Value cond = where.getCondition();
    auto condType = dyn_cast<RankedTensorType>(cond.getType());
    if (isMaskFill(where.getX()) && isCausalMask(cond, tq, tk, /*setAbove=*/true)) {
      s = where.getY();
      m.causal = true;
      m.causalWhere = where;
    } else if (isMaskFill(where.getY()) && isCausalMask(cond, tq, tk, /*setAbove=*/false)) {
      s = where.getX();
      m.causal = true;
      m.causalWhere = where;
    } else if (!m.bias && broadcastsTo(condType, scores) &&
               (isMaskFill(where.getX()) || isMaskFill(where.getY()))) {
      // Any other boolean mask (padding, masked_fill of an input's mask).
      m.maskWhere = where;
      m.maskKeepsX = isMaskFill(where.getY());
      s = m.maskKeepsX ? where.getX() : where.getY();
    } else {
      return std::nullopt;
    }
    if (s.getType() != scores)
      return std::nullopt;
  }
  // [s * c | c * s | s / c]
  if (auto mul = s.getDefiningOp<MulOp>(); mul && s.hasOneUse()) {
    for (auto [x, c] : {std::pair(mul.getLhs(), mul.getRhs()), std::pair(mul.getRhs(), mul.getLhs())})
      if (auto value = scalarOf(c); value && x.getType() == scores) {
        m.scale = *value;
        s = x;
        break;
      }
  } else if (auto div = s.getDefiningOp<DivOp>(); div && s.hasOneUse()) {
    if (auto value = scalarOf(div.getRhs()); value && *value != 0 && div.getLhs().getType() == scores) {
      m.scale = 1.0 / *value;
      s = div.getLhs();
    }
  }
  auto qk = s.getDefiningOp<MatMulOp>();
  if (!qk || !s.hasOneUse() || qk.getTransA() || qk.getTransB() || !rank4(qk.getLhs()) ||
      !rank4(qk.getRhs()) || !std::isfinite(m.scale) || m.scale <= 0)
    return std::nullopt;
  m.q = qk.getLhs();
  // k^T = transpose(x, p) gives k = transpose(x, p with its last two swapped);
  // any other k^T, k = transpose(k^T, (0, 1, 3, 2)).
  m.kSource = qk.getRhs();
  m.kPerm = {0, 1, 3, 2};
  if (auto transpose = m.kSource.getDefiningOp<TransposeOp>(); transpose && m.kSource.hasOneUse()) {
    ArrayRef<int64_t> p = transpose.getPerm();
    m.kSource = transpose.getInput();
    m.kPerm = {p[0], p[1], p[3], p[2]};
  }
  // ONNX Attention's import scales q and k by sqrt(scale) each.
  auto q0 = m.q.getDefiningOp<MulOp>(), k0 = m.kSource.getDefiningOp<MulOp>();
  if (q0 && k0 && m.q.hasOneUse() && m.kSource.hasOneUse() && m.scale == 1.0) {
    auto qc = scalarOf(q0.getRhs()), kc = scalarOf(k0.getRhs());
    if (qc && kc && *qc == *kc && q0.getLhs().getType() == m.q.getType() &&
        k0.getLhs().getType() == m.kSource.getType()) {
      m.scale = *qc * *kc;
      m.q = q0.getLhs();
      m.kSource = k0.getLhs();
    }
  }
  auto q = cast<RankedTensorType>(m.q.getType()), kT = cast<RankedTensorType>(qk.getRhs().getType());
  auto v = cast<RankedTensorType>(m.v.getType());
  // One batch and head count (k^T's and v's as the products see them).
  if (kT.getShape().take_front(2) != q.getShape().take_front(2) ||
      v.getShape().take_front(2) != q.getShape().take_front(2) ||
      kT.getElementType() != q.getElementType() || v.getElementType() != q.getElementType())
    return std::nullopt;
  // GQA spelled out: k and v repeated per group of query heads
  // (repeat_interleave / expand: reshape(broadcast(reshape(x)))): the op reads
  // x, query head h reading key/value head h / G.
  if (llvm::equal(m.kPerm, llvm::seq<int64_t>(0, 4)))
    if (Value k0 = unrepeatHeads(m.kSource), v0 = unrepeatHeads(m.v); k0 && v0 &&
        cast<RankedTensorType>(k0.getType()).getDimSize(1) ==
            cast<RankedTensorType>(v0.getType()).getDimSize(1)) {
      m.kSource = k0;
      m.v = v0;
    }
  return m;
}

/// Why cuDNN's flash attention would not take `m` ("" when it would): its
/// head sizes (the types come later, from forge-assign-precision).
std::string cudnnRefusal(const AttentionMatch &m) {
  return cudnnAttentionHeadRefusal(cast<RankedTensorType>(m.q.getType()).getDimSize(3),
                                   cast<RankedTensorType>(m.v.getType()).getDimSize(3));
}

/// k as the match states it: kSource itself, or its transpose by kPerm.
Value keyOf(OpBuilder &b, Location loc, const AttentionMatch &m) {
  if (llvm::equal(m.kPerm, llvm::seq<int64_t>(0, 4)))
    return m.kSource;
  auto t = cast<RankedTensorType>(m.kSource.getType());
  SmallVector<int64_t> shape;
  for (int64_t p : m.kPerm)
    shape.push_back(t.getDimSize(p));
  return b.create<TransposeOp>(loc, RankedTensorType::get(shape, t.getElementType()), m.kSource,
                               b.getDenseI64ArrayAttr(m.kPerm));
}

struct RecognizeCompositesPass
    : public mlir::forge::impl::RecognizeCompositesBase<RecognizeCompositesPass> {
  using RecognizeCompositesBase::RecognizeCompositesBase;

  void runOnOperation() override {
    bool changed = false;
    SmallVector<MulOp> roots;
    getOperation().walk([&](MulOp op) { roots.push_back(op); });
    changed |= recognizeAttention();
    for (MulOp root : roots) {
      auto type = dyn_cast<RankedTensorType>(root.getType());
      if (!type || !isa<FloatType>(type.getElementType()))
        continue;
      Value x = tanhGeluInput(root);
      if (!x)
        continue;
      OpBuilder b(root);
      auto gelu = b.create<GeluOp>(root.getLoc(), root.getType(), x, b.getStringAttr("tanh"));
      root.getResult().replaceAllUsesWith(gelu.getResult());
      root.erase(); // the rest of the chain is dead now
      changed = true;
    }
    if (!changed)
      markAllAnalysesPreserved();
  }

  bool recognizeAttention() {
    if (attention != "all" && attention != "cudnn" && attention != "none") {
      getOperation().emitError() << "forge-recognize-composites: attention must be all, cudnn "
                                    "or none, got '" << attention << "'";
      signalPassFailure();
      return false;
    }
    SmallVector<MatMulOp> roots;
    getOperation().walk([&](MatMulOp op) { roots.push_back(op); });
    bool changed = false;
    int unfused = 0;
    std::string why;
    for (MatMulOp root : roots) {
      std::optional<AttentionMatch> m = matchAttention(root);
      if (!m)
        continue;
      std::string refusal = attention == "none"    ? "this target has no fused attention at "
                                                     "this precision"
                            : attention == "cudnn" ? cudnnRefusal(*m)
                                                   : "";
      if (!refusal.empty()) {
        ++unfused;
        why = refusal;
        continue;
      }
      OpBuilder b(root);
      Location loc = root.getLoc();
      // q, k and v all head transposes (0, 2, 1, 3) of [B, T, H, D] views (the
      // exporters' split heads): layout bshd reads those, so that autodiff
      // sees no transpose around attention (canonicalization would fold them
      // later too, but not across the gradient rule's dk centering).
      const SmallVector<int64_t> swap = {0, 2, 1, 3};
      auto headView = [&](Value x) -> Value {
        auto t = x.getDefiningOp<TransposeOp>();
        return t && t.getPerm() == ArrayRef<int64_t>(swap) ? t.getInput() : Value();
      };
      Value qs = headView(m->q), vs = headView(m->v);
      bool bshd = qs && vs && m->kPerm == swap;
      Value q = bshd ? qs : m->q, v = bshd ? vs : m->v;
      Value k = bshd ? m->kSource : keyOf(b, loc, *m);
      // A boolean mask as the additive bias: 0 where the scores are kept, the
      // fill where they are masked.
      auto asBias = [&](WhereOp where, bool keepsX) -> Value {
        Type elem = cast<RankedTensorType>(keepsX ? where.getX().getType() : where.getY().getType())
                        .getElementType();
        auto scalar = RankedTensorType::get({}, elem);
        Value zero = b.create<ConstantOp>(loc, DenseElementsAttr::get(scalar, b.getFloatAttr(elem, 0.0)));
        Value f = b.create<ConstantOp>(
            loc, DenseElementsAttr::get(
                     scalar, b.getFloatAttr(elem, *scalarOf(keepsX ? where.getY() : where.getX()))));
        return b.create<WhereOp>(loc, where.getCondition(), keepsX ? zero : f, keepsX ? f : zero);
      };
      Value bias = m->bias;
      if (WhereOp where = m->maskWhere)
        bias = asBias(where, m->maskKeepsX);
      // With a bias, the causal triangle joins it (causal = false): cuDNN's
      // causal mask hides keys with a finite fill, so a row whose visible keys
      // the bias all sets to -inf would average the hidden ones instead of
      // giving 0 (the op's fully masked row).
      bool causal = m->causal;
      if (bias && causal) {
        WhereOp where = m->causalWhere;
        bias = b.create<AddOp>(loc, bias, asBias(where, isMaskFill(where.getY())));
        causal = false;
      }
      // The bias as rank 4 (numpy broadcasting prepends ones).
      if (auto t = bias ? cast<RankedTensorType>(bias.getType()) : nullptr; t && t.getRank() < 4) {
        SmallVector<int64_t> shape(4 - t.getRank(), 1);
        llvm::append_range(shape, t.getShape());
        bias = b.create<ReshapeOp>(loc, RankedTensorType::get(shape, t.getElementType()), bias,
                                   b.getDenseI64ArrayAttr(shape));
      }
      auto op = b.create<AttentionOp>(loc, q, k, v, bias, b.getF64FloatAttr(m->scale),
                                      b.getBoolAttr(causal),
                                      b.getStringAttr(bshd ? "bshd" : "bhsd"));
      Value o = op.getO();
      if (bshd)
        o = b.create<TransposeOp>(loc, root.getType(), o, b.getDenseI64ArrayAttr(swap));
      root.getResult().replaceAllUsesWith(o);
      root.erase();
      changed = true;
    }
    if (unfused)
      getOperation().emitRemark() << "forge-recognize-composites: " << unfused
                                  << " attention chain(s) left unfused (" << why << ")";
    return changed;
  }
};

} // namespace
