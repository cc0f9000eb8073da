//===- TrainGraph.cpp - inference graph -> training step -------------------===//
//
// Invariants of the generated routines:
//  * trainable parameters are float initializers not matched by --freeze; they
//    become `forge.kind = "parameter"` arguments (initial value attached), and
//    their roles come from how the graph uses them (conv/matmul weight, bias,
//    norm scale/bias, embedding), never from their position;
//  * gradients flow only from the loss to values that depend on a trainable
//    parameter; nothing is built for frozen parameters or integer inputs;
//  * with K micro-batches the step sums K forward/backward passes (each loss a
//    mean over its micro-batch) and scales by 1/K, which equals one K-times
//    larger batch for mean-reduced losses; with D data-parallel ranks the
//    gradients and the loss are then averaged over the ranks (forge.all_reduce),
//    which equals one D-times larger batch again;
//  * the optimizer math follows PyTorch's formulas exactly (so parity tests
//    can compare at fp32 rounding level).
//
//===----------------------------------------------------------------------===//
#include "forge/Train/TrainGraph.h"

#include <cmath>
#include <limits>
#include <map>

#include "forge/Dialect/ForgeBuilder.h"
#include "forge/Dialect/ForgeDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/GlobPattern.h"

#include <cmath>

using namespace mlir;
using namespace mlir::forge;

//===----------------------------------------------------------------------===//
// Option parsing
//===----------------------------------------------------------------------===//

namespace {

/// Splits "kind:k=v,k=v" into kind and key/value pairs.
bool splitSpec(StringRef text, std::string &kind, SmallVectorImpl<std::pair<std::string, std::string>> &kv,
               std::string &error) {
  auto [head, rest] = text.split(':');
  kind = head.trim().str();
  if (kind.empty()) {
    error = "missing kind in '" + text.str() + "'";
    return false;
  }
  if (rest.empty())
    return true;
  for (StringRef part : llvm::split(rest, ',')) {
    auto [k, v] = part.split('=');
    if (k.trim().empty() || v.trim().empty()) {
      error = "expected key=value, got '" + part.str() + "' in '" + text.str() + "'";
      return false;
    }
    kv.push_back({k.trim().str(), v.trim().str()});
  }
  return true;
}

bool toDouble(StringRef s, double &out) { return !s.getAsDouble(out) && std::isfinite(out); }

} // namespace

FailureOr<LossSpec> mlir::forge::parseLossSpec(StringRef text, std::string &error) {
  LossSpec spec;
  auto [kind, rest] = text.split(':');
  spec.kind = kind.str();
  SmallVector<StringRef> parts;
  rest.split(parts, ',');
  if (spec.kind == "output") {
    if (parts.size() != 1 || parts[0].empty()) {
      error = "--loss output:NAME names the model output that is the loss";
      return failure();
    }
    spec.output = parts[0].str();
    return spec;
  }
  if (spec.kind != "cross_entropy" && spec.kind != "mse" && spec.kind != "bce") {
    error = "unknown loss '" + spec.kind + "' (cross_entropy, mse, bce, output)";
    return failure();
  }
  // cross_entropy's options after OUTPUT,LABEL: smoothing=S, probs and ignore=N, in any
  // order.
  while (parts.size() > 2 && spec.kind == "cross_entropy") {
    StringRef option = parts.back();
    if (option.starts_with("smoothing=")) {
      double v = 0;
      if (!toDouble(option.drop_front(10), v) || v < 0 || v >= 1) {
        error = "--loss cross_entropy:...,smoothing=S takes 0 <= S < 1, not '" +
                option.drop_front(10).str() + "'";
        return failure();
      }
      spec.smoothing = v;
    } else if (option == "probs") {
      spec.probs = true;
    } else if (option.starts_with("ignore=")) {
      int64_t v = 0;
      if (option.drop_front(7).getAsInteger(10, v)) {
        error = "--loss cross_entropy:...,ignore=N takes an integer label, not '" +
                option.drop_front(7).str() + "'";
        return failure();
      }
      spec.ignoreIndex = v;
    } else {
      break;
    }
    parts.pop_back();
  }
  if (parts.size() != 2 || parts[0].empty() || parts[1].empty()) {
    error = "--loss " + spec.kind + ":OUTPUT,LABEL names a model output and the label input to add" +
            (spec.kind == "cross_entropy"
                 ? " (and optionally smoothing=S, probs: the label holds class probabilities, "
                   "and ignore=N: label N has no loss term)"
                 : "");
    return failure();
  }
  if (spec.ignoreIndex && spec.probs) {
    error = "--loss cross_entropy: ignore=N applies to class-index labels, not to probs";
    return failure();
  }
  spec.output = parts[0].str();
  spec.label = parts[1].str();
  return spec;
}

FailureOr<OptimizerSpec> mlir::forge::parseOptimizerSpec(StringRef text, std::string &error) {
  OptimizerSpec spec;
  SmallVector<std::pair<std::string, std::string>> kv;
  if (!splitSpec(text, spec.kind, kv, error))
    return failure();
  if (spec.kind == "momentum") {
    spec.kind = "sgd";
    spec.momentum = 0.9;
  } else if (spec.kind == "nesterov") {
    spec.kind = "sgd";
    spec.momentum = 0.9;
    spec.nesterov = true;
  } else if (spec.kind == "adamw") {
    spec.weightDecay = 0.01; // PyTorch's default
  } else if (spec.kind != "sgd" && spec.kind != "adam") {
    error = "unknown optimizer '" + spec.kind + "' (sgd, momentum, nesterov, adam, adamw)";
    return failure();
  }
  for (auto &[k, v] : kv) {
    double d;
    if (!toDouble(v, d)) {
      error = "optimizer option " + k + "=" + v + " is not a number";
      return failure();
    }
    if (k == "lr") spec.lr = d;
    else if (k == "momentum") spec.momentum = d;
    else if (k == "nesterov") spec.nesterov = d != 0;
    else if (k == "beta1") spec.beta1 = d;
    else if (k == "beta2") spec.beta2 = d;
    else if (k == "eps") spec.eps = d;
    else if (k == "wd" || k == "weight_decay") spec.weightDecay = d;
    else {
      error = "unknown optimizer option '" + k + "' (lr, momentum, nesterov, beta1, beta2, eps, weight_decay)";
      return failure();
    }
  }
  auto bad = [&](const char *what, double value, const char *range) {
    error = std::string(what) + "=" + std::to_string(value) + " is out of range (" + range + ")";
    return failure();
  };
  if (spec.lr <= 0)
    return bad("lr", spec.lr, "lr > 0");
  if (spec.momentum < 0 || spec.momentum >= 1)
    return bad("momentum", spec.momentum, "0 <= momentum < 1");
  if (spec.beta1 < 0 || spec.beta1 >= 1)
    return bad("beta1", spec.beta1, "0 <= beta1 < 1");
  if (spec.beta2 < 0 || spec.beta2 >= 1)
    return bad("beta2", spec.beta2, "0 <= beta2 < 1");
  if (spec.eps <= 0)
    return bad("eps", spec.eps, "eps > 0");
  if (spec.weightDecay < 0)
    return bad("weight_decay", spec.weightDecay, "weight_decay >= 0");
  if (spec.nesterov && spec.momentum == 0) {
    error = "nesterov needs momentum > 0";
    return failure();
  }
  return spec;
}

FailureOr<LossScaleSpec> mlir::forge::parseLossScaleSpec(StringRef text, std::string &error) {
  LossScaleSpec spec;
  if (text.empty() || text == "none")
    return spec;
  std::string kind;
  SmallVector<std::pair<std::string, std::string>> kv;
  if (!splitSpec(text, kind, kv, error))
    return failure();
  if (kind != "dynamic") {
    error = "unknown loss scaling '" + kind + "' (none, dynamic)";
    return failure();
  }
  spec.dynamic = true;
  for (auto &[k, v] : kv) {
    double d;
    if (!toDouble(v, d)) {
      error = "'" + k + "' needs a finite number, got '" + v + "'";
      return failure();
    }
    if (k == "init" && d >= 1.0 && d <= 3.0e38)
      spec.init = d;
    else if (k == "interval" && d >= 1 && d == std::floor(d) && d <= 1e9)
      spec.interval = static_cast<int64_t>(d);
    else if (k == "growth" && d > 1.0 && d <= 1024.0)
      spec.growth = d;
    else if (k == "backoff" && d > 0.0 && d < 1.0)
      spec.backoff = d;
    else {
      error = "'" + k + "=" + v + "' is not a dynamic loss scaling option (init in [1, 3e38], "
              "interval >= 1, growth in (1, 1024], backoff in (0, 1))";
      return failure();
    }
  }
  return spec;
}

