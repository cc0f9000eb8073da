//===- ShardTensorParallel.cpp - Megatron's column/row matmul splits ------===//
//
// Invariants: on every rank, the function computes the same values as
// before wherever it did not split (the sum over the group of the
// row-parallel partial products is the whole product); a split pair's
// hidden values are each rank's columns (an attention's: its heads) and are
// read by nothing outside the pair; every split initializer is read through exactly one forge.shard, the
// parameter forge-build-train-step makes of it. Every rank runs this same
// program, so all issue the same collectives in the same order. A
// vocabulary split (the cross-entropy loss's logits output) leaves that
// output holding this rank's classes, marked forge.shard on the result, and
// every forward gather of the split embedding summed over the group.
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "forge/Dialect/ForgeBuilder.h"
#include "forge/Train/TrainGraph.h"
#include "mlir/IR/Builders.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "llvm/ADT/SmallPtrSet.h"

namespace mlir::forge {
#define GEN_PASS_DEF_SHARDTENSORPARALLEL
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

constexpr StringLiteral kGroup = "tp";

/// Whether `use` is a row lookup in the initializer: an embedding's
/// forge.gather along axis 0 reading it as the table.
bool isRowLookup(OpOperand &use) {
  auto g = dyn_cast<GatherOp>(use.getOwner());
  return g && use.getOperandNumber() == 0 && g.getAxis() == 0;
}

/// An initializer read by `user` alone (a weight nothing else shares); with
/// `lookups`, also by row lookups (a language model's tied embedding).
ConstantOp ownInitializer(Value v, bool lookups = false) {
  auto c = v.getDefiningOp<ConstantOp>();
  if (!c || !c->hasAttr("forge.initializer") ||
      !isa<FloatType>(cast<RankedTensorType>(c.getType()).getElementType()))
    return {};
  int64_t others = 0;
  for (OpOperand &use : c->getUses())
    others += !(lookups && isRowLookup(use));
  return others == 1 ? c : ConstantOp();
}

/// One matmul or gemm of a pair: its activation operand, weight initializer
/// and (gemm) bias, and whether the weight is stored transposed: by the op's
/// transB, or by a transpose of the initializer that only the op reads
/// (PyTorch's Linear imported as MatMul(x, Transpose(W))).
struct Product {
  Operation *op = nullptr;
  Value input;
  ConstantOp weight;
  TransposeOp transpose; // between the weight and the op, or null
  Value bias;            // gemm's C, else null
  bool transB = false;   // the initializer is [out, in]
};

/// `rhs` as an initializer, seeing through a 2-D transpose only `p`'s op reads.
void takeWeight(Product &p, Value rhs, bool lookups) {
  if (auto t = rhs.getDefiningOp<TransposeOp>();
      t && t->hasOneUse() && t.getPerm() == ArrayRef<int64_t>{1, 0}) {
    p.transpose = t;
    p.transB = !p.transB;
    rhs = t.getInput();
  }
  p.weight = ownInitializer(rhs, lookups);
}

/// Points `p`'s op (or its transpose) at `sliced`, the weight's slice.
void setWeight(Product &p, Value sliced) {
  if (!p.transpose) {
    p.op->setOperand(1, sliced);
    return;
  }
  p.transpose->setOperand(0, sliced);
  auto t = cast<RankedTensorType>(sliced.getType());
  p.transpose.getResult().setType(
      RankedTensorType::get({t.getDimSize(1), t.getDimSize(0)}, t.getElementType()));
}

/// `op` as a product of an activation and a 2-D weight initializer; `why`
/// says what is missing when it is not one. With `lookups`, row lookups may
/// share the weight (a tied embedding).
std::optional<Product> asProduct(Operation *op, std::string &why, bool lookups = false) {
  Product p;
  p.op = op;
  if (auto m = dyn_cast<MatMulOp>(op)) {
    p.input = m.getLhs();
    p.transB = m.getTransB();
    takeWeight(p, m.getRhs(), lookups);
    if (m.getTransA()) {
      why = "its activation is transposed";
      return std::nullopt;
    }
  } else if (auto g = dyn_cast<GemmOp>(op)) {
    p.input = g.getA();
    p.bias = g.getC();
    p.transB = g.getTransB();
    takeWeight(p, g.getB(), lookups);
    if (g.getTransA() || g.getAlpha().convertToDouble() != 1.0 ||
        (p.bias && g.getBeta().convertToDouble() != 1.0)) {
      why = "it is a gemm with a transposed A or alpha/beta other than 1";
      return std::nullopt;
    }
  } else {
    return std::nullopt;
  }
  if (!p.weight || cast<RankedTensorType>(p.weight.getType()).getRank() != 2) {
    why = "its weight is no 2-D initializer of its own";
    return std::nullopt;
  }
  return p;
}

/// `b` as a bias row of `width` (an initializer of its own holding `width`
/// elements along its last dim), or null.
ConstantOp biasRow(Value b, int64_t width) {
  ConstantOp c = ownInitializer(b);
  auto t = cast<RankedTensorType>(b.getType());
  return c && t.getRank() >= 1 && t.getShape().back() == width && t.getNumElements() == width
             ? c
             : ConstantOp();
}

RankedTensorType splitType(Type type, int64_t axis, int64_t parts) {
  auto t = cast<RankedTensorType>(type);
  SmallVector<int64_t> shape(t.getShape());
  shape[axis] /= parts;
  return RankedTensorType::get(shape, t.getElementType());
}

/// Whether `v` broadcasts against anything without a dim of its own (a scalar
/// operand of a pointwise op in the hidden chain: a GELU's constants).
bool isScalarLike(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.hasStaticShape() && t.getNumElements() == 1;
}

struct ShardTensorParallelPass
    : public mlir::forge::impl::ShardTensorParallelBase<ShardTensorParallelPass> {
  using ShardTensorParallelBase::ShardTensorParallelBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (size < 1) {
      func.emitError() << "forge-shard-tensor-parallel: size " << int64_t(size) << " is not positive";
      return signalPassFailure();
    }
    if (size == 1)
      return;
    SmallVector<Operation *> candidates;
    func.walk([&](Operation *op) {
      if (isa<MatMulOp, GemmOp>(op))
        candidates.push_back(op);
    });
    llvm::SmallPtrSet<Operation *, 16> used;
    int splits = 0;
    for (Operation *op : candidates) {
      if (used.contains(op))
        continue;
      std::string why;
      std::optional<Product> first = asProduct(op, why);
      if (!first)
        continue; // not a layer with a weight of its own: nothing to split
      if (trySplit(*first, used, why) ||
          (why.empty() && trySplitAttention(*first, used, why)))
        ++splits;
      else if (!why.empty())
        op->emitRemark() << "forge-shard-tensor-parallel: not split over " << int64_t(size)
                         << " ranks: " << why;
    }
    // The loss head after the pairs: a classifier's last layer that a pair
    // already split by rows stays so.
    if (splitVocabulary(func, used))
      ++splits;
    if (splits == 0) {
      func.emitError() << "--tp " << int64_t(size)
                       << ": no pair of matmuls to split (a matmul/gemm with a weight "
                          "initializer, pointwise ops, then another such matmul reading them)";
      return signalPassFailure();
    }
  }

