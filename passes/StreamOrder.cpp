//===- StreamOrder.cpp - streams and event edges of a routine -------------===//
#include "StreamOrder.h"

#include "Passes.h"

#include "mlir/IR/Builders.h"

#include <algorithm>

using namespace mlir;
using namespace mlir::forge;

bool mlir::forge::isCollectiveOp(Operation *op) {
  return isa<AllReduceOp, ReduceScatterOp, AllGatherOp, RankSliceOp>(op);
}

void mlir::forge::producersThroughViews(Value v, SmallVectorImpl<Operation *> &out) {
  Operation *def = v.getDefiningOp();
  if (!def)
    return;
  if (!isViewOp(def)) {
    out.push_back(def);
    return;
  }
  // A view is its operands' bytes (a split's one operand, a concat's pieces):
  // their producers'.
  for (Value in : def->getOperands())
    producersThroughViews(in, out);
}

bool mlir::forge::isViewOp(Operation *op) {
  auto placement = op->getAttrOfType<StringAttr>("forge.placement");
  return placement && placement.getValue() == "view";
}

StreamOrder mlir::forge::deriveStreamOrder(
    func::FuncOp func, const llvm::DenseMap<Operation *, SmallVector<Operation *, 4>> &overwrites) {
  StreamOrder o;
  Block &body = func.getBody().front();
  auto names = func->getAttrOfType<ArrayAttr>("forge.streams");
  if (names) {
    for (Attribute a : names)
      o.streams.push_back(cast<StringAttr>(a).str());
  } else {
    o.streams.push_back("compute");
  }
  int collective = -1; // an unscheduled function's collective stream
  llvm::DenseMap<Operation *, int64_t> position;
  for (Operation &op : body.without_terminator()) {
    if (isa<ConstantOp>(op))
      continue;
    unsigned s = 0;
    if (auto mark = op.getAttrOfType<IntegerAttr>("forge.stream")) {
      s = static_cast<unsigned>(mark.getInt());
    } else if (!names && isCollectiveOp(&op)) {
      if (collective < 0) {
        collective = static_cast<int>(o.streams.size());
        o.streams.push_back("collective");
      }
      s = static_cast<unsigned>(collective);
    }
    position[&op] = static_cast<int64_t>(o.ops.size());
    o.ops.push_back(&op);
    o.stream.push_back(s);
  }
  const size_t n = o.ops.size(), streams = o.streams.size();
  o.event.assign(n, 0);
  o.waits.assign(n, {});
  o.after.assign(n, -1);
  o.until.assign(n, static_cast<int64_t>(n));
  // ordered[s][t]: the last position of stream t that stream s is ordered
  // after so far (-1: the start, after the inputs arrived on the compute
  // stream, which every stream waits for). seen[p]: ordered[stream p] as of p.
  std::vector<std::vector<int64_t>> ordered(streams, std::vector<int64_t>(streams, -1));
  std::vector<std::vector<int64_t>> seen(n);
  std::vector<int64_t> untilSet(streams, -1); // per side stream: positions given `until` so far
  SmallVector<Operation *, 4> defs;
  auto producersOf = [&](Value v) {
    SmallVector<int64_t, 4> at;
    defs.clear();
    producersThroughViews(v, defs);
    for (Operation *def : defs)
      if (auto it = position.find(def); it != position.end())
        at.push_back(it->second);
    return at;
  };
  auto eventAt = [&](int64_t d) {
    if (!o.event[d])
      o.event[d] = ++o.events;
    return o.event[d];
  };
  // Stream s waits for the event after position d (of stream t): it is now
  // ordered after d and after everything stream t was ordered after at d.
  auto orderAfter = [&](unsigned s, int64_t d) {
    const std::vector<int64_t> &then = seen[d];
    for (size_t u = 0; u < streams; ++u)
      ordered[s][u] = std::max(ordered[s][u], then[u]);
  };
  // The compute stream just became ordered after positions of side stream t
  // up to ordered[0][t]: those reuse-safe from position q on.
  auto settle = [&](int64_t q) {
    for (size_t t = 1; t < streams; ++t)
      for (int64_t p = untilSet[t] + 1; p <= ordered[0][t]; ++p)
        if (o.stream[p] == t && o.until[p] == static_cast<int64_t>(n))
          o.until[p] = q;
    for (size_t t = 1; t < streams; ++t)
      untilSet[t] = std::max(untilSet[t], ordered[0][t]);
  };
  for (size_t p = 0; p < n; ++p) {
    Operation *op = o.ops[p];
    const unsigned s = o.stream[p];
    if (isViewOp(op)) { // runs nowhere: no wait, no event, orders nothing
      seen[p] = ordered[s];
      o.after[p] = s == 0 ? static_cast<int64_t>(p) - 1 : ordered[s][0];
      if (s == 0)
        o.until[p] = static_cast<int64_t>(p);
      continue;
    }
    // The latest producer per other stream among the operands (of nested
    // regions too: a fusion's body reads only its operands).
    std::vector<int64_t> latest(streams, -1);
    for (Value v : op->getOperands())
      for (int64_t d : producersOf(v))
        if (o.stream[d] != s)
          latest[o.stream[d]] = std::max(latest[o.stream[d]], d);
    if (auto it = overwrites.find(op); it != overwrites.end())
      for (Operation *reader : it->second)
        if (auto r = position.find(reader); r != position.end() && r->second < int64_t(p) &&
                                            o.stream[r->second] != s)
          latest[o.stream[r->second]] = std::max(latest[o.stream[r->second]], r->second);
    for (size_t t = 0; t < streams; ++t)
      if (latest[t] > ordered[s][t]) {
        o.waits[p].push_back(eventAt(latest[t]));
        orderAfter(s, latest[t]);
      }
    ordered[s][s] = static_cast<int64_t>(p);
    seen[p] = ordered[s];
    o.after[p] = s == 0 ? static_cast<int64_t>(p) - 1 : ordered[s][0];
    if (s == 0) {
      o.until[p] = static_cast<int64_t>(p);
      settle(static_cast<int64_t>(p));
    }
  }
  // The end waits for every side stream's last op it is not ordered after.
  for (size_t t = 1; t < streams; ++t) {
    int64_t last = -1;
    for (size_t p = 0; p < n; ++p)
      if (o.stream[p] == t && !isViewOp(o.ops[p]))
        last = static_cast<int64_t>(p);
    if (last > ordered[0][t])
      o.joins.push_back(eventAt(last));
  }
  llvm::SmallDenseSet<unsigned, 4> sides;
  for (unsigned s : o.stream)
    if (s != 0)
      sides.insert(s);
  for (size_t p = 0; p < n; ++p) {
    const int64_t until = o.until[p];
    o.operandsUntil.push_back(o.stream[p] == 0 ? static_cast<int64_t>(p)
                              : until < static_cast<int64_t>(n) && sides.size() == 1 ? until - 1
                                                                                     : until);
  }
  return o;
}

void mlir::forge::writeStreamOrder(func::FuncOp func, const StreamOrder &o) {
  Builder b(func.getContext());
  for (size_t p = 0; p < o.ops.size(); ++p) {
    Operation *op = o.ops[p];
    op->removeAttr("forge.event");
    op->removeAttr("forge.waits");
    if (o.event[p])
      op->setAttr("forge.event", b.getI64IntegerAttr(o.event[p]));
    if (!o.waits[p].empty())
      op->setAttr("forge.waits", b.getDenseI64ArrayAttr(o.waits[p]));
    if (o.stream[p])
      op->setAttr("forge.stream", b.getI64IntegerAttr(o.stream[p]));
  }
  SmallVector<Attribute> names;
  for (const std::string &s : o.streams)
    names.push_back(b.getStringAttr(s));
  func->setAttr("forge.streams", b.getArrayAttr(names));
  func->setAttr("forge.events", b.getI64IntegerAttr(o.events));
  func->setAttr("forge.joins", b.getDenseI64ArrayAttr(o.joins));
}
