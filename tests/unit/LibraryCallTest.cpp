// The CUDA executor's check of a library call's stated problem (forge-select-library ->
// Instruction.matmul): a bundle whose cuBLASLt problem does not fit its tensors is refused
// with a message naming the instruction, never run past a buffer's end. No GPU needed.
#include "forge/runtime/Bundle.h"
#include "forge/runtime/Executor.h"
#include "BundleTestUtil.h"
#include "cuda/Matmul.h"
#include "cuda/Nvml.h"

#include <functional>

#include <gtest/gtest.h>

using namespace forge::rt;
using namespace forge::rt::testing;
namespace fb = forge::bundle;

namespace {

/// checkLibraryCalls' verdict on `w`'s program after `mutate` edits it.
Status verdict(BundleWriter &w, const std::function<void(fb::Program &)> &mutate) {
  if (mutate)
    mutate(w.program());
  auto bundle = Bundle::fromBytes(w.serialize(), "test.forge");
  if (!bundle)
    return bundle.status();
  return checkLibraryCalls(**bundle);
}

/// a[2,3,4,8] @ b[2,3,8,5] -> y[2,3,4,5] (batch 6, strides 32 and 40), then
/// gemm y2[4,8] @ w[8,5] + bias[5] -> z[4,5]; `mutate` edits the program first.
Status check(const std::function<void(fb::Program &)> &mutate = {}) {
  BundleWriter w;
  fb::Program &p = w.program();
  p.set_target("cuda:sm_90");
  p.set_producer("LibraryCallTest");
  addTensor(p, "a", fb::TensorInfo::INPUT, {2, 3, 4, 8}, 0);
  addTensor(p, "b", fb::TensorInfo::INPUT, {2, 3, 8, 5}, 1024);
  addTensor(p, "y", fb::TensorInfo::OUTPUT, {2, 3, 4, 5}, 2048);
  addTensor(p, "x2", fb::TensorInfo::INPUT, {4, 8}, 3072);
  addTensor(p, "w", fb::TensorInfo::INPUT, {8, 5}, 3328);
  addTensor(p, "bias", fb::TensorInfo::INPUT, {5}, 3584);
  addTensor(p, "z", fb::TensorInfo::OUTPUT, {4, 5}, 3712);
  p.set_arena_size(4096);
  fb::Routine *r = p.add_routines();
  r->set_name("forward");
  fb::Instruction *mm = r->add_instructions();
  mm->set_op("matmul");
  mm->set_name("attn/MatMul");
  mm->set_placement(fb::LIBRARY);
  mm->add_inputs(0);
  mm->add_inputs(1);
  mm->add_outputs(2);
  fb::MatmulProblem *pr = mm->mutable_matmul();
  pr->set_m(4);
  pr->set_n(5);
  pr->set_k(8);
  pr->set_batch(6);
  pr->set_lhs_batch_stride(32);
  pr->set_rhs_batch_stride(40);
  pr->set_alpha(1.0);
  pr->set_dtype(fb::F32);
  fb::Instruction *g = r->add_instructions();
  g->set_op("gemm");
  g->set_name("fc/Gemm");
  g->set_placement(fb::LIBRARY);
  g->add_inputs(3);
  g->add_inputs(4);
  g->add_inputs(5);
  g->add_outputs(6);
  fb::MatmulProblem *gp = g->mutable_matmul();
  gp->set_m(4);
  gp->set_n(5);
  gp->set_k(8);
  gp->set_batch(1);
  gp->set_c(fb::MatmulProblem::BIAS_ROW);
  gp->set_alpha(1.0);
  gp->set_beta(1.0);
  gp->set_dtype(fb::F32);
  for (int t : {0, 1, 3, 4, 5})
    r->add_inputs(t);
  r->add_outputs(2);
  r->add_outputs(6);
  return verdict(w, mutate);
}

fb::MatmulProblem &matmul(fb::Program &p, int i) {
  return *p.mutable_routines(0)->mutable_instructions(i)->mutable_matmul();
}

void expectRefused(const std::function<void(fb::Program &)> &mutate, const std::string &needle,
                   const std::string &where = "instruction #0 'attn/MatMul'") {
  Status st = check(mutate);
  ASSERT_FALSE(st.isOk()) << "expected an error containing: " << needle;
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(where), std::string::npos) << st.message();
}

} // namespace

