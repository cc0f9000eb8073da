//===- ForgeGradOps.td - backward-only ops of the forge dialect -----------===//
//
// Ops that only gradient rules create (compiler/lib/Autodiff), for backward
// computations where a composition of primitives would be wasteful (a scatter
// into zeros, a second pass over a window) or would hide a library call
// (convolution weight gradient, normalization backward).
//
// Invariants:
//   * every op here is NotDifferentiable (diff = 0): Forge does not build
//     second-order gradients;
//   * the ONNX name is the forward op's, so the op table's per-op facts hold;
//     the importer never creates these ops;
//   * operand and attribute conventions are the forward op's (ForgeOps.td):
//     `grad_output` is the gradient of the forward result, `input_shape` the
//     forward input's shape where the backward op does not read the input;
//   * the fused normalization backward ops compute only the gradients their
//     `*_grad` flags ask for, one result per set flag in the order
//     (input, scale, bias); canonicalization clears the flag of a result that
//     has no use, so a frozen scale or bias costs nothing;
//   * CPU kernels: runtime/lib/cpu/Backward.cpp.
//
//===----------------------------------------------------------------------===//

#ifndef FORGE_DIALECT_FORGEGRADOPS_TD
#define FORGE_DIALECT_FORGEGRADOPS_TD

class Forge_GradOp<string mnemonic, string onnx, string fusion, string precision,
                   list<Trait> traits = []>
    : Forge_Op<mnemonic, onnx, fusion, precision, 0, traits>;

//===----------------------------------------------------------------------===//
// Convolution and pooling
//===----------------------------------------------------------------------===//

// The input gradient of conv is conv_transpose (with output_padding chosen to
// restore the input extent) and that of conv_transpose is conv, so only the
// weight gradient needs an op of its own.
def Forge_ConvGradWeightOp : Forge_GradOp<"conv_grad_weight", "Conv", FusionLibrary, PrecisionTensorCore> {
  let summary = "Gradient of conv w.r.t. its weight: [M, C/group, kernel...]";
  let description = [{
    dW[m, c, k] = sum over n and window positions o of
    grad_output[n, m, o] * input[n, g*C/group + c, o*stride - pad_begin + k*dilation]
    (g the group of m). grad_output's spatial extents follow the conv formula
    for `input`; it is also the weight gradient of conv_transpose with the
    roles of its input and output swapped. With `channels_last` the input and
    grad_output are [N, spatial..., C] and the result [M, k..., C/group].
  }];
  let arguments = (ins AnyForgeTensor:$input, AnyForgeTensor:$grad_output,
                       DenseI64ArrayAttr:$kernel_shape, DenseI64ArrayAttr:$strides,
                       DenseI64ArrayAttr:$pads, DenseI64ArrayAttr:$dilations, I64Attr:$group,
                       DefaultValuedAttr<BoolAttr, "false">:$channels_last);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input `,` $grad_output attr-dict `:` functional-type(operands, results)";
  let extraDecl = [{ ::mlir::forge::OpCost computeCost(); }];
}

def Forge_MaxPoolGradOp : Forge_GradOp<"max_pool_grad", "MaxPool", FusionReduction, PrecisionFollowsInput> {
  let summary = "Gradient of max_pool: each window's gradient goes to its first maximum";
  let description = [{
    Attributes are the forward op's. Within a window the maximum is chosen
    exactly as the forward kernel does (the first tap in row-major order that
    is strictly greater than all before it), so ties send the whole gradient
    to one position; overlapping windows accumulate. With `channels_last`
    the tensors are [N, spatial..., C].
  }];
  let arguments = (ins AnyForgeTensor:$input, AnyForgeTensor:$grad_output,
                       DenseI64ArrayAttr:$kernel_shape, DenseI64ArrayAttr:$strides,
                       DenseI64ArrayAttr:$pads, DenseI64ArrayAttr:$dilations,
                       BoolAttr:$ceil_mode, DefaultValuedAttr<BoolAttr, "false">:$channels_last);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input `,` $grad_output attr-dict `:` functional-type(operands, results)";
  let flopsPerElement = 2;
}

