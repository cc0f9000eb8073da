//===- SplitPipelineStages.cpp - one routine per pipeline stage, 1F1B ------===//
//
// Invariants of the routines `<name>@pp<s>` that replace a marked routine:
//  * each op of the original runs on exactly one stage (its home), except the
//    ops that read only constants and inputs, which every stage that needs
//    them recomputes; so the stages together compute what the routine did;
//  * a value read on a stage other than its home arrives by one
//    forge.recv there, matched by tag to one forge.send on its home right
//    after it is made; tags are unique in the module;
//  * every routine keeps the original's arguments (all inputs, all state);
//    it returns the updates of the state whose home it is, and every metric;
//  * within a routine the micro-batches run in 1F1B order, a reorder of
//    whole micro-batch passes that keeps every dependence (checked).
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "forge/Train/TrainGraph.h"

#include <map>
#include <set>
#include <tuple>

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"

namespace mlir::forge {
#define GEN_PASS_DEF_SPLITPIPELINESTAGES
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

constexpr int64_t kEverywhere = -1; // an op every stage may compute (constants, inputs)
constexpr StringLiteral kGroup = "pp";

std::optional<int64_t> intAttr(Operation *op, StringRef name) {
  if (auto a = op->getAttrOfType<IntegerAttr>(name))
    return a.getInt();
  return std::nullopt;
}

/// The 1F1B order of stage `s` of `p` over `k` micro-batches, as positions:
/// forward[m] and backward[m].
struct Schedule {
  SmallVector<int64_t> forward, backward;
  std::string text;
  Schedule(int64_t s, int64_t p, int64_t k) : forward(k), backward(k) {
    const int64_t warmup = std::min(p - 1 - s, k);
    int64_t at = 0, f = 0, bw = 0;
    auto F = [&]() {
      forward[f] = at++;
      text += (text.empty() ? "F" : " F") + std::to_string(f++);
    };
    auto B = [&]() {
      backward[bw] = at++;
      text += " B" + std::to_string(bw++);
    };
    for (int64_t i = 0; i < warmup; ++i)
      F();
    while (f < k) {
      F();
      B();
    }
    while (bw < k)
      B();
  }
};

struct SplitPipelineStagesPass
    : public mlir::forge::impl::SplitPipelineStagesBase<SplitPipelineStagesPass> {
  int64_t nextTag = 0;
  int64_t micro = 0; // micro-batches of the train step (0: none marked)
  std::string scheduleText;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<func::FuncOp> marked;
    int64_t stages = 0;
    for (auto f : module.getOps<func::FuncOp>()) {
      bool any = false;
      f.walk([&](Operation *op) {
        if (std::optional<int64_t> s = pipelineStageOf(op)) {
          any = true;
          stages = std::max(stages, *s + 1);
        }
      });
      if (any)
        marked.push_back(f);
    }
    if (marked.empty()) {
      markAllAnalysesPreserved();
      return;
    }
    if (stages < 2) {
      module.emitError("forge-split-pipeline-stages: the marks name one stage; --pp needs >= 2");
      return signalPassFailure();
    }
    for (func::FuncOp f : marked)
      if (failed(split(f, stages)))
        return signalPassFailure();
    Builder b(&getContext());
    // 1F1B's bubble: each stage idles (P - 1) of (K + P - 1) pass slots.
    if (micro > 0) {
      const double bubble = double(stages - 1) / double(micro + stages - 1);
      scheduleText += llvm::formatv("\nbubble: {0} of {1} slots per stage idle ({2:P})",
                                    stages - 1, micro + stages - 1, bubble)
                          .str();
      if (micro < stages)
        module.emitWarning() << "--pp " << stages << " with " << micro
                             << " micro-batch(es): each stage idles "
                             << static_cast<int64_t>(100 * bubble + 0.5)
                             << "% of the step; use --micro-batches >= " << stages
                             << " (4x the stages keeps the bubble near 20%)";
    }
    module->setAttr("forge.pipeline_schedule", b.getStringAttr(scheduleText));
  }