TEST(LibraryCallTest, StatedProblemsThatFitRun) {
  Status st = check();
  EXPECT_TRUE(st.isOk()) << st.message();
  // The lhs batch folded into M over a matrix rhs: 24 x 8 @ 8 x 5, no strides.
  st = check([](fb::Program &p) {
    p.mutable_tensors(1)->clear_shape();
    p.mutable_tensors(1)->add_shape(8);
    p.mutable_tensors(1)->add_shape(5);
    matmul(p, 0).set_m(24);
    matmul(p, 0).set_batch(1);
    matmul(p, 0).set_lhs_batch_stride(0);
    matmul(p, 0).set_rhs_batch_stride(0);
  });
  EXPECT_TRUE(st.isOk()) << st.message();
  // forge-assign-precision's forms: bf16 operands written as f32 (the gemm with
  // its f32 bias row) and as bf16 (the batched matmul; a gemm with a bf16 row).
  st = check([](fb::Program &p) {
    for (int t : {0, 1, 2, 3, 4})
      p.mutable_tensors(t)->set_dtype(fb::BF16);
    matmul(p, 0).set_dtype(fb::BF16);
    matmul(p, 1).set_dtype(fb::BF16);
  });
  EXPECT_TRUE(st.isOk()) << st.message();
  st = check([](fb::Program &p) {
    for (int t : {0, 1, 2, 3, 4, 5, 6})
      p.mutable_tensors(t)->set_dtype(fb::BF16);
    matmul(p, 0).set_dtype(fb::BF16);
    matmul(p, 1).set_dtype(fb::BF16);
  });
  EXPECT_TRUE(st.isOk()) << st.message();
}

TEST(LibraryCallTest, ProblemsThatDoNotFitAreRefused) {
  expectRefused([](fb::Program &p) { p.mutable_routines(0)->mutable_instructions(0)->clear_matmul(); },
                "has no cuBLASLt problem");
  expectRefused([](fb::Program &p) { matmul(p, 0).set_m(5); }, "batch strides 32 and 40 do not fit");
  expectRefused([](fb::Program &p) {
    matmul(p, 0).set_m(5);
    matmul(p, 0).set_lhs_batch_stride(40);
  }, "do not fit the cuBLASLt problem");
  expectRefused([](fb::Program &p) { matmul(p, 0).set_batch(7); }, "do not fit");
  expectRefused([](fb::Program &p) { matmul(p, 0).set_rhs_batch_stride(41); }, "batch strides");
  expectRefused([](fb::Program &p) { matmul(p, 0).set_m(int64_t{1} << 61); }, "out of range");
  expectRefused([](fb::Program &p) { matmul(p, 0).set_k(0); }, "out of range");
  expectRefused([](fb::Program &p) { matmul(p, 0).set_dtype(fb::F16); },
                "the operands are f32 and f32, the cuBLASLt problem states f16");
  expectRefused([](fb::Program &p) { matmul(p, 0).set_dtype(fb::I32); },
                "(f32, bf16 or f16 expected)");
  // bf16 operands: the output f32 or bf16, a full C the output's type, a bias row f32.
  auto lowOperands = [](fb::Program &p, int inst, int lhs, int rhs) {
    p.mutable_tensors(lhs)->set_dtype(fb::BF16);
    p.mutable_tensors(rhs)->set_dtype(fb::BF16);
    matmul(p, inst).set_dtype(fb::BF16);
  };
  expectRefused([&](fb::Program &p) {
    lowOperands(p, 0, 0, 1);
    p.mutable_tensors(2)->set_dtype(fb::F16);
  }, "a product of bf16 operands is written as f32 or bf16, not f16");
  expectRefused([&](fb::Program &p) {
    lowOperands(p, 1, 3, 4);
    p.mutable_tensors(6)->set_dtype(fb::BF16);
  }, "bias row must be bf16", "instruction #1 'fc/Gemm'");
  expectRefused([&](fb::Program &p) {
    p.mutable_tensors(0)->set_dtype(fb::BF16);
    matmul(p, 0).set_dtype(fb::BF16);
  }, "the operands are bf16 and f32");
  expectRefused([](fb::Program &p) { matmul(p, 1).set_c(fb::MatmulProblem::NO_C); },
                "C operand", "instruction #1 'fc/Gemm'");
  expectRefused([](fb::Program &p) { matmul(p, 1).set_c(fb::MatmulProblem::FULL_C); },
                "does not fit the cuBLASLt problem", "instruction #1 'fc/Gemm'");
  expectRefused([](fb::Program &p) { matmul(p, 1).set_beta(0.5); },
                "does not fit the cuBLASLt problem", "instruction #1 'fc/Gemm'");
}

