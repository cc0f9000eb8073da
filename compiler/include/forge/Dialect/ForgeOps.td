//===- ForgeOps.td - the forge op table ------------------------------------===//
//
// Conventions shared with the runtime (runtime/lib/cpu kernels read these
// attributes by name; the bundle writer copies them verbatim):
//   * binary elementwise ops broadcast NumPy-style;
//   * axes, perms and per-dimension lists are normalized at import: non-negative,
//     full length where the op needs one entry per dimension;
//   * float attributes are F64Attr, integer ones I64Attr, flags BoolAttr;
//   * spatial ops use NC[D]HW layout; `pads` holds all begin pads then all end pads.
//
//===----------------------------------------------------------------------===//

#ifndef FORGE_DIALECT_FORGEOPS_TD
#define FORGE_DIALECT_FORGEOPS_TD

include "forge/Dialect/ForgeBase.td"
include "mlir/IR/BuiltinAttributes.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

// Shared type inference helpers live in ForgeOps.cpp; the classes below route
// their InferTypeOpAdaptor hook to them.
class Forge_BinaryOp<string mnemonic, string onnx, bit diff = 1, int flops = 1,
                     list<Trait> traits = [], dag attrs = (ins)>
    : Forge_Op<mnemonic, onnx, FusionElementwise, PrecisionFollowsInput, diff, traits> {
  let arguments = !con((ins AnyForgeTensor:$lhs, AnyForgeTensor:$rhs), attrs);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` functional-type(operands, results)";
  let flopsPerElement = flops;
  let extraClassDefinition = [{
    ::llvm::LogicalResult $cppClass::inferReturnTypes(::mlir::MLIRContext *context,
        std::optional<::mlir::Location> location, Adaptor adaptor,
        ::llvm::SmallVectorImpl<::mlir::Type> &inferred) {
      return ::mlir::forge::inferBroadcastType(location, adaptor.getOperands(),
                                               /*resultElement=*/nullptr, inferred);
    }
  }];
}

class Forge_CompareOp<string mnemonic, string onnx>
    : Forge_Op<mnemonic, onnx, FusionElementwise, PrecisionFollowsInput, 0> {
  let arguments = (ins AnyForgeTensor:$lhs, AnyForgeTensor:$rhs);
  let results = (outs TensorOf<[I1]>:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` functional-type(operands, results)";
  let extraClassDefinition = [{
    ::llvm::LogicalResult $cppClass::inferReturnTypes(::mlir::MLIRContext *context,
        std::optional<::mlir::Location> location, Adaptor adaptor,
        ::llvm::SmallVectorImpl<::mlir::Type> &inferred) {
      return ::mlir::forge::inferBroadcastType(location, adaptor.getOperands(),
                                               ::mlir::IntegerType::get(context, 1), inferred);
    }
  }];
}

class Forge_UnaryOp<string mnemonic, string onnx, bit diff = 1, int flops = 1,
                    dag attrs = (ins)>
    : Forge_Op<mnemonic, onnx, FusionElementwise, PrecisionFollowsInput, diff> {
  let arguments = !con((ins AnyForgeTensor:$input), attrs);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let flopsPerElement = flops;
  let extraClassDefinition = [{
    ::llvm::LogicalResult $cppClass::inferReturnTypes(::mlir::MLIRContext *context,
        std::optional<::mlir::Location> location, Adaptor adaptor,
        ::llvm::SmallVectorImpl<::mlir::Type> &inferred) {
      inferred.push_back(adaptor.getInput().getType());
      return ::mlir::success();
    }
  }];
}

def Forge_AddOp : Forge_BinaryOp<"add", "Add,Sum", 1, 1, [Commutative]>;
def Forge_SubOp : Forge_BinaryOp<"sub", "Sub">;
def Forge_MulOp : Forge_BinaryOp<"mul", "Mul", 1, 1, [Commutative]>;
def Forge_DivOp : Forge_BinaryOp<"div", "Div,Mean">;
def Forge_PowOp : Forge_BinaryOp<"pow", "Pow", 1, 8>;
def Forge_MinOp : Forge_BinaryOp<"min", "Min", 1, 1, [Commutative]>;
def Forge_MaxOp : Forge_BinaryOp<"max", "Max", 1, 1, [Commutative]>;
def Forge_AndOp : Forge_BinaryOp<"and", "And", 0, 1, [Commutative]>;
def Forge_OrOp : Forge_BinaryOp<"or", "Or", 0, 1, [Commutative]>;
def Forge_XorOp : Forge_BinaryOp<"xor", "Xor", 0, 1, [Commutative]>;
// `fmod`: the result takes the dividend's sign (C fmod, truncated quotient);
// otherwise the divisor's (Python %, floored quotient).
def Forge_ModOp : Forge_BinaryOp<"mod", "Mod", 1, 2, [], (ins BoolAttr:$fmod)>;
// Integer operands only (bit_shift: unsigned, as in ONNX).
def Forge_BitwiseAndOp : Forge_BinaryOp<"bitwise_and", "BitwiseAnd", 0, 1, [Commutative]> {
  let opsetMin = 18;
}
def Forge_BitwiseOrOp : Forge_BinaryOp<"bitwise_or", "BitwiseOr", 0, 1, [Commutative]> {
  let opsetMin = 18;
}
def Forge_BitwiseXorOp : Forge_BinaryOp<"bitwise_xor", "BitwiseXor", 0, 1, [Commutative]> {
  let opsetMin = 18;
}
// `direction`: "LEFT" or "RIGHT"; shifts by the bit width or more give 0.
def Forge_BitShiftOp : Forge_BinaryOp<"bit_shift", "BitShift", 0, 1, [],
                                      (ins StrAttr:$direction)>;

def Forge_EqualOp : Forge_CompareOp<"equal", "Equal">;
def Forge_LessOp : Forge_CompareOp<"less", "Less">;
def Forge_GreaterOp : Forge_CompareOp<"greater", "Greater">;
def Forge_LessEqualOp : Forge_CompareOp<"less_equal", "LessOrEqual">;
def Forge_GreaterEqualOp : Forge_CompareOp<"greater_equal", "GreaterOrEqual">;