FailureOr<TrainOptions> mlir::forge::parseTrainFlags(const TrainFlags &flags,
                                                    std::string &error) {
  TrainOptions t;
  auto fail = [&](std::string message) -> FailureOr<TrainOptions> {
    error = std::move(message);
    return failure();
  };
  if (flags.loss.empty() || flags.optimizer.empty())
    return fail("training bundles need --loss and --optimizer (or --inference-only)");
  std::string why;
  auto loss = parseLossSpec(flags.loss, why);
  if (failed(loss))
    return fail("--loss: " + why);
  auto optimizer = parseOptimizerSpec(flags.optimizer, why);
  if (failed(optimizer))
    return fail("--optimizer: " + why);
  auto schedule = parseScheduleSpec(flags.lrSchedule, why);
  if (failed(schedule))
    return fail("--lr-schedule: " + why);
  t.loss = *loss;
  t.optimizer = *optimizer;
  t.schedule = *schedule;
  if (!(flags.clipGradNorm >= 0))
    return fail("--clip-grad-norm must be >= 0 (0 turns clipping off)");
  t.clipGradNorm = flags.clipGradNorm;
  auto scaling = parseLossScaleSpec(flags.lossScale, why);
  if (failed(scaling))
    return fail("--loss-scale: " + why);
  t.lossScale = *scaling;
  if (flags.microBatches < 1)
    return fail("--micro-batches must be >= 1");
  t.microBatches = flags.microBatches;
  if (flags.dataParallel < 0)
    return fail("--dp must be >= 1");
  t.dataParallel = flags.dataParallel;
  if (flags.zero != 0 && flags.zero != 1)
    return fail("--zero must be 0 or 1 (ZeRO-1: the optimizer state split over the "
                "data-parallel ranks), got " + std::to_string(flags.zero));
  if (flags.zero == 1 && flags.dataParallel < 1)
    return fail("--zero 1 splits the optimizer state over data-parallel ranks: it needs --dp");
  if (flags.zero == 1 && flags.exposeGradients)
    return fail("--expose-gradients with --zero 1: each rank holds only its part of a gradient");
  t.zero = flags.zero;
  if (flags.pipeline < 1)
    return fail("--pp must be >= 1");
  if (flags.pipeline > 1) {
    // Not yet: each of these needs its collectives split by stage.
    if (!flags.lossScale.empty())
      return fail("--pp with --loss-scale is not supported yet (the skip decision would "
                  "have to reach every stage)");
    if (flags.exposeGradients)
      return fail("--pp with --expose-gradients is not supported (each stage holds its own "
                  "parameters' gradients)");
  }
  t.pipeline = flags.pipeline;
  // The loop by default; pipeline stages reorder the unrolled copies (1F1B).
  if (flags.accumulate == "loop" && flags.pipeline > 1)
    return fail("--accumulate loop with --pp: pipeline stages interleave the unrolled "
                "micro-batches (1F1B); use --accumulate unroll");
  if (!flags.accumulate.empty() && flags.accumulate != "loop" && flags.accumulate != "unroll")
    return fail("--accumulate must be loop or unroll (got '" + flags.accumulate + "')");
  t.accumulateLoop = flags.microBatches > 1 && flags.accumulate != "unroll" &&
                     flags.pipeline == 1;
  if (flags.dynamicMicroBatches && !t.accumulateLoop)
    return fail("a varying number of micro-batches (--batch-schedule) needs the accumulation "
                "loop: --micro-batches >= 2, not --accumulate unroll or --pp");
  t.dynamicMicroBatches = flags.dynamicMicroBatches;
  t.freeze = flags.freeze;
  t.exposeGradients = flags.exposeGradients;
  t.gradNorm = flags.gradNorm;
  if (flags.batchnormRunningVar == "biased" || flags.batchnormRunningVar == "unbiased")
    t.unbiasedRunningVar = flags.batchnormRunningVar == "unbiased";
  else if (!flags.batchnormRunningVar.empty())
    return fail("--batchnorm-running-var must be biased or unbiased (got '" +
                flags.batchnormRunningVar + "')");
  return t;
}

FailureOr<ScheduleSpec> mlir::forge::parseScheduleSpec(StringRef text, std::string &error) {
  ScheduleSpec spec;
  SmallVector<std::pair<std::string, std::string>> kv;
  if (!splitSpec(text, spec.kind, kv, error))
    return failure();
  if (spec.kind != "constant" && spec.kind != "cosine" && spec.kind != "linear") {
    error = "unknown lr schedule '" + spec.kind + "' (constant, cosine, linear)";
    return failure();
  }
  for (auto &[k, v] : kv) {
    double d;
    if (!toDouble(v, d) || d < 0) {
      error = "schedule option " + k + "=" + v + " is not a non-negative number";
      return failure();
    }
    bool isStepCount = k == "warmup" || k == "total" || k == "steps";
    if (isStepCount && d != std::floor(d)) {
      error = "schedule option " + k + "=" + v + " must be a whole number of steps";
      return failure();
    }
    if (k == "warmup") spec.warmupSteps = (int64_t)d;
    else if (k == "total" || k == "steps") spec.totalSteps = (int64_t)d;
    else if (k == "min" || k == "min_ratio") {
      if (d > 1) {
        error = "schedule option min_ratio=" + v + " must be in [0, 1]";
        return failure();
      }
      spec.minRatio = d;
    }
    else {
      error = "unknown schedule option '" + k + "' (warmup, total, min_ratio)";
      return failure();
    }
  }
  if (spec.kind != "constant" && spec.totalSteps <= spec.warmupSteps) {
    error = "schedule '" + spec.kind + "' needs total > warmup steps";
    return failure();
  }
  return spec;
}

//===----------------------------------------------------------------------===//
// Graph construction
//===----------------------------------------------------------------------===//

namespace {

struct Param {
  std::string name;
  std::string role;
  DenseElementsAttr initial; // the whole initializer, also of a split one
  // Op handles (mutable: their accessors are not const).
  mutable ConstantOp constant; // in @main
  /// Tensor parallelism (forge-shard-tensor-parallel): the forge.shard that
  /// @main reads this initializer through; the parameter is its slice.
  mutable ShardOp shard;
  /// The value @main reads (the shard's, else the constant's), and its type:
  /// the parameter's and its optimizer state's.
  Value value() const { return shard ? shard.getResult() : constant.getResult(); }
  RankedTensorType type() const { return cast<RankedTensorType>(value().getType()); }
  /// The arguments' forge.shard attribute ({axis, group, size}), or null.
  DictionaryAttr shardAttr() const {
    if (!shard)
      return {};
    mlir::Builder b(shard.getContext());
    return shardSpec(b, shard.getAxis(), shard.getGroup(), shard.getSize(), shard.getBlocks());
  }
  /// ZeRO-1: the optimizer state is split over `zeroParts` data-parallel ranks
  /// along dim 0 (0: not split).
  int64_t zeroParts = 0;
  RankedTensorType momentType() const {
    RankedTensorType t = type();
    if (!zeroParts)
      return t;
    SmallVector<int64_t> shape(t.getShape());
    shape[0] /= zeroParts;
    return RankedTensorType::get(shape, t.getElementType());
  }
  DictionaryAttr momentShard() const {
    if (!zeroParts)
      return shardAttr();
    mlir::Builder b(constant.getContext());
    return shardSpec(b, 0, "dp", zeroParts);
  }
};

/// Role from the first use that decides it; roles are never positional.
std::string roleOf(ConstantOp c) {
  // A split initializer (tensor parallelism) is read through its shard.
  Value read = c.getResult();
  if (c->hasOneUse())
    if (auto shard = dyn_cast<ShardOp>(*c->user_begin()))
      read = shard.getResult();
  for (OpOperand &use : read.getUses()) {
    Operation *user = use.getOwner();
    unsigned i = use.getOperandNumber();
    if (isa<ConvOp, ConvTransposeOp>(user))
      return i == 1 ? "weight" : "bias";
    if (isa<GemmOp>(user))
      return i == 2 ? "bias" : "weight";
    if (isa<LayerNormOp, GroupNormOp, BatchNormOp, BatchNormTrainingOp>(user))
      return i == 1 ? "norm_scale" : i == 2 ? "norm_bias" : "running_stat";
    if (isa<GatherOp>(user) && i == 0)
      return "embedding";
  }
  auto type = cast<RankedTensorType>(c.getType());
  return type.getRank() >= 2 ? "weight" : "bias";
}

bool decays(StringRef role) { return role == "weight" || role == "embedding"; }

using Builder = ForgeBuilder;


/// Pipeline marks (TrainOptions::pipeline): stamp() gives the ops appended to
/// `block` since the last stamp the marks they lack (forge.stage,
/// forge.micro, forge.backward). Off, it does nothing.
class Marks {
public:
  Marks(Block *block, bool on) : block(block), on(on) { advance(); }
  void stamp(std::optional<int64_t> stage, std::optional<int64_t> micro = std::nullopt,
             bool backward = false) {
    if (!on)
      return;
    mlir::Builder b(block->getParent()->getContext());
    for (auto it = last ? std::next(Block::iterator(last)) : block->begin(); it != block->end();
         ++it) {
      if (stage && !it->hasAttr("forge.stage"))
        it->setAttr("forge.stage", b.getI64IntegerAttr(*stage));
      if (micro && !it->hasAttr("forge.micro"))
        it->setAttr("forge.micro", b.getI64IntegerAttr(*micro));
      if (backward && !it->hasAttr("forge.backward"))
        it->setAttr("forge.backward", b.getUnitAttr());
    }
    advance();
  }

private:
  void advance() { last = on && !block->empty() ? &block->back() : nullptr; }
  Block *block;
  bool on;
  Operation *last = nullptr;
};

/// Reverse-mode differentiation of `loss` (a scalar) w.r.t. `wrt`, over the
/// ops of `block` before the insertion point. Gradients of values that do not
/// depend on `wrt` are never requested.
FailureOr<SmallVector<Value>> differentiate(OpBuilder &b, Block &block, Value loss, Value seed,
                                            ArrayRef<Value> wrt, Marks *marks = nullptr,
                                            int64_t micro = 0) {
  // Forward pass: which values depend on a differentiated argument.
  llvm::DenseSet<Value> needs(wrt.begin(), wrt.end());
  SmallVector<Operation *> tape;
  for (Operation &op : block) {
    if (isa<func::ReturnOp>(op))
      continue;
    bool depends = llvm::any_of(op.getOperands(), [&](Value v) { return needs.contains(v); });
    if (!depends)
      continue;
    auto diff = dyn_cast<DifferentiableOpInterface>(&op);
    if (!diff || !diff.isDifferentiable())
      continue; // integer/mask results: gradient stops here
    for (Value r : op.getResults())
      if (isa<FloatType>(Builder::elementOf(r)))
        needs.insert(r);
    tape.push_back(&op);
    if (llvm::is_contained(op.getResults(), loss))
      break;
  }
  if (!needs.contains(loss))
    return emitError(loss.getLoc()) << "the loss does not depend on any trainable parameter";

  llvm::DenseMap<Value, Value> grad;
  grad[loss] = seed;
  auto accumulate = [&](Value v, Value g) {
    auto it = grad.find(v);
    if (it == grad.end())
      grad[v] = g;
    else
      it->second = b.create<AddOp>(g.getLoc(), it->second, g);
  };
  for (Operation *op : llvm::reverse(tape)) {
    SmallVector<Value> resultGrads;
    bool any = false;
    for (Value r : op->getResults()) {
      resultGrads.push_back(grad.lookup(r));
      any |= bool(resultGrads.back());
    }
    if (!any)
      continue;
    SmallVector<Value> operandGrads;
    OpBuilder::InsertionGuard guard(b);
    if (failed(cast<DifferentiableOpInterface>(op).buildGradient(b, resultGrads, operandGrads)))
      return failure();
    if (operandGrads.size() != op->getNumOperands())
      return op->emitError() << "gradient rule returned " << operandGrads.size()
                             << " gradients for " << op->getNumOperands() << " operands";
    if (marks) // a rule's ops run on its forward op's stage
      marks->stamp(pipelineStageOf(op), micro, /*backward=*/true);
    for (auto [operand, g] : llvm::zip(op->getOperands(), operandGrads))
      if (g && needs.contains(operand))
        accumulate(operand, g);
    if (marks) // a sum of contributions: where they are (the split decides)
      marks->stamp(std::nullopt, micro, /*backward=*/true);
  }
  SmallVector<Value> result;
  for (Value v : wrt) {
    Value g = grad.lookup(v);
    if (!g) // the loss does not depend on this parameter: zero gradient
      g = b.create<ConstantOp>(v.getLoc(), DenseElementsAttr::get(cast<ShapedType>(v.getType()),
                                                                   b.getFloatAttr(Builder::elementOf(v), 0.0)));
    result.push_back(g);
  }
  return result;
}

/// A logits output split by vocabulary (forge-shard-tensor-parallel's
/// forge.shard on the result): rank r of the `size` ranks of `group` holds
/// classes [r C, (r + 1) C) of every row, C the output's last dim.
struct ClassShard {
  std::string group;
  int64_t size = 1;
};

/// Cross-entropy's view of a model output: classes on the last dim ([N, C] or
/// [N, T, C]) as rows of C, the labels as one per row, and either the
/// log-softmax (whole classes) or, for a vocabulary split (`shard`), the
/// pieces of Megatron's vocabulary-parallel cross-entropy: every row's
/// log-sum-exp over all ranks' classes and its label's logit. No rank ever
/// holds a row's whole logits: each makes its part's log-sum-exp, the group
/// gathers those [ranks, rows] (forge.all_gather, whose rule hands each rank
/// its row of the cotangent) and combines them; the label's logit is read
/// on the rank holding it, zero elsewhere, and summed (forge.all_reduce).
struct ClassRows {
  int64_t rows = 0;
  Value logits, labels, logProb; // logProb: whole classes only
  bool probs = false;            // labels: [rows, C] class probabilities (LossSpec::probs)
  std::optional<int64_t> ignore; // LossSpec::ignoreIndex (whole classes only)
  const ClassShard *shard = nullptr;
  Value lse, picked, localMax; // split: [rows] f32, [rows] f32, [rows, 1]

