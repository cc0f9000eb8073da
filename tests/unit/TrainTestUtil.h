// Hand-built training bundles for the runtime's training tests (no compiler):
//
//  * makeLinearBundle: y ~ x @ w (mean squared error) trained with SGD +
//    momentum, written with existing ops. train_step takes x, y (or x@k, y@k
//    with K micro-batches) and forge.step; the learning rate decays as
//    lr / forge.step (so a wrong step counter changes the losses); the
//    momentum buffer `m` is a STATE tensor updated through "copy", the weight
//    `w` a PARAMETER updated in place. eval outputs loss and forge.correct
//    (predictions within 0.5 of the target). With `exposeGradient`,
//    train_step also outputs `forge.grad.w` (the accumulated gradient, as
//    forgec --expose-gradients does).
//  * makeClassifierBundle: logits = x @ W, log_softmax + nll_loss with C
//    classes; train_step only computes the loss (no update) - enough to test
//    label checks.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "forge/runtime/Bundle.h"

namespace forge::rt::testing {

namespace fb = forge::bundle;

/// Builds a Program routine by routine, laying out each routine's arena
/// tensors with a bump allocator (64-byte aligned).
class ProgramBuilder {
public:
  explicit ProgramBuilder(BundleWriter &w) : w_(w), p_(w.program()) {}

  fb::Program &program() { return p_; }

  void routine(const std::string &name) {
    r_ = p_.add_routines();
    r_->set_name(name);
    top_ = 0;
  }
  fb::Routine &current() { return *r_; }

  int32_t arena(const std::string &name, fb::TensorInfo::Kind kind, std::vector<int64_t> shape,
                fb::DType dtype = fb::F32) {
    int32_t t = add(name, kind, shape, dtype);
    p_.mutable_tensors(t)->set_arena_offset(top_);
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    top_ += (n * static_cast<int64_t>(dtypeSize(dtype)) + 63) / 64 * 64;
    if (static_cast<uint64_t>(top_) > p_.arena_size())
      p_.set_arena_size(static_cast<uint64_t>(top_));
    return t;
  }
  int32_t input(const std::string &name, std::vector<int64_t> shape, fb::DType dtype = fb::F32) {
    int32_t t = arena(name, fb::TensorInfo::INPUT, std::move(shape), dtype);
    r_->add_inputs(t);
    return t;
  }
  int32_t output(const std::string &name, std::vector<int64_t> shape, fb::DType dtype = fb::F32) {
    int32_t t = arena(name, fb::TensorInfo::OUTPUT, std::move(shape), dtype);
    r_->add_outputs(t);
    return t;
  }
  int32_t tmp(std::vector<int64_t> shape, fb::DType dtype = fb::F32) {
    return arena(fmt::format("{}.t{}", r_->name(), p_.tensors_size()), fb::TensorInfo::INTERMEDIATE,
                 std::move(shape), dtype);
  }
  /// A CONSTANT, PARAMETER or STATE tensor with f32 data in its own section.
  int32_t data(const std::string &name, fb::TensorInfo::Kind kind, std::vector<int64_t> shape,
               const std::vector<float> &values, const std::string &role = "") {
    std::vector<uint8_t> bytes(values.size() * 4);
    std::memcpy(bytes.data(), values.data(), bytes.size());
    uint32_t sec = w_.addSection(name, bytes);
    int32_t t = add(name, kind, std::move(shape), fb::F32);
    fb::TensorInfo *info = p_.mutable_tensors(t);
    info->set_section(sec);
    info->set_data_size(bytes.size());
    if (!role.empty())
      info->set_role(role);
    return t;
  }
  /// A zero-initialized STATE tensor.
  int32_t state(const std::string &name, std::vector<int64_t> shape) {
    return add(name, fb::TensorInfo::STATE, std::move(shape), fb::F32);
  }

  fb::Instruction &inst(const std::string &op, std::vector<int32_t> in, std::vector<int32_t> out) {
    fb::Instruction *i = r_->add_instructions();
    i->set_op(op);
    i->set_name(fmt::format("{}#{}", op, r_->instructions_size() - 1));
    for (int32_t t : in)
      i->add_inputs(t);
    for (int32_t t : out)
      i->add_outputs(t);
    return *i;
  }

private:
  int32_t add(const std::string &name, fb::TensorInfo::Kind kind, std::vector<int64_t> shape,
              fb::DType dtype) {
    fb::TensorInfo *t = p_.add_tensors();
    t->set_name(name);
    t->set_kind(kind);
    t->set_dtype(dtype);
    for (int64_t d : shape)
      t->add_shape(d);
    return p_.tensors_size() - 1;
  }