namespace {

/// Adds a gemm region's call (op "fusion", forge-fuse's "gemm" with its
/// cuBLASLt epilogue): the weight gradient dw[5,8] = dy[6,5]^T x[6,8] and the
/// bias gradient db[1,5] (dy summed over k), as instruction #2.
fb::Instruction &addBiasGradCall(fb::Program &p) {
  addTensor(p, "dy", fb::TensorInfo::INPUT, {6, 5}, 4096);
  addTensor(p, "x", fb::TensorInfo::INPUT, {6, 8}, 4224);
  addTensor(p, "dw", fb::TensorInfo::OUTPUT, {5, 8}, 4480);
  addTensor(p, "db", fb::TensorInfo::OUTPUT, {1, 5}, 4736);
  p.set_arena_size(8192);
  fb::Routine *r = p.mutable_routines(0);
  fb::Instruction *f = r->add_instructions();
  f->set_op("fusion");
  f->set_name("fc/bgrad");
  f->set_placement(fb::LIBRARY);
  f->add_inputs(7);
  f->add_inputs(8);
  f->add_outputs(9);
  f->add_outputs(10);
  fb::MatmulProblem *pr = f->mutable_matmul();
  pr->set_m(5);
  pr->set_n(8);
  pr->set_k(6);
  pr->set_batch(1);
  pr->set_trans_a(true);
  pr->set_alpha(1.0);
  pr->set_dtype(fb::F32);
  pr->set_epilogue(fb::MatmulProblem::BGRAD_LHS);
  // The body the CPU runs (the loader wants one; the GPU runs the call).
  fb::Instruction *gemm = f->add_body();
  gemm->set_op("gemm");
  gemm->add_inputs(7);
  gemm->add_inputs(8);
  gemm->add_outputs(9);
  fb::Instruction *sum = f->add_body();
  sum->set_op("reduce_sum");
  sum->add_inputs(7);
  sum->add_outputs(10);
  r->add_inputs(7);
  r->add_inputs(8);
  r->add_outputs(9);
  r->add_outputs(10);
  return *f;
}

/// Makes instruction #1 (the gemm with its bias row) a gemm region with a
/// ReLU epilogue (its body: the gemm).
fb::Instruction &makeReluRegion(fb::Program &p) {
  fb::Instruction *g = p.mutable_routines(0)->mutable_instructions(1);
  fb::Instruction inner = *g;
  inner.clear_placement();
  inner.clear_matmul();
  g->set_op("fusion");
  *g->add_body() = inner;
  g->mutable_matmul()->set_epilogue(fb::MatmulProblem::RELU);
  return *g;
}

} // namespace

TEST(LibraryCallTest, GemmRegionEpiloguesThatFitRun) {
  Status st = check([](fb::Program &p) { addBiasGradCall(p); });
  EXPECT_TRUE(st.isOk()) << st.message();
  // The gemm with its bias row and a ReLU (RELU_BIAS), stated on a region.
  st = check([](fb::Program &p) { makeReluRegion(p); });
  EXPECT_TRUE(st.isOk()) << st.message();
}

TEST(LibraryCallTest, GemmRegionEpiloguesThatDoNotFitAreRefused) {
  const std::string at = "instruction #2 'fc/bgrad'";
  // The bias gradient sums the lhs over k: it must be stored [k, m] (trans_a).
  expectRefused([](fb::Program &p) {
    addBiasGradCall(p).mutable_matmul()->set_trans_a(false);
  }, "bias-gradient epilogue needs one product without C", at);
  // Its output has m elements.
  expectRefused([](fb::Program &p) {
    addBiasGradCall(p);
    p.mutable_tensors(10)->set_shape(1, 8);
  }, "the bias gradient must be f32 of 5 elements", at);
  // A second output is the bias gradient's; without it the call is refused.
  expectRefused([](fb::Program &p) {
    fb::Instruction &f = addBiasGradCall(p);
    f.mutable_outputs()->RemoveLast();
    f.mutable_body()->RemoveLast();
  }, "two outputs", at);
  // The rhs's bias gradient needs a plain rhs [k, n]: here it is x [6, 8] with n = 8.
  expectRefused([](fb::Program &p) {
    fb::Instruction &f = addBiasGradCall(p);
    f.mutable_matmul()->set_epilogue(fb::MatmulProblem::BGRAD_RHS);
    f.mutable_matmul()->set_trans_b(true);
  }, "bias-gradient epilogue", at);
  // A fusion in a library without an epilogue is no gemm region.
  expectRefused([](fb::Program &p) {
    addBiasGradCall(p).mutable_matmul()->set_epilogue(fb::MatmulProblem::NO_EPILOGUE);
  }, "must be a gemm region", at);
  // ReLU takes no full C.
  expectRefused([](fb::Program &p) {
    makeReluRegion(p).mutable_matmul()->set_c(fb::MatmulProblem::FULL_C);
  }, "takes no full C", "instruction #1 'fc/Gemm'");
}

