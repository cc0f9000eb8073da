//===- forgec.cpp - the Forge compiler driver ------------------------------===//
//
// ONNX file -> import -> pass pipeline -> .forge bundle. Options are LLVM
// command-line options so that MLIR's own flags (--mlir-print-ir-after-all,
// --mlir-print-ir-after-change, --mlir-timing, crash reproducers) work as in
// every MLIR tool.
//
//===----------------------------------------------------------------------===//
#include "forge/Bundle/BundleEmitter.h"
#include "forge/Codegen/KernelGen.h"
#include "forge/Import/OnnxImporter.h"
#include "forge/Pipeline/Pipeline.h"
#include "forge/Train/TrainGraph.h"
#include "forge/runtime/BatchSchedule.h"
#include "forge/runtime/Bundle.h"
#include "forge/runtime/DataSource.h"
#include "forge/runtime/Npy.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/Timing.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SHA256.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

#define TOML_EXCEPTIONS 0  // forgec is built without exceptions (LLVM flags)
#define TOML_HEADER_ONLY 1 // so the exception mode need not match the shared library
#include <toml++/toml.h>

#include <map>
#include <optional>

using namespace mlir;
namespace cl = llvm::cl;

static cl::OptionCategory forgecCategory("forgec options");
static cl::opt<std::string> inputFile(cl::Positional, cl::desc("<model.onnx>"), cl::Required,
                                      cl::cat(forgecCategory));
static cl::opt<std::string> outputFile("o", cl::desc("Output file (default: <model>.forge)"),
                                       cl::value_desc("file"), cl::cat(forgecCategory));
static cl::opt<std::string> target("target", cl::desc("Target device: cpu (default), cuda:sm_80, cuda:sm_89 or cuda:sm_90"),
                                   cl::init("cpu"), cl::cat(forgecCategory));
static cl::opt<std::string> weights(
    "weights", cl::init("embedded"),
    cl::desc("embedded (default): parameters' initial values in the bundle; external: a thin "
             "bundle that reads them at load time from the model's ONNX external-data file "
             "(forge-train --weights DIR); forgec then needs no weight values"),
    cl::cat(forgecCategory));
static cl::opt<bool> tf32("tf32",
                          cl::desc("CUDA: f32 matmuls on TF32 tensor cores (cuBLASLt "
                                   "CUBLAS_COMPUTE_32F_FAST_TF32; ~1e-3 relative error)"),
                          cl::init(false), cl::cat(forgecCategory));
static cl::opt<std::string> precision(
    "precision", cl::init("fp32"),
    cl::desc("fp32 (default) | tf32 (as --tf32) | bf16 | fp16 | fp8: the training step's "
             "activations, gradients and GEMM operands in bf16 (or fp16, with dynamic loss "
             "scaling) on tensor cores, with fp32 master weights, optimizer and statistics "
             "(forge-assign-precision); fp8 (experimental): bf16 with the forward GEMMs in "
             "float8 E4M3, scaled per tensor"),
    cl::cat(forgecCategory));
static cl::opt<std::string> fp8Scaling(
    "fp8-scaling", cl::init("current"),
    cl::desc("--precision fp8: current (default): each GEMM operand scaled by its own amax, "
             "found before its cast | delayed: an activation scaled by the largest amax of its "
             "last --fp8-history steps (a state tensor per activation, checkpointed; the first "
             "step scales by 1; with --dp the ranks share the largest amax), so its cast need "
             "not wait for a reduction; weights and data inputs keep current scaling"),
    cl::cat(forgecCategory));
static cl::opt<unsigned> fp8History(
    "fp8-history", cl::init(16),
    cl::desc("--fp8-scaling delayed: the steps each amax history holds (1..65536; default 16)"),
    cl::cat(forgecCategory));
static cl::opt<bool> lowNormGradients(
    "low-norm-gradients",
    cl::desc("with --precision bf16|fp16|fp8: a layer norm's gradient reads its grad_output (the "
             "next linear layer's dX) low, as a region does (forge-assign-precision); its x, the "
             "residual stream, stays f32. Off by default: the norm's bias and scale gradients "
             "would sum rounded terms"),
    cl::init(false), cl::cat(forgecCategory));
static cl::opt<std::string> fp8Gradients(
    "fp8-gradients", cl::init("bf16"),
    cl::desc("--precision fp8: bf16 (default): the backward's GEMMs in bf16 | e5m2: the data "
             "and weight gradient GEMMs of each float8 product in float8 too, the output "
             "gradient in E5M2 beside E4M3 copies of the weight and the input (transposed "
             "copies where Hopper's K-major float8 layout needs them)"),
    cl::cat(forgecCategory));
static cl::opt<std::string> layout(
    "layout", cl::init("auto"),
    cl::desc("auto (default) | nchw | nhwc: the layout of 2-d convolution nets in the training "
             "step, or the forward of --inference-only (forge-assign-layout); auto is nhwc for "
             "CUDA targets whose convolutions "
             "run on tensor cores (--tf32, or --precision tf32, bf16, fp16, fp8), else nchw"),
    cl::cat(forgecCategory));
static cl::opt<std::string> augment(
    "augment",
    cl::desc("[INPUT:]ITEM,... input transforms compiled into the graph (forge-augment-inputs), "
             "for a rank-4 float image input [B,C,H,W] (INPUT: the only one when not named): "
             "pixels (the bundle takes u8 [B,H,W,C] pixels, as forge-train's image folders give "
             "them, scaled by 1/255 on the device), flip (each training sample mirrored along its "
             "width with probability 1/2; eval never), normalize=imagenet, mean=R/G/B, std=R/G/B, "
             "canvas=HxW (with pixels: the bundle takes each decoded image in a u8 [B,H,W,3] "
             "canvas and its crop box, INPUT.crop [B,6], and crops and scales on the device)"),
    cl::cat(forgecCategory));
static cl::opt<bool> memoryReport(
    "memory-report",
    cl::desc("Print each routine's arena, its peak of live tensors and the largest tensors live "
             "at the peak (what to recompute or shard)"),
    cl::init(false), cl::cat(forgecCategory));
static cl::opt<bool> scheduleReport(
    "schedule-report",
    cl::desc("Print each routine's schedule: its ops in order, one column per stream, with the "
             "events they record and wait for (--dump-dir writes it to schedule.txt)"),
    cl::init(false), cl::cat(forgecCategory));
static cl::opt<std::string> scheduleOrder(
    "schedule-order",
    cl::desc("memory: move ops to their first readers where that lowers the peak of live "
             "memory (default); program: keep the order the passes made"),
    cl::init("memory"), cl::cat(forgecCategory));
static cl::opt<int64_t> computeStreams(
    "compute-streams",
    cl::desc("CUDA: compute streams for independent work (a weight gradient beside the data "
             "gradient), 1 to 16 (default 2); kept where it does not raise the peak of live "
             "memory (--stream-memory-growth)"),
    cl::init(2), cl::cat(forgecCategory));
static cl::opt<int64_t> streamMemoryGrowth(
    "stream-memory-growth",
    cl::desc("How much (percent) further compute streams may raise the estimated peak of live "
             "memory before one stream is kept (default 1)"),
    cl::init(1), cl::cat(forgecCategory));
static cl::opt<int64_t> maxStreamPins(
    "max-stream-pins",
    cl::desc("While further compute streams raise the estimated peak too far, put back on the "
             "compute stream the side op holding the most bytes across it and assign the rest "
             "again, up to N times (default 8; 0: all side ops or one stream; a further "
             "stream's 32 MiB GEMM workspace is not counted)"),
    cl::init(8), cl::cat(forgecCategory));
static cl::opt<bool> foldAttentionViews(
    "fold-attention-views",
    cl::desc("CUDA: cuDNN attention reads q, k and v where a fused qkv projection wrote them "
             "and writes dq, dk and dv where their concat lies (no split or concat kernel; "
             "forge-fold-attention-views). =false keeps both, for comparisons"),
    cl::init(true), cl::cat(forgecCategory));
static cl::opt<bool> fuseNormGradEpilogues(
    "fuse-norm-grad-epilogues",
    cl::desc("CUDA: a layer norm's gradient and the region reading its dx run as one kernel, "
             "dx kept in registers (forge-fuse-norm-grad-epilogues). =false keeps two kernels, "
             "for comparisons"),
    cl::init(true), cl::cat(forgecCategory));