def Forge_AvgPoolGradOp : Forge_GradOp<"avg_pool_grad", "AveragePool", FusionReduction, PrecisionFollowsInput> {
  let summary = "Gradient of avg_pool: each window spreads grad/divisor over its taps";
  let arguments = (ins AnyForgeTensor:$grad_output, DenseI64ArrayAttr:$input_shape,
                       DenseI64ArrayAttr:$kernel_shape, DenseI64ArrayAttr:$strides,
                       DenseI64ArrayAttr:$pads, DenseI64ArrayAttr:$dilations,
                       BoolAttr:$ceil_mode, BoolAttr:$count_include_pad);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$grad_output attr-dict `:` functional-type(operands, results)";
  let flopsPerElement = 2;
}

//===----------------------------------------------------------------------===//
// Activations
//===----------------------------------------------------------------------===//

// One op rather than gelu's derivative spelled in primitives: a fusion region
// still evaluates it per element, and cuBLASLt's DGELU epilogue (forge-fuse's
// GEMM regions) matches one op after the GEMM that produces grad_output.
def Forge_GeluGradOp : Forge_GradOp<"gelu_grad", "Gelu", FusionElementwise, PrecisionFollowsInput> {
  let summary = "dx = grad_output * gelu'(input), gelu's `approximate` (none | tanh)";
  let arguments = (ins AnyForgeTensor:$grad_output, AnyForgeTensor:$input,
                       StrAttr:$approximate);
  let results = (outs AnyForgeTensor:$grad_input);
  let assemblyFormat = "$grad_output `,` $input attr-dict `:` functional-type(operands, results)";
  let flopsPerElement = 16;
}

// ReLU's saved mask as cuBLASLt's RELU_AUX epilogue writes it, and the
// gradient that its DRELU epilogue computes from it: forge-fuse puts them in
// gemm regions (a linear layer's ReLU and the GEMM of its gradient), so a
// mask of 1 bit per element is saved instead of the f32 output being read.
// Row i of x [M, N] is `bytes` = ceil(N / 128) * 16 bytes of the mask, bit
// j % 8 of byte j / 8 set when x[i, j] > 0 (padding bits 0).
def Forge_ReluBitmaskOp : Forge_GradOp<"relu_bitmask", "Relu", FusionOpaque, PrecisionFollowsInput> {
  let summary = "Bits of x > 0, rows padded to 128 bits: [M, ceil(N / 128) * 16] i8";
  let arguments = (ins AnyForgeTensor:$input);
  let results = (outs TensorOf<[I8]>:$mask);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let extraDecl = [{
    /// Bytes of the mask per row of n elements (n bits rounded up to 128).
    static int64_t rowBytes(int64_t n) { return (n + 127) / 128 * 16; }
  }];
}

def Forge_ReluGradBitmaskOp : Forge_GradOp<"relu_grad_bitmask", "Relu", FusionOpaque, PrecisionFollowsInput> {
  let summary = "dx = grad_output where the mask's bit is set, else 0";
  let arguments = (ins AnyForgeTensor:$grad_output, TensorOf<[I8]>:$mask);
  let results = (outs AnyForgeTensor:$grad_input);
  let assemblyFormat = "$grad_output `,` $mask attr-dict `:` functional-type(operands, results)";
}

//===----------------------------------------------------------------------===//
// Normalizations, softmax, losses
//===----------------------------------------------------------------------===//

// Shared shape of the fused normalization backward ops: results in the order
// (input grad, scale grad, bias grad), one per set flag.
class Forge_NormGradOp<string mnemonic, string onnx, dag attrs>
    : Forge_GradOp<mnemonic, onnx, FusionReduction, PrecisionKeepFP32> {
  let arguments = !con((ins AnyForgeTensor:$input, AnyForgeTensor:$scale,
                            AnyForgeTensor:$grad_output),
                       attrs,
                       (ins BoolAttr:$input_grad, BoolAttr:$scale_grad, BoolAttr:$bias_grad));
  let results = (outs Variadic<AnyForgeTensor>:$results);
  let assemblyFormat = "$input `,` $scale `,` $grad_output attr-dict `:` functional-type(operands, results)";
  let flopsPerElement = 8;
  let hasVerifier = 1;
  let hasCanonicalizeMethod = 1;
}

def Forge_BatchNormTrainingGradOp : Forge_NormGradOp<"batch_norm_training_grad", "BatchNormalization",
                                                     (ins F64Attr:$epsilon)> {
  let summary = "Backward of batch_norm_training through the batch statistics";
  let description = [{
    With xhat = (x - mean_c) / sqrt(var_c + epsilon) over the batch statistics
    of channel c (biased variance, M = N * spatial elements per channel):
    dbias_c = sum dy, dscale_c = sum dy * xhat,
    dx = scale_c / sqrt(var_c + epsilon) * (dy - dbias_c / M - xhat * dscale_c / M).
    The scale and bias gradients have shape [C] and the scale's element type.
  }];
}

