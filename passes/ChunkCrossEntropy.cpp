//===- ChunkCrossEntropy.cpp - a language model's loss head in row chunks -===//
//
// A language model's loss head makes the training step's largest tensors:
// GPT-2's logits (B*T x 50264 f32, 3.1 GiB at B16) and their gradient (bf16,
// 1.5 GiB) are live together at the cross-entropy gradient, the step's
// memory peak. The head's rows are independent (row r's logits, loss and
// logit gradient depend on row r of the hidden state alone) and the
// weight's gradient is a sum over rows, so the head runs in chunks of rows,
// each chunk's logits and gradient dead before the next chunk's are made:
//
//   for each chunk c of rows:            h_c, target_c = rows of h, target
//     logits_c = h_c W^T;                (loss_c, lse_c) = cross_entropy(...)
//     d_c = cross_entropy_grad(logits_c, lse_c, target_c, g / N)  (sum)
//     dh_c = d_c W;                      dW = d_c^T h_c + dW      (C, beta 1)
//   loss = concat(loss_c);               dh = concat(dh_c)
//
// Invariants: the same ops run on fewer rows, so every value is the one the
// unchunked head computes except dW, whose sum over rows is accumulated chunk
// after chunk in the GEMM's fp32 (reassociation only); at most `max-bytes`
// of logits are live at once; the chunks' ops are emitted one chunk after
// the other, the order in which the memory plan (which follows op order)
// gives a chunk's buffers to the next.
//
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SetVector.h"

#include <functional>

