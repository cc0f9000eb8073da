//===- SplitAccumulation.cpp - @train_step -> @accumulate + @train_step ---===//
//
// Invariants of the two routines that replace a train step holding
// forge.accumulated ops (forgec --micro-batches K, --accumulate loop):
//  * @accumulate holds exactly the ops some forge.accumulated operand depends
//    on, in their order; it returns each such operand as the update of the
//    op's accumulator (by name) and every update of the step those ops made
//    (batch norms' running statistics); it has no outputs;
//  * @train_step keeps every other op; where it read a forge.accumulated
//    result it reads the accumulator's argument, which holds that sum once
//    the runtime has run @accumulate on each micro-batch; a micro-batch value
//    it reads otherwise is recomputed from its constants and non-data
//    arguments, or the pass fails;
//  * @accumulate_first is @accumulate for a step's first micro-batch: its
//    accumulations write the term (no read of the accumulator);
//  * @train_step's data inputs that nothing reads any more are dropped:
//    the runtime feeds them to @accumulate only. Both keep forge.step (and
//    forge.micro_count where they read it).
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include <functional>

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/BitVector.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::forge {
#define GEN_PASS_DEF_SPLITACCUMULATION
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

constexpr StringLiteral kRoutine = "accumulate";
constexpr StringLiteral kFirstRoutine = "accumulate_first";

/// An accumulation: where(first, term, acc + term), both ops marked
/// forge.accumulates (forge-build-train-step), alone in a loop region or loose.
struct Accumulation {
  Operation *op;          // the region (or the loose where) whose result is the sum
  Value acc, term, first; // as the op reads them
};

std::optional<Accumulation> matchAccumulation(Operation *op) {
  WhereOp w;
  ValueRange args, inputs; // a region's block arguments and the inputs they stand for
  if (auto fusion = dyn_cast<FusionOp>(op)) {
    if (fusion.getKind() != "loop" || fusion->getNumResults() != 1 ||
        llvm::range_size(fusion.getBlock().without_terminator()) != 2)
      return std::nullopt;
    w = dyn_cast_or_null<WhereOp>(
        fusion.getBlock().getTerminator()->getOperand(0).getDefiningOp());
    args = fusion.getBlock().getArguments();
    inputs = fusion.getInputs();
  } else {
    w = dyn_cast<WhereOp>(op);
  }
  if (!w)
    return std::nullopt;
  auto add = w.getOperand(2).getDefiningOp<AddOp>();
  if (!w->hasAttr("forge.accumulates") || !add || !add->hasAttr("forge.accumulates") ||
      add.getOperand(1) != w.getOperand(1))
    return std::nullopt;
  auto outer = [&](Value v) -> Value { // a block argument -> the region's input
    if (args.empty())
      return v;
    auto arg = dyn_cast<BlockArgument>(v);
    return arg ? inputs[arg.getArgNumber()] : Value();
  };
  Accumulation a{op, outer(add.getOperand(0)), outer(w.getOperand(1)), outer(w.getOperand(0))};
  if (!a.acc || !a.term || !a.first)
    return std::nullopt;
  return a;
}

StringRef argString(func::FuncOp f, unsigned i, StringRef attr) {
  auto a = f.getArgAttrOfType<StringAttr>(i, attr);
  return a ? a.getValue() : StringRef();
}

/// A data input: fed per micro-batch, so the rest of the step cannot read it.
/// forge.step and forge.micro_count (the step's count of micro-batches) are
/// the step's own.
bool isDataInput(func::FuncOp f, unsigned i) {
  StringRef name = argString(f, i, "forge.name");
  return argString(f, i, "forge.kind") == "input" && name != "forge.step" &&
         name != "forge.micro_count";
}

/// The top-level op of `body` that `v` is defined by (nullptr: an argument).
Operation *topLevelDef(Value v, Block &body) {
  Operation *def = v.getDefiningOp();
  return def ? body.findAncestorOpInBlock(*def) : nullptr;
}

/// Whether `op` computes without side effects: a pure op, or a fusion region
/// of pure ops (fusion puts a scalar chain such as 1 / forge.micro_count into
/// a region).
bool computesOnly(Operation *op) {
  if (auto fusion = dyn_cast<FusionOp>(op)) {
    WalkResult r = fusion.getBody().walk([](Operation *inner) {
      return isMemoryEffectFree(inner) ? WalkResult::advance() : WalkResult::interrupt();
    });
    return !r.wasInterrupted();
  }
  return isMemoryEffectFree(op);
}

/// Every value `op` (and the ops nested in it) reads from outside itself.
SmallVector<Value> valuesRead(Operation *op) {
  SmallVector<Value> read;
  op->walk([&](Operation *inner) {
    for (Value v : inner->getOperands()) {
      Operation *owner = v.getDefiningOp();
      if (!owner)
        owner = cast<BlockArgument>(v).getOwner()->getParentOp();
      if (owner != op && !op->isProperAncestor(owner))
        read.push_back(v);
    }
  });
  return read;
}

/// Erases the ops of `body` that nothing reads and that have no effect, last
/// first (forge-eliminate-dead-code's rule, inside this pass).
void eraseDeadOps(Block &body) {
  SmallVector<Operation *> ops;
  for (Operation &op : body.without_terminator())
    ops.push_back(&op);
  for (Operation *op : llvm::reverse(ops))
    if (op->use_empty() && isMemoryEffectFree(op))
      op->erase();
}

struct SplitAccumulationPass
    : public mlir::forge::impl::SplitAccumulationBase<SplitAccumulationPass> {
  using SplitAccumulationBase::SplitAccumulationBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    // @train_step, and each length bucket's @"train_step@len<T>" (forgec
    // --length-buckets): @accumulate<suffix> and @accumulate_first<suffix>.
    bool any = false;
    for (auto train : llvm::to_vector(module.getOps<func::FuncOp>())) {
      StringRef name = train.getSymName();
      if (name != "train_step" && !name.starts_with("train_step@len"))
        continue;
      SmallVector<AccumulatedOp> cuts;
      train.walk([&](AccumulatedOp op) { cuts.push_back(op); });
      if (cuts.empty())
        continue;
      std::string suffix = name.drop_front(StringRef("train_step").size()).str();
      for (StringRef routine : {kRoutine, kFirstRoutine})
        if (module.lookupSymbol((routine + suffix).str())) {
          module.emitError() << "forge-split-accumulation: the module already has @"
                             << routine << suffix;
          return signalPassFailure();
        }
      any = true;
      if (failed(split(train, cuts, suffix)))
        return signalPassFailure();
    }
    if (!any)
      markAllAnalysesPreserved();
  }

  /// @accumulate_first (`firstMicroBatch`): each accumulation is its term
  /// (what where(first, ...) selects), so the producer writes the accumulator.
  /// @accumulate: on CUDA (gemm-accumulation), a term that a lone GEMM makes
  /// becomes that GEMM with the accumulator as C and beta = 1 (cuBLASLt adds
  /// it in the epilogue, in place), instead of a kernel reading both.
  void specialize(func::FuncOp f, bool firstMicroBatch) {
    SmallVector<Accumulation> found;
    for (Operation &op : f.front().without_terminator())
      if (auto m = matchAccumulation(&op))
        found.push_back(*m);
    for (Accumulation &a : found) {
      Value sum = a.op->getResult(0);
      Operation *add = nullptr; // a loose accumulation's add (a region holds its own)
      if (auto w = dyn_cast<WhereOp>(a.op))
        add = w.getOperand(2).getDefiningOp();
      if (firstMicroBatch) {
        sum.replaceAllUsesWith(a.term);
      } else {
        auto gemm = a.term.getDefiningOp<GemmOp>();
        if (!gemmAccumulation || !gemm || gemm.getC() || gemm.getBeta().convertToDouble() != 0.0 ||
            a.term.getType() != a.acc.getType() ||
            !llvm::all_of(a.term.getUsers(),
                          [&](Operation *u) { return u == a.op || u == add; }))
          continue;
        OpBuilder b(gemm);
        auto fused = b.create<GemmOp>(gemm.getLoc(), gemm.getType(), gemm.getA(), gemm.getB(),
                                      a.acc, gemm.getTransAAttr(), gemm.getTransBAttr(),
                                      gemm.getAlphaAttr(), b.getF64FloatAttr(1.0));
        fused->setDiscardableAttrs(gemm->getDiscardableAttrDictionary());
        sum.replaceAllUsesWith(fused.getResult());
      }
      a.op->erase();
      if (add && add->use_empty())
        add->erase();
      if (Operation *term = a.term.getDefiningOp(); !firstMicroBatch && term && term->use_empty())
        term->erase();
    }
    // The first-micro-batch flag (and what made it) may be dead now.
    eraseDeadOps(f.front());
  }

  LogicalResult split(func::FuncOp train, ArrayRef<AccumulatedOp> cuts, StringRef suffix) {
    Block &body = train.front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    // Dead ops (the pipeline removed them already; forge-opt's input may not
    // have) would read the micro-batch's values for nothing.
    eraseDeadOps(body);

    // 1. The micro-batch part: what the sums depend on.
    for (AccumulatedOp cut : cuts)
      if (cut->getBlock() != &body)
        return cut.emitError("forge-split-accumulation: forge.accumulated inside a region");
    llvm::DenseSet<Operation *> micro = accumulationPart(body);
    for (AccumulatedOp cut : cuts)
      if (micro.contains(cut))
        return cut.emitError("forge-split-accumulation: a micro-batch sum depends on another "
                             "accumulated sum");

    // 2. The rest may read a micro-batch value only where it can recompute it:
    // pure ops over constants and non-data arguments.
    llvm::DenseMap<Operation *, bool> recomputable;
    std::function<bool(Operation *)> canRecompute = [&](Operation *op) {
      if (auto it = recomputable.find(op); it != recomputable.end())
        return it->second;
      recomputable[op] = false; // no cycles in a block; a guard all the same
      bool ok = computesOnly(op);
      for (Value v : valuesRead(op)) {
        if (!ok)
          break;
        if (auto arg = dyn_cast<BlockArgument>(v); arg && arg.getOwner() == &body)
          ok = !isDataInput(train, arg.getArgNumber());
        else if (Operation *def = topLevelDef(v, body))
          ok = canRecompute(def);
      }
      return recomputable[op] = ok;
    };
    llvm::SetVector<Operation *> copies; // micro-batch ops the rest recomputes
    std::function<void(Operation *)> copy = [&](Operation *op) {
      for (Value v : valuesRead(op))
        if (Operation *def = topLevelDef(v, body); def && micro.contains(def))
          copy(def);
      copies.insert(op);
    };
    for (Operation &op : body.without_terminator()) {
      if (micro.contains(&op) || isa<AccumulatedOp>(op))
        continue;
      for (Value v : valuesRead(&op)) {
        Operation *def = topLevelDef(v, body);
        if (!def || !micro.contains(def))
          continue;
        if (!canRecompute(def))
          return op.emitError("forge-split-accumulation: reads a value of the micro-batch's "
                              "forward/backward (")
                 << def->getName() << ") other than through forge.accumulated";
        copy(def);
      }
    }

    // 3. The step's results: the micro-batch part's updates move to @accumulate.
    SmallVector<unsigned> moved;
    for (auto [r, v] : llvm::enumerate(ret.getOperands())) {
      Operation *def = topLevelDef(v, body);
      if (!def || !micro.contains(def))
        continue;
      if (!train.getResultAttr(r, "forge.updates")) {
        auto name = train.getResultAttrOfType<StringAttr>(r, "forge.name");
        return train.emitError("forge-split-accumulation: output '")
               << (name ? name.getValue() : StringRef("?"))
               << "' is made by the micro-batch's forward/backward; the loop returns only "
                  "the sums (use --accumulate unroll)";
      }
      if (copies.contains(def))
        continue; // recomputed where the step returns it
      moved.push_back(static_cast<unsigned>(r));
    }

    // 4. @accumulate: the micro-batch ops over the arguments they read.
    MLIRContext *ctx = train.getContext();
    OpBuilder b(ctx);
    llvm::SetVector<unsigned> argsRead;
    for (Operation &op : body.without_terminator())
      if (micro.contains(&op))
        for (Value v : valuesRead(&op))
          if (auto arg = dyn_cast<BlockArgument>(v); arg && arg.getOwner() == &body)
            argsRead.insert(arg.getArgNumber());
    SmallVector<unsigned> args(argsRead.begin(), argsRead.end());
    llvm::sort(args);
    SmallVector<Type> argTypes;
    for (unsigned i : args)
      argTypes.push_back(train.getArgument(i).getType());
    b.setInsertionPoint(train);
    auto acc = b.create<func::FuncOp>(train.getLoc(), (kRoutine + suffix).str(),
                                      b.getFunctionType(argTypes, {}));
    for (NamedAttribute a : train->getDiscardableAttrs())
      acc->setAttr(a.getName(), a.getValue());
    Block *entry = acc.addEntryBlock();
    IRMapping map;
    for (auto [k, i] : llvm::enumerate(args)) {
      if (DictionaryAttr attrs = train.getArgAttrDict(i))
        acc.setArgAttrs(k, attrs);
      map.map(train.getArgument(i), entry->getArgument(k));
    }
    b.setInsertionPointToStart(entry);
    for (Operation &op : body.without_terminator())
      if (micro.contains(&op))
        b.clone(op, map);
    SmallVector<Value> results;
    SmallVector<DictionaryAttr> resultAttrs;
    auto updates = [&](StringRef name) {
      return b.getDictionaryAttr(b.getNamedAttr("forge.updates", b.getStringAttr(name)));
    };
    for (AccumulatedOp cut : cuts) {
      results.push_back(map.lookup(cut.getSum()));
      resultAttrs.push_back(updates(cut.getAccumulator()));
    }
    for (unsigned r : moved) {
      results.push_back(map.lookup(ret.getOperand(r)));
      resultAttrs.push_back(train.getResultAttrDict(r));
    }
    b.create<func::ReturnOp>(train.getLoc(), results);
    acc.setFunctionType(b.getFunctionType(argTypes, ValueRange(results).getTypes()));
    for (auto [r, attrs] : llvm::enumerate(resultAttrs))
      if (attrs)
        acc.setResultAttrs(r, attrs);
    // The first micro-batch's routine: each accumulation writes its term.
    auto first = cast<func::FuncOp>(acc->clone());
    first.setSymName((kFirstRoutine + suffix).str());
    b.setInsertionPoint(acc);
    b.insert(first);
    specialize(first, /*firstMicroBatch=*/true);
    specialize(acc, /*firstMicroBatch=*/false);

    // 5. @train_step: the accumulators where the sums were read, the
    // recomputed values before their first reader, the micro-batch part gone.
    llvm::StringMap<BlockArgument> persistent;
    for (BlockArgument arg : train.getArguments())
      if (StringRef name = argString(train, arg.getArgNumber(), "forge.name"); !name.empty())
        persistent[name] = arg;
    for (AccumulatedOp cut : cuts) {
      auto it = persistent.find(cut.getAccumulator());
      if (it == persistent.end() || it->second.getType() != cut.getType())
        return cut.emitError("forge-split-accumulation: no argument '")
               << cut.getAccumulator() << "' of the sum's type to read it from";
      cut.getResult().replaceAllUsesWith(it->second);
    }
    IRMapping again;
    b.setInsertionPointToStart(&body);
    for (Operation *op : copies) {
      Operation *clone = b.clone(*op, again);
      for (auto [from, to] : llvm::zip(op->getResults(), clone->getResults()))
        from.replaceUsesWithIf(to, [&](OpOperand &use) {
          return !micro.contains(body.findAncestorOpInBlock(*use.getOwner()));
        });
    }
    SmallVector<Value> kept;
    llvm::BitVector dropResults(ret.getNumOperands());
    for (unsigned r : moved)
      dropResults.set(r);
    for (auto [r, v] : llvm::enumerate(ret.getOperands()))
      if (!dropResults.test(r))
        kept.push_back(v);
    ret->setOperands(kept);
    train.eraseResults(dropResults);
    for (AccumulatedOp cut : cuts)
      cut->erase();
    SmallVector<Operation *> gone;
    for (Operation &op : body.without_terminator())
      if (micro.contains(&op))
        gone.push_back(&op);
    for (Operation *op : llvm::reverse(gone)) {
      if (!op->use_empty())
        return op->emitError("forge-split-accumulation: internal: a micro-batch op is still read");
      op->erase();
    }
    llvm::BitVector dropArgs(train.getNumArguments());
    for (BlockArgument arg : train.getArguments())
      if (arg.use_empty() && isDataInput(train, arg.getArgNumber()))
        dropArgs.set(arg.getArgNumber());
    train.eraseArguments(dropArgs);
    return success();
  }
};

} // namespace

