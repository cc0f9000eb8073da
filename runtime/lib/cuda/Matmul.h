// matmul / gemm instructions as one cuBLASLt matmul each.
//
// Row-major Y[M,N] = op(A) op(B) is computed as the column-major product
// Y^T = op(B)^T op(A)^T, so no operand is ever transposed in memory: cuBLASLt's
// "A" is the instruction's rhs and its "B" the lhs. Batches use strided-batch
// layouts (stride 0 broadcasts an operand); a lhs batch over a matrix rhs is
// folded into M. gemm's C is either a full [M, N] matrix scaled by beta or a
// bias row [N] applied with the BIAS epilogue. A fused gemm region adds RELU
// (RELU_BIAS), a bias row after a full C (BIAS), a bias gradient (BGRADB for
// the lhs, cuBLASLt's B; BGRADA for the rhs, its A), the tanh GELU
// (GELU[_AUX][_BIAS]: the aux matrix is the GELU's input, written) or its
// gradient (DGELU[_BGRAD]: the aux matrix read), RELU_AUX[_BIAS] (the aux
// is the ReLU's bitmask) and DRELU (reading it). Aux matrices have the
// output's layout, one batch, leading dimension N (GELU: a multiple of 8) or
// N rounded up to 128 bits (the bitmask). The compiler states each
// problem (forge-select-library -> Instruction.matmul); the runtime checks it
// against the tensors' sizes and runs it, deriving nothing from shapes.
//
// Candidates come from cuBLASLt's heuristic (up to kMatmulCandidates, once per
// distinct problem), with the workspace the executor provides. The first
// checked run times them on the real operands (MatmulPlan::tune) and every
// plan of that problem then runs the fastest: the heuristic's first choice
// can be several times slower for small or skinny problems (too few tiles to
// fill the GPU without split-K).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cuda/CudaApi.h"
#include "cuda/CutlassGemm.h"
#include "forge/runtime/Bundle.h"
#include "forge/runtime/Tensor.h"
#include "program.pb.h"

