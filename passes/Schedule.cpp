//===- Schedule.cpp - order, streams and event edges of a routine ---------===//
//
// Invariants established for forge-plan-memory and the bundle emitter:
//  * program order stays a topological order of the data flow; only ops
//    without effects beyond their results move (not collectives, messages,
//    host calls), and an op moves later only to just before its first reader,
//    when each of its operands is still read there or later (its move then
//    shortens its results' live ranges and lengthens none);
//  * the estimated peak of live bytes never grows (else the order is kept);
//  * every collective is on the "collective" stream (forge.stream = 1),
//    everything else on the compute stream (0);
//  * forge.event / forge.waits / forge.joins are exactly deriveStreamOrder's
//    edges (StreamOrder.h): a reader on another stream waits for its
//    producer, no wait is repeated, and the end joins every stream.
//
//===----------------------------------------------------------------------===//
#include "Passes.h"
#include "StreamOrder.h"

#include "forge/Conversion/Conversion.h"
#include "forge/runtime/Bundle.h"

#include "mlir/IR/Builders.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <mutex>

namespace mlir::forge {
#define GEN_PASS_DEF_SCHEDULE
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

/// Positions of the body's ops (constants left out; the terminator last).
llvm::DenseMap<Operation *, int64_t> positions(Block &body) {
  llvm::DenseMap<Operation *, int64_t> at;
  int64_t p = 0;
  for (Operation &op : body)
    if (!isa<ConstantOp>(op))
      at[&op] = p++;
  return at;
}

uint64_t bytesOf(Value v) {
  auto type = dyn_cast<RankedTensorType>(v.getType());
  if (!type || !type.hasStaticShape())
    return 0;
  return static_cast<uint64_t>(type.getNumElements()) *
         ::forge::rt::dtypeSize(dtypeFromType(type.getElementType()));
}

/// Whether `op` may run on a further compute stream: not a collective (its
/// own stream), a host call (the compute stream's callbacks) or a pipeline
/// message (ordered by tokens on the compute stream). cuDNN calls run through
/// a handle of their stream's own; cuBLASLt calls take their stream and
/// workspace per call.
bool mayRunAside(Operation &op) {
  if (isCollectiveOp(&op) || isa<SendOp, RecvOp>(op))
    return false;
  // A concat view's pieces and their makers stay on the compute stream: the
  // bundle knows the pieces as contiguous byte ranges, which interleave (the
  // race check would take makers on two streams for a race), and they are
  // short (dk's centring) or there already (cuDNN attention).
  if (op.hasAttr("forge.out_row_strides") ||
      (isa<ReshapeOp>(op) && llvm::any_of(op.getUsers(), [](Operation *user) {
         return isa<ConcatOp>(user) && isViewOp(user);
       })))
    return false;
  auto placement = op.getAttrOfType<StringAttr>("forge.placement");
  return !placement || placement.getValue() != "host";
}

/// Ops the schedule may move: those whose only effect is their results (the
/// ops that may also run on another stream).
bool movable(Operation &op) {
  return !isa<ConstantOp>(op) && op.getNumResults() > 0 &&
         !op.hasTrait<OpTrait::IsTerminator>() && mayRunAside(op);
}

/// Moves each movable op, last first, to just before its first reader when
/// every operand is still read there or later; returns how many moved.
int64_t sinkToReaders(Block &body) {
  int64_t moved = 0;
  SmallVector<Operation *> order;
  for (Operation &op : body.without_terminator())
    if (!isa<ConstantOp>(op))
      order.push_back(&op);
  for (Operation *op : llvm::reverse(order)) {
    if (!movable(*op))
      continue;
    auto at = positions(body);
    Operation *first = nullptr;
    for (Value r : op->getResults())
      for (Operation *user : r.getUsers())
        if (Operation *top = body.findAncestorOpInBlock(*user);
            top && (!first || at[top] < at[first]))
          first = top;
    if (!first || at[first] <= at[op] + 1)
      continue;
    bool operandsLive = true;
    for (Value v : op->getOperands()) {
      Operation *def = v.getDefiningOp();
      if (!def || isa<ConstantOp>(def))
        continue; // an argument or a constant: not in the arena's live ranges
      bool readLater = false;
      for (Operation *user : v.getUsers())
        if (Operation *top = body.findAncestorOpInBlock(*user);
            top && top != op && at[top] >= at[first])
          readLater = true;
      operandsLive &= readLater;
    }
    if (!operandsLive)
      continue;
    op->moveBefore(first);
    ++moved;
  }
  return moved;
}

/// Independent work on further compute streams (`streams`: their indices,
/// the compute stream's 0 first). An op continues the stream whose latest op
/// produced one of its operands (a chain stays on its stream, without
/// events; of several, the most recent one's); an op that continues none (a second reader of an
/// older value, e.g. a weight gradient beside the data gradient, or one reading only arguments)
/// forks onto the compute stream that has been without work the longest; `pinned` ops stay on the
/// compute stream. Returns how many ops are off the compute stream.
int64_t assignComputeStreams(Block &body, ArrayRef<unsigned> streams,
                             const llvm::DenseSet<Operation *> &pinned) {
  llvm::DenseMap<Operation *, int64_t> position;
  llvm::DenseMap<Operation *, unsigned> streamOf;
  llvm::DenseMap<unsigned, int64_t> tail; // stream -> position of its latest op
  llvm::DenseMap<unsigned, Operation *> tailOp;
  for (unsigned s : streams)
    tail[s] = -1;
  int64_t p = 0, aside = 0;
  for (Operation &op : body.without_terminator()) {
    if (isa<ConstantOp>(op))
      continue;
    position[&op] = p;
    if (auto mark = op.getAttrOfType<IntegerAttr>("forge.stream")) { // a collective
      streamOf[&op] = static_cast<unsigned>(mark.getInt());
      ++p;
      continue;
    }
    if (isViewOp(&op)) { // no instruction: on no stream's timeline
      streamOf[&op] = 0;
      ++p;
      continue;
    }
    std::optional<unsigned> chosen;
    if (!mayRunAside(op) || pinned.contains(&op)) {
      chosen = 0;
    } else {
      // Of the streams it continues, the one whose operand came last: the
      // op waits for that one anyway (the optimizer after the gradient norm
      // stays with the norm, not with an earlier weight gradient's stream).
      SmallVector<Operation *, 4> defs;
      for (Value v : op.getOperands())
        producersThroughViews(v, defs);
      for (Operation *def : defs)
        if (streamOf.count(def)) {
          unsigned s = streamOf[def];
          if (tail.count(s) && tailOp.lookup(s) == def && (!chosen || tail[s] > tail[*chosen]))
            chosen = s;
        }
      if (!chosen) { // a fork: the stream idle the longest
        chosen = streams.front();
        for (unsigned s : streams)
          if (tail[s] < tail[*chosen])
            chosen = s;
      }
    }
    streamOf[&op] = *chosen;
    tail[*chosen] = p;
    tailOp[*chosen] = &op;
    if (*chosen != 0) {
      op.setAttr("forge.stream", IntegerAttr::get(IntegerType::get(op.getContext(), 64), *chosen));
      ++aside;
    }
    ++p;
  }
  return aside;
}

/// Takes every op but the collectives off the further compute streams.
void clearComputeStreams(Block &body) {
  for (Operation &op : body.without_terminator())
    if (op.hasAttr("forge.stream") && !isCollectiveOp(&op))
      op.removeAttr("forge.stream");
}

/// The most bytes of op results live at once under the streams' order
/// (StreamOrder.h), each from its op to its last reader (the return: the
/// end); an op off the compute stream holds its operands until the compute
/// stream is ordered after it (StreamOrder's operandsUntil, as
/// forge-plan-memory), and its results from the last compute op it follows.
/// A cuDNN op's workspace (kCudnnWorkspaceFloor) is live over the same span:
/// concurrent convolutions each hold one. Inputs, parameters and constants
/// are left out: no order changes them. The plan's in-place reuse is not
/// modelled. `peakAt`, if given, gets the position where the peak is first
/// reached.
uint64_t estimatePeak(const StreamOrder &o, Block &body, int64_t *peakAt = nullptr) {
  const int64_t n = static_cast<int64_t>(o.ops.size());
  llvm::DenseMap<Operation *, int64_t> at;
  for (int64_t p = 0; p < n; ++p)
    at[o.ops[p]] = p;
  llvm::DenseMap<Value, std::pair<int64_t, int64_t>> range;
  for (int64_t p = 0; p < n; ++p) {
    const bool aside = o.stream[p] != 0;
    for (Value r : o.ops[p]->getResults())
      range[r] = {aside ? o.after[p] + 1 : p, aside ? o.until[p] : p};
    for (Value v : o.ops[p]->getOperands())
      if (auto it = range.find(v); it != range.end())
        it->second.second = std::max(it->second.second, o.operandsUntil[p]);
  }
  for (Value v : body.getTerminator()->getOperands())
    if (auto it = range.find(v); it != range.end())
      it->second.second = n;
  std::vector<int64_t> delta(static_cast<size_t>(n) + 2, 0);
  for (auto &[v, r] : range) {
    delta[std::max<int64_t>(r.first, 0)] += static_cast<int64_t>(bytesOf(v));
    delta[std::min(r.second, n) + 1] -= static_cast<int64_t>(bytesOf(v));
  }
  for (int64_t p = 0; p < n; ++p) {
    auto library = o.ops[p]->getAttrOfType<StringAttr>("forge.library");
    if (!library || library.getValue() != "cudnn")
      continue;
    const bool aside = o.stream[p] != 0;
    delta[std::max<int64_t>(aside ? o.after[p] + 1 : p, 0)] += kCudnnWorkspaceFloor;
    delta[std::min(aside ? o.until[p] : p, n) + 1] -= kCudnnWorkspaceFloor;
  }
  int64_t live = 0, peak = 0, where = 0;
  for (int64_t p = 0; p < static_cast<int64_t>(delta.size()); ++p)
    if ((live += delta[p]) > peak)
      peak = live, where = p;
  if (peakAt)
    *peakAt = where;
  return static_cast<uint64_t>(peak);
}

/// "conv 'layer1/conv1'", "fusion loop 'ln'", "all_reduce".
std::string label(Operation *op) {
  std::string text = launchKind(op);
  if (StringRef name = sourceNodeName(op); !name.empty())
    text += " '" + name.str() + "'";
  return text;
}

struct SchedulePass : public mlir::forge::impl::ScheduleBase<SchedulePass> {
  using ScheduleBase::ScheduleBase;
  int64_t aside = 0;      // ops on further compute streams
  uint64_t asidePeak = 0; // the estimated peak with them
  bool refused = false;   // further streams were tried and would raise the peak
  int64_t pins = 0;       // side ops kept on the compute stream for the peak

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (!func.getBody().hasOneBlock() ||
        !isa<func::ReturnOp>(func.getBody().front().getTerminator())) {
      func.emitError("routines must have a single block ending in return");
      return signalPassFailure();
    }
    if (func->hasAttr("forge.streams")) {
      func.emitError("the routine is already scheduled");
      return signalPassFailure();
    }
    if (order != "memory" && order != "program") {
      func.emitError("forge-schedule: order must be memory or program, not '") << order << "'";
      return signalPassFailure();
    }
    if (maxStreamPins < 0) {
      func.emitError("forge-schedule: max-stream-pins must be 0 or more, not ")
          << static_cast<int64_t>(maxStreamPins);
      return signalPassFailure();
    }
    if (computeStreams < 1 || computeStreams > 16) {
      func.emitError("forge-schedule: compute-streams must be 1 to 16, not ")
          << static_cast<int64_t>(computeStreams);
      return signalPassFailure();
    }
    Block &body = func.getBody().front();
    aside = 0, asidePeak = 0, refused = false, pins = 0;
    // The order's peaks before streams are set: collectives on their own
    // stream (an unscheduled function's), everything else on one.
    const uint64_t before = estimatePeak(deriveStreamOrder(func), body);
    uint64_t after = before;
    int64_t sunk = 0;
    if (order == "memory") {
      SmallVector<Operation *> original;
      for (Operation &op : body.without_terminator())
        original.push_back(&op);
      sunk = sinkToReaders(body);
      after = estimatePeak(deriveStreamOrder(func), body);
      if (after > before) { // never worse than the order it was given
        for (Operation *op : original)
          op->moveBefore(body.getTerminator());
        sunk = 0;
        after = before;
      }
    }