def Forge_LayerNormGradOp : Forge_NormGradOp<"layer_norm_grad", "LayerNormalization",
                                             (ins I64Attr:$axis, F64Attr:$epsilon)> {
  let summary = "Backward of layer_norm over dims [axis, rank)";
  let description = [{
    Per row (the normalized dims flattened, D elements), with wdy = dy * scale:
    dx = rstd * (wdy - mean(wdy) - xhat * mean(wdy * xhat)); the scale and bias
    gradients (sum over rows of dy * xhat and dy) have the normalized shape
    x.shape[axis:] and the scale's element type; the rule sums them to the
    parameters' own (broadcast) shapes.
  }];
  let opsetMin = 17;
}

def Forge_GroupNormGradOp : Forge_NormGradOp<"group_norm_grad", "GroupNormalization",
                                             (ins I64Attr:$num_groups, F64Attr:$epsilon)> {
  let summary = "Backward of group_norm (per-channel scale and bias of shape [C])";
}

// The whole attention backward as one op (cuDNN's flash attention backward):
// the probabilities are recomputed from q, k and the forward's lse, never read.
def Forge_AttentionGradOp : Forge_GradOp<"attention_grad", "Attention", FusionLibrary, PrecisionTensorCore> {
  let summary = "Gradients of attention w.r.t. q, k and v";
  let description = [{
    With P = exp(scale q k^T [masked] - lse) and D_i = sum_d do[i, d] o[i, d]:
    dv = P^T do, dP = do v^T, dS = P * (dP - D), dq = scale dS k,
    dk = scale dS^T q; a key/value head shared by several query heads (GQA)
    sums their contributions. Operands and attributes are the forward's; its
    optional `bias` (last) enters the scores as there.
  }];
  let arguments = (ins AnyForgeTensor:$q, AnyForgeTensor:$k, AnyForgeTensor:$v,
                       AnyForgeTensor:$o, AnyForgeTensor:$lse, AnyForgeTensor:$grad_output,
                       Optional<AnyForgeTensor>:$bias,
                       F64Attr:$scale, BoolAttr:$causal,
                       DefaultValuedAttr<StrAttr, "\"bhsd\"">:$layout);
  let results = (outs AnyForgeTensor:$grad_q, AnyForgeTensor:$grad_k, AnyForgeTensor:$grad_v);
  let assemblyFormat = "$q `,` $k `,` $v `,` $o `,` $lse `,` $grad_output (`,` $bias^)? attr-dict `:` functional-type(operands, results)";
  let hasCanonicalizer = 1;
  let opsetMin = 23;
  let opsetMax = 23;
  let extraDecl = [{ ::mlir::forge::OpCost computeCost(); }];
}

def Forge_SoftmaxGradOp : Forge_GradOp<"softmax_grad", "Softmax", FusionReduction, PrecisionKeepFP32> {
  let summary = "dx = y * (dy - sum(dy * y)) along `axis`, y the softmax result";
  let arguments = (ins AnyForgeTensor:$result, AnyForgeTensor:$grad_output, I64Attr:$axis);
  let results = (outs AnyForgeTensor:$grad_input);
  let assemblyFormat = "$result `,` $grad_output attr-dict `:` functional-type(operands, results)";
  let flopsPerElement = 4;
}

def Forge_LogSoftmaxGradOp : Forge_GradOp<"log_softmax_grad", "LogSoftmax", FusionReduction, PrecisionKeepFP32> {
  let summary = "dx = dy - exp(y) * sum(dy) along `axis`, y the log_softmax result";
  let arguments = (ins AnyForgeTensor:$result, AnyForgeTensor:$grad_output, I64Attr:$axis);
  let results = (outs AnyForgeTensor:$grad_input);
  let assemblyFormat = "$result `,` $grad_output attr-dict `:` functional-type(operands, results)";
  let flopsPerElement = 12;
}