  /// Megatron's vocabulary parallelism, for the logits output that a
  /// cross-entropy `loss` reads: its matmul split by columns (classes; each
  /// rank computes its [V / size] of every row, the logits never whole), the
  /// result marked forge.shard {axis, group, size} for forge-build-train-step's
  /// sharded loss. A tied embedding (the weight also read by row lookups)
  /// splits with it by rows: each rank looks up the ids in its rows, zeroes
  /// the others and the group sums (forge.all_reduce). Returns whether it split;
  /// a remark says why an output that qualifies otherwise is left whole.
  bool splitVocabulary(func::FuncOp func, llvm::SmallPtrSetImpl<Operation *> &used) {
    std::string error;
    FailureOr<LossSpec> spec = parseLossSpec(loss, error);
    if (loss.empty() || failed(spec) || spec->kind != "cross_entropy" || spec->probs)
      return false; // BuildTrainStep reports a bad spec; probabilities: whole classes
    auto ret = cast<func::ReturnOp>(func.getBody().front().getTerminator());
    int64_t index = -1;
    for (unsigned i = 0; i < func.getNumResults(); ++i)
      if (auto name = func.getResultAttrOfType<StringAttr>(i, "forge.name");
          name && name.getValue() == spec->output)
        index = i;
    if (index < 0)
      return false;
    Value logits = ret.getOperand(index);
    Operation *op = logits.getDefiningOp();
    if (!op || !isa<MatMulOp, GemmOp>(op) || used.contains(op))
      return false; // not a linear head, or split as a pair's second layer
    auto remark = [&](const Twine &why) {
      op->emitRemark() << "forge-shard-tensor-parallel: the vocabulary of '" << spec->output
                       << "' is not split over " << int64_t(size) << " ranks: " << why;
      return false;
    };
    std::string why;
    std::optional<Product> head = asProduct(op, why, /*lookups=*/true);
    if (!head)
      return remark(why.empty() ? "its weight is no initializer of its own" : why);
    auto type = cast<RankedTensorType>(logits.getType());
    const int64_t classes = type.getShape().back(), axis = head->transB ? 0 : 1;
    if (!logits.hasOneUse())
      return remark("the logits have readers besides the return");
    if (classes % size != 0)
      return remark(Twine(classes) + " classes do not divide by " + Twine(int64_t(size)));
    SmallVector<GatherOp> lookups;
    for (OpOperand &use : head->weight->getUses())
      if (isRowLookup(use))
        lookups.push_back(cast<GatherOp>(use.getOwner()));
    if (!lookups.empty() && axis != 0)
      return remark("its weight is [hidden, classes] but row lookups read it as [classes, "
                    "hidden]");
    ConstantOp bias;
    if (head->bias && !(bias = biasRow(head->bias, classes)))
      return remark("its bias is no row initializer of its own");

    splitFirst(*head, bias, /*blocks=*/1);
    used.insert(op);
    SmallVector<Type> results(func.getResultTypes());
    results[index] = logits.getType();
    func.setFunctionType(FunctionType::get(&getContext(), func.getArgumentTypes(), results));
    Builder attrs(&getContext());
    func.setResultAttr(index, "forge.shard",
                       shardSpec(attrs, type.getRank() - 1, kGroup, size));
    if (lookups.empty())
      return true;
    // The shard splitFirst made (the op's weight, or its transpose's input).
    Value shard = head->transpose ? head->transpose.getInput() : op->getOperand(1);
    const int64_t rows = classes / size;
    for (GatherOp g : lookups) {
      OpBuilder b(g);
      ForgeBuilder fb(b, g.getLoc());
      Value ids = fb.castTo(g.getIndices(), b.getI64Type());
      Value local = fb.sub(ids, fb.rankOffset(kGroup, size, rows));
      Value mine = fb.inRange(local, rows);
      Value rowsOf =
          b.create<GatherOp>(g.getLoc(), shard, fb.where(mine, local, fb.intScalar(0)),
                             g.getAxisAttr())
              .getResult();
      SmallVector<int64_t> maskShape(cast<RankedTensorType>(mine.getType()).getShape());
      maskShape.push_back(1);
      Value kept = fb.where(fb.reshape(mine, maskShape), rowsOf,
                            fb.scalar(0.0, ForgeBuilder::elementOf(rowsOf)));
      auto sum = b.create<AllReduceOp>(g.getLoc(), TypeRange{g.getType()}, ValueRange{kept}, kGroup,
                                       "sum", size);
      g.getResult().replaceAllUsesWith(sum.getResult(0));
      g.erase();
    }
    return true;
  }