def Forge_NegOp : Forge_UnaryOp<"neg", "Neg">;
def Forge_AbsOp : Forge_UnaryOp<"abs", "Abs">;
def Forge_ExpOp : Forge_UnaryOp<"exp", "Exp", 1, 8>;
def Forge_LogOp : Forge_UnaryOp<"log", "Log", 1, 8>;
def Forge_SqrtOp : Forge_UnaryOp<"sqrt", "Sqrt", 1, 4>;
def Forge_ReciprocalOp : Forge_UnaryOp<"reciprocal", "Reciprocal", 1, 4>;
def Forge_TanhOp : Forge_UnaryOp<"tanh", "Tanh", 1, 8>;
def Forge_SigmoidOp : Forge_UnaryOp<"sigmoid", "Sigmoid", 1, 8>;
def Forge_ReluOp : Forge_UnaryOp<"relu", "Relu">;
def Forge_ErfOp : Forge_UnaryOp<"erf", "Erf", 1, 8>;
def Forge_SoftplusOp : Forge_UnaryOp<"softplus", "Softplus", 1, 16>;
def Forge_HardSwishOp : Forge_UnaryOp<"hard_swish", "HardSwish", 1, 4>;
def Forge_NotOp : Forge_UnaryOp<"not", "Not", 0>;
// Integer-valued steps: zero gradient almost everywhere, so not differentiable
// (no gradient flows through them, as in PyTorch). Round is half to even.
def Forge_FloorOp : Forge_UnaryOp<"floor", "Floor", 0>;
def Forge_CeilOp : Forge_UnaryOp<"ceil", "Ceil", 0>;
def Forge_RoundOp : Forge_UnaryOp<"round", "Round", 0>;
def Forge_BitwiseNotOp : Forge_UnaryOp<"bitwise_not", "BitwiseNot", 0> {
  let opsetMin = 18;
}
def Forge_SinOp : Forge_UnaryOp<"sin", "Sin", 1, 8>;
def Forge_CosOp : Forge_UnaryOp<"cos", "Cos", 1, 8>;
def Forge_TanOp : Forge_UnaryOp<"tan", "Tan", 1, 8>;
def Forge_AsinOp : Forge_UnaryOp<"asin", "Asin", 1, 8>;
def Forge_AcosOp : Forge_UnaryOp<"acos", "Acos", 1, 8>;
def Forge_AtanOp : Forge_UnaryOp<"atan", "Atan", 1, 8>;
def Forge_SinhOp : Forge_UnaryOp<"sinh", "Sinh", 1, 8>;
def Forge_CoshOp : Forge_UnaryOp<"cosh", "Cosh", 1, 8>;
def Forge_AsinhOp : Forge_UnaryOp<"asinh", "Asinh", 1, 8>;
def Forge_AcoshOp : Forge_UnaryOp<"acosh", "Acosh", 1, 8>;
def Forge_AtanhOp : Forge_UnaryOp<"atanh", "Atanh", 1, 8>;
def Forge_LeakyReluOp : Forge_UnaryOp<"leaky_relu", "LeakyRelu", 1, 2, (ins F64Attr:$alpha)>;
def Forge_EluOp : Forge_UnaryOp<"elu", "Elu", 1, 8, (ins F64Attr:$alpha)>;
def Forge_SeluOp : Forge_UnaryOp<"selu", "Selu", 1, 8, (ins F64Attr:$alpha, F64Attr:$gamma)>;
def Forge_ThresholdedReluOp : Forge_UnaryOp<"thresholded_relu", "ThresholdedRelu", 1, 1,
                                            (ins F64Attr:$alpha)>;
def Forge_GeluOp : Forge_UnaryOp<"gelu", "Gelu", 1, 16, (ins StrAttr:$approximate)> {
  let opsetMin = 20;
}
def Forge_HardSigmoidOp : Forge_UnaryOp<"hard_sigmoid", "HardSigmoid", 1, 3,
                                        (ins F64Attr:$alpha, F64Attr:$beta)>;
def Forge_ClipOp : Forge_UnaryOp<"clip", "Clip", 1, 2, (ins F64Attr:$min, F64Attr:$max)>;

