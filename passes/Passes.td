//===- Passes.td - Forge graph passes ------------------------------------===//
//
// One pass per file in passes/, named after the verb; the flag is
// `--forge-<name>`. Each description is what `forge-opt --help` shows.
// The pipeline order is fixed in compiler/lib/Pipeline/Pipeline.cpp.
//
//===----------------------------------------------------------------------===//
#ifndef FORGE_PASSES_TD
#define FORGE_PASSES_TD

include "mlir/Pass/PassBase.td"

def BuildTrainStep : Pass<"forge-build-train-step", "::mlir::ModuleOp"> {
  let summary = "Replace @main with the training step (@train_step) and @eval";
  let description = [{
    Builds the training bundle's routines from the imported forward graph
    (compiler/lib/Train): `@train_step` is the forward pass, the loss,
    reverse-mode gradients through DifferentiableOpInterface, optional global
    gradient-norm clipping, the learning-rate schedule and the optimizer update
    of every trainable parameter (float initializers not matched by `freeze`
    become `forge.kind = "parameter"` arguments); `@eval` is the forward pass,
    the loss and, for classification losses, the number of correct
    predictions. The options are forgec's training flags, with the same
    syntax and errors. Length buckets (forgec --length-buckets): each
    further `@"main@len<T>"` (the model imported at sequence length T) gets
    its own `@"train_step@len<T>"` and `@"eval@len<T>"`; their parameters
    and state are the same by name.
  }];
  let options = [
    Option<"loss", "loss", "std::string", /*default=*/"",
           "cross_entropy:OUTPUT,LABEL | mse:OUTPUT,LABEL | bce:OUTPUT,LABEL | output:NAME">,
    Option<"optimizer", "optimizer", "std::string", /*default=*/"",
           "sgd|momentum|nesterov|adam|adamw[:lr=,momentum=,beta1=,beta2=,eps=,weight_decay=]">,
    Option<"lrSchedule", "lr-schedule", "std::string", /*default=*/"\"constant\"",
           "constant | cosine:warmup=N,total=N[,min_ratio=R] | linear:...">,
    Option<"clipGradNorm", "clip-grad-norm", "double", /*default=*/"0.0",
           "Clip the global gradient norm (0: off)">,
    Option<"microBatches", "micro-batches", "int64_t", /*default=*/"1",
           "Accumulate gradients over this many micro-batches">,
    Option<"accumulate", "accumulate", "std::string", /*default=*/"",
           "loop (default with micro-batches; not with pipeline stages) | unroll: one "
           "micro-batch's forward and backward adding into persistent accumulators "
           "(forge.accumulated, cut by forge-split-accumulation), or K unrolled copies">,
    Option<"dynamicMicroBatches", "dynamic-micro-batches", "bool", /*default=*/"false",
           "The loop runs a varying number of times per step, at most micro-batches "
           "(forgec --batch-schedule): the count is the input forge.micro_count">,
    Option<"dataParallel", "data-parallel", "int64_t", /*default=*/"0",
           "Ranks of the data-parallel group: gradients and loss averaged by forge.all_reduce "
           "(0: none; 1: a group of one)">,
    Option<"pipeline", "pipeline", "int64_t", /*default=*/"1",
           "Pipeline stages: the ops carry forge-assign-pipeline-stages' marks, which the "
           "gradients and optimizer updates inherit (1: none)">,
    Option<"zero", "zero", "int64_t", /*default=*/"0",
           "ZeRO stage: 1 splits the optimizer state over the data-parallel ranks (needs "
           "data-parallel)">,
    ListOption<"freeze", "freeze", "std::string",
               "Glob patterns of initializers that stay frozen">,
    Option<"exposeGradients", "expose-gradients", "bool", /*default=*/"false",
           "Also return every parameter's gradient (forge.grad.NAME)">,
    Option<"gradNorm", "grad-norm", "bool", /*default=*/"false",
           "Compute and output the global gradient norm (forge.grad_norm) even where "
           "neither clipping nor dynamic loss scaling needs it">,
    Option<"batchnormRunningVar", "batchnorm-running-var", "std::string", /*default=*/"",
           "biased | unbiased (default: unbiased for PyTorch exports)">,
    Option<"lossScale", "loss-scale", "std::string", /*default=*/"",
           "none | dynamic[:init=S,interval=N,growth=G,backoff=B] (fp16)">,
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect", "::mlir::func::FuncDialect"];
}

def FoldConstants : Pass<"forge-fold-constants", "::mlir::func::FuncOp"> {
  let summary = "Evaluate forge ops whose operands are all constants";
  let description = [{
    Replaces every forge op whose operands are all `forge.constant` with the
    constants it computes, evaluated by the runtime's CPU kernels (so every op
    folds with the exact semantics it has at run time). Results larger than
    `max-elements` are left alone so that folding never bloats a bundle (for
    example a broadcast of a scalar into a large tensor). Parameters (constants
    tagged `forge.initializer`) fold like any constant in inference graphs; the
    training pipeline runs this pass only after parameters became arguments.
  }];
  let options = [
    Option<"maxElements", "max-elements", "int64_t", /*default=*/"1 << 22",
           "Largest result (in elements) that folding may materialize">,
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

def RecognizeComposites : Pass<"forge-recognize-composites", "::mlir::func::FuncOp"> {
  let summary = "Replace exporters' elementwise spellings of an op by the op";
  let description = [{
    The tanh GELU that PyTorch writes below opset 20,
    0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) (operands in
    either order; x^3 as x * (x * x), (x * x) * x or pow(x, 3); the 0.5 on
    the product or on x), becomes `forge.gelu {approximate = "tanh"}`: its own
    gradient rule, and a GEMM epilogue can compute it. The constants must be
    one-element forge.constant values within 1e-6 (relative), and every
    intermediate read by the chain alone. The chain's ops are left dead for
    forge-eliminate-dead-code; nothing is folded (initializers are still
    constants in the import-cleanup stage, where the pipeline runs it).

    Attention as exporters (and the importer, for ONNX Attention) write it:
    matmul(q, k^T) [* scale | / c] [where(causal mask, -inf, .)],
    softmax(last axis), matmul(., v), on [batch, heads, seq, head_dim]
    tensors, becomes `forge.attention` (the scale 1 when absent; the mask a
    boolean constant that is exactly the top-left causal triangle, -inf or a
    value <= -1e9 where masked; GQA's k and v repeated per query-head group,
    reshape(broadcast(reshape)), read unrepeated). `attention` says where: `all` (the CPU,
    which has a kernel for every form), `cudnn` (only forms cuDNN's flash
    attention takes: head sizes equal, a multiple of 8, at most 128) or
    `none`. A match left unfused is counted in one remark with the reason.
  }];
  let options = [
    Option<"attention", "attention", "std::string", /*default=*/"\"all\"",
           "Which attention chains become forge.attention: all | cudnn | none">,
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

def EliminateDeadCode : Pass<"forge-eliminate-dead-code", "::mlir::func::FuncOp"> {
  let summary = "Erase side-effect-free ops whose results are unused";
  let description = [{
    Walks the function backwards and erases every op that has no memory
    effects and no remaining uses, so chains of dead ops vanish in one sweep.
    Ops with side effects and terminators are kept.
  }];
}

def AugmentInputs : Pass<"forge-augment-inputs", "::mlir::func::FuncOp"> {
  let summary = "Take an image input as raw pixels and normalize it in the graph";
  let description = [{
    The input transforms of `forgec --augment`, on @main before the train
    step is built (so train_step and eval both get them). `input` names a
    rank-4 float model input [B, C, H, W]. With `pixels`, the function takes
    u8 pixels [B, H, W, C] instead (what an image decoder produces: a quarter
    of f32's upload) and casts them to the model's type, scaled by 1/255;
    `mean`/`std` (C values each) then normalize, (x - mean) / std, as one
    multiply-add with [C] coefficients; a transpose gives the model its
    channels-first view (forge-assign-layout cancels it against the
    convolutions' NHWC transposes). `flip` mirrors each sample along its
    width with probability 1/2 in train_step only: the draw is a dropout of
    ratio 1/2 over a [B, 1, 1, 1] tensor of ones (the train step builder gives
    it Philox's per-step mask, a distinct key per micro-batch, and makes it
    the identity in eval), and `where(draw > 1, mirrored, x)` selects. All of
    it is pointwise or a view, so forge-fuse makes one kernel of it together
    with the model's first ops. With `canvas-height`/`canvas-width` (and
    `pixels`) the u8 argument is a canvas [B, Hc, Wc, C] holding each decoded
    image in its top-left corner, a new argument `INPUT.crop` [B, 6] f32 gives
    each sample's crop box (the data pipeline draws it: random-resized in
    training, the centre crop in eval), and `forge.resized_crop` scales the boxes
    to [B, H, W, C] on the device before the normalization. Errors name the
    input. A function without that input is left alone.
  }];
  let options = [
    Option<"input", "input", "std::string", /*default=*/"", "the model input to transform">,
    Option<"pixels", "pixels", "bool", /*default=*/"false",
           "take u8 [B, H, W, C] pixels (scaled by 1/255) instead of [B, C, H, W] floats">,
    ListOption<"mean", "mean", "double", "per-channel mean subtracted (after the 1/255)">,
    ListOption<"stddev", "std", "double", "per-channel standard deviation divided by">,
    Option<"flip", "flip", "bool", /*default=*/"false",
           "mirror each training sample along its width with probability 1/2">,
    Option<"canvasHeight", "canvas-height", "int64_t", /*default=*/"0",
           "with pixels: take u8 images in a [B, canvas-height, canvas-width, C] canvas and "
           "their crop boxes (INPUT.crop [B, 6]), cropped and scaled on the device">,
    Option<"canvasWidth", "canvas-width", "int64_t", /*default=*/"0", "see canvas-height">
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

def SymmetrizeConvPadding : Pass<"forge-symmetrize-conv-padding", "::mlir::func::FuncOp"> {
  let summary = "Turn asymmetric convolution padding into explicit pads (for cuDNN)";
  let description = [{
    cuDNN pads each spatial dimension equally at both ends. A conv or
    conv_grad_weight whose begin and end pads differ gets a constant-zero
    `forge.pad` of its input by the difference and keeps the smaller pad at
    both ends; a conv_transpose, whose pads crop its output, keeps the smaller
    pads and its result is cropped by the difference (a `forge.pad` with
    negative pads). Results are unchanged; the pipeline runs this pass for
    CUDA targets only.
  }];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

def AssignLayout : Pass<"forge-assign-layout", "::mlir::func::FuncOp"> {
  let summary = "Run 2-d convolution nets channels-last (NHWC) between cancelling transposes";
  let description = [{
    With layout=nhwc, every rank-4 conv, conv_transpose and conv_grad_weight
    takes its `channels_last` form between transposes ([0, 2, 3, 1] before,
    [0, 3, 1, 2] after; weights included), batch norms over rank-4 inputs are
    expanded into channels-last column sums and pointwise ops with [C]
    coefficients, and the transposes are then sunk through pointwise ops and
    keepdims reductions and cancelled in pairs. A transpose that moves only
    unit dims becomes a reshape. Functions without a rank-4 convolution are
    unchanged; layout=nchw changes nothing. The pipeline runs it for CUDA
    targets (forgec --layout), before fusion.

    With pad-channels, a channels_last conv (group 1) whose input has fewer
    than 8 channels (an RGB stem) reads its input and weight zero-padded to 8
    channels, and the weight gradient of such a conv is computed at 8
    channels and sliced (16-byte channel rows for tensor cores). The padded
    channels are zeros, so results are unchanged. Off by default: on an H200
    ResNet-50's bf16 step was 0.8% slower with it (18.43 vs 18.29 ms, +0.1 GB
    for the padded image kept for the weight gradient), although its
    3-channel stem convolution takes 1.5 ms of the profiled step.
  }];
  let options = [
    Option<"layout", "layout", "std::string", /*default=*/"\"nhwc\"",
           "nchw | nhwc: the layout of 2-d convolution nets">,
    Option<"padChannels", "pad-channels", "bool", /*default=*/"false",
           "Zero-pad convolutions' inputs of fewer than 8 channels to 8 (nhwc)">,
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

def PadContractions : Pass<"forge-pad-contractions", "::mlir::func::FuncOp"> {
  let summary = "Zero-pad matmul/gemm dims so every matrix row is 16-byte aligned (for cuBLASLt)";
  let description = [{
    cuBLASLt's fast kernels need every leading dimension to be a multiple of
    16 bytes (4 f32, 8 f16/bf16 elements); otherwise it runs its unaligned
    kernels, 2-3x slower (GPT-2's LM head: N = 50257). A static float matmul
    or gemm of at least `min-flops` whose K (when an operand holds it
    innermost), N, or M (with transA) is not aligned gets constant-zero
    `forge.pad`s of its operands to the next multiple (and of a gemm's C along
    M and N) and a `forge.slice` of the padded result back to its shape.
    Results are bit-identical (the padding only adds exact zeros). CUDA
    targets only; before CSE, which merges the equal pads of an operand that
    several contractions read (a weight in the forward and backward pass).
  }];
  let options = [
    Option<"minFlops", "min-flops", "int64_t", /*default=*/"1073741824",
           "Smallest contraction (2*M*N*K per batch, summed) to pad: below it the pads' "
           "and slices' launches cost more than the unaligned GEMM loses">,
    Option<"minElements", "min-elements", "int64_t", /*default=*/"0",
           "Align to at least this many elements (8: the training step is stored in "
           "bf16/f16 later by forge-assign-precision, whose 16 bytes are 8 elements)">,
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

// Stage "recomputation" (after the last CSE, which would merge a clone back;
// before fusion, which fuses the recomputed chain as it fuses the forward's).

def Rematerialize : Pass<"forge-rematerialize", "::mlir::func::FuncOp"> {
  let summary = "Recompute large forward values in the backward pass instead of keeping them";
  let description = [{
    In a train step (a routine with a result named "loss"), a forward value
    (one the loss depends on) that backward ops read is kept from the forward
    pass to its first backward reader. With `recompute=attention`, each
    softmax whose scores a matmul makes (an unfused attention's
    probabilities, [B, H, Tq, Tk]) is recomputed instead: its cone (the
    matmul and the pointwise ops between it and the softmax, at most 12 pure
    ops, one library call, nothing opaque) is cloned before its first
    backward reader, from leaves the backward pass keeps anyway (Q and K,
    which dQ and dK read; constants; arguments), and every backward reader
    reads the clone. The forward probabilities then die at the forward's
    P V product: GPT-2 124M B16 T1024 in f32 keeps 12 x 768 MiB less, and
    pays one Q K^T matmul and one softmax pass per layer in the backward.

    Results are bit-identical (the same ops on the same inputs). A value the
    routine returns is kept. A remark says how many values were recomputed
    and how many bytes are no longer kept, or why nothing was (bf16/fp16
    attention is fused: cuDNN recomputes its probabilities itself).
  }];
  let options = [
    Option<"recompute", "recompute", "std::string", /*default=*/"\"none\"",
           "none | attention: which forward values the backward pass recomputes">,
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

// A module pass (it fuses each function): a function pass right after the
// function passes of the graph cleanup would share their per-function
// adaptor, and the dump after the cleanup would already show regions.
def Fuse : Pass<"forge-fuse", "::mlir::ModuleOp"> {
  let summary = "Group ops into forge.fusion regions that each run as one kernel";
  let description = [{
    Loop fusion: chains of pointwise ops (FusionClass Elementwise) whose
    results have one shape become a `forge.fusion "loop"` region, evaluated
    per element by one kernel; operands of other shapes enter the region as
    broadcast inputs. A pointwise op joins the region of a producer with its
    result shape unless that would make a cycle (a path from the region
    through an op outside it back into the op), or unless it only adds a
    result kept for later readers: when the region has two ops or more, every
    value the op reads from it is written anyway (a non-pointwise reader), and
    the op's readers are pointwise ops that cannot join the region (the
    backward pass), the op goes to its readers' region instead (a ReLU's mask
    is computed there from the ReLU's output, not saved). Values used outside the region
    become its results (so a region may have several, e.g. an optimizer's new
    parameter and moments). Ops with a zero-element result and single-op
    groups stay as they are. Program order is otherwise kept: the region takes
    the place of its last op, and outside users in between move after it.

    Then rematerialization: a loop region that reads results of an earlier
    loop region of its iteration shape computes them itself from that
    region's inputs when this reads fewer bytes (a GELU's backward recomputes
    its intermediates from the GELU's input instead of reading four saved
    tensors); results that nobody reads any more are dropped from the
    producer, and so are inputs it no longer needs. A result the producer
    keeps writing for another reader is read rather than recomputed (the
    consumer of g * scale reads g, which a residual path also reads).

    Then row fusion: a softmax-family op over the innermost axis (softmax,
    log_softmax and their gradients) absorbs the loop regions or pointwise ops
    of its shape that compute its operands and that nothing else reads (its
    prologue), and the loop region or pointwise op of its shape that alone
    reads its result (its epilogue), into one `forge.fusion "row"`: an
    attention's scale and causal mask before its softmax and after the
    softmax's gradient. The region takes the place of its last member.

    Then batch-norm fusion: a `forge.batch_norm_training` whose normalized
    output only one loop region or pointwise op of its shape reads (the ReLU,
    or a residual add and ReLU, after a convolution) becomes one
    `forge.fusion "batch_norm"` with it when that reader's other inputs have
    its shape or one element; the region yields the reader's results and then
    the running statistics. One kernel computes the statistics and writes the
    reader's results in its output pass. Likewise a
    `forge.batch_norm_training_grad` takes in the loop region or pointwise op
    of its shape that alone computes its dy (a ReLU's mask applied to the
    incoming gradient), when that stage's inputs have its shape or one element.

    Then sibling fusion: small loop regions (at most 64k elements) of one
    iteration shape that read a common input and do not depend on each other
    become one, at the later one's place (a batch norm's [C] coefficients
    beside its parameters' update).

    After it, horizontal fusion of the optimizer: the loop regions that update
    persistent state (a result returned with `forge.updates`) and do not
    depend on each other become one `forge.fusion "horizontal"` region, one
    launch for every parameter's update. Members are chosen from the last
    update back, so an update that later ones read (a batch norm's running
    statistics, read by the rest of the step) stays out without keeping the
    others out. Then the scalar loop regions (one
    element: a clip scale, a learning rate) that do not read each other become
    one horizontal region, when no op between them reads the first; a lone
    pointwise op of one element (a loss's mean: the multi-reduction takes a
    whole-tensor reduce_mean beside other sums as a sum, and the division by n
    stays outside) joins them as a loop region of its own.

    Before loop fusion, reductions side by side: column sums (reduce_sum over
    every dim but the last, f32) of one iteration shape that read a common
    leaf become one `forge.fusion "column_reduce"` with their pointwise
    prologues recomputed per element (a channels-last batch norm's two
    statistics; its gradient's sum(dy) and sum(dy * (x - k))). A prologue
    cone of more than 12 ops is pruned: values written anyway (read by a
    non-fusible op, or by several ops and computed from two full-size
    tensors: a residual network's masked gradient) become leaves, and no
    member recomputes a value another member reads. Then the whole-tensor
    sums of a block (a gradient norm's squares, a loss's mean) become
    `forge.fusion "multi_reduce"` regions.

    With `gemm-epilogues` (forgec sets it for CUDA targets), before loop
    fusion: GEMM epilogues. A `forge.relu` that alone reads an f32 gemm or
    matmul product, and a bias gradient (a reduce_sum over all but the last
    axis) of a tensor that a weight gradient's GEMM reads as its transposed
    2-D lhs (or plain rhs), i.e. the same sum over the contraction, join the
    product in a `forge.fusion "gemm"` region, and so does a residual linear
    layer, add(add(product, bias row), r) with r of the product's shape: r
    becomes gemm's C (beta 1) and the bias row the region's last argument
    (GPT-2's attention and MLP outputs); the bias gradient only when the
    contraction is no longer than the product's larger side (cuBLASLt's
    bias-gradient epilogue gives up split-K: GPT-2's weight gradients over
    16384 tokens ran ~1.5x slower with it). With `aux-epilogues` (off by
    default: slower than unfused in f32/TF32), a linear layer's tanh GELU,
    gelu(add(product, bias row)) or gelu(product), joins as well: the bias
    becomes gemm's C, and when anything else reads the GELU's input (the
    backward's gelu_grad) the region yields it too, as the epilogue's aux
    output. A gelu_grad (tanh) whose grad_output is a product (or its one
    reshape) that nothing else reads joins that product with the GELU's
    input as the region's last argument, and a bias gradient of the
    gelu_grad (reduce_sum over all but the last axis) joins it too. With
    `relu-aux-epilogues`, a ReLU region also yields the ReLU's bitmask, which
    the GEMM of the ReLU's gradient, where(y > 0, P, 0), reads to mask P.
    forge-select-library states the cuBLASLt epilogue (RELU/RELU_BIAS,
    BGRADA/BGRADB, BIAS, GELU[_AUX][_BIAS], DGELU[_BGRAD]) that computes it
    as the product is written.

    Before everything, row fusion of the classification loss:
    nll_loss(log_softmax(x, axis 1), t) over [N, C] logits (no class weights,
    no ignore_index) and its gradient log_softmax_grad(y, nll_loss_grad(g, t))
    become `forge.cross_entropy` (loss and per-row log-sum-exp) and
    `forge.cross_entropy_grad`, when nothing else reads the log-softmax.
  }];
  let options = [
    Option<"rematerialize", "rematerialize", "bool", /*default=*/"true",
           "Recompute a loop region's inputs from an earlier region's inputs when that "
           "reads fewer bytes">,
    Option<"fuseRows", "rows", "bool", /*default=*/"true",
           "Fuse pointwise prologues and epilogues into softmax-family row ops">,
    Option<"fuseNorms", "norms", "bool", /*default=*/"true",
           "Fuse batch_norm_training with the pointwise reader of its output">,
    Option<"gemmEpilogues", "gemm-epilogues", "bool", /*default=*/"false",
           "Fuse ReLUs of GEMM products and bias gradients beside weight gradients into "
           "gemm regions (a GEMM library's epilogues: CUDA only)">,
    Option<"reluAuxEpilogues", "relu-aux-epilogues", "bool", /*default=*/"false",
           "With gemm-epilogues, the ReLU's bitmask (RELU_AUX) and its gradient (DRELU) "
           "too. Off: slower than the plain GEMMs and two mask kernels in TF32 (20%) and "
           "bf16 (7%) on the bench MLP (bench/RESULTS.md, nineteenth session)">,
    Option<"auxEpilogues", "aux-epilogues", "bool", /*default=*/"false",
           "With gemm-epilogues, also the epilogues that save a tensor for the backward "
           "or read one: the tanh GELU with its input (GELU_AUX_BIAS) and its gradient "
           "(DGELU[_BGRAD]). forgec turns them on in bf16 (GPT-2 4% faster). Off: in "
           "f32/TF32 cuBLASLt's kernels for them ran slower than the plain GEMM and a "
           "kernel (GPT-2 +3 ms/step on an H200, bench/RESULTS.md)">,
    Option<"maxHorizontalOperands", "max-horizontal-operands", "int64_t", /*default=*/"120",
           "Most operands plus results of one horizontal region: its kernel takes one "
           "pointer per tensor (CUDA's parameter space is 4 KiB), and LLVM's time on one "
           "kernel grows faster than its size (GPT-2: 500 took 6.2 s to compile, 120 4.3 s)">,
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

// Stage "precision" (after fusion, so that casts fall into regions).

def AssignPrecision : Pass<"forge-assign-precision", "::mlir::ModuleOp"> {
  let summary = "Store the training step's tensors in bf16/f16 where that is safe";
  let description = [{
    Decides the storage type of every tensor of `@train_step` between
    kernels (kernels compute in f32 whatever they load and convert as they
    store). With `precision=bf16` (or fp16), a float tensor of 2 or more
    elements is stored low when every reader takes it low:
      * a GEMM (matmul, gemm, gemm region) as its lhs or rhs: tensor cores;
      * a loop or row region reading it at the iteration shape, unless as
        operand 0 of a KeepFP32 op (the logits into the loss, a norm's input:
        the residual stream, softmax's scores);
      * a view (reshape, transpose, slice, view region) whose own readers all
        take it low;
      * a layer_norm_grad as its grad_output, with `low-norm-gradients` (off
        by default): the next linear layer's dX, which the norm's gradient
        reads once in f32 registers; its x, the residual stream, stays f32.
    It is never stored low when the optimizer, the gradient norm or a
    routine result reads it (parameter gradients, metrics), nor when it is
    a GEMM's output over a full C (the residual stream).
    Where it is stored low, the region that makes it converts before its
    yield (a gemm region's product and epilogue take the type: cuBLASLt
    writes D low); regions that read it convert after loading.

    Every GEMM then reads low lhs and rhs: an f32 operand gets a low copy;
    so does the bias row beside a low output (cuBLASLt wants it in D's type),
    and a loose add of a product and a bias row, stored low, gets a low
    product and row (forge-select-library folds it into the BIAS epilogue).
    A parameter's copy is a state argument (`forge.kind = "state"`,
    `forge.copy_of = "<parameter>"`, named `<parameter>.bf16`) that the
    optimizer's update writes each step as one more output of the member
    that updates the master (returned with `forge.updates`); the runtime
    derives it from the master whenever that is loaded. A view of a
    parameter is the same view of its copy. A loop region's result gets one
    more, low, output. Anything else (a data input, a library output read by
    both) gets a loop region of one cast, counted in a remark.

    With `precision=fp8`, forward GEMMs in the float8 layout read E4M3
    copies scaled per tensor. `fp8-scaling=current` scales each by its amax
    of the same step (a reduction, then the cast). `fp8-scaling=delayed`
    scales each activation by the largest amax of its last `fp8-history`
    steps: a state argument `<name>.fp8_amax_history` (role
    `fp8_amax_history`, a ring indexed by (forge.step - 1) mod H, initially
    [448, 0, ...]: the first step scales by 1, as Transformer Engine does),
    whose maxima one multi_reduce at the entry reads; the cast no longer
    waits for the tensor's own amax, which only fills this step's slot (the
    slots are written by one horizontal region at the end; with --dp the
    amaxes first go through one forge.all_reduce with `reduction = "max"`, so
    every rank keeps the same histories). Arguments (the weights, data
    inputs) keep current scaling: their amaxes are known at the entry, one
    multi_reduce for all.

    `fp8-gradients=e5m2` also runs the backward of each float8 product
    Y = X W^T in float8: dX = dY W and dW = dY^T X become scaled_gemms of an
    E5M2 copy of dY (scaled by 57344 / amax: range before precision, as
    gradients need) beside E4M3 copies of W and X. Hopper's float8 GEMMs
    read both operands K-major, so dX reads W^T and dW reads dY^T and X^T:
    transposed copies (a transpose, then the cast) scaled by the amax of
    the tensor they copy. A gradient's scaling follows `fp8-scaling` as an
    activation's does (its own history when delayed, initially
    [57344, 0, ...]). Products the forward left in bf16 keep a bf16
    backward.

    Parameters, optimizer state and @eval stay f32. `precision=fp32` and
    `tf32` change nothing (TF32 is cuBLASLt's compute type, the bundle's
    build option).
  }];
  let options = [
    Option<"precision", "precision", "std::string", /*default=*/"\"fp32\"",
           "fp32 | tf32 | bf16 | fp16 | fp8: the storage type of low-precision tensors">,
    Option<"fp8Scaling", "fp8-scaling", "std::string", /*default=*/"\"current\"",
           "fp8: current (each activation scaled by its own amax, found first) | "
           "delayed (by the largest amax of its last fp8-history steps)">,
    Option<"fp8History", "fp8-history", "unsigned", /*default=*/"16",
           "fp8-scaling=delayed: the steps of each activation's amax history">,
    Option<"fp8Gradients", "fp8-gradients", "std::string", /*default=*/"\"bf16\"",
           "fp8: bf16 (the backward's GEMMs stay bf16) | e5m2 (the data and weight "
           "gradient GEMMs of each float8 product read the output gradient in E5M2 "
           "beside E4M3 copies of the weight and the input, transposed where the "
           "float8 layout needs)">,
    Option<"lowNormGradients", "low-norm-gradients", "bool", /*default=*/"false",
           "a layer norm's gradient reads its grad_output (a GEMM's product: dX of the "
           "next linear layer) low, as a region does (off: it stays f32)">,
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

// A module pass, as forge-fuse: a function pass beside placement's would
// share its per-function adaptor, and this pass's dump would show placement.
def ChunkCrossEntropy : Pass<"forge-chunk-cross-entropy", "::mlir::ModuleOp"> {
  let summary = "Run a language model's loss head (logits, cross-entropy, their gradients) in row chunks";
  let description = [{
    A `cross_entropy_grad` whose logits [N, V] (more than `max-bytes`) are
    made by a matmul or gemm of rows `h` [.., K] (through a reshape) and read
    only by their `cross_entropy` and its gradient, and whose gradient D is
    read only by gemms without C, each either rows of D times a matrix (the
    hidden state's gradient) or a sum over D's rows (the weight's gradient,
    D^T B or A^T D), is rewritten into chunks of ceil(N / chunks) rows. Each
    chunk slices h's and the target's rows, makes its logits, loss and D,
    then its rows of the hidden gradient, and adds its part of the weight
    gradient to the previous chunks' (a gemm with C and beta 1). A mean's
    1/N is applied to the upstream gradient once (the chunks sum). The
    chunks' losses and hidden gradients are concatenated.

    Results: every value equals the unchunked head's except the weight
    gradient, whose row sum is reassociated chunk by chunk (fp32). Peak
    memory: one chunk's logits and D instead of all of them (GPT-2 B16: 4.6
    GiB -> 1.2 GiB). A head over the size that does not match gets a remark
    naming why. With `fused-head` (CUDA sm_90; on in the pipeline: GPT-2 B16
    2 chunks, -0.17 ms a step on an H200), a head that forge-fuse-linear-cross-entropy
    will take counts its gradient's bytes (bf16), since its f32 logits are
    never stored: GPT-2 B16 2 chunks instead of 4.
    After forge-assign-precision (the chunks keep the types it chose) and
    before placement (which states each new GEMM's problem).
  }];
  let options = [
    Option<"maxBytes", "max-bytes", "int64_t", /*default=*/"1073741824",
           "Largest logits tensor left whole; a larger one runs in chunks of at most this "
           "many bytes (0: never chunk)">,
    Option<"fusedHead", "fused-head", "bool", /*default=*/"false",
           "forge-fuse-linear-cross-entropy runs later: a head of its form stores no logits, "
           "so its bytes are its gradient's (2 a logit) instead of the f32 logits'">,
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

// A module pass, as forge-chunk-cross-entropy (its dump is its own stage).
def MergeCrossEntropyGrad : Pass<"forge-merge-cross-entropy-grad", "::mlir::ModuleOp"> {
  let summary = "Merge a cross_entropy and its gradient into one cross_entropy_with_grad";
  let description = [{
    cross_entropy(logits, t) -> (loss, lse) and cross_entropy_grad(logits,
    lse, t, g) of the same logits, target and classes, whose lse nothing
    else reads, become cross_entropy_with_grad(logits, t, g) -> (loss, d) at
    the loss's place: one row kernel reads the logits from memory once (a
    row's second read hits L2) where two kernels read them twice (GPT-2 B16:
    3.3 GB per step). g must not depend on the loss; its producers that
    come after the loss (the backward seed, 1/K times a loss scale) move
    before it when they are pure. Values are the two ops' (lse stays in
    registers). After forge-chunk-cross-entropy, which matches the pair.
  }];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

def FuseLinearCrossEntropy : Pass<"forge-fuse-linear-cross-entropy", "::mlir::ModuleOp"> {
  let summary = "The LM head's GEMM and its cross_entropy_with_grad as one CUTLASS call";
  let description = [{
    A matmul x w^T (bf16 [N, K] by [C, K]) whose f32 logits only a
    cross_entropy_with_grad reads, with a bf16 gradient, becomes one
    linear_cross_entropy_with_grad: the runtime's CUTLASS GEMM writes each
    logit's exp(x - m) in f16 (m its row's maximum over the 128 columns of an
    epilogue subtile) and the (m, sum) pairs, and a streaming kernel makes
    the loss and the gradient from them, so the f32 logits are never stored
    (GPT-2 B16: 3.3 GB written and read back a step). K and C multiples of 8.
    CUDA sm_90 only (forgec --fuse-linear-cross-entropy); after the loss
    head's chunking and merge, before placement.
  }];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

def FuseColumnSums : Pass<"forge-fuse-column-sums", "::mlir::ModuleOp"> {
  let summary = "Compute a column sum (a bias gradient) in the loop region that makes its input";
  let description = [{
    A reduce_sum over every dim but the last (f32) of a loop region's result
    becomes part of that region, which turns into a column_reduce region
    yielding the column sums first and then the loop's results as side
    outputs: the tensor is summed as it is written instead of read back by a
    kernel of its own (GPT-2: the MLP's bias gradient over its 100 MB GELU
    gradient, the attention projection's over the residual gradient). Only
    loop regions whose body is pointwise and whose inputs are at the
    iteration shape, per column or scalars (what the column kernel reads).
    After precision (the sums read the stored type, as before) and the loss
    head's stages; before partition and placement.
  }];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

def FuseLineReductions : Pass<"forge-fuse-line-reductions", "::mlir::ModuleOp"> {
  let summary = "Compute a reduction over a middle axis in the loop region that reads it";
  let description = [{
    A keepdims reduce_sum or reduce_mean (f32) of x over one axis that is
    not the innermost, read only by a loop region whose inputs are x and the
    reduction (attention's dk minus its mean over the keys), becomes one
    forge.fusion "lines" region of x: the reduction first, then the loop's
    body. Its kernel sums each line and writes the body's values from the
    same block: x is read from memory once, the reduced tensor never stored,
    one launch and no atomics instead of two launches (GPT-2 bf16: 0.42 ms a
    step). Only where the kernel takes the shape (the elements after the
    axis a multiple of 32). After precision and the loss head's stages;
    before partition and placement.
  }];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

// Stage "tensor parallelism": on the forward graph, before the train step.
def ShardTensorParallel : Pass<"forge-shard-tensor-parallel", "::mlir::func::FuncOp"> {
  let summary = "Tensor parallelism: Megatron's column/row splits of matmul pairs";
  let description = [{
    Splits each pair of matmuls (forge.matmul or forge.gemm with an
    initializer as the weight, or a 2-D transpose of one that only the
    matmul reads: PyTorch's Linear) joined by pointwise ops, as a transformer's
    MLP or a classifier's hidden layer, over the `size` ranks of group "tp"
    (Megatron-LM): the first weight by columns (its bias too), the second by
    rows. Each rank then computes its own columns of the hidden activation
    and a partial product of the output; forge.all_reduce (sum) adds those
    (Megatron's g), and the pair's input passes forge.enter_group (the
    identity, whose gradient is summed over the group: Megatron's f). The
    second weight's bias is added after the sum. Split initializers become
    forge.shard ops, which forge-build-train-step turns into parameters of
    the slice's type; the runtime loads each rank's slice.

    Self-attention splits by heads: a fused q/k/v projection (weight and
    bias by the columns of this rank's heads in each of q, k and v: a shard
    of 3 blocks), the split into q, k, v, their reshapes to [.., heads, head
    size], a forge.attention of layout bshd, transposes, the reshape back and
    the output projection (by rows), then the sum.

    A pair is split only when every hidden value has one reader (the next op
    of the chain), the weights are read by nothing else, the hidden width
    divides by `size`, and a gemm has alpha = beta = 1 and no transposed
    input; each pair left whole gets a remark saying why. It is an error
    when no pair can be split. `size` 1: nothing to do.

    The vocabulary (with `loss` a cross_entropy spec): the matmul or gemm
    that makes the loss's logits output is split by columns, so each rank
    computes its [classes / size] of every row and the logits are never
    whole; the output gets `forge.shard = {axis, group, size}` and
    forge-build-train-step builds the sharded loss on it (Megatron's
    vocabulary-parallel cross-entropy). A weight the embedding's row lookups
    share (a tied embedding, [classes, hidden]) is split by rows with it:
    each forward forge.gather looks the ids up in this rank's rows
    (forge.rank_slice gives the shard's first class), zeroes the rows of
    other ranks' ids and sums over the group. Left whole, with a remark,
    when the classes do not divide by `size` or the weight or logits have
    other readers.
  }];
  let options = [
    Option<"size", "size", "int64_t", /*default=*/"1", "Ranks of the tensor-parallel group">,
    Option<"loss", "loss", "std::string", /*default=*/"",
           "forge-build-train-step's loss spec: with cross_entropy:OUTPUT,LABEL the "
           "OUTPUT's vocabulary is split too">,
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

// Stage "partition": after the graph is final (fusion, precision, the loss
// head), before placement, which places the collectives.
def AssignPipelineStages : Pass<"forge-assign-pipeline-stages", "::mlir::func::FuncOp"> {
  let summary = "Pipeline parallelism: cost-balanced stages of the forward graph";
  let description = [{
    Cuts @main (the forward graph, before the train step is built) into
    `stages` contiguous runs of its ops in program order, balanced by each
    op's estimated cost (FLOPs plus bytes moved), and marks every op but the
    constants with `forge.stage`. Program order makes every value flow from
    a stage to itself or a later one. forge-build-train-step carries the
    marks to each op's gradient and to each parameter's optimizer update;
    forge-split-pipeline-stages then gives every stage its own routine. A
    remark states each stage's ops and share of the cost. Fails when the
    graph has fewer ops than stages.
  }];
  let options = [
    Option<"stages", "stages", "int64_t", /*default=*/"2", "Pipeline stages (ranks of group pp)">,
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

def SplitPipelineStages : Pass<"forge-split-pipeline-stages", "::mlir::ModuleOp"> {
  let summary = "Pipeline parallelism: one routine per stage, with send/recv and a 1F1B order";
  let description = [{
    Splits each routine whose ops carry `forge.stage` (train_step and eval,
    as forge-build-train-step made them with --pp) into one routine per stage,
    `<name>@pp<s>`. An op's stage is its mark; an op without one runs where
    its operands are (the latest of their stages: a sum of a gradient's
    contributions, the gradient norm's partial sums), and ops that read only
    constants and inputs are copied to every stage that reads them. A
    parameter (and its optimizer state) lives on the stage of its first
    forward use; another stage reading it gets it by message. A value made on
    one stage and read on another travels as forge.send/forge.recv (group
    "pp", one tag per value and reader). Every routine keeps the whole
    signature; it returns the updates of its own state and every metric
    (loss, lr, gradient norm: the ones made elsewhere arrive by message).

    The train step's micro-batches are reordered into the 1F1B schedule:
    stage s first runs min(P-1-s, K) forward passes, then alternates one
    forward and one backward, then the remaining backwards; the optimizer
    runs last. The module's `forge.pipeline_schedule` shows it per stage.
  }];
  let dependentDialects = ["::mlir::forge::ForgeDialect", "::mlir::func::FuncDialect"];
}

def Partition : Pass<"forge-partition", "::mlir::func::FuncOp"> {
  let summary = "Data parallelism: the gradient all-reduce in size-capped buckets";
  let description = [{
    forge-build-train-step (`--dp D`) averages every gradient and the loss
    over the data-parallel ranks with one forge.all_reduce placed after the
    whole backward pass. This pass splits each such op into buckets of at
    most `bucket-bytes` (PyTorch DDP's default, 25 MiB; a larger tensor is a
    bucket of its own): operands are taken in the order the step makes them
    (the backward pass makes the last layer's gradients first), and each
    bucket's all_reduce is placed right after its last operand is made, so
    its transfer can overlap the rest of the backward pass. Buckets keep
    that order, which is the same on every rank (each runs this program).
    `bucket-bytes=0`: one all_reduce per tensor. Values are unchanged (an
    element-wise mean is the same whichever bucket it is in). ZeRO-1's
    reduce_scatter ops (one gradient each) move right after their gradient.
  }];
  let options = [
    Option<"bucketBytes", "bucket-bytes", "int64_t", /*default=*/"25 << 20",
           "Largest bucket in bytes (0: one all_reduce per tensor)">,
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

def SplitAccumulation : Pass<"forge-split-accumulation", "::mlir::ModuleOp"> {
  let summary = "Gradient accumulation in a loop: @train_step cut into @accumulate and the rest";
  let description = [{
    forge-build-train-step with `--micro-batches K --accumulate loop` builds
    one micro-batch's forward and backward, whose gradients (and loss) it adds
    into persistent f32 accumulators (the first micro-batch's replace their
    values), and the rest of the step (gradient norm,
    collectives, optimizer) reading the sums through forge.accumulated. This
    pass cuts the step there. @accumulate gets every op that a forge.accumulated
    operand depends on, the arguments they read, and returns each sum as the
    new value of its accumulator (and the other updates those ops make: batch
    norms' running statistics). The runtime runs it once per micro-batch, then
    @train_step, which keeps the other ops, reads each accumulator where the
    sum was read, and drops the data inputs it no longer reads. So the step
    is one graph body run K times, not K unrolled copies.

    A value of the micro-batch part that the rest reads other than through
    forge.accumulated is recomputed there when it depends only on constants
    and arguments other than data inputs (forge.step allowed); otherwise, and
    for an output (not an update) made by the micro-batch part, the pass
    fails naming it. Without forge.accumulated the pass does nothing.

    The micro-batch part comes in two routines: @accumulate_first, which the
    runtime runs for a step's first micro-batch, writes each term into its
    accumulator (where(first, term, acc + term) selects the term), and
    @accumulate adds it. With `gemm-accumulation` (CUDA), a term made by a
    lone GEMM is that GEMM with the accumulator as C and beta = 1: cuBLASLt
    adds it as it writes the product, in place, instead of a kernel reading
    the product and the accumulator again.
  }];
  let options = [
    Option<"gemmAccumulation", "gemm-accumulation", "bool", /*default=*/"false",
           "Add a GEMM-made term into its accumulator through the GEMM's C (CUDA)">,
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect", "::mlir::func::FuncDialect"];
}

// Stage "placement" (the last before the bundle): where each op runs.

def MergeScalarRegions : Pass<"forge-merge-scalar-regions", "::mlir::func::FuncOp"> {
  let summary = "Run scalar regions as members of other kernels instead of launches of their own";
  let description = [{
    A loop region whose results have one element each (or a horizontal
    region of such: forge-fuse's scalar group; or a lone pointwise op of one
    element, which becomes such a region when it can ride) costs a launch
    for a few flops. Each such member whose place is free joins a pointwise region (a
    non-view loop region, or a horizontal region of them, with more than
    scalars) as one more horizontal member:
      * late: only the routine's return reads it (a loss's mean, the
        gradient norm: metrics) -> the last pointwise region after it;
      * early: it reads only the routine's arguments and constants (Adam's
        bias corrections from the step count) -> the first pointwise region
        before its first reader (constants it reads move above that region).
    A member that is neither (a clip scale that the optimizer reads and that
    reads the gradient norm) stays; what stays of a scalar group keeps its
    place. A loop writing a piece of a concat through a reshape (dk's
    centring) is no host: forge-fold-attention-views writes such pieces in
    place only from one-result loops. A host takes riders while its operands
    plus results stay within
    `max-horizontal-operands`. Values are unchanged; the launches of a
    routine drop by one per scalar group emptied (the bench MLP: 14 -> 13).
  }];
  let options = [
    Option<"maxHorizontalOperands", "max-horizontal-operands", "int64_t", /*default=*/"120",
           "Most operands plus results of a host region after its riders join "
           "(forge-fuse's limit for horizontal regions)">,
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

def MergeReductions : Pass<"forge-merge-reductions", "::mlir::func::FuncOp"> {
  let summary = "Run a multi_reduce region inside the horizontal region whose scalar members "
                "alone read its sums";
  let description = [{
    A multi_reduce region (the loss's sum, the gradients' squared norms)
    whose sums only one-element loop members of one later horizontal region
    read (the loss's mean and the gradient norm's square root, which
    forge-merge-scalar-regions put beside the optimizer's updates) joins
    that region as its first member, and those members read the sums inside
    it. The region's kernel gives each sum blocks of its own and evaluates
    the readers in the block that completes the last sum (an arrival count
    kept, until then, in the bits of an f32 result of the readers, zeroed
    with the sums). Not merged: a sum anything else reads (a clip scale the
    updates read, an all-reduce), readers without an f32 result, a host
    whose operands plus results would pass `max-horizontal-operands`.
    Values are unchanged; one launch fewer (the bench MLP: 13 -> 12).
  }];
  let options = [
    Option<"maxHorizontalOperands", "max-horizontal-operands", "int64_t", /*default=*/"120",
           "Most operands plus results of the merged region (forge-fuse's limit for "
           "horizontal regions)">,
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

def ElideCentredSums : Pass<"forge-elide-centred-sums", "::mlir::func::FuncOp"> {
  let summary = "Mark the elements of a sum whose input piece is centred over its axes as zero";
  let description = [{
    x minus its keepdims mean over axes A sums to exactly 0 over axes that
    include A. A reduce_sum (outside regions) of a concat along the one axis
    it keeps, one of whose pieces is such a centring (a "lines" region or a
    sub, through reshapes that keep the leading dims holding A), gets
    `zero_outputs` = that piece's range of the result: kernels write 0 there
    without reading it (attention's dk, centred over the keys, in the qkv
    bias gradient's sum: GPT-2 bf16 reads 25 MB a layer less). CUDA, in
    placement: after forge-merge-reductions, before forge-fold-attention-views
    (which turns the concat into a view).
  }];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

def SelectLibrary : Pass<"forge-select-library", "::mlir::func::FuncOp"> {
  let summary = "Mark the matmul/gemm/conv ops that run as cuBLASLt or cuDNN calls";
  let description = [{
    Sets `forge.library = "cublaslt"` on every matmul and gemm, and
    `forge.library = "cudnn"` on every conv, conv_transpose and
    conv_grad_weight, whose form the CUDA runtime's library paths take
    (runtime/lib/cuda/Conv.h restates the convolution rules). A cuBLASLt op
    also gets its whole problem, `forge.matmul = {m, n, k, batch, trans_a,
    trans_b, lhs_batch_stride, rhs_batch_stride, c = none|full|bias, alpha,
    beta}`, which the bundle carries (Instruction.matmul) and the runtime
    executes without deriving it again:
      * f32 operands and results of static shape, none of zero elements;
      * matmul: both operands at least matrices, and the batch dimensions equal,
        or one side without batch (or all ones: batch stride 0), or the rhs a
        matrix (the lhs batch folds into M);
      * gemm: 2-d operands; C absent, a full [M, N] matrix, or a bias row [N]
        or [1, N] (cuBLASLt's bias epilogue) with beta = 1;
      * convolutions: 1 to 3 spatial dimensions and symmetric pads; a
        conv_transpose whose output follows the conv formula from its input.
    The other forms get generated kernels (forge-generate-kernels).

    Before marking, a standalone `add(matmul(A, W), b)` (W a matrix, b a row
    of N, f32, no transA) becomes `gemm(reshape(A, [M, K]), W, b)` reshaped
    back: cuBLASLt adds the bias as it writes the product (its BIAS epilogue)
    instead of a kernel reading and writing the product again. The pipeline
    runs this pass for CUDA targets only.

    A `forge.fusion "gemm"` (forge-fuse) whose product has a cuBLASLt form
    gets the library marks itself, with the epilogue in `forge.matmul`:
    `epilogue = "relu"` (RELU, or RELU_BIAS with a bias row; not with a full
    C), `"bias"` (BIAS from the region's last input, after a full C),
    `"bgrad_lhs"` or `"bgrad_rhs"` (the bias gradient, its second result,
    summed from that operand as cuBLASLt reads it; one product, no C), and
    the GELU forms (gelu, gelu_aux, dgelu, dgelu_bgrad). cuBLASLt writes a
    bias gradient in D's type: a region whose sum has another type (the f32
    sum forge-assign-precision keeps beside a bf16 D) keeps its product and
    epilogue, and the sum becomes a loose reduce_sum after it. One that has
    no such form becomes its ops again, marked as loose ops are.
  }];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

def FoldAttentionViews : Pass<"forge-fold-attention-views", "::mlir::func::FuncOp"> {
  let summary = "Read q/k/v and write dq/dk/dv in place in the fused qkv buffers";
  let description = [{
    A `forge.split` along the last axis of a [B, T, N] tensor (a fused qkv
    projection) whose every piece is read only by reshapes to [B, T, H, D],
    which are read only as q, k or v operands of cuDNN attention or
    attention_grad ops (`forge.library = "cudnn"`, layout "bshd"), gets
    `forge.placement = "view"`: no instruction runs for it, and
    forge-plan-memory places each piece in its operand's bytes at the
    piece's offset (the reshapes alias as always). Each such attention op
    gets `forge.row_strides = [q, k, v]`: the elements between consecutive
    tokens of each operand (N for a piece, H * D for a packed tensor), which
    the runtime hands cuDNN as strides. A split with any other reader keeps
    its kernel. GPT-2 124M bf16: 12 split kernels fewer (0.59 ms of the step).

    The backward's `forge.concat` along the last axis of dq, dk and dv
    (each a [B, T, H, D] value reshaped to [B, T, H * D] and read only by
    the concat) likewise, when each value is read only by that reshape and
    made by a cuDNN attention_grad (layout bshd) or a loop region (its one
    result: dk's centring): the concat gets `forge.placement = "view"`,
    forge-plan-memory places each maker's result in the concat's bytes at
    the piece's column offset, and each maker gets
    `forge.out_row_strides` (per result, 0: packed): cuDNN's output strides,
    the generated loop kernel's output map. Not when the concat is a
    function result or a piece has another reader. GPT-2 124M bf16: 12
    concat kernels fewer (1.8 GB less traffic a step).
  }];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

def FuseNormGradEpilogues : Pass<"forge-fuse-norm-grad-epilogues", "::mlir::ModuleOp"> {
  let summary = "Fuse a layer norm's gradient with the one region reading its dx";
  let description = [{
    A `layer_norm_grad` (f32, over the last axis, dx asked for) whose dx is
    read only by one loop or column_reduce region, at dx's shape, becomes
    with it one `forge.fusion "norm_grad"`: the norm on the region's first
    three arguments (x, scale, dy), then the reader's body with dx in place
    of its argument; it yields the norm's scale/bias gradients, then the
    reader's results. Its kernel keeps dx in registers (GPT-2 124M: the
    residual gradient's add, bf16 copy and bias sum after each of 24 norms:
    2 x 50 MB less traffic each). A dx that other ops read too (the final
    norm's) fuses with the first of its regions that can go at the norm, and
    the region then also yields dx, last. CUDA, after forge-fuse-column-sums.
  }];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

def FoldContiguousViews : Pass<"forge-fold-contiguous-views", "::mlir::func::FuncOp"> {
  let summary = "Run slices and concats whose pieces are contiguous byte ranges as views";
  let description = [{
    A `forge.slice` (steps 1) whose result is one contiguous run of its
    operand's elements, 64-byte aligned, gets `forge.placement = "view"`: no
    instruction, and forge-plan-memory places the result in the operand's
    bytes at its offset. A `forge.concat` along its leading axis (dims before
    it of size 1) whose every piece is made by an op (not a reshape, view or
    constant) for this concat alone gets the view placement too: the makers
    write their pieces where the concat lies. Never for a routine's
    arguments or results. GPT-2 124M bf16: the loss head's chunk slices and
    gradient concat, and the padded LM head gradient's slice (11 kernels).
  }];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

def PermuteParameters : Pass<"forge-permute-parameters", "::mlir::ModuleOp"> {
  let summary = "Store each parameter in the layout its routines read it in";
  let description = [{
    A parameter that every routine reads through one transpose (a
    convolution weight after forge-assign-layout: [O, C, kh, kw] read as
    [O, kh, kw, C]) is stored in that layout, and so is what the training
    step keeps of its shape: the gradient (which arrives through the inverse
    transpose), the optimizer's state and the pointwise values between them.
    Both transposes go; the arguments get `forge.layout_perm` (stored =
    transpose(canonical, perm)), which the bundle carries so that the runtime
    converts initial values, checkpoints and exports (they stay in the ONNX
    layout). A parameter whose cluster meets anything but pointwise ops,
    rank-0 operands, those transposes, whole reductions and its updates keeps
    its layout (with report=1, a remark says why).
  }];
  let options = [
    Option<"report", "report", "bool", /*default=*/"false",
           "a remark for each parameter left in its layout, with the reason">,
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

def InlineFusions : Pass<"forge-inline-fusions", "::mlir::func::FuncOp"> {
  let summary = "Replace the fusion regions that have no kernel by their ops";
  let description = [{
    Every `forge.fusion` without a `forge.launch` attribute (all of them on
    the CPU, whose bundles run a region's ops one by one) is replaced by its
    body's ops in order; a horizontal region's members are inlined in turn.
    Values, results and program order are otherwise unchanged.
  }];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

// Stage "schedule" (after placement: what runs where is known; before the
// memory plan, which bounds live ranges by the streams' order).

def Schedule : Pass<"forge-schedule", "::mlir::func::FuncOp"> {
  let summary = "Order the routine for a lower peak and put its work on streams with event edges";
  let description = [{
    Order (`order=memory`, the default): each op whose only effect is its
    results (not a collective, a pipeline message or a host call) moves,
    last first, to just before its first reader when every operand it reads
    is still read there or later, so the move shortens its results' live
    ranges and lengthens none: a weight's cast or transpose made at the start
    of the step and first read deep in the forward pass is made there. The
    new order is kept only if the estimated peak of live bytes (op results
    from their op to their last reader) does not grow. `order=program`
    keeps the order it is given.

    Streams: the function gets `forge.streams` (["compute"], plus
    "collective" when it has collectives), each collective `forge.stream =
    1` (NCCL runs it beside the compute stream), every other op the compute
    stream. Event edges follow from data flow (StreamOrder.h): an op reading
    a value made on another stream waits (`forge.waits`) for the event
    recorded after its producer (`forge.event`), unless its stream is
    already ordered after it; `forge.joins` lists the events the routine's
    end waits for (a collective whose results only the routine returns).
    forge-plan-memory keeps a tensor's bytes from reuse until the compute
    stream is ordered after its last reader on another stream.

    Further compute streams (`compute-streams=N`, "compute.1" ...): an op
    continues the stream whose latest op produced one of its operands (a
    chain stays on its stream); one that continues none (a second reader of
    an older value: a weight gradient beside the data gradient, or an op of
    arguments only) forks onto the compute stream idle the longest. Host
    calls and pipeline messages stay on the compute stream; cuDNN calls run
    through their stream's own cuDNN handle. Kept only when the estimated peak, with the longer live
    ranges the other streams' work needs, grows by at most
    `stream-memory-growth` percent (1); while it would grow more, the side
    op that may run across the peak holding the most bytes goes back to the
    compute stream and the rest are assigned again, up to `max-stream-pins`
    times (0 by default: all side ops or none), before one stream is kept
    (GPT-2 bf16 with 64: 323 ops beside, 11 kept in order, the peak
    unchanged: the LM head's weight-gradient GEMMs, which would hold a loss
    chunk's gradient while the next chunk's logits are made).

    `report` prints per routine a timeline, one line per op in its stream's
    column with its waits and event; `report-file` appends it to a file
    (`forgec --schedule-report`, and `schedule.txt` in `--dump-dir`).
  }];
  let options = [
    Option<"order", "order", "std::string", /*default=*/"\"memory\"",
           "memory (move ops to their readers when the peak does not grow) or program">,
    Option<"computeStreams", "compute-streams", "int64_t", /*default=*/"1",
           "Compute streams for independent work (1 to 16)">,
    Option<"streamMemoryGrowth", "stream-memory-growth", "int64_t", /*default=*/"1",
           "How much the estimated peak may grow for further compute streams, in percent">,
    Option<"maxStreamPins", "max-stream-pins", "int64_t", /*default=*/"0",
           "Side-stream ops that may go back to the compute stream, one at a time, to keep "
           "the peak within stream-memory-growth (0: all side ops or none)">,
    Option<"report", "report", "bool", /*default=*/"false",
           "Print the timeline of each routine (stdout)">,
    Option<"reportFile", "report-file", "std::string", /*default=*/"\"\"",
           "Append the timeline of each routine to this file">,
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

// Stage "memory plan" (after placement, which decides what is a kernel).

def PlanMemory : Pass<"forge-plan-memory", "::mlir::func::FuncOp"> {
  let summary = "Decide in-place updates and the arena offset of every tensor";
  let description = [{
    In-place updates: a result returned with `forge.updates = "P"` is written
    into P's buffer when no later op still reads P's old value, nothing else
    reads the new value, and it is returned once. The op computing it may read
    P itself only when it reads each element before writing it: a pointwise
    op, a loop region's kernel (`forge.launch`), or the member of a
    horizontal region's kernel that writes it (members run on different
    blocks at different times). Otherwise a `forge.copy` ("update P") writes
    P after everything else. A routine output that is an input, a constant,
    a persistent tensor or another output gets a `forge.copy` ("output N").

    Arena: every routine input, op result not written in place, and output is
    placed by first fit, largest first, over its live range [definition, last
    use] (inputs from the start, outputs to the end); two tensors share bytes
    only when their live ranges are disjoint. A reshape's result shares its
    operand's bytes (a chain of reshapes is one interval), except when the
    chain starts at an input and ends at an output (the caller may set the
    next inputs before reading the outputs). A result also takes the bytes of
    an operand of its shape and element size that dies at its op, when the op
    reads each element before writing it (pointwise ops, loop regions, the
    logits of cross_entropy_grad) and, for an op on a side stream, every other
    reader of those bytes is ordered before it. Offsets are aligned to the
    bundle section alignment.

    Results: `forge.offsets` on each op (one entry per result, -1 when
    written in place), `forge.offset` on each input argument, and
    `forge.arena_size` on the function. The bundle emitter reads them.

    Library workspace: every op marked `forge.library = "cudnn"` (a
    convolution or an attention; cuBLASLt keeps its fixed 32 MiB workspace)
    gets scratch bytes of the arena, `forge.workspace = array<i64: offset,
    bytes>`, live at that op only: the largest gap the placed tensors leave
    free at its position, rounded down to a power of two (ops of one problem
    then share cuDNN plans) and at most `workspace-cap`. Where no gap of
    `workspace-floor` bytes is free (near the peak), it gets that floor
    above the tensors live there, growing the arena by what the floor
    exceeds. The runtime chooses among the algorithms that fit, so the
    workspace costs memory only where the step has none to spare, instead of
    one buffer of the largest candidate's size beside the arena.

    With `report`, prints per function the arena, the peak of the bytes live
    at once (the arena minus fragmentation), the op where it occurs, and the
    largest tensors live there (what to recompute or shard): `forgec
    --memory-report`; then the library workspaces (how many, their sizes,
    and what the floor added to the arena).
  }];
  let options = [
    Option<"workspaceFloor", "workspace-floor", "int64_t", /*default=*/"64 << 20",
           "Least workspace of a cuDNN op, in bytes (the arena grows for it; forge-schedule counts this default, kCudnnWorkspaceFloor)">,
    Option<"workspaceCap", "workspace-cap", "int64_t", /*default=*/"1 << 30",
           "Most workspace of a cuDNN op, in bytes">,
    Option<"report", "report", "bool", /*default=*/"false",
           "Print the peak and the largest tensors live at it (stdout)">,
    Option<"reportTop", "report-top", "int64_t", /*default=*/"20",
           "How many tensors live at the peak the report lists">,
  ];
  let dependentDialects = ["::mlir::forge::ForgeDialect"];
}

#endif // FORGE_PASSES_TD