    Builder b(func.getContext());
    SmallVector<Attribute> streams{b.getStringAttr("compute")};
    for (Operation &op : body.without_terminator())
      if (isCollectiveOp(&op)) {
        if (streams.size() == 1)
          streams.push_back(b.getStringAttr("collective"));
        op.setAttr("forge.stream", b.getI64IntegerAttr(1));
      }
    func->setAttr("forge.streams", b.getArrayAttr(streams));
    StreamOrder o = deriveStreamOrder(func);
    if (computeStreams > 1) {
      // Further compute streams, kept only if the peak (with the longer live
      // ranges their work has) grows by at most stream-memory-growth percent.
      const uint64_t oneStream = estimatePeak(o, body);
      SmallVector<unsigned> compute{0};
      for (int64_t k = 1; k < computeStreams; ++k) {
        compute.push_back(static_cast<unsigned>(streams.size()));
        streams.push_back(b.getStringAttr("compute." + std::to_string(k)));
      }
      func->setAttr("forge.streams", b.getArrayAttr(streams));
      const uint64_t limit =
          oneStream +
          oneStream / 100 * static_cast<uint64_t>(std::max<int64_t>(streamMemoryGrowth, 0));
      llvm::DenseSet<Operation *> pinned;
      aside = assignComputeStreams(body, compute, pinned);
      StreamOrder several = deriveStreamOrder(func);
      int64_t peakAt = 0;
      asidePeak = estimatePeak(several, body, &peakAt);
      const int64_t tried = aside;         // side ops before any went back
      const uint64_t allAside = asidePeak; // and the peak with all of them
      // Over the limit: the side op that may run across the peak holding the
      // most bytes goes back to the compute stream, and the rest are assigned
      // again, until the peak fits (a weight gradient's GEMM that keeps a
      // loss chunk's gradient alive while the next chunk's logits are made
      // stays in order; the other layers' still run beside) or max-stream-pins.
      for (int64_t round = 0; aside > 0 && asidePeak > limit && round < maxStreamPins; ++round) {
        Operation *culprit = nullptr;
        uint64_t most = 0;
        for (size_t p = 0; p < several.ops.size(); ++p) {
          Operation *op = several.ops[p];
          if (several.stream[p] == 0 || isCollectiveOp(op) || isViewOp(op) ||
              several.after[p] + 1 > peakAt ||
              std::max(several.until[p], several.operandsUntil[p]) < peakAt)
            continue;
          uint64_t held = 0;
          for (Value v : op->getResults())
            held += bytesOf(v);
          for (Value v : op->getOperands())
            if (Operation *def = v.getDefiningOp(); def && !isa<ConstantOp>(def))
              held += bytesOf(v);
          if (!culprit || held > most)
            culprit = op, most = held;
        }
        if (!culprit)
          break;
        pinned.insert(culprit);
        clearComputeStreams(body);
        aside = assignComputeStreams(body, compute, pinned);
        several = deriveStreamOrder(func);
        asidePeak = estimatePeak(several, body, &peakAt);
      }
      pins = static_cast<int64_t>(pinned.size());
      if (aside > 0 && asidePeak <= limit) {
        o = std::move(several);
      } else { // back to one compute stream
        streams.resize(streams.size() - static_cast<size_t>(computeStreams - 1));
        func->setAttr("forge.streams", b.getArrayAttr(streams));
        clearComputeStreams(body);
        refused = tried > 0;
        asidePeak = allAside;
        aside = 0;
        pins = 0;
        o = deriveStreamOrder(func);
      }
    }
    writeStreamOrder(func, o);

