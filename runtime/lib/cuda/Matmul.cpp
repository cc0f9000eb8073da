// cuBLASLt matmul plans (Matmul.h).
#include "cuda/Matmul.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string_view>

namespace forge::rt::cuda {

namespace {

#define LT_CHECK(call)                                                                          \
  do {                                                                                          \
    cublasStatus_t status_ = (call);                                                            \
    if (status_ != CUBLAS_STATUS_SUCCESS)                                                       \
      return Status::error("cuBLASLt {} failed: {}", #call,                                    \
                           api.cublasLtGetStatusString(status_));                               \
  } while (0)

} // namespace

std::string MatmulProblem::key() const {
  return fmt::format("{}x{}x{} b{} t{}{} s{},{} c{}{} a{} b{} tf{} e{} d{},{},{}{}", m, n, k,
                     batch, transA, transB, lhsBatchStride, rhsBatchStride, fullC, bias, alpha,
                     beta, tf32, static_cast<int>(epilogue), static_cast<int>(ab),
                     static_cast<int>(out), static_cast<int>(rhsDType()), scaled ? " scaled" : "");
}

namespace {

bool isFloat8(bundle::DType d) { return d == bundle::F8E4M3 || d == bundle::F8E5M2; }

/// The problem of `inst` with a scaled problem's two scale inputs taken out
/// (`scaled`: they were; the float8 types and bf16 bias rows apply).
Expected<MatmulProblem> unscaledProblem(const bundle::Program &p, const bundle::Instruction &inst,
                                        bool tf32, bool scaled);

} // namespace

Expected<MatmulProblem> matmulProblem(const bundle::Program &p, const bundle::Instruction &inst,
                                      bool tf32) {
  if (!inst.has_matmul() || !inst.matmul().scaled())
    return unscaledProblem(p, inst, tf32, false);
  // Inputs lhs, rhs, the two scales, then what an unscaled problem has.
  if (inst.inputs_size() < 4)
    return Status::error("{}: a scaled cuBLASLt problem needs lhs, rhs and their two scales",
                         inst.op());
  for (int i = 2; i < 4; ++i) {
    int32_t t = inst.inputs(i);
    if (t < 0 || t >= p.tensors_size() || p.tensors(t).dtype() != bundle::F32 ||
        numElements(shapeOf(p.tensors(t))) != 1)
      return Status::error("{}: the scaled problem's input {} (the {}'s scale) must be an f32 "
                           "scalar",
                           inst.op(), i, i == 2 ? "lhs" : "rhs");
  }
  bundle::Instruction rest = inst;
  rest.clear_body(); // not read; a region's body can be long
  rest.mutable_inputs()->erase(rest.mutable_inputs()->begin() + 2,
                               rest.mutable_inputs()->begin() + 4);
  return unscaledProblem(p, rest, tf32, true);
}

namespace {

Expected<MatmulProblem> unscaledProblem(const bundle::Program &p, const bundle::Instruction &inst,
                                        bool tf32, bool scaled) {
  if (inst.op() != "matmul" && inst.op() != "gemm" && inst.op() != "scaled_gemm" &&
      inst.op() != "fusion")
    return Status::error("op '{}' is not a matmul", inst.op());
  const auto e = inst.has_matmul() ? inst.matmul().epilogue() : bundle::MatmulProblem::NO_EPILOGUE;
  // Epilogues with a second output (a bias gradient, an aux matrix).
  const bool twoOutputs = e == bundle::MatmulProblem::BGRAD_LHS ||
                          e == bundle::MatmulProblem::BGRAD_RHS ||
                          e == bundle::MatmulProblem::GELU_AUX ||
                          e == bundle::MatmulProblem::DGELU_BGRAD ||
                          e == bundle::MatmulProblem::RELU_AUX;
  if (inst.op() == "fusion" && (!inst.has_matmul() ||
                                inst.matmul().epilogue() == bundle::MatmulProblem::NO_EPILOGUE))
    return Status::error("a fusion placed in a library must be a gemm region with a cuBLASLt "
                         "epilogue");
  if (inst.inputs_size() < 2 || inst.outputs_size() != (twoOutputs ? 2 : 1) || inst.inputs(0) < 0 ||
      inst.inputs(1) < 0)
    return Status::error("{} needs lhs, rhs and {}", inst.op(),
                         twoOutputs ? "two outputs (the product, then the bias gradient or the "
                                      "aux matrix)"
                                    : "one output");
  if (!inst.has_matmul())
    return Status::error("{} has no cuBLASLt problem (Instruction.matmul; a bundle from an older "
                         "forgec? compile it again)",
                         inst.op());
  for (int32_t t : {inst.inputs(0), inst.inputs(1), inst.outputs(0)})
    if (t >= p.tensors_size())
      return Status::error("{}: tensor {} does not exist", inst.op(), t);
  const bundle::MatmulProblem &b = inst.matmul();
  // Operands f32, bf16 or f16 (the problem's dtype); the output f32 or theirs.
  // Scaled: float8 operands (E4M3 or E5M2, not both E5M2), the output f32 or
  // bf16.
  const bundle::DType ab = b.dtype(), out = p.tensors(inst.outputs(0)).dtype();
  const bundle::DType rhsType = scaled ? b.rhs_dtype() : ab;
  if (scaled) {
    if (!isFloat8(ab) || !isFloat8(rhsType) || (ab == bundle::F8E5M2 && rhsType == bundle::F8E5M2))
      return Status::error("{}: a scaled cuBLASLt problem takes float8 operands, not both E5M2 "
                           "({} and {})",
                           inst.op(), dtypeName(ab), dtypeName(rhsType));
    if (out != bundle::F32 && out != bundle::BF16)
      return Status::error("{}: a float8 product is written as f32 or bf16, not {}", inst.op(),
                           dtypeName(out));
  } else if (ab != bundle::F32 && ab != bundle::BF16 && ab != bundle::F16) {
    return Status::error("{}: the cuBLASLt problem's dtype is {} (f32, bf16 or f16 expected)",
                         inst.op(), dtypeName(ab));
  } else if (out != bundle::F32 && out != ab) {
    return Status::error("{}: a product of {} operands is written as f32 or {}, not {}",
                         inst.op(), dtypeName(ab), dtypeName(ab), dtypeName(out));
  }
  if (p.tensors(inst.inputs(0)).dtype() != ab || p.tensors(inst.inputs(1)).dtype() != rhsType)
    return Status::error("{}: the operands are {} and {}, the cuBLASLt problem states {} and {}",
                         inst.op(), dtypeName(p.tensors(inst.inputs(0)).dtype()),
                         dtypeName(p.tensors(inst.inputs(1)).dtype()), dtypeName(ab),
                         dtypeName(rhsType));
  MatmulProblem pr;
  pr.scaled = scaled;
  pr.rhsType = rhsType;
  pr.tf32 = tf32 && ab == bundle::F32;
  pr.ab = ab;
  pr.out = out;
  pr.m = b.m();
  pr.n = b.n();
  pr.k = b.k();
  pr.batch = b.batch();
  pr.transA = b.trans_a();
  pr.transB = b.trans_b();
  pr.lhsBatchStride = b.lhs_batch_stride();
  pr.rhsBatchStride = b.rhs_batch_stride();
  pr.alpha = static_cast<float>(b.alpha());
  pr.beta = static_cast<float>(b.beta());
  pr.fullC = b.c() == bundle::MatmulProblem::FULL_C;
  pr.bias = b.c() == bundle::MatmulProblem::BIAS_ROW;
  // What cuBLASLt will read and write must be exactly the tensors: a corrupt
  // bundle is refused here, never run past a buffer's end.
  auto elements = [&](int32_t t) { return numElements(shapeOf(p.tensors(t))); };
  // Whether tensor t exists and is of the output's type with n elements (an
  // epilogue's vector or a GELU's aux matrix).
  auto outOf = [&](int32_t t, int64_t n) {
    return t >= 0 && t < p.tensors_size() && p.tensors(t).dtype() == out && elements(t) == n;
  };
  // A bias row read: the output's type, bf16 beside float8 operands.
  const bundle::DType rowType = scaled ? bundle::BF16 : out;
  auto fits = [](int64_t a, int64_t b) { return a > 0 && b > 0 && a <= (int64_t{1} << 62) / b; };
  if (!fits(pr.m, pr.k) || !fits(pr.k, pr.n) || !fits(pr.m, pr.n) || pr.batch < 1 ||
      !fits(pr.batch, pr.m * pr.n) || !fits(pr.batch, pr.m * pr.k) || !fits(pr.batch, pr.k * pr.n))
    return Status::error("{}: cuBLASLt problem m={} n={} k={} batch={} is out of range",
                         inst.op(), pr.m, pr.n, pr.k, pr.batch);
  if ((pr.lhsBatchStride != 0 && pr.lhsBatchStride != pr.m * pr.k) ||
      (pr.rhsBatchStride != 0 && pr.rhsBatchStride != pr.k * pr.n) ||
      (pr.batch == 1 && (pr.lhsBatchStride != 0 || pr.rhsBatchStride != 0)))
    return Status::error("{}: cuBLASLt batch strides {} and {} do not fit m={} n={} k={} batch={}",
                         inst.op(), pr.lhsBatchStride, pr.rhsBatchStride, pr.m, pr.n, pr.k,
                         pr.batch);
  int64_t lhsWant = pr.lhsBatchStride ? pr.batch * pr.m * pr.k : pr.m * pr.k;
  int64_t rhsWant = pr.rhsBatchStride ? pr.batch * pr.k * pr.n : pr.k * pr.n;
  int64_t outWant = pr.batch * pr.m * pr.n;
  if (elements(inst.inputs(0)) != lhsWant || elements(inst.inputs(1)) != rhsWant ||
      elements(inst.outputs(0)) != outWant)
    return Status::error("{}: operands of {}, {} and {} elements do not fit the cuBLASLt problem "
                         "m={} n={} k={} batch={} (lhs {}, rhs {}, output {} expected)",
                         inst.op(), elements(inst.inputs(0)), elements(inst.inputs(1)),
                         elements(inst.outputs(0)), pr.m, pr.n, pr.k, pr.batch, lhsWant, rhsWant,
                         outWant);
  // A GELU epilogue's aux matrix: the output's shape and layout, leading
  // dimension n, which cuBLASLt wants a multiple of 8.
  auto auxMatrix = [&](int32_t t, const char *what) -> Status {
    if (!outOf(t, outWant))
      return Status::error("{}: the GELU epilogue's aux matrix ({}) must be {} of {} elements",
                           inst.op(), what, dtypeName(out), outWant);
    if (pr.n % 8 != 0)
      return Status::error("{}: the GELU epilogue's aux matrix needs n = {} to be a multiple of 8",
                           inst.op(), pr.n);
    return Status::ok();
  };
  // A ReLU epilogue's bitmask: I8 rows of ceil(n / 128) * 16 bytes.
  auto bitmask = [&](int32_t t, const char *what) -> Status {
    int64_t bytes = pr.m * reluBitmaskRowBytes(pr.n);
    if (t < 0 || t >= p.tensors_size() || p.tensors(t).dtype() != bundle::I8 ||
        elements(t) != bytes)
      return Status::error("{}: the ReLU epilogue's bitmask ({}) must be i8 of {} elements",
                           inst.op(), what, bytes);
    return Status::ok();
  };
  switch (b.epilogue()) {
  case bundle::MatmulProblem::NO_EPILOGUE:
    break;
  case bundle::MatmulProblem::RELU:
    if (pr.fullC)
      return Status::error("{}: cuBLASLt's ReLU epilogue takes no full C", inst.op());
    pr.epilogue = MatmulProblem::Epilogue::Relu;
    break;
  case bundle::MatmulProblem::BIAS: {
    // After a full C: inputs lhs, rhs, C, then the bias row of n.
    if (!pr.fullC || inst.inputs_size() != 4)
      return Status::error("{}: the bias epilogue needs a full C and the bias row as input 3",
                           inst.op());
    if (inst.inputs(3) < 0 || inst.inputs(3) >= p.tensors_size() ||
        p.tensors(inst.inputs(3)).dtype() != rowType || elements(inst.inputs(3)) != pr.n)
      return Status::error("{}: the bias row must be {} of {} elements", inst.op(),
                           dtypeName(rowType), pr.n);
    pr.epilogue = MatmulProblem::Epilogue::Bias;
    break;
  }
  case bundle::MatmulProblem::BGRAD_LHS:
  case bundle::MatmulProblem::BGRAD_RHS: {
    bool lhs = b.epilogue() == bundle::MatmulProblem::BGRAD_LHS;
    // The sum runs over k of the stored operand's rows: a transposed lhs
    // ([k, m]) or a plain rhs ([k, n]), one product, no C.
    if (pr.batch != 1 || pr.fullC || pr.bias || (lhs ? !pr.transA : pr.transB))
      return Status::error("{}: a bias-gradient epilogue needs one product without C and the "
                           "{} stored as [k, {}]",
                           inst.op(), lhs ? "lhs" : "rhs", lhs ? "m" : "n");
    if (!outOf(inst.outputs(1), lhs ? pr.m : pr.n))
      return Status::error("{}: the bias gradient must be {} of {} elements", inst.op(),
                           dtypeName(out), lhs ? pr.m : pr.n);
    pr.epilogue = lhs ? MatmulProblem::Epilogue::BgradLhs : MatmulProblem::Epilogue::BgradRhs;
    break;
  }
  case bundle::MatmulProblem::RELU_AUX:
    if (pr.fullC || pr.batch != 1)
      return Status::error("{}: cuBLASLt's ReLU epilogue takes no full C, and one product with "
                           "its bitmask",
                           inst.op());
    FORGE_RETURN_IF_ERROR(bitmask(inst.outputs(1), "output 1"));
    pr.epilogue = MatmulProblem::Epilogue::ReluAux;
    break;
  case bundle::MatmulProblem::DRELU:
    if (pr.batch != 1 || pr.fullC || pr.bias || inst.inputs_size() != 3)
      return Status::error("{}: a ReLU-gradient epilogue needs one product without C and the "
                           "ReLU's bitmask as input 2",
                           inst.op());
    FORGE_RETURN_IF_ERROR(bitmask(inst.inputs(2), "input 2"));
    pr.epilogue = MatmulProblem::Epilogue::Drelu;
    break;
  case bundle::MatmulProblem::GELU:
  case bundle::MatmulProblem::GELU_AUX: {
    bool aux = b.epilogue() == bundle::MatmulProblem::GELU_AUX;
    if (pr.fullC || (aux && pr.batch != 1))
      return Status::error("{}: cuBLASLt's GELU epilogue takes no full C{}", inst.op(),
                           aux ? ", and one product with its aux output" : "");
    if (aux) {
      FORGE_RETURN_IF_ERROR(auxMatrix(inst.outputs(1), "output 1"));
      pr.epilogue = MatmulProblem::Epilogue::GeluAux;
    } else {
      pr.epilogue = MatmulProblem::Epilogue::Gelu;
    }
    break;
  }
  case bundle::MatmulProblem::DGELU:
  case bundle::MatmulProblem::DGELU_BGRAD: {
    // Inputs lhs, rhs and the GELU's input (no C).
    if (pr.batch != 1 || pr.fullC || pr.bias || inst.inputs_size() != 3)
      return Status::error("{}: a GELU-gradient epilogue needs one product without C and the "
                           "GELU's input as input 2",
                           inst.op());
    FORGE_RETURN_IF_ERROR(auxMatrix(inst.inputs(2), "input 2"));
    if (b.epilogue() == bundle::MatmulProblem::DGELU_BGRAD) {
      if (!outOf(inst.outputs(1), pr.n))
        return Status::error("{}: the bias gradient must be {} of {} elements", inst.op(),
                             dtypeName(out), pr.n);
      pr.epilogue = MatmulProblem::Epilogue::DgeluBgrad;
    } else {
      pr.epilogue = MatmulProblem::Epilogue::Dgelu;
    }
    break;
  }
  default:
    return Status::error("{}: unknown cuBLASLt epilogue {}", inst.op(),
                         static_cast<int>(b.epilogue()));
  }
  // C is input 2, unless it is the aux matrix an epilogue reads (DGELU, DRELU).
  bool hasC = !pr.readsAux() && inst.inputs_size() > 2 && inst.inputs(2) >= 0;
  if (hasC != (pr.fullC || pr.bias))
    return Status::error("{}: the cuBLASLt problem {} a C operand but the instruction {} one",
                         inst.op(), hasC ? "has no" : "has", hasC ? "has" : "lacks");
  if (hasC) {
    int32_t c = inst.inputs(2);
    // A full C has the output's type, a bias row too (bf16 when scaled).
    bundle::DType want = pr.fullC ? out : rowType;
    if (c >= p.tensors_size() || p.tensors(c).dtype() != want)
      return Status::error("{}'s {} must be {} on the GPU", inst.op(),
                           pr.fullC ? "C" : "bias row", dtypeName(want));
    if (elements(c) != (pr.fullC ? outWant : pr.n) || (pr.bias && pr.beta != 1.0f))
      return Status::error("{}: C of {} elements does not fit the cuBLASLt problem ({} {})",
                           inst.op(), elements(c), pr.fullC ? "full C of" : "bias row of",
                           pr.fullC ? outWant : pr.n);
  }
  return pr;
}

} // namespace

MatmulTensors matmulTensors(const bundle::Instruction &inst, const MatmulProblem &pr) {
  MatmulTensors t;
  if (pr.scaled) { // the scales, then the instruction as an unscaled one
    bundle::Instruction rest;
    *rest.mutable_inputs() = inst.inputs();
    *rest.mutable_outputs() = inst.outputs();
    rest.mutable_inputs()->erase(rest.mutable_inputs()->begin() + 2,
                                 rest.mutable_inputs()->begin() + 4);
    MatmulProblem unscaled = pr;
    unscaled.scaled = false;
    t = matmulTensors(rest, unscaled);
    t.lhsScale = inst.inputs(2);
    t.rhsScale = inst.inputs(3);
    return t;
  }
  t.lhs = inst.inputs(0);
  t.rhs = inst.inputs(1);
  t.out = inst.outputs(0);
  // Input 2 is C (a full C or the bias row), but the aux matrix of the
  // epilogues that read one (DGELU, DRELU); the written aux is output 1.
  if (pr.readsAux())
    t.aux = inst.inputs(2);
  else if (pr.hasAux())
    t.aux = inst.outputs(1);
  if (!pr.readsAux() && inst.inputs_size() > 2)
    t.c = inst.inputs(2);
  if (pr.epilogue == MatmulProblem::Epilogue::Bias)
    t.vector = inst.inputs(3);
  else if (pr.hasVector())
    t.vector = inst.outputs(1);
  return t;
}

std::optional<CutlassGemm> cutlassProblem(const MatmulProblem &pr) {
  using E = MatmulProblem::Epilogue;
  if (pr.scaled || pr.tf32 || pr.batch != 1 || pr.ab != bundle::BF16 || pr.transA)
    return std::nullopt;
  CutlassGemm g;
  g.m = pr.n;
  g.n = pr.m;
  g.k = pr.k;
  g.aKMajor = pr.transB;
  g.alpha = pr.alpha;
  if (pr.epilogue == E::None && pr.bias && !pr.fullC && pr.out == bundle::BF16)
    g.epilogue = CutlassGemm::Epilogue::Bias;
  else if (pr.epilogue == E::GeluAux && pr.bias && pr.out == bundle::BF16)
    g.epilogue = CutlassGemm::Epilogue::GeluAuxBias;
  else if (pr.epilogue == E::Bias && pr.fullC && pr.out == bundle::F32) {
    g.epilogue = CutlassGemm::Epilogue::ResidualBias;
    g.beta = pr.beta;
  } else if (pr.epilogue == E::Dgelu && !pr.bias && !pr.fullC && pr.out == bundle::BF16)
    g.epilogue = CutlassGemm::Epilogue::Dgelu;
  else
    return std::nullopt;
  // TMA needs 16-byte rows: D's and A's leading dimensions (m, or k for a K-major A) and
  // B's (k) multiples of 8 bf16 elements.
  if (g.m % 8 != 0 || g.k % 8 != 0)
    return std::nullopt;
  return g;
}

CutlassOperands cutlassOperands(const MatmulProblem &pr, const MatmulOperands &ops) {
  CutlassOperands co;
  co.a = ops.rhs;
  co.b = ops.lhs;
  co.c = pr.fullC ? ops.c : nullptr;
  co.bias = pr.bias ? ops.c : ops.vector; // the bias row of C (`c = bias`), or its own input
  co.d = ops.out;
  co.aux = ops.aux;
  return co;
}

MatmulLibraryChoice parseMatmulLibrary(std::string_view s, std::string *warning) {
  MatmulLibraryChoice c;
  if (s == "cublaslt")
    c.cutlassAllowed = false;
  else if (s == "cutlass")
    c.forcedCutlass = 0;
  else if (s.size() == 9 && s.substr(0, 8) == "cutlass:" && s[8] >= '0' && s[8] <= '9')
    c.forcedCutlass = s[8] - '0';
  else if (!s.empty() && s != "auto")
    *warning = fmt::format("FORGE_MATMUL_LIBRARY={} ignored (auto, cublaslt, cutlass or "
                           "cutlass:N)",
                           s);
  if (c.forcedCutlass > 1) { // CutlassGemm.cu builds configurations 0 and 1
    *warning = fmt::format("FORGE_MATMUL_LIBRARY={}: no such CUTLASS configuration (0 or 1); "
                           "cuBLASLt runs every matmul, untimed",
                           s);
    c.cutlassAllowed = false;
  }
  return c;
}

namespace {
/// FORGE_MATMUL_TUNING: `off` keeps cuBLASLt's first heuristic algorithm instead of
/// timing the candidates. Timing picks whichever ran fastest in this process, so two
/// processes may round a bf16 GEMM differently; tests that compare two runs (and
/// anyone who needs a run to repeat bit for bit) turn it off. `verbose` prints each
/// problem's candidates' times and the choice.
enum class Tuning { On, Off, Verbose };
Tuning tuning() {
  static const Tuning mode = [] {
    const char *v = std::getenv("FORGE_MATMUL_TUNING");
    std::string_view s = v ? v : "";
    return s == "off" ? Tuning::Off : s == "verbose" ? Tuning::Verbose : Tuning::On;
  }();
  return mode;
}

const MatmulLibraryChoice &libraryChoice() {
  static const MatmulLibraryChoice choice = [] {
    const char *v = std::getenv("FORGE_MATMUL_LIBRARY");
    std::string warning;
    MatmulLibraryChoice c = parseMatmulLibrary(v ? v : "", &warning);
    if (!warning.empty())
      fmt::print(stderr, "forge: {}\n", warning);
    return c;
  }();
  return choice;
}

#ifdef FORGE_HAVE_CUTLASS
/// Whether the current device runs CUTLASS's sm_90a kernels (compute capability 9.0).
bool deviceRunsCutlass() {
  int dev = 0, major = 0, minor = 0;
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
         major == 9 && minor == 0;
}
#endif

/// `pr` as the CUTLASS GEMM a plan may run on this device (none without CUTLASS, with
/// FORGE_MATMUL_LIBRARY=cublaslt, off sm_90, or without a configuration for it).
std::optional<CutlassGemm> cutlassGemmFor(const MatmulProblem &pr) {
#ifdef FORGE_HAVE_CUTLASS
  // Asked per plan: an executor's device is its own (cheap: cached attributes).
  if (!libraryChoice().cutlassAllowed || !deviceRunsCutlass())
    return std::nullopt;
  auto g = cutlassProblem(pr);
  if (g && cutlassGemmConfigs(*g) > 0)
    return g;
#else
  (void)pr;
#endif
  return std::nullopt;
}

} // namespace

Expected<std::unique_ptr<MatmulPlan>> MatmulPlan::create(const CublasLtApi &api,
                                                         cublasLtHandle_t handle,
                                                         const MatmulProblem &pr,
                                                         size_t workspaceBytes,
                                                         std::shared_ptr<MatmulAlgoCache> cache) {
  std::unique_ptr<MatmulPlan> plan(new MatmulPlan());
  plan->api_ = &api;
  plan->handle_ = handle;
  plan->problem_ = pr;
  plan->workspaceBytes_ = workspaceBytes;
  plan->cache_ = cache;
  plan->cutlassGemm_ = cutlassGemmFor(pr);
#ifdef FORGE_HAVE_CUTLASS
  plan->cutlassConfigs_ = plan->cutlassGemm_ ? cutlassGemmConfigs(*plan->cutlassGemm_) : 0;
#endif
  if (int forced = libraryChoice().forcedCutlass; forced >= 0 && forced < plan->cutlassConfigs_) {
    plan->cutlass_ = forced;
    if (tuning() == Tuning::Verbose)
      fmt::print(stderr, "forge: matmul {} -> cutlass config {} (FORGE_MATMUL_LIBRARY)\n", pr.key(),
                 forced);
  }
  // bf16/f16 operands accumulate in f32 (CUBLAS_COMPUTE_32F) with f32 scales.
  cublasComputeType_t compute = pr.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LT_CHECK(api.cublasLtMatmulDescCreate(&plan->desc_, compute, CUDA_R_32F));
  auto cudaType = [](bundle::DType d) {
    switch (d) {
    case bundle::BF16: return CUDA_R_16BF;
    case bundle::F16: return CUDA_R_16F;
    case bundle::F8E4M3: return CUDA_R_8F_E4M3;
    case bundle::F8E5M2: return CUDA_R_8F_E5M2;
    default: return CUDA_R_32F;
    }
  };
  if (pr.scaled) {
    // Float8: fast accumulation (Hopper's float8 MMA accumulates in reduced
    // precision; the output is promoted to f32 every few K steps either
    // way) as TransformerEngine's forward GEMMs; bias rows bf16.
    int8_t fast = 1;
    LT_CHECK(api.cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                                &fast, sizeof(fast)));
    if (pr.bias || pr.epilogue == MatmulProblem::Epilogue::Bias) {
      cudaDataType_t row = CUDA_R_16BF;
      LT_CHECK(api.cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                  &row, sizeof(row)));
    }
  }
  // Bias rows and bias gradients have D's type (cuBLASLt's default: its
  // RELU_BIAS refuses an f32 bias beside a bf16 D on sm_90).

  // cuBLASLt A = rhs^T view (N x K), B = lhs^T view (K x M), D = Y^T (N x M).
  cublasOperation_t opA = pr.transB ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opB = pr.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_CHECK(api.cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_TRANSA, &opA,
                                              sizeof(opA)));
  LT_CHECK(api.cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_TRANSB, &opB,
                                              sizeof(opB)));
  // cuBLASLt's A is the rhs and its B the lhs (above): the lhs's bias
  // gradient is BGRADB, the rhs's BGRADA.
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  switch (pr.epilogue) {
  case MatmulProblem::Epilogue::None:
    epilogue = pr.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    break;
  case MatmulProblem::Epilogue::Relu:
    epilogue = pr.bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    break;
  case MatmulProblem::Epilogue::Bias:
    epilogue = CUBLASLT_EPILOGUE_BIAS;
    break;
  case MatmulProblem::Epilogue::BgradLhs:
    epilogue = CUBLASLT_EPILOGUE_BGRADB;
    break;
  case MatmulProblem::Epilogue::BgradRhs:
    epilogue = CUBLASLT_EPILOGUE_BGRADA;
    break;
  case MatmulProblem::Epilogue::Gelu:
    epilogue = pr.bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    break;
  case MatmulProblem::Epilogue::GeluAux:
    epilogue = pr.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    break;
  case MatmulProblem::Epilogue::Dgelu:
    epilogue = CUBLASLT_EPILOGUE_DGELU;
    break;
  case MatmulProblem::Epilogue::DgeluBgrad:
    epilogue = CUBLASLT_EPILOGUE_DGELU_BGRAD;
    break;
  case MatmulProblem::Epilogue::ReluAux:
    epilogue = pr.bias ? CUBLASLT_EPILOGUE_RELU_AUX_BIAS : CUBLASLT_EPILOGUE_RELU_AUX;
    break;
  case MatmulProblem::Epilogue::Drelu:
    epilogue = CUBLASLT_EPILOGUE_DRELU;
    break;
  }
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT)
    LT_CHECK(api.cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                &epilogue, sizeof(epilogue)));
  if (pr.hasAux()) {
    int64_t ld = pr.auxLd(); // laid out as D (column-major n x m): elements or bits
    LT_CHECK(api.cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                &ld, sizeof(ld)));
  }
  auto layout = [&](cublasLtMatrixLayout_t *l, bundle::DType type, int64_t rows, int64_t cols,
                    int64_t stride) -> Status {
    LT_CHECK(api.cublasLtMatrixLayoutCreate(l, cudaType(type), static_cast<uint64_t>(rows),
                                            static_cast<uint64_t>(cols), rows));
    if (pr.batch > 1) {
      int32_t count = static_cast<int32_t>(pr.batch);
      LT_CHECK(api.cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                    &count, sizeof(count)));
      LT_CHECK(api.cublasLtMatrixLayoutSetAttribute(
          *l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
    return Status::ok();
  };
  // Stored (column-major) shapes: rhs is N x K when transB, else... its memory
  // is row-major [K, N] (or [N, K] with transB), i.e. column-major N x K (K x N).
  FORGE_RETURN_IF_ERROR(layout(&plan->a_, pr.rhsDType(), pr.transB ? pr.k : pr.n,
                               pr.transB ? pr.n : pr.k, pr.rhsBatchStride));
  FORGE_RETURN_IF_ERROR(layout(&plan->b_, pr.ab, pr.transA ? pr.m : pr.k,
                               pr.transA ? pr.k : pr.m, pr.lhsBatchStride));
  FORGE_RETURN_IF_ERROR(layout(&plan->c_, pr.out, pr.n, pr.m, pr.m * pr.n));

  const std::string key = pr.key();
  if (auto hit = cache->candidates.find(key); hit != cache->candidates.end()) {
    plan->algo_ = hit->second.front();
    return plan;
  }
  cublasLtMatmulPreference_t pref;
  LT_CHECK(api.cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = workspaceBytes;
  cublasStatus_t st = api.cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  cublasLtMatmulHeuristicResult_t results[kMatmulCandidates] = {};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = api.cublasLtMatmulAlgoGetHeuristic(handle, plan->desc_, plan->a_, plan->b_, plan->c_,
                                            plan->c_, pref, kMatmulCandidates, results, &found);
  api.cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    return Status::error("cuBLASLt found no algorithm for {} ({})", pr.key(),
                         st != CUBLAS_STATUS_SUCCESS ? api.cublasLtGetStatusString(st)
                                                     : "no heuristic result");
  std::vector<cublasLtMatmulAlgo_t> &candidates = cache->candidates[key];
  for (int i = 0; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= workspaceBytes)
      candidates.push_back(results[i].algo);
  if (candidates.empty())
    candidates.push_back(results[0].algo);
  plan->algo_ = candidates.front();
  return plan;
}

MatmulPlan::~MatmulPlan() {
  if (!api_)
    return;
  if (a_) api_->cublasLtMatrixLayoutDestroy(a_);
  if (b_) api_->cublasLtMatrixLayoutDestroy(b_);
  if (c_) api_->cublasLtMatrixLayoutDestroy(c_);
  if (desc_) api_->cublasLtMatmulDescDestroy(desc_);
}

Status MatmulPlan::run(cudaStream_t stream, const MatmulOperands &ops, void *workspace) const {
  const CublasLtApi &api = *api_;
#ifdef FORGE_HAVE_CUTLASS
  if (cutlass_ >= 0) {
    cudaError_t e = runCutlassGemm(*cutlassGemm_, cutlass_, cutlassOperands(problem_, ops),
                                   workspace, workspaceBytes_, stream);
    // Forced (FORGE_MATMUL_LIBRARY=cutlass) onto operands CUTLASS cannot take (a view
    // not 16-byte aligned): cuBLASLt runs it. Timed, such a candidate is dropped.
    if (e == cudaErrorNotSupported && libraryChoice().forcedCutlass >= 0)
      ; // nothing was launched: cuBLASLt runs it below
    else if (e != cudaSuccess)
      return Status::error("{} ({}) failed: {}", cutlassGemmConfigName(cutlass_), problem_.key(),
                           e == cudaErrorNotSupported
                               ? "CUTLASS cannot implement it (sizes or pointers not 16-byte "
                                 "aligned, or too little workspace)"
                               : cudaGetErrorString(e));
    else
      return Status::ok();
  }
#endif
  // The bias pointer is the bias row read (C's, or the epilogue's own), or
  // the bias gradient written.
  if (problem_.bias)
    LT_CHECK(api.cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ops.c,
                                                sizeof(ops.c)));
  if (problem_.hasVector())
    LT_CHECK(api.cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                &ops.vector, sizeof(ops.vector)));
  if (problem_.hasAux())
    LT_CHECK(api.cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                &ops.aux, sizeof(ops.aux)));
  if (problem_.scaled) {
    // cuBLASLt's A is the rhs. It refuses (NOT_SUPPORTED, at this call)
    // scale pointers that are not 16-byte aligned (bench/fp8_gemm_probe.cpp);
    // the arena's 64-byte sections are.
    if (reinterpret_cast<uintptr_t>(ops.lhsScale) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(ops.rhsScale) % 16 != 0)
      return Status::error("a float8 GEMM's scales must be 16-byte aligned (a bundle whose "
                           "memory plan misplaces them)");
    LT_CHECK(api.cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                &ops.rhsScale, sizeof(ops.rhsScale)));
    LT_CHECK(api.cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                &ops.lhsScale, sizeof(ops.lhsScale)));
  }
  const void *cPtr = problem_.fullC ? ops.c : ops.out;
  float beta = problem_.fullC ? problem_.beta : 0.0f;
  LT_CHECK(api.cublasLtMatmul(handle_, desc_, &problem_.alpha, ops.rhs, a_, ops.lhs, b_, &beta,
                              cPtr, c_, ops.out, c_, &algo_, workspace, workspaceBytes_, stream));
  return Status::ok();
}

