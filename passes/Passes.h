//===- Passes.h - Forge graph passes -------------------------------------===//
#ifndef FORGE_PASSES_PASSES_H
#define FORGE_PASSES_PASSES_H

#include "forge/Dialect/ForgeDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::forge {

#define GEN_PASS_DECL
#include "Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "Passes.h.inc"

/// Whether every operand and result of `op` is a static f32 tensor with
/// elements: what the GPU libraries' calls take (cuBLASLt refuses k = 0, and
/// an op whose results are empty is a zero-byte copy). forge-select-library
/// marks only such ops; forge-fuse forms GEMM epilogue regions only of them.
bool isStaticNonEmptyF32(Operation *op);
/// Why cuDNN's flash attention takes no attention of head sizes `d` (q, k)
/// and `dv` (v) ("" when it does): equal, a multiple of 8, at most 128.
/// forge-recognize-composites and forge-select-library state it once here.
std::string cudnnAttentionHeadRefusal(int64_t d, int64_t dv);
/// Whether forge-fuse-linear-cross-entropy takes a head made by `product` with these logits
/// and logit gradient: a matmul x w^T of bf16 x [.., K] and w [C, K], f32 logits whose rows
/// are x's, a bf16 gradient, K and C multiples of 8 (the runtime's CUTLASS kernels' form).
/// forge-chunk-cross-entropy asks it too: such a head stores no logits, only the gradient.
bool isLinearCrossEntropyForm(Operation *product, Type logits, Type gradient);
/// Bytes for a person: "768.0 MiB" (powers of 1024). The memory plan's report
/// and forge-rematerialize's remark.
std::string formatBytes(uint64_t bytes);
/// The ops of `body` that the operands of its forge.accumulated ops depend on
/// (reads from nested regions included), and the ops that only make state
/// updates from those (a channels-last batch norm's running statistics): one
/// micro-batch's forward and backward, which forge-split-accumulation cuts out
/// and forge-fuse keeps apart from the rest. Empty without forge.accumulated.
llvm::DenseSet<Operation *> accumulationPart(Block &body);
/// A forge.fusion "loop" right before `op` whose body is a clone of it (one
/// block argument per distinct operand): a lone pointwise op as a region of
/// its own. The caller replaces op's results with the region's and erases op
/// (forge-fuse's scalar group, forge-assign-precision's mixed-precision
/// readers, forge-merge-scalar-regions' riders).
FusionOp cloneIntoLoopRegion(Operation *op);
/// Replaces the independent loop regions `group` (program order) with one
/// forge.fusion "horizontal" at the last one's place (one launch); users of
/// earlier members that sit before the last move after it. forge-fuse's
/// sibling and scalar groups, forge-assign-precision's fp8 history updates.
void outlineHorizontal(ArrayRef<FusionOp> group);
/// [shape[perm[0]], shape[perm[1]], ...]: a transpose's result shape.
/// forge-assign-layout and forge-permute-parameters.
SmallVector<int64_t> permutedShape(ArrayRef<int64_t> shape, ArrayRef<int64_t> perm);
/// The permutation that undoes `perm`.
SmallVector<int64_t> inversePermutation(ArrayRef<int64_t> perm);
/// Where the pieces of `whole`, cut along `axis` (>= 0), start in its bytes,
/// in order: each piece's extent along the axis times the elements after it
/// (row-major), at the bundle's storage sizes. A split's results in its
/// operand, a concat's operands in its result: what forge-plan-memory places
/// and forge-fold-attention-views / forge-fold-contiguous-views keep aligned.
SmallVector<uint64_t> pieceByteOffsets(RankedTensorType whole, int64_t axis, TypeRange pieces);
/// Whether every piece of `whole` (as pieceByteOffsets) starts on a bundle
/// tensor's alignment (kSectionAlignment, 64 bytes).
bool piecesAligned(RankedTensorType whole, int64_t axis, TypeRange pieces);
/// The row-major element offset of `slice`'s first element in its operand.
int64_t sliceFirstElement(SliceOp slice);

} // namespace mlir::forge

#endif // FORGE_PASSES_PASSES_H