// Fused cross-entropy (made by forge-fuse from log_softmax + nll_loss and
// their gradients): the softmax is never materialized, and its gradient is
// one pass over the logits.
def Forge_CrossEntropyOp : Forge_GradOp<"cross_entropy", "SoftmaxCrossEntropyLoss", FusionReduction, PrecisionKeepFP32> {
  let summary = "Per row: -log_softmax(logits)[target] and the log-sum-exp";
  let description = [{
    logits [N, C], target [N] (integer classes in [0, C), else a fault).
    lse[n] = log(sum_c exp(logits[n, c])) and loss[n] = lse[n] -
    logits[n, target[n]]: one row kernel that reads the logits and writes two
    [N] vectors, never the [N, C] log-softmax. A mean or sum over the rows is
    a reduce op after it.

    `classes` (optional, at most C): only the first `classes` columns of each
    row are logits (a row padded for aligned GEMMs, forge-pad-contractions)
    and targets must lie in [0, classes).
  }];
  let arguments = (ins AnyForgeTensor:$logits, TensorOf<[I32, I64]>:$target,
                       OptionalAttr<I64Attr>:$classes);
  let results = (outs AnyForgeTensor:$loss, AnyForgeTensor:$lse);
  let assemblyFormat = "$logits `,` $target attr-dict `:` functional-type(operands, results)";
  let extraDecl = [{ ::mlir::forge::OpCost computeCost(); }];
}