  /// `c`'s slice along `axis` (`blocks` blocks, each split over the group).
  Value shardOf(ConstantOp c, int64_t axis, int64_t blocks) {
    OpBuilder b(c->getContext());
    b.setInsertionPointAfter(c);
    auto t = cast<RankedTensorType>(c.getType());
    return b.create<ShardOp>(c.getLoc(), splitType(t, axis, size), c.getResult(),
                             b.getI64IntegerAttr(axis), b.getStringAttr(kGroup),
                             b.getI64IntegerAttr(size), b.getI64IntegerAttr(blocks))
        .getResult();
  }

  /// The column-parallel side: forge.enter_group on the input (Megatron's f),
  /// the weight by output columns and a gemm's bias with it. Returns the bias's
  /// slice (null without a bias) for a matmul's separate bias add to read.
  Value splitFirst(const Product &first, ConstantOp bias, int64_t blocks) {
    OpBuilder b(first.op);
    Value input = b.create<EnterGroupOp>(first.op->getLoc(), first.input.getType(), first.input,
                                         b.getStringAttr(kGroup), b.getI64IntegerAttr(size));
    first.op->setOperand(0, input);
    Product p = first;
    setWeight(p, shardOf(first.weight, first.transB ? 0 : 1, blocks));
    Value sliced;
    if (bias) {
      sliced = shardOf(bias, cast<RankedTensorType>(bias.getType()).getRank() - 1, blocks);
      if (first.bias)
        first.op->setOperand(2, sliced);
    }
    auto t = cast<RankedTensorType>(first.op->getResult(0).getType());
    first.op->getResult(0).setType(splitType(t, t.getRank() - 1, size));
    return sliced;
  }