  LogicalResult split(func::FuncOp f, int64_t stages) {
    if (!f.getBody().hasOneBlock())
      return f.emitError("forge-split-pipeline-stages: a routine of one block is expected");
    Block &body = f.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    // Data parallelism (--dp with --pp): the one all_reduce of every gradient
    // and the loss becomes one per stage, of the operands made there (each
    // stage's data-parallel group averages its own gradients).
    splitAllReduces(f, body);

    // Homes: arguments first (inputs everywhere; state where its first marked
    // reader is), then ops in program order.
    llvm::DenseMap<Value, int64_t> home;
    for (BlockArgument arg : body.getArguments()) {
      auto kind = f.getArgAttrOfType<StringAttr>(arg.getArgNumber(), "forge.kind");
      int64_t h = kEverywhere;
      if (!kind || kind.getValue() != "input")
        for (Operation *user : arg.getUsers())
          if (std::optional<int64_t> s = pipelineStageOf(user))
            h = h == kEverywhere ? *s : std::min(h, *s);
      home[arg] = h;
    }
    llvm::DenseMap<Operation *, int64_t> opHome;
    for (Operation &op : body.without_terminator()) {
      int64_t h = kEverywhere;
      if (isa<ConstantOp>(op)) {
        h = kEverywhere;
      } else if (std::optional<int64_t> s = pipelineStageOf(&op)) {
        h = *s;
      } else {
        // Unmarked (a sum of gradient contributions, the norm's partial sums,
        // the loss's mean): the latest stage among its operands'.
        for (Value v : op.getOperands())
          h = std::max(h, home.lookup(v));
      }
      if (h >= stages)
        return op.emitError() << "forge-split-pipeline-stages: stage " << h << " of " << stages;
      opHome[&op] = h;
      for (Value r : op.getResults())
        home[r] = h;
    }

    // Which stages return each result: an update on its state's home, a
    // metric on every stage.
    std::map<std::string, int64_t> stateHome;
    for (BlockArgument arg : body.getArguments())
      if (auto name = f.getArgAttrOfType<StringAttr>(arg.getArgNumber(), "forge.name"))
        stateHome[name.str()] = home[arg];
    SmallVector<int64_t> resultHome(ret.getNumOperands(), kEverywhere);
    for (unsigned i = 0; i < ret.getNumOperands(); ++i)
      if (auto updates = f.getResultAttrOfType<StringAttr>(i, "forge.updates")) {
        auto it = stateHome.find(updates.str());
        int64_t h = it == stateHome.end() ? kEverywhere : it->second;
        if (h == kEverywhere)
          h = std::max<int64_t>(home.lookup(ret.getOperand(i)), 0);
        resultHome[i] = h;
      }

    // Messages: (value, reading stage) -> tag, in program order.
    std::map<std::pair<void *, int64_t>, int64_t> tagOf;
    llvm::DenseMap<Value, SmallVector<int64_t>> readersOf; // value -> other stages
    auto need = [&](Value v, int64_t at) {
      int64_t h = home.lookup(v);
      if (h == kEverywhere || h == at)
        return;
      auto key = std::make_pair(v.getAsOpaquePointer(), at);
      if (tagOf.count(key))
        return;
      tagOf[key] = nextTag++;
      readersOf[v].push_back(at);
    };
    for (Operation &op : body.without_terminator())
      if (opHome[&op] != kEverywhere)
        for (Value v : op.getOperands())
          need(v, opHome[&op]);
    for (int64_t s = 0; s < stages; ++s)
      for (unsigned i = 0; i < ret.getNumOperands(); ++i)
        if (resultHome[i] == kEverywhere || resultHome[i] == s)
          need(ret.getOperand(i), s);

    int64_t k = 0; // this routine's micro-batches (eval: none)
    for (Operation &op : body)
      if (std::optional<int64_t> m = intAttr(&op, "forge.micro"))
        k = std::max(k, *m + 1);
    micro = std::max(micro, k);

    OpBuilder b(f.getContext());
    auto tokenType = RankedTensorType::get({0}, b.getI1Type());
    std::string text;
    for (int64_t s = 0; s < stages; ++s) {
      SmallVector<unsigned> kept;
      SmallVector<Type> resultTypes;
      for (unsigned i = 0; i < ret.getNumOperands(); ++i)
        if (resultHome[i] == kEverywhere || resultHome[i] == s) {
          kept.push_back(i);
          resultTypes.push_back(ret.getOperand(i).getType());
        }
      b.setInsertionPoint(f);
      auto stage = b.create<func::FuncOp>(
          f.getLoc(), (f.getSymName() + "@pp" + std::to_string(s)).str(),
          b.getFunctionType(f.getArgumentTypes(), resultTypes));
      for (unsigned i = 0; i < f.getNumArguments(); ++i)
        stage.setArgAttrs(i, f.getArgAttrDict(i));
      for (auto [j, i] : llvm::enumerate(kept))
        stage.setResultAttrs(j, f.getResultAttrDict(i));
      Block *entry = stage.addEntryBlock();
      b.setInsertionPointToEnd(entry);
      IRMapping map;
      // Arguments of another stage (a tied weight) are not read here: they
      // arrive by message, current, where the local copy would be stale.
      for (auto [from, to] : llvm::zip(body.getArguments(), entry->getArguments()))
        if (home.lookup(from) == s || home.lookup(from) == kEverywhere)
          map.map(from, to);
      // A recv takes the micro-batch marks of its first reader, a send those of
      // its producer: the 1F1B sort moves them with their passes.
      auto copyMarks = [](Operation *from, Operation *to) {
        for (StringRef name : {"forge.micro", "forge.backward"})
          if (Attribute a = from ? from->getAttr(name) : Attribute())
            to->setAttr(name, a);
      };
      auto receive = [&](Value v, Operation *reader) {
        if (map.contains(v))
          return;
        int64_t h = home.lookup(v);
        auto recv = b.create<RecvOp>(v.getLoc(), v.getType(), tokenType, Value(), kGroup, h,
                                     tagOf.at({v.getAsOpaquePointer(), s}), stages);
        copyMarks(reader, recv);
        map.map(v, recv.getResult());
      };
      // State another stage reads (a tied weight) leaves at the start.
      for (BlockArgument arg : body.getArguments()) {
        auto it = readersOf.find(arg);
        if (home.lookup(arg) != s || it == readersOf.end())
          continue;
        for (int64_t reader : it->second)
          b.create<SendOp>(arg.getLoc(), tokenType, entry->getArgument(arg.getArgNumber()),
                           Value(), kGroup, reader,
                           tagOf.at({Value(arg).getAsOpaquePointer(), reader}), stages);
      }
      for (Operation &op : body.without_terminator()) {
        const int64_t h = opHome[&op];
        if (h != kEverywhere && h != s)
          continue;
        for (Value v : op.getOperands())
          if (home.lookup(v) != kEverywhere && home.lookup(v) != s)
            receive(v, &op);
        Operation *clone = b.clone(op, map);
        for (auto [r, c] : llvm::zip(op.getResults(), clone->getResults())) {
          auto it = readersOf.find(r);
          if (it == readersOf.end() || h != s)
            continue;
          for (int64_t reader : it->second) {
            auto send = b.create<SendOp>(op.getLoc(), tokenType, c, Value(), kGroup, reader,
                                         tagOf.at({r.getAsOpaquePointer(), reader}), stages);
            copyMarks(&op, send);
          }
        }
      }
      SmallVector<Value> results;
      for (unsigned i : kept) {
        receive(ret.getOperand(i), nullptr);
        results.push_back(map.lookup(ret.getOperand(i)));
      }
      b.create<func::ReturnOp>(ret.getLoc(), results);
      if (k > 0) {
        Schedule order(s, stages, k);
        if (failed(reorder(stage, order, k)))
          return failure();
        text += (text.empty() ? "" : "\n") + f.getSymName().str() + " stage " +
                std::to_string(s) + ": " + order.text;
      }
      // The messages in their final order, chained by their tokens.
      Value previous;
      for (Operation &op : stage.getBody().front()) {
        if (auto send = dyn_cast<SendOp>(op)) {
          if (previous)
            send->insertOperands(1, previous);
          previous = send.getToken();
        } else if (auto recv = dyn_cast<RecvOp>(op)) {
          if (previous)
            recv->insertOperands(0, previous);
          previous = recv.getToken();
        }
      }
      stage.walk([](Operation *op) {
        for (StringRef name : {"forge.stage", "forge.micro", "forge.backward"})
          op->removeAttr(name);
      });
    }
    if (!text.empty())
      scheduleText += (scheduleText.empty() ? "" : "\n") + text;
    // Every send has its recv (a message nobody takes would hold the sender's
    // queue, and a recv nobody sends would wait out the timeout).
    std::set<std::tuple<int64_t, int64_t, int64_t>> sent, received; // (from, to, tag)
    for (int64_t s = 0; s < stages; ++s) {
      auto stage = f->getParentOfType<ModuleOp>().lookupSymbol<func::FuncOp>(
          (f.getSymName() + "@pp" + std::to_string(s)).str());
      stage.walk([&](SendOp op) { sent.insert({s, op.getPeer(), op.getTag()}); });
      stage.walk([&](RecvOp op) { received.insert({op.getPeer(), s, op.getTag()}); });
    }
    if (sent != received)
      return f.emitError("forge-split-pipeline-stages: internal: ")
             << sent.size() << " sends and " << received.size() << " recvs do not pair up";
    f.erase();
    return success();
  }