namespace mlir::forge {
#define GEN_PASS_DEF_CHUNKCROSSENTROPY
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

/// A GEMM that reads the logits' gradient D [N, V]: a row user makes
/// D·B [N, X] (each row from D's row); a sum user makes D^T·B or A^T·D
/// [V, X] / [X, V], a sum over D's rows (the weight's gradient).
struct GradUser {
  GemmOp gemm;
  bool sums;     // a sum over rows (else rows of the result follow D's)
  Value other;   // the operand that is not D: [N, X] for a sum user
  bool dIsLhs;   // D is the gemm's A (else its B; sum users only)
};

/// The head as matched: product -> [reshape] -> logits [N, V] ->
/// cross_entropy, cross_entropy_grad -> D -> users.
struct Head {
  Operation *product = nullptr; // matmul or gemm(h, W) making the logits
  ReshapeOp view;               // [.., V] -> [N, V], when the product is not 2-d
  CrossEntropyOp ce;
  CrossEntropyGradOp grad;
  SmallVector<GradUser> users;
  SmallVector<ReshapeOp> dViews; // views of D that only lead to users
  int64_t rows = 0;
};

/// Why `grad`'s head cannot be chunked ("" when it can); fills `head`.
std::string matchHead(CrossEntropyGradOp grad, Head &head) {
  head.grad = grad;
  Value logits = grad.getLogits();
  head.ce = grad.getLse().getDefiningOp<CrossEntropyOp>();
  if (!head.ce || head.ce.getLogits() != logits || head.ce.getTarget() != grad.getTarget())
    return "the gradient reads another cross_entropy's statistics";
  auto type = cast<RankedTensorType>(logits.getType());
  if (!type.hasStaticShape() || type.getRank() != 2)
    return "the logits are not a static matrix";
  head.rows = type.getDimSize(0);
  for (Operation *user : logits.getUsers())
    if (user != head.ce.getOperation() && user != grad.getOperation())
      return "the logits have a user other than the loss and its gradient";
  Value produced = logits;
  if (auto view = logits.getDefiningOp<ReshapeOp>()) {
    head.view = view;
    produced = view.getInput();
    if (!produced.hasOneUse())
      return "the logits' product has another user";
  }
  Operation *product = produced.getDefiningOp();
  Value lhs;
  if (auto mm = dyn_cast_or_null<MatMulOp>(product)) {
    if (mm.getTransA() || cast<RankedTensorType>(mm.getRhs().getType()).getRank() != 2)
      return "the logits' matmul is not rows of its lhs times a matrix";
    lhs = mm.getLhs();
  } else if (auto gemm = dyn_cast_or_null<GemmOp>(product)) {
    if (gemm.getTransA() || gemm.getC())
      return "the logits' gemm transposes its lhs or adds a C";
    lhs = gemm.getA();
  } else {
    return "the logits are not made by a matmul or gemm";
  }
  head.product = product;
  auto lhsType = cast<RankedTensorType>(lhs.getType());
  if (!lhsType.hasStaticShape() || lhsType.getNumElements() / lhsType.getShape().back() != head.rows)
    return "the product's rows are not the logits' rows";
  if (head.ce->getNumResults() != 2 || !head.ce.getLoss().getType().hasStaticShape())
    return "unexpected cross_entropy results";
  if (grad.getReduction() == "none" &&
      cast<RankedTensorType>(grad.getGradOutput().getType()).getNumElements() != head.rows)
    return "the per-row upstream gradient is not one value per row";
  // D's readers, through views of it (the CPU pipeline leaves D reshaped to
  // [B, T, V] and back): gemms that read D as the matrix [N, V].
  SmallVector<Value> worklist{grad.getResult()};
  SmallVector<std::pair<GemmOp, Value>> readers;
  while (!worklist.empty()) {
    Value v = worklist.pop_back_val();
    for (Operation *user : v.getUsers()) {
      if (auto view = dyn_cast<ReshapeOp>(user)) {
        head.dViews.push_back(view);
        worklist.push_back(view.getResult());
        continue;
      }
      auto gemm = dyn_cast<GemmOp>(user);
      if (!gemm || gemm.getC() || gemm.getA() == gemm.getB() || v.getType() != grad.getType())
        return "the logits' gradient has a user other than a gemm without C";
      readers.push_back({gemm, v});
    }
  }
  for (auto [gemm, d] : readers) {
    GradUser u{gemm, false, {}, gemm.getA() == d};
    if (u.dIsLhs && !gemm.getTransA()) {
      u.other = gemm.getB(); // D B: rows follow D's
    } else if (u.dIsLhs && !gemm.getTransB()) {
      u.sums = true; // D^T B, B [N, X]
      u.other = gemm.getB();
    } else if (!u.dIsLhs && gemm.getTransA() && !gemm.getTransB()) {
      u.sums = true; // A^T D, A [N, X]
      u.other = gemm.getA();
    } else {
      return "the logits' gradient is read by a gemm that is neither rows of it nor a "
             "sum over its rows";
    }
    if (u.sums && cast<RankedTensorType>(u.other.getType()).getDimSize(0) != head.rows)
      return "a sum over the gradient's rows reads an operand of other rows";
    head.users.push_back(u);
  }
  // In program order, which the chunks repeat.
  llvm::sort(head.users, [](const GradUser &a, const GradUser &b) {
    return a.gemm->isBeforeInBlock(b.gemm);
  });
  return "";
}

struct ChunkCrossEntropyPass
    : public mlir::forge::impl::ChunkCrossEntropyBase<ChunkCrossEntropyPass> {
  using ChunkCrossEntropyBase::ChunkCrossEntropyBase;

  void runOnOperation() override {
    if (maxBytes <= 0)
      return;
    SmallVector<CrossEntropyGradOp> grads;
    getOperation().walk([&](CrossEntropyGradOp op) { grads.push_back(op); });
    for (CrossEntropyGradOp grad : grads) {
      auto type = cast<RankedTensorType>(grad.getLogits().getType());
      if (!type.hasStaticShape())
        continue;
      int64_t bytes = type.getNumElements() * type.getElementTypeBitWidth() / 8;
      if (bytes <= maxBytes)
        continue;
      Head head;
      std::string why = matchHead(grad, head);
      // A head forge-fuse-linear-cross-entropy will take stores no logits: its largest
      // tensor is the gradient (2 bytes a logit).
      if (why.empty() && fusedHead &&
          isLinearCrossEntropyForm(head.product, type, grad.getResult().getType())) {
        bytes = type.getNumElements() * 2;
        if (bytes <= maxBytes)
          continue;
      }
      if (why.empty() && head.product->getBlock() != grad->getBlock())
        why = "the head spans blocks";
      int64_t chunks = (bytes + maxBytes - 1) / maxBytes;
      if (why.empty())
        why = chunk(head, std::min(chunks, head.rows));
      if (!why.empty())
        grad.emitRemark() << "forge-chunk-cross-entropy: logits of " << bytes
                          << " bytes not chunked: " << why;
    }
  }

  /// Rewrites the matched head into `chunks` chunks of rows; "" or why not.
  std::string chunk(Head &head, int64_t chunks) {
    Operation *product = head.product;
    OpBuilder b(product);
    Location loc = head.grad.getLoc();
    const int64_t n = head.rows;
    const int64_t per = (n + chunks - 1) / chunks;

    // Every value the chunks read must be available at the product (where
    // they go): defined before it, or a reshape (a view) of such a value,
    // made anew there. Checked before anything is built.
    std::function<bool(Value)> reachable = [&](Value v) {
      Operation *def = v.getDefiningOp();
      if (!def || def->isBeforeInBlock(product))
        return true;
      auto view = dyn_cast<ReshapeOp>(def);
      return view && reachable(view.getInput());
    };
    SmallVector<Value> needed{product->getOperand(0), product->getOperand(1),
                              head.ce.getTarget(), head.grad.getGradOutput()};
    for (GradUser &u : head.users)
      needed.push_back(u.other);
    for (Value v : needed)
      if (!reachable(v))
        return "an operand of the head is computed after its logits";
    // Their views, to erase at the end those left unread.
    llvm::SetVector<Operation *> viewSet;
    for (Value v : needed)
      for (auto view = v.getDefiningOp<ReshapeOp>(); view;
           view = view.getInput().getDefiningOp<ReshapeOp>())
        viewSet.insert(view);
    SmallVector<Operation *> views(viewSet.begin(), viewSet.end());
    auto rootOf = [](Value v) {
      while (auto view = v.getDefiningOp<ReshapeOp>())
        v = view.getInput();
      return v;
    };
    // The [N, X] view of a row operand, one per underlying tensor (the
    // hidden state is both the product's lhs and the weight gradient's
    // operand), and its rows per chunk, sliced once.
    llvm::DenseMap<Value, Value> matrices;
    auto asRows = [&](Value v) -> Value {
      Value root = rootOf(v);
      if (Value m = matrices.lookup(root))
        return m;
      auto t = cast<RankedTensorType>(root.getType());
      Value m = root;
      if (t.getRank() != 2 || t.getDimSize(0) != n) {
        int64_t inner = t.getNumElements() / n;
        m = b.create<ReshapeOp>(loc, RankedTensorType::get({n, inner}, t.getElementType()), root,
                                b.getDenseI64ArrayAttr({n, inner}));
      }
      return matrices[root] = m;
    };
    auto available = [&](Value v) -> Value {
      if (!v.getDefiningOp() || v.getDefiningOp()->isBeforeInBlock(product))
        return v;
      Value root = rootOf(v);
      if (root == v)
        return v;
      auto t = cast<RankedTensorType>(v.getType());
      return b.create<ReshapeOp>(loc, t, root, b.getDenseI64ArrayAttr(t.getShape()));
    };
    llvm::DenseMap<std::pair<Value, int64_t>, Value> slices;
    auto rowsOf = [&](Value m, int64_t begin, int64_t end) -> Value {
      Value &slice = slices[{m, begin}];
      if (slice)
        return slice;
      auto t = cast<RankedTensorType>(m.getType());
      SmallVector<int64_t> starts(t.getRank(), 0), ends(t.getShape()), steps(t.getRank(), 1),
          shape(t.getShape());
      starts[0] = begin;
      ends[0] = end;
      shape[0] = end - begin;
      return slice = b.create<SliceOp>(loc, RankedTensorType::get(shape, t.getElementType()), m,
                                       b.getDenseI64ArrayAttr(starts),
                                       b.getDenseI64ArrayAttr(ends),
                                       b.getDenseI64ArrayAttr(steps));
    };

    Value hidden = asRows(product->getOperand(0));
    Value weight = available(product->getOperand(1));
    Value target = available(head.ce.getTarget());
    Value g = available(head.grad.getGradOutput());
    SmallVector<Value> others;
    for (GradUser &u : head.users)
      others.push_back(u.sums ? asRows(u.other) : available(u.other));

    // The mean's 1/N once; the chunks sum (a chunk's own mean would divide
    // by its rows).
    StringRef reduction = head.grad.getReduction();
    if (reduction == "mean") {
      auto gt = cast<RankedTensorType>(g.getType());
      auto count = b.create<ConstantOp>(
          loc, DenseElementsAttr::get(gt, b.getFloatAttr(gt.getElementType(),
                                                         static_cast<double>(n))));
      g = b.create<DivOp>(loc, gt, g, count.getResult());
      reduction = "sum";
    }

    auto logitsType = cast<RankedTensorType>(head.grad.getLogits().getType());
    auto lossType = cast<RankedTensorType>(head.ce.getLoss().getType());
    auto lseType = cast<RankedTensorType>(head.ce.getLse().getType());
    auto dType = cast<RankedTensorType>(head.grad.getType());
    auto withRows = [](RankedTensorType t, int64_t rows) {
      SmallVector<int64_t> shape(t.getShape());
      shape[0] = rows;
      return RankedTensorType::get(shape, t.getElementType());
    };

    SmallVector<Value> losses, lses;
    SmallVector<SmallVector<Value>> rowResults(head.users.size());
    SmallVector<Value> sums(head.users.size());
    for (int64_t begin = 0; begin < n; begin += per) {
      int64_t end = std::min(n, begin + per), rows = end - begin;
      Value h = rowsOf(hidden, begin, end);
      Value logits;
      if (auto mm = dyn_cast<MatMulOp>(product))
        logits = b.create<MatMulOp>(loc, withRows(logitsType, rows), h, weight,
                                    b.getBoolAttr(false), mm.getTransBAttr());
      else {
        auto gemm = cast<GemmOp>(product);
        logits = b.create<GemmOp>(loc, withRows(logitsType, rows), h, weight, Value(),
                                  gemm.getTransAAttr(), gemm.getTransBAttr(),
                                  gemm.getAlphaAttr(), gemm.getBetaAttr());
      }
      Value t = rowsOf(target, begin, end);
      auto ce = b.create<CrossEntropyOp>(loc, TypeRange{withRows(lossType, rows),
                                                        withRows(lseType, rows)},
                                         logits, t, head.ce.getClassesAttr());
      losses.push_back(ce.getLoss());
      lses.push_back(ce.getLse());
      Value gc = reduction == "none" ? rowsOf(g, begin, end) : g;
      auto d = b.create<CrossEntropyGradOp>(loc, withRows(dType, rows), logits, ce.getLse(), t,
                                            gc, b.getStringAttr(reduction),
                                            head.grad.getClassesAttr());
      for (auto [i, u] : llvm::enumerate(head.users)) {
        GemmOp gemm = u.gemm;
        auto resultType = cast<RankedTensorType>(gemm.getType());
        if (!u.sums) {
          rowResults[i].push_back(b.create<GemmOp>(
              gemm.getLoc(), withRows(resultType, rows), d.getResult(), others[i], Value(),
              gemm.getTransAAttr(), gemm.getTransBAttr(), gemm.getAlphaAttr(),
              b.getF64FloatAttr(0.0)));
          continue;
        }
        // Accumulated: the first chunk's product, then C + product.
        Value o = rowsOf(others[i], begin, end);
        Value lhs = u.dIsLhs ? d.getResult() : o, rhs = u.dIsLhs ? o : d.getResult();
        sums[i] = b.create<GemmOp>(gemm.getLoc(), resultType, lhs, rhs, sums[i],
                                   gemm.getTransAAttr(), gemm.getTransBAttr(),
                                   gemm.getAlphaAttr(), b.getF64FloatAttr(sums[i] ? 1.0 : 0.0));
      }
    }

    auto concat = [&](ValueRange parts, Type type) -> Value {
      return b.create<ConcatOp>(loc, type, parts, b.getI64IntegerAttr(0)).getResult();
    };
    for (auto [i, u] : llvm::enumerate(head.users))
      u.gemm.getResult().replaceAllUsesWith(
          u.sums ? sums[i] : concat(rowResults[i], u.gemm.getType()));
    head.ce.getLoss().replaceAllUsesWith(concat(losses, lossType));
    if (llvm::any_of(head.ce.getLse().getUsers(),
                     [&](Operation *user) { return user != head.grad.getOperation(); })) {
      Value lse = concat(lses, lseType);
      head.ce.getLse().replaceUsesWithIf(
          lse, [&](OpOperand &use) { return use.getOwner() != head.grad.getOperation(); });
    }
    for (GradUser &u : head.users)
      u.gemm.erase();
    for (ReshapeOp view : llvm::reverse(head.dViews))
      view.erase();
    head.grad.erase();
    head.ce.erase();
    if (head.view)
      head.view.erase();
    product->erase();
    // The views the head read that nothing reads now (made anew above).
    for (bool erased = true; erased;) {
      erased = false;
      for (Operation *&view : views)
        if (view && view->use_empty()) {
          view->erase();
          view = nullptr;
          erased = true;
        }
    }
    return "";
  }
};

} // namespace