namespace {

/// Makes instruction #1 a residual linear layer's gemm region: z = x2 @ w +
/// y2 (full C, beta 1) + bias as the BIAS epilogue, the bias its input 3.
fb::Instruction &makeBiasRegion(fb::Program &p) {
  addTensor(p, "residual", fb::TensorInfo::INPUT, {4, 5}, 4096);
  p.set_arena_size(8192);
  fb::Instruction *g = p.mutable_routines(0)->mutable_instructions(1);
  g->set_op("fusion");
  g->clear_inputs();
  for (int t : {3, 4, 7, 5})
    g->add_inputs(t);
  fb::Instruction *gemm = g->add_body();
  gemm->set_op("gemm");
  for (int t : {3, 4, 7})
    gemm->add_inputs(t);
  gemm->add_outputs(6);
  fb::MatmulProblem *pr = g->mutable_matmul();
  pr->set_c(fb::MatmulProblem::FULL_C);
  pr->set_epilogue(fb::MatmulProblem::BIAS);
  p.mutable_routines(0)->add_inputs(7);
  return *g;
}

} // namespace

TEST(LibraryCallTest, BiasEpilogueAfterAFullC) {
  Status st = check([](fb::Program &p) { makeBiasRegion(p); });
  EXPECT_TRUE(st.isOk()) << st.message();
  const std::string at = "instruction #1 'fc/Gemm'";
  // The bias row has n elements.
  expectRefused([](fb::Program &p) {
    makeBiasRegion(p);
    p.mutable_tensors(5)->set_shape(0, 4);
  }, "the bias row must be f32 of 5 elements", at);
  // Without a full C (C a bias row) the epilogue's row has no place.
  expectRefused([](fb::Program &p) {
    makeBiasRegion(p).mutable_matmul()->set_c(fb::MatmulProblem::BIAS_ROW);
  }, "the bias epilogue needs a full C", at);
}

namespace {

/// Adds an MLP's GELU layer and its gradient as gemm-region calls (n = 8, a
/// multiple of 8 as aux matrices need): #2 g = gelu(x @ w + b) with the
/// pre-activation as its aux output (GELU_AUX_BIAS), #3 dh = (dy @ w2) *
/// gelu'(pre) and db = dh summed over its rows (DGELU_BGRAD).
void addGeluCalls(fb::Program &p) {
  addTensor(p, "x", fb::TensorInfo::INPUT, {6, 8}, 4096);      // 7
  addTensor(p, "w", fb::TensorInfo::INPUT, {8, 8}, 4352);      // 8
  addTensor(p, "b", fb::TensorInfo::INPUT, {8}, 4608);         // 9
  addTensor(p, "g", fb::TensorInfo::OUTPUT, {6, 8}, 4864);     // 10
  addTensor(p, "pre", fb::TensorInfo::OUTPUT, {6, 8}, 5120);   // 11
  addTensor(p, "dy", fb::TensorInfo::INPUT, {6, 8}, 5376);     // 12
  addTensor(p, "dh", fb::TensorInfo::OUTPUT, {6, 8}, 5632);    // 13
  addTensor(p, "db", fb::TensorInfo::OUTPUT, {1, 8}, 5888);    // 14
  p.set_arena_size(8192);
  fb::Routine *r = p.mutable_routines(0);
  auto call = [&](const char *name, std::initializer_list<int> in, std::initializer_list<int> out,
                  fb::MatmulProblem::Epilogue e) -> fb::Instruction & {
    fb::Instruction *f = r->add_instructions();
    f->set_op("fusion");
    f->set_name(name);
    f->set_placement(fb::LIBRARY);
    for (int t : in)
      f->add_inputs(t);
    for (int t : out)
      f->add_outputs(t);
    fb::MatmulProblem *pr = f->mutable_matmul();
    pr->set_m(6);
    pr->set_n(8);
    pr->set_k(8);
    pr->set_batch(1);
    pr->set_alpha(1.0);
    pr->set_dtype(fb::F32);
    pr->set_epilogue(e);
    fb::Instruction *gemm = f->add_body(); // the loader wants a body; the GPU runs the call
    gemm->set_op("gemm");
    gemm->add_inputs(*in.begin());
    gemm->add_inputs(*(in.begin() + 1));
    gemm->add_outputs(*out.begin());
    return *f;
  };
  fb::Instruction &fwd = call("mlp/gelu", {7, 8, 9}, {10, 11}, fb::MatmulProblem::GELU_AUX);
  fwd.mutable_matmul()->set_c(fb::MatmulProblem::BIAS_ROW);
  fwd.mutable_matmul()->set_beta(1.0);
  call("mlp/dgelu", {12, 8, 11}, {13, 14}, fb::MatmulProblem::DGELU_BGRAD);
  for (int t : {7, 8, 9, 12})
    r->add_inputs(t);
  for (int t : {10, 13, 14})
    r->add_outputs(t);
}

fb::Instruction &instruction(fb::Program &p, int i) {
  return *p.mutable_routines(0)->mutable_instructions(i);
}

} // namespace