namespace forge::rt::cuda {

struct MatmulProblem {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  bool transA = false, transB = false; // of the instruction's lhs / rhs
  int64_t lhsBatchStride = 0, rhsBatchStride = 0;
  bool fullC = false, bias = false;
  // A gemm region's epilogue (bundle MatmulProblem.epilogue): relu of the
  // output, a bias row (its own input) added after a full C, the bias
  // gradient of the lhs / rhs (summed over k) written to a second output, the
  // tanh GELU (with its input written as the aux output: GeluAux), or the
  // GELU's gradient reading that aux (with the output's bias gradient:
  // DgeluBgrad).
  enum class Epilogue {
    None, Relu, Bias, BgradLhs, BgradRhs, Gelu, GeluAux, Dgelu, DgeluBgrad, ReluAux, Drelu
  } epilogue = Epilogue::None;
  float alpha = 1, beta = 0;
  bool tf32 = false; // f32 operands only
  // Element types: of lhs and rhs (f32, bf16, f16), and of the output (f32
  // or the operands'), which a full C, a bias row, a bias gradient and a
  // GELU's aux matrix share.
  bundle::DType ab = bundle::F32, out = bundle::F32;
  // A scaled_gemm: float8 lhs (ab) and rhs (rhsType), each multiplied by an
  // f32 scalar (inputs 2 and 3; cuBLASLt's B and A scale pointers); a bias
  // row is then bf16.
  bool scaled = false;
  bundle::DType rhsType = bundle::F32;
  /// The rhs's element type (cuBLASLt's A).
  bundle::DType rhsDType() const { return scaled ? rhsType : ab; }
  std::string key() const;
  /// Whether the epilogue reads or writes a vector (the bias pointer): BIAS's
  /// row, or a bias gradient.
  bool hasVector() const {
    return epilogue == Epilogue::Bias || epilogue == Epilogue::BgradLhs ||
           epilogue == Epilogue::BgradRhs || epilogue == Epilogue::DgeluBgrad;
  }
  /// Whether it writes (GeluAux, ReluAux) or reads (Dgelu*, Drelu) an aux
  /// matrix: the GELU's input, or the ReLU's bitmask.
  bool hasAux() const {
    return epilogue == Epilogue::GeluAux || epilogue == Epilogue::Dgelu ||
           epilogue == Epilogue::DgeluBgrad || epilogue == Epilogue::ReluAux ||
           epilogue == Epilogue::Drelu;
  }
  /// Whether the aux matrix is read (input 2, in place of C).
  bool readsAux() const {
    return epilogue == Epilogue::Dgelu || epilogue == Epilogue::DgeluBgrad ||
           epilogue == Epilogue::Drelu;
  }
  /// The aux matrix's leading dimension: n elements (the GELU's input), or
  /// the bitmask's n bits rounded up to a multiple of 128.
  int64_t auxLd() const {
    bool relu = epilogue == Epilogue::ReluAux || epilogue == Epilogue::Drelu;
    return relu ? reluBitmaskRowBytes(n) * 8 : n;
  }
};

/// The problem of a matmul/gemm instruction (tensor shapes from the program).
Expected<MatmulProblem> matmulProblem(const bundle::Program &p, const bundle::Instruction &inst,
                                      bool tf32);

/// Which tensors of an instruction whose problem matmulProblem accepted the
/// call reads and writes (-1: none): lhs, rhs, C (a full C or the bias row),
/// the output, the epilogue's vector (the BIAS row read, or a bias gradient
/// written) and its aux matrix (the GELU input written, or read by DGELU).
struct MatmulTensors {
  int32_t lhs = -1, rhs = -1, c = -1, out = -1, vector = -1, aux = -1;
  int32_t lhsScale = -1, rhsScale = -1; // a scaled problem's inputs 2 and 3
};
MatmulTensors matmulTensors(const bundle::Instruction &inst, const MatmulProblem &pr);

/// Device pointers of a call's MatmulTensors.
struct MatmulOperands {
  const void *lhs = nullptr, *rhs = nullptr, *c = nullptr;
  void *out = nullptr, *vector = nullptr, *aux = nullptr;
  const void *lhsScale = nullptr, *rhsScale = nullptr;
};

/// What runs a problem: a cuBLASLt algorithm, or (cutlass >= 0) that configuration of
/// CUTLASS's GEMM with the problem's epilogue (CutlassGemm.h).
struct MatmulChoice {
  cublasLtMatmulAlgo_t algo{};
  int cutlass = -1;
};

/// `pr` as a CUTLASS GEMM (CutlassGemm.h; its column-major terms are cuBLASLt's: A = the
/// rhs, B = the lhs, D = Y^T) when one of its epilogues computes it: bf16 operands, one
/// batch, the lhs not transposed, m and k multiples of 8. Whether this build and device
/// hold a configuration for it is asked separately (cutlassGemmConfigs).
std::optional<CutlassGemm> cutlassProblem(const MatmulProblem &pr);
/// The pointers CUTLASS's GEMM of `pr` reads and writes: the epilogue's bias is C's bias
/// row (`c = bias`) or the epilogue's own vector.
CutlassOperands cutlassOperands(const MatmulProblem &pr, const MatmulOperands &ops);

/// FORGE_MATMUL_LIBRARY: `auto` or unset (the default) times CUTLASS's candidates beside
/// cuBLASLt's; `cublaslt` leaves CUTLASS out; `cutlass` or `cutlass:N` runs CUTLASS's
/// configuration N (0 by default) for every problem it takes, untimed (tests of its
/// kernels). An unknown value leaves the default and sets *warning.
struct MatmulLibraryChoice {
  bool cutlassAllowed = true;
  int forcedCutlass = -1; // >= 0: forced (untimed)
};
MatmulLibraryChoice parseMatmulLibrary(std::string_view value, std::string *warning);

/// By MatmulProblem::key(): the heuristic's candidates (best first; one query
/// per distinct problem: a GPT step has ~550 matmuls of ~15 problems) and the
/// choice timed fastest on real operands. Shared by an executor's plans.
struct MatmulAlgoCache {
  std::map<std::string, std::vector<cublasLtMatmulAlgo_t>> candidates;
  std::map<std::string, MatmulChoice> tuned;
};
inline constexpr int kMatmulCandidates = 8;

class MatmulPlan {
public:
  static Expected<std::unique_ptr<MatmulPlan>> create(const CublasLtApi &api,
                                                      cublasLtHandle_t handle,
                                                      const MatmulProblem &problem,
                                                      size_t workspaceBytes,
                                                      std::shared_ptr<MatmulAlgoCache> cache);
  ~MatmulPlan();
  /// Enqueues Y = alpha op(lhs) op(rhs) (+ beta C | + bias) on `stream`, with
  /// the problem's epilogue (its vector and aux operands).
  Status run(cudaStream_t stream, const MatmulOperands &ops, void *workspace) const;
  /// Picks the fastest candidate for this problem: the one already timed by a
  /// plan of the same problem, or times each (a warm-up then a few runs) on
  /// these operands, which must be computed (the first checked run). The
  /// candidates are cuBLASLt's and, on sm_90 for the epilogues it has, CUTLASS's
  /// configurations. A candidate that fails is dropped. Skipped (the heuristic's
  /// choice stays) when an output aliases an operand, since repeated runs would
  /// change it.
  Status tune(cudaStream_t stream, const MatmulOperands &ops, void *workspace);
  const MatmulProblem &problem() const { return problem_; }

private:
  MatmulPlan() = default;
  const CublasLtApi *api_ = nullptr;
  cublasLtHandle_t handle_ = nullptr;
  MatmulProblem problem_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  int cutlass_ = -1;                       // the CUTLASS configuration that runs it (-1: algo_)
  std::optional<CutlassGemm> cutlassGemm_; // the problem as CUTLASS's, where it may run here
  int cutlassConfigs_ = 0;                 // its configurations (0 without cutlassGemm_)
  size_t workspaceBytes_ = 0;
  std::shared_ptr<MatmulAlgoCache> cache_;
  bool tuned_ = false;
};

} // namespace forge::rt::cuda