static cl::opt<bool> foldContiguousViews(
    "fold-contiguous-views",
    cl::desc("CUDA: slices whose result is a contiguous run of their operand, and concats along "
             "their leading axis, run as views of the same bytes (no kernel; "
             "forge-fold-contiguous-views). =false keeps their kernels, for comparisons"),
    cl::init(true), cl::cat(forgecCategory));
static cl::opt<bool> permuteParameters(
    "permute-parameters",
    cl::desc("Channels-last conv nets: store each weight (with its gradient and optimizer state) "
             "in the layout the convolutions read, so no step transposes it "
             "(forge-permute-parameters; checkpoints stay in the ONNX layout). =false keeps "
             "the ONNX layout, for comparisons"),
    cl::init(true), cl::cat(forgecCategory));
static cl::opt<bool> fuseColumnSums(
    "fuse-column-sums",
    cl::desc("CUDA: a column sum (bias gradient) of a loop region's result is computed by that "
             "region's kernel as it writes the result (forge-fuse-column-sums). =false keeps "
             "the sum's own kernel, for comparisons"),
    cl::init(true), cl::cat(forgecCategory));
static cl::opt<bool> fuseLineReductions(
    "fuse-line-reductions",
    cl::desc("CUDA: a reduction over a middle axis read only by a loop region that reads its "
             "input too (attention's dk minus its mean over the keys) runs in one kernel with "
             "that region (forge-fuse-line-reductions). =false keeps two kernels, for "
             "comparisons"),
    cl::init(true), cl::cat(forgecCategory));
static cl::opt<bool> fuseLinearCrossEntropy(
    "fuse-linear-cross-entropy",
    cl::desc("CUDA sm_90: a bf16 matmul x w^T whose f32 logits only a cross_entropy_with_grad "
             "reads (a language model's head) runs as one CUTLASS call that never stores the "
             "f32 logits (forge-fuse-linear-cross-entropy; needs a runtime built with "
             "CUTLASS). =false keeps the cuBLASLt GEMM and the loss kernel"),
    cl::init(true), cl::cat(forgecCategory));
static cl::opt<bool> mergeReductions(
    "merge-reductions",
    cl::desc("CUDA: a multi_reduce region (the loss's sum, the gradient norms) whose sums only "
             "the optimizer's scalar members read runs inside the optimizer's kernel "
             "(forge-merge-reductions). =false keeps its own launch, for comparisons"),
    cl::init(true), cl::cat(forgecCategory));
static cl::opt<bool> elideCentredSums(
    "elide-centred-sums",
    cl::desc("CUDA: a sum whose input piece is centred over its axes (attention's dk in the qkv "
             "bias gradient) writes 0 there without reading it (forge-elide-centred-sums). "
             "=false reads and sums it, for comparisons"),
    cl::init(true), cl::cat(forgecCategory));
static cl::opt<bool> gemmAuxEpilogues(
    "gemm-aux-epilogues",
    cl::desc("CUDA: also the cuBLASLt epilogues that save a tensor for the backward or read "
             "one (GELU_AUX/DGELU, RELU_AUX/DRELU). Without the flag: the GELU's with "
             "--precision bf16 (GPT-2 4% faster), none otherwise (slower in TF32, the "
             "ReLU's in bf16 too; fp16/fp8 unmeasured)"),
    cl::init(false), cl::cat(forgecCategory));
static cl::opt<int64_t> gemmPadMinFlops(
    "gemm-pad-min-flops",
    cl::desc("CUDA: the smallest matmul/gemm (2*M*N*K FLOPs) whose unaligned dims are "
             "zero-padded for cuBLASLt's aligned kernels (0: every one)"),
    cl::init(int64_t(1) << 30), cl::cat(forgecCategory));
static cl::opt<int64_t> lossChunkBytes(
    "loss-chunk-bytes",
    cl::desc("Largest logits tensor of a cross-entropy loss head computed whole; a larger one "
             "(a language model's vocabulary) runs in row chunks of at most this many bytes, "
             "its logits and their gradient never all live (0: never chunk)"),
    cl::init(int64_t(1) << 30), cl::cat(forgecCategory));
static cl::opt<std::string> recompute(
    "recompute",
    cl::desc("none (default) | attention | auto: recompute in the backward pass what the forward "
             "pass would keep for it (forge-rematerialize); attention: an unfused attention's "
             "probabilities [B, H, T, T] (fp32/TF32 on CUDA), made again from Q and K by one "
             "matmul and one softmax pass per layer; auto: attention only where the plan does "
             "not fit --device-memory without it"),
    cl::init("none"), cl::cat(forgecCategory));
static cl::opt<bool> inferenceOnly("inference-only",
                                   cl::desc("Compile the forward graph only (no training step)"),
                                   cl::cat(forgecCategory));
static cl::opt<std::string> batchFlag(
    "batch",
    cl::desc("Value of dim 0 of every input whose dim 0 is symbolic; auto: the largest batch "
             "whose planned device memory fits in --device-memory (a multiple of 8 from 8 on)"),
    cl::value_desc("N|auto"), cl::init(""), cl::cat(forgecCategory));
static cl::opt<std::string> deviceMemory(
    "device-memory",
    cl::desc("--batch auto, --recompute auto: the GPU's memory (e.g. 80GB, 141GB, 24GiB); the plan (arena, "
             "parameters, optimizer state, constants, GEMM workspace) must fit in 90% of it, "
             "the rest left to the CUDA context and cuDNN's workspaces"),
    cl::value_desc("SIZE"), cl::init(""), cl::cat(forgecCategory));
/// --batch as a number (0: not given; with --batch auto, the batch being tried).
static int64_t batch = 0;
static bool batchAuto = false;
static cl::list<std::string> shapes("shape", cl::desc("Static shape of an input: NAME=d0,d1,..."),
                                    cl::value_desc("NAME=DIMS"), cl::cat(forgecCategory));
static cl::opt<std::string> shapesFrom(
    "shapes-from",
    cl::desc("Static shapes of the inputs from a sample batch: each array of FILE.npz named "
             "like a graph input gives that input's shape (--shape overrides)"),
    cl::value_desc("FILE.npz"), cl::cat(forgecCategory));
static cl::list<std::string> dims("dim", cl::desc("Value of a symbolic dim: NAME=N"),
                                  cl::value_desc("NAME=N"), cl::cat(forgecCategory));
static cl::opt<std::string>
    dumpDir("dump-dir",
            cl::desc("Write NN-passname.mlir/.onnx after import and every pass, with "
                     "summary.txt (each stage's launches, bytes, FLOPs), "
                     "costs.txt (the last stage's launches by estimated "
                     "bytes) and schedule.txt"),
            cl::value_desc("DIR"), cl::cat(forgecCategory));
static cl::OptionCategory trainCategory("training options (also from --recipe FILE.toml; flags win)");
static cl::opt<std::string> recipe("recipe", cl::desc("TOML file with training options (keys = option names)"),
                                   cl::value_desc("FILE"), cl::cat(trainCategory));
static cl::opt<std::string> loss("loss",
                                 cl::desc("Loss: cross_entropy:OUTPUT,LABEL[,smoothing=S][,probs: LABEL holds class probabilities] | mse:OUTPUT,LABEL | "
                                          "bce:OUTPUT,LABEL (on logits) | output:NAME (model computes it)"),
                                 cl::cat(trainCategory));
static cl::opt<std::string> optimizer("optimizer",
                                      cl::desc("sgd|momentum|nesterov|adam|adamw[:lr=,momentum=,nesterov=,"
                                               "beta1=,beta2=,eps=,weight_decay=]"),
                                      cl::cat(trainCategory));
static cl::opt<std::string> lrSchedule("lr-schedule",
                                       cl::desc("constant | cosine:warmup=N,total=N[,min_ratio=R] | "
                                                "linear:warmup=N,total=N[,min_ratio=R]"),
                                       cl::init("constant"), cl::cat(trainCategory));