  void splitAllReduces(func::FuncOp f, Block &body) {
    llvm::DenseMap<Operation *, int64_t> memo;
    for (AllReduceOp op : llvm::to_vector(body.getOps<AllReduceOp>())) {
      std::map<int64_t, SmallVector<unsigned>> byStage;
      for (auto [i, v] : llvm::enumerate(op.getInputs()))
        byStage[std::max<int64_t>(pipelineStageMaking(v, memo), 0)].push_back(i);
      if (byStage.size() < 2)
        continue; // one stage's already (tensor parallelism's sums, in their pass)
      OpBuilder b(op);
      for (auto &[stage, members] : byStage) {
        SmallVector<Value> inputs;
        for (unsigned i : members)
          inputs.push_back(op.getInputs()[i]);
        auto part = b.create<AllReduceOp>(op.getLoc(), ValueRange(inputs).getTypes(), inputs,
                                          op.getGroup(), op.getReduction(), op.getSize());
        for (StringRef mark : {"forge.micro", "forge.backward"})
          if (Attribute a = op->getAttr(mark))
            part->setAttr(mark, a);
        part->setAttr("forge.stage", b.getI64IntegerAttr(stage));
        for (auto [k, i] : llvm::enumerate(members))
          op.getResult(i).replaceAllUsesWith(part.getResult(k));
      }
      op.erase();
    }
  }