  BundleWriter &w_;
  fb::Program &p_;
  fb::Routine *r_ = nullptr;
  int64_t top_ = 0;
};

inline void setInt(fb::Instruction &i, const std::string &k, int64_t v) {
  (*i.mutable_attrs())[k].set_i(v);
}
inline void setFloat(fb::Instruction &i, const std::string &k, double v) {
  (*i.mutable_attrs())[k].set_f(v);
}
inline void setInts(fb::Instruction &i, const std::string &k, std::vector<int64_t> v) {
  auto *ints = (*i.mutable_attrs())[k].mutable_ints();
  for (int64_t x : v)
    ints->add_values(x);
}

struct LinearSpec {
  int64_t batch = 4, dim = 3, micro = 1, evalBatch = 5;
  float lr = 0.1f, momentum = 0.9f;
  std::vector<float> w0 = {0.5f, -0.25f, 0.125f};
  std::string sourceHash = "linear-test";
  bool exposeGradient = false;
  /// eval takes forge.sample_weight [evalBatch] (as forgec's eval routines do):
  /// loss = sum(w * sq) / sum(w), correct = sum(w * hit).
  bool sampleWeights = false;
};

inline BundleWriter makeLinearBundle(const LinearSpec &s = {}) {
  BundleWriter w;
  ProgramBuilder b(w);
  fb::Program &p = b.program();
  p.set_target("cpu");
  p.set_producer("TrainTestUtil");
  p.set_training(true);
  p.set_source_hash(s.sourceHash);
  (*p.mutable_build_options())["mode"] = "training";
  (*p.mutable_build_options())["loss"] = "mse:pred,y";
  (*p.mutable_build_options())["label_input"] = "y";
  (*p.mutable_build_options())["micro_batches"] = std::to_string(s.micro);
  (*p.mutable_build_options())["batch"] = std::to_string(s.batch);

  const int64_t B = s.batch, D = s.dim, K = s.micro;
  int32_t wt = b.data("w", fb::TensorInfo::PARAMETER, {D, 1}, s.w0, "weight");
  int32_t m = b.state("opt.m.w", {D, 1});
  int32_t lr = b.data("lr0", fb::TensorInfo::CONSTANT, {}, {s.lr});
  int32_t mu = b.data("mu", fb::TensorInfo::CONSTANT, {}, {s.momentum});
  int32_t invK = b.data("inv_k", fb::TensorInfo::CONSTANT, {}, {1.0f / static_cast<float>(K)});

  b.routine("train_step");
  std::vector<int32_t> xs, ys;
  for (int64_t k = 0; k < K; ++k) {
    std::string suffix = K > 1 ? "@" + std::to_string(k) : "";
    xs.push_back(b.input("x" + suffix, {B, D}));
    ys.push_back(b.input("y" + suffix, {B, 1}));
  }
  int32_t step = b.input("forge.step", {});
  int32_t lossSum = -1, grad = -1;
  for (int64_t k = 0; k < K; ++k) {
    int32_t pred = b.tmp({B, 1}), diff = b.tmp({B, 1}), sq = b.tmp({B, 1}), l = b.tmp({});
    int32_t g = b.tmp({D, 1});
    b.inst("matmul", {xs[k], wt}, {pred});
    b.inst("sub", {pred, ys[k]}, {diff});
    b.inst("mul", {diff, diff}, {sq});
    auto &rm = b.inst("reduce_mean", {sq}, {l});
    setInts(rm, "axes", {0, 1});
    setInt(rm, "keepdims", 0);
    auto &gm = b.inst("gemm", {xs[k], diff}, {g});
    setInt(gm, "transA", 1);
    setInt(gm, "transB", 0);
    setFloat(gm, "alpha", 2.0 / static_cast<double>(B * K));
    setFloat(gm, "beta", 0.0);
    if (k == 0) {
      lossSum = l;
      grad = g;
    } else {
      int32_t l2 = b.tmp({}), g2 = b.tmp({D, 1});
      b.inst("add", {lossSum, l}, {l2});
      b.inst("add", {grad, g}, {g2});
      lossSum = l2;
      grad = g2;
    }
  }
  int32_t loss = b.output("loss", {});
  b.inst("mul", {lossSum, invK}, {loss});
  int32_t lrOut = b.output("forge.lr", {});
  b.inst("div", {lr, step}, {lrOut});
  int32_t gg = b.tmp({D, 1}), ss = b.tmp({});
  b.inst("mul", {grad, grad}, {gg});
  auto &rs = b.inst("reduce_sum", {gg}, {ss});
  setInts(rs, "axes", {0, 1});
  setInt(rs, "keepdims", 0);
  int32_t gn = b.output("forge.grad_norm", {});
  b.inst("sqrt", {ss}, {gn});
  if (s.exposeGradient) {
    int32_t gradOut = b.output("forge.grad.w", {D, 1});
    b.inst("copy", {grad}, {gradOut});
  }
  // m = mu * m + g (via a temporary and copy); w -= lr_t * m (in place).
  int32_t mm = b.tmp({D, 1}), mnew = b.tmp({D, 1}), upd = b.tmp({D, 1});
  b.inst("mul", {m, mu}, {mm});
  b.inst("add", {mm, grad}, {mnew});
  b.inst("copy", {mnew}, {m});
  b.inst("mul", {m, lrOut}, {upd});
  b.inst("sub", {wt, upd}, {wt});

  b.routine("eval");
  const int64_t E = s.evalBatch;
  int32_t ex = b.input("x", {E, D}), ey = b.input("y", {E, 1});
  int32_t pred = b.tmp({E, 1}), diff = b.tmp({E, 1}), sq = b.tmp({E, 1});
  b.inst("matmul", {ex, wt}, {pred});
  b.inst("sub", {pred, ey}, {diff});
  b.inst("mul", {diff, diff}, {sq});
  int32_t ew = -1, ew2 = -1;
  if (s.sampleWeights) {
    ew = b.input("forge.sample_weight", {E});
    ew2 = b.tmp({E, 1});
    setInts(b.inst("reshape", {ew}, {ew2}), "shape", {E, 1});
  }
  auto sumAll = [&](int32_t in, int32_t out) {
    auto &r = b.inst("reduce_sum", {in}, {out});
    setInts(r, "axes", {0, 1});
    setInt(r, "keepdims", 0);
  };
  int32_t eloss = b.output("loss", {});
  if (s.sampleWeights) {
    int32_t wsq = b.tmp({E, 1}), num = b.tmp({}), den = b.tmp({});
    b.inst("mul", {sq, ew2}, {wsq});
    sumAll(wsq, num);
    sumAll(ew2, den);
    b.inst("div", {num, den}, {eloss});
  } else {
    auto &erm = b.inst("reduce_mean", {sq}, {eloss});
    setInts(erm, "axes", {0, 1});
    setInt(erm, "keepdims", 0);
  }
  int32_t half = b.data("half", fb::TensorInfo::CONSTANT, {}, {0.5f});
  int32_t ad = b.tmp({E, 1}), hit = b.tmp({E, 1}, fb::BOOL), hitf = b.tmp({E, 1});
  b.inst("abs", {diff}, {ad});
  b.inst("less", {ad, half}, {hit});
  auto &cast = b.inst("cast", {hit}, {hitf});
  (*cast.mutable_attrs())["to"].set_dtype(fb::F32);
  int32_t correct = b.output("forge.correct", {});
  if (s.sampleWeights) {
    int32_t whit = b.tmp({E, 1});
    b.inst("mul", {hitf, ew2}, {whit});
    sumAll(whit, correct);
  } else {
    sumAll(hitf, correct);
  }
  return w;
}

/// logits = x @ W [B, C]; loss = nll_loss(log_softmax(logits), labels).
inline BundleWriter makeClassifierBundle(int64_t B, int64_t D, int64_t C) {
  BundleWriter w;
  ProgramBuilder b(w);
  fb::Program &p = b.program();
  p.set_training(true);
  (*p.mutable_build_options())["label_input"] = "labels";
  std::vector<float> w0(static_cast<size_t>(D * C));
  for (size_t i = 0; i < w0.size(); ++i)
    w0[i] = 0.01f * static_cast<float>(i % 7) - 0.02f;
  int32_t W = b.data("W", fb::TensorInfo::PARAMETER, {D, C}, w0, "weight");
  for (const char *name : {"train_step", "eval"}) {
    b.routine(name);
    int32_t x = b.input("x", {B, D}), labels = b.input("labels", {B}, fb::I64);
    int32_t logits = b.tmp({B, C}), lp = b.tmp({B, C});
    b.inst("matmul", {x, W}, {logits});
    auto &ls = b.inst("log_softmax", {logits}, {lp});
    setInt(ls, "axis", 1);
    int32_t loss = b.output("loss", {});
    auto &nll = b.inst("nll_loss", {lp, labels}, {loss});
    (*nll.mutable_attrs())["reduction"].set_s("mean");
    if (std::string(name) == "eval") {
      int32_t pred = b.tmp({B}, fb::I64), hit = b.tmp({B}, fb::BOOL), hitf = b.tmp({B});
      auto &am = b.inst("argmax", {logits}, {pred});
      setInt(am, "axis", 1);
      setInt(am, "keepdims", 0);
      setInt(am, "select_last_index", 0);
      b.inst("equal", {pred, labels}, {hit});
      auto &cast = b.inst("cast", {hit}, {hitf});
      (*cast.mutable_attrs())["to"].set_dtype(fb::F32);
      int32_t correct = b.output("forge.correct", {});
      auto &cs = b.inst("reduce_sum", {hitf}, {correct});
      setInts(cs, "axes", {0});
      setInt(cs, "keepdims", 0);
    }
  }
  return w;
}

} // namespace forge::rt::testing