  /// Per row: -log p(label), [rows] (probabilities: -sum_c q_c log p_c);
  /// 0 on a row whose label is the ignored one.
  Value terms(Builder &bb) const {
    if (probs)
      return bb.mulScalar(bb.reduceSum(bb.mul(labels, logProb), {1}, false), -1.0);
    if (!shard)
      return bb.b.create<NllLossOp>(bb.loc, logProb, labels, Value(), bb.b.getStringAttr("none"),
                                    ignoreAttr(bb));
    Value t = bb.sub(lse, picked);
    return ignore ? bb.mul(t, valid(bb)) : t;
  }
  IntegerAttr ignoreAttr(Builder &bb) const {
    return ignore ? bb.b.getI64IntegerAttr(*ignore) : IntegerAttr();
  }
  /// meanLogProb over the rows that have a target (ignore=N): their classes'
  /// log p summed, over C times their count (PyTorch's label_smoothing with
  /// ignore_index: an ignored row has no smoothing term either). Split: a
  /// row's logits summed over the group, less C times its lse.
  Value meanLogProbKept(Builder &bb) const {
    int64_t classes = cast<RankedTensorType>(logits.getType()).getDimSize(1);
    Value perRow;
    if (!shard) {
      perRow = bb.reduceSum(logProb, {1}, false);
    } else {
      classes *= shard->size;
      Value sum = bb.reduceSum(logits, {1}, false);
      sum = bb.b.create<AllReduceOp>(bb.loc, TypeRange{sum.getType()}, ValueRange{sum},
                                     shard->group, "sum", shard->size)
                .getResult(0);
      perRow = bb.sub(sum, bb.mulScalar(lse, static_cast<double>(classes)));
    }
    Value keep = valid(bb);
    perRow = bb.castTo(perRow, bb.b.getF32Type());
    return bb.div(bb.sumAll(bb.mul(perRow, keep)),
                  bb.mulScalar(bb.sumAll(keep), static_cast<double>(classes)));
  }
  /// 1 where the row has a target (its label is not the ignored one), f32 [rows].
  Value valid(Builder &bb) const {
    return bb.where(bb.b.create<EqualOp>(bb.loc, labels, bb.intScalar(*ignore)), bb.scalar(0.0),
                    bb.scalar(1.0));
  }
  /// The mean over rows of terms(): nll_loss's own mean for class indices
  /// (over the rows with a target, with ignore=N).
  Value meanTerms(Builder &bb) const {
    if (!shard && !probs)
      return bb.b.create<NllLossOp>(bb.loc, logProb, labels, Value(), bb.b.getStringAttr("mean"),
                                    ignoreAttr(bb));
    if (ignore)
      return bb.div(bb.sumAll(terms(bb)), bb.sumAll(valid(bb)));
    return bb.meanAll(terms(bb));
  }
  /// The mean of log p over every row and class (label smoothing's term):
  /// split, (sum of all logits - classes * sum of lse) / (rows * classes).
  Value meanLogProb(Builder &bb) const {
    if (!shard)
      return bb.meanAll(logProb);
    int64_t classes = cast<RankedTensorType>(logits.getType()).getDimSize(1) * shard->size;
    Value sum = bb.sumAll(logits);
    sum = bb.b.create<AllReduceOp>(bb.loc, TypeRange{sum.getType()}, ValueRange{sum},
                                   shard->group, "sum", shard->size)
              .getResult(0);
    Value total = bb.sub(sum, bb.mulScalar(bb.sumAll(lse), double(classes)));
    return bb.mulScalar(total, 1.0 / double(rows * classes));
  }
  /// 1 where the row's argmax is its label (f32, [rows]). Split: where the
  /// label's logit is the largest of the row's (an exact tie with a smaller
  /// class counts as a hit here, not for argmax).
  Value hits(Builder &bb) const {
    OpBuilder &b = bb.b;
    if (shard) {
      Value best = bb.reduceMax(gatherRows(bb, localMax), {0}, false);
      Value hit = bb.where(bb.less(picked, best), bb.scalar(0.0), bb.scalar(1.0));
      return ignore ? bb.mul(hit, valid(bb)) : hit;
    }
    Value pred = b.create<ArgMaxOp>(bb.loc, logits, b.getI64IntegerAttr(1), b.getBoolAttr(false),
                                    b.getBoolAttr(false));
    // Probabilities: the most probable class is the label.
    Value label = probs ? b.create<ArgMaxOp>(bb.loc, labels, b.getI64IntegerAttr(1),
                                             b.getBoolAttr(false), b.getBoolAttr(false))
                              .getResult()
                        : bb.castTo(labels, b.getI64Type());
    Value hit = bb.castTo(b.create<EqualOp>(bb.loc, pred, label), b.getF32Type());
    return ignore ? bb.mul(hit, valid(bb)) : hit;
  }
  /// Every rank's [rows, 1] column `v` as the rows of a [ranks, rows].
  Value gatherRows(Builder &bb, Value v) const {
    auto type = RankedTensorType::get({shard->size, rows}, Builder::elementOf(v));
    return bb.b.create<AllGatherOp>(bb.loc, type, bb.reshape(v, {1, rows}), shard->group,
                                    shard->size)
        .getResult();
  }
};

ClassRows classRows(Builder &bb, Value output, Value label, const ClassShard *shard,
                    bool probs, std::optional<int64_t> ignore = std::nullopt) {
  auto type = cast<RankedTensorType>(output.getType());
  ClassRows c;
  int64_t classes = type.getShape().back();
  c.rows = type.getNumElements() / classes;
  c.logits = bb.reshape(output, {c.rows, classes});
  c.probs = probs;
  c.ignore = ignore;
  c.labels = probs ? bb.castTo(bb.reshape(label, {c.rows, classes}), bb.elementOf(c.logits))
                   : bb.reshape(label, {c.rows});
  c.shard = shard;
  if (!shard) {
    c.logProb = bb.b.create<LogSoftmaxOp>(bb.loc, c.logits, bb.b.getI64IntegerAttr(1));
    return c;
  }
  // This part's log-sum-exp, then the whole row's from the gathered parts:
  // both shifted by their maximum (no overflow).
  auto logSumExp = [&](Value x, int64_t axis, Value &max) {
    max = bb.reduceMax(x, {axis}, true);
    return bb.add(bb.log(bb.reduceSum(bb.exp(bb.sub(x, max)), {axis}, true)), max);
  };
  Value partMax, rowMax;
  Value part = logSumExp(c.logits, 1, partMax);
  c.localMax = partMax;
  c.lse = bb.reshape(logSumExp(c.gatherRows(bb, part), 0, rowMax), {c.rows});
  // The label's logit, on the rank whose classes hold it.
  Value local = bb.sub(bb.castTo(c.labels, bb.b.getI64Type()),
                       bb.rankOffset(shard->group, shard->size, classes));
  Value mine = bb.inRange(local, classes);
  Value column = bb.reshape(bb.where(mine, local, bb.intScalar(0)), {c.rows, 1});
  Value logit = bb.reshape(
      bb.b.create<GatherElementsOp>(bb.loc, c.logits, column, bb.b.getI64IntegerAttr(1)),
      {c.rows});
  logit = bb.where(mine, logit, bb.scalar(0.0, Builder::elementOf(logit)));
  c.picked = bb.b.create<AllReduceOp>(bb.loc, TypeRange{logit.getType()}, ValueRange{logit},
                                      shard->group, "sum", shard->size)
                 .getResult(0);
  return c;
}

/// The loss on top of a model output; returns {loss, correct-count or null}.
FailureOr<std::pair<Value, Value>> buildLoss(Builder &bb, const LossSpec &spec, Value output,
                                             Value label, bool wantCorrect,
                                             const ClassShard *shard) {
  OpBuilder &b = bb.b;
  Location loc = bb.loc;
  if (spec.kind == "output") {
    auto type = cast<RankedTensorType>(output.getType());
    if (type.getNumElements() != 1 || !isa<FloatType>(type.getElementType()))
      return emitError(loc) << "loss output '" << spec.output << "' must be a float scalar";
    return std::make_pair(bb.reshape(output, {}), Value());
  }
  auto type = cast<RankedTensorType>(output.getType());
  if (spec.kind == "cross_entropy") {
    ClassRows c = classRows(bb, output, label, shard, spec.probs, spec.ignoreIndex);
    Value loss = c.meanTerms(bb);
    if (spec.smoothing > 0) // (1 - s) NLL + s mean(-log p): every row's class mean, averaged
      loss = bb.sub(bb.mulScalar(loss, 1.0 - spec.smoothing),
                    bb.mulScalar(spec.ignoreIndex ? c.meanLogProbKept(bb) : c.meanLogProb(bb),
                                 spec.smoothing));
    return std::make_pair(loss, wantCorrect ? bb.sumAll(c.hits(bb)) : Value());
  }
  Value target = bb.castTo(label, type.getElementType());
  if (spec.kind == "mse") {
    Value diff = bb.sub(output, target);
    return std::make_pair(bb.meanAll(bb.mul(diff, diff)), Value());
  }
  // bce on logits: softplus(x) - x * t, stable for large |x|.
  Value loss = bb.sub(b.create<SoftplusOp>(loc, output), bb.mul(output, target));
  return std::make_pair(bb.meanAll(loss), Value());
}

/// The eval loss and correct-count of a batch whose samples (dim 0) carry
/// weights `weight` ([N] f32: 1 for a real sample, 0 for padding that fills a
/// last partial batch): loss = sum(w_n l_n) / sum(w_n), l_n the mean of sample
/// n's terms as in buildLoss; correct = sum of w_n-weighted hits. With all
/// weights 1 this is buildLoss's value. Null when the loss has no per-sample
/// form (the model's own scalar, or an output without the batch on dim 0).
/// With cross_entropy's ignore=N, rows whose label is N have no term: the
/// loss is the w-weighted mean over the other rows, and `count` (else null)
/// their w-weighted number.
struct EvalLoss {
  Value loss, correct, count;
};
FailureOr<EvalLoss> buildWeightedEvalLoss(Builder &bb, const LossSpec &spec, Value output,
                                          Value label, Value weight, bool wantCorrect,
                                          const ClassShard *shard) {
  OpBuilder &b = bb.b;
  Location loc = bb.loc;
  Type f32 = b.getF32Type();
  auto type = cast<RankedTensorType>(output.getType());
  int64_t n = cast<RankedTensorType>(weight.getType()).getDimSize(0);
  // Per-sample terms as [N, terms] f32, weighted by w[N, 1] and summed.
  Value w = bb.reshape(weight, {n, 1});
  Value denominator;
  auto weightedMean = [&](Value terms) {
    int64_t count = cast<RankedTensorType>(terms.getType()).getNumElements() / n;
    Value perSample = bb.reshape(bb.castTo(terms, f32), {n, count});
    denominator = bb.mulScalar(bb.sumAll(weight), static_cast<double>(count));
    return bb.div(bb.sumAll(bb.mul(perSample, w)), denominator);
  };
  if (spec.kind == "cross_entropy") {
    ClassRows c = classRows(bb, output, label, shard, spec.probs, spec.ignoreIndex);
    Value terms = c.terms(bb);
    Value correct;
    if (wantCorrect)
      correct = bb.sumAll(bb.mul(bb.reshape(c.hits(bb), {n, c.rows / n}), w));
    if (!spec.ignoreIndex)
      return EvalLoss{weightedMean(terms), correct, Value()};
    // Ignored rows' terms are 0 (nll_loss's ignore_index): divide by the
    // weighted count of the others.
    Value count = bb.sumAll(bb.mul(bb.reshape(c.valid(bb), {n, c.rows / n}), w));
    Value sum = bb.sumAll(bb.mul(bb.reshape(bb.castTo(terms, f32), {n, c.rows / n}), w));
    return EvalLoss{bb.div(sum, count), correct, count};
  }
  Value target = bb.castTo(label, type.getElementType());
  if (spec.kind == "mse") {
    Value diff = bb.sub(output, target);
    return EvalLoss{weightedMean(bb.mul(diff, diff)), Value(), Value()};
  }
  Value terms = bb.sub(b.create<SoftplusOp>(loc, output), bb.mul(output, target));
  return EvalLoss{weightedMean(terms), Value(), Value()};
}

/// Dynamic loss scaling's state after a step (LossScaleSpec): the next scale
/// and count of finite steps, and whether the step skipped (1) or updated (0).
struct LossScaleStep {
  Value scale, goodSteps, skipped;
};

/// good' = finite ? good + 1 : 0; grown = good' >= interval;
/// scale' = finite ? (grown ? scale * growth : scale) : scale * backoff;
/// good'' = grown ? 0 : good'.
LossScaleStep nextLossScale(Builder &bb, const LossScaleSpec &spec, Value scale, Value good,
                            Value finite) {
  OpBuilder &b = bb.b;
  Location loc = bb.loc;
  Value zero = bb.scalar(0.0), one = bb.scalar(1.0);
  Value counted = b.create<WhereOp>(loc, finite, bb.add(good, one), zero);
  Value grown = b.create<LessOp>(loc, bb.scalar(double(spec.interval) - 0.5), counted);
  Value kept = b.create<WhereOp>(loc, grown, bb.mulScalar(scale, spec.growth), scale);
  Value next = b.create<WhereOp>(loc, finite, kept, bb.mulScalar(scale, spec.backoff));
  Value goodNext = b.create<WhereOp>(loc, grown, zero, counted);
  return {next, goodNext, b.create<WhereOp>(loc, finite, zero, one)};
}

class TrainGraphBuilder {
public:
  /// Builds @train_step<suffix> and @eval<suffix> from `main` (@main<suffix>).
  TrainGraphBuilder(ModuleOp module, const TrainOptions &options, func::FuncOp main,
                    StringRef suffix)
      : module(module), options(options), ctx(module.getContext()), main(main),
        suffix(suffix.str()) {}
  LogicalResult run();

private:
  LogicalResult collectParams(func::FuncOp main);
  FailureOr<Value> labelFor(func::FuncOp main, RankedTensorType &type);
  LogicalResult buildTrainStep(func::FuncOp main);
  void appendOptimizerUpdates(Builder &bb, Value step, Value lr, ArrayRef<Value> paramArgs,
                              ArrayRef<Value> gradSum, ValueRange moments,
                              function_ref<void(Value, const std::string &, Value)> update);
  LogicalResult buildEval(func::FuncOp main);
  Value learningRate(Builder &bb, Value step);
  Value gradientSquares(Builder &bb, ArrayRef<Value> gradSum);

