//===- Partition.cpp - data parallelism: the gradient all-reduce in buckets ===//
//
// Invariants: every forge.all_reduce result keeps its value (each operand
// is averaged over the same group, only in another op); the buckets of one
// op partition its operands, are ordered by where their last operand is
// made, and each sits right after that op, before any reader of its
// results (those read the original op's results, which came later). The
// buckets' order depends on the program only, so every rank, running the
// same program, issues the same collectives in the same order.
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "forge/Conversion/Conversion.h"
#include "forge/runtime/Bundle.h"

#include "mlir/IR/Builders.h"

#include <algorithm>

namespace mlir::forge {
#define GEN_PASS_DEF_PARTITION
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

int64_t bytesOf(Type type) {
  auto t = cast<RankedTensorType>(type);
  return t.getNumElements() *
         static_cast<int64_t>(::forge::rt::dtypeSize(dtypeFromType(t.getElementType())));
}

struct PartitionPass : public mlir::forge::impl::PartitionBase<PartitionPass> {
  using PartitionBase::PartitionBase;

  void runOnOperation() override {
    if (bucketBytes < 0) {
      getOperation().emitError() << "forge-partition: bucket-bytes " << bucketBytes
                                 << " is negative";
      return signalPassFailure();
    }
    SmallVector<AllReduceOp> ops;
    getOperation().walk([&](AllReduceOp op) {
      if (op.getGroup() == "dp") // tensor parallelism's sums are each in place already
        ops.push_back(op);
    });
    for (AllReduceOp op : ops)
      split(op);
    // ZeRO-1: each gradient's reduce-scatter right after the gradient is made
    // (one tensor each: a reduce-scatter has no buckets), so it overlaps the
    // rest of the backward pass as the all-reduce buckets do. Their order
    // follows the program's, the same on every rank.
    SmallVector<ReduceScatterOp> scatters;
    getOperation().walk([&](ReduceScatterOp op) {
      if (op.getGroup() == "dp")
        scatters.push_back(op);
    });
    for (ReduceScatterOp op : scatters) {
      Operation *def = op.getInput().getDefiningOp();
      while (def && def->getBlock() != op->getBlock())
        def = def->getParentOp();
      if (def && def->isBeforeInBlock(op))
        op->moveAfter(def);
    }
  }

  void split(AllReduceOp op) {
    Block *block = op->getBlock();
    // Where each operand is made: its op's position in the block (-1: an argument).
    DenseMap<Operation *, int64_t> position;
    int64_t n = 0;
    for (Operation &o : *block)
      position[&o] = n++;
    auto madeAt = [&](Value v) -> int64_t {
      Operation *def = v.getDefiningOp();
      if (!def)
        return -1;
      while (def->getBlock() != block) // not expected: the step is one block
        def = def->getParentOp();
      return position.lookup(def);
    };
    SmallVector<unsigned> order(op.getInputs().size());
    for (unsigned i = 0; i < order.size(); ++i)
      order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](unsigned a, unsigned b) {
      return madeAt(op.getInputs()[a]) < madeAt(op.getInputs()[b]);
    });
    SmallVector<SmallVector<unsigned>> buckets;
    int64_t filled = 0;
    for (unsigned i : order) {
      int64_t bytes = bytesOf(op.getInputs()[i].getType());
      if (buckets.empty() || bucketBytes == 0 || filled + bytes > bucketBytes) {
        buckets.emplace_back();
        filled = 0;
      }
      buckets.back().push_back(i);
      filled += bytes;
    }
    if (buckets.size() <= 1 && madeAt(op.getInputs()[order.back()]) + 1 ==
                                   position.lookup(op.getOperation()))
      return; // already one bucket right after its last operand
    OpBuilder b(op);
    SmallVector<Value> replacement(op.getNumResults());
    AllReduceOp previous;
    int64_t previousAt = -2;
    for (const SmallVector<unsigned> &bucket : buckets) {
      SmallVector<Value> inputs;
      for (unsigned i : bucket)
        inputs.push_back(op.getInputs()[i]);
      const int64_t at = madeAt(inputs.back());
      if (previous && at == previousAt) {
        b.setInsertionPointAfter(previous); // two buckets end at one op: keep their order
      } else if (Operation *def = inputs.back().getDefiningOp()) {
        while (def->getBlock() != block)
          def = def->getParentOp();
        b.setInsertionPointAfter(def);
      } else {
        b.setInsertionPointToStart(block);
      }
      previous = b.create<AllReduceOp>(op.getLoc(), ValueRange(inputs).getTypes(), inputs,
                                       op.getGroup(), op.getReduction(), op.getSize());
      previousAt = at;
      for (auto [k, i] : llvm::enumerate(bucket))
        replacement[i] = previous.getResult(k);
    }
    op.replaceAllUsesWith(replacement);
    op.erase();
  }
};

} // namespace