Status MatmulPlan::tune(cudaStream_t stream, const MatmulOperands &ops, void *workspace) {
  if (tuned_)
    return Status::ok();
  if (tuning() == Tuning::Off || libraryChoice().forcedCutlass >= 0) {
    tuned_ = true;
    return Status::ok();
  }
  const std::string key = problem_.key();
  if (auto hit = cache_->tuned.find(key); hit != cache_->tuned.end()) {
    algo_ = hit->second.algo;
    cutlass_ = hit->second.cutlass;
    tuned_ = true;
    return Status::ok();
  }
  // cuBLASLt's candidates (by create), then CUTLASS's configurations.
  std::vector<MatmulChoice> candidates;
  for (const cublasLtMatmulAlgo_t &algo : cache_->candidates.at(key))
    candidates.push_back({algo, -1});
  for (int c = 0; c < cutlassConfigs_; ++c)
    candidates.push_back({algo_, c});
  if (candidates.size() < 2) {
    tuned_ = true;
    return Status::ok();
  }
  // Outputs: out, and the vector or aux when the epilogue writes them.
  std::vector<const void *> written{ops.out}, read{ops.lhs, ops.rhs, ops.c, ops.lhsScale,
                                                   ops.rhsScale};
  bool writesVector = problem_.epilogue != MatmulProblem::Epilogue::Bias;
  bool writesAux = problem_.hasAux() && !problem_.readsAux();
  (writesVector ? written : read).push_back(ops.vector);
  (writesAux ? written : read).push_back(ops.aux);
  for (const void *w : written)
    if (w && (std::count(written.begin(), written.end(), w) > 1 ||
              std::find(read.begin(), read.end(), w) != read.end()))
      return Status::ok(); // a later plan of this problem times them
  tuned_ = true;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess)
    return Status::error("cudaEventCreate failed while tuning a matmul");
  constexpr int kRuns = 5; // after one untimed run of each candidate
  float best = 0;
  bool any = false;
  MatmulChoice chosen{algo_, cutlass_};
  Status lastFailure;
  std::string report;
  for (const MatmulChoice &candidate : candidates) {
    algo_ = candidate.algo;
    cutlass_ = candidate.cutlass;
    Status status = run(stream, ops, workspace); // warm-up (does it run at all?)
    if (!status.isOk()) {
      lastFailure = status;
      continue;
    }
    cudaEventRecord(start, stream);
    for (int i = 0; i < kRuns && status.isOk(); ++i)
      status = run(stream, ops, workspace);
    cudaEventRecord(stop, stream);
    float ms = 0;
    if (status.isOk() && (cudaEventSynchronize(stop) != cudaSuccess ||
                          cudaEventElapsedTime(&ms, start, stop) != cudaSuccess)) {
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
      return Status::error("CUDA error while timing a matmul algorithm for {}: {}", key,
                           cudaGetErrorString(cudaGetLastError()));
    }
    if (!status.isOk()) {
      lastFailure = status;
      continue;
    }
    if (tuning() == Tuning::Verbose)
      report += candidate.cutlass >= 0
                    ? fmt::format(" cutlass{}:{:.4f}", candidate.cutlass, ms / kRuns)
                    : fmt::format(" lt:{:.4f}", ms / kRuns);
    if (!any || ms < best) {
      best = ms;
      chosen = candidate;
    }
    any = true;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  algo_ = chosen.algo; // the fastest, or (none ran) what was there before
  cutlass_ = chosen.cutlass;
  if (!any)
    return lastFailure;
  cache_->tuned[key] = chosen;
  if (tuning() == Tuning::Verbose)
    fmt::print(stderr, "forge: matmul {}: ms{} -> {}\n", key, report,
               chosen.cutlass >= 0 ? fmt::format("cutlass config {}", chosen.cutlass)
                                   : std::string("cuBLASLt"));
  return Status::ok(); // the caller then runs the chosen algorithm
}

} // namespace forge::rt::cuda
