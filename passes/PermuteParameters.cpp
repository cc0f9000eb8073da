//===- PermuteParameters.cpp - parameters stored in their consumers' layout --===//
//
// forge-permute-parameters: a parameter that every routine reads through one
// transpose (a convolution weight after forge-assign-layout: [O, C, kh, kw]
// read as [O, kh, kw, C]) is stored in that layout instead, together with
// what the training step keeps of its shape: its gradient (which arrives
// through the inverse transpose: conv_grad_weight makes it channels-last),
// the optimizer's state and every pointwise value between them. The
// transposes at both ends go (ResNet-50 bf16: one per weight and one per
// weight gradient each step). The stored layout is the argument's
// `forge.layout_perm` (stored = transpose(canonical, perm)); the bundle
// carries it, and the runtime converts at its edges (initial values,
// checkpoints, export), so checkpoints stay in the ONNX layout.
//
// Invariants:
//  * A parameter is permuted in every routine or in none; so is each state
//    tensor its cluster reaches (by name). The cluster of a routine is the
//    connected set of values of the parameter's shape joined by pointwise
//    ops, with persistent arguments and `forge.updates` results; its edges
//    may only be rank-0 operands, transposes by perm (read from the
//    cluster) or by its inverse (into it), whole reductions (every axis: a
//    sum of squares does not see the order), --dp's all_reduce (element by
//    element), updates, and outputs of their
//    own (forgec --expose-gradients), which get a transpose back to stay
//    canonical. Anything else (a broadcast, a data input, a reshape, an
//    accumulation) leaves the parameter as it is.
//  * Values keep their element types; only shapes are permuted.
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSet.h"

