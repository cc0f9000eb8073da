//===- GradientCheckTest.cpp - numeric checks of every gradient rule ------===//
//
// ../shared/DESIGN.md §8: every differentiable op gets a numeric (finite-difference,
// float64) gradient check.
//
// Each case builds
//     @main(x0, x1, ...) -> (op results in the loss..., d loss / d x_k...)
// where loss = sum_r sum(result_r * R_r) for fixed random R_r, the result
// gradients handed to DifferentiableOpInterface::buildGradient. The module
// becomes a bundle that runs on the CPU executor, all in float64. Every
// analytic gradient element is compared with the central difference
//     (loss(x + eps e_i) - loss(x - eps e_i)) / (2 eps),   eps = 1e-6,
// (the forward re-run with that input element perturbed) and must satisfy
//     |analytic - numeric| / max(1, |numeric|) <= 1e-6.
// Inputs keep a margin far larger than eps from the kinks of non-smooth ops
// (relu, clip, max_pool/reduce_max ties, ...). Each case is then rebuilt in
// float32 and its gradients must match the float64 ones to 2e-3 (same
// measure), which runs the f32 paths of the rules and backward kernels.
//
// Further tests: every differentiable op has at least two cases; the contract
// of buildGradient (nulls for integer operands and all-null result gradients,
// no ops created then, bad inputs rejected); dead backward code disappears
// under canonicalization; and the checker itself fails on a wrong gradient.
//
//===----------------------------------------------------------------------===//
#include "forge/Autodiff/GradientBuilder.h"
#include "forge/Bundle/BundleEmitter.h"
#include "forge/Dialect/ForgeDialect.h"
#include "forge/Pipeline/Pipeline.h"
#include "forge/runtime/Bundle.h"
#include "forge/runtime/CpuExecutor.h"
#include "forge/runtime/FileUtil.h"
#include "forge/runtime/Npy.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/FormatVariadic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <tuple>
#include <variant>

using namespace mlir;
using namespace mlir::forge;
namespace rt = ::forge::rt;