  /// The row-parallel side: the weight by input rows, the partial products
  /// added over the ranks (Megatron's g), a gemm's bias after the sum, once.
  /// Returns the product op (a new gemm when the bias moved).
  Operation *splitSecond(Product &second, int64_t rowAxis) {
    Operation *product = second.op;
    setWeight(second, shardOf(second.weight, rowAxis, 1));
    OpBuilder b(product->getContext());
    b.setInsertionPointAfter(product);
    Value partial = product->getResult(0);
    if (auto g = dyn_cast<GemmOp>(product); g && g.getC()) {
      auto plain = b.create<GemmOp>(g.getLoc(), g.getType(), g.getA(), g.getB(), Value(),
                                    g.getTransAAttr(), g.getTransBAttr(), g.getAlphaAttr(),
                                    g.getBetaAttr());
      auto sum = b.create<AllReduceOp>(g.getLoc(), TypeRange{g.getType()},
                                       ValueRange{plain.getResult()}, kGroup, "sum", size);
      auto add = b.create<AddOp>(g.getLoc(), sum.getResult(0), g.getC());
      g.getResult().replaceAllUsesWith(add.getResult());
      g.erase();
      return plain;
    }
    auto sum = b.create<AllReduceOp>(product->getLoc(), TypeRange{partial.getType()},
                                     ValueRange{partial}, kGroup, "sum", size);
    partial.replaceAllUsesExcept(sum.getResult(0), sum);
    return product;
  }