    if (!report && reportFile.empty())
      return;
    // One write per routine: the routines of a module are scheduled in parallel.
    std::string text;
    llvm::raw_string_ostream timeline(text);
    printTimeline(func, o, before, after, sunk, timeline);
    if (report) {
      static std::mutex stdoutMutex;
      std::lock_guard<std::mutex> lock(stdoutMutex);
      llvm::outs() << text;
      llvm::outs().flush();
    }
    if (!reportFile.empty()) {
      std::error_code ec;
      llvm::raw_fd_ostream os(reportFile, ec, llvm::sys::fs::OF_Append);
      if (ec) {
        func.emitError("cannot write the schedule to '") << reportFile << "': " << ec.message();
        return signalPassFailure();
      }
      os << text;
    }
  }

  /// One line per op, in a column per stream, with its waits and its event.
  void printTimeline(func::FuncOp func, const StreamOrder &o, uint64_t before, uint64_t after,
                     int64_t sunk, llvm::raw_ostream &os) {
    os << "schedule of @" << func.getSymName() << ": " << o.ops.size() << " ops on "
       << o.streams.size() << " stream" << (o.streams.size() > 1 ? "s" : "") << " (";
    llvm::interleaveComma(o.streams, os);
    os << "), " << o.events << " event" << (o.events == 1 ? "" : "s") << "; order " << order;
    if (order == "memory")
      os << " (ops moved to their first readers: " << sunk << "; estimated peak "
         << formatBytes(before) << " -> " << formatBytes(after) << ")";
    if (aside > 0)
      os << "; " << aside << " ops on further compute streams (estimated peak "
         << formatBytes(asidePeak)
         << (pins > 0 ? ", " + std::to_string(pins) + " kept in order for it" : std::string())
         << ")";
    else if (refused)
      os << "; one compute stream (further ones would raise the estimated peak to "
         << formatBytes(asidePeak) << ")";
    os << "\n";
    constexpr int kWidth = 44;
    os << llvm::formatv("  {0,5}", "#");
    for (const std::string &s : o.streams)
      os << "  " << llvm::left_justify(s, kWidth);
    os << "\n";
    for (size_t p = 0; p < o.ops.size(); ++p) {
      std::string cell = label(o.ops[p]);
      if (!o.waits[p].empty()) {
        cell += " (waits";
        for (int64_t e : o.waits[p])
          cell += " e" + std::to_string(e);
        cell += ")";
      }
      if (o.event[p])
        cell += " -> e" + std::to_string(o.event[p]);
      os << llvm::formatv("  {0,5}", p);
      for (size_t s = 0; s < o.streams.size(); ++s) {
        if (s != o.stream[p]) {
          if (s < o.stream[p])
            os << "  " << std::string(kWidth, ' ');
          continue;
        }
        os << "  " << cell;
      }
      os << "\n";
    }
    if (!o.joins.empty()) {
      os << "    end  compute waits";
      for (int64_t e : o.joins)
        os << " e" << e;
      os << "\n";
    }
  }
};

} // namespace