  ModuleOp module;
  const TrainOptions &options;
  MLIRContext *ctx;
  func::FuncOp main;
  std::string suffix; // of the routines' names: "" or a length bucket's "@len<T>"
  std::vector<Param> params, states;
  int64_t outputIndex = -1;
  std::optional<ClassShard> outputShard; // the loss's logits split by vocabulary
  RankedTensorType labelType;
  bool unbiasedRunningVar = false; // TrainOptions::unbiasedRunningVar, resolved
  // Pipeline marks of the train step being built (null without --pp), and
  // each parameter's stage: that of its first forward use.
  Marks *marks = nullptr;
  std::vector<int64_t> paramStage;
};

LogicalResult TrainGraphBuilder::collectParams(func::FuncOp main) {
  std::vector<llvm::GlobPattern> frozen;
  for (const std::string &pattern : options.freeze) {
    auto glob = llvm::GlobPattern::create(pattern);
    if (!glob)
      return main.emitError() << "bad --freeze pattern '" << pattern << "'";
    frozen.push_back(std::move(*glob));
  }
  std::vector<bool> patternUsed(frozen.size(), false);
  for (ConstantOp c : main.getOps<ConstantOp>()) {
    auto name = c->getAttrOfType<StringAttr>("forge.initializer");
    auto type = cast<RankedTensorType>(c.getType());
    if (!name || !isa<FloatType>(type.getElementType()) || c->use_empty())
      continue;
    for (auto [i, g] : llvm::enumerate(frozen))
      patternUsed[i] = patternUsed[i] || g.match(name.getValue());
    std::string role = roleOf(c);
    auto value = cast<DenseElementsAttr>(c.getValue());
    ShardOp shard;
    for (Operation *user : c->getUsers())
      if (auto s = dyn_cast<ShardOp>(user))
        shard = s;
    if (shard && !c->hasOneUse())
      return shard.emitOpError() << "splits initializer '" << name.getValue()
                                 << "', which is also read whole";
    bool isFrozen = llvm::any_of(
        frozen, [&](const llvm::GlobPattern &g) { return g.match(name.getValue()); });
    if (shard && (role == "running_stat" || isFrozen))
      return shard.emitOpError() << "splits initializer '" << name.getValue() << "', which is "
                                 << (isFrozen ? "frozen (--freeze)" : "a running statistic")
                                 << ": only trained parameters can be split over ranks";
    if (role == "running_stat") {
      states.push_back({name.str(), role, value, c, {}});
      continue;
    }
    if (isFrozen)
      continue; // frozen parameters stay constants: no gradient is built for them
    params.push_back({name.str(), role, value, c, shard});
  }
  // A pattern that matches nothing is almost always a typo that would
  // silently train what the user meant to freeze.
  for (auto [i, used] : llvm::enumerate(patternUsed))
    if (!used)
      return main.emitError() << "--freeze pattern '" << options.freeze[i]
                              << "' matches no float initializer";
  if (params.empty())
    return main.emitError("no trainable parameters (float initializers) left after --freeze");
  return success();
}

Value TrainGraphBuilder::learningRate(Builder &bb, Value step) {
  const ScheduleSpec &s = options.schedule;
  double lr = options.optimizer.lr;
  if (s.kind == "constant")
    return bb.scalar(lr);
  OpBuilder &b = bb.b;
  // warm = min(step / warmup, 1); progress = clamp((step - warmup) / (total - warmup), 0, 1)
  Value warm = s.warmupSteps > 0 ? Value(b.create<ClipOp>(bb.loc, bb.mulScalar(step, 1.0 / s.warmupSteps),
                                                          b.getF64FloatAttr(0), b.getF64FloatAttr(1)))
                                 : bb.scalar(1.0);
  Value progress = b.create<ClipOp>(
      bb.loc, bb.mulScalar(bb.sub(step, bb.scalar(double(s.warmupSteps))), 1.0 / (s.totalSteps - s.warmupSteps)),
      b.getF64FloatAttr(0), b.getF64FloatAttr(1));
  Value decay;
  if (s.kind == "cosine") {
    // 0.5 * (1 + cos(pi * p)). The dialect has no cos op; the Taylor series
    // to x^16 is within 2e-7 of cos on [0, pi], plenty for a schedule.
    Value x = bb.mulScalar(progress, M_PI);
    Value x2 = bb.mul(x, x);
    Value term = bb.scalar(1.0), cos = bb.scalar(1.0);
    for (int k = 1; k <= 8; ++k) {
      term = bb.mulScalar(bb.mul(term, x2), -1.0 / ((2 * k - 1) * (2 * k)));
      cos = bb.add(cos, term);
    }
    decay = bb.mulScalar(bb.add(cos, bb.scalar(1.0)), 0.5);
  } else {
    decay = bb.sub(bb.scalar(1.0), progress);
  }
  // lr * warm * (min + (1 - min) * decay)
  Value factor = bb.add(bb.scalar(s.minRatio), bb.mulScalar(decay, 1.0 - s.minRatio));
  return bb.mulScalar(bb.mul(warm, factor), lr);
}

/// The optimizer's update of every parameter and its moments, in parameter
/// order, each returned through `update(value, name, old value)`. `moments`
/// are the moment arguments: exp_avg then exp_avg_sq of every parameter
/// (Adam), or momentum (SGD with momentum).
void TrainGraphBuilder::appendOptimizerUpdates(
    Builder &bb, Value step, Value lr, ArrayRef<Value> paramArgs, ArrayRef<Value> gradSum,
    ValueRange moments, function_ref<void(Value, const std::string &, Value)> update) {
  OpBuilder &b = bb.b;
  Location loc = bb.loc;
  const OptimizerSpec &opt = options.optimizer;
  bool adam = opt.kind == "adam" || opt.kind == "adamw";
  // Adam's bias corrections 1 - beta^t, in f64 like PyTorch (Python floats):
  // in f32, beta2 = 0.999 rounds to 0.99900001, so 1 - beta2^t is off by
  // ~1.3e-5 relative for all early steps, a systematic error in the step size.
  Value bc1, bc2Sqrt;
  if (adam) {
    Type f64 = b.getF64Type();
    Value step64 = bb.castTo(step, f64);
    bc1 = bb.sub(bb.scalar(1.0, f64), b.create<PowOp>(loc, bb.scalar(opt.beta1, f64), step64));
    bc2Sqrt = bb.sqrt(
        bb.sub(bb.scalar(1.0, f64), b.create<PowOp>(loc, bb.scalar(opt.beta2, f64), step64)));
  }
  if (marks) // what came before (the bias corrections: the step's alone) is no parameter's
    marks->stamp(std::nullopt);
  for (auto [i, p] : llvm::enumerate(params)) {
    Value w = paramArgs[i], g = gradSum[i];
    Type e = Builder::elementOf(w);
    Value lrE = bb.castTo(lr, e);
    double wd = decays(p.role) ? opt.weightDecay : 0.0;
    if (adam) {
      Value m = moments[i];
      Value v = moments[params.size() + i];
      if (opt.kind == "adam" && wd > 0)
        g = bb.add(g, bb.mulScalar(w, wd));
      if (opt.kind == "adamw" && wd > 0) // decoupled: p *= 1 - lr * wd
        w = bb.mul(w, bb.sub(bb.scalar(1.0, e), bb.mulScalar(lrE, wd)));
      Value m2 = bb.add(bb.mulScalar(m, opt.beta1), bb.mulScalar(g, 1 - opt.beta1));
      Value v2 = bb.add(bb.mulScalar(v, opt.beta2), bb.mulScalar(bb.mul(g, g), 1 - opt.beta2));
      // p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps), as torch's single-tensor AdamW.
      Value denom = bb.add(bb.div(bb.sqrt(v2), bb.castTo(bc2Sqrt, e)), bb.scalar(opt.eps, e));
      Value stepSize = bb.castTo(bb.div(bb.castTo(lr, Builder::elementOf(bc1)), bc1), e);
      Value w2 = bb.sub(w, bb.mul(stepSize, bb.div(m2, denom)));
      update(w2, p.name, paramArgs[i]);
      update(m2, p.name + ".exp_avg", m);
      update(v2, p.name + ".exp_avg_sq", v);
    } else {
      if (wd > 0)
        g = bb.add(g, bb.mulScalar(w, wd));
      if (opt.momentum > 0) {
        Value buf = moments[i];
        Value buf2 = bb.add(bb.mulScalar(buf, opt.momentum), g);
        Value dir = opt.nesterov ? bb.add(g, bb.mulScalar(buf2, opt.momentum)) : buf2;
        update(bb.sub(w, bb.mul(lrE, dir)), p.name, paramArgs[i]);
        update(buf2, p.name + ".momentum", buf);
      } else {
        update(bb.sub(w, bb.mul(lrE, g)), p.name, paramArgs[i]);
      }
    }
    if (marks) // the update runs where the parameter lives
      marks->stamp(paramStage[i]);
  }
}

/// The sum of every gradient's squares over the step (the global norm's
/// square, still scaled by a loss scale).
Value TrainGraphBuilder::gradientSquares(Builder &bb, ArrayRef<Value> gradSum) {
  // A split parameter's gradient is this rank's slice of it: the squares of
  // the slices are summed over their group (once for all of them), the
  // replicated ones' counted once.
  Value normSq;
  std::map<std::pair<std::string, int64_t>, Value> splitSq; // (group, size) -> sum
  // Pipeline stages: each stage's squares summed where they are made, the
  // stages' partial sums then in stage order (one message per stage).
  std::map<int64_t, Value> stageSq;
  // Where a gradient is made, as forge-split-pipeline-stages will find it (a
  // tied weight's sum of contributions: on the latest contributing stage).
  llvm::DenseMap<Operation *, int64_t> madeOn;
  for (auto [i, p, g] : llvm::enumerate(params, gradSum)) {
    Value s = bb.sumAll(bb.mul(g, g));
    if (p.shard || p.zeroParts) {
      Value &acc = p.shard ? splitSq[{p.shard.getGroup().str(), p.shard.getSize()}]
                           : splitSq[{"dp", p.zeroParts}];
      acc = acc ? bb.add(acc, s) : s;
      continue;
    }
    if (marks) {
      Value &acc = stageSq[std::max<int64_t>(pipelineStageMaking(g, madeOn), paramStage[i])];
      acc = acc ? bb.add(acc, s) : s;
      continue;
    }
    normSq = normSq ? bb.add(normSq, s) : s;
  }
  for (auto &[stage, s] : stageSq)
    normSq = normSq ? bb.add(normSq, s) : s;
  for (auto &[group, s] : splitSq) {
    Value sum = bb.b.create<AllReduceOp>(bb.loc, TypeRange{s.getType()}, ValueRange{s},
                                         group.first, "sum", group.second)
                    .getResult(0);
    normSq = normSq ? bb.add(normSq, sum) : sum;
  }
  return normSq;
}

LogicalResult TrainGraphBuilder::buildTrainStep(func::FuncOp main) {
  OpBuilder b(ctx);
  Location loc = main.getLoc();
  int64_t k = options.microBatches;
  // The loop builds one micro-batch's forward and backward (forge.accumulated
  // marks where forge-split-accumulation cuts it); else K unrolled copies.
  const bool loop = options.accumulateLoop && k > 1;
  const int64_t copies = loop ? 1 : k;
  bool hasLabel = options.loss.kind != "output";

  // Signature: data inputs (x K), labels (x K), params, states, optimizer
  // state, (accumulators,) step.
  SmallVector<Type> argTypes;
  SmallVector<DictionaryAttr> argAttrs;
  auto named = [&](StringRef name, StringRef kind, StringRef role = {}, Attribute init = {},
                   DictionaryAttr shard = {}) {
    SmallVector<NamedAttribute> attrs = {b.getNamedAttr("forge.name", b.getStringAttr(name)),
                                         b.getNamedAttr("forge.kind", b.getStringAttr(kind))};
    if (!role.empty())
      attrs.push_back(b.getNamedAttr("forge.role", b.getStringAttr(role)));
    if (init)
      attrs.push_back(b.getNamedAttr("forge.initial_value", init));
    if (shard) // this rank's slice of `init` (tensor parallelism)
      attrs.push_back(b.getNamedAttr("forge.shard", shard));
    return b.getDictionaryAttr(attrs);
  };
  unsigned numData = main.getNumArguments();
  for (int64_t m = 0; m < copies; ++m) {
    for (unsigned i = 0; i < numData; ++i) {
      auto name = main.getArgAttrOfType<StringAttr>(i, "forge.name");
      std::string n = name ? name.str() : "input" + std::to_string(i);
      argTypes.push_back(main.getArgumentTypes()[i]);
      argAttrs.push_back(named(copies > 1 ? n + "@" + std::to_string(m) : n, "input"));
    }
    if (hasLabel) {
      argTypes.push_back(labelType);
      std::string n = options.loss.label;
      argAttrs.push_back(named(copies > 1 ? n + "@" + std::to_string(m) : n, "input"));
    }
  }
  // ZeRO-1: which parameters' optimizer state is split (a dim 0 that divides
  // by the ranks; a parameter split by tensor parallelism keeps it whole).
  for (Param &p : params) {
    RankedTensorType t = p.type();
    const int64_t d = options.dataParallel;
    // --dp 1 --zero 1: a group of one, the code path of D ranks on one device.
    p.zeroParts = options.zero == 1 && d >= 1 && !p.shard && t.getRank() >= 1 &&
                          t.getDimSize(0) % d == 0
                      ? d
                      : 0;
  }
  unsigned paramBase = argTypes.size();
  for (const Param &p : params) {
    argTypes.push_back(p.type());
    argAttrs.push_back(named(p.name, "parameter", p.role, p.initial, p.shardAttr()));
  }
  unsigned stateBase = argTypes.size();
  for (const Param &s : states) {
    argTypes.push_back(s.initial.getType());
    argAttrs.push_back(named(s.name, "state", s.role, s.initial));
  }
  // Optimizer moments: zero-initialized state.
  const OptimizerSpec &opt = options.optimizer;
  SmallVector<std::string> momentNames;
  bool adam = opt.kind == "adam" || opt.kind == "adamw";
  if (adam)
    momentNames = {"exp_avg", "exp_avg_sq"};
  else if (opt.momentum > 0)
    momentNames = {"momentum"};
  unsigned momentBase = argTypes.size();
  for (const std::string &m : momentNames)
    for (const Param &p : params) {
      argTypes.push_back(p.momentType());
      argAttrs.push_back(named(p.name + "." + m, "state", "optimizer", {}, p.momentShard()));
    }
  // Dynamic loss scaling: the scale and the count of finite steps since it
  // last changed, f32 scalars of state.
  const LossScaleSpec &scaling = options.lossScale;
  auto f32Scalar = [&](double v) {
    return DenseElementsAttr::get(RankedTensorType::get({}, b.getF32Type()),
                                  b.getF32FloatAttr(static_cast<float>(v)));
  };
  // The loop's accumulators: each gradient's running sum (f32, the gradient's
  // type before any reduction over ranks) and the losses', zero between steps.
  unsigned accumBase = argTypes.size();
  if (loop) {
    for (const Param &p : params) {
      argTypes.push_back(p.type());
      argAttrs.push_back(named(p.name + ".grad_accum", "state", "grad_accumulator"));
    }
    argTypes.push_back(RankedTensorType::get({}, b.getF32Type()));
    argAttrs.push_back(named("forge.loss_accum", "state", "grad_accumulator", f32Scalar(0.0)));
  }
  unsigned scaleIndex = argTypes.size();
  if (scaling.dynamic) {
    argTypes.push_back(RankedTensorType::get({}, b.getF32Type()));
    argAttrs.push_back(named("forge.loss_scale", "state", "loss_scale", f32Scalar(scaling.init)));
    argTypes.push_back(RankedTensorType::get({}, b.getF32Type()));
    argAttrs.push_back(named("forge.good_steps", "state", "loss_scale", f32Scalar(0.0)));
  }
  unsigned stepIndex = argTypes.size();
  argTypes.push_back(RankedTensorType::get({}, b.getF32Type()));
  argAttrs.push_back(named("forge.step", "input"));
  // Dropout with several data-parallel ranks: the rank (an i64 scalar the trainer
  // feeds) places each rank's samples in the step's global batch for the masks.
  const bool hasDropout =
      llvm::any_of(main.getBody().front(), [](Operation &op) { return isa<DropoutOp>(op); });
  // In the loop, the micro-batch's place instead: rank * K + micro-batch (the
  // trainer feeds it each run), whose samples start at that times B; the first
  // micro-batch (index % K == 0) overwrites the accumulators.
  const int64_t rankIndex =
      loop || (options.dataParallel > 1 && hasDropout) ? argTypes.size() : -1;
  if (rankIndex >= 0) {
    argTypes.push_back(RankedTensorType::get({}, b.getI64Type()));
    argAttrs.push_back(named(loop ? "forge.micro_index" : "forge.dp_rank", "input"));
  }
  // A varying number of micro-batches (--batch-schedule): this step's count.
  const bool dynamicK = loop && options.dynamicMicroBatches;
  const int64_t countIndex = dynamicK ? argTypes.size() : -1;
  if (dynamicK) {
    argTypes.push_back(RankedTensorType::get({}, b.getI64Type()));
    argAttrs.push_back(named("forge.micro_count", "input"));
  }

  auto func = func::FuncOp::create(loc, "train_step" + suffix, b.getFunctionType(argTypes, {}));
  module.push_back(func);
  Block *entry = func.addEntryBlock();
  for (unsigned i = 0; i < argAttrs.size(); ++i)
    func.setArgAttrs(i, argAttrs[i]);
  b.setInsertionPointToStart(entry);
  Builder bb(b, loc);
  // Pipeline marks (--pp): each parameter's stage is its first forward use's.
  Marks stageMarks(entry, options.pipeline > 1);
  if (options.pipeline > 1) {
    marks = &stageMarks;
    paramStage.assign(params.size(), 0);
    for (auto [i, p] : llvm::enumerate(params)) {
      std::optional<int64_t> first;
      for (Operation *user : p.value().getUsers())
        if (std::optional<int64_t> s = pipelineStageOf(user))
          first = first ? std::min(*first, *s) : *s;
      paramStage[i] = first.value_or(0);
    }
  }

  SmallVector<Value> paramArgs, stateValues;
  for (unsigned i = 0; i < params.size(); ++i)
    paramArgs.push_back(entry->getArgument(paramBase + i));
  for (unsigned i = 0; i < states.size(); ++i)
    stateValues.push_back(entry->getArgument(stateBase + i));

  // Dropout masks are keyed by the sample's index in the step's global batch:
  // micro-batch m of rank r starts at sample r * K * B + m * B.
  Value dpRank;
  if (hasDropout)
    dpRank = rankIndex >= 0
                 ? Value(entry->getArgument(static_cast<unsigned>(rankIndex)))
                 : b.create<ConstantOp>(loc, DenseElementsAttr::get(
                                                 RankedTensorType::get({}, b.getI64Type()),
                                                 b.getI64IntegerAttr(0)))
                       .getResult();
  const int64_t microBatch =
      numData > 0 ? cast<RankedTensorType>(main.getArgument(0).getType()).getDimSize(0) : 1;

  // 1/K: a constant, or 1/forge.micro_count (f32 division, rounded as the
  // constant is).
  Value count = dynamicK ? Value(entry->getArgument(static_cast<unsigned>(countIndex))) : Value();
  Value invCount = dynamicK ? bb.div(bb.scalar(1.0), bb.castTo(count, b.getF32Type()))
                            : bb.scalar(1.0 / double(k));

  // K forward/backward passes, gradients summed.
  SmallVector<Value> gradSum;
  Value lossSum;
  unsigned perMicro = numData + (hasLabel ? 1 : 0);
  auto ret = cast<func::ReturnOp>(main.getBody().front().getTerminator());
  for (int64_t m = 0; m < copies; ++m) {
    IRMapping map;
    for (unsigned i = 0; i < numData; ++i)
      map.map(main.getArgument(i), entry->getArgument(m * perMicro + i));
    for (auto [p, arg] : llvm::zip(params, paramArgs))
      map.map(p.value(), arg);
    for (auto [s, value] : llvm::zip(states, stateValues))
      map.map(s.constant.getResult(), value);
    Operation *previous = nullptr; // what its clone(s) were made from (pipeline marks)
    for (Operation &op : main.getBody().front()) {
      stageMarks.stamp(pipelineStageOf(previous), m);
      previous = &op;
      if (isa<func::ReturnOp>(op))
        continue;
      if (isa<ConstantOp, ShardOp>(op) && map.contains(op.getResult(0)))
        continue;
      // Dropout draws its mask from the step counter and the global index of
      // each element's sample (DropoutMaskOp); the backward of `where` reuses it.
      if (auto d = dyn_cast<DropoutOp>(op)) {
        Value x = map.lookupOrDefault(d.getInput());
        auto type = cast<RankedTensorType>(x.getType());
        double ratio = d.getRatio().convertToDouble();
        // A mask that is not sample-major in B samples (its elements do not divide
        // by B) is one block per micro-batch: still distinct per rank and micro-batch.
        const int64_t numel = type.getNumElements();
        const int64_t batch = microBatch > 0 && numel % microBatch == 0 ? microBatch : 1;
        const int64_t unit = batch == microBatch ? 1 : microBatch; // samples per row 0 step
        Value mask = b.create<DropoutMaskOp>(
            d.getLoc(), entry->getArgument(stepIndex), dpRank, d.getRatioAttr(),
            b.getI64IntegerAttr(d.getSeed()), b.getDenseI64ArrayAttr(type.getShape()),
            b.getI64IntegerAttr(m * microBatch / unit),
            b.getI64IntegerAttr(copies * microBatch / unit), b.getI64IntegerAttr(batch));
        Value scaled = bb.mulScalar(x, 1.0 / (1.0 - ratio));
        Value zero = b.create<ConstantOp>(
            d.getLoc(), DenseElementsAttr::get(RankedTensorType::get({}, type.getElementType()),
                                               b.getFloatAttr(type.getElementType(), 0.0)));
        map.map(d.getResult(), b.create<WhereOp>(d.getLoc(), mask, scaled, zero).getResult());
        map.map(d.getMask(), mask);
        continue;
      }
      // Batch norm trains on batch statistics and updates its running stats.
      if (auto bn = dyn_cast<BatchNormOp>(op)) {
        auto train = b.create<BatchNormTrainingOp>(
            bn.getLoc(), map.lookupOrDefault(bn.getInput()), map.lookupOrDefault(bn.getScale()),
            map.lookupOrDefault(bn.getBias()), map.lookupOrDefault(bn.getMean()),
            map.lookupOrDefault(bn.getVar()), bn.getEpsilonAttr(), bn.getMomentumAttr(),
            b.getBoolAttr(unbiasedRunningVar));
        map.map(bn.getResult(), train.getResult());
        for (auto [i, s] : llvm::enumerate(states)) {
          if (s.constant.getResult() == bn.getMean())
            stateValues[i] = train.getNewRunningMean();
          if (s.constant.getResult() == bn.getVar())
            stateValues[i] = train.getNewRunningVar();
        }
        for (auto [s, value] : llvm::zip(states, stateValues))
          map.map(s.constant.getResult(), value);
        continue;
      }
      Operation *clone = b.clone(op, map);
      if (auto bn = dyn_cast<BatchNormTrainingOp>(clone)) {
        bn.setUnbiasedVar(unbiasedRunningVar);
        for (auto [i, s] : llvm::enumerate(states)) {
          if (s.constant.getResult() == cast<BatchNormTrainingOp>(op).getRunningMean())
            stateValues[i] = bn.getNewRunningMean();
          if (s.constant.getResult() == cast<BatchNormTrainingOp>(op).getRunningVar())
            stateValues[i] = bn.getNewRunningVar();
        }
        for (auto [s, value] : llvm::zip(states, stateValues))
          map.map(s.constant.getResult(), value);
      }
    }
    Value output = map.lookup(ret.getOperand(outputIndex));
    Value label = hasLabel ? entry->getArgument(m * perMicro + numData) : Value();
    auto loss = buildLoss(bb, options.loss, output, label, /*wantCorrect=*/false,
                          outputShard ? &*outputShard : nullptr);
    if (failed(loss))
      return failure();
    // The loss runs where the output is made.
    stageMarks.stamp(pipelineStageOf(output.getDefiningOp()), m);
    // The backward starts from 1/K (accumulation), times the loss scale.
    Value seed = bb.castTo(invCount, Builder::elementOf(loss->first));
    if (scaling.dynamic)
      seed = bb.mul(seed, bb.castTo(entry->getArgument(scaleIndex), Builder::elementOf(seed)));
    auto grads = differentiate(b, *entry, loss->first, seed, paramArgs, marks, m);
    if (failed(grads))
      return failure();
    if (loop) {
      // Added to the accumulators (the first micro-batch's term replaces what
      // they hold: no zeroing between steps, and nothing left from an earlier
      // one, NaN included, reaches this one); the rest of the step reads their
      // sums once every micro-batch has added its own (forge.accumulated).
      Value index = entry->getArgument(static_cast<unsigned>(rankIndex));
      auto i64Scalar = [&](int64_t v) {
        return b.create<ConstantOp>(loc, DenseElementsAttr::get(
                                             RankedTensorType::get({}, b.getI64Type()),
                                             b.getI64IntegerAttr(v)));
      };
      Value first = b.create<EqualOp>(
          loc, b.create<ModOp>(loc, index, count ? count : i64Scalar(k), b.getBoolAttr(false)),
          i64Scalar(0));
      auto accumulated = [&](Value acc, Value term, StringRef name) {
        Value plus = bb.add(acc, term);
        Value sum = bb.where(first, term, plus);
        for (Value v : {plus, sum}) // its terms stay f32 (forge-assign-precision)
          v.getDefiningOp()->setAttr("forge.accumulates", b.getUnitAttr());
        return b.create<AccumulatedOp>(loc, sum, b.getStringAttr(name)).getResult();
      };
      for (auto [i, g] : llvm::enumerate(*grads))
        gradSum.push_back(accumulated(entry->getArgument(accumBase + i), g,
                                      params[i].name + ".grad_accum"));
      lossSum = accumulated(entry->getArgument(accumBase + params.size()), loss->first,
                            "forge.loss_accum");
    } else if (gradSum.empty()) {
      gradSum.assign(grads->begin(), grads->end());
      lossSum = loss->first;
    } else {
      // The sum over micro-batches stays f32 in every term (forge-assign-precision).
      for (auto [acc, g] : llvm::zip(gradSum, *grads)) {
        acc = bb.add(acc, g);
        if (Operation *sum = acc.getDefiningOp())
          sum->setAttr("forge.accumulates", b.getUnitAttr());
      }
      lossSum = bb.add(lossSum, loss->first);
    }
    stageMarks.stamp(std::nullopt, m, /*backward=*/true);
  }
  Value lossMean = k > 1 ? bb.mul(lossSum, bb.castTo(invCount, Builder::elementOf(lossSum)))
                         : lossSum;
  stageMarks.stamp(std::nullopt);

  // Data parallelism: every rank made its gradients from its own batch; their
  // mean over the ranks is the gradient of the global batch (each loss a mean
  // over an equal share), and the loss reported is the global mean. One
  // collective here, before anything reads a gradient (the norm, clipping,
  // the optimizer); forge-partition splits it into buckets issued as the
  // backward pass makes them.
  // ZeRO-1: a split parameter's gradient is reduced to this rank's part
  // instead (forge.reduce_scatter, mean), the part its optimizer updates.
  if (options.dataParallel >= 1) {
    SmallVector<Value> operands;
    SmallVector<unsigned> whole;
    for (auto [i, p] : llvm::enumerate(params))
      if (!p.zeroParts) {
        operands.push_back(gradSum[i]);
        whole.push_back(i);
      }
    operands.push_back(lossMean);
    auto reduce = b.create<AllReduceOp>(loc, ValueRange(operands).getTypes(), operands, "dp",
                                        "mean", options.dataParallel);
    for (auto [k, i] : llvm::enumerate(whole))
      gradSum[i] = reduce.getResult(k);
    lossMean = reduce.getResults().back();
    for (auto [i, p] : llvm::enumerate(params))
      if (p.zeroParts)
        gradSum[i] = b.create<ReduceScatterOp>(loc, p.momentType(), gradSum[i], "dp", "mean",
                                               p.zeroParts);
  }

  // Loss scaling: the gradients stay scaled until the optimizer reads them
  // (times 1/scale, with the clipping factor): the norm's sum of squares is
  // unscaled as a scalar, so that the optimizer and the norm are a
  // gradient's only readers (forge-assign-precision keeps it f32, fusion
  // puts the factor into the update) and no unscaled copy is written.
  Value scaleNow, finite, invScale;
  if (scaling.dynamic) {
    scaleNow = entry->getArgument(scaleIndex);
    invScale = bb.div(bb.scalar(1.0), scaleNow);
  }
  // Global gradient norm and clipping. The norm is a pass over every gradient, so it is
  // computed where clipping or the loss scale's finiteness test reads it, or where asked
  // for (--grad-norm), as PyTorch computes it only in clip_grad_norm_.
  Value normSq, gradNorm;
  if (options.clipGradNorm > 0 || scaling.dynamic || options.gradNorm) {
    normSq = gradientSquares(bb, gradSum);
    if (invScale)
      normSq = bb.mul(normSq, bb.castTo(bb.mul(invScale, invScale), Builder::elementOf(normSq)));
    gradNorm = bb.sqrt(normSq);
  }
  if (scaling.dynamic) // every gradient finite iff the sum of squares is (NaN < inf is false)
    finite = b.create<LessOp>(loc, normSq,
                              bb.scalar(std::numeric_limits<double>::infinity(),
                                        Builder::elementOf(normSq)));
  SmallVector<Value> exposed(options.exposeGradients ? gradSum : SmallVector<Value>());
  if (invScale)
    for (Value &g : exposed)
      g = bb.mul(g, bb.castTo(invScale, Builder::elementOf(g)));
  Value factor = invScale;
  if (options.clipGradNorm > 0) {
    // scale = min(1, clip / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_.
    Value scale = b.create<MinOp>(loc, bb.scalar(1.0),
                                  bb.div(bb.scalar(options.clipGradNorm), bb.add(gradNorm, bb.scalar(1e-6))));
    factor = factor ? bb.mul(factor, scale) : scale;
  }
  stageMarks.stamp(std::nullopt); // the norm and the factor: where their operands are
  if (factor)
    for (auto [i, g] : llvm::enumerate(gradSum)) {
      g = bb.mul(g, bb.castTo(factor, Builder::elementOf(g)));
      if (marks)
        marks->stamp(paramStage[i]);
    }

  Value step = entry->getArgument(stepIndex);
  Value lr = learningRate(bb, step);

  SmallVector<Value> results = {lossMean, lr};
  SmallVector<std::string> resultNames = {"loss", "forge.lr"};
  if (gradNorm) {
    results.push_back(gradNorm);
    resultNames.push_back("forge.grad_norm");
  }
  SmallVector<std::string> updates(results.size(), "");
  // A skipped step (gradients not finite) keeps every optimizer update's old
  // value: `old` is what the step read.
  // ZeRO-1: the optimizer reads this rank's part of a split parameter and
  // updates it (and its state's parts); the ranks then gather the parameter.
  SmallVector<Value> optimizerParams(paramArgs.begin(), paramArgs.end());
  std::map<std::string, const Param *> gathered;
  for (auto [i, p] : llvm::enumerate(params))
    if (p.zeroParts) {
      optimizerParams[i] = b.create<RankSliceOp>(loc, p.momentType(), paramArgs[i], "dp",
                                                 p.zeroParts);
      gathered[p.name] = &p;
    }
  auto update = [&](Value v, const std::string &name, Value old = {}) {
    if (finite && old)
      v = b.create<WhereOp>(loc, finite, v, old);
    if (auto it = gathered.find(name); it != gathered.end())
      v = b.create<AllGatherOp>(loc, it->second->type(), v, "dp", it->second->zeroParts);
    results.push_back(v);
    resultNames.push_back("");
    updates.push_back(name);
  };
  appendOptimizerUpdates(bb, step, lr, optimizerParams, gradSum,
                         ValueRange(entry->getArguments().slice(
                             momentBase, momentNames.size() * params.size())),
                         update);
  for (auto [s, value] : llvm::zip(states, stateValues))
    if (value != s.constant.getResult())
      update(value, s.name);
  if (scaling.dynamic) {
    LossScaleStep next =
        nextLossScale(bb, scaling, scaleNow, entry->getArgument(scaleIndex + 1), finite);
    update(next.scale, "forge.loss_scale");
    update(next.goodSteps, "forge.good_steps");
    results.push_back(scaleNow);
    resultNames.push_back("forge.loss_scale_used");
    updates.push_back("");
    results.push_back(next.skipped);
    resultNames.push_back("forge.skipped");
    updates.push_back("");
  }
  for (auto [p, g] : llvm::zip(params, exposed)) {
    results.push_back(g);
    resultNames.push_back("forge.grad." + p.name);
    updates.push_back("");
  }

  b.create<func::ReturnOp>(loc, results);
  marks = nullptr; // stageMarks ends here
  SmallVector<Type> resultTypes;
  for (Value v : results)
    resultTypes.push_back(v.getType());
  func.setFunctionType(b.getFunctionType(argTypes, resultTypes));
  for (unsigned i = 0; i < results.size(); ++i) {
    if (!updates[i].empty())
      func.setResultAttr(i, "forge.updates", b.getStringAttr(updates[i]));
    else
      func.setResultAttr(i, "forge.name", b.getStringAttr(resultNames[i]));
  }
  return success();
}

LogicalResult TrainGraphBuilder::buildEval(func::FuncOp main) {
  OpBuilder b(ctx);
  Location loc = main.getLoc();
  bool hasLabel = options.loss.kind != "output";
  SmallVector<Type> argTypes(main.getArgumentTypes());
  unsigned numData = main.getNumArguments();
  if (hasLabel)
    argTypes.push_back(labelType);
  // Sample weights (forge.sample_weight, [N] f32) let the runtime evaluate a
  // last partial batch: it pads the batch and gives the padding weight 0.
  // Needs the batch on dim 0 of the label and the output, and per-sample terms
  // of equal count.
  auto outputType = cast<RankedTensorType>(main.getResultTypes()[outputIndex]);
  int64_t batch = hasLabel && labelType.getRank() > 0 ? labelType.getDimSize(0) : 0;
  bool weighted = batch > 0 && outputType.getRank() > 0 && outputType.getDimSize(0) == batch &&
                  outputType.getNumElements() % batch == 0 &&
                  labelType.getNumElements() % batch == 0;
  unsigned weightArg = argTypes.size();
  if (weighted)
    argTypes.push_back(RankedTensorType::get({batch}, b.getF32Type()));
  unsigned paramBase = argTypes.size();
  for (const Param &p : params)
    argTypes.push_back(p.type());
  for (const Param &s : states)
    argTypes.push_back(s.initial.getType());
  auto func = func::FuncOp::create(loc, "eval" + suffix, b.getFunctionType(argTypes, {}));
  module.push_back(func);
  Block *entry = func.addEntryBlock();
  for (unsigned i = 0; i < numData; ++i)
    func.setArgAttrs(i, main.getArgAttrDict(i));
  if (hasLabel)
    func.setArgAttr(numData, "forge.name", b.getStringAttr(options.loss.label));
  if (weighted)
    func.setArgAttr(weightArg, "forge.name", b.getStringAttr("forge.sample_weight"));
  auto setPersistent = [&](unsigned i, const Param &p, StringRef kind) {
    func.setArgAttr(i, "forge.name", b.getStringAttr(p.name));
    func.setArgAttr(i, "forge.kind", b.getStringAttr(kind));
    func.setArgAttr(i, "forge.role", b.getStringAttr(p.role));
    func.setArgAttr(i, "forge.initial_value", p.initial);
    if (DictionaryAttr shard = p.shardAttr())
      func.setArgAttr(i, "forge.shard", shard);
  };
  for (auto [i, p] : llvm::enumerate(params))
    setPersistent(paramBase + i, p, "parameter");
  for (auto [i, s] : llvm::enumerate(states))
    setPersistent(paramBase + params.size() + i, s, "state");

  b.setInsertionPointToStart(entry);
  IRMapping map;
  for (unsigned i = 0; i < numData; ++i)
    map.map(main.getArgument(i), entry->getArgument(i));
  for (auto [i, p] : llvm::enumerate(params))
    map.map(p.value(), entry->getArgument(paramBase + i));
  for (auto [i, s] : llvm::enumerate(states))
    map.map(s.constant.getResult(), entry->getArgument(paramBase + params.size() + i));
  Marks evalMarks(entry, options.pipeline > 1); // as the train step's (no micro-batches)
  Operation *previous = nullptr;
  for (Operation &op : main.getBody().front()) {
    evalMarks.stamp(pipelineStageOf(previous));
    previous = &op;
    if (isa<func::ReturnOp>(op))
      continue;
    if (isa<ConstantOp, ShardOp>(op) && map.contains(op.getResult(0)))
      continue;
    // Evaluation does not drop.
    if (auto d = dyn_cast<DropoutOp>(op)) {
      map.map(d.getResult(), map.lookupOrDefault(d.getInput()));
      map.map(d.getMask(), b.create<ConstantOp>(d.getLoc(), DenseElementsAttr::get(
                                                               d.getMask().getType(), true)));
      continue;
    }
    // Evaluation uses the running statistics.
    if (auto bn = dyn_cast<BatchNormTrainingOp>(op)) {
      Value y = b.create<BatchNormOp>(bn.getLoc(), map.lookupOrDefault(bn.getInput()),
                                      map.lookupOrDefault(bn.getScale()), map.lookupOrDefault(bn.getBias()),
                                      map.lookupOrDefault(bn.getRunningMean()),
                                      map.lookupOrDefault(bn.getRunningVar()), bn.getEpsilonAttr(),
                                      bn.getMomentumAttr());
      map.map(bn.getResult(), y);
      map.map(bn.getNewRunningMean(), map.lookupOrDefault(bn.getRunningMean()));
      map.map(bn.getNewRunningVar(), map.lookupOrDefault(bn.getRunningVar()));
      continue;
    }
    b.clone(op, map);
  }
  auto ret = cast<func::ReturnOp>(main.getBody().front().getTerminator());
  Builder bb(b, loc);
  Value output = map.lookup(ret.getOperand(outputIndex));
  bool wantCorrect = options.loss.kind == "cross_entropy";
  FailureOr<EvalLoss> loss = failure();
  if (weighted) {
    loss = buildWeightedEvalLoss(bb, options.loss, output, entry->getArgument(numData),
                                 entry->getArgument(weightArg), wantCorrect,
                                 outputShard ? &*outputShard : nullptr);
  } else if (auto plain = buildLoss(bb, options.loss, output,
                                    hasLabel ? entry->getArgument(numData) : Value(),
                                    wantCorrect, outputShard ? &*outputShard : nullptr);
             succeeded(plain)) {
    loss = EvalLoss{plain->first, plain->second, Value()};
  }
  if (failed(loss))
    return failure();
  evalMarks.stamp(pipelineStageOf(output.getDefiningOp()));
  SmallVector<Value> results = {loss->loss};
  if (loss->correct)
    results.push_back(loss->correct);
  if (loss->count)
    results.push_back(loss->count);
  b.create<func::ReturnOp>(loc, results);
  SmallVector<Type> resultTypes;
  for (Value v : results)
    resultTypes.push_back(v.getType());
  func.setFunctionType(b.getFunctionType(argTypes, resultTypes));
  func.setResultAttr(0, "forge.name", b.getStringAttr("loss"));
  if (loss->correct)
    func.setResultAttr(1, "forge.name", b.getStringAttr("forge.correct"));
  if (loss->count)
    func.setResultAttr(results.size() - 1, "forge.name", b.getStringAttr("forge.label_count"));
  return success();
}

LogicalResult TrainGraphBuilder::run() {
  if (options.microBatches < 1)
    return main.emitError("--micro-batches must be >= 1");
  auto producer = module->getAttrOfType<StringAttr>("forge.producer");
  unbiasedRunningVar = options.unbiasedRunningVar.value_or(
      producer && producer.getValue().lower().find("pytorch") != std::string::npos);
  for (unsigned i = 0; i < main.getNumResults(); ++i)
    if (auto name = main.getResultAttrOfType<StringAttr>(i, "forge.name");
        name && name.getValue() == options.loss.output)
      outputIndex = i;
  if (outputIndex < 0) {
    std::string names;
    for (unsigned i = 0; i < main.getNumResults(); ++i)
      if (auto name = main.getResultAttrOfType<StringAttr>(i, "forge.name"))
        names += (names.empty() ? "" : ", ") + name.str();
    return main.emitError() << "--loss names output '" << options.loss.output
                            << "', which the model does not have (outputs: " << names << ")";
  }
  for (unsigned i = 0; i < main.getNumArguments(); ++i)
    if (auto name = main.getArgAttrOfType<StringAttr>(i, "forge.name");
        name && name.getValue() == options.loss.label)
      return main.emitError() << "label input '" << options.loss.label
                              << "' collides with a model input";
  for (unsigned i = 0; i < main.getNumResults(); ++i)
    if (auto name = main.getResultAttrOfType<StringAttr>(i, "forge.name");
        name && name.getValue() == options.loss.label)
      return main.emitError() << "label input '" << options.loss.label
                              << "' has the name of a model output; name the labels otherwise";
  WalkResult parameterNamed = main.walk([&](ConstantOp c) {
    auto init = c->getAttrOfType<StringAttr>("forge.initializer");
    return init && init.getValue() == options.loss.label ? WalkResult::interrupt()
                                                         : WalkResult::advance();
  });
  if (parameterNamed.wasInterrupted())
    return main.emitError() << "label input '" << options.loss.label
                            << "' has the name of a model initializer (parameter); name the "
                               "labels otherwise";
  if (failed(collectParams(main)))
    return failure();
  auto outType = cast<RankedTensorType>(main.getResultTypes()[outputIndex]);
  if (auto split = main.getResultAttrOfType<DictionaryAttr>(outputIndex, "forge.shard")) {
    auto axis = split.getAs<IntegerAttr>("axis");
    auto group = split.getAs<StringAttr>("group");
    auto size = split.getAs<IntegerAttr>("size");
    if (!axis || !group || !size || size.getInt() < 1 ||
        axis.getInt() != outType.getRank() - 1)
      return main.emitError() << "output '" << options.loss.output
                              << "': forge.shard must be {axis = its last dim, group, size}, not "
                              << split;
    outputShard = ClassShard{group.getValue().str(), size.getInt()};
  }
  if (options.loss.kind == "cross_entropy") {
    if (outType.getRank() < 2 || !isa<FloatType>(outType.getElementType()))
      return main.emitError() << "cross_entropy needs float logits of rank >= 2, '"
                              << options.loss.output << "' is " << outType;
    labelType = options.loss.probs // class probabilities, as the logits; else indices
                    ? RankedTensorType::get(outType.getShape(), Float32Type::get(ctx))
                    : RankedTensorType::get(outType.getShape().drop_back(),
                                            IntegerType::get(ctx, 64));
    if (options.loss.probs && outputShard)
      return main.emitError() << "output '" << options.loss.output
                              << "' is split by vocabulary (forge.shard): its loss takes class "
                                 "indices, not probabilities";
  } else if (main.getResultAttr(outputIndex, "forge.shard")) {
    return main.emitError() << "output '" << options.loss.output
                            << "' is split by vocabulary (forge.shard): only a cross_entropy "
                               "loss reads it";
  } else if (options.loss.kind != "output") {
    labelType = outType;
  }
  if (failed(buildTrainStep(main)) || failed(buildEval(main)))
    return failure();
  main.erase();
  return success();
}

} // namespace