TEST(LibraryCallTest, GeluEpiloguesThatFitRun) {
  Status st = check([](fb::Program &p) { addGeluCalls(p); });
  EXPECT_TRUE(st.isOk()) << st.message();
  // Without the aux output (GELU_BIAS) and without the bias gradient (DGELU).
  st = check([](fb::Program &p) {
    addGeluCalls(p);
    instruction(p, 2).mutable_matmul()->set_epilogue(fb::MatmulProblem::GELU);
    instruction(p, 2).mutable_outputs()->RemoveLast();
    instruction(p, 3).mutable_matmul()->set_epilogue(fb::MatmulProblem::DGELU);
    instruction(p, 3).mutable_outputs()->RemoveLast();
  });
  EXPECT_TRUE(st.isOk()) << st.message();
}

TEST(LibraryCallTest, GeluEpiloguesThatDoNotFitAreRefused) {
  const std::string fwd = "instruction #2 'mlp/gelu'", bwd = "instruction #3 'mlp/dgelu'";
  // The aux output is a second output.
  expectRefused([](fb::Program &p) {
    addGeluCalls(p);
    instruction(p, 2).mutable_outputs()->RemoveLast();
  }, "two outputs", fwd);
  // It has the output's elements.
  expectRefused([](fb::Program &p) {
    addGeluCalls(p);
    p.mutable_tensors(11)->set_shape(0, 5);
  }, "aux matrix (output 1) must be f32 of 48 elements", fwd);
  // GELU takes no full C.
  expectRefused([](fb::Program &p) {
    addGeluCalls(p);
    instruction(p, 2).mutable_matmul()->set_c(fb::MatmulProblem::FULL_C);
  }, "takes no full C", fwd);
  // The aux matrix's leading dimension n must be a multiple of 8: the
  // gemm of #1 (n = 5) as a GELU_AUX_BIAS region with an aux output.
  expectRefused([](fb::Program &p) {
    addTensor(p, "aux5", fb::TensorInfo::OUTPUT, {4, 5}, 6144);
    p.set_arena_size(8192);
    fb::Instruction &f = makeReluRegion(p);
    f.mutable_matmul()->set_epilogue(fb::MatmulProblem::GELU_AUX);
    f.add_outputs(7);
  }, "multiple of 8", "instruction #1 'fc/Gemm'");
  // DGELU reads the GELU's input as input 2 and takes no C.
  expectRefused([](fb::Program &p) {
    addGeluCalls(p);
    instruction(p, 3).add_inputs(9);
  }, "GELU-gradient epilogue needs one product without C", bwd);
  expectRefused([](fb::Program &p) {
    addGeluCalls(p);
    instruction(p, 3).set_inputs(2, 9); // the bias row: not of the output's shape
  }, "aux matrix (input 2) must be f32 of 48 elements", bwd);
  // DGELU_BGRAD's bias gradient has n elements.
  expectRefused([](fb::Program &p) {
    addGeluCalls(p);
    p.mutable_tensors(14)->set_shape(1, 6);
  }, "the bias gradient must be f32 of 8 elements", bwd);
}

// Which tensor each cuBLASLt pointer is: C and the GELU's bias row are input
// 2, but DGELU's input 2 is its aux matrix; the aux output is output 1.
TEST(LibraryCallTest, GeluEpilogueOperandsAreTheStatedTensors) {
  BundleWriter w;
  fb::Program &p = w.program();
  addTensor(p, "unused", fb::TensorInfo::INPUT, {1}, 0); // tensors 0..6 as in check()
  for (int i = 1; i < 7; ++i)
    addTensor(p, "t" + std::to_string(i), fb::TensorInfo::INPUT, {1}, 64 * i);
  p.add_routines();
  addGeluCalls(p);
  const fb::Routine &r = p.routines(0);
  auto fwd = cuda::matmulProblem(p, r.instructions(0), false);
  ASSERT_TRUE(fwd) << fwd.status().message();
  cuda::MatmulTensors t = cuda::matmulTensors(r.instructions(0), *fwd);
  EXPECT_EQ(fwd->epilogue, cuda::MatmulProblem::Epilogue::GeluAux);
  EXPECT_TRUE(fwd->bias);
  EXPECT_EQ(std::vector<int32_t>({t.lhs, t.rhs, t.c, t.out, t.vector, t.aux}),
            std::vector<int32_t>({7, 8, 9, 10, -1, 11}));
  auto bwd = cuda::matmulProblem(p, r.instructions(1), false);
  ASSERT_TRUE(bwd) << bwd.status().message();
  t = cuda::matmulTensors(r.instructions(1), *bwd);
  EXPECT_EQ(bwd->epilogue, cuda::MatmulProblem::Epilogue::DgeluBgrad);
  EXPECT_EQ(std::vector<int32_t>({t.lhs, t.rhs, t.c, t.out, t.vector, t.aux}),
            std::vector<int32_t>({12, 8, -1, 13, 14, 11}));
}

