//===- AssignPipelineStages.cpp - cost-balanced pipeline stages ------------===//
//
// Invariants: every op of @main but the constants gets `forge.stage` in
// [0, stages); stages are contiguous runs of program order and never
// decrease along it (but for ops of initializers alone, which take their
// first reader's stage), so every value flows to its own stage or a later
// one; every stage gets at least one op. Nothing else changes.
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/Support/Format.h"

namespace mlir::forge {
#define GEN_PASS_DEF_ASSIGNPIPELINESTAGES
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

struct AssignPipelineStagesPass
    : public mlir::forge::impl::AssignPipelineStagesBase<AssignPipelineStagesPass> {
  using AssignPipelineStagesBase::AssignPipelineStagesBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (func.getSymName() != "main" || !func.getBody().hasOneBlock()) {
      markAllAnalysesPreserved();
      return;
    }
    if (stages < 1) {
      func.emitError() << "forge-assign-pipeline-stages: stages must be >= 1, got "
                       << static_cast<int64_t>(stages);
      return signalPassFailure();
    }
    SmallVector<Operation *> ops;
    SmallVector<double> cost;
    double total = 0;
    for (Operation &op : func.getBody().front().without_terminator()) {
      if (isa<ConstantOp>(op))
        continue;
      OpCost c;
      if (auto iface = dyn_cast<ForgeOpInterface>(op))
        c = iface.getCost();
      // FLOPs and bytes both: a GEMM's cost is its FLOPs, a norm's or a
      // softmax's its memory traffic; one unit each keeps small ops nonzero.
      const double v = static_cast<double>(std::max<int64_t>(c.flops, 0)) +
                       static_cast<double>(std::max<int64_t>(c.bytes, 0)) + 1.0;
      ops.push_back(&op);
      cost.push_back(v);
      total += v;
    }
    if (static_cast<int64_t>(ops.size()) < stages) {
      func.emitError() << "--pp " << static_cast<int64_t>(stages) << ": the forward graph has "
                       << ops.size()
                       << " op(s), fewer than the stages to cut it into";
      return signalPassFailure();
    }
    // Op i goes to the stage its cost midpoint falls in; then every stage is
    // made nonempty by moving boundaries (a run of one huge op can swallow
    // its neighbours' shares).
    SmallVector<int64_t> stage(ops.size());
    double before = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      const double mid = before + cost[i] / 2;
      stage[i] = std::min<int64_t>(stages - 1, static_cast<int64_t>(mid / total * stages));
      before += cost[i];
    }
    // Stage s starts at first[s]; force first[s] >= first[s-1] + 1 and leave
    // room for the stages after it.
    SmallVector<size_t> first(stages, 0);
    for (int64_t s = 0; s < stages; ++s) {
      size_t f = ops.size();
      for (size_t i = 0; i < ops.size(); ++i)
        if (stage[i] >= s) {
          f = i;
          break;
        }
      first[s] = f;
    }
    first[0] = 0;
    for (int64_t s = 1; s < stages; ++s)
      first[s] = std::max(first[s], first[s - 1] + 1);
    for (int64_t s = stages - 1; s >= 1; --s)
      first[s] = std::min(first[s], ops.size() - static_cast<size_t>(stages - s));
    for (int64_t s = 1; s < stages; ++s)
      first[s] = std::max(first[s], first[s - 1] + 1);

    Builder b(&getContext());
    SmallVector<double> share(stages, 0);
    SmallVector<size_t> count(stages, 0);
    for (size_t i = 0, s = 0; i < ops.size(); ++i) {
      while (s + 1 < static_cast<size_t>(stages) && i >= first[s + 1])
        ++s;
      ops[i]->setAttr("forge.stage", b.getI64IntegerAttr(static_cast<int64_t>(s)));
      share[s] += cost[i];
      ++count[s];
    }
    // An op of initializers alone (PyTorch's Linear exports a weight's
    // transpose; a tied weight's) runs where its first reader does: else the
    // weight would live on an earlier stage and cross to its reader every step.
    llvm::DenseSet<Operation *> weightOnly;
    for (Operation *op : ops)
      if (llvm::all_of(op->getOperands(), [&](Value v) {
            Operation *def = v.getDefiningOp();
            return def && (isa<ConstantOp>(def) || weightOnly.contains(def));
          }))
        weightOnly.insert(op);
    for (Operation *op : llvm::reverse(ops)) {
      if (!weightOnly.contains(op))
        continue;
      std::optional<int64_t> first;
      for (Operation *user : op->getUsers())
        if (auto a = user->getAttrOfType<IntegerAttr>("forge.stage"))
          first = first ? std::min(*first, a.getInt()) : a.getInt();
      if (first)
        op->setAttr("forge.stage", b.getI64IntegerAttr(*first));
    }

    std::string text;
    llvm::raw_string_ostream os(text);
    os << "forge-assign-pipeline-stages: " << static_cast<int64_t>(stages) << " stages:";
    for (int64_t s = 0; s < stages; ++s)
      os << (s ? ";" : "") << " stage " << s << " " << count[s] << " ops, "
         << llvm::format("%.1f", 100.0 * share[s] / total) << "% of the forward's cost";
    func.emitRemark() << text;
  }
};

} // namespace