  /// Sorts the routine's ops into `order` (stable within a pass); ops of no
  /// micro-batch stay before the first pass or after the last, as they were.
  LogicalResult reorder(func::FuncOp f, const Schedule &order, int64_t micro) {
    Block &body = f.getBody().front();
    SmallVector<std::pair<int64_t, Operation *>> keyed;
    bool seenMicro = false;
    for (Operation &op : body.without_terminator()) {
      int64_t key;
      if (std::optional<int64_t> m = intAttr(&op, "forge.micro")) {
        seenMicro = true;
        key = op.hasAttr("forge.backward") ? order.backward[*m] : order.forward[*m];
      } else {
        key = seenMicro ? 2 * micro : -1;
      }
      keyed.push_back({key, &op});
    }
    std::stable_sort(keyed.begin(), keyed.end(),
                     [](const auto &a, const auto &b) { return a.first < b.first; });
    Operation *terminator = body.getTerminator();
    for (auto &[key, op] : keyed)
      op->moveBefore(terminator);
    llvm::DenseMap<Operation *, size_t> position;
    for (auto [i, op] : llvm::enumerate(body))
      position[&op] = i;
    for (Operation &op : body)
      for (Value v : op.getOperands())
        if (Operation *def = v.getDefiningOp(); def && position[def] > position[&op])
          return op.emitError("forge-split-pipeline-stages: internal: the 1F1B order puts ")
                 << op.getName() << " " << op.getAttrDictionary() << " before the producer of "
                 << "its operand, " << def->getName() << " " << def->getAttrDictionary();
    return success();
  }
};

} // namespace