static cl::opt<std::string> lossScale(
    "loss-scale",
    cl::desc("none | dynamic[:init=S,interval=N,growth=G,backoff=B]: multiply the loss by a scale "
             "before the backward pass, divide the gradients after, skip steps whose gradients "
             "are not finite (scale x backoff) and grow it after N finite steps (defaults 65536, "
             "2000, 2, 0.5). Default: dynamic with --precision fp16, else none"),
    cl::cat(trainCategory));
static cl::opt<double> clipGradNorm("clip-grad-norm", cl::desc("Clip the global gradient norm (0: off)"),
                                    cl::init(0.0), cl::cat(trainCategory));
static cl::opt<int64_t> microBatches("micro-batches",
                                     cl::desc("Accumulate gradients over K micro-batches of --batch each"),
                                     cl::init(1), cl::cat(trainCategory));
static cl::opt<int64_t> samplesPerStep(
    "samples-per-step",
    cl::desc("With --batch auto: the samples of one optimizer step (per rank). forgec picks "
             "the largest micro-batch that divides it and whose plan fits --device-memory, "
             "and accumulates the rest in the loop (--micro-batches N / batch)"),
    cl::init(0), cl::cat(trainCategory));
static cl::opt<std::string> batchSchedule(
    "batch-schedule",
    cl::desc("S1:N1,S2:N2,...,Sn: samples per optimizer step (per rank) by step: S1 up to step "
             "N1, then S2 up to N2, ..., Sn after (e.g. 64:1000,256). Each S a multiple of "
             "--batch, which is the micro-batch: a step runs S / batch micro-batches of the "
             "accumulation loop (one compiled shape serves every size)"),
    cl::cat(trainCategory));
static cl::opt<std::string> lengthBuckets(
    "length-buckets",
    cl::desc("NAME=T1,T2,...,Tn: compile the step for each value of the symbolic dim NAME "
             "(a sequence length): the largest is the plain train_step/eval, each smaller Tk "
             "adds train_step@lenTk and eval@lenTk, sharing the parameters. forge-train "
             "batches variable-length token data (--doc-separator) by length into them"),
    cl::cat(trainCategory));
/// --length-buckets parsed: the dim and its values, ascending (empty: none).
static std::string bucketDim;
static std::vector<int64_t> bucketValues;
static cl::opt<std::string> accumulate(
    "accumulate",
    cl::desc("loop | unroll: with --micro-batches K, run one micro-batch's forward and backward "
             "K times (a routine of its own, adding into fp32 gradient accumulators; the default) "
             "or build K unrolled copies into the step (what --pp needs, and its default)"),
    cl::cat(trainCategory));
static cl::opt<int64_t> dataParallel(
    "dp",
    cl::desc("Data parallelism over D ranks (forge-train --nproc D, or RANK/WORLD_SIZE from a "
             "launcher): each rank trains on its own --batch; gradients and loss are averaged "
             "over the ranks. --dp 1 builds the same collectives for one rank"),
    cl::init(0), cl::cat(trainCategory));
static cl::opt<int64_t> zeroStage(
    "zero",
    cl::desc("ZeRO stage with --dp D: 1 splits the optimizer state (Adam's moments, momentum) "
             "of every parameter whose first dim divides by D over the ranks; each rank reduces "
             "and applies its part of the gradient, then the ranks gather the parameters"),
    cl::init(0), cl::cat(trainCategory));
static cl::opt<int64_t> tensorParallel(
    "tp",
    cl::desc("Tensor parallelism over T ranks (Megatron): each pair of matmuls joined by "
             "pointwise ops (an MLP) is split by columns, then rows, over the ranks, which all "
             "read the same batch. With --dp D the run has D x T ranks"),
    cl::init(1), cl::cat(trainCategory));
static cl::opt<int64_t> pipelineParallel(
    "pp",
    cl::desc("Pipeline parallelism over P ranks: the forward graph is cut into P stages of "
             "about equal cost, each rank runs one stage's forward and backward passes over "
             "the --micro-batches in the 1F1B order and updates its own parameters; values "
             "cross between stages by send/recv"),
    cl::init(1), cl::cat(trainCategory));
static cl::opt<bool> exposeGradients("expose-gradients",
                                     cl::desc("Also output every parameter's gradient from train_step "
                                              "(forge.grad.NAME; for parity checks)"),
                                     cl::cat(trainCategory));
static cl::opt<bool> gradNormFlag(
    "grad-norm",
    cl::desc("Compute the global gradient norm every step and output it (forge-train's metrics "
             "grad_norm) even without --clip-grad-norm or dynamic loss scaling, which compute "
             "it anyway (a pass over every gradient)"),
    cl::cat(trainCategory));
static cl::opt<bool> keepSharedInitializers(
    "keep-shared-initializers",
    cl::desc("Train parameters that the exporter merged into one initializer (equal initial "
             "values, Identity nodes named after the others) as one shared parameter; by "
             "default each Identity of an initializer becomes its own parameter"),
    cl::cat(trainCategory));
static cl::opt<std::string> batchnormRunningVar(
    "batchnorm-running-var",
    cl::desc("BatchNorm's running variance in training: biased (ONNX) or unbiased (PyTorch); "
             "default: unbiased when the model's producer is PyTorch, else biased"),
    cl::value_desc("biased|unbiased"), cl::cat(trainCategory));
static cl::list<std::string> freeze("freeze", cl::desc("Keep initializers matching this glob frozen"),
                                    cl::value_desc("PATTERN"), cl::cat(trainCategory));

enum class EmitKind { Bundle, Mlir };
static cl::opt<EmitKind> emit("emit", cl::desc("What to write"), cl::init(EmitKind::Bundle),
                              cl::values(clEnumValN(EmitKind::Bundle, "bundle", ".forge bundle"),
                                         clEnumValN(EmitKind::Mlir, "mlir", "final IR as text")),
                              cl::cat(forgecCategory));

static bool parseDims(StringRef text, std::vector<int64_t> &out) {
  for (StringRef part : llvm::split(text, ',')) {
    int64_t v;
    if (part.trim().getAsInteger(10, v) || v < 0)
      return false;
    out.push_back(v);
  }
  return !out.empty();
}

static int fail(const Twine &message) {
  llvm::errs() << "forgec: error: " << message << "\n";
  return 1;
}