std::optional<int64_t> mlir::forge::pipelineStageOf(Operation *op) {
  if (auto a = op ? op->getAttrOfType<IntegerAttr>("forge.stage") : IntegerAttr())
    return a.getInt();
  return std::nullopt;
}

int64_t mlir::forge::pipelineStageMaking(Value v, llvm::DenseMap<Operation *, int64_t> &memo) {
  Operation *def = v.getDefiningOp();
  if (!def || isa<ConstantOp>(def))
    return -1;
  if (auto it = memo.find(def); it != memo.end())
    return it->second;
  std::optional<int64_t> mark = pipelineStageOf(def);
  int64_t stage = mark.value_or(-1);
  if (!mark)
    for (Value operand : def->getOperands())
      stage = std::max(stage, pipelineStageMaking(operand, memo));
  return memo[def] = stage;
}

LogicalResult mlir::forge::buildTrainingModule(ModuleOp module, const TrainOptions &options) {
  // @main, and with length buckets (forgec --length-buckets) @main@len<T> per
  // smaller bucket: each gets its own train step and eval; their parameters and
  // state are shared by name (the bundle emitter checks that their types agree).
  SmallVector<func::FuncOp> mains;
  for (auto f : module.getOps<func::FuncOp>())
    if (f.getSymName() == "main" || f.getSymName().starts_with("main@"))
      mains.push_back(f);
  if (mains.empty())
    return module.emitError("no @main function to train");
  for (func::FuncOp main : mains)
    if (failed(TrainGraphBuilder(module, options, main, main.getSymName().drop_front(4)).run()))
      return failure();
  return success();
}