namespace mlir::forge {
#define GEN_PASS_DEF_PERMUTEPARAMETERS
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

bool isPersistentArg(func::FuncOp f, unsigned i) {
  auto kind = f.getArgAttrOfType<StringAttr>(i, "forge.kind");
  return kind && (kind.getValue() == "parameter" || kind.getValue() == "state");
}

/// A reduction over every axis: the order of its input's elements is unseen.
bool isWholeReduction(Operation *op) {
  if (!isa<ReduceSumOp, ReduceMeanOp, ReduceMaxOp, ReduceMinOp>(op))
    return false;
  auto axes = op->getAttrOfType<DenseI64ArrayAttr>("axes");
  auto in = cast<RankedTensorType>(op->getOperand(0).getType());
  if (!axes || static_cast<int64_t>(axes.size()) != in.getRank())
    return false;
  SmallVector<int64_t> sorted(axes.asArrayRef());
  llvm::sort(sorted);
  for (auto [i, a] : llvm::enumerate(sorted))
    if (a != static_cast<int64_t>(i))
      return false;
  return true;
}

bool isPointwise(Operation *op) {
  auto iface = dyn_cast<ForgeOpInterface>(op);
  return iface && iface.getFusionClass() == FusionClass::Elementwise &&
         op->getNumResults() == 1 && op->getNumRegions() == 0 && !isa<TransposeOp>(op);
}

/// One routine's cluster of a parameter (see the file comment).
struct Cluster {
  llvm::SetVector<Value> values;               // every value to store permuted
  SmallVector<TransposeOp> into, outOf;        // inverse transposes in, transposes out
  llvm::SetVector<unsigned> args, results;     // the routine's argument and result numbers
  llvm::SetVector<unsigned> canonical;         // results that stay canonical (transposed back)
  std::string why;                             // set when the parameter cannot be permuted
};

Cluster clusterOf(func::FuncOp f, unsigned paramArg, ArrayRef<int64_t> perm) {
  Cluster c;
  auto shape = cast<RankedTensorType>(f.getArgument(paramArg).getType()).getShape();
  SmallVector<int64_t> inv = inversePermutation(perm);
  auto ret = cast<func::ReturnOp>(f.front().getTerminator());
  auto ofShape = [&](Value v) {
    auto t = dyn_cast<RankedTensorType>(v.getType());
    return t && t.getShape() == shape;
  };
  auto isScalar = [](Value v) {
    auto t = dyn_cast<RankedTensorType>(v.getType());
    return t && t.getRank() == 0;
  };
  SmallVector<Value> work{f.getArgument(paramArg)};
  c.values.insert(f.getArgument(paramArg));
  auto join = [&](Value v) {
    if (c.values.insert(v))
      work.push_back(v);
  };
  // A value of the cluster's shape reached from inside it: through what makes it.
  auto joinOperand = [&](Value v) -> bool {
    if (c.values.contains(v) || isScalar(v))
      return true;
    if (!ofShape(v)) {
      c.why = "an operand of another shape";
      return false;
    }
    if (auto arg = dyn_cast<BlockArgument>(v)) {
      if (!isPersistentArg(f, arg.getArgNumber())) {
        c.why = "a data input of its shape";
        return false;
      }
      join(v);
      return true;
    }
    Operation *def = v.getDefiningOp();
    if (auto t = dyn_cast<TransposeOp>(def)) {
      if (t.getPerm() != ArrayRef<int64_t>(inv)) {
        c.why = "a transpose of another order";
        return false;
      }
      c.into.push_back(t);
      join(v);
      return true;
    }
    if (!isPointwise(def) && !isa<AllReduceOp>(def)) {
      c.why = ("made by '" + def->getName().getStringRef() + "'").str();
      return false;
    }
    join(v);
    return true;
  };
  while (!work.empty() && c.why.empty()) {
    Value v = work.pop_back_val();
    if (auto arg = dyn_cast<BlockArgument>(v)) {
      c.args.insert(arg.getArgNumber());
    } else if (Operation *def = v.getDefiningOp(); def && isPointwise(def)) {
      for (Value operand : def->getOperands())
        if (!joinOperand(operand))
          break;
    } else if (auto ar = dyn_cast_or_null<AllReduceOp>(def)) { // result i: operand i's sum
      joinOperand(ar.getInputs()[cast<OpResult>(v).getResultNumber()]);
    }
    for (OpOperand &use : v.getUses()) {
      Operation *user = use.getOwner();
      if (auto t = dyn_cast<TransposeOp>(user)) {
        if (t.getPerm() != perm) {
          c.why = "read through another transpose";
          break;
        }
        if (!llvm::is_contained(c.outOf, t))
          c.outOf.push_back(t);
      } else if (user == ret) {
        auto updates = f.getResultAttrOfType<StringAttr>(use.getOperandNumber(), "forge.updates");
        if (updates)
          c.results.insert(use.getOperandNumber());
        else // an output of its own (forgec --expose-gradients): transposed back
          c.canonical.insert(use.getOperandNumber());
      } else if (auto ar = dyn_cast<AllReduceOp>(user)) {
        // --dp's gradient sum: element by element, in whatever order every rank stores.
        join(ar.getResult(use.getOperandNumber()));
      } else if (isWholeReduction(user)) {
        // Sums over every element (the gradient norm): unchanged.
      } else if (isPointwise(user) && ofShape(user->getResult(0))) {
        join(user->getResult(0));
      } else {
        c.why = ("read by '" + user->getName().getStringRef() + "'").str();
        break;
      }
    }
  }
  return c;
}

struct PermuteParametersPass
    : public mlir::forge::impl::PermuteParametersBase<PermuteParametersPass> {
  using PermuteParametersBase::PermuteParametersBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto funcs = llvm::to_vector(module.getOps<func::FuncOp>());
    auto argNamed = [](func::FuncOp f, StringRef name) -> std::optional<unsigned> {
      for (unsigned i = 0; i < f.getNumArguments(); ++i)
        if (auto n = f.getArgAttrOfType<StringAttr>(i, "forge.name"); n && n.getValue() == name)
          return i;
      return std::nullopt;
    };
    // Candidates: parameters of static rank >= 2 read through a transpose.
    llvm::SetVector<StringRef> names;
    for (func::FuncOp f : funcs)
      for (unsigned i = 0; i < f.getNumArguments(); ++i) {
        auto kind = f.getArgAttrOfType<StringAttr>(i, "forge.kind");
        auto name = f.getArgAttrOfType<StringAttr>(i, "forge.name");
        auto type = dyn_cast<RankedTensorType>(f.getArgument(i).getType());
        if (kind && kind.getValue() == "parameter" && name && type && type.hasStaticShape() &&
            type.getRank() >= 2 && !f.getArgAttr(i, "forge.shard") &&
            !f.getArgAttr(i, "forge.layout_perm") &&
            llvm::any_of(f.getArgument(i).getUsers(), [](Operation *u) { return isa<TransposeOp>(u); }))
          names.insert(name.getValue());
      }
    for (StringRef name : names) {
      // The order: that of the parameter's transposes, the same everywhere.
      std::optional<SmallVector<int64_t>> perm;
      bool mixed = false;
      for (func::FuncOp f : funcs)
        if (auto i = argNamed(f, name))
          for (Operation *u : f.getArgument(*i).getUsers())
            if (auto t = dyn_cast<TransposeOp>(u)) {
              if (perm && ArrayRef<int64_t>(*perm) != t.getPerm())
                mixed = true;
              perm = SmallVector<int64_t>(t.getPerm());
            }
      if (!perm)
        continue;
      if (mixed) {
        if (report)
          module.emitRemark() << "forge-permute-parameters: '" << name
                              << "' keeps its layout: read through transposes of different orders";
        continue;
      }
      // Every routine's cluster; the persistent names they reach must be
      // reached in every routine that has them.
      std::vector<std::pair<func::FuncOp, Cluster>> clusters;
      llvm::StringSet<> persistent;
      std::string why;
      for (func::FuncOp f : funcs) {
        auto i = argNamed(f, name);
        if (!i)
          continue;
        Cluster c = clusterOf(f, *i, *perm);
        if (!c.why.empty()) {
          why = c.why + " in @" + f.getSymName().str();
          break;
        }
        for (unsigned a : c.args)
          persistent.insert(f.getArgAttrOfType<StringAttr>(a, "forge.name").getValue());
        clusters.emplace_back(f, std::move(c));
      }
      for (auto &[f, c] : clusters) {
        if (!why.empty())
          break;
        for (unsigned a = 0; a < f.getNumArguments(); ++a) {
          auto n = f.getArgAttrOfType<StringAttr>(a, "forge.name");
          if (n && persistent.contains(n.getValue()) && !c.args.contains(a))
            why = ("'" + n.getValue() + "' is read otherwise in @" + f.getSymName()).str();
        }
        for (unsigned r : c.results) { // an update's target is in the cluster
          auto target = f.getResultAttrOfType<StringAttr>(r, "forge.updates");
          if (!persistent.contains(target.getValue()))
            why = ("'" + target.getValue() + "' is updated from it in @" + f.getSymName()).str();
        }
      }
      if (!why.empty()) {
        if (report)
          module.emitRemark() << "forge-permute-parameters: '" << name << "' keeps its layout: "
                              << why;
        continue;
      }
      for (auto &[f, c] : clusters)
        rewrite(f, c, *perm);
    }
  }