/// ImportOptions from the shape and weight flags; an error message or "".
static std::string importOptionsFromFlags(mlir::forge::ImportOptions &o) {
  if (inferenceOnly) {
    // Training flags on an inference bundle would be ignored: say so.
    std::string given;
    int count = 0;
    for (cl::Option *o : std::initializer_list<cl::Option *>{
             &loss, &optimizer, &lrSchedule, &clipGradNorm, &gradNormFlag, &microBatches,
             &accumulate, &batchSchedule, &samplesPerStep, &dataParallel, &tensorParallel,
             &pipelineParallel, &zeroStage})
      if (o->getNumOccurrences())
        given += (count++ ? ", --" : "--") + o->ArgStr.str();
    if (count)
      return given + (count > 1 ? " configure" : " configures") +
             " training and cannot be used with --inference-only";
  }
  if (!batchFlag.empty()) {
    batchAuto = batchFlag == "auto";
    if (!batchAuto && (StringRef(batchFlag).getAsInteger(10, batch) || batch <= 0))
      return "--batch must be a positive number of samples or auto (got '" + batchFlag + "')";
    if (batchAuto && inferenceOnly)
      return "--batch auto sizes a training step; give a number with --inference-only";
    if (batchAuto && deviceMemory.empty())
      return "--batch auto needs --device-memory (the GPU's memory, e.g. 80GB or 141GB)";
  }
  if (samplesPerStep.getNumOccurrences() || samplesPerStep != 0) {
    if (samplesPerStep < 1)
      return "--samples-per-step must be a positive number of samples";
    if (!batchAuto)
      return "--samples-per-step picks the micro-batch with --batch auto (with a number, use "
             "--micro-batches)";
    if (microBatches.getNumOccurrences() || !batchSchedule.empty() || pipelineParallel > 1 ||
        accumulate == "unroll")
      return "--samples-per-step sets the micro-batches of the accumulation loop: not with "
             "--micro-batches, --batch-schedule, --pp or --accumulate unroll";
    if (recompute == "auto")
      return "--samples-per-step with --recompute auto is not supported: give --recompute "
             "none or attention";
  }
  if (!batchSchedule.empty()) {
    // The micro-batch is --batch; each stage's size a multiple of it, the
    // largest one's count of micro-batches what the bundle's loop runs at most.
    ::forge::rt::BatchSchedule schedule;
    std::string why;
    if (!::forge::rt::BatchSchedule::parse(batchSchedule.getValue(), schedule, why))
      return "--batch-schedule: " + why;
    if (batchAuto || batch <= 0)
      return "--batch-schedule needs --batch N, the micro-batch that every size is a multiple of";
    if (microBatches.getNumOccurrences())
      return "--batch-schedule sets the micro-batches of each step; drop --micro-batches";
    if (accumulate == "unroll" || pipelineParallel > 1)
      return "--batch-schedule runs the accumulation loop a varying number of times: it "
             "cannot be used with --accumulate unroll or --pp";
    for (const auto &s : schedule.stages)
      if (s.samples % batch != 0)
        return "--batch-schedule: " + std::to_string(s.samples) + " is not a multiple of --batch " +
               std::to_string(batch);
    if (schedule.maxSamples() / batch < 2)
      return "--batch-schedule '" + batchSchedule.getValue() + "' never takes more than --batch " +
             std::to_string(batch) + " samples a step: drop it, or lower --batch";
    microBatches = schedule.maxSamples() / batch;
  }
  if (recompute == "auto" && deviceMemory.empty())
    return "--recompute auto needs --device-memory (the GPU's memory, e.g. 80GB or 141GB)";
  if (!deviceMemory.empty() && !batchAuto && recompute != "auto")
    return "--device-memory applies to --batch auto and --recompute auto";
  o.batch = batch;
  o.keepFloatInitializers = !inferenceOnly; // they become parameters
  o.untieSharedInitializers = !inferenceOnly && !keepSharedInitializers;
  if (weights != "embedded" && weights != "external")
    return "--weights must be embedded or external (got '" + weights + "')";
  if (weights == "external" && inferenceOnly)
    return "--weights external needs a training bundle (its parameters are read at load time); "
           "drop --inference-only";
  o.externalWeights = weights == "external";
  for (const std::string &s : shapes) {
    auto [name, value] = StringRef(s).split('=');
    std::vector<int64_t> d;
    if (name.empty() || !parseDims(value, d))
      return "--shape expects NAME=d0,d1,... (got '" + s + "')";
    o.inputShapes[name.str()] = d;
  }
  if (!shapesFrom.empty()) {
    auto arrays = ::forge::rt::readNpz(shapesFrom);
    if (!arrays)
      return "--shapes-from: " + arrays.status().message();
    for (const auto &[name, array] : *arrays) // after --shape: those win
      if (o.inputShapes.emplace(name, array.shape).second)
        o.optionalShapeNames.insert(name);
  }
  for (const std::string &s : dims) {
    auto [name, value] = StringRef(s).split('=');
    int64_t v;
    if (name.empty() || value.getAsInteger(10, v) || v < 0)
      return "--dim expects NAME=N (got '" + s + "')";
    o.dimValues[name.str()] = v;
  }
  if (!lengthBuckets.empty()) {
    auto [name, list] = StringRef(lengthBuckets.getValue()).split('=');
    SmallVector<StringRef> parts;
    list.split(parts, ',');
    for (StringRef part : parts) {
      int64_t v;
      if (part.trim().getAsInteger(10, v) || v < 1)
        return "--length-buckets expects NAME=T1,T2,... with positive lengths (got '" +
               lengthBuckets + "')";
      bucketValues.push_back(v);
    }
    llvm::sort(bucketValues);
    bucketValues.erase(std::unique(bucketValues.begin(), bucketValues.end()),
                       bucketValues.end());
    if (name.empty() || bucketValues.size() < 2)
      return "--length-buckets expects NAME=T1,T2,... with at least two lengths (got '" +
             lengthBuckets + "')";
    bucketDim = name.str();
    if (o.dimValues.count(bucketDim))
      return "--length-buckets sets dim '" + bucketDim + "' (its largest length is the plain "
             "train_step's): drop --dim " + bucketDim + "=...";
    if (inferenceOnly)
      return "--length-buckets compiles training steps; drop --inference-only";
    if (batchAuto || !batchSchedule.empty() || accumulate == "unroll" || pipelineParallel > 1)
      return "--length-buckets is not supported yet with --batch auto, --batch-schedule, "
             "--accumulate unroll or --pp";
    o.dimValues[bucketDim] = bucketValues.back();
  }
  return "";
}

/// --recipe FILE.toml: fills the options the command line did not give; an
/// error message or "".
static std::string applyRecipe() {
  if (recipe.empty())
    return "";
  toml::parse_result parsed = toml::parse_file(recipe.getValue());
  if (!parsed)
    return "recipe '" + recipe + "': " + std::string(parsed.error().description()) +
           " at line " + std::to_string(parsed.error().source().begin.line);
  const toml::table &table = parsed.table();
  for (auto &&[key, node] : table) {
    std::string k(key.str());
    auto str = [&](cl::opt<std::string> &o) {
      if (!node.is_string())
        return false;
      if (!o.getNumOccurrences())
        o = *node.value<std::string>();
      return true;
    };
    bool ok = true;
    if (k == "loss") ok = str(loss);
    else if (k == "optimizer") ok = str(optimizer);
    else if (k == "lr-schedule") ok = str(lrSchedule);
    else if (k == "target") ok = str(target);
    else if (k == "clip-grad-norm") {
      ok = node.is_number();
      if (ok && !clipGradNorm.getNumOccurrences())
        clipGradNorm = *node.value<double>();
    } else if (k == "grad-norm") {
      ok = node.is_boolean();
      if (ok && !gradNormFlag.getNumOccurrences())
        gradNormFlag = *node.value<bool>();
    } else if (k == "batch") {
      // An integer, or "auto".
      ok = node.is_integer() || (node.is_string() && *node.value<std::string>() == "auto");
      if (ok && !batchFlag.getNumOccurrences())
        batchFlag = node.is_integer() ? std::to_string(*node.value<int64_t>())
                                      : *node.value<std::string>();
    } else if (k == "micro-batches") {
      ok = node.is_integer();
      if (ok && !microBatches.getNumOccurrences())
        microBatches = *node.value<int64_t>();
    } else if (k == "accumulate") {
      ok = str(accumulate);
    } else if (k == "batch-schedule") {
      ok = str(batchSchedule);
    } else if (k == "length-buckets") {
      ok = str(lengthBuckets);
    } else if (k == "samples-per-step") {
      ok = node.is_integer();
      if (ok && !samplesPerStep.getNumOccurrences())
        samplesPerStep = *node.value<int64_t>();
    } else if (k == "dp") {
      ok = node.is_integer();
      if (ok && !dataParallel.getNumOccurrences())
        dataParallel = *node.value<int64_t>();
    } else if (k == "zero") {
      ok = node.is_integer();
      if (ok && !zeroStage.getNumOccurrences())
        zeroStage = *node.value<int64_t>();
    } else if (k == "tp") {
      ok = node.is_integer();
      if (ok && !tensorParallel.getNumOccurrences())
        tensorParallel = *node.value<int64_t>();
    } else if (k == "pp") {
      ok = node.is_integer();
      if (ok && !pipelineParallel.getNumOccurrences())
        pipelineParallel = *node.value<int64_t>();
    } else if (k == "freeze") {
      ok = node.is_array();
      if (ok && !freeze.getNumOccurrences())
        for (auto &&item : *node.as_array()) {
          ok &= item.is_string();
          if (item.is_string())
            freeze.push_back(*item.value<std::string>());
        }
    } else {
      return "recipe '" + recipe + "': unknown key '" + k + "'";
    }
    if (!ok)
      return "recipe '" + recipe + "': key '" + k + "' has the wrong type";
  }
  return "";
}

