//===- OnnxRecurrent.cpp - LSTM, GRU and RNN as unrolled primitives --------===//
//
// ONNX's recurrent ops imported as their equations unrolled over the (static)
// sequence: one matmul of all inputs with W per direction, then per step a
// matmul with R, the gate activations and the state update. Trainable through
// the primitives' gradient rules (back-propagation through time falls out).
//
// Invariants: every direction, sequence_lens, initial states, peepholes, clip,
// input_forget, linear_before_reset, layout and the activation list follow the
// ONNX spec (LSTM-14, GRU-14, RNN-14). With sequence_lens, a batch entry's
// state is held after its last step and its outputs there are zero; the
// reverse direction runs each entry's valid prefix backwards (a per-entry time
// permutation, applied to the inputs and again to the outputs). The graph grows
// with the sequence length: fine for the lengths training uses; a fused
// recurrent kernel can replace it later without changing the semantics.
//
//===----------------------------------------------------------------------===//

#include "ImportContext.h"

#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/StringExtras.h"

using namespace mlir;
using namespace mlir::forge;
using namespace mlir::forge::onnx_import;

namespace {

#define FORGE_TRY(var, expr)                                                                       \
  auto var##OrFailure = (expr);                                                                    \
  if (failed(var##OrFailure))                                                                      \
    return failure();                                                                              \
  Value var = *var##OrFailure

RankedTensorType typeOf(Value v) { return cast<RankedTensorType>(v.getType()); }

enum class Kind { LSTM, GRU, RNN };

/// One activation of the `activations` attribute with its alpha/beta.
struct Activation {
  std::string name;
  double alpha = 0, beta = 0;
};

/// A slice along one axis (the others whole).
FailureOr<Value> sliceAxis(NodeImporter &n, Value v, int64_t axis, int64_t start, int64_t end) {
  auto t = typeOf(v);
  SmallVector<int64_t> starts(t.getRank(), 0), ends(t.getShape()), steps(t.getRank(), 1);
  starts[axis] = start;
  ends[axis] = end;
  return n.create1("slice", {v}, {n.ints("starts", starts), n.ints("ends", ends),
                                  n.ints("steps", steps)});
}

FailureOr<Value> activate(NodeImporter &n, const Activation &a, Value x) {
  Type elem = typeOf(x).getElementType();
  std::string f = llvm::StringRef(a.name).lower();
  auto scaled = [&](Value v, double s) { return n.create1("mul", {v, n.scalar(elem, s)}); };
  if (f == "sigmoid")
    return n.create1("sigmoid", {x});
  if (f == "tanh")
    return n.create1("tanh", {x});
  if (f == "relu")
    return n.create1("relu", {x});
  if (f == "leakyrelu")
    return n.create1("leaky_relu", {x}, {n.f64("alpha", a.alpha)});
  if (f == "elu")
    return n.create1("elu", {x}, {n.f64("alpha", a.alpha)});
  if (f == "softplus")
    return n.create1("softplus", {x});
  if (f == "hardsigmoid")
    return n.create1("hard_sigmoid", {x}, {n.f64("alpha", a.alpha), n.f64("beta", a.beta)});
  if (f == "affine") { // alpha * x + beta
    FORGE_TRY(m, scaled(x, a.alpha));
    return n.create1("add", {m, n.scalar(elem, a.beta)});
  }
  if (f == "scaledtanh") { // alpha * tanh(beta * x)
    FORGE_TRY(m, scaled(x, a.beta));
    FORGE_TRY(t, n.create1("tanh", {m}));
    return scaled(t, a.alpha);
  }
  if (f == "softsign") { // x / (1 + |x|)
    FORGE_TRY(ab, n.create1("abs", {x}));
    FORGE_TRY(d, n.create1("add", {ab, n.scalar(elem, 1.0)}));
    return n.create1("div", {x, d});
  }
  if (f == "thresholdedrelu") { // x where x > alpha, else 0
    FORGE_TRY(above, n.create1("greater", {x, n.scalar(elem, a.alpha)}));
    return n.create1("where", {above, x, n.scalar(elem, 0.0)});
  }
  return n.error() << "unsupported activation '" << a.name << "'";
}

/// The per-direction activations: the attribute's, else the defaults; alpha and
/// beta are consumed in order by the functions that take them (ONNX Runtime's
/// reading), with each function's ONNX default otherwise.
FailureOr<SmallVector<Activation>> activations(NodeImporter &n, Kind kind, int64_t directions) {
  SmallVector<std::string> names;
  if (const auto *a = n.attr("activations"))
    for (const auto &s : a->strings())
      names.push_back(s);
  else {
    static const char *const lstm[] = {"Sigmoid", "Tanh", "Tanh"}, *const gru[] = {"Sigmoid", "Tanh"},
                             *const rnn[] = {"Tanh"};
    ArrayRef<const char *> defaults = kind == Kind::LSTM  ? ArrayRef<const char *>(lstm)
                                      : kind == Kind::GRU ? ArrayRef<const char *>(gru)
                                                          : ArrayRef<const char *>(rnn);
    for (int64_t d = 0; d < directions; ++d)
      for (const char *s : defaults)
        names.push_back(s);
  }
  int64_t per = kind == Kind::LSTM ? 3 : kind == Kind::GRU ? 2 : 1;
  if (static_cast<int64_t>(names.size()) != per * directions)
    return n.error() << "activations lists " << names.size() << " functions, expected "
                     << per * directions;
  SmallVector<double> alphas, betas;
  if (const auto *a = n.attr("activation_alpha"))
    alphas.assign(a->floats().begin(), a->floats().end());
  if (const auto *b = n.attr("activation_beta"))
    betas.assign(b->floats().begin(), b->floats().end());
  size_t ai = 0, bi = 0;
  SmallVector<Activation> out;
  for (const std::string &name : names) {
    std::string f = llvm::StringRef(name).lower();
    Activation act{name};
    bool usesAlpha = llvm::is_contained({"leakyrelu", "thresholdedrelu", "scaledtanh",
                                         "hardsigmoid", "elu", "affine"},
                                        f);
    bool usesBeta = llvm::is_contained({"scaledtanh", "hardsigmoid", "affine"}, f);
    double alphaDefault = f == "leakyrelu" ? 0.01 : f == "hardsigmoid" ? 0.2 : 1.0;
    double betaDefault = f == "hardsigmoid" ? 0.5 : f == "affine" ? 0.0 : 1.0;
    act.alpha = usesAlpha && ai < alphas.size() ? alphas[ai++] : alphaDefault;
    act.beta = usesBeta && bi < betas.size() ? betas[bi++] : betaDefault;
    out.push_back(act);
  }
  return out;
}

LogicalResult importRecurrent(NodeImporter &n, Kind kind) {
  auto xT = n.inputType(0), wT = n.inputType(1), rT = n.inputType(2);
  if (!xT || !wT || !rT || xT.getRank() != 3 || wT.getRank() != 3 || rT.getRank() != 3)
    return n.error() << "needs X, W and R of rank 3";
  std::string direction = n.stringAttr("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    return n.error() << "direction must be forward, reverse or bidirectional";
  int64_t dirs = direction == "bidirectional" ? 2 : 1;
  int64_t gates = kind == Kind::LSTM ? 4 : kind == Kind::GRU ? 3 : 1;
  int64_t hidden = n.intAttr("hidden_size", wT.getDimSize(1) / gates);
  bool batchFirst = n.intAttr("layout", 0) != 0;
  double clip = n.floatAttr("clip", 0.0);
  bool coupled = kind == Kind::LSTM && n.intAttr("input_forget", 0) != 0;
  bool linearBeforeReset = kind == Kind::GRU && n.intAttr("linear_before_reset", 0) != 0;
  Type elem = xT.getElementType();
  if (!isa<FloatType>(elem))
    return n.error() << "needs a float input";
  if (wT.getDimSize(0) != dirs || wT.getDimSize(1) != gates * hidden ||
      rT.getShape() != ArrayRef<int64_t>{dirs, gates * hidden, hidden})
    return n.error() << "W " << wT << " / R " << rT << " do not match " << dirs
                     << " direction(s) of " << gates << " gates of hidden_size " << hidden;
  auto acts = activations(n, kind, dirs);
  if (failed(acts))
    return failure();

  // X as [T, B, I].
  Value x = n.input(0);
  if (batchFirst) {
    FORGE_TRY(t, n.transpose(x, {1, 0, 2}));
    x = t;
  }
  int64_t steps = typeOf(x).getDimSize(0), batch = typeOf(x).getDimSize(1);
  int64_t inputSize = typeOf(x).getDimSize(2);
  // Initial states as [D, B, H].
  auto initial = [&](int64_t i) -> FailureOr<Value> {
    Value v = n.input(i);
    if (!v)
      return n.constant(DenseElementsAttr::get(
          RankedTensorType::get({dirs, batch, hidden}, elem), n.b.getFloatAttr(elem, 0.0)));
    return batchFirst ? n.transpose(v, {1, 0, 2}) : FailureOr<Value>(v);
  };
  FORGE_TRY(h0All, initial(5));
  Value c0All;
  if (kind == Kind::LSTM) {
    FORGE_TRY(c, initial(6));
    c0All = c;
  }
  // sequence_lens: masks and the reverse direction's per-entry permutation,
  // unless it is a constant equal to the sequence length everywhere.
  Value lens; // [1, B] int64, or null
  if (n.input(4)) {
    bool full = false;
    if (DenseElementsAttr c = n.constantInput(4))
      full = llvm::all_of(c.getValues<APInt>(),
                          [&](const APInt &v) { return v.getSExtValue() == steps; });
    if (!full) {
      FORGE_TRY(wide, n.cast(n.input(4), n.b.getI64Type()));
      FORGE_TRY(row, n.reshape(wide, {1, batch}));
      lens = row;
    }
  }
  Type i64 = n.b.getI64Type();
  Value permutation; // [T, B]: t -> lens - 1 - t inside each entry's sequence
  if (lens && direction != "forward") {
    SmallVector<int64_t> ts(steps);
    for (int64_t t = 0; t < steps; ++t)
      ts[t] = t;
    Value tcol = n.constant(
        DenseElementsAttr::get(RankedTensorType::get({steps, 1}, i64), ArrayRef<int64_t>(ts)));
    FORGE_TRY(inside, n.create1("less", {tcol, lens}));
    FORGE_TRY(lastIndex, n.create1("sub", {lens, n.scalar(i64, 1)}));
    FORGE_TRY(mirrored, n.create1("sub", {lastIndex, tcol}));
    FORGE_TRY(tFull, n.create1("broadcast", {tcol}, {n.ints("shape", {steps, batch})}));
    FORGE_TRY(perm, n.create1("where", {inside, mirrored, tFull}));
    permutation = perm;
  }
  auto permute = [&](Value v) -> FailureOr<Value> { // [T, B, F] by the permutation
    auto t = typeOf(v);
    auto idx3 = n.reshape(permutation, {steps, batch, 1});
    if (failed(idx3))
      return failure();
    auto idx = n.create1("broadcast", {*idx3}, {n.ints("shape", t.getShape())});
    if (failed(idx))
      return failure();
    return n.create1("gather_elements", {v, *idx}, {n.i64("axis", 0)});
  };
  auto gateAct = [&](Value pre, const Activation &a) -> FailureOr<Value> {
    if (clip > 0) {
      auto c = n.create1("clip", {pre}, {n.f64("min", -clip), n.f64("max", clip)});
      if (failed(c))
        return failure();
      pre = *c;
    }
    return activate(n, a, pre);
  };

  SmallVector<Value> yDirs, hLast, cLast;
  for (int64_t d = 0; d < dirs; ++d) {
    bool reverse = direction == "reverse" || d == 1;
    const Activation *act = &(*acts)[d * (kind == Kind::LSTM ? 3 : kind == Kind::GRU ? 2 : 1)];
    auto ofDir = [&](Value v, int64_t rows) -> FailureOr<Value> { // v[d] as [rows, cols]
      auto sliced = sliceAxis(n, v, 0, d, d + 1);
      if (failed(sliced))
        return failure();
      return n.reshape(*sliced, {rows, typeOf(v).getDimSize(2)});
    };
    FORGE_TRY(w, ofDir(n.input(1), gates * hidden));
    FORGE_TRY(r, ofDir(n.input(2), gates * hidden));
    FORGE_TRY(wt, n.transpose(w, {1, 0}));
    FORGE_TRY(rt, n.transpose(r, {1, 0}));
    Value xd = x;
    if (reverse && permutation) {
      FORGE_TRY(p, permute(x));
      xd = p;
    }
    // All steps' input projections at once: [T*B, I] x [I, G*H] (+ Wb).
    FORGE_TRY(flatX, n.reshape(xd, {steps * batch, inputSize}));
    FORGE_TRY(xwFlat, n.create1("matmul", {flatX, wt}));
    Value xw = xwFlat, rb;
    if (n.input(3)) {
      FORGE_TRY(bd, sliceAxis(n, n.input(3), 0, d, d + 1));
      FORGE_TRY(bv, n.reshape(bd, {2 * gates * hidden}));
      FORGE_TRY(wb, sliceAxis(n, bv, 0, 0, gates * hidden));
      FORGE_TRY(rbv, sliceAxis(n, bv, 0, gates * hidden, 2 * gates * hidden));
      FORGE_TRY(biased, n.create1("add", {xw, wb}));
      xw = biased;
      rb = rbv;
    }
    FORGE_TRY(xw3, n.reshape(xw, {steps, batch, gates * hidden}));
    Value peep[3]; // LSTM P: i, o, f
    if (kind == Kind::LSTM && n.input(7)) {
      FORGE_TRY(pd, sliceAxis(n, n.input(7), 0, d, d + 1));
      FORGE_TRY(pv, n.reshape(pd, {3 * hidden}));
      for (int j = 0; j < 3; ++j) {
        FORGE_TRY(pj, sliceAxis(n, pv, 0, j * hidden, (j + 1) * hidden));
        peep[j] = pj;
      }
    }
    FORGE_TRY(h0, ofDir(h0All, batch));
    Value h = h0, c;
    if (kind == Kind::LSTM) {
      FORGE_TRY(c0, ofDir(c0All, batch));
      c = c0;
    }
    SmallVector<Value> ys(steps);
    for (int64_t s = 0; s < steps; ++s) {
      // With a permutation the reversed sequences run forwards.
      int64_t t = reverse && !permutation ? steps - 1 - s : s;
      FORGE_TRY(xs, sliceAxis(n, xw3, 0, t, t + 1));
      FORGE_TRY(xt, n.reshape(xs, {batch, gates * hidden}));
      auto gate = [&](Value all, int64_t j) { return sliceAxis(n, all, 1, j * hidden, (j + 1) * hidden); };
      FORGE_TRY(hrRaw, n.create1("matmul", {h, rt}));
      Value hr = hrRaw;
      if (rb) {
        FORGE_TRY(hb, n.create1("add", {hr, rb}));
        hr = hb;
      }
      Value hNew, cNew;
      if (kind == Kind::RNN) {
        FORGE_TRY(pre, n.create1("add", {xt, hr}));
        FORGE_TRY(hn, gateAct(pre, act[0]));
        hNew = hn;
      } else if (kind == Kind::GRU) { // gates z, r, h
        FORGE_TRY(xz, gate(xt, 0));
        FORGE_TRY(hz, gate(hr, 0));
        FORGE_TRY(xr, gate(xt, 1));
        FORGE_TRY(hrr, gate(hr, 1));
        FORGE_TRY(xh, gate(xt, 2));
        FORGE_TRY(zPre, n.create1("add", {xz, hz}));
        FORGE_TRY(z, gateAct(zPre, act[0]));
        FORGE_TRY(rPre, n.create1("add", {xr, hrr}));
        FORGE_TRY(rg, gateAct(rPre, act[0]));
        Value candidate;
        if (linearBeforeReset) { // rt * (H Rh^T + Rbh)
          FORGE_TRY(hh, gate(hr, 2));
          FORGE_TRY(reset, n.create1("mul", {rg, hh}));
          FORGE_TRY(sum, n.create1("add", {xh, reset}));
          candidate = sum;
        } else { // (rt * H) Rh^T + Rbh
          FORGE_TRY(rh, n.create1("mul", {rg, h}));
          FORGE_TRY(rhT, sliceAxis(n, rt, 1, 2 * hidden, 3 * hidden));
          FORGE_TRY(proj, n.create1("matmul", {rh, rhT}));
          Value projB = proj;
          if (rb) {
            FORGE_TRY(rbh, sliceAxis(n, rb, 0, 2 * hidden, 3 * hidden));
            FORGE_TRY(pb, n.create1("add", {proj, rbh}));
            projB = pb;
          }
          FORGE_TRY(sum, n.create1("add", {xh, projB}));
          candidate = sum;
        }
        FORGE_TRY(hc, gateAct(candidate, act[1]));
        // H = (1 - z) * h~ + z * H = h~ + z * (H - h~)
        FORGE_TRY(diff, n.create1("sub", {h, hc}));
        FORGE_TRY(zd, n.create1("mul", {z, diff}));
        FORGE_TRY(hn, n.create1("add", {hc, zd}));
        hNew = hn;
      } else { // LSTM gates i, o, f, c
        FORGE_TRY(pre, n.create1("add", {xt, hr}));
        FORGE_TRY(iPre0, gate(pre, 0));
        FORGE_TRY(oPre0, gate(pre, 1));
        FORGE_TRY(fPre0, gate(pre, 2));
        FORGE_TRY(cPre, gate(pre, 3));
        Value iPre = iPre0, fPre = fPre0, oPre = oPre0;
        if (peep[0]) {
          FORGE_TRY(pi, n.create1("mul", {peep[0], c}));
          FORGE_TRY(ip, n.create1("add", {iPre, pi}));
          iPre = ip;
          FORGE_TRY(pf, n.create1("mul", {peep[2], c}));
          FORGE_TRY(fp, n.create1("add", {fPre, pf}));
          fPre = fp;
        }
        FORGE_TRY(ig, gateAct(iPre, act[0]));
        Value fg;
        if (coupled) {
          FORGE_TRY(one, n.create1("sub", {n.scalar(elem, 1.0), ig}));
          fg = one;
        } else {
          FORGE_TRY(f, gateAct(fPre, act[0]));
          fg = f;
        }
        FORGE_TRY(cg, gateAct(cPre, act[1]));
        FORGE_TRY(keep, n.create1("mul", {fg, c}));
        FORGE_TRY(write, n.create1("mul", {ig, cg}));
        FORGE_TRY(cn, n.create1("add", {keep, write}));
        cNew = cn;
        if (peep[1]) {
          FORGE_TRY(po, n.create1("mul", {peep[1], cNew}));
          FORGE_TRY(op, n.create1("add", {oPre, po}));
          oPre = op;
        }
        FORGE_TRY(og, gateAct(oPre, act[0]));
        FORGE_TRY(hc, activate(n, act[2], cNew));
        FORGE_TRY(hn, n.create1("mul", {og, hc}));
        hNew = hn;
      }
      Value y = hNew;
      if (lens) { // past an entry's length: hold the state, output zero
        Value tConst = n.scalar(i64, static_cast<double>(s));
        FORGE_TRY(validRow, n.create1("less", {tConst, lens}));
        FORGE_TRY(valid, n.reshape(validRow, {batch, 1}));
        FORGE_TRY(hHeld, n.create1("where", {valid, hNew, h}));
        FORGE_TRY(yMasked, n.create1("where", {valid, hNew, n.scalar(elem, 0.0)}));
        hNew = hHeld;
        y = yMasked;
        if (cNew) {
          FORGE_TRY(cHeld, n.create1("where", {valid, cNew, c}));
          cNew = cHeld;
        }
      }
      h = hNew;
      c = cNew;
      FORGE_TRY(y4, n.reshape(y, {1, 1, batch, hidden}));
      ys[t] = y4;
    }
    FORGE_TRY(yd, n.create1("concat", ys, {n.i64("axis", 0)})); // [T, 1, B, H]
    Value yDir = yd;
    if (reverse && permutation) { // back to each entry's original time order
      FORGE_TRY(y3, n.reshape(yd, {steps, batch, hidden}));
      FORGE_TRY(back, permute(y3));
      FORGE_TRY(y4, n.reshape(back, {steps, 1, batch, hidden}));
      yDir = y4;
    }
    yDirs.push_back(yDir);
    FORGE_TRY(hl, n.reshape(h, {1, batch, hidden}));
    hLast.push_back(hl);
    if (c) {
      FORGE_TRY(cl, n.reshape(c, {1, batch, hidden}));
      cLast.push_back(cl);
    }
  }
  auto joined = [&](ArrayRef<Value> parts, int64_t axis) -> FailureOr<Value> {
    if (parts.size() == 1)
      return parts[0];
    return n.create1("concat", parts, {n.i64("axis", axis)});
  };
  // Outputs: Y [T, D, B, H] (layout 1: [B, T, D, H]), Y_h/Y_c [D, B, H] ([B, D, H]).
  if (n.outputUsed(0)) {
    FORGE_TRY(y, joined(yDirs, 1));
    if (batchFirst) {
      FORGE_TRY(yt, n.transpose(y, {2, 0, 1, 3}));
      y = yt;
    }
    (void)n.setOutput(0, y);
  }
  for (auto [index, parts] : {std::pair<int64_t, ArrayRef<Value>>{1, hLast}, {2, cLast}}) {
    if (!n.outputUsed(index) || parts.empty())
      continue;
    FORGE_TRY(s, joined(parts, 0));
    if (batchFirst) {
      FORGE_TRY(st, n.transpose(s, {1, 0, 2}));
      s = st;
    }
    (void)n.setOutput(index, s);
  }
  return success();
}

} // namespace

void onnx_import::addRecurrentRules(llvm::StringMap<OpRule> &r) {
  r["LSTM"] = [](NodeImporter &n) { return importRecurrent(n, Kind::LSTM); };
  r["GRU"] = [](NodeImporter &n) { return importRecurrent(n, Kind::GRU); };
  r["RNN"] = [](NodeImporter &n) { return importRecurrent(n, Kind::RNN); };
}