  void rewrite(func::FuncOp f, Cluster &c, ArrayRef<int64_t> perm) {
    OpBuilder b(f.getContext());
    for (Value v : c.values) {
      auto t = cast<RankedTensorType>(v.getType());
      v.setType(RankedTensorType::get(permutedShape(t.getShape(), perm), t.getElementType()));
    }
    for (TransposeOp t : c.into) { // transpose(y, inverse) is y stored permuted
      t.getResult().replaceAllUsesWith(t.getInput());
      t.erase();
    }
    for (TransposeOp t : c.outOf) {
      t.getResult().replaceAllUsesWith(t.getInput());
      t.erase();
    }
    for (unsigned a : c.args)
      f.setArgAttr(a, "forge.layout_perm", b.getDenseI64ArrayAttr(perm));
    auto ret = f.front().getTerminator();
    SmallVector<int64_t> inv = inversePermutation(perm);
    for (unsigned r : c.canonical) {
      Value v = ret->getOperand(r);
      auto t = cast<RankedTensorType>(v.getType());
      b.setInsertionPoint(ret);
      ret->setOperand(r, b.create<TransposeOp>(
                             ret->getLoc(),
                             RankedTensorType::get(permutedShape(t.getShape(), inv),
                                                   t.getElementType()),
                             v, b.getDenseI64ArrayAttr(inv)));
    }
    f.setFunctionType(
        b.getFunctionType(f.front().getArgumentTypes(), ret->getOperandTypes()));
  }
};

} // namespace

SmallVector<int64_t> mlir::forge::permutedShape(ArrayRef<int64_t> shape, ArrayRef<int64_t> perm) {
  SmallVector<int64_t> r;
  for (int64_t p : perm)
    r.push_back(shape[p]);
  return r;
}

SmallVector<int64_t> mlir::forge::inversePermutation(ArrayRef<int64_t> perm) {
  SmallVector<int64_t> inv(perm.size());
  for (auto [i, p] : llvm::enumerate(perm))
    inv[p] = static_cast<int64_t>(i);
  return inv;
}