namespace {

/// The GELU calls of addGeluCalls as ReLU calls: #2 RELU_AUX_BIAS writing the
/// bitmask (tensor 11, i8 [6, 16]: rows of 8 bits padded to 128), #3 DRELU reading it.
void addReluCalls(fb::Program &p) {
  addGeluCalls(p);
  fb::TensorInfo &mask = *p.mutable_tensors(11);
  mask.set_dtype(fb::I8);
  mask.set_shape(1, 16);
  int n = p.routines(0).instructions_size(); // the GELU calls are the last two
  instruction(p, n - 2).mutable_matmul()->set_epilogue(fb::MatmulProblem::RELU_AUX);
  fb::Instruction &bwd = instruction(p, n - 1);
  bwd.mutable_matmul()->set_epilogue(fb::MatmulProblem::DRELU);
  bwd.mutable_outputs()->RemoveLast();
  p.mutable_routines(0)->mutable_outputs()->RemoveLast();
}

} // namespace

TEST(LibraryCallTest, ReluBitmaskEpilogues) {
  Status st = check([](fb::Program &p) { addReluCalls(p); });
  EXPECT_TRUE(st.isOk()) << st.message();
  const std::string fwd = "instruction #2 'mlp/gelu'", bwd = "instruction #3 'mlp/dgelu'";
  // The bitmask is i8 of m rows of ceil(n / 128) * 16 bytes.
  expectRefused([](fb::Program &p) {
    addReluCalls(p);
    p.mutable_tensors(11)->set_shape(1, 8);
  }, "bitmask (output 1) must be i8 of 96 elements", fwd);
  expectRefused([](fb::Program &p) {
    addReluCalls(p);
    p.mutable_tensors(11)->set_dtype(fb::F32);
  }, "bitmask (output 1) must be i8", fwd);
  // DRELU reads it as input 2 and takes no C.
  expectRefused([](fb::Program &p) {
    addReluCalls(p);
    instruction(p, 3).add_inputs(9);
  }, "ReLU-gradient epilogue needs one product without C", bwd);
  // Which tensor each pointer is: the bias row is C, the bitmask the aux.
  BundleWriter w;
  fb::Program &p = w.program();
  for (int i = 0; i < 7; ++i)
    addTensor(p, "t" + std::to_string(i), fb::TensorInfo::INPUT, {1}, 64 * i);
  p.add_routines();
  addReluCalls(p);
  auto f = cuda::matmulProblem(p, p.routines(0).instructions(0), false);
  ASSERT_TRUE(f) << f.status().message();
  cuda::MatmulTensors t = cuda::matmulTensors(p.routines(0).instructions(0), *f);
  EXPECT_EQ(f->auxLd(), 128);
  EXPECT_EQ(std::vector<int32_t>({t.c, t.out, t.aux}), std::vector<int32_t>({9, 10, 11}));
  auto b = cuda::matmulProblem(p, p.routines(0).instructions(1), false);
  ASSERT_TRUE(b) << b.status().message();
  t = cuda::matmulTensors(p.routines(0).instructions(1), *b);
  EXPECT_EQ(std::vector<int32_t>({t.c, t.out, t.vector, t.aux}),
            std::vector<int32_t>({-1, 13, -1, 11}));
}

// GPU telemetry: a missing NVML library (or device) is no reading, not an error; the CPU
// executor has no sensors.
TEST(NvmlTest, AbsentLibraryGivesNoReading) {
  EXPECT_FALSE(cuda::Nvml::open("00000000:00:00.0", "libforge-test-no-such-nvml.so.1"));
  BundleWriter w;
  w.program().set_producer("NvmlTest");
  auto bundle = Bundle::fromBytes(w.serialize(), "empty.forge");
  ASSERT_TRUE(bundle.isOk()) << bundle.status().message();
  auto cpu = createExecutor(**bundle, ExecutorOptions{"cpu", 1, true});
  ASSERT_TRUE(cpu.isOk()) << cpu.status().message();
  Executor::Telemetry t = (*cpu)->telemetry();
  EXPECT_FALSE(t.powerWatts || t.smClockMHz || t.temperatureC || t.busyPercent);
}