  /// Splits the pair that starts at `first` when it is one; else `why`.
  bool trySplit(const Product &first, llvm::SmallPtrSetImpl<Operation *> &used,
                std::string &why) {
    Value hidden = first.op->getResult(0);
    auto hiddenType = cast<RankedTensorType>(hidden.getType());
    const int64_t width = hiddenType.getShape().back();
    // The hidden chain: a bias row (a matmul's), then pointwise ops, each the
    // only reader of the value before it.
    ConstantOp bias;
    SmallVector<Operation *> chain;
    Value v = hidden;
    if (first.bias && !(bias = biasRow(first.bias, width))) {
      why = "its bias is no row initializer of its own";
      return false;
    }
    std::optional<Product> second;
    while (!second) {
      if (!v.hasOneUse()) {
        why = "its hidden value has " + std::to_string(std::distance(v.use_begin(), v.use_end())) +
              " readers";
        return false;
      }
      Operation *user = *v.user_begin();
      if (isa<MatMulOp, GemmOp>(user) && user->getOperand(0) == v) {
        std::string secondWhy;
        second = asProduct(user, secondWhy);
        if (!second) {
          why = "the matmul after it: " + (secondWhy.empty() ? std::string("no weight") : secondWhy);
          return false;
        }
        break;
      }
      if (auto add = dyn_cast<AddOp>(user); add && !first.bias && !bias && chain.empty() &&
                                             v == hidden) {
        Value other = add.getLhs() == v ? add.getRhs() : add.getLhs();
        if (ConstantOp c = biasRow(other, width); c && add.getType() == hiddenType) {
          bias = c;
          chain.push_back(add);
          v = add.getResult();
          continue;
        }
      }
      auto iface = dyn_cast<ForgeOpInterface>(user);
      bool pointwise = iface && iface.getFusionClass() == FusionClass::Elementwise &&
                       user->getNumResults() == 1 &&
                       cast<RankedTensorType>(user->getResult(0).getType()).getShape() ==
                           hiddenType.getShape() &&
                       llvm::all_of(user->getOperands(),
                                    [&](Value o) { return o == v || isScalarLike(o); });
      if (!pointwise) // not a pair (a model's last layer, say): nothing to remark
        return false;
      chain.push_back(user);
      v = user->getResult(0);
    }
    if (width % size != 0) {
      why = "its hidden width " + std::to_string(width) + " does not divide by " +
            std::to_string(size);
      return false;
    }
    const int64_t rowAxis = second->transB ? 1 : 0;
    if (cast<RankedTensorType>(second->weight.getType()).getDimSize(rowAxis) != width) {
      why = "the second weight's rows are not the hidden width";
      return false;
    }

    // Megatron's f on the input, the first weight (and bias) by columns.
    Value sliced = splitFirst(first, bias, /*blocks=*/1);
    if (bias && !first.bias)
      chain.front()->setOperand(chain.front()->getOperand(0) == hidden ? 1 : 0, sliced);
    // The hidden values after it: this rank's columns too.
    for (Operation *op : chain)
      op->getResult(0).setType(splitType(op->getResult(0).getType(), hiddenType.getRank() - 1,
                                         size));
    // Marked before the split: splitSecond may erase it (a gemm whose bias moves), and the
    // pass's list of candidates still holds it.
    used.insert(second->op);
    Operation *product = splitSecond(*second, rowAxis);
    used.insert(first.op);
    used.insert(product);
    return true;
  }

