//===- CollectiveGradients.cpp - rules of tensor parallelism's collectives ===//
//
// Megatron's pair (forge-shard-tensor-parallel): where a replicated value
// enters a column-parallel matmul (forge.enter_group, the identity), every
// rank's gradient is a part of the whole, so the rule sums them over the
// group; where the row-parallel matmul's partial products are summed
// (forge.all_reduce, "sum"), every rank holds the same cotangent of the sum,
// which is each partial product's gradient. The vocabulary-parallel loss
// gathers every rank's log-sum-exp (forge.all_gather) and computes on the
// whole replicated: rank r's gradient is part r of the cotangent. The
// data-parallel mean and ZeRO-1's collectives are made after differentiation
// and have no rule.
//
//===----------------------------------------------------------------------===//
#include "RuleUtils.h"

using namespace mlir;
using namespace mlir::forge;
using namespace mlir::forge::autodiff;

FORGE_GRADIENT(EnterGroupOp) {
  Value g = resultGrads[0];
  auto sum = builder.create<AllReduceOp>(getLoc(), TypeRange{g.getType()}, ValueRange{g},
                                         getGroup(), "sum", getSize());
  operandGrads.push_back(sum.getResult(0));
  return success();
}

FORGE_GRADIENT(AllReduceOp) {
  if (getReduction() != "sum")
    return emitOpError() << "has no gradient rule for reduction '" << getReduction()
                         << "' (only the tensor-parallel sum is differentiated)";
  for (Value g : resultGrads)
    operandGrads.push_back(g);
  return success();
}

FORGE_GRADIENT(AllGatherOp) {
  auto part = builder.create<RankSliceOp>(getLoc(), getInput().getType(), resultGrads[0],
                                          getGroup(), getSize());
  operandGrads.push_back(part.getResult());
  return success();
}