llvm::DenseSet<Operation *> mlir::forge::accumulationPart(Block &body) {
  llvm::DenseSet<Operation *> part;
  SmallVector<Operation *> work;
  auto reach = [&](Value v) {
    if (Operation *def = topLevelDef(v, body); def && part.insert(def).second)
      work.push_back(def);
  };
  for (Operation &op : body)
    if (auto cut = dyn_cast<AccumulatedOp>(op))
      reach(cut.getSum());
  while (!work.empty())
    for (Value v : valuesRead(work.pop_back_val()))
      reach(v);
  if (part.empty())
    return part;
  // Ops that only make state updates from micro-batch values (and constants or
  // arguments) belong to it too: each micro-batch's run updates that state, as
  // a batch_norm_training op's running statistics are (a channels-last batch
  // norm, which forge-assign-layout expands, makes them with pointwise ops
  // that no sum depends on; forge-fuse would otherwise put them in the
  // optimizer's region, which reads the sums).
  auto func = dyn_cast<func::FuncOp>(body.getParentOp());
  Operation *ret = body.getTerminator();
  if (!func || !ret)
    return part;
  llvm::DenseSet<Operation *> updateOnly;
  for (Operation &op : llvm::reverse(body.without_terminator())) {
    if (part.contains(&op) || isa<AccumulatedOp>(op) || op.use_empty())
      continue;
    bool only = true;
    for (OpOperand &use : op.getUses()) {
      Operation *user = body.findAncestorOpInBlock(*use.getOwner());
      if (user == ret)
        only = only && func.getResultAttr(use.getOperandNumber(), "forge.updates");
      else
        only = only && user && updateOnly.contains(user);
    }
    if (only)
      updateOnly.insert(&op);
  }
  for (Operation &op : body.without_terminator()) {
    if (!updateOnly.contains(&op))
      continue;
    bool readsPart = false, readsRest = false;
    for (Value v : valuesRead(&op)) {
      Operation *def = topLevelDef(v, body);
      if (def && part.contains(def))
        readsPart = true;
      else if (def && !isa<ConstantOp>(def))
        readsRest = true;
    }
    if (!readsPart || readsRest)
      continue;
    part.insert(&op);
    // With the constants it reads, which nothing in the part may have
    // reached (fp8 delayed scaling's history slots).
    for (Value v : valuesRead(&op))
      if (Operation *def = topLevelDef(v, body); def && isa<ConstantOp>(def))
        part.insert(def);
  }
  return part;
}