namespace {

constexpr double kEps = 1e-6;
constexpr double kTolerance = 1e-6;
constexpr double kF32Tolerance = 2e-3;

//===----------------------------------------------------------------------===//
// Case description
//===----------------------------------------------------------------------===//

using Sampler = std::function<double(std::mt19937_64 &)>;

Sampler uniform(double lo, double hi) {
  return [=](std::mt19937_64 &rng) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
}

/// Uniform in [lo, hi], at least `margin` away from every kink.
Sampler awayFrom(std::vector<double> kinks, double margin, double lo, double hi) {
  return [=](std::mt19937_64 &rng) {
    std::uniform_real_distribution<double> d(lo, hi);
    for (;;) {
      double v = d(rng);
      if (std::all_of(kinks.begin(), kinks.end(),
                      [&](double k) { return std::abs(v - k) >= margin; }))
        return v;
    }
  };
}

/// offset + step * k for a random integer k in [-n, n]: two operands on
/// grids with different offsets are never closer than |offset difference|.
Sampler grid(double offset, double step = 0.2, int n = 5) {
  return [=](std::mt19937_64 &rng) {
    return offset + step * std::uniform_int_distribution<int>(-n, n)(rng);
  };
}

enum class Kind {
  Var,   // a function argument: differentiated and checked
  Const, // a float constant operand (not differentiated)
  Int,   // an index/target constant (i64, or i32)
  Bool,  // a mask constant
};

struct Operand {
  Kind kind = Kind::Var;
  std::vector<int64_t> shape;
  std::vector<double> values; // fixed values; sampled when empty
  Sampler sample = uniform(-1, 1);
  bool distinct = false;   // a shuffled grid with spacing 4/numel: no ties
  bool expectNull = false; // a Var whose gradient is null by design
  bool i32 = false;        // Int: i32 instead of i64
};

Operand var(std::vector<int64_t> shape, Sampler s = uniform(-1, 1)) {
  Operand o;
  o.shape = std::move(shape);
  o.sample = std::move(s);
  return o;
}
Operand distinctVar(std::vector<int64_t> shape) {
  Operand o = var(std::move(shape));
  o.distinct = true;
  return o;
}
Operand fixedVar(std::vector<int64_t> shape, std::vector<double> values) {
  Operand o = var(std::move(shape));
  o.values = std::move(values);
  return o;
}
/// A float operand whose gradient must be null (a constant by the op's rule).
Operand nullVar(std::vector<int64_t> shape, Sampler s = uniform(-1, 1)) {
  Operand o = var(std::move(shape), std::move(s));
  o.expectNull = true;
  return o;
}
Operand constant(std::vector<int64_t> shape, Sampler s = uniform(-1, 1)) {
  Operand o = var(std::move(shape), std::move(s));
  o.kind = Kind::Const;
  return o;
}
Operand ints(std::vector<int64_t> shape, std::vector<double> values, bool i32 = false) {
  Operand o;
  o.kind = Kind::Int;
  o.shape = std::move(shape);
  o.values = std::move(values);
  o.i32 = i32;
  return o;
}
Operand bools(std::vector<int64_t> shape, std::vector<double> values) {
  Operand o = ints(std::move(shape), std::move(values));
  o.kind = Kind::Bool;
  return o;
}

/// A float element type attribute: the other float type of the run
/// (f32 in the float64 run), or the run's own.
struct FloatTypeAttr {
  bool other;
};
using AttrValue =
    std::variant<bool, int64_t, double, std::vector<int64_t>, std::string, FloatTypeAttr>;
struct Attr {
  std::string name;
  AttrValue value;
};
Attr B(std::string n, bool v) { return {std::move(n), v}; }
Attr I(std::string n, int64_t v) { return {std::move(n), v}; }
Attr F(std::string n, double v) { return {std::move(n), v}; }
Attr Is(std::string n, std::vector<int64_t> v) { return {std::move(n), std::move(v)}; }
Attr S(std::string n, std::string v) { return {std::move(n), std::move(v)}; }

struct Case {
  std::string op; // mnemonic, e.g. "matmul"
  std::string name;
  std::vector<Operand> operands;
  std::vector<Attr> attrs;
  int lossResults = -1; // leading results that enter the loss (-1: all)
  double eps = kEps, tolerance = kTolerance;
  bool f32Check = true;
};

void PrintTo(const Case &c, std::ostream *os) { *os << "forge." << c.op << " / " << c.name; }

Case mk(std::string op, std::string name, std::vector<Operand> operands,
        std::vector<Attr> attrs = {}) {
  Case c;
  c.op = std::move(op);
  c.name = std::move(name);
  c.operands = std::move(operands);
  c.attrs = std::move(attrs);
  return c;
}

//===----------------------------------------------------------------------===//
// The case table
//===----------------------------------------------------------------------===//

std::vector<Attr> convAttrs(std::vector<int64_t> strides, std::vector<int64_t> pads,
                            std::vector<int64_t> dilations, int64_t group) {
  return {Is("strides", strides), Is("pads", pads), Is("dilations", dilations), I("group", group)};
}
std::vector<Attr> poolAttrs(std::vector<int64_t> kernel, std::vector<int64_t> strides,
                            std::vector<int64_t> pads, std::vector<int64_t> dilations, bool ceil) {
  return {Is("kernel_shape", kernel), Is("strides", strides), Is("pads", pads),
          Is("dilations", dilations), B("ceil_mode", ceil)};
}
std::vector<Attr> with(std::vector<Attr> a, std::vector<Attr> more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

std::vector<Case> allCases() {
  std::vector<Case> cs;
  auto add = [&](Case c) { cs.push_back(std::move(c)); };
  const Sampler pos = uniform(0.3, 2.0);
  const Sampler nonzero = awayFrom({0.0}, 0.3, -2, 2);
  const Sampler noKink = awayFrom({0.0}, 0.05, -2, 2);

  // --- binary elementwise: same shape, broadcast both ways, scalars -------
  for (std::string op : {"add", "sub", "mul"}) {
    add(mk(op, "same_shape", {var({2, 3}), var({2, 3})}));
    add(mk(op, "broadcast_rhs", {var({2, 3, 4}), var({3, 1})}));
    add(mk(op, "broadcast_both", {var({1, 4}), var({3, 1})}));
    add(mk(op, "scalar_lhs", {var({}), var({2, 3})}));
  }
  add(mk("div", "same_shape", {var({2, 3}), var({2, 3}, nonzero)}));
  add(mk("div", "broadcast_rhs", {var({2, 3, 4}), var({4}, nonzero)}));
  add(mk("div", "broadcast_lhs", {var({3, 1}), var({2, 3, 5}, nonzero)}));
  add(mk("pow", "same_shape", {var({2, 3}, pos), var({2, 3}, uniform(-2, 2))}));
  add(mk("pow", "broadcast_exponent", {var({2, 3, 4}, pos), var({4}, uniform(-2, 2))}));
  add(mk("pow", "broadcast_both", {var({3, 1}, pos), var({1, 4}, uniform(-2, 2))}));
  // mod: a / b at least 0.15 from an integer, where the quotient (and so the
  // function) jumps.
  for (bool fmod : {true, false}) {
    std::string form = fmod ? "fmod_" : "floored_";
    add(mk("mod", form + "same_shape",
           {fixedVar({2, 3}, {2.5, -2.5, 0.3, -1.1, 3.7, -0.2}),
            fixedVar({2, 3}, {0.7, 0.7, -1.3, -1.3, 1.1, -0.45})},
           {B("fmod", fmod)}));
    add(mk("mod", form + "broadcast_rhs",
           {fixedVar({2, 3}, {2.5, -2.5, 0.3, -1.1, 3.7, -0.2}), fixedVar({3}, {0.7, -1.3, 1.1})},
           {B("fmod", fmod)}));
  }
  for (std::string op : {"min", "max"}) {
    add(mk(op, "same_shape", {var({2, 3}, grid(0.05)), var({2, 3}, grid(0.15))}));
    add(mk(op, "broadcast", {var({2, 3, 4}, grid(0.05)), var({3, 1}, grid(0.15))}));
    add(mk(op, "scalar_rhs", {var({3, 4}, grid(0.05)), var({}, grid(0.15))}));
  }

  // --- unary elementwise --------------------------------------------------
  struct Unary {
    std::string op;
    Sampler s;
    std::vector<Attr> attrs;
  };
  std::vector<Unary> unaries = {
      {"neg", uniform(-2, 2), {}},
      {"abs", nonzero, {}},
      {"exp", uniform(-2, 2), {}},
      {"log", pos, {}},
      {"sqrt", pos, {}},
      {"reciprocal", nonzero, {}},
      {"tanh", uniform(-2, 2), {}},
      {"sigmoid", uniform(-4, 4), {}},
      {"relu", noKink, {}},
      {"erf", uniform(-2, 2), {}},
      {"softplus", uniform(-4, 4), {}},
      {"hard_swish", awayFrom({-3.0, 3.0}, 0.05, -5, 5), {}},
      {"leaky_relu", noKink, {F("alpha", 0.1)}},
      {"elu", noKink, {F("alpha", 1.5)}},
      {"gelu", uniform(-3, 3), {S("approximate", "none")}},
      {"hard_sigmoid", awayFrom({-2.5, 2.5}, 0.05, -4, 4), {F("alpha", 0.2), F("beta", 0.5)}},
      {"clip", awayFrom({-0.5, 0.5}, 0.05, -1.5, 1.5), {F("min", -0.5), F("max", 0.5)}},
      {"sin", uniform(-3, 3), {}},
      {"cos", uniform(-3, 3), {}},
      {"tan", uniform(-1.2, 1.2), {}},
      // Inside the domains, away from the infinite slopes at their ends.
      {"asin", uniform(-0.9, 0.9), {}},
      {"acos", uniform(-0.9, 0.9), {}},
      {"atan", uniform(-3, 3), {}},
      {"sinh", uniform(-2, 2), {}},
      {"cosh", uniform(-2, 2), {}},
      {"asinh", uniform(-3, 3), {}},
      {"acosh", uniform(1.1, 3), {}},
      {"atanh", uniform(-0.9, 0.9), {}},
      {"selu", noKink, {F("alpha", 1.6732632423543772), F("gamma", 1.0507009873554805)}},
      {"thresholded_relu", awayFrom({0.5}, 0.05, -2, 2), {F("alpha", 0.5)}},
  };
  for (const Unary &u : unaries) {
    add(mk(u.op, "matrix", {var({2, 3}, u.s)}, u.attrs));
    add(mk(u.op, "batched", {var({4, 1, 5}, u.s)}, u.attrs));
  }
  add(mk("gelu", "tanh_matrix", {var({2, 3}, uniform(-3, 3))}, {S("approximate", "tanh")}));
  add(mk("gelu", "tanh_scalar", {var({}, uniform(-3, 3))}, {S("approximate", "tanh")}));
  add(mk("clip", "one_sided", {var({3, 4}, awayFrom({0.2}, 0.05, -1, 1))},
         {F("min", -INFINITY), F("max", 0.2)}));

  // cast: to the same type, and to f32 (the forward rounds to f32, so the
  // difference quotient needs a larger step; the function is linear).
  {
    Case c = mk("cast", "f64_to_f32", {var({2, 3})}, {{"to", FloatTypeAttr{true}}});
    c.eps = 1e-2;
    c.tolerance = 1e-4;
    c.f32Check = false;
    add(c);
    add(mk("cast", "same_type", {var({3, 2})}, {{"to", FloatTypeAttr{false}}}));
  }
  add(mk("where", "same_shape", {bools({2, 3}, {1, 0, 0, 1, 1, 0}), var({2, 3}), var({2, 3})}));
  add(mk("where", "broadcast", {bools({3, 1}, {1, 0, 1}), var({1, 4}), var({})}));
  add(mk("where", "const_y", {bools({2, 2}, {0, 1, 1, 0}), var({2, 2}), constant({2, 2})}));

  // --- matmul / gemm --------------------------------------------------------
  add(mk("matmul", "matrix", {var({3, 4}), var({4, 5})}));
  add(mk("matmul", "shared_weight", {var({2, 3, 4}), var({4, 5})}));
  add(mk("matmul", "vector_lhs", {var({4}), var({4, 5})}));
  add(mk("matmul", "vector_rhs", {var({3, 4}), var({4})}));
  add(mk("matmul", "dot", {var({4}), var({4})}));
  add(mk("matmul", "batch_broadcast", {var({2, 1, 3, 4}), var({3, 4, 2})}));
  add(mk("matmul", "batched", {var({2, 3, 4}), var({2, 4, 5})}));
  add(mk("matmul", "vector_batched", {var({4}), var({2, 4, 3})}));
  auto gemmAttrs = [](bool ta, bool tb, double alpha, double beta) {
    return std::vector<Attr>{B("transA", ta), B("transB", tb), F("alpha", alpha), F("beta", beta)};
  };
  add(mk("gemm", "plain_bias_row", {var({3, 4}), var({4, 5}), var({5})},
         gemmAttrs(false, false, 0.7, 1.3)));
  add(mk("gemm", "transA_bias_col", {var({4, 3}), var({4, 5}), var({3, 1})},
         gemmAttrs(true, false, 1.0, 1.0)));
  add(mk("gemm", "transB_full_c", {var({3, 4}), var({5, 4}), var({3, 5})},
         gemmAttrs(false, true, -0.5, 2.0)));
  add(mk("gemm", "both_scalar_c", {var({4, 3}), var({5, 4}), var({})},
         gemmAttrs(true, true, 1.5, 0.5)));
  add(mk("gemm", "no_c", {var({2, 3}), var({3, 2})}, gemmAttrs(false, false, 1.0, 1.0)));
  add(mk("gemm", "beta_zero", {var({2, 3}), var({3, 4}), nullVar({4})},
         gemmAttrs(false, false, 1.0, 0.0)));

  // --- conv / conv_transpose ----------------------------------------------
  add(mk("conv", "2d_bias", {var({2, 3, 5, 6}), var({4, 3, 3, 2}), var({4})},
         convAttrs({1, 1}, {0, 0, 0, 0}, {1, 1}, 1)));
  add(mk("conv", "2d_strided_padded_dilated", {var({1, 2, 7, 6}), var({2, 2, 3, 2})},
         convAttrs({2, 3}, {1, 0, 0, 1}, {2, 1}, 1)));
  add(mk("conv", "2d_groups", {var({1, 4, 5, 5}), var({6, 2, 3, 3}), var({6})},
         convAttrs({1, 1}, {1, 1, 1, 1}, {1, 1}, 2)));
  add(mk("conv", "2d_depthwise", {var({1, 3, 5, 4}), var({3, 1, 3, 3})},
         convAttrs({2, 1}, {1, 1, 1, 1}, {1, 1}, 3)));
  add(mk("conv", "1d", {var({2, 3, 9}), var({2, 3, 3})}, convAttrs({2}, {1, 2}, {2}, 1)));
  add(mk("conv", "3d", {var({1, 2, 4, 3, 4}), var({2, 2, 2, 2, 2}), var({2})},
         convAttrs({1, 1, 2}, {0, 1, 0, 0, 0, 1}, {1, 1, 1}, 1)));
  add(mk("conv_transpose", "2d_strided", {var({1, 3, 3, 4}), var({3, 2, 3, 3}), var({2})},
         with(convAttrs({2, 2}, {1, 1, 0, 0}, {1, 1}, 1), {Is("output_padding", {1, 0})})));
  add(mk("conv_transpose", "2d_groups", {var({2, 4, 3, 3}), var({4, 1, 2, 2})},
         with(convAttrs({1, 1}, {0, 0, 0, 0}, {1, 1}, 2), {Is("output_padding", {0, 0})})));
  add(mk("conv_transpose", "1d_dilated", {var({1, 2, 5}), var({2, 3, 3}), var({3})},
         with(convAttrs({2}, {1, 1}, {2}, 1), {Is("output_padding", {1})})));
  // output_padding >= stride (allowed by ONNX when below the dilation).
  add(mk("conv_transpose", "output_padding_above_stride", {var({2, 2, 4}), var({2, 2, 2})},
         with(convAttrs({1}, {0, 1}, {3}, 2), {Is("output_padding", {2})})));

  // --- pools (distinct values: no ties within a window) ---------------------
  add(mk("max_pool", "2d", {distinctVar({1, 2, 5, 5})},
         poolAttrs({2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 1}, false)));
  add(mk("max_pool", "2d_padded_ceil", {distinctVar({2, 1, 6, 5})},
         poolAttrs({3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, true)));
  add(mk("max_pool", "2d_overlap_dilated", {distinctVar({1, 2, 7, 7})},
         poolAttrs({2, 3}, {1, 2}, {0, 1, 0, 1}, {2, 1}, false)));
  add(mk("max_pool", "1d_ceil", {distinctVar({2, 3, 9})}, poolAttrs({3}, {2}, {1, 1}, {1}, true)));
  add(mk("avg_pool", "2d", {var({1, 2, 5, 5})},
         with(poolAttrs({2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 1}, false),
              {B("count_include_pad", false)})));
  add(mk(
      "avg_pool", "2d_padded_ceil_include_pad", {var({2, 1, 6, 5})},
      with(poolAttrs({3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, true), {B("count_include_pad", true)})));
  add(mk("avg_pool", "2d_padded_exclude_pad_dilated", {var({1, 2, 6, 6})},
         with(poolAttrs({2, 2}, {1, 2}, {1, 1, 1, 0}, {2, 1}, false),
              {B("count_include_pad", false)})));
  add(mk("avg_pool", "3d", {var({1, 1, 4, 4, 4})},
         with(poolAttrs({2, 2, 2}, {2, 2, 2}, {0, 0, 0, 0, 0, 0}, {1, 1, 1}, false),
              {B("count_include_pad", false)})));
  add(mk("avg_pool", "global", {var({2, 3, 4, 5})},
         with(poolAttrs({4, 5}, {1, 1}, {0, 0, 0, 0}, {1, 1}, false),
              {B("count_include_pad", false)})));

  // --- normalizations ---------------------------------------------------------
  add(mk("batch_norm", "4d",
         {var({2, 3, 4, 5}), var({3}), var({3}), nullVar({3}), nullVar({3}, pos)},
         {F("epsilon", 1e-5)}));
  add(mk("batch_norm", "2d", {var({4, 3}), var({3}), var({3}), nullVar({3}), nullVar({3}, pos)},
         {F("epsilon", 1e-3)}));
  add(mk("batch_norm", "param_shapes",
         {var({2, 3, 4}), var({3, 1}), var({1, 3}), constant({3}), constant({3}, pos)},
         {F("epsilon", 1e-5)}));
  {
    Case c = mk("batch_norm_training", "3d",
                {var({3, 2, 4}), var({2}), var({2}), nullVar({2}), nullVar({2}, pos)},
                {F("epsilon", 1e-5), F("momentum", 0.9)});
    c.lossResults = 1; // running statistics are state, not differentiable
    add(c);
    c = mk("batch_norm_training", "4d",
           {var({4, 3, 2, 2}), var({3}), var({3}), constant({3}), constant({3}, pos)},
           {F("epsilon", 1e-3), F("momentum", 0.1)});
    c.lossResults = 1;
    add(c);
  }
  add(mk("layer_norm", "last_axis", {var({2, 3, 4}), var({4}), var({4})},
         {I("axis", 2), F("epsilon", 1e-5)}));
  add(mk("layer_norm", "two_axes_broadcast_bias", {var({2, 3, 4}), var({3, 4}), var({4})},
         {I("axis", 1), F("epsilon", 1e-5)}));
  add(mk("layer_norm", "no_bias", {var({3, 5}), var({5})}, {I("axis", 1), F("epsilon", 1e-3)}));
  add(mk("layer_norm", "all_dims", {var({3, 4}), var({3, 4}), var({1})},
         {I("axis", 0), F("epsilon", 1e-5)}));
  add(mk("layer_norm", "broadcast_scale", {var({2, 3, 4}), var({1, 4}), var({3, 1})},
         {I("axis", 1), F("epsilon", 1e-5)}));
  add(mk("group_norm", "4d", {var({2, 4, 3, 2}), var({4}), var({4})},
         {I("num_groups", 2), F("epsilon", 1e-5)}));
  add(mk("group_norm", "3d", {var({1, 6, 5}), var({6}), var({6})},
         {I("num_groups", 3), F("epsilon", 1e-5)}));
  add(mk("group_norm", "instance", {var({2, 3, 4}), var({3}), var({3})},
         {I("num_groups", 3), F("epsilon", 1e-3)}));
  // attention: o enters the loss (lse is read only by attention_grad). Causal
  // and not, Tq != Tk, GQA (4 query heads on 2 key/value heads), Dv != D.
  {
    Case c = mk("attention", "causal", {var({2, 2, 5, 4}), var({2, 2, 5, 4}), var({2, 2, 5, 4})},
                {F("scale", 0.5), B("causal", true)});
    c.lossResults = 1;
    add(c);
    c = mk("attention", "cross_gqa", {var({1, 4, 3, 8}), var({1, 2, 6, 8}), var({1, 2, 6, 5})},
           {F("scale", 0.35), B("causal", false)});
    c.lossResults = 1;
    add(c);
    c = mk("attention", "causal_gqa_long_keys",
           {var({2, 2, 3, 4}), var({2, 1, 7, 4}), var({2, 1, 7, 4})},
           {F("scale", 1.0), B("causal", true)});
    c.lossResults = 1;
    add(c);
    // layout bshd: [B, T, H, D] operands (GQA 4/2, causal, Dv != D).
    c = mk("attention", "bshd_causal_gqa", {var({2, 5, 4, 4}), var({2, 5, 2, 4}), var({2, 5, 2, 6})},
           {F("scale", 0.5), B("causal", true), S("layout", "bshd")});
    c.lossResults = 1;
    add(c);
    // An additive bias (a mask: a constant, no gradient of its own) on the
    // scores: a padding mask [B, 1, 1, Tk] broadcast over heads and queries,
    // and a full [B, H, Tq, Tk] one beside the causal mask in layout bshd.
    c = mk("attention", "padding_bias",
           {var({2, 2, 3, 4}), var({2, 2, 5, 4}), var({2, 2, 5, 4}), constant({2, 1, 1, 5}, uniform(-3, 1))},
           {F("scale", 0.5), B("causal", false)});
    c.lossResults = 1;
    add(c);
    c = mk("attention", "bshd_causal_gqa_bias",
           {var({1, 5, 4, 4}), var({1, 5, 2, 4}), var({1, 5, 2, 6}), constant({1, 4, 5, 5}, uniform(-2, 2))},
           {F("scale", 0.5), B("causal", true), S("layout", "bshd")});
    c.lossResults = 1;
    add(c);
  }
  for (std::string op : {"softmax", "log_softmax"}) {
    add(mk(op, "rows", {var({3, 5}, uniform(-2, 2))}, {I("axis", 1)}));
    add(mk(op, "middle_axis", {var({2, 3, 4}, uniform(-2, 2))}, {I("axis", 1)}));
    add(mk(op, "vector", {var({4}, uniform(-2, 2))}, {I("axis", 0)}));
  }
  add(mk("nll_loss", "mean", {var({4, 5}), ints({4}, {0, 4, 2, 2})}, {S("reduction", "mean")}));
  add(mk("nll_loss", "sum_weight_ignore",
         {var({2, 3, 4}), ints({2, 4}, {0, 1, 2, 1, 2, 2, 0, 1}), nullVar({3}, pos)},
         {S("reduction", "sum"), I("ignore_index", 1)}));
  add(mk("nll_loss", "none_weight_ignore",
         {var({3, 4}), ints({3}, {3, 2, 0}, /*i32=*/true), nullVar({4}, pos)},
         {S("reduction", "none"), I("ignore_index", 2)}));
  add(mk("nll_loss", "mean_weight_ignore",
         {var({5, 3}), ints({5}, {0, 1, 2, 2, 1}), constant({3}, pos)},
         {S("reduction", "mean"), I("ignore_index", 0)}));

  // --- reductions and scans ---------------------------------------------------
  for (std::string op : {"reduce_sum", "reduce_mean"}) {
    add(mk(op, "one_axis", {var({2, 3, 4})}, {Is("axes", {1}), B("keepdims", false)}));
    add(mk(op, "two_axes_keepdims", {var({2, 3, 4})}, {Is("axes", {0, 2}), B("keepdims", true)}));
    add(mk(op, "all", {var({3, 4})}, {Is("axes", {0, 1}), B("keepdims", false)}));
    // A middle axis under kept rows of 128 (a warp of 4-wide vectors): the
    // generated kernel's vector form with kept dims on both sides (only the
    // GPU replay of the emitted case runs that kernel; here the CPU's).
    add(mk(op, "middle_axis_vectors", {var({2, 3, 128})}, {Is("axes", {1}), B("keepdims", true)}));
  }
  for (std::string op : {"reduce_max", "reduce_min"}) {
    add(mk(op, "one_axis", {distinctVar({3, 4})}, {Is("axes", {1}), B("keepdims", false)}));
    add(mk(op, "two_axes_keepdims", {distinctVar({2, 3, 4})},
           {Is("axes", {0, 2}), B("keepdims", true)}));
  }
  add(mk("reduce_prod", "one_axis", {var({3, 4}, awayFrom({0.0}, 0.5, -1.5, 1.5))},
         {Is("axes", {1}), B("keepdims", false)}));
  add(mk("reduce_prod", "two_axes_keepdims", {var({2, 3, 2}, awayFrom({0.0}, 0.5, -1.5, 1.5))},
         {Is("axes", {0, 2}), B("keepdims", true)}));
  // Exact zeros: one in row 0, two in row 1, none in row 2 (prod is
  // multilinear, so central differences are exact there too).
  add(mk("reduce_prod", "with_zeros",
         {fixedVar({3, 3}, {0.0, 1.5, -0.7, 0.0, 0.0, 2.0, 0.9, -1.1, 1.3})},
         {Is("axes", {1}), B("keepdims", false)}));
  add(mk("reduce_l2", "one_axis", {var({3, 4})}, {Is("axes", {1}), B("keepdims", false)}));
  add(mk("reduce_l2", "two_axes_keepdims", {var({2, 3, 4})},
         {Is("axes", {0, 2}), B("keepdims", true)}));
  add(mk("cumsum", "inclusive", {var({3, 4})},
         {I("axis", 1), B("exclusive", false), B("reverse", false)}));
  add(mk("cumsum", "exclusive", {var({3, 4})},
         {I("axis", 1), B("exclusive", true), B("reverse", false)}));
  add(mk("cumsum", "reverse", {var({4, 3})},
         {I("axis", 0), B("exclusive", false), B("reverse", true)}));
  add(mk("cumsum", "exclusive_reverse", {var({2, 4, 3})},
         {I("axis", 1), B("exclusive", true), B("reverse", true)}));

  // --- data movement ----------------------------------------------------------
  add(mk("reshape", "matrix", {var({2, 6})}, {Is("shape", {3, 4})}));
  add(mk("reshape", "flatten", {var({2, 3, 4})}, {Is("shape", {24})}));
  add(mk("transpose", "3d", {var({2, 3, 4})}, {Is("perm", {2, 0, 1})}));
  add(mk("transpose", "matrix", {var({3, 5})}, {Is("perm", {1, 0})}));
  add(mk("broadcast", "inner_ones", {var({3, 1})}, {Is("shape", {2, 3, 4})}));
  add(mk("broadcast", "leading", {var({4})}, {Is("shape", {2, 3, 4})}));
  add(mk("broadcast", "scalar", {var({})}, {Is("shape", {2, 2})}));
  add(mk("concat", "two", {var({2, 3}), var({2, 2})}, {I("axis", 1)}));
  add(mk("concat", "three_with_const", {var({1, 3}), constant({2, 3}), var({3, 3})},
         {I("axis", 0)}));
  add(mk("split", "two", {var({2, 7})}, {I("axis", 1), Is("sizes", {3, 4})}));
  add(mk("split", "three", {var({6, 2})}, {I("axis", 0), Is("sizes", {1, 2, 3})}));
  {
    Case c = mk("split", "first_only", {var({5, 2})}, {I("axis", 0), Is("sizes", {2, 3})});
    c.lossResults = 1; // the second part does not reach the loss
    add(c);
  }
  add(mk("slice", "unit_steps", {var({5, 6})},
         {Is("starts", {1, 2}), Is("ends", {4, 6}), Is("steps", {1, 1})}));
  add(mk("slice", "strided", {var({6, 7})},
         {Is("starts", {0, 1}), Is("ends", {6, 7}), Is("steps", {2, 3})}));
  add(mk("slice", "negative_steps", {var({5, 4})},
         {Is("starts", {4, 3}), Is("ends", {-1, 0}), Is("steps", {-2, -1})}));
  add(mk("pad", "constant", {var({2, 3})},
         {Is("pads", {1, 0, 2, 1}), S("mode", "constant"), F("value", 0.5)}));
  add(mk("pad", "constant_negative", {var({4, 5})},
         {Is("pads", {-1, 2, 1, -2}), S("mode", "constant"), F("value", 0.0)}));
  add(mk("pad", "reflect", {var({3, 4})},
         {Is("pads", {2, 1, 1, 2}), S("mode", "reflect"), F("value", 0.0)}));
  add(mk("pad", "edge", {var({2, 3})},
         {Is("pads", {1, 2, 2, 1}), S("mode", "edge"), F("value", 0.0)}));
  add(mk("pad", "wrap", {var({2, 3})},
         {Is("pads", {1, 4, 3, -1}), S("mode", "wrap"), F("value", 0.0)}));
  add(mk("tile", "matrix", {var({2, 3})}, {Is("repeats", {2, 3})}));
  add(mk("tile", "middle", {var({3, 1, 2})}, {Is("repeats", {1, 4, 1})}));
  add(mk("gather", "rows_with_repeats", {var({5, 3}), ints({4}, {0, 2, 2, 4})}, {I("axis", 0)}));
  add(mk("gather", "middle_axis_negative", {var({2, 5, 3}), ints({2, 2}, {1, -1, 0, 1}, true)},
         {I("axis", 1)}));
  add(mk("gather_elements", "axis1", {var({3, 4}), ints({3, 2}, {0, 3, 1, 1, 2, -1})},
         {I("axis", 1)}));
  add(mk("gather_elements", "axis0_repeats", {var({3, 4}), ints({2, 4}, {0, 1, 2, 0, 0, 1, 2, 2})},
         {I("axis", 0)}));
  // scatter_elements: unique indices for none (repeated ones are unspecified);
  // add takes repeats (both updates reach the same element).
  add(mk("scatter_elements", "none_axis1",
         {var({3, 4}), ints({3, 2}, {0, 3, 1, 2, -1, 0}), var({3, 2})},
         {I("axis", 1), S("reduction", "none")}));
  add(mk("scatter_elements", "add_axis0_repeats",
         {var({3, 4}), ints({2, 4}, {0, 1, 2, 0, 0, 1, 2, 2}), var({2, 4})},
         {I("axis", 0), S("reduction", "add")}));
  // top_k: distinct values, so the selection does not change within eps; the
  // indices (result 1) are not differentiable.
  for (auto [name, shape, axis, k, largest] :
       {std::tuple{"largest_axis1", std::vector<int64_t>{3, 5}, 1, 3, true},
        std::tuple{"smallest_middle_axis", std::vector<int64_t>{2, 4, 3}, 1, 2, false},
        std::tuple{"all_axis0", std::vector<int64_t>{4, 2}, 0, 4, true}}) {
    Case c = mk("top_k", name, {distinctVar(shape)},
                {I("axis", axis), I("k", k), B("largest", largest), B("sorted", true)});
    c.lossResults = 1;
    add(c);
  }
  add(mk("trilu", "upper", {var({4, 5})}, {B("upper", true), I("k", 0)}));
  add(mk("trilu", "lower_batched", {var({2, 3, 3})}, {B("upper", false), I("k", -1)}));
  add(mk("trilu", "upper_offset", {var({3, 4})}, {B("upper", true), I("k", 2)}));
  return cs;
}

const std::vector<Case> &cases() {
  static const std::vector<Case> all = allCases();
  return all;
}

//===----------------------------------------------------------------------===//
// Building, emitting and running one case
//===----------------------------------------------------------------------===//

/// Operand values, drawn once per case (the float32 run reuses them).
std::vector<std::vector<double>> drawValues(const Case &c, std::mt19937_64 &rng) {
  std::vector<std::vector<double>> values;
  for (const Operand &o : c.operands) {
    int64_t n = std::accumulate(o.shape.begin(), o.shape.end(), int64_t(1), std::multiplies<>());
    std::vector<double> v = o.values;
    if (v.empty() && o.distinct) {
      for (int64_t i = 0; i < n; ++i)
        v.push_back(-2.0 + 4.0 * (i + 0.5) / n);
      std::shuffle(v.begin(), v.end(), rng);
    } else if (v.empty()) {
      for (int64_t i = 0; i < n; ++i)
        v.push_back(o.sample(rng));
    }
    EXPECT_EQ((int64_t)v.size(), n) << "operand values do not match the shape";
    values.push_back(std::move(v));
  }
  return values;
}

/// The bundle input name of function argument `a`.
std::string argName(size_t a) { return ("x" + Twine(a)).str(); }

DenseElementsAttr floats(RankedTensorType type, const std::vector<double> &v) {
  if (type.getElementType().isF64())
    return DenseElementsAttr::get(type, ArrayRef<double>(v));
  std::vector<float> f(v.begin(), v.end());
  return DenseElementsAttr::get(type, ArrayRef<float>(f));
}

struct Program {
  OwningOpRef<ModuleOp> module;
  std::vector<size_t> args; // operand index of each function argument
  std::vector<int> gradOut; // per argument: output index of its gradient (-1: none)
  size_t lossResults = 0;   // leading outputs: op results in the loss
};

/// Builds the module of `c` with float type `fp`; `R` (the result
/// gradients) is drawn on the first build and reused.
Program build(MLIRContext &ctx, const Case &c, const std::vector<std::vector<double>> &values,
              std::vector<std::vector<double>> &R, std::mt19937_64 &rng, FloatType fp) {
  Program p;
  OpBuilder b(&ctx);
  Location loc = NameLoc::get(b.getStringAttr(c.op + "/" + c.name));
  p.module = ModuleOp::create(loc);
  SmallVector<Type> argTypes;
  for (auto [i, o] : llvm::enumerate(c.operands))
    if (o.kind == Kind::Var) {
      argTypes.push_back(RankedTensorType::get(o.shape, fp));
      p.args.push_back(i);
    }
  b.setInsertionPointToEnd(p.module->getBody());
  auto func = b.create<func::FuncOp>(loc, "main", b.getFunctionType(argTypes, {}));
  Block *block = func.addEntryBlock();
  b.setInsertionPointToStart(block);
  for (size_t a = 0; a < p.args.size(); ++a)
    func.setArgAttr(a, "forge.name", b.getStringAttr(argName(a)));

  SmallVector<Value> operands;
  for (size_t i = 0, a = 0; i < c.operands.size(); ++i) {
    const Operand &o = c.operands[i];
    switch (o.kind) {
    case Kind::Var:
      operands.push_back(block->getArgument(a++));
      break;
    case Kind::Const:
      operands.push_back(
          b.create<ConstantOp>(loc, floats(RankedTensorType::get(o.shape, fp), values[i])));
      break;
    case Kind::Int: {
      auto type = RankedTensorType::get(o.shape, b.getIntegerType(o.i32 ? 32 : 64));
      DenseElementsAttr attr;
      if (o.i32) {
        std::vector<int32_t> v(values[i].begin(), values[i].end());
        attr = DenseElementsAttr::get(type, ArrayRef<int32_t>(v));
      } else {
        std::vector<int64_t> v(values[i].begin(), values[i].end());
        attr = DenseElementsAttr::get(type, ArrayRef<int64_t>(v));
      }
      operands.push_back(b.create<ConstantOp>(loc, attr));
      break;
    }
    case Kind::Bool: {
      SmallVector<bool> v;
      for (double d : values[i])
        v.push_back(d != 0);
      operands.push_back(b.create<ConstantOp>(
          loc, DenseElementsAttr::get(RankedTensorType::get(o.shape, b.getI1Type()), v)));
      break;
    }
    }
  }

  GradientBuilder gb(b, loc);
  SmallVector<NamedAttribute> attrs;
  for (const Attr &a : c.attrs) {
    std::visit(
        [&](const auto &v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::vector<int64_t>>)
            attrs.push_back(gb.attr(a.name, ArrayRef<int64_t>(v)));
          else if constexpr (std::is_same_v<V, std::string>)
            attrs.push_back(gb.attr(a.name, StringRef(v)));
          else if constexpr (std::is_same_v<V, FloatTypeAttr>)
            attrs.push_back(gb.attr(
                a.name, v.other ? Type(fp.isF64() ? b.getF32Type() : b.getF64Type()) : Type(fp)));
          else
            attrs.push_back(gb.attr(a.name, v));
        },
        a.value);
  }
  SmallVector<Value> results = gb.create(c.op, operands, attrs);
  if (gb.failed() || results.empty()) {
    ADD_FAILURE() << "cannot build forge." << c.op;
    return p;
  }
  Operation *op = results.front().getDefiningOp();
  p.lossResults = c.lossResults < 0 ? results.size() : c.lossResults;

  // Result gradients R_r for the results in the loss, null for the others.
  SmallVector<Value> resultGrads;
  for (size_t r = 0; r < results.size(); ++r) {
    if (r >= p.lossResults) {
      resultGrads.push_back(Value());
      continue;
    }
    auto type = cast<RankedTensorType>(results[r].getType());
    if (R.size() <= r) {
      std::uniform_real_distribution<double> d(-1, 1);
      std::vector<double> v(type.getNumElements());
      for (double &x : v)
        x = d(rng);
      R.push_back(std::move(v));
    }
    resultGrads.push_back(b.create<ConstantOp>(loc, floats(type, R[r])));
  }
  SmallVector<Value> grads;
  if (failed(cast<DifferentiableOpInterface>(op).buildGradient(b, resultGrads, grads))) {
    ADD_FAILURE() << "buildGradient failed";
    return p;
  }
  if (grads.size() != op->getNumOperands()) {
    ADD_FAILURE() << grads.size() << " gradients for " << op->getNumOperands() << " operands";
    return p;
  }

  SmallVector<Value> returned(results.begin(), results.begin() + p.lossResults);
  for (auto [i, o] : llvm::enumerate(c.operands)) {
    bool expectGrad = o.kind == Kind::Var && !o.expectNull;
    if (o.kind != Kind::Const) {
      EXPECT_EQ(bool(grads[i]), expectGrad)
          << "operand " << i << (expectGrad ? " has no gradient" : " has an unexpected gradient");
    }
    if (o.kind == Kind::Var) {
      p.gradOut.push_back(expectGrad && grads[i] ? (int)returned.size() : -1);
      if (expectGrad && grads[i])
        returned.push_back(grads[i]);
    }
  }
  b.create<func::ReturnOp>(loc, returned);
  func.setType(b.getFunctionType(argTypes, ValueRange(returned).getTypes()));
  if (failed(verify(*p.module))) {
    ADD_FAILURE() << "the gradient module does not verify";
    p.module = nullptr;
  }
  return p;
}

/// A loaded program and its executor.
struct Runner {
  std::unique_ptr<rt::Bundle> bundle;
  std::unique_ptr<rt::CpuExecutor> exec;

  bool load(ModuleOp module) {
    OwningOpRef<ModuleOp> planned = module.clone();
    PassManager pm(module.getContext());
    buildBackendPipeline(pm, PipelineOptions{});
    if (failed(pm.run(*planned))) {
      ADD_FAILURE() << "the placement and memory-plan stages failed";
      return false;
    }
    rt::BundleWriter writer;
    if (failed(emitBundle(*planned, {}, writer))) {
      ADD_FAILURE() << "emitBundle failed";
      return false;
    }
    auto b = rt::Bundle::fromBytes(writer.serialize(), "gradient-check");
    if (!b) {
      ADD_FAILURE() << b.status().message();
      return false;
    }
    bundle = b.take();
    auto ex = rt::CpuExecutor::create(*bundle, {1});
    if (!ex) {
      ADD_FAILURE() << ex.status().message();
      return false;
    }
    exec = ex.take();
    return true;
  }

  /// Runs with `args` (one vector per argument) converted to `dtype`;
  /// returns every output as doubles.
  std::optional<std::vector<std::vector<double>>>
  run(const std::vector<std::vector<double>> &args, const std::vector<std::vector<int64_t>> &shapes,
      rt::DType dtype) {
    for (size_t a = 0; a < args.size(); ++a) {
      std::vector<float> f(args[a].begin(), args[a].end());
      void *data = dtype == ::forge::bundle::F64 ? const_cast<double *>(args[a].data())
                                                 : static_cast<void *>(f.data());
      rt::TensorView v{data, dtype, shapes[a]};
      rt::Status st = exec->setInput(argName(a), v);
      if (!st.isOk()) {
        ADD_FAILURE() << st.message();
        return std::nullopt;
      }
    }
    rt::Status st = exec->run();
    if (!st.isOk()) {
      ADD_FAILURE() << st.message();
      return std::nullopt;
    }
    std::vector<std::vector<double>> out;
    for (int32_t t : exec->outputs()) {
      rt::TensorView v = exec->view(t);
      std::vector<double> d(v.numel());
      for (int64_t i = 0; i < v.numel(); ++i)
        d[i] = v.dtype == ::forge::bundle::F64 ? v.as<double>()[i] : double(v.as<float>()[i]);
      out.push_back(std::move(d));
    }
    return out;
  }
};

struct CheckResult {
  bool ran = false;
  double maxError = 0;                       // the checked measure, max over all elements
  std::string worst;                         // where it occurred
  std::vector<std::vector<double>> analytic; // per argument (empty: no gradient)
};

/// The numeric check of one case in float64. `corrupt` scales the analytic
/// gradients by (1 + corrupt) (to test that the checker can fail).
CheckResult checkCase(const Case &c, double corrupt = 0.0) {
  CheckResult res;
  MLIRContext ctx;
  ctx.loadDialect<ForgeDialect, func::FuncDialect>();
  std::mt19937_64 rng(std::hash<std::string>{}(c.op + "/" + c.name));
  std::vector<std::vector<double>> values = drawValues(c, rng), R;
  Program p = build(ctx, c, values, R, rng, Float64Type::get(&ctx));
  if (!p.module)
    return res;
  Runner runner;
  if (!runner.load(*p.module))
    return res;
  std::vector<std::vector<double>> args;
  std::vector<std::vector<int64_t>> shapes;
  for (size_t i : p.args) {
    args.push_back(values[i]);
    shapes.push_back(c.operands[i].shape);
  }
  auto loss = [&]() -> std::optional<double> {
    auto out = runner.run(args, shapes, ::forge::bundle::F64);
    if (!out)
      return std::nullopt;
    double l = 0;
    for (size_t r = 0; r < p.lossResults; ++r)
      for (size_t j = 0; j < R[r].size(); ++j)
        l += (*out)[r][j] * R[r][j];
    return l;
  };
  auto base = runner.run(args, shapes, ::forge::bundle::F64);
  if (!base)
    return res;
  for (size_t a = 0; a < args.size(); ++a) {
    std::vector<double> analytic;
    if (p.gradOut[a] >= 0)
      analytic = (*base)[p.gradOut[a]];
    for (double &g : analytic)
      g *= 1 + corrupt;
    res.analytic.push_back(analytic);
    if (analytic.empty())
      continue;
    for (size_t j = 0; j < args[a].size(); ++j) {
      double saved = args[a][j];
      args[a][j] = saved + c.eps;
      auto up = loss();
      args[a][j] = saved - c.eps;
      auto down = loss();
      args[a][j] = saved;
      if (!up || !down)
        return res;
      double numeric = (*up - *down) / (2 * c.eps);
      double err = std::abs(analytic[j] - numeric) / std::max(1.0, std::abs(numeric));
      if (!(err <= res.maxError)) { // also catches nan
        res.maxError = std::isnan(err) ? INFINITY : err;
        res.worst = llvm::formatv("{0}[{1}]: analytic {2}, numeric {3}", argName(a), j, analytic[j],
                                  numeric)
                        .str();
      }
    }
  }
  res.ran = true;
  return res;
}

/// FORGE_GRADCHECK_EMIT_DIR=DIR: the float32 case, compiled for cuda:sm_90, with its inputs
/// and the CPU's outputs, as DIR/NAME/{model.forge,set_0.npz} for forge-replay (tests/gpu:
/// the gradient rules' GPU kernels against the CPU).
void emitForReplay(const std::string &dir, const std::string &name, ModuleOp module,
                   const std::vector<std::vector<double>> &args,
                   const std::vector<std::vector<int64_t>> &shapes,
                   const std::vector<std::vector<double>> &outputs) {
  // As forgec compiles for CUDA: the graph pipeline for the target (which, e.g., makes
  // asymmetric conv padding explicit so that cuDNN takes the conv), on a copy.
  OwningOpRef<ModuleOp> compiled = module.clone();
  PassManager pm(module.getContext());
  PipelineOptions pipeline;
  pipeline.target = "cuda:sm_90";
  buildInferencePipeline(pm, pipeline);
  ASSERT_TRUE(succeeded(pm.run(*compiled))) << "the pipeline for cuda:sm_90";
  rt::BundleWriter writer;
  BundleEmitOptions options;
  options.target = "cuda:sm_90";
  ASSERT_TRUE(succeeded(emitBundle(*compiled, options, writer))) << "emitBundle for cuda:sm_90";
  std::vector<uint8_t> bytes = writer.serialize();
  auto bundle = rt::Bundle::fromBytes(bytes, name);
  ASSERT_TRUE(bundle.isOk()) << bundle.status().message();
  std::filesystem::path out = std::filesystem::path(dir) / name;
  std::filesystem::create_directories(out);
  ASSERT_TRUE(rt::writeFileAtomically((out / "model.forge").string(),
                                      std::span<const uint8_t>(bytes))
                  .isOk());
  std::vector<std::vector<float>> data;
  std::map<std::string, rt::TensorView> arrays;
  for (size_t a = 0; a < args.size(); ++a)
    data.emplace_back(args[a].begin(), args[a].end());
  const auto &routine = (*bundle)->program().routines(0);
  for (size_t o = 0; o < outputs.size(); ++o)
    data.emplace_back(outputs[o].begin(), outputs[o].end());
  for (size_t a = 0; a < args.size(); ++a)
    arrays[argName(a)] = {data[a].data(), ::forge::bundle::F32, shapes[a]};
  for (size_t o = 0; o < outputs.size(); ++o) {
    const auto &info = (*bundle)->program().tensors(routine.outputs(static_cast<int>(o)));
    rt::TensorView v{data[args.size() + o].data(), ::forge::bundle::F32,
                     {info.shape().begin(), info.shape().end()}};
    arrays["cpu:" + std::to_string(o)] = v;
    arrays["expected:" + std::to_string(o)] = v;
  }
  rt::Status st = rt::writeNpz((out / "set_0.npz").string(), arrays);
  ASSERT_TRUE(st.isOk()) << st.message();
}

std::string testName(const Case &c);

/// The same case in float32; returns the gradients (per argument).
std::optional<std::vector<std::vector<double>>> runF32(const Case &c) {
  MLIRContext ctx;
  ctx.loadDialect<ForgeDialect, func::FuncDialect>();
  std::mt19937_64 rng(std::hash<std::string>{}(c.op + "/" + c.name));
  std::vector<std::vector<double>> values = drawValues(c, rng), R;
  Program p = build(ctx, c, values, R, rng, Float32Type::get(&ctx));
  Runner runner;
  if (!p.module || !runner.load(*p.module))
    return std::nullopt;
  std::vector<std::vector<double>> args;
  std::vector<std::vector<int64_t>> shapes;
  for (size_t i : p.args) {
    args.push_back(values[i]);
    shapes.push_back(c.operands[i].shape);
  }
  auto out = runner.run(args, shapes, ::forge::bundle::F32);
  if (!out)
    return std::nullopt;
  // Attention runs on CUDA in bf16/f16 only (cuDNN's flash attention; an f32 one is
  // refused there): its GPU check against a float64 reference is AttentionGpuTest.
  if (const char *dir = std::getenv("FORGE_GRADCHECK_EMIT_DIR"); dir && *dir && c.op != "attention")
    emitForReplay(dir, testName(c), *p.module, args, shapes, *out);
  std::vector<std::vector<double>> grads;
  for (int g : p.gradOut)
    grads.push_back(g >= 0 ? (*out)[g] : std::vector<double>());
  return grads;
}

std::string testName(const Case &c) {
  std::string n = c.op + "_" + c.name;
  for (char &ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch)))
      ch = '_';
  return n;
}

//===----------------------------------------------------------------------===//
// The numeric checks
//===----------------------------------------------------------------------===//

class GradientCheck : public ::testing::TestWithParam<Case> {};

TEST_P(GradientCheck, MatchesCentralDifferences) {
  const Case &c = GetParam();
  CheckResult res = checkCase(c);
  ASSERT_TRUE(res.ran);
  EXPECT_LE(res.maxError, c.tolerance)
      << "max |analytic - numeric| / max(1, |numeric|) at " << res.worst;
  if (!c.f32Check)
    return;
  auto f32 = runF32(c);
  ASSERT_TRUE(f32.has_value());
  ASSERT_EQ(f32->size(), res.analytic.size());
  for (size_t a = 0; a < f32->size(); ++a) {
    ASSERT_EQ((*f32)[a].size(), res.analytic[a].size()) << "x" << a;
    for (size_t j = 0; j < res.analytic[a].size(); ++j) {
      double ref = res.analytic[a][j];
      EXPECT_LE(std::abs((*f32)[a][j] - ref) / std::max(1.0, std::abs(ref)), kF32Tolerance)
          << "float32 gradient of x" << a << "[" << j << "]: " << (*f32)[a][j] << " vs " << ref;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, GradientCheck, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case> &info) {
                           return testName(info.param);
                         });

TEST(GradientChecker, FailsOnAWrongGradient) {
  // A gradient off by 0.01% must be caught (the tolerance is 1e-6).
  Case c = mk("mul", "corrupted", {var({2, 3}), var({3})});
  CheckResult good = checkCase(c), bad = checkCase(c, 1e-4);
  ASSERT_TRUE(good.ran && bad.ran);
  EXPECT_LE(good.maxError, kTolerance);
  EXPECT_GT(bad.maxError, kTolerance);
}

TEST(GradientCoverage, EveryDifferentiableOpHasCases) {
  MLIRContext ctx;
  ctx.loadDialect<ForgeDialect>();
  std::map<std::string, int> count;
  std::set<std::string> names;
  for (const Case &c : cases()) {
    ++count[c.op];
    EXPECT_TRUE(names.insert(testName(c)).second) << "duplicate case " << testName(c);
  }
  int differentiable = 0;
  for (RegisteredOperationName name : ctx.getRegisteredOperations()) {
    // fusion/yield/copy: made after autodiff (regions, the memory plan's
    // copies). The collectives and splits run over several ranks, so one
    // process cannot check them numerically: enter_group's and all_reduce's
    // rules are checked by training over ranks against one process
    // (tests/e2e/test_tensor_parallel.py, lit shard-tensor-parallel-train).
    // send/recv are made after autodiff (forge-split-pipeline-stages), and so
    // is accumulated (the accumulation loop's cut, cut by forge-split-accumulation).
    static const std::set<std::string> skipped = {
        "forge.accumulated",
        "forge.fusion",     "forge.yield",      "forge.copy",           "forge.all_reduce",
        "forge.enter_group", "forge.shard",     "forge.reduce_scatter", "forge.all_gather",
        "forge.rank_slice", "forge.send",       "forge.recv"};
    if (name.getDialectNamespace() != "forge" || skipped.count(name.getStringRef().str()))
      continue;
    auto *iface = name.getInterface<DifferentiableOpInterface>();
    ASSERT_NE(iface, nullptr);
    std::string op = name.stripDialect().str();
    if (!iface->isDifferentiable()) {
      EXPECT_EQ(count.count(op), 0u) << op << " is not differentiable but has cases";
      continue;
    }
    ++differentiable;
    EXPECT_GE(count[op], 2) << "differentiable op forge." << op
                            << " needs at least two gradient-check cases";
  }
  EXPECT_GE(differentiable, 50);
}

//===----------------------------------------------------------------------===//
// The buildGradient contract and dead backward code
//===----------------------------------------------------------------------===//

class GradientContract : public ::testing::Test {
protected:
  GradientContract() : b(&ctx), loc(b.getUnknownLoc()) {
    ctx.loadDialect<ForgeDialect, func::FuncDialect>();
    module = ModuleOp::create(loc);
    b.setInsertionPointToEnd(module->getBody());
  }

  /// A @main taking `argTypes`; the builder is left inside its body.
  func::FuncOp beginFunc(ArrayRef<Type> argTypes) {
    auto func = b.create<func::FuncOp>(loc, "main", b.getFunctionType(argTypes, {}));
    b.setInsertionPointToStart(func.addEntryBlock());
    return func;
  }
  void endFunc(func::FuncOp func, ValueRange returned) {
    b.create<func::ReturnOp>(loc, returned);
    func.setType(b.getFunctionType(func.getArgumentTypes(), returned.getTypes()));
  }
  Value splat(Type type, double v) {
    GradientBuilder gb(b, loc);
    return gb.splat(cast<RankedTensorType>(type), v);
  }
  size_t numOps(func::FuncOp f) { return f.getBody().front().getOperations().size(); }
  template <typename Op> size_t count(ModuleOp m) {
    size_t n = 0;
    m.walk([&](Op) { ++n; });
    return n;
  }
  LogicalResult grad(Operation *op, ArrayRef<Value> resultGrads, SmallVector<Value> &out) {
    return cast<DifferentiableOpInterface>(op).buildGradient(b, resultGrads, out);
  }

  MLIRContext ctx;
  OpBuilder b;
  Location loc;
  OwningOpRef<ModuleOp> module;
};

TEST_F(GradientContract, IntegerMathGetsNullsAndCreatesNothing) {
  auto i64 = RankedTensorType::get({2, 3}, b.getI64Type());
  auto f64 = RankedTensorType::get({2, 3}, b.getF64Type());
  auto func = beginFunc({i64, i64});
  // Shape arithmetic on integers uses the same differentiable ops.
  auto addOp = b.create<AddOp>(loc, func.getArgument(0), func.getArgument(1));
  Value g = splat(i64, 1);
  size_t before = numOps(func);
  SmallVector<Value> grads;
  ASSERT_TRUE(succeeded(grad(addOp, {g}, grads)));
  EXPECT_EQ(grads, SmallVector<Value>(2, Value()));
  EXPECT_EQ(numOps(func), before);
  // An integer input of a cast to float gets no gradient either.
  auto castOp = b.create<CastOp>(loc, func.getArgument(0), TypeAttr::get(b.getF64Type()), b.getBoolAttr(true));
  Value gf = splat(f64, 1);
  before = numOps(func);
  grads.clear();
  ASSERT_TRUE(succeeded(grad(castOp, {gf}, grads)));
  EXPECT_EQ(grads, SmallVector<Value>(1, Value()));
  EXPECT_EQ(numOps(func), before);
}

TEST_F(GradientContract, IndexOperandsGetNulls) {
  auto f64 = RankedTensorType::get({5, 3}, b.getF64Type());
  auto func = beginFunc({f64});
  auto idx =
      b.create<ConstantOp>(loc, DenseElementsAttr::get(RankedTensorType::get({2}, b.getI64Type()),
                                                       ArrayRef<int64_t>{1, 3}));
  auto gather = b.create<GatherOp>(loc, func.getArgument(0), idx, b.getI64IntegerAttr(0));
  SmallVector<Value> grads;
  ASSERT_TRUE(succeeded(grad(gather, {splat(gather.getType(), 1)}, grads)));
  ASSERT_EQ(grads.size(), 2u);
  EXPECT_TRUE(grads[0]);
  EXPECT_FALSE(grads[1]);
}

TEST_F(GradientContract, AllNullResultGradientsCreateNothing) {
  auto a = RankedTensorType::get({2, 3}, b.getF64Type());
  auto c = RankedTensorType::get({3, 4}, b.getF64Type());
  auto func = beginFunc({a, c});
  auto mm = b.create<MatMulOp>(loc, func.getArgument(0), func.getArgument(1));
  size_t before = numOps(func);
  SmallVector<Value> grads;
  ASSERT_TRUE(succeeded(grad(mm, {Value()}, grads)));
  EXPECT_EQ(grads, SmallVector<Value>(2, Value()));
  EXPECT_EQ(numOps(func), before);
}

TEST_F(GradientContract, NonDifferentiableOpsGiveNulls) {
  auto f64 = RankedTensorType::get({2, 3}, b.getF64Type());
  auto func = beginFunc({f64});
  auto arg = b.create<ArgMaxOp>(loc, func.getArgument(0), b.getI64IntegerAttr(1),
                                b.getBoolAttr(false), b.getBoolAttr(false));
  EXPECT_FALSE(cast<DifferentiableOpInterface>(arg.getOperation()).isDifferentiable());
  Value g = splat(arg.getType(), 1);
  size_t before = numOps(func);
  SmallVector<Value> grads;
  ASSERT_TRUE(succeeded(grad(arg, {g}, grads)));
  EXPECT_EQ(grads, SmallVector<Value>(1, Value()));
  EXPECT_EQ(numOps(func), before);
}

TEST_F(GradientContract, MalformedResultGradientsAreRejected) {
  auto f64 = RankedTensorType::get({2, 3}, b.getF64Type());
  auto func = beginFunc({f64});
  auto relu = b.create<ReluOp>(loc, func.getArgument(0));
  ScopedDiagnosticHandler silence(&ctx, [](Diagnostic &) { return success(); });
  SmallVector<Value> grads;
  EXPECT_TRUE(failed(grad(relu, {}, grads))); // one per result
  Value wrongType = splat(RankedTensorType::get({3, 2}, b.getF64Type()), 1);
  EXPECT_TRUE(failed(grad(relu, {wrongType}, grads)));
}

TEST_F(GradientContract, FrozenNormParametersAreNotComputed) {
  // layer_norm whose scale and bias are frozen: only dx is used, and after
  // canonicalization the fused backward op computes only dx.
  auto x = RankedTensorType::get({4, 6}, b.getF32Type());
  auto p = RankedTensorType::get({6}, b.getF32Type());
  auto func = beginFunc({x, p, p});
  auto ln =
      b.create<LayerNormOp>(loc, func.getArgument(0), func.getArgument(1), func.getArgument(2),
                            b.getI64IntegerAttr(1), b.getF64FloatAttr(1e-5));
  SmallVector<Value> grads;
  ASSERT_TRUE(succeeded(grad(ln, {splat(x, 1)}, grads)));
  ASSERT_EQ(grads.size(), 3u);
  ASSERT_TRUE(grads[0] && grads[1] && grads[2]);
  endFunc(func, {grads[0]});
  ASSERT_TRUE(succeeded(verify(*module)));
  PassManager pm(&ctx);
  pm.addPass(createCanonicalizerPass());
  ASSERT_TRUE(succeeded(pm.run(*module)));
  SmallVector<LayerNormGradOp> lng;
  module->walk([&](LayerNormGradOp op) { lng.push_back(op); });
  ASSERT_EQ(lng.size(), 1u);
  EXPECT_TRUE(lng[0].getInputGrad());
  EXPECT_FALSE(lng[0].getScaleGrad());
  EXPECT_FALSE(lng[0].getBiasGrad());
  EXPECT_EQ(lng[0]->getNumResults(), 1u);
  EXPECT_EQ(count<ReduceSumOp>(*module), 0u) << "dead parameter-gradient reductions remain";
}

TEST_F(GradientContract, UnneededConvGradientsAreRemoved) {
  // A first layer: the input gets no gradient, the bias is frozen.
  auto x = RankedTensorType::get({1, 2, 5, 5}, b.getF32Type());
  auto w = RankedTensorType::get({3, 2, 3, 3}, b.getF32Type());
  auto bias = RankedTensorType::get({3}, b.getF32Type());
  auto func = beginFunc({x, w, bias});
  auto conv = b.create<ConvOp>(loc, func.getArgument(0), func.getArgument(1), func.getArgument(2),
                               b.getDenseI64ArrayAttr({1, 1}), b.getDenseI64ArrayAttr({1, 1, 1, 1}),
                               b.getDenseI64ArrayAttr({1, 1}), b.getI64IntegerAttr(1), b.getBoolAttr(false));
  SmallVector<Value> grads;
  ASSERT_TRUE(succeeded(grad(conv, {splat(conv.getType(), 1)}, grads)));
  ASSERT_EQ(grads.size(), 3u);
  endFunc(func, {grads[1]});
  PassManager pm(&ctx);
  pm.addPass(createCanonicalizerPass());
  ASSERT_TRUE(succeeded(pm.run(*module)));
  EXPECT_EQ(count<ConvGradWeightOp>(*module), 1u);
  EXPECT_EQ(count<ConvTransposeOp>(*module), 0u);
  EXPECT_EQ(count<ReduceSumOp>(*module), 0u);
}

} // namespace