/// The training flags as text (checked by parseTrainFlags).
static mlir::forge::TrainFlags trainFlags() {
  mlir::forge::TrainFlags t;
  t.loss = loss;
  t.optimizer = optimizer;
  t.lrSchedule = lrSchedule;
  t.clipGradNorm = clipGradNorm;
  t.microBatches = microBatches;
  t.dynamicMicroBatches = !batchSchedule.empty();
  t.accumulate = accumulate;
  t.dataParallel = dataParallel;
  t.zero = zeroStage;
  t.freeze.assign(freeze.begin(), freeze.end());
  t.exposeGradients = exposeGradients;
  t.gradNorm = gradNormFlag;
  t.batchnormRunningVar = batchnormRunningVar;
  t.lossScale = lossScale.getNumOccurrences() ? lossScale.getValue()
                : precision == "fp16"         ? std::string("dynamic")
                                              : std::string();
  return t;
}

/// Bytes from a size like "80GB", "141 GB", "24GiB", "1.5TB" or "4096" (bytes):
/// decimal units (kB, MB, GB, TB) and binary ones (KiB, MiB, GiB, TiB).
static std::optional<uint64_t> parseBytes(StringRef text) {
  text = text.trim();
  size_t digits = text.find_first_not_of("0123456789.");
  double value;
  if (digits == 0 || text.substr(0, digits).getAsDouble(value) || value <= 0)
    return std::nullopt;
  StringRef unit = text.substr(digits == StringRef::npos ? text.size() : digits).trim();
  static const std::pair<const char *, double> units[] = {
      {"", 1},         {"B", 1},           {"kB", 1e3},        {"KB", 1e3},
      {"MB", 1e6},     {"GB", 1e9},        {"TB", 1e12},       {"KiB", 1024.0},
      {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  for (auto [name, scale] : units)
    if (unit.equals_insensitive(name)) {
      double bytes = value * scale;
      if (bytes >= 1.8e19) // beyond uint64
        return std::nullopt;
      return static_cast<uint64_t>(bytes);
    }
  return std::nullopt;
}

static std::string gib(uint64_t bytes) {
  return bytes >= (uint64_t(1) << 30) ? llvm::formatv("{0:F2} GiB", bytes / 1073741824.0).str()
                                      : llvm::formatv("{0:F2} MiB", bytes / 1048576.0).str();
}

/// --batch auto: the largest batch whose planned device bytes (`planAt`, a
/// trial compile) fit in 90% of `memory`: from 8 on a multiple of 8 (tensor
/// cores take dims in multiples of 8), else 1..7. The plan grows about
/// linearly with the batch, so after two multiples of 8 the search tries the
/// line's prediction and its neighbour, and falls back to doubling and
/// bisection when the line misses.
/// A trial compile of --batch auto: its planned device bytes, or why it did
/// not compile (a batch too large for 32-bit kernel indices does not fit).
struct Trial {
  bool compiled = false;
  uint64_t bytes = 0;
  std::string error;
};

/// 90% of --device-memory (the rest: the CUDA context, cuDNN's workspaces), or nullopt
/// after an error naming the value.
static std::optional<uint64_t> allowedBytes(StringRef memory) {
  std::optional<uint64_t> total = parseBytes(memory);
  if (!total) {
    fail("--device-memory '" + memory + "': expected a size such as 80GB, 141GB or 24GiB");
    return std::nullopt;
  }
  return *total / 10 * 9;
}

/// The largest batch whose plan fits `allowed`, or nullopt with `error` saying why none does.
static std::optional<int64_t> autoBatch(StringRef memory, uint64_t allowed,
                                        llvm::function_ref<Trial(int64_t)> planAt,
                                        std::string &error) {
  std::map<int64_t, uint64_t> plans; // batch -> planned bytes (UINT64_MAX: did not compile)
  std::map<int64_t, std::string> errors;
  int trials = 0;
  // A trial that fails to compile (a tensor of 2^31 elements) does not fit.
  auto fits = [&](int64_t b) {
    if (!plans.count(b)) {
      Trial t = planAt(b);
      ++trials;
      plans[b] = t.compiled ? t.bytes : UINT64_MAX;
      if (!t.compiled)
        errors[b] = t.error;
    }
    return plans[b] <= allowed;
  };
  int64_t best = 0, over = 0; // largest batch that fits; smallest candidate that does not
  if (!fits(8)) {
    over = 8;
    for (int64_t b = 7; b >= 1 && !best; --b) {
      if (fits(b))
        best = b;
      else
        over = b;
    }
  } else {
    // A model whose inputs have a fixed batch dimension ignores --batch: its
    // plan does not grow, and the search would never end.
    fits(16);
    if (!errors.count(16) && plans[16] == plans[8]) {
      error = "--batch auto: the plan does not grow with the batch (" + gib(plans[8]) +
              " at 8 and at 16): the model's inputs have a fixed batch dimension";
      return std::nullopt;
    }
    // Multiples of 8: m * 8. The plan of m is about linear: extrapolate from
    // the two largest that fit (at most 4x the larger) until one does not,
    // then interpolate inside the bracket, bisecting every other step so that
    // a bad line cannot stall the search.
    int64_t lo = 1, hi = 0; // lo fits; hi (if > 0) does not
    int64_t prev = 0;       // the fitting m before lo (0: none yet)
    auto planOf = [&](int64_t m) { return double(plans[8 * m]); };
    for (int step = 0; hi == 0 || hi > lo + 1; ++step) {
      int64_t m;
      if (hi == 0) {
        m = 2 * lo;
        if (prev && planOf(lo) > planOf(prev)) {
          double slope = (planOf(lo) - planOf(prev)) / double(lo - prev);
          m = lo + int64_t((double(allowed) - planOf(lo)) / slope);
        }
        m = std::clamp<int64_t>(m, lo + 1, 4 * lo);
        if (m > (int64_t(1) << 20))
          break;
      } else if (step % 2 == 0 && planOf(hi) > planOf(lo)) {
        m = lo + int64_t((double(allowed) - planOf(lo)) * double(hi - lo) /
                         (planOf(hi) - planOf(lo)));
        m = std::clamp<int64_t>(m, lo + 1, hi - 1);
      } else {
        m = lo + (hi - lo) / 2;
      }
      if (fits(8 * m)) {
        prev = lo;
        lo = m;
      } else {
        hi = m;
      }
    }
    best = 8 * lo;
    over = hi ? 8 * hi : 0;
  }
  if (!best && errors.count(1)) {
    error = "--batch auto: a batch of 1 does not compile: " + errors[1];
    return std::nullopt;
  }
  if (!best) {
    error = llvm::formatv("--batch auto: even a batch of 1 plans {0} on the device, more than "
                          "the {1} allowed (90% of --device-memory {2}); use a smaller model, "
                          "--precision bf16, or --recompute attention",
                          gib(plans[1]), gib(allowed), memory)
                .str();
    return std::nullopt;
  }
  std::string next = !over || !plans.count(over) ? std::string()
                     : errors.count(over)
                         ? llvm::formatv("; {0} does not compile: {1}", over, errors[over]).str()
                         : llvm::formatv("; {0} needs {1}", over, gib(plans[over])).str();
  llvm::errs() << llvm::formatv("forgec: --batch auto: {0} (plan {1} of the {2} allowed, 90% of "
                                "--device-memory {3}{4}; {5} trial compiles)\n",
                                best, gib(plans[best]), gib(allowed), memory, next, trials);
  return best;
}

/// --augment's [INPUT:]ITEM,... into `out`; an error message, or "".
static std::string parseAugment(StringRef spec, mlir::forge::PipelineOptions::Augment &out) {
  auto [head, rest] = spec.split(':');
  StringRef items = spec;
  if (!rest.empty() || spec.ends_with(":")) {
    out.input = head.str();
    items = rest;
  }
  auto values = [](StringRef list, std::vector<double> &to) {
    SmallVector<StringRef> parts;
    list.split(parts, '/');
    for (StringRef p : parts) {
      double v;
      if (p.trim().getAsDouble(v))
        return false;
      to.push_back(v);
    }
    return !to.empty();
  };
  SmallVector<StringRef> list;
  items.split(list, ',', -1, false);
  if (list.empty())
    return "no transforms given";
  for (StringRef item : list) {
    auto [key, value] = item.trim().split('=');
    if (key == "pixels" && value.empty()) {
      out.pixels = true;
    } else if (key == "flip" && value.empty()) {
      out.flip = true;
    } else if (key == "canvas") {
      auto [h, w] = value.split('x');
      if (h.getAsInteger(10, out.canvasHeight) || w.getAsInteger(10, out.canvasWidth) ||
          out.canvasHeight < 1 || out.canvasWidth < 1)
        return ("canvas '" + value + "' is not HEIGHTxWIDTH in pixels").str();
    } else if (key == "normalize" && value == "imagenet") {
      out.mean.assign(std::begin(::forge::rt::kImageNetMean), std::end(::forge::rt::kImageNetMean));
      out.std.assign(std::begin(::forge::rt::kImageNetStd), std::end(::forge::rt::kImageNetStd));
    } else if (key == "mean" && (out.mean.clear(), values(value, out.mean))) {
    } else if (key == "std" && (out.std.clear(), values(value, out.std))) {
    } else {
      return ("unknown transform '" + item.trim() +
              "' (pixels, flip, normalize=imagenet, mean=R/G/B, std=R/G/B, canvas=HxW)")
          .str();
    }
  }
  if (out.canvasHeight > 0 && !out.pixels)
    return "canvas=HxW takes pixels (the canvas holds u8 images)";
  return "";
}

/// The pipeline's options from the flags, each checked (before the import,
/// so that a typo fails fast; the train-step pass parses the same text
/// again). Returns the first problem, or "".
static std::string pipelineOptionsFromFlags(mlir::forge::PipelineOptions &o) {
  o.target = target;
  o.train = trainFlags();
  o.memoryReport = memoryReport;
  // Unless given: the pipeline's rule (the GELU's in bf16).
  o.auxEpilogues = !gemmAuxEpilogues.getNumOccurrences() ? "auto" : gemmAuxEpilogues ? "on" : "off";
  o.foldAttentionViews = foldAttentionViews;
  o.foldContiguousViews = foldContiguousViews;
  o.fuseNormGradEpilogues = fuseNormGradEpilogues;
  o.permuteParameters = permuteParameters;
  o.fuseColumnSums = fuseColumnSums;
  o.fuseLineReductions = fuseLineReductions;
  o.fuseLinearCrossEntropy = fuseLinearCrossEntropy;
  o.mergeReductions = mergeReductions;
  o.elideCentredSums = elideCentredSums;
  o.scheduleReport = scheduleReport;
  o.scheduleOrder = scheduleOrder;
  o.computeStreams = computeStreams;
  o.streamMemoryGrowth = streamMemoryGrowth;
  o.maxStreamPins = maxStreamPins;
  if (precision != "fp32" && precision != "tf32" && precision != "bf16" && precision != "fp16" &&
      precision != "fp8")
    return "unknown --precision '" + precision + "' (fp32, tf32, bf16, fp16, fp8)";
  if (precision == "fp8" && target == "cuda:sm_80")
    return "--precision fp8 needs float8 tensor cores (cuda:sm_89 or cuda:sm_90), not " + target;
  if ((precision == "bf16" || precision == "fp16" || precision == "fp8") && inferenceOnly)
    return std::string("--precision " + precision +
                       " applies to the training step; use it without --inference-only");
  o.precision = precision;
  if (fp8Scaling != "current" && fp8Scaling != "delayed")
    return "unknown --fp8-scaling '" + fp8Scaling + "' (current, delayed)";
  if (fp8Scaling != "current" && precision != "fp8")
    return "--fp8-scaling " + fp8Scaling + " needs --precision fp8";
  if (fp8History < 1 || fp8History > 65536)
    return "--fp8-history must be 1..65536, got " + std::to_string(fp8History);
  o.fp8Scaling = fp8Scaling;
  o.fp8History = fp8History;
  if (fp8Gradients != "bf16" && fp8Gradients != "e5m2")
    return "unknown --fp8-gradients '" + fp8Gradients + "' (bf16, e5m2)";
  if (fp8Gradients != "bf16" && precision != "fp8")
    return "--fp8-gradients " + fp8Gradients + " needs --precision fp8";
  o.fp8Gradients = fp8Gradients;
  if (lowNormGradients && precision != "bf16" && precision != "fp16" && precision != "fp8")
    return "--low-norm-gradients needs --precision bf16, fp16 or fp8";
  o.lowNormGradients = lowNormGradients;
  if (layout != "auto" && layout != "nchw" && layout != "nhwc")
    return "unknown --layout '" + layout + "' (auto, nchw, nhwc)";
  // auto: channels-last for convolutions on tensor cores (ResNet-50 on an H200:
  // bf16 22.3 ms NHWC, 43.1 NCHW; TF32 38.7 NHWC, ~43 NCHW; bench/RESULTS.md);
  // strict fp32 (FMA) keeps NCHW, the layout its tests and cuDNN's FMA kernels
  // were tuned on.
  const bool tensorCores = tf32 || precision != "fp32";
  o.layout = layout != "auto"                 ? std::string(layout)
             : target != "cpu" && tensorCores ? "nhwc"
                                              : "nchw";
  if (gemmPadMinFlops < 0)
    return "--gemm-pad-min-flops must be >= 0, got " + std::to_string(gemmPadMinFlops);
  o.gemmPadMinFlops = gemmPadMinFlops;
  if (lossChunkBytes < 0)
    return "--loss-chunk-bytes must be >= 0, got " + std::to_string(lossChunkBytes);
  o.lossChunkBytes = lossChunkBytes;
  if (recompute != "none" && recompute != "attention" && recompute != "auto")
    return "--recompute must be none, attention or auto, got '" + recompute + "'";
  if (tensorParallel < 1)
    return "--tp must be >= 1, got " + std::to_string(tensorParallel);
  o.tensorParallel = tensorParallel;
  if (pipelineParallel < 1)
    return "--pp must be >= 1, got " + std::to_string(pipelineParallel);
  if (pipelineParallel > 1 && precision == "fp8")
    return "--pp with --precision fp8 is not supported yet (bf16 is)";
  // With --tp a rank's activations are partly its own shard's: which amax
  // to share is not settled (--dp reduces them with a max over the ranks).
  if (fp8Scaling == "delayed" && tensorParallel > 1)
    return "--fp8-scaling delayed with --tp is not supported yet (--dp is)";
  o.train.pipeline = pipelineParallel;
  // auto: trial plans without recomputation first (below).
  o.recompute = recompute == "auto" ? std::string("none") : recompute.getValue();
  if (!augment.empty()) {
    std::string error = parseAugment(augment, o.augment);
    if (!error.empty())
      return "--augment '" + augment + "': " + error;
  }
  return "";
}

/// The bundle's build options (what forge-train and `forge-replay -v` show
/// and check) from the flags.
static void addBuildOptions(std::map<std::string, std::string> &build,
                            const mlir::forge::TrainOptions &train) {
  build["mode"] = inferenceOnly ? "inference" : "training";
  // TF32 for what stays f32 (bf16 GEMMs compute in f32 whatever the flag).
  if (tf32 || precision != "fp32")
    build["tf32"] = "1";
  if (precision != "fp32")
    build["precision"] = precision;
  if (precision == "fp8")
    build["fp8_scaling"] = fp8Scaling == "delayed" ? "delayed:history=" + std::to_string(fp8History)
                                                   : std::string("current");
  if (precision == "fp8")
    build["fp8_gradients"] = fp8Gradients;
  if (lowNormGradients)
    build["low_norm_gradients"] = "1";
  if (!inferenceOnly && !trainFlags().lossScale.empty())
    build["loss_scale"] = trainFlags().lossScale;
  build["weights"] = weights;
  SmallString<256> absolute(inputFile.getValue());
  (void)llvm::sys::fs::make_absolute(absolute);
  build["source_onnx"] = absolute.str().str();
  if (!inferenceOnly) {
    build["loss"] = loss;
    if (train.loss.kind != "output")
      build["label_input"] = train.loss.label;
    build["optimizer"] = optimizer;
    build["lr_schedule"] = lrSchedule;
    build["micro_batches"] = std::to_string(microBatches);
    if (train.accumulateLoop)
      build["accumulate"] = "loop";
    if (!batchSchedule.empty())
      build["batch_schedule"] = batchSchedule;
    if (!bucketValues.empty()) {
      std::string list;
      for (int64_t v : bucketValues)
        list += (list.empty() ? "" : ",") + std::to_string(v);
      build["length_buckets"] = bucketDim + "=" + list;
    }
    if (dataParallel > 0)
      build["data_parallel"] = std::to_string(dataParallel);
    if (tensorParallel > 1)
      build["tensor_parallel"] = std::to_string(tensorParallel);
    if (pipelineParallel > 1)
      build["pipeline_parallel"] = std::to_string(pipelineParallel);
    if (zeroStage > 0)
      build["zero"] = std::to_string(zeroStage);
    if (clipGradNorm > 0)
      build["clip_grad_norm"] = std::to_string(clipGradNorm);
    if (gradNormFlag)
      build["grad_norm"] = "1";
  }
}

int main(int argc, char **argv) {
  llvm::InitLLVM initLLVM(argc, argv);
  registerMLIRContextCLOptions();
  registerPassManagerCLOptions();
  registerDefaultTimingManagerCLOptions();
  registerAsmPrinterCLOptions();
  // libLLVM registers hundreds of backend options; --help shows Forge's and
  // MLIR's own (--mlir-*) only. --help-hidden still lists everything.
  for (auto &[name, option] : cl::getRegisteredOptions()) {
    bool ours = llvm::is_contained(option->Categories, &forgecCategory) ||
                llvm::is_contained(option->Categories, &trainCategory);
    if (!ours && !name.starts_with("mlir-") && name != "help" && name != "version")
      option->setHiddenFlag(cl::Hidden);
  }
  cl::ParseCommandLineOptions(argc, argv, "forgec: compile an ONNX model into a .forge bundle\n");

  // The recipe first: it fills options (batch and target too) that the command
  // line did not give, before anything reads them.
  if (std::string error = applyRecipe(); !error.empty())
    return fail(error);
  mlir::forge::ImportOptions importOptions;
  if (std::string error = importOptionsFromFlags(importOptions); !error.empty())
    return fail(error);
  if (target != "cpu" && !mlir::forge::parseCudaTarget(target))
    return fail("unknown --target '" + target + "' (cpu, cuda:sm_80, cuda:sm_89, cuda:sm_90)");
  // Checked here, before the import, so that a typo fails fast.
  mlir::forge::PipelineOptions pipelineOptions;
  if (std::string error = pipelineOptionsFromFlags(pipelineOptions); !error.empty())
    return fail(error);
  std::string trainError;
  FailureOr<mlir::forge::TrainOptions> trainOptions =
      inferenceOnly ? FailureOr<mlir::forge::TrainOptions>(mlir::forge::TrainOptions{})
                    : mlir::forge::parseTrainFlags(pipelineOptions.train, trainError);
  if (failed(trainOptions))
    return fail(trainError);

  // The output: a new path or an existing regular file, never the input model
  // (checked before the work; -o /dev/sda as root used to replace the device).
  std::string output = outputFile;
  if (output.empty()) {
    SmallString<256> p(inputFile.getValue());
    llvm::sys::path::replace_extension(p, emit == EmitKind::Mlir ? "mlir" : "forge");
    output = p.str().str();
  }
  if (llvm::sys::fs::exists(output)) {
    llvm::sys::fs::file_status st;
    if (llvm::sys::fs::status(output, st) || st.type() != llvm::sys::fs::file_type::regular_file)
      return fail("-o '" + output + "' exists and is not a regular file; give a new path or a "
                  "regular file to replace");
    if (llvm::sys::fs::equivalent(output, inputFile.getValue()))
      return fail("-o '" + output + "' is the input model; give another output path");
  }
  DialectRegistry registry;
  mlir::forge::registerForgeDialects(registry);
  MLIRContext context(registry);
  context.loadAllAvailableDialects();
  // An error of a pass names the problem; the whole function printed after it
  // (MLIR's default for pass diagnostics) buries the message. The flag
  // --mlir-print-op-on-diagnostic still turns it on.
  if (!cl::getRegisteredOptions().lookup("mlir-print-op-on-diagnostic")->getNumOccurrences())
    context.printOpOnDiagnostic(false);
  // Warnings (e.g. CUDA instructions left on the host) are shown too; MLIR's
  // default prints errors only.
  llvm::SourceMgr sourceMgr;
  SourceMgrDiagnosticHandler diagnostics(sourceMgr, &context);

  auto source = llvm::MemoryBuffer::getFile(inputFile, false, false);
  if (!source)
    return fail("cannot read '" + inputFile + "': " + source.getError().message());
  llvm::SHA256 sha;
  sha.update((*source)->getBuffer());
  std::string sourceHash = llvm::toHex(sha.final(), /*LowerCase=*/true);

  DefaultTimingManager timing;
  applyDefaultTimingManagerCLOptions(timing);
  TimingScope rootTiming = timing.getRootScope();

  // --augment canvas=HxW: the crop size the data pipeline's boxes are for (the image
  // input's H x W), as build option image_crop "INPUT=HxW".
  std::string imageCrop;
  // Import and the pipeline at batch `b`. A trial (--batch auto's search)
  // writes no dumps and no memory report.
  auto compileAt = [&](int64_t b, bool trial, OwningOpRef<ModuleOp> &module) -> LogicalResult {
    importOptions.batch = b;
    {
      TimingScope importTiming = rootTiming.nest("import");
      module = mlir::forge::importOnnxBytes(&context, (*source)->getBuffer(), inputFile,
                                            importOptions);
    }
    if (!module)
      return failure();
    // Length buckets: the model again at each smaller length, its @main
    // renamed @main@len<T> beside the largest's (the train step builds each).
    for (size_t i = 0; i + 1 < bucketValues.size(); ++i) {
      mlir::forge::ImportOptions at = importOptions;
      at.dimValues[bucketDim] = bucketValues[i];
      OwningOpRef<ModuleOp> other;
      {
        TimingScope importTiming = rootTiming.nest("import");
        other = mlir::forge::importOnnxBytes(&context, (*source)->getBuffer(), inputFile, at);
      }
      if (!other)
        return failure();
      auto funcs = llvm::to_vector(other->getOps<func::FuncOp>());
      if (funcs.size() != 1 || funcs.front().getSymName() != "main") {
        llvm::errs() << "forgec: error: --length-buckets: the import at " << bucketDim << "="
                     << bucketValues[i] << " did not give one @main function\n";
        return failure();
      }
      func::FuncOp main = funcs.front();
      main->remove();
      main.setSymName(("main@len" + std::to_string(bucketValues[i])));
      module->push_back(main);
    }
    if (!augment.empty() && pipelineOptions.augment.input.empty()) {
      // The image input: the only static rank-4 float input of the model.
      std::vector<std::string> images;
      for (auto f : module->getOps<func::FuncOp>())
        for (unsigned i = 0; i < f.getNumArguments(); ++i) {
          auto t = dyn_cast<RankedTensorType>(f.getArgument(i).getType());
          auto name = f.getArgAttrOfType<StringAttr>(i, "forge.name");
          if (t && name && t.getRank() == 4 && isa<FloatType>(t.getElementType()))
            images.push_back(name.str());
        }
      if (images.size() != 1) {
        llvm::errs() << "forgec: error: --augment: the model has " << images.size()
                     << " rank-4 float inputs; name the image input (--augment INPUT:...)\n";
        return failure();
      }
      pipelineOptions.augment.input = images.front();
    }
    if (pipelineOptions.augment.canvasHeight > 0)
      for (auto f : module->getOps<func::FuncOp>())
        for (unsigned i = 0; i < f.getNumArguments(); ++i) {
          auto t = dyn_cast<RankedTensorType>(f.getArgument(i).getType());
          auto name = f.getArgAttrOfType<StringAttr>(i, "forge.name");
          if (t && name && name.getValue() == pipelineOptions.augment.input && t.getRank() == 4)
            imageCrop = pipelineOptions.augment.input + "=" + std::to_string(t.getDimSize(2)) +
                        "x" + std::to_string(t.getDimSize(3));
        }
    if (auto untied = (*module)->getAttrOfType<DictionaryAttr>("forge.untied_initializers")) {
      if (!trial)
        llvm::errs() << "forgec: untied " << untied.size()
                     << " parameter(s) that the exporter had merged into shared initializers "
                        "(each Identity of an initializer is its own parameter again; "
                        "--keep-shared-initializers keeps them merged)\n";
      (*module)->removeAttr("forge.untied_initializers");
    }
    if (!trial && !dumpDir.empty() &&
        failed(mlir::forge::writeStageDump(*module, dumpDir, 0, "import")))
      return failure();
    PassManager pm(&context);
    if (failed(applyPassManagerCLOptions(pm)))
      return failure();
    TimingScope pipelineTiming = rootTiming.nest("pipeline");
    if (!trial) {
      pm.enableTiming(pipelineTiming);
      if (!dumpDir.empty())
        mlir::forge::addDumpInstrumentation(pm, dumpDir, 1);
    }
    mlir::forge::PipelineOptions options = pipelineOptions;
    options.memoryReport = pipelineOptions.memoryReport && !trial;
    options.scheduleReport = pipelineOptions.scheduleReport && !trial;
    if (!trial && !dumpDir.empty()) { // appended per routine: start it afresh
      llvm::SmallString<256> file(dumpDir);
      llvm::sys::path::append(file, "schedule.txt");
      llvm::sys::fs::remove(file);
      options.scheduleFile = std::string(file);
    }
    if (inferenceOnly)
      mlir::forge::buildInferencePipeline(pm, options);
    else
      mlir::forge::buildTrainingPipeline(pm, options);
    return pm.run(*module);
  };

  mlir::forge::BundleEmitOptions emitOptions;
  emitOptions.target = target;
  emitOptions.sourceHash = sourceHash;
  auto &build = emitOptions.buildOptions;
  addBuildOptions(build, *trainOptions);

  // The plan at batch b, from a quiet compile and emit (--batch auto, --recompute auto).
  auto trialAt = [&](int64_t b) -> Trial {
    // A trial keeps its diagnostics to itself; its first error says why the
    // batch does not compile (e.g. a tensor of 2^31 elements): no fit.
    std::string error;
    ScopedDiagnosticHandler quiet(&context, [&](Diagnostic &d) {
      if (d.getSeverity() == DiagnosticSeverity::Error && error.empty())
        error = d.str();
      return success();
    });
    OwningOpRef<ModuleOp> trial;
    ::forge::rt::BundleWriter w;
    if (failed(compileAt(b, true, trial)) ||
        failed(mlir::forge::emitBundle(*trial, emitOptions, w)))
      return {false, 0, error.empty() ? "the compile failed" : error};
    return {true,
            ::forge::rt::plannedTensorBytes(w.program()) +
                ::forge::rt::plannedWorkspaceBytes(w.program()) *
                    ::forge::rt::computeStreamCount(w.program()),
            ""};
  };
  std::optional<uint64_t> allowed;
  if (!deviceMemory.empty() && !(allowed = allowedBytes(deviceMemory)))
    return 1;
  const bool recomputeAuto = recompute == "auto";
  if (batchAuto && samplesPerStep > 0) {
    // The largest micro-batch B dividing N whose plan (with the loop's accumulators
    // and K = N / B) fits: plans grow with B, so bisect the divisors.
    const int64_t n = samplesPerStep;
    std::vector<int64_t> divisors;
    for (int64_t d = 1; d <= n; ++d)
      if (n % d == 0)
        divisors.push_back(d);
    std::map<int64_t, Trial> trials;
    auto fits = [&](int64_t b) {
      if (!trials.count(b)) {
        pipelineOptions.train.microBatches = n / b;
        trials[b] = trialAt(b);
      }
      return trials[b].compiled && trials[b].bytes <= *allowed;
    };
    int64_t lo = -1, hi = static_cast<int64_t>(divisors.size()); // lo fits, hi does not
    while (hi - lo > 1) {
      int64_t mid = (lo + hi) / 2;
      (fits(divisors[mid]) ? lo : hi) = mid;
    }
    if (lo < 0)
      return fail(llvm::formatv("--batch auto --samples-per-step {0}: even a micro-batch of 1 "
                                "plans {1}, more than the {2} allowed (90% of --device-memory "
                                "{3}){4}",
                                n, trials[1].compiled ? gib(trials[1].bytes) : "nothing",
                                gib(*allowed), deviceMemory,
                                trials[1].compiled ? "" : ": " + trials[1].error)
                      .str());
    batch = divisors[lo];
    microBatches = n / batch;
    pipelineOptions.train.microBatches = microBatches;
    build["micro_batches"] = std::to_string(microBatches);
    if (microBatches > 1)
      build["accumulate"] = "loop";
    build["device_memory"] = deviceMemory;
    build["samples_per_step"] = std::to_string(n);
    llvm::errs() << llvm::formatv(
        "forgec: --batch auto: {0} x {1} micro-batch{2} = {3} samples per step (plan {4} of "
        "the {5} allowed, 90% of --device-memory {6}{7}; {8} trial compiles)\n",
        batch, microBatches, microBatches > 1 ? "es" : "", n, gib(trials[batch].bytes),
        gib(*allowed), deviceMemory,
        hi < static_cast<int64_t>(divisors.size())
            ? llvm::formatv("; a micro-batch of {0} needs {1}", divisors[hi],
                            trials[divisors[hi]].compiled ? gib(trials[divisors[hi]].bytes)
                                                          : "a failed compile")
                  .str()
            : std::string(),
        trials.size());
  } else if (batchAuto) {
    // --recompute auto: the largest batch without recomputation; with it only when not
    // even a batch of 1 fits without (recomputing costs time on every step).
    std::string error;
    auto chosen = autoBatch(deviceMemory, *allowed, trialAt, error);
    if (!chosen && recomputeAuto) {
      llvm::errs() << "forgec: --recompute auto: " << error << "; trying --recompute attention\n";
      pipelineOptions.recompute = "attention";
      error.clear();
      chosen = autoBatch(deviceMemory, *allowed, trialAt, error);
    }
    if (!chosen)
      return fail(error);
    batch = *chosen;
    build["device_memory"] = deviceMemory;
  } else if (recomputeAuto) {
    Trial without = trialAt(batch);
    if (!without.compiled || without.bytes > *allowed) {
      pipelineOptions.recompute = "attention";
      Trial with = trialAt(batch);
      llvm::errs() << llvm::formatv(
          "forgec: --recompute auto: attention (the plan is {0} without recomputation, {1} "
          "with it, of the {2} allowed: 90% of --device-memory {3})\n",
          without.compiled ? gib(without.bytes) : "not compiled (" + without.error + ")",
          with.compiled ? gib(with.bytes) : "not compiled (" + with.error + ")", gib(*allowed),
          deviceMemory);
      if (!with.compiled || with.bytes > *allowed)
        llvm::errs() << "forgec: warning: --recompute auto: the plan does not fit with "
                        "recomputation either; use a smaller --batch, or --batch auto\n";
    } else {
      llvm::errs() << llvm::formatv("forgec: --recompute auto: none (the plan is {0} of the {1} "
                                    "allowed: 90% of --device-memory {2})\n",
                                    gib(without.bytes), gib(*allowed), deviceMemory);
    }
    build["device_memory"] = deviceMemory;
  }
  if (!inferenceOnly)
    build["recompute"] = pipelineOptions.recompute;
  if (batch > 0)
    build["batch"] = std::to_string(batch);

  OwningOpRef<ModuleOp> module;
  if (failed(compileAt(batch, false, module)))
    return 1;

  if (emit == EmitKind::Mlir) {
    std::error_code ec;
    llvm::raw_fd_ostream out(output, ec);
    if (ec)
      return fail("cannot write '" + output + "': " + ec.message());
    module->print(out);
    return 0;
  }

  TimingScope emitTiming = rootTiming.nest("emit bundle");
  ::forge::rt::BundleWriter writer;
  emitOptions.kernelDumpDir = dumpDir;
  emitOptions.timing = &emitTiming;
  if (!imageCrop.empty())
    emitOptions.buildOptions["image_crop"] = imageCrop;
  if (failed(mlir::forge::emitBundle(*module, emitOptions, writer)))
    return 1;
  // The schedule against the memory plan, as the runtime will run them: a race
  // between streams is a compiler bug, caught here rather than as wrong numbers.
  if (::forge::rt::Status races = ::forge::rt::checkScheduleRaces(writer.program());
      !races.isOk())
    return fail("internal error: the schedule and the memory plan disagree: " + races.message());
  ::forge::rt::Status status = writer.writeFile(output);
  if (!status.isOk())
    return fail(status.message());
  return 0;
}