def Forge_IsNaNOp : Forge_Op<"isnan", "IsNaN", FusionElementwise, PrecisionFollowsInput, 0> {
  let arguments = (ins AnyForgeTensor:$input);
  let results = (outs TensorOf<[I1]>:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
}

def Forge_IsInfOp : Forge_Op<"isinf", "IsInf", FusionElementwise, PrecisionFollowsInput, 0> {
  let arguments = (ins AnyForgeTensor:$input, BoolAttr:$detect_positive,
                       BoolAttr:$detect_negative);
  let results = (outs TensorOf<[I1]>:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
}

def Forge_CastOp : Forge_Op<"cast", "Cast", FusionElementwise, PrecisionFollowsInput, 1> {
  let summary = "Element type conversion (gradient flows between float types only)";
  let description = [{
    `saturate` (ONNX Cast-19) applies to float8 targets only: out-of-range
    values become +-max instead of NaN (E4M3FN) or infinity (E5M2).
  }];
  let arguments = (ins AnyForgeTensor:$input, TypeAttr:$to,
                       DefaultValuedAttr<BoolAttr, "true">:$saturate);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasFolder = 1;
}

def Forge_WhereOp : Forge_Op<"where", "Where", FusionElementwise, PrecisionFollowsInput, 1> {
  let arguments = (ins TensorOf<[I1]>:$condition, AnyForgeTensor:$x, AnyForgeTensor:$y);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$condition `,` $x `,` $y attr-dict `:` functional-type(operands, results)";
}

//===----------------------------------------------------------------------===//
// Library-class ops (cuBLASLt / cuDNN on GPU, OpenBLAS on CPU)
//===----------------------------------------------------------------------===//

def Forge_MatMulOp : Forge_Op<"matmul", "MatMul,Einsum", FusionLibrary, PrecisionTensorCore, 1> {
  let summary = "NumPy matmul: batched, broadcast over leading dims, 1-D operands promoted";
  let description = [{
    `transA` / `transB`: the operand's last two dims are swapped first (for
    operands of rank >= 2). The importer never sets them; canonicalization
    folds transposes of the last two dims into them, so a GEMM reads the
    operand in place (cuBLASLt's op flags) instead of a materialized copy.
  }];
  let arguments = (ins AnyForgeTensor:$lhs, AnyForgeTensor:$rhs,
                       DefaultValuedAttr<BoolAttr, "false">:$transA,
                       DefaultValuedAttr<BoolAttr, "false">:$transB);
  let hasCanonicalizer = 1;
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` functional-type(operands, results)";
  let extraDecl = [{ ::mlir::forge::OpCost computeCost(); }];
}

def Forge_GemmOp : Forge_Op<"gemm", "Gemm", FusionLibrary, PrecisionTensorCore, 1> {
  let summary = "alpha * op(A) * op(B) + beta * C, with C broadcast to [M, N]";
  let arguments = (ins AnyForgeTensor:$a, AnyForgeTensor:$b, Optional<AnyForgeTensor>:$c,
                       BoolAttr:$transA, BoolAttr:$transB, F64Attr:$alpha, F64Attr:$beta);
  let results = (outs AnyForgeTensor:$result);
  let hasCanonicalizer = 1;
  let assemblyFormat = "$a `,` $b (`,` $c^)? attr-dict `:` functional-type(operands, results)";
  let extraDecl = [{ ::mlir::forge::OpCost computeCost(); }];
}

// Made by forge-assign-precision (precision=fp8) from the forward's Gemm and
// MatMul only; no gradient rule (it appears after autodiff).
def Forge_ScaledGemmOp : Forge_Op<"scaled_gemm", "Gemm,MatMul", FusionLibrary, PrecisionTensorCore, 0> {
  let summary = "alpha * (a_scale * op(A)) * (b_scale * op(B)) + beta * C, float8 A and B";
  let description = [{
    A float8 GEMM with per-tensor dequantization: `a` and `b` are float8
    (E4M3FN or E5M2) matrices, `a_scale` and `b_scale` f32 scalars that each
    multiplies its operand's decoded values. C as in forge.gemm. cuBLASLt
    runs it with the scales as its A/B scale pointers (Hopper and Ada take
    float8 only with both operands K-major: transA false, transB true).
  }];
  let arguments = (ins AnyForgeTensor:$a, AnyForgeTensor:$b, AnyForgeTensor:$a_scale,
                       AnyForgeTensor:$b_scale, Optional<AnyForgeTensor>:$c,
                       BoolAttr:$transA, BoolAttr:$transB, F64Attr:$alpha, F64Attr:$beta);
  let results = (outs AnyForgeTensor:$result);
  let hasVerifier = 1;
  let assemblyFormat = "$a `,` $b `,` $a_scale `,` $b_scale (`,` $c^)? attr-dict `:` functional-type(operands, results)";
  let extraDecl = [{ ::mlir::forge::OpCost computeCost(); }];
}

def Forge_ConvOp : Forge_Op<"conv", "Conv", FusionLibrary, PrecisionTensorCore, 1> {
  let summary = "N-d grouped convolution, NC[D]HW (or N[D]HWC), explicit pads (auto_pad resolved)";
  let description = [{
    With `channels_last` (set by forge-layout) the input and result are
    [N, spatial..., C] and the weight [M, k..., C/group]; the attributes keep
    their meaning (per spatial dim, in order).
  }];
  let arguments = (ins AnyForgeTensor:$input, AnyForgeTensor:$weight,
                       Optional<AnyForgeTensor>:$bias, DenseI64ArrayAttr:$strides,
                       DenseI64ArrayAttr:$pads, DenseI64ArrayAttr:$dilations, I64Attr:$group,
                       DefaultValuedAttr<BoolAttr, "false">:$channels_last);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input `,` $weight (`,` $bias^)? attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
  let extraDecl = [{ ::mlir::forge::OpCost computeCost(); }];
}

def Forge_ConvTransposeOp : Forge_Op<"conv_transpose", "ConvTranspose", FusionLibrary, PrecisionTensorCore, 1> {
  let summary = "N-d grouped transposed convolution; output_shape resolved into pads";
  let description = [{
    With `channels_last` the input and result are [N, spatial..., C] and the
    weight [C, k..., M/group].
  }];
  let arguments = (ins AnyForgeTensor:$input, AnyForgeTensor:$weight,
                       Optional<AnyForgeTensor>:$bias, DenseI64ArrayAttr:$strides,
                       DenseI64ArrayAttr:$pads, DenseI64ArrayAttr:$dilations,
                       DenseI64ArrayAttr:$output_padding, I64Attr:$group,
                       DefaultValuedAttr<BoolAttr, "false">:$channels_last);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input `,` $weight (`,` $bias^)? attr-dict `:` functional-type(operands, results)";
  let extraDecl = [{ ::mlir::forge::OpCost computeCost(); }];
}

// Pools are window reductions, generated kernels on every target (not library
// calls: cuDNN's pooling is not used, design notes "CUDA backend").
def Forge_MaxPoolOp : Forge_Op<"max_pool", "MaxPool", FusionReduction, PrecisionFollowsInput, 1> {
  let summary = "N-d max pooling, NC[D]HW (or N[D]HWC with `channels_last`, set by forge-assign-layout)";
  let arguments = (ins AnyForgeTensor:$input, DenseI64ArrayAttr:$kernel_shape,
                       DenseI64ArrayAttr:$strides, DenseI64ArrayAttr:$pads,
                       DenseI64ArrayAttr:$dilations, BoolAttr:$ceil_mode,
                       DefaultValuedAttr<BoolAttr, "false">:$channels_last);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
}

def Forge_AvgPoolOp : Forge_Op<"avg_pool", "AveragePool,GlobalAveragePool", FusionReduction, PrecisionFollowsInput, 1> {
  let arguments = (ins AnyForgeTensor:$input, DenseI64ArrayAttr:$kernel_shape,
                       DenseI64ArrayAttr:$strides, DenseI64ArrayAttr:$pads,
                       DenseI64ArrayAttr:$dilations, BoolAttr:$ceil_mode,
                       BoolAttr:$count_include_pad);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
}

//===----------------------------------------------------------------------===//
// Normalizations and softmax (fused reductions; math stays in fp32)
//===----------------------------------------------------------------------===//

def Forge_BatchNormOp : Forge_Op<"batch_norm", "BatchNormalization", FusionReduction, PrecisionKeepFP32, 1> {
  let summary = "Inference-mode batch normalization over channel dim 1";
  let description = [{
    `momentum` (ONNX semantics: running = running * momentum + batch * (1 -
    momentum)) is unused here; it is kept so that the training graph, which
    turns this op into batch_norm_training, updates the running statistics the
    way the model was defined.
  }];
  let arguments = (ins AnyForgeTensor:$input, AnyForgeTensor:$scale, AnyForgeTensor:$bias,
                       AnyForgeTensor:$mean, AnyForgeTensor:$var, F64Attr:$epsilon,
                       DefaultValuedAttr<F64Attr, "0.9">:$momentum);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input `,` $scale `,` $bias `,` $mean `,` $var attr-dict `:` functional-type(operands, results)";
  let flopsPerElement = 4;
}

def Forge_BatchNormTrainingOp : Forge_Op<"batch_norm_training", "BatchNormalization", FusionReduction, PrecisionKeepFP32, 1> {
  let summary = "Training-mode batch normalization: batch statistics, updated running stats";
  let description = [{
    Normalizes with the batch's mean and biased variance. The running variance
    is updated from the biased batch variance (ONNX's rule) or, with
    `unbiased_var`, from the unbiased one, M / (M - 1) times it for M values
    per channel (PyTorch's rule).
  }];
  let arguments = (ins AnyForgeTensor:$input, AnyForgeTensor:$scale, AnyForgeTensor:$bias,
                       AnyForgeTensor:$running_mean, AnyForgeTensor:$running_var,
                       F64Attr:$epsilon, F64Attr:$momentum,
                       DefaultValuedAttr<BoolAttr, "false">:$unbiased_var);
  let results = (outs AnyForgeTensor:$result, AnyForgeTensor:$new_running_mean,
                      AnyForgeTensor:$new_running_var);
  let assemblyFormat = "$input `,` $scale `,` $bias `,` $running_mean `,` $running_var attr-dict `:` functional-type(operands, results)";
  let flopsPerElement = 8;
}

def Forge_LayerNormOp : Forge_Op<"layer_norm", "LayerNormalization", FusionReduction, PrecisionKeepFP32, 1> {
  let summary = "Normalize over dims [axis, rank); scale/bias broadcast over those dims";
  let arguments = (ins AnyForgeTensor:$input, AnyForgeTensor:$scale,
                       Optional<AnyForgeTensor>:$bias, I64Attr:$axis, F64Attr:$epsilon);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input `,` $scale (`,` $bias^)? attr-dict `:` functional-type(operands, results)";
  let flopsPerElement = 8;
  let opsetMin = 17;
}

def Forge_GroupNormOp : Forge_Op<"group_norm", "GroupNormalization,InstanceNormalization", FusionReduction, PrecisionKeepFP32, 1> {
  let summary = "Group normalization (per-channel scale and bias of shape [C])";
  let arguments = (ins AnyForgeTensor:$input, AnyForgeTensor:$scale, AnyForgeTensor:$bias,
                       I64Attr:$num_groups, F64Attr:$epsilon);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input `,` $scale `,` $bias attr-dict `:` functional-type(operands, results)";
  let flopsPerElement = 8;
}

// One op for what exporters spell as matmul, scale, mask, softmax, matmul
// (forge-recognize-composites) and for ONNX Attention: its own gradient rule,
// and one fused kernel (cuDNN's flash attention) where the T x T scores are
// never stored. forge-decompose-attention expands it back into those ops where
// the target has no fused kernel for its form.
def Forge_AttentionOp : Forge_Op<"attention", "Attention", FusionLibrary, PrecisionTensorCore, 1> {
  let summary = "softmax(scale q k^T [causal]) v and each row's log-sum-exp";
  let description = [{
    q [B, H, Tq, D], k [B, Hk, Tk, D], v [B, Hk, Tk, Dv] with H % Hk == 0:
    query head h reads key/value head h / (H / Hk) (GQA, MQA). `causal`: key j
    is visible to query i iff j <= i (the top-left diagonal). Results: o
    [B, H, Tq, Dv] in q's type, and lse [B, H, Tq] f32 (f64 beside f64 q), the natural-log
    log-sum-exp of each row of scaled, masked scores, from which the backward
    recomputes the probabilities. `layout` "bshd" means q, k, v and o are
    [B, T, H, D] instead (the exporters' tensors before their head transposes,
    which canonicalization folds in; cuDNN reads them strided); lse is
    [B, H, Tq] in both. `bias` (optional, q's type) is added to the scaled
    scores before the causal mask and the softmax: an additive or padding
    mask (-inf or a large negative where a key is hidden), [B, H, Tq, Tk] with
    any dims 1 (broadcast) in both layouts. It has no gradient: the op is
    formed only where nothing trainable reaches it (forge-recognize-composites).
    A row whose every score is -inf (all keys masked) gives o = 0 and
    lse = -inf, and no gradient (what the exporters' NaN guard after the
    softmax, where(isnan(p), 0, p), makes of it).
  }];
  let arguments = (ins AnyForgeTensor:$q, AnyForgeTensor:$k, AnyForgeTensor:$v,
                       Optional<AnyForgeTensor>:$bias,
                       F64Attr:$scale, BoolAttr:$causal,
                       DefaultValuedAttr<StrAttr, "\"bhsd\"">:$layout);
  let results = (outs AnyForgeTensor:$o, AnyForgeTensor:$lse);
  let assemblyFormat = "$q `,` $k `,` $v (`,` $bias^)? attr-dict `:` functional-type(operands, results)";
  let hasCanonicalizer = 1;
  let opsetMin = 23;
  let opsetMax = 23;
  let extraDecl = [{ ::mlir::forge::OpCost computeCost(); }];
}

def Forge_SoftmaxOp : Forge_Op<"softmax", "Softmax", FusionReduction, PrecisionKeepFP32, 1> {
  let arguments = (ins AnyForgeTensor:$input, I64Attr:$axis);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let flopsPerElement = 10;
}

def Forge_LogSoftmaxOp : Forge_Op<"log_softmax", "LogSoftmax,SoftmaxCrossEntropyLoss", FusionReduction, PrecisionKeepFP32, 1> {
  let arguments = (ins AnyForgeTensor:$input, I64Attr:$axis);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let flopsPerElement = 10;
}

def Forge_NllLossOp : Forge_Op<"nll_loss", "NegativeLogLikelihoodLoss,SoftmaxCrossEntropyLoss", FusionReduction, PrecisionKeepFP32, 1> {
  let summary = "Negative log-likelihood over class dim 1; reduction none|sum|mean";
  let arguments = (ins AnyForgeTensor:$input, AnyForgeTensor:$target,
                       Optional<AnyForgeTensor>:$weight, StrAttr:$reduction,
                       OptionalAttr<I64Attr>:$ignore_index);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input `,` $target (`,` $weight^)? attr-dict `:` functional-type(operands, results)";
}

//===----------------------------------------------------------------------===//
// Reductions and scans
//===----------------------------------------------------------------------===//

class Forge_ReduceOp<string mnemonic, string onnx, bit diff = 1>
    : Forge_Op<mnemonic, onnx, FusionReduction, PrecisionKeepFP32, diff> {
  let summary = "Reduce over sorted non-negative `axes` (never empty after import)";
  let description = [{
    `zero_outputs` = [begin, end), set by forge-elide-centred-sums on a sum alone:
    the result's elements begin..end-1 (row-major) are 0 whatever the input (in
    exact arithmetic the input's values there sum to 0), so kernels write 0 there
    (the CPU kernel too, so both give the same bits) and the split column-layout
    kernel does not read them.
  }];
  let arguments = (ins AnyForgeTensor:$input, DenseI64ArrayAttr:$axes, BoolAttr:$keepdims,
                       OptionalAttr<DenseI64ArrayAttr>:$zero_outputs);
  let results = (outs AnyForgeTensor:$result);
  // Without zero_outputs (the generated builders take it last, with no default).
  let builders = [
    OpBuilder<(ins "::mlir::Value":$input, "::mlir::DenseI64ArrayAttr":$axes,
                   "::mlir::BoolAttr":$keepdims),
      [{ build($_builder, $_state, input, axes, keepdims, ::mlir::DenseI64ArrayAttr()); }]>,
    OpBuilder<(ins "::mlir::Type":$result, "::mlir::Value":$input,
                   "::mlir::DenseI64ArrayAttr":$axes, "::mlir::BoolAttr":$keepdims),
      [{ build($_builder, $_state, result, input, axes, keepdims, ::mlir::DenseI64ArrayAttr()); }]>,
    OpBuilder<(ins "::mlir::Value":$input, "::llvm::ArrayRef<int64_t>":$axes, "bool":$keepdims),
      [{ build($_builder, $_state, input, axes, keepdims, ::mlir::DenseI64ArrayAttr()); }]>,
    OpBuilder<(ins "::mlir::Type":$result, "::mlir::Value":$input,
                   "::llvm::ArrayRef<int64_t>":$axes, "bool":$keepdims),
      [{ build($_builder, $_state, result, input, axes, keepdims, ::mlir::DenseI64ArrayAttr()); }]>
  ];
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let extraClassDefinition = [{
    ::llvm::LogicalResult $cppClass::inferReturnTypes(::mlir::MLIRContext *context,
        std::optional<::mlir::Location> location, Adaptor adaptor,
        ::llvm::SmallVectorImpl<::mlir::Type> &inferred) {
      if (::mlir::failed(::mlir::forge::inferReduceType(location, adaptor.getInput().getType(),
              adaptor.getAxes(), adaptor.getKeepdims(), nullptr, inferred)))
        return ::mlir::failure();
      return ::mlir::forge::checkZeroOutputs(location, adaptor.getZeroOutputs(), inferred[0]);
    }
  }];
}

def Forge_ReduceSumOp : Forge_ReduceOp<"reduce_sum", "ReduceSum,GlobalAveragePool">;
def Forge_ReduceMeanOp : Forge_ReduceOp<"reduce_mean", "ReduceMean,GlobalAveragePool">;
def Forge_ReduceMaxOp : Forge_ReduceOp<"reduce_max", "ReduceMax">;
def Forge_ReduceMinOp : Forge_ReduceOp<"reduce_min", "ReduceMin">;
def Forge_ReduceProdOp : Forge_ReduceOp<"reduce_prod", "ReduceProd">;
def Forge_ReduceL2Op : Forge_ReduceOp<"reduce_l2", "ReduceL2">;

def Forge_ArgMaxOp : Forge_Op<"argmax", "ArgMax", FusionReduction, PrecisionKeepFP32, 0> {
  let arguments = (ins AnyForgeTensor:$input, I64Attr:$axis, BoolAttr:$keepdims,
                       BoolAttr:$select_last_index);
  let results = (outs TensorOf<[I64]>:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
}

def Forge_TopKOp : Forge_Op<"top_k", "TopK", FusionOpaque, PrecisionFollowsInput, 1> {
  let summary = "The k largest (or smallest) elements along `axis` and their indices";
  let description = [{
    Along `axis`, the elements in the order largest first (or smallest first),
    ties by the lower index; the first `k` of that order are `values` and
    their positions along the axis `indices`. NaN counts as larger than every
    number and equal to NaN (onnx's reference: NumPy sorts NaN last, and
    largest flips that order), so NaNs come first for largest and last for
    smallest. `sorted` = false allows any order; Forge returns the sorted one.
    Gradient: the values' cotangent scattered to `indices` along `axis`.
  }];
  let arguments = (ins AnyForgeTensor:$input, I64Attr:$axis, I64Attr:$k, BoolAttr:$largest,
                       BoolAttr:$sorted);
  let results = (outs AnyForgeTensor:$values, TensorOf<[I64]>:$indices);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let opsetMin = 1;
}

def Forge_CumSumOp : Forge_Op<"cumsum", "CumSum", FusionReduction, PrecisionKeepFP32, 1> {
  let arguments = (ins AnyForgeTensor:$input, I64Attr:$axis, BoolAttr:$exclusive,
                       BoolAttr:$reverse);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
}

//===----------------------------------------------------------------------===//
// Data movement (shape class: no arithmetic)
//===----------------------------------------------------------------------===//

def Forge_ConstantOp : Forge_Op<"constant", "Constant,ConstantOfShape,Shape,Size,Range", FusionShape, PrecisionFollowsInput, 0,
                                [ConstantLike]> {
  let arguments = (ins ElementsAttr:$value);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "attr-dict $value";
  let hasFolder = 1;
}

def Forge_ReshapeOp : Forge_Op<"reshape", "Reshape,Flatten,Squeeze,Unsqueeze,Identity,Dropout", FusionShape, PrecisionFollowsInput, 1> {
  let summary = "Reinterpret the elements with a new static shape (`shape` fully resolved)";
  let arguments = (ins AnyForgeTensor:$input, DenseI64ArrayAttr:$shape);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasFolder = 1;
}

def Forge_TransposeOp : Forge_Op<"transpose", "Transpose,Einsum", FusionShape, PrecisionFollowsInput, 1> {
  let arguments = (ins AnyForgeTensor:$input, DenseI64ArrayAttr:$perm);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
  let hasFolder = 1;
  let hasCanonicalizer = 1;
}

def Forge_BroadcastOp : Forge_Op<"broadcast", "Expand", FusionShape, PrecisionFollowsInput, 1> {
  let summary = "NumPy-broadcast the input to `shape`";
  let arguments = (ins AnyForgeTensor:$input, DenseI64ArrayAttr:$shape);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasFolder = 1;
}

def Forge_ConcatOp : Forge_Op<"concat", "Concat", FusionShape, PrecisionFollowsInput, 1> {
  let arguments = (ins Variadic<AnyForgeTensor>:$inputs, I64Attr:$axis);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$inputs attr-dict `:` functional-type(operands, results)";
}

def Forge_SplitOp : Forge_Op<"split", "Split", FusionShape, PrecisionFollowsInput, 1> {
  let arguments = (ins AnyForgeTensor:$input, I64Attr:$axis, DenseI64ArrayAttr:$sizes);
  let results = (outs Variadic<AnyForgeTensor>:$results);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
}

def Forge_SliceOp : Forge_Op<"slice", "Slice", FusionShape, PrecisionFollowsInput, 1> {
  let summary = "Strided slice; starts/ends/steps have one clamped entry per dimension";
  let description = [{
    For step > 0: 0 <= start <= end <= dim. For step < 0: -1 <= end <= start <= dim - 1.
    Result extent per dimension is max(0, ceil((end - start) / step)).
  }];
  let arguments = (ins AnyForgeTensor:$input, DenseI64ArrayAttr:$starts,
                       DenseI64ArrayAttr:$ends, DenseI64ArrayAttr:$steps);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Forge_PadOp : Forge_Op<"pad", "Pad", FusionShape, PrecisionFollowsInput, 1> {
  let summary = "Pad (constant|reflect|edge|wrap); pads = all begins then all ends, may be negative";
  let arguments = (ins AnyForgeTensor:$input, DenseI64ArrayAttr:$pads, StrAttr:$mode,
                       F64Attr:$value);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
}

def Forge_TileOp : Forge_Op<"tile", "Tile", FusionShape, PrecisionFollowsInput, 1> {
  let arguments = (ins AnyForgeTensor:$input, DenseI64ArrayAttr:$repeats);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
}

def Forge_GatherOp : Forge_Op<"gather", "Gather", FusionShape, PrecisionFollowsInput, 1> {
  let summary = "Take along `axis` (negative indices count from the end)";
  let arguments = (ins AnyForgeTensor:$input, TensorOf<[I32, I64]>:$indices, I64Attr:$axis);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input `,` $indices attr-dict `:` functional-type(operands, results)";
}

def Forge_GatherElementsOp : Forge_Op<"gather_elements", "GatherElements", FusionShape, PrecisionFollowsInput, 1> {
  let arguments = (ins AnyForgeTensor:$input, TensorOf<[I32, I64]>:$indices, I64Attr:$axis);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input `,` $indices attr-dict `:` functional-type(operands, results)";
}

def Forge_ScatterElementsOp : Forge_Op<"scatter_elements", "ScatterElements,ScatterND",
                                      FusionShape, PrecisionFollowsInput, 1> {
  let summary = "`input` with `updates` written (or combined) at `indices` along `axis`";
  let description = [{
    result = input; then for every element u of `updates` at position p,
    result[p with p[axis] = indices[p]] = u, or combined with it by
    `reduction` (add, mul, max, min). Indices count from the end when
    negative. With reduction none and repeated indices, which update lands is
    unspecified (ONNX). ScatterND imports as this op on a flattened input.
    Gradients: none and add only (input: the cotangent, zeroed where written
    for none; updates: gather_elements of it).
  }];
  let arguments = (ins AnyForgeTensor:$input, TensorOf<[I32, I64]>:$indices,
                       AnyForgeTensor:$updates, I64Attr:$axis, StrAttr:$reduction);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input `,` $indices `,` $updates attr-dict `:` functional-type(operands, results)";
  let opsetMin = 11;
}

// Trilu and OneHot read the element's index, not only operand elements: not
// pointwise (Elementwise), so loop fusion does not take them.
def Forge_TriluOp : Forge_Op<"trilu", "Trilu", FusionOpaque, PrecisionFollowsInput, 1> {
  let summary = "Keep the upper (or lower) triangle of the last two dims, offset by k";
  let arguments = (ins AnyForgeTensor:$input, BoolAttr:$upper, I64Attr:$k);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
}

def Forge_ResizedCropOp : Forge_Op<"resized_crop", "", FusionOpaque, PrecisionKeepFP32, 0> {
  let summary = "Per-sample crop boxes of u8 images, scaled bilinearly to one size";
  let description = [{
    `canvas` holds B images of 8-bit pixels [B, Hc, Wc, C], image b in its
    top-left imageW x imageH corner; `geometry` [B, 6] f32 gives per sample
    (x0, y0, boxW, boxH, imageW, imageH) in that image's pixels. Result
    [B, height, width, C] f32 (values in [0, 255]): output pixel (x, y) samples
    sx = clamp(x0 + (x + 0.5) * boxW / width - 0.5, 0, imageW - 1) (and so for
    y), bilinear between taps floor(sx) and min(floor(sx) + 1, imageW - 1),
    with f32 weights: top = p00 + (p01 - p00) * fx, then top + (bottom - top)
    * fy. The data pipeline's random-resized and centre crops (forge-train's
    image folders) in the step: forge-augment-inputs makes it (`canvas=HxW`),
    no importer does. imageW/imageH are clamped to [1, Wc]/[1, Hc].
  }];
  let arguments = (ins TensorOf<[UI8]>:$canvas, TensorOf<[F32]>:$geometry, I64Attr:$height,
                       I64Attr:$width);
  // f32 as inferred; forge-assign-precision may store it in bf16/f16 (the kernels
  // compute in f32 and round on the store).
  let results = (outs TensorOf<[F32, BF16, F16]>:$result);
  let assemblyFormat = "$canvas `,` $geometry attr-dict `:` functional-type(operands, results)";
  let flopsPerElement = 12;
}

def Forge_OneHotOp : Forge_Op<"one_hot", "OneHot", FusionOpaque, PrecisionFollowsInput, 0> {
  let summary = "One-hot along `axis` (normalized, in [0, rank(indices)])";
  let arguments = (ins AnyForgeTensor:$indices, I64Attr:$depth, I64Attr:$axis,
                       F64Attr:$off_value, F64Attr:$on_value, TypeAttr:$dtype);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$indices attr-dict `:` functional-type(operands, results)";
}

//===----------------------------------------------------------------------===//
// Dropout
//===----------------------------------------------------------------------===//

def Forge_DropoutOp : Forge_Op<"dropout", "Dropout", FusionOpaque, PrecisionFollowsInput, 0> {
  let summary = "Dropout as imported for training (identity outside train_step)";
  let description = [{
    A training-mode ONNX Dropout with a nonzero `ratio`. The training graph
    builder replaces it: in `train_step` by `dropout_mask` on the step counter
    and `where(mask, input / (1 - ratio), 0)`, in `eval` by the identity
    (mask all true). Inference imports never create it; run as it is (the CPU
    kernel) it is that identity. `seed` keys its masks (the ONNX
    attribute, else a hash of the node's name).
  }];
  let arguments = (ins AnyForgeTensor:$input, F64Attr:$ratio, I64Attr:$seed);
  let results = (outs AnyForgeTensor:$result, TensorOf<[I1]>:$mask);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
}

def Forge_DropoutMaskOp : Forge_Op<"dropout_mask", "Dropout", FusionOpaque, PrecisionFollowsInput, 0> {
  let summary = "Dropout's keep mask from a counter-based RNG (Philox4x32-10)";
  let description = [{
    Element i of the [shape] result is kept (true) when 32-bit word j % 4 of
    Philox4x32-10(key = seed, counter = (j / 4 low, j / 4 high, step, 0)) is
    at least round(ratio * 2^32), where j = (rank * rank_samples + first_sample)
    * (numel / batch) + i: the element's index in the step's whole global batch
    when the mask is sample-major with `batch` samples (row 0 is global sample
    rank * rank_samples + first_sample). So a sample gets the same mask however
    the step is split into micro-batches and data-parallel ranks, and masks do
    not depend on device, thread count or launch shape: the CPU and CUDA kernels
    are bit-identical. `step` is train_step's step counter (f32 scalar, an
    integer value); `rank` the data-parallel rank (i64 scalar).
  }];
  let arguments = (ins AnyForgeTensor:$step, AnyForgeTensor:$rank, F64Attr:$ratio,
                       I64Attr:$seed, DenseI64ArrayAttr:$shape, I64Attr:$first_sample,
                       I64Attr:$rank_samples, I64Attr:$batch);
  let results = (outs TensorOf<[I1]>:$result);
  let assemblyFormat = "$step `,` $rank attr-dict `:` functional-type(operands, results)";
}

//===----------------------------------------------------------------------===//
// Structure: fusion regions (made by forge-fuse; no ONNX origin, so not
// Forge_Op: no ForgeOpInterface, no gradient, no CPU kernel of their own)
//===----------------------------------------------------------------------===//

def Forge_FusionOp : Op<Forge_Dialect, "fusion",
    [IsolatedFromAbove, RecursiveMemoryEffects, SingleBlock]> {
  let summary = "A group of forge ops that runs as one kernel";
  let description = [{
    The body's block arguments are the `inputs`; `forge.yield` returns the
    `results`. Body ops are forge ops on tensors, in program order.

    `kind = "loop"`: every body op is pointwise (FusionClass Elementwise) and
    every body value has the iteration shape, the shape of every result;
    inputs broadcast to it (NumPy rules). The CUDA code generator emits one
    kernel per loop region that evaluates the body per element, and no body
    value other than the results touches memory. A bundle for the CPU runs the
    body's ops one by one. A loop region may instead be a view region: one
    input, one result, and a chain of transpose/reshape/slice ops between
    them (e.g. a head split of one third of a fused qkv projection); its
    kernel is one strided copy.

    `kind = "horizontal"`: independent loop regions side by side (an
    optimizer's per-parameter updates): each member reads only the region's
    arguments (the region's inputs are all members' inputs, member by
    member), and the region yields all members' results in member order. One
    kernel runs them all, each member on its own range of blocks. A member
    may also be a multi_reduce region (below), and a loop region whose
    results have one element each may read such an earlier member's sums
    (forge-merge-reductions: a loss's mean and the gradient norm's square
    root beside the optimizer); the kernel evaluates it in the block that
    completes the last sum, so no launch waits for the sums.

    `kind = "row"`: one softmax-family op over the innermost axis (softmax,
    log_softmax, softmax_grad, log_softmax_grad) with pointwise ops before it
    (its prologue: they compute its operands and nothing else reads them) and
    after it (its epilogue: they read its result, the inputs and each other).
    Every body value has the iteration shape; the region has one result. The
    CUDA code generator emits one row kernel: it evaluates the prologue as it
    loads a row and the epilogue as it stores it (an attention's scale and
    causal mask around its softmax, forward and backward).

    `kind = "batch_norm"`: one `forge.batch_norm_training` (its operands
    are body arguments) and pointwise ops after it of its output's shape, its
    epilogue (reading its output, the arguments and each other). The region
    yields values of that shape (the iteration shape) and then the norm's
    running mean and variance. The CUDA code generator emits the norm's
    kernel, whose output pass evaluates the epilogue per element (the ReLU,
    or residual add and ReLU, after a batch norm). Or, for the backward pass:
    pointwise ops (a prologue of the image's shape) that compute operand dy of
    one `forge.batch_norm_training_grad`, whose x and scale are body arguments
    and which comes last; the region yields its results. Its kernel evaluates
    the prologue wherever it reads dy.

    `kind = "multi_reduce"`: independent full reductions side by side (the
    squared norms of every gradient for the global gradient norm): each
    `forge.reduce_sum` to a scalar, of a body argument or of pointwise ops of
    its shape on body arguments (its prologue, read by it alone); the region
    yields the sums in order. One kernel computes them all, each sum on its
    own range of blocks.

    `kind = "gemm"`: one `forge.gemm` or `forge.matmul` whose operands are the
    region's arguments in order (lhs, rhs, then gemm's C), and its epilogue,
    which a GEMM library applies as it writes the product: a `forge.relu`
    that alone reads the product (the region yields the ReLU's result); a
    `forge.add` of the product (2-D, alone read by it) and a bias row of its
    columns, the region's last argument (a linear layer's bias beside a
    residual added as gemm's C; the region yields the sum); or a
    `forge.reduce_sum` of the 2-D lhs (or rhs) over its leading axis, i.e.
    over the product's contraction (a bias gradient beside a weight
    gradient; the region yields the product, then the sum). On CUDA
    forge-select-library states the cuBLASLt epilogue (`forge.matmul`'s
    `epilogue`) and the region runs as one library call; a CPU bundle runs
    the body's ops.

    `kind = "lines"`: one input x and one result, both at the iteration
    shape; the body starts with a keepdims `forge.reduce_sum` or
    `forge.reduce_mean` of x over one axis that is not the last (f32), then
    pointwise ops at the iteration shape reading x and that reduction (dk
    minus its mean over the keys; forge-fuse-line-reductions). Its CUDA
    kernel reduces each line and evaluates the body from the same block: x
    read from memory once, the reduction never stored.
  }];
  let arguments = (ins Variadic<AnyForgeTensor>:$inputs, StrAttr:$kind);
  let results = (outs Variadic<AnyForgeTensor>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $kind `(` $inputs `)` attr-dict `:` functional-type($inputs, $results) $body
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::Block &getBlock() { return getBody().front(); }
    /// The iteration shape of a loop, row or batch_norm region (result 0's shape).
    ::llvm::ArrayRef<int64_t> getIterationShape() {
      return ::llvm::cast<::mlir::RankedTensorType>(getResult(0).getType()).getShape();
    }
    /// A loop region that is a chain of views (transpose, reshape, slice)
    /// from its one input to its one result: one strided copy.
    bool isViewRegion();
    /// The FLOPs of the body's ops and the bytes of the region's inputs and
    /// results (intermediates stay in registers).
    ::mlir::forge::OpCost getCost();
    /// This region rebuilt right before itself over `inputs`, yielding
    /// `yielded` (values of its body; the terminator's operands are reset):
    /// the attributes and the body move to the new op, which is returned.
    /// The caller replaces this op's results and erases it (a region
    /// growing, dropping or retyping results).
    FusionOp rebuild(::mlir::ValueRange inputs, ::mlir::ValueRange yielded);
    /// Replaces the region by its body: the ops move before this op in
    /// order (a horizontal region's members inlined in turn), the results
    /// are replaced by the yielded values, and this op is erased. What a
    /// target without a kernel for the region runs (forge-inline-fusions).
    void inlineBody();
  }];
}

def Forge_YieldOp : Op<Forge_Dialect, "yield",
    [Pure, Terminator, ReturnLike, HasParent<"FusionOp">]> {
  let summary = "The results of a fusion region";
  let arguments = (ins Variadic<AnyForgeTensor>:$values);
  let assemblyFormat = "$values attr-dict `:` type($values)";
}

def Forge_CopyOp : Op<Forge_Dialect, "copy", [Pure, SameOperandsAndResultType]> {
  let summary = "A copy of a tensor into a buffer of its own";
  let description = [{
    Made by forge-plan-memory, not by import: the new value of a persistent
    tensor that cannot be written in place (the copy writes it, after every
    read of the old value), and a routine output that needs its own named
    buffer (an input, a constant, a persistent tensor or another output).
    Runs as a device-to-device copy.
  }];
  let arguments = (ins AnyForgeTensor:$input);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def Forge_AccumulatedOp : Op<Forge_Dialect, "accumulated", [SameOperandsAndResultType]> {
  let summary = "A running sum over micro-batches, read once the last one has added to it";
  let description = [{
    Made by forge-build-train-step for gradient accumulation in a loop
    (`forgec --micro-batches K`, `--accumulate loop`), not by import. `sum` is
    the new value of the persistent f32 tensor named `accumulator` (its old
    value plus this micro-batch's term; the first micro-batch's term alone);
    the result is that sum once all K micro-batches have added theirs. forge-split-accumulation cuts the step
    here: what `sum` depends on becomes the routine @accumulate, which the
    runtime runs once per micro-batch and which writes `sum` into the
    accumulator; what reads the result stays in @train_step, which reads the
    accumulator instead. Until the cut the op is the identity.

    Not Pure: it is never merged, moved or erased, and no fusion region takes
    it, so nothing fuses across the cut.
  }];
  let arguments = (ins AnyForgeTensor:$sum, StrAttr:$accumulator);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$sum attr-dict `:` type($result)";
}

def Forge_AllReduceOp : Op<Forge_Dialect, "all_reduce",
    [DeclareOpInterfaceMethods<Forge_DifferentiableOpInterface>]> {
  let summary = "Element-wise sum, mean or max of each operand over a group of ranks";
  let description = [{
    Made by forge-build-train-step for data parallelism (`forgec --dp D`), not
    by import (and by forge-assign-precision: fp8 delayed scaling's amaxes,
    `reduction = "max"`): result i is operand i summed (or averaged: `reduction =
    "mean"`) element by element over the `size` ranks of the collective
    `group` ("dp"), each rank running the same program on its own slice of
    the batch. forge-partition splits the one op the train step gets into
    size-capped buckets, each issued where its last operand is made, so the
    reduction of one bucket overlaps the backward pass of the next.

    Every rank issues the same collectives in the same order; so the op is
    deterministic per rank, but not Pure: it must neither be merged with
    another nor moved across another collective, and a rank may not skip it.
    The runtime runs it through the process's communicator of `group`
    (CPU ranks: Gloo; CUDA: NCCL on the collective stream).

    forge-shard-tensor-parallel (`forgec --tp T`) makes one in the forward
    pass: the sum over group "tp" of a row-parallel matmul's partial
    products (Megatron's g). Its gradient rule is for that use: every rank of
    the group holds the same cotangent of the sum (what follows it is
    replicated), which is each operand's gradient. A "mean" has no rule (the
    data-parallel one is made after differentiation).
  }];
  let arguments = (ins Variadic<AnyForgeTensor>:$inputs, StrAttr:$group, StrAttr:$reduction,
                       I64Attr:$size);
  let results = (outs Variadic<AnyForgeTensor>:$results);
  let assemblyFormat = "$inputs attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    static constexpr bool kDifferentiable = true;
    ::llvm::LogicalResult buildGradientRule(::mlir::OpBuilder &builder,
        ::mlir::ValueRange resultGrads, ::llvm::SmallVectorImpl<::mlir::Value> &operandGrads);
  }];
}

// ZeRO-1 (forgec --zero 1): made by forge-build-train-step after
// differentiation, not differentiable. Each splits dim 0 (the outermost, so a
// rank's slice is contiguous) into `size` equal parts, part r held by rank r
// of `group`.
def Forge_ReduceScatterOp : Op<Forge_Dialect, "reduce_scatter"> {
  let summary = "This rank's part (along dim 0) of the sum or mean of the operand over a group";
  let description = [{
    Every rank of `group` passes a whole tensor; rank r gets part r of their
    element-wise sum (or mean: `reduction = "mean"`). ZeRO-1's gradient
    reduction: each rank updates only its part of a parameter. Not Pure, as
    forge.all_reduce: every rank must issue it, in the same order.
  }];
  let arguments = (ins AnyForgeTensor:$input, StrAttr:$group, StrAttr:$reduction, I64Attr:$size);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Forge_AllGatherOp : Op<Forge_Dialect, "all_gather",
    [DeclareOpInterfaceMethods<Forge_DifferentiableOpInterface>]> {
  let summary = "The whole tensor from every rank's part along dim 0";
  let description = [{
    Rank r of `group` passes part r; every rank gets the parts concatenated
    along dim 0 in rank order. ZeRO-1's parameter gather after each rank
    updated its part (made after differentiation), and the vocabulary-parallel
    loss's gather of every rank's log-sum-exp (forge-build-train-step, on a
    logits output split by forge-shard-tensor-parallel). Not Pure (a
    collective). Its gradient rule is for the loss's use: what follows the
    gather is replicated over the group, so every rank holds the same
    cotangent of the whole, and part r of it (forge.rank_slice) is rank r's
    gradient.
  }];
  let arguments = (ins AnyForgeTensor:$input, StrAttr:$group, I64Attr:$size);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    static constexpr bool kDifferentiable = true;
    ::llvm::LogicalResult buildGradientRule(::mlir::OpBuilder &builder,
        ::mlir::ValueRange resultGrads, ::llvm::SmallVectorImpl<::mlir::Value> &operandGrads);
  }];
}

// Pipeline parallelism (forgec --pp P): made by forge-split-pipeline-stages,
// which gives each stage its own routine. A value made on one stage and read
// on another travels as one send on the producer's routine and one recv, with
// the same tag, on the reader's. Neither is Pure: each is one half of a
// message the other rank waits for, so neither may be dropped, merged or moved
// across another send or recv (1F1B's order is what keeps the ranks from
// waiting on each other).

def Forge_SendOp : Op<Forge_Dialect, "send"> {
  let summary = "Sends a tensor to another stage of a pipeline group";
  let description = [{
    Copies `input` to the rank at place `peer` of the `size` ranks of
    `group` ("pp"), where the forge.recv of the same `tag` receives it. The
    copy is taken when the op runs (the runtime stages it), so the input's
    bytes may be reused right after; the op does not wait for the receiver.

    Order: `after` is the token of the routine's previous send or recv, and
    `token` (a tensor<0xi1>, no bytes) this one's, so the messages form one
    chain of data dependences: no pass can reorder them, and one that moves
    a send later (fusion moves the users of a region's values after it)
    moves every later message with it.
  }];
  let arguments = (ins AnyForgeTensor:$input, Optional<AnyForgeTensor>:$after, StrAttr:$group,
                       I64Attr:$peer, I64Attr:$tag, I64Attr:$size);
  let results = (outs AnyForgeTensor:$token);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Forge_RecvOp : Op<Forge_Dialect, "recv"> {
  let summary = "Receives a tensor from another stage of a pipeline group";
  let description = [{
    Waits for the forge.send of the same `tag` on the rank at place `peer` of
    `group` and writes its bytes into `result` (the sent tensor's type). A
    peer that does not send within the group's timeout fails the step with
    the group, the peer and the tag. `after` and `token` chain it with the
    routine's other messages, as forge.send's.
  }];
  let arguments = (ins Optional<AnyForgeTensor>:$after, StrAttr:$group, I64Attr:$peer,
                       I64Attr:$tag, I64Attr:$size);
  let results = (outs AnyForgeTensor:$result, AnyForgeTensor:$token);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Forge_RankSliceOp : Op<Forge_Dialect, "rank_slice", [Pure]> {
  let summary = "This rank's part (along dim 0) of a tensor every rank holds whole";
  let description = [{
    Part r of `input` for rank r of `group`: the slice of a replicated
    parameter that ZeRO-1's optimizer updates on this rank. No
    communication; the part depends on the process's rank.
  }];
  let arguments = (ins AnyForgeTensor:$input, StrAttr:$group, I64Attr:$size);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Forge_EnterGroupOp : Op<Forge_Dialect, "enter_group",
    [Pure, SameOperandsAndResultType,
     DeclareOpInterfaceMethods<Forge_DifferentiableOpInterface>]> {
  let summary = "Identity whose gradient is summed over a group of ranks (Megatron's f)";
  let description = [{
    Made by forge-shard-tensor-parallel (`forgec --tp T`) where a replicated
    value enters a column-parallel matmul: each of the `size` ranks of
    `group` reads it whole and computes its own columns, so its gradient is
    the sum of every rank's partial gradient: the rule is forge.all_reduce
    (sum) of the cotangent. The forward is the identity, folded away once
    the train step is built.
  }];
  let arguments = (ins AnyForgeTensor:$input, StrAttr:$group, I64Attr:$size);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
  let hasFolder = 1;
  let extraClassDeclaration = [{
    static constexpr bool kDifferentiable = true;
    ::llvm::LogicalResult buildGradientRule(::mlir::OpBuilder &builder,
        ::mlir::ValueRange resultGrads, ::llvm::SmallVectorImpl<::mlir::Value> &operandGrads);
  }];
}

def Forge_ShardOp : Op<Forge_Dialect, "shard", [Pure]> {
  let summary = "This rank's slice of an initializer split over a group of ranks";
  let description = [{
    Made by forge-shard-tensor-parallel (`forgec --tp T`): rank r of the
    `size` ranks of `group` holds slice r of `input` (an initializer, a
    forge.constant with forge.initializer) along `axis`, the axis divided
    into `size` equal parts. With `blocks` > 1 the axis is `blocks` equal
    blocks, each split so: rank r holds part r of every block (a fused q, k,
    v projection split by heads). forge-build-train-step makes the parameter
    of the result's type, with the initializer's whole value as its initial
    value and the split as its `forge.shard` attribute; the runtime loads
    each rank's slice. Nothing else may read a shard: it has no kernel.
  }];
  let arguments = (ins AnyForgeTensor:$input, I64Attr:$axis, StrAttr:$group, I64Attr:$size,
                       DefaultValuedAttr<I64Attr, "1">:$blocks);
  let results = (outs AnyForgeTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

// Backward-only ops (created by gradient rules).
include "forge/Dialect/ForgeGradOps.td"

#endif // FORGE_DIALECT_FORGEOPS_TD