def Forge_CrossEntropyGradOp : Forge_GradOp<"cross_entropy_grad", "SoftmaxCrossEntropyLoss", FusionReduction, PrecisionKeepFP32> {
  let summary = "Gradient of cross_entropy w.r.t. its logits: g[n] * (softmax - one_hot(target))";
  let description = [{
    d[n, c] = g[n] * (exp(logits[n, c] - lse[n]) - (c == target[n])) with
    g[n] = grad_output[n] (reduction none), grad_output (sum) or
    grad_output / N (mean). With `classes` (as cross_entropy's), the columns
    from `classes` on are padding and their gradient is exactly zero.
  }];
  let arguments = (ins AnyForgeTensor:$logits, AnyForgeTensor:$lse,
                       TensorOf<[I32, I64]>:$target, AnyForgeTensor:$grad_output,
                       StrAttr:$reduction, OptionalAttr<I64Attr>:$classes);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$logits `,` $lse `,` $target `,` $grad_output attr-dict `:` functional-type(operands, results)";
  let flopsPerElement = 4;
}

def Forge_CrossEntropyWithGradOp : Forge_GradOp<"cross_entropy_with_grad", "SoftmaxCrossEntropyLoss", FusionReduction, PrecisionKeepFP32> {
  let summary = "cross_entropy and cross_entropy_grad in one pass over the logits";
  let description = [{
    loss[n] = lse[n] - logits[n, target[n]] as cross_entropy, and
    result[n, c] = g[n] * (exp(logits[n, c] - lse[n]) - (c == target[n])) as
    cross_entropy_grad, with g from `grad_output` and `reduction` as there.
    Legal only where grad_output does not depend on the loss (the backward
    pass's seed: 1/K, a loss scale). One row kernel computes a row's
    statistics and then its gradient, so the logits are read from memory once
    (the second read of a row hits L2) instead of once by each of two
    kernels; lse is never stored. Formed by forge-merge-cross-entropy-grad
    after the loss head's chunking. `classes` as cross_entropy's.
  }];
  let arguments = (ins AnyForgeTensor:$logits, TensorOf<[I32, I64]>:$target,
                       AnyForgeTensor:$grad_output, StrAttr:$reduction,
                       OptionalAttr<I64Attr>:$classes);
  let results = (outs AnyForgeTensor:$loss, AnyForgeTensor:$result);
  let assemblyFormat = "$logits `,` $target `,` $grad_output attr-dict `:` functional-type(operands, results)";
  let extraDecl = [{ ::mlir::forge::OpCost computeCost(); }];
}

def Forge_LinearCrossEntropyWithGradOp : Forge_GradOp<"linear_cross_entropy_with_grad", "SoftmaxCrossEntropyLoss", FusionLibrary, PrecisionKeepFP32> {
  let summary = "cross_entropy_with_grad of the logits x w^T, which are never stored";
  let description = [{
    cross_entropy_with_grad(matmul(x, w, transB), target, grad_output): with
    logits[n, c] = sum_k x[n, k] w[c, k] (accumulated in f32),
    loss[n] = lse[n] - logits[n, target[n]] and
    result[n, c] = g[n] * (exp(logits[n, c] - lse[n]) - (c == target[n])),
    g and `reduction` as cross_entropy_grad's; columns from `classes` on are
    padding (no logit, a zero gradient). Formed on CUDA sm_90 by
    forge-fuse-linear-cross-entropy from a matmul whose one reader is a
    cross_entropy_with_grad with a 2-byte gradient: the runtime's CUTLASS GEMM
    writes each logit's exp(x - m) in f16 (m the maximum of its row's 128
    columns) and the (m, sum) pairs, and a streaming kernel makes lse, the loss
    and the gradient from them (runtime/lib/cuda/LinearCrossEntropy.h), so the
    f32 logits never reach memory. The CPU kernel computes the logits in double.
  }];
  let arguments = (ins AnyForgeTensor:$x, AnyForgeTensor:$w, TensorOf<[I32, I64]>:$target,
                       AnyForgeTensor:$grad_output, StrAttr:$reduction,
                       OptionalAttr<I64Attr>:$classes);
  let results = (outs AnyForgeTensor:$loss, AnyForgeTensor:$result);
  let assemblyFormat = "$x `,` $w `,` $target `,` $grad_output attr-dict `:` functional-type(operands, results)";
  let extraDecl = [{ ::mlir::forge::OpCost computeCost(); }];
}

def Forge_NllLossGradOp : Forge_GradOp<"nll_loss_grad", "NegativeLogLikelihoodLoss", FusionReduction, PrecisionKeepFP32> {
  let summary = "Gradient of nll_loss w.r.t. its input [N, num_classes, ...]";
  let description = [{
    dx[n, target, d] = -weight[target] * dy (dy[n, d] for reduction none, the
    scalar dy otherwise, divided by the total weight of the targets not ignored
    for mean); zero elsewhere and at ignored targets.
  }];
  let arguments = (ins AnyForgeTensor:$grad_output, TensorOf<[I32, I64]>:$target,
                       Optional<AnyForgeTensor>:$weight, StrAttr:$reduction,
                       OptionalAttr<I64Attr>:$ignore_index, I64Attr:$num_classes);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$grad_output `,` $target (`,` $weight^)? attr-dict `:` functional-type(operands, results)";
}

//===----------------------------------------------------------------------===//
// Data movement (scatters into zeros)
//===----------------------------------------------------------------------===//

def Forge_GatherGradOp : Forge_GradOp<"gather_grad", "Gather", FusionShape, PrecisionFollowsInput> {
  let summary = "Scatter-add grad_output into zeros of `input_shape` along `axis`";
  let arguments = (ins AnyForgeTensor:$grad_output, TensorOf<[I32, I64]>:$indices,
                       I64Attr:$axis, DenseI64ArrayAttr:$input_shape);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$grad_output `,` $indices attr-dict `:` functional-type(operands, results)";
}

def Forge_GatherElementsGradOp : Forge_GradOp<"gather_elements_grad", "GatherElements", FusionShape, PrecisionFollowsInput> {
  let summary = "Scatter-add of gather_elements' gradient into zeros of `input_shape`";
  let arguments = (ins AnyForgeTensor:$grad_output, TensorOf<[I32, I64]>:$indices,
                       I64Attr:$axis, DenseI64ArrayAttr:$input_shape);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$grad_output `,` $indices attr-dict `:` functional-type(operands, results)";
}

def Forge_SliceGradOp : Forge_GradOp<"slice_grad", "Slice", FusionShape, PrecisionFollowsInput> {
  let summary = "Strided insert of grad_output into zeros of `input_shape`";
  let description = [{
    starts/ends/steps are the forward slice's (normalized as in forge.slice).
    Unit-step slices get their gradient from forge.pad instead.
  }];
  let arguments = (ins AnyForgeTensor:$grad_output, DenseI64ArrayAttr:$input_shape,
                       DenseI64ArrayAttr:$starts, DenseI64ArrayAttr:$ends,
                       DenseI64ArrayAttr:$steps);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$grad_output attr-dict `:` functional-type(operands, results)";
}

def Forge_PadGradOp : Forge_GradOp<"pad_grad", "Pad", FusionShape, PrecisionFollowsInput> {
  let summary = "Gradient of pad: every output position adds into the input it copied";
  let description = [{
    `pads`/`mode` are the forward pad's; the result has the forward input's
    shape (grad_output's shape minus the pads). Constant-mode pads get their
    gradient from slice/pad instead; reflect and edge copies accumulate.
  }];
  let arguments = (ins AnyForgeTensor:$grad_output, DenseI64ArrayAttr:$pads, StrAttr:$mode);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$grad_output attr-dict `:` functional-type(operands, results)";
}

#endif // FORGE_DIALECT_FORGEGRADOPS_TD