  /// Self-attention by heads (Megatron): a fused q/k/v projection (its
  /// weight and bias by the columns of this rank's heads in each of q, k and
  /// v: three blocks), the split into q, k, v, each reshaped to [.., heads,
  /// head size] for an attention of layout bshd, transposes, the reshape back,
  /// and the output projection by the rows of those heads.
  bool trySplitAttention(const Product &first, llvm::SmallPtrSetImpl<Operation *> &used,
                         std::string &why) {
    Value v = first.op->getResult(0);
    auto type = cast<RankedTensorType>(v.getType());
    const int64_t rank = type.getRank(), width = type.getShape().back();
    if (width % 3 != 0)
      return false;
    const int64_t d = width / 3;
    ConstantOp bias;
    AddOp biasAdd;
    if (first.bias && !(bias = biasRow(first.bias, width)))
      return false;
    if (!first.bias && v.hasOneUse())
      if (auto add = dyn_cast<AddOp>(*v.user_begin()); add && add.getType() == type)
        if ((bias = biasRow(add.getLhs() == v ? add.getRhs() : add.getLhs(), width))) {
          biasAdd = add;
          v = add.getResult();
        }
    if (!v.hasOneUse())
      return false;
    auto split = dyn_cast<SplitOp>(*v.user_begin());
    if (!split || static_cast<int64_t>(split.getAxis()) != rank - 1 ||
        split.getSizes() != ArrayRef<int64_t>{d, d, d})
      return false;
    SmallVector<ReshapeOp, 3> heads;
    AttentionOp attention;
    for (auto [i, part] : llvm::enumerate(split.getResults())) {
      auto r = part.hasOneUse() ? dyn_cast<ReshapeOp>(*part.user_begin()) : ReshapeOp();
      if (!r || !r.getResult().hasOneUse())
        return false;
      auto a = dyn_cast<AttentionOp>(*r.getResult().user_begin());
      ArrayRef<int64_t> shape = r.getShape();
      if (!a || (attention && a != attention) || a->getOperand(i) != r.getResult() ||
          static_cast<int64_t>(shape.size()) != rank + 1 ||
          shape[rank - 1] * shape[rank] != d || (!heads.empty() &&
                                                 heads.front().getShape() != shape))
        return false;
      attention = a;
      heads.push_back(r);
    }
    if (attention.getLayout() != "bshd" || attention.getBias() || !attention.getLse().use_empty())
      return false;
    const int64_t numHeads = heads.front().getShape()[rank - 1];
    if (numHeads % size != 0) {
      why = "its " + std::to_string(numHeads) + " attention heads do not divide by " +
            std::to_string(size);
      return false;
    }
    // After the attention: transposes, then the reshape back to [.., d].
    SmallVector<Operation *> after;
    Value o = attention.getO();
    ReshapeOp back;
    while (!back) {
      if (!o.hasOneUse())
        return false;
      Operation *user = *o.user_begin();
      if (auto t = dyn_cast<TransposeOp>(user)) {
        after.push_back(t);
        o = t.getResult();
        continue;
      }
      back = dyn_cast<ReshapeOp>(user);
      if (!back || back.getShape().size() != static_cast<size_t>(rank) ||
          back.getShape().back() != d || !back.getResult().hasOneUse())
        return false;
    }
    Operation *user = *back.getResult().user_begin();
    std::string secondWhy;
    std::optional<Product> second =
        isa<MatMulOp, GemmOp>(user) && user->getOperand(0) == back.getResult()
            ? asProduct(user, secondWhy)
            : std::nullopt;
    const int64_t rowAxis = second && second->transB ? 1 : 0;
    if (!second || cast<RankedTensorType>(second->weight.getType()).getDimSize(rowAxis) != d)
      return false;

    // The q/k/v projection by this rank's heads of each of q, k and v.
    Value sliced = splitFirst(first, bias, /*blocks=*/3);
    if (biasAdd) {
      biasAdd->setOperand(biasAdd.getLhs() == first.op->getResult(0) ? 1 : 0, sliced);
      biasAdd.getResult().setType(cast<RankedTensorType>(first.op->getResult(0).getType()));
    }
    SmallVector<int64_t> parts(3, d / size);
    split.setSizes(parts);
    for (Value part : split.getResults())
      part.setType(splitType(part.getType(), rank - 1, size));
    for (ReshapeOp r : heads) {
      SmallVector<int64_t> shape(r.getShape());
      shape[rank - 1] /= size;
      r.setShape(shape);
      r.getResult().setType(RankedTensorType::get(shape, type.getElementType()));
    }
    if (failed(reinfer(attention)))
      return false;
    for (Operation *t : after)
      if (failed(reinfer(t)))
        return false;
    SmallVector<int64_t> shape(back.getShape());
    shape.back() /= size;
    back.setShape(shape);
    back.getResult().setType(splitType(back.getResult().getType(), rank - 1, size));
    // Marked before the split: splitSecond may erase it (a gemm whose bias moves), and the
    // pass's list of candidates still holds it.
    used.insert(second->op);
    Operation *product = splitSecond(*second, rowAxis);
    used.insert(first.op);
    used.insert(product);
    return true;
  }

  /// Sets `op`'s result types to what its type inference says of its operands.
  static LogicalResult reinfer(Operation *op) {
    auto iface = dyn_cast<InferTypeOpInterface>(op);
    SmallVector<Type> types;
    if (!iface ||
        failed(iface.inferReturnTypes(op->getContext(), op->getLoc(), op->getOperands(),
                                      op->getRawDictionaryAttrs(), op->getPropertiesStorage(),
                                      op->getRegions(), types)) ||
        types.size() != op->getNumResults())
      return failure();
    for (auto [r, t] : llvm::zip(op->getResults(), types))
      r.setType(t);
    return success();
  }
};

} // namespace