// The problems CUTLASS's epilogue GEMMs take (Matmul.h cutlassProblem): GPT-2's four
// epilogue GEMMs in bf16, in cuBLASLt's column-major terms (m and n swapped, A = the rhs),
// and which pointer each epilogue operand is; and the problems left to cuBLASLt alone.
TEST(LibraryCallTest, CutlassTakesTheEpilogueGemmsItHas) {
  using E = cuda::MatmulProblem::Epilogue;
  using CE = cuda::CutlassGemm::Epilogue;
  auto problem = [](E epilogue, bool bias, bool fullC, fb::DType out, bool transB = true) {
    cuda::MatmulProblem pr;
    pr.m = 16384, pr.n = 3072, pr.k = 768;
    pr.transB = transB;
    pr.bias = bias, pr.fullC = fullC;
    pr.beta = fullC || bias ? 1.0f : 0.0f;
    pr.epilogue = epilogue;
    pr.ab = fb::BF16, pr.out = out;
    return pr;
  };
  const cuda::MatmulProblem qkv = problem(E::None, true, false, fb::BF16),
                            fc1 = problem(E::GeluAux, true, false, fb::BF16),
                            proj = problem(E::Bias, false, true, fb::F32),
                            dgelu = problem(E::Dgelu, false, false, fb::BF16, false);
  struct Case {
    const cuda::MatmulProblem &pr;
    CE epilogue;
    bool aKMajor;
  };
  for (const Case &c : {Case{qkv, CE::Bias, true}, Case{fc1, CE::GeluAuxBias, true},
                        Case{proj, CE::ResidualBias, true}, Case{dgelu, CE::Dgelu, false}}) {
    auto g = cuda::cutlassProblem(c.pr);
    ASSERT_TRUE(g) << c.pr.key();
    EXPECT_EQ(g->epilogue, c.epilogue) << c.pr.key();
    EXPECT_EQ(std::vector<int64_t>({g->m, g->n, g->k}), std::vector<int64_t>({3072, 16384, 768}));
    EXPECT_EQ(g->aKMajor, c.aKMajor) << c.pr.key();
    EXPECT_EQ(g->beta, c.epilogue == CE::ResidualBias ? 1.0f : 0.0f) << c.pr.key();
  }
  auto ptr = [](uintptr_t a) { return reinterpret_cast<void *>(a); };
  cuda::MatmulOperands ops;
  ops.lhs = ptr(0x100), ops.rhs = ptr(0x200), ops.c = ptr(0x300), ops.out = ptr(0x400);
  ops.vector = ptr(0x500), ops.aux = ptr(0x600);
  cuda::CutlassOperands co = cuda::cutlassOperands(fc1, ops); // the bias is C's row
  EXPECT_EQ(std::vector<const void *>({co.a, co.b, co.c, co.bias, co.d, co.aux}),
            std::vector<const void *>({ops.rhs, ops.lhs, nullptr, ops.c, ops.out, ops.aux}));
  co = cuda::cutlassOperands(proj, ops); // a full C, then the epilogue's own bias
  EXPECT_EQ(std::vector<const void *>({co.c, co.bias}),
            std::vector<const void *>({ops.c, ops.vector}));

  // Left to cuBLASLt: other element types, batches, a transposed lhs, rows that are not
  // 16 bytes, epilogues CUTLASS's kernels here do not have, GELU without its bias row.
  std::vector<std::pair<std::string, cuda::MatmulProblem>> refused;
  auto with = [&](std::string what, cuda::MatmulProblem pr, auto edit) {
    edit(pr);
    refused.emplace_back(std::move(what), pr);
  };
  with("f32 operands", fc1, [](auto &p) { p.ab = fb::F32, p.out = fb::F32; });
  with("tf32", fc1, [](auto &p) { p.tf32 = true; });
  with("f16 operands", fc1, [](auto &p) { p.ab = fb::F16, p.out = fb::F16; });
  with("float8", fc1, [](auto &p) { p.scaled = true; });
  with("a batch", fc1, [](auto &p) { p.batch = 2; });
  with("transposed lhs", fc1, [](auto &p) { p.transA = true; });
  with("k not a multiple of 8", fc1, [](auto &p) { p.k = 770; });
  with("n not a multiple of 8", qkv, [](auto &p) { p.n = 2300; });
  with("GELU without a bias", fc1, [](auto &p) { p.bias = false; });
  with("dGELU with its bias gradient", dgelu, [](auto &p) { p.epilogue = E::DgeluBgrad; });
  with("ReLU", qkv, [](auto &p) { p.epilogue = E::Relu; });
  with("a plain GEMM", qkv, [](auto &p) { p.bias = false; });
  with("a plain GEMM into f32 (the LM head's logits)", qkv,
       [](auto &p) { p.bias = false, p.out = fb::F32; });
  with("residual into bf16", proj, [](auto &p) { p.out = fb::BF16; });
  for (const auto &[what, pr] : refused)
    EXPECT_FALSE(cuda::cutlassProblem(pr)) << what;
}

// FORGE_MATMUL_LIBRARY's values: timed with CUTLASS by default, cuBLASLt alone, CUTLASS's
// configuration forced; anything else warns and keeps the default.
TEST(LibraryCallTest, MatmulLibraryChoices) {
  struct Case {
    std::string value;
    bool cutlassAllowed;
    int forced;
    bool warns;
  };
  for (const Case &c : {Case{"", true, -1, false}, Case{"auto", true, -1, false},
                        Case{"cublaslt", false, -1, false}, Case{"cutlass", true, 0, false},
                        Case{"cutlass:1", true, 1, false}, Case{"cutlass:7", false, 7, true},
                        Case{"cutlass:", true, -1, true}, Case{"cutlass:12", true, -1, true},
                        Case{"CUTLASS", true, -1, true}}) {
    std::string warning;
    cuda::MatmulLibraryChoice got = cuda::parseMatmulLibrary(c.value, &warning);
    EXPECT_EQ(got.cutlassAllowed, c.cutlassAllowed) << c.value;
    EXPECT_EQ(got.forcedCutlass, c.forced) << c.value;
    EXPECT_EQ(!warning.empty(), c.warns) << c.value << ": " << warning;
    if (c.warns)
      EXPECT_NE(warning.find("FORGE_MATMUL_LIBRARY=" + c.value), std::string::npos) << warning;
  }
}

namespace {

/// A bundle with one linear_cross_entropy_with_grad (x bf16 [4, 8] w^T, w bf16 [16, 8], 15
/// classes, reduction sum); `mutate` edits the program first. checkLibraryCalls' verdict.
Status checkLinearCrossEntropy(const std::function<void(fb::Program &)> &mutate = {}) {
  BundleWriter w;
  fb::Program &p = w.program();
  p.set_target("cuda:sm_90");
  p.set_producer("LibraryCallTest");
  auto add = [&](const char *name, fb::TensorInfo::Kind kind, std::vector<int64_t> shape,
                 fb::DType dtype, int64_t offset) {
    int32_t t = addTensor(p, name, kind, std::move(shape), offset);
    p.mutable_tensors(t)->set_dtype(dtype);
    return t;
  };
  add("x", fb::TensorInfo::INPUT, {4, 8}, fb::BF16, 0);
  add("w", fb::TensorInfo::INPUT, {16, 8}, fb::BF16, 256);
  add("target", fb::TensorInfo::INPUT, {4}, fb::I64, 512);
  add("g", fb::TensorInfo::INPUT, {}, fb::F32, 768);
  add("loss", fb::TensorInfo::OUTPUT, {4}, fb::F32, 1024);
  add("d", fb::TensorInfo::OUTPUT, {4, 16}, fb::BF16, 1280);
  p.set_arena_size(2048);
  fb::Routine *r = p.add_routines();
  r->set_name("train_step");
  fb::Instruction *inst = r->add_instructions();
  inst->set_op("linear_cross_entropy_with_grad");
  inst->set_name("head");
  inst->set_placement(fb::LIBRARY);
  for (int t : {0, 1, 2, 3})
    inst->add_inputs(t);
  inst->add_outputs(4);
  inst->add_outputs(5);
  (*inst->mutable_attrs())["reduction"].set_s("sum");
  (*inst->mutable_attrs())["classes"].set_i(15);
  for (int t : {0, 1, 2, 3})
    r->add_inputs(t);
  r->add_outputs(4);
  r->add_outputs(5);
  return verdict(w, mutate);
}

} // namespace

// The LM head's CUTLASS call (forge-fuse-linear-cross-entropy): its tensors are checked at
// load, naming the instruction, before any kernel could read past a buffer.
TEST(LibraryCallTest, LinearCrossEntropyProblems) {
  Status ok = checkLinearCrossEntropy();
  EXPECT_TRUE(ok.isOk()) << ok.message();
  auto refused = [](const std::function<void(fb::Program &)> &mutate, const std::string &needle) {
    Status st = checkLinearCrossEntropy(mutate);
    ASSERT_FALSE(st.isOk()) << "expected an error containing: " << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("instruction #0 'head'"), std::string::npos) << st.message();
  };
  // An f32 x (the kernels read bf16).
  refused([](fb::Program &p) { p.mutable_tensors(0)->set_dtype(fb::F32); }, "bf16 x, w and result");
  // A result of other rows than x's.
  refused([](fb::Program &p) { p.mutable_tensors(5)->set_shape(0, 3); }, "shapes do not agree");
  // K not a multiple of 8 (x and w [.., 6]).
  refused(
      [](fb::Program &p) {
        p.mutable_tensors(0)->set_shape(1, 6);
        p.mutable_tensors(1)->set_shape(1, 6);
      },
      "multiples of 8");
  // More classes than columns.
  refused(
      [](fb::Program &p) {
        (*p.mutable_routines(0)->mutable_instructions(0)->mutable_attrs())["classes"].set_i(17);
      },
      "classes (17) in 1..C");
  // Reduction none needs a grad_output a row.
  refused(
      [](fb::Program &p) {
        (*p.mutable_routines(0)->mutable_instructions(0)->mutable_attrs())["reduction"].set_s(
            "none");
      },
      "shapes do not agree");
  // A missing output.
  refused(
      [](fb::Program &p) {
        p.mutable_routines(0)->mutable_instructions(0)->mutable_outputs()->RemoveLast();
      },
      "makes loss and result");
}
