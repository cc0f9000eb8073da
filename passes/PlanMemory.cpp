//===- PlanMemory.cpp - in-place updates and arena offsets -----------------===//
//
// Invariants established for the bundle emitter (which only reads them):
//  * every result returned with forge.updates is computed by an op of the
//    routine that may write the persistent tensor in place (forge.copy when
//    nothing else may);
//  * every other returned value is an op result returned once, so it can be
//    the routine's output buffer;
//  * two arena tensors share bytes only if their live ranges [definition,
//    last use] are disjoint, so a kernel never reads an operand that aliases
//    its own output, except a reshape, whose result is its operand's bytes,
//    and views (forge-fold-attention-views, forge-fold-contiguous-views): a
//    split's pieces and a slice's result are their operand's bytes, a
//    concat's pieces its result's (their makers write them there, strided
//    with forge.out_row_strides);
//  * an op off the compute stream (a collective) holds its operands' and
//    results' bytes until the compute stream is ordered after it, and its
//    results' from the last compute op it is ordered after (StreamOrder.h);
//  * a cuDNN op's forge.workspace bytes overlap no tensor live at that op
//    (other ops' workspaces may share them: each lives at its op only).
//
//===----------------------------------------------------------------------===//
#include "Passes.h"
#include "StreamOrder.h"

#include "forge/Conversion/Conversion.h"
#include "forge/runtime/Bundle.h"

#include "mlir/IR/Builders.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MathExtras.h"
#include "llvm/Support/raw_ostream.h"

#include <map>
#include <mutex>

namespace mlir::forge {
#define GEN_PASS_DEF_PLANMEMORY
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

std::string mlir::forge::formatBytes(uint64_t bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return llvm::formatv("{0:F1} {1}", v, units[u]).str();
}

SmallVector<uint64_t> mlir::forge::pieceByteOffsets(RankedTensorType whole, int64_t axis,
                                                    TypeRange pieces) {
  uint64_t bytes = ::forge::rt::dtypeSize(dtypeFromType(whole.getElementType()));
  for (int64_t d = axis + 1; d < whole.getRank(); ++d)
    bytes *= static_cast<uint64_t>(whole.getDimSize(d));
  SmallVector<uint64_t> offsets;
  uint64_t at = 0;
  for (Type piece : pieces) {
    offsets.push_back(at);
    at += static_cast<uint64_t>(cast<RankedTensorType>(piece).getDimSize(axis)) * bytes;
  }
  return offsets;
}

bool mlir::forge::piecesAligned(RankedTensorType whole, int64_t axis, TypeRange pieces) {
  return llvm::all_of(pieceByteOffsets(whole, axis, pieces),
                      [](uint64_t at) { return at % ::forge::rt::kSectionAlignment == 0; });
}

int64_t mlir::forge::sliceFirstElement(SliceOp slice) {
  auto type = cast<RankedTensorType>(slice.getInput().getType());
  int64_t offset = 0, stride = 1;
  for (int64_t d = type.getRank() - 1; d >= 0; --d) {
    offset += slice.getStarts()[d] * stride;
    stride *= type.getDimSize(d);
  }
  return offset;
}

namespace {

using ::forge::rt::alignUp; // forge/runtime/Bundle.h

uint64_t dtypeSizeOf(Type element) {
  return ::forge::rt::dtypeSize(dtypeFromType(element));
}

bool isPersistent(func::FuncOp func, unsigned i) {
  auto kind = func.getArgAttrOfType<StringAttr>(i, "forge.kind");
  return kind && (kind.getValue() == "parameter" || kind.getValue() == "state");
}

/// Whether `op` reads element i of operand k before writing element i of
/// result j, and no other element of the operand after that: then the
/// result may be written over the operand. Pointwise ops and loop regions
/// (per element; an operand of the result's shape is not broadcast), and
/// cross_entropy_grad's logits (one thread per element, lse given) and
/// cross_entropy_with_grad's (a row's statistics are read before its
/// gradient is written, by the threads that write it). A horizontal
/// region's members run in no order: only when the loop member that writes
/// result j is the only one reading operand k (a pointwise region that took
/// a scalar rider, forge-merge-scalar-regions).
/// A horizontal region's member that reads an earlier member's sums
/// (forge-merge-reductions): its kernel writes it in the block that completes
/// the last sum, into outputs zeroed before the launch (one holds the blocks'
/// arrival count), so it never writes over an input.
bool readsSums(FusionOp member) {
  return llvm::any_of(member.getInputs(), [&](Value v) {
    auto arg = dyn_cast<BlockArgument>(v);
    return !arg || arg.getOwner() != member->getBlock();
  });
}

bool readsBeforeWrites(Operation *op, unsigned k, unsigned j) {
  auto in = cast<RankedTensorType>(op->getOperand(k).getType());
  auto out = cast<RankedTensorType>(op->getResult(j).getType());
  if (in.getShape() != out.getShape() ||
      dtypeSizeOf(in.getElementType()) != dtypeSizeOf(out.getElementType()))
    return false;
  if (auto fusion = dyn_cast<FusionOp>(op)) {
    if (fusion.getKind() == "horizontal") {
      Block &body = fusion.getBlock();
      Value yielded = body.getTerminator()->getOperand(j);
      auto writer = dyn_cast_or_null<FusionOp>(yielded.getDefiningOp());
      if (!writer || writer->getBlock() != &body || writer.getKind() != "loop" ||
          writer.isViewRegion() || readsSums(writer))
        return false;
      // Every operand slot holding the value (members read their own copies).
      for (auto [i, v] : llvm::enumerate(op->getOperands()))
        if (v == op->getOperand(k))
          for (Operation *user : body.getArgument(i).getUsers())
            if (body.findAncestorOpInBlock(*user) != writer)
              return false;
      return true;
    }
    return fusion.getKind() == "loop" && !fusion.isViewRegion(); // a view moves elements
  }
  if (isa<CrossEntropyGradOp>(op))
    return k == 0;
  if (isa<CrossEntropyWithGradOp>(op)) // the gradient over the logits
    return k == 0 && j == 1;
  auto iface = dyn_cast<ForgeOpInterface>(op);
  return iface && iface.getFusionClass() == FusionClass::Elementwise;
}

struct Interval {
  int64_t tensor; // the planning index of the chain's root
  int64_t begin, end; // op positions, inclusive; -1: before the first op
  uint64_t bytes;
};

/// First-fit offsets for intervals (sorted here by size, largest first);
/// returns the arena size and sets offsets[tensor].
uint64_t planArena(std::vector<Interval> intervals, std::vector<int64_t> &offsets) {
  std::sort(intervals.begin(), intervals.end(), [](const Interval &a, const Interval &b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.begin < b.begin;
  });
  struct Placed {
    uint64_t offset, size;
    int64_t begin, end;
  };
  std::vector<Placed> placed;
  uint64_t arena = 0;
  for (const Interval &iv : intervals) {
    uint64_t size = alignUp(std::max<uint64_t>(iv.bytes, 1), ::forge::rt::kSectionAlignment);
    std::vector<std::pair<uint64_t, uint64_t>> busy;
    for (const Placed &p : placed)
      if (!(p.end < iv.begin || iv.end < p.begin))
        busy.push_back({p.offset, p.offset + p.size});
    std::sort(busy.begin(), busy.end());
    uint64_t offset = 0;
    for (auto [lo, hi] : busy) {
      if (offset + size <= lo)
        break;
      offset = std::max(offset, hi);
    }
    placed.push_back({offset, size, iv.begin, iv.end});
    offsets[iv.tensor] = static_cast<int64_t>(offset);
    arena = std::max(arena, offset + size);
  }
  return arena;
}

struct PlanMemoryPass : public mlir::forge::impl::PlanMemoryBase<PlanMemoryPass> {
  using PlanMemoryBase::PlanMemoryBase;
  void runOnOperation() override;

  /// Marks the updates written in place and makes the copies the others and
  /// the outputs need; returns the values written in place.
  llvm::DenseSet<Value> placeUpdates(func::FuncOp func);
  /// Per op writing a persistent tensor's bytes (an update in place, or its
  /// copy): the ops that read the tensor's old value.
  llvm::DenseMap<Operation *, SmallVector<Operation *, 4>>
  overwrites(func::FuncOp func, const llvm::DenseSet<Value> &inPlace);
  LogicalResult planArena(func::FuncOp func, const llvm::DenseSet<Value> &inPlace,
                          const StreamOrder &order);
  /// `lastOf(root)`: the last value the buffer holds (other values written
  /// over the root's, in place or as reshapes), and how many there are.
  void printReport(llvm::raw_ostream &os, func::FuncOp func, ArrayRef<Interval> intervals,
                   uint64_t arena,
                   function_ref<Value(int64_t)> valueOf,
                   function_ref<std::pair<int64_t, int64_t>(int64_t)> lastOf);
};


/// What a tensor is called in the report: its op's location name, or the
/// argument's forge.name.
std::string describe(func::FuncOp func, Value v) {
  std::string text;
  llvm::raw_string_ostream os(text);
  if (auto arg = dyn_cast<BlockArgument>(v)) {
    auto name = func.getArgAttrOfType<StringAttr>(arg.getArgNumber(), "forge.name");
    os << "input '" << (name ? name.getValue() : "?") << "'";
  } else {
    Operation *op = v.getDefiningOp();
    os << op->getName().getStringRef();
    if (auto fusion = dyn_cast<FusionOp>(op))
      os << " \"" << fusion.getKind() << "\"";
    if (StringRef name = sourceNodeName(op); !name.empty())
      os << " '" << name << "'";
  }
  os << " " << v.getType();
  return text;
}

llvm::DenseSet<Value> PlanMemoryPass::placeUpdates(func::FuncOp func) {
  Block &body = func.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  llvm::DenseMap<Operation *, int64_t> position;
  llvm::DenseMap<Value, SmallVector<int64_t>> readers; // value -> positions reading it
  SmallVector<Operation *> steps;
  for (Operation &op : body.without_terminator()) {
    if (isa<ConstantOp>(op))
      continue;
    position[&op] = static_cast<int64_t>(steps.size());
    for (Value v : op.getOperands())
      readers[v].push_back(static_cast<int64_t>(steps.size()));
    steps.push_back(&op);
  }
  SmallVector<Value> returned(ret.getOperands());

  // Whether the op at a position may read `old` while writing `updated`: it
  // reads each element before writing that same element.
  auto pointwise = [&](Operation *op, Value old, Value updated) {
    // A GEMM adding the old value as its full C (an accumulation loop's
    // gradient, forge-split-accumulation): cuBLASLt reads C(i, j) in the
    // epilogue that writes D(i, j), and allows C == D; the CPU kernel too.
    if (auto g = dyn_cast<GemmOp>(op);
        g && g.getC() == old && g.getA() != old && g.getB() != old &&
        cast<RankedTensorType>(old.getType()).getShape() ==
            cast<RankedTensorType>(updated.getType()).getShape())
      return true;
    auto iface = dyn_cast<ForgeOpInterface>(op);
    if (iface && iface.getFusionClass() == FusionClass::Elementwise)
      return true;
    auto fusion = dyn_cast<FusionOp>(op);
    if (!fusion || !fusion->hasAttr("forge.launch"))
      return false;
    // A loop's updated tensor has the iteration shape; a view region moves
    // elements, and a row kernel may read a row after writing it.
    if (fusion.getKind() != "horizontal")
      return fusion.getKind() == "loop" && !fusion.isViewRegion();
    Value yielded =
        fusion.getBlock().getTerminator()->getOperand(cast<OpResult>(updated).getResultNumber());
    auto writer = llvm::find_if(fusion.getBlock().without_terminator(), [&](Operation &m) {
      return llvm::is_contained(m.getResults(), yielded);
    });
    if (writer == fusion.getBlock().without_terminator().end() || !isa<FusionOp>(*writer) ||
        cast<FusionOp>(*writer).getKind() != "loop" || readsSums(cast<FusionOp>(*writer)))
      return false;
    for (auto [i, input] : llvm::enumerate(op->getOperands()))
      if (input == old)
        for (Operation *user : fusion.getBlock().getArgument(i).getUsers())
          if (user != &*writer)
            return false;
    return true;
  };

  llvm::DenseSet<Value> inPlace;
  SmallVector<std::pair<unsigned, StringRef>> copies; // result index, persistent name
  for (auto [i, v] : llvm::enumerate(returned)) {
    auto updates = func.getResultAttrOfType<StringAttr>(i, "forge.updates");
    if (!updates)
      continue;
    Operation *def = v.getDefiningOp();
    bool safe = def && position.count(def) && !inPlace.contains(v) && !readers.count(v) &&
                llvm::count(returned, v) == 1;
    if (safe) {
      int64_t at = position[def];
      for (auto [a, arg] : llvm::enumerate(func.getArguments())) {
        auto name = func.getArgAttrOfType<StringAttr>(a, "forge.name");
        if (!isPersistent(func, a) || !name || name != updates)
          continue;
        if (llvm::is_contained(returned, Value(arg)))
          safe = false;
        for (int64_t p : readers.lookup(arg))
          safe &= p < at || (p == at && pointwise(steps[p], arg, v));
      }
    }
    if (safe)
      inPlace.insert(v);
    else
      copies.push_back({static_cast<unsigned>(i), updates.getValue()});
  }

  OpBuilder b(ret);
  MLIRContext *ctx = func.getContext();
  auto copyOf = [&](Value v, const std::string &name) {
    auto copy = b.create<CopyOp>(NameLoc::get(StringAttr::get(ctx, name)), v);
    copy->setAttr("forge.placement", b.getStringAttr("copy"));
    return copy.getResult();
  };
  // Outputs that need a buffer of their own: copies, named after the output.
  llvm::DenseSet<Value> claimed;
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    if (func.getResultAttrOfType<StringAttr>(i, "forge.updates"))
      continue;
    Operation *def = v.getDefiningOp();
    bool own = def && !isa<ConstantOp>(def) && !inPlace.contains(v) && !claimed.contains(v);
    if (own) {
      claimed.insert(v);
      continue;
    }
    auto name = func.getResultAttrOfType<StringAttr>(i, "forge.name");
    std::string output = name ? name.str() : "output" + std::to_string(i);
    if (!name)
      func.setResultAttr(i, "forge.name", b.getStringAttr(output));
    Value copy = copyOf(v, "output " + output);
    ret.setOperand(i, copy);
    claimed.insert(copy);
  }
  // Updates that cannot be in place: copies after everything else (after the
  // output copies too, which may read a persistent tensor's old value: a loss
  // scale reported and updated by one step), in result order.
  for (auto [i, name] : copies) {
    Value copy = copyOf(returned[i], "update " + name.str());
    ret.setOperand(i, copy);
    inPlace.insert(copy);
  }
  return inPlace;
}

llvm::DenseMap<Operation *, SmallVector<Operation *, 4>>
PlanMemoryPass::overwrites(func::FuncOp func, const llvm::DenseSet<Value> &inPlace) {
  llvm::DenseMap<Operation *, SmallVector<Operation *, 4>> edges;
  Block &body = func.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    auto updates = func.getResultAttrOfType<StringAttr>(i, "forge.updates");
    Operation *writer = v.getDefiningOp();
    if (!updates || !writer || !inPlace.contains(v))
      continue;
    for (auto [a, arg] : llvm::enumerate(func.getArguments())) {
      auto name = func.getArgAttrOfType<StringAttr>(a, "forge.name");
      if (!isPersistent(func, a) || name != updates)
        continue;
      for (Operation *user : arg.getUsers())
        if (Operation *reader = body.findAncestorOpInBlock(*user); reader && reader != writer)
          edges[writer].push_back(reader);
    }
  }
  return edges;
}

LogicalResult PlanMemoryPass::planArena(func::FuncOp func, const llvm::DenseSet<Value> &inPlace,
                                        const StreamOrder &order) {
  Block &body = func.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  // Planning indices in the bundle's tensor order: inputs, then op results.
  struct Tensor {
    Value value;
    int64_t begin, end; // live range over op positions
    bool input = false, output = false;
  };
  std::vector<Tensor> tensors;
  llvm::DenseMap<Value, int64_t> indexOf;
  for (auto [i, arg] : llvm::enumerate(func.getArguments()))
    if (!isPersistent(func, i)) {
      indexOf[arg] = static_cast<int64_t>(tensors.size());
      tensors.push_back({arg, -1, -1, true});
    }
  llvm::DenseSet<Value> outputs;
  for (auto [i, v] : llvm::enumerate(ret.getOperands()))
    if (!func.getResultAttrOfType<StringAttr>(i, "forge.updates"))
      outputs.insert(v);
  SmallVector<Operation *> steps;
  for (Operation &op : body.without_terminator()) {
    if (isa<ConstantOp>(op))
      continue;
    int64_t at = static_cast<int64_t>(steps.size());
    steps.push_back(&op);
    for (Value v : op.getOperands())
      if (auto it = indexOf.find(v); it != indexOf.end())
        tensors[it->second].end = std::max(tensors[it->second].end, at);
    for (Value r : op.getResults()) {
      if (inPlace.contains(r))
        continue;
      auto type = dyn_cast<RankedTensorType>(r.getType());
      if (!type || !type.hasStaticShape())
        return op.emitError("bundle tensors need static shapes, got ") << r.getType();
      indexOf[r] = static_cast<int64_t>(tensors.size());
      tensors.push_back({r, at, at, false, outputs.contains(r)});
    }
  }
  int64_t last = static_cast<int64_t>(steps.size()); // inputs and outputs live to here
  for (Tensor &t : tensors)
    if (t.input || t.output)
      t.end = last;
  // An op on another stream than the compute stream (a collective) runs
  // beside it: its operands and results keep their bytes until the compute
  // stream is ordered after it (`until`: a wait for it or a later op of its
  // stream, else the end), and its results have them from the last compute
  // op it is ordered after on (`after`), since the compute ops between may
  // still be running when it writes them. The compute op at `until` runs
  // after the op is done (it waited for it): its results may take the
  // operands' bytes (the operands' range ends before it, unless it reads
  // them too), not the results' (it reads them): StreamOrder's
  // operandsUntil, which says when that holds.
  llvm::DenseMap<Operation *, int64_t> collectiveEnd;
  for (auto [at, op] : llvm::enumerate(steps)) {
    if (order.stream[at] == 0)
      continue;
    const int64_t until = std::min(order.until[at], last);
    const int64_t operandsUntil = std::min(order.operandsUntil[at], last);
    for (Value v : op->getOperands())
      if (auto it = indexOf.find(v); it != indexOf.end())
        tensors[it->second].end = std::max(tensors[it->second].end, operandsUntil);
    for (Value r : op->getResults())
      if (auto it = indexOf.find(r); it != indexOf.end()) {
        tensors[it->second].begin = std::min(tensors[it->second].begin, order.after[at] + 1);
        tensors[it->second].end = std::max(tensors[it->second].end, until);
      }
    collectiveEnd[op] = operandsUntil; // where its operands die
  }

  // A reshape's result shares its operand's bytes: one interval per chain,
  // planned at its root; not from an input to an output.
  // A split placed as a view (forge-fold-attention-views) likewise: piece i
  // is its operand's bytes from the pieces before it on (aliasOffset: bytes
  // from the chain root's start).
  // A concat placed as a view (the same pass, the backward's dq/dk/dv): the
  // reverse, each piece's maker writes its result into the concat's bytes
  // (forge.out_row_strides), so the value it makes is planned at the concat
  // from the first maker on, at the piece's column offset; the reshapes from
  // it to the piece follow below.
  std::vector<int64_t> root(tensors.size());
  std::vector<uint64_t> aliasOffset(tensors.size(), 0);
  for (size_t t = 0; t < tensors.size(); ++t)
    root[t] = static_cast<int64_t>(t);
  for (Operation *op : steps) {
    auto concat = dyn_cast<ConcatOp>(op);
    if (!concat || !isViewOp(op) || !indexOf.count(concat.getResult()))
      continue;
    const int64_t c = indexOf[concat.getResult()];
    auto type = cast<RankedTensorType>(concat.getType());
    int64_t axis = static_cast<int64_t>(concat.getAxis());
    if (axis < 0)
      axis += type.getRank();
    // Columns of rows for the strided pieces, whole rows along the leading axis.
    SmallVector<uint64_t> at = pieceByteOffsets(type, axis, concat.getInputs().getTypes());
    for (auto [i, piece] : llvm::enumerate(concat.getInputs())) {
      // The maker's result: the piece, or what a reshape to it reads.
      Value value = piece;
      if (auto reshape = piece.getDefiningOp<ReshapeOp>())
        value = reshape.getInput();
      auto made = indexOf.find(value);
      if (made == indexOf.end() || tensors[made->second].input || tensors[made->second].output)
        return concat.emitError("forge-plan-memory: a concat view's piece must be an op's result "
                                "or a reshape of one (forge-fold-attention-views, "
                                "forge-fold-contiguous-views)");
      root[made->second] = c;
      aliasOffset[made->second] = at[i];
    }
  }
  for (Operation *op : steps) {
    // A contiguous slice as a view (forge-fold-contiguous-views): its
    // operand's bytes from the slice's first element on.
    if (auto slice = dyn_cast<SliceOp>(op); slice && isViewOp(op)) {
      auto in = indexOf.find(slice.getInput());
      auto t = indexOf.find(slice.getResult());
      if (in == indexOf.end() || t == indexOf.end() ||
          cast<RankedTensorType>(slice.getInput().getType()).getElementType() !=
              cast<RankedTensorType>(slice.getType()).getElementType())
        return slice.emitError("forge-plan-memory: a slice view must read an arena tensor of "
                               "its own element type (forge-fold-contiguous-views)");
      root[t->second] = root[in->second];
      aliasOffset[t->second] =
          aliasOffset[in->second] +
          static_cast<uint64_t>(sliceFirstElement(slice)) *
              dtypeSizeOf(cast<RankedTensorType>(slice.getType()).getElementType());
      continue;
    }
    if (auto split = dyn_cast<SplitOp>(op); split && isViewOp(op)) {
      auto it = indexOf.find(split.getInput());
      if (it == indexOf.end())
        continue;
      int64_t in = it->second;
      auto type = cast<RankedTensorType>(split.getInput().getType());
      int64_t axis = static_cast<int64_t>(split.getAxis());
      if (axis < 0)
        axis += type.getRank();
      SmallVector<uint64_t> at = pieceByteOffsets(type, axis, split->getResultTypes());
      for (auto [i, piece] : llvm::enumerate(split->getResults())) {
        int64_t t = indexOf.lookup(piece);
        root[t] = root[in];
        aliasOffset[t] = aliasOffset[in] + at[i];
      }
      continue;
    }
    auto reshape = dyn_cast<ReshapeOp>(op);
    if (!reshape || !indexOf.count(reshape.getInput()) || !indexOf.count(reshape.getResult()))
      continue;
    int64_t in = indexOf[reshape.getInput()], r = root[in], t = indexOf[reshape.getResult()];
    if (tensors[r].input && tensors[t].output)
      continue;
    root[t] = r;
    aliasOffset[t] = aliasOffset[in];
  }
  // A result may take the bytes of an operand that dies at its op when the
  // op reads each element of that operand before writing the same element
  // of the result (readsBeforeWrites): logits become their gradient. An
  // all_reduce reduces operand k into result k in place (NCCL and the CPU
  // kernel take equal send and receive buffers) when nothing else reads it:
  // its operands "die" where the collective is waited for.
  std::vector<int64_t> groupEnd(tensors.size(), 0);
  std::vector<bool> groupHasOutput(tensors.size(), false);
  for (size_t t = 0; t < tensors.size(); ++t) {
    groupEnd[root[t]] = std::max(groupEnd[root[t]], tensors[t].end);
    groupHasOutput[root[t]] = groupHasOutput[root[t]] || tensors[t].output;
  }
  // An op on a side stream is ordered after the compute stream's ops only up
  // to its `after`: a reader of the operand at a later compute position (or
  // on another side stream) may still be reading when the op writes, so the
  // op takes an operand's bytes only when every other reader of them is
  // ordered before it.
  llvm::DenseMap<Operation *, int64_t> stepOf;
  for (auto [at, op] : llvm::enumerate(steps))
    stepOf[op] = static_cast<int64_t>(at);
  auto othersBefore = [&](int64_t r, int64_t at) {
    for (size_t x = 0; x < tensors.size(); ++x) {
      if (root[x] != r)
        continue;
      for (Operation *user : tensors[x].value.getUsers()) {
        Operation *top = body.findAncestorOpInBlock(*user);
        auto it = top ? stepOf.find(top) : stepOf.end();
        if (it == stepOf.end() || it->second == at)
          continue;
        const int64_t p = it->second;
        const bool before = order.stream[p] == order.stream[at]
                                ? p < at
                                : order.stream[p] == 0 && p <= order.after[at];
        if (!before)
          return false;
      }
    }
    return true;
  };
  for (auto [at, op] : llvm::enumerate(steps)) {
    for (auto [j, result] : llvm::enumerate(op->getResults())) {
      auto out = indexOf.find(result);
      if (out == indexOf.end() || root[out->second] != out->second)
        continue;
      auto aside = collectiveEnd.find(op);
      const bool collective = isa<AllReduceOp>(op) && aside != collectiveEnd.end();
      const int64_t diesAt = collective ? aside->second : static_cast<int64_t>(at);
      for (auto [k, operand] : llvm::enumerate(op->getOperands())) {
        auto in = indexOf.find(operand);
        if (in == indexOf.end() || !(collective ? k == j && operand.hasOneUse()
                                                : readsBeforeWrites(op, k, j)))
          continue;
        int64_t r = root[in->second];
        if (tensors[r].input || groupHasOutput[r] || groupEnd[r] != diesAt ||
            r == out->second)
          continue;
        if (!collective && order.stream[at] != 0 && !othersBefore(r, static_cast<int64_t>(at)))
          continue;
        // Another operand in the same bytes (a slice view of them, at another
        // offset) would be read while the result overwrites them.
        if (llvm::any_of(llvm::enumerate(op->getOperands()), [&](auto other) {
              auto o = indexOf.find(other.value());
              return other.index() != k && o != indexOf.end() && root[o->second] == r &&
                     (aliasOffset[o->second] != aliasOffset[in->second] ||
                      other.value().getType() != operand.getType());
            }))
          continue;
        // The result takes the operand's bytes where the operand lies in
        // its group (a view's offset).
        int64_t t = out->second;
        const uint64_t shift = aliasOffset[in->second];
        for (size_t x = 0; x < root.size(); ++x)
          if (root[x] == t) {
            root[x] = r;
            aliasOffset[x] += shift;
          }
        groupEnd[r] = std::max(groupEnd[r], groupEnd[t]);
        groupHasOutput[r] = groupHasOutput[r] || groupHasOutput[t];
        break;
      }
    }
  }
  std::map<int64_t, Interval> intervalOf; // by root, in tensor order
  for (size_t t = 0; t < tensors.size(); ++t) {
    auto type = cast<RankedTensorType>(tensors[t].value.getType());
    // The group's bytes reach to the end of its furthest member.
    uint64_t bytes = aliasOffset[t] + static_cast<uint64_t>(type.getNumElements()) *
                                          dtypeSizeOf(type.getElementType());
    auto [it, fresh] = intervalOf.try_emplace(root[t], Interval{root[t], tensors[t].begin,
                                                                tensors[t].end, bytes});
    if (!fresh) {
      it->second.begin = std::min(it->second.begin, tensors[t].begin);
      it->second.end = std::max(it->second.end, tensors[t].end);
      it->second.bytes = std::max(it->second.bytes, bytes);
    }
  }
  std::vector<Interval> intervals;
  for (const auto &[t, iv] : intervalOf)
    intervals.push_back(iv);
  std::vector<int64_t> offsets(tensors.size(), -1);
  uint64_t arena = ::planArena(intervals, offsets);
  const uint64_t tensorArena = arena;
  Builder b(func.getContext());

  // cuDNN workspaces: per op, bytes no tensor live there holds (the largest
  // gap, a power of two up to the cap), or the floor above the live ones.
  const uint64_t align = ::forge::rt::kSectionAlignment;
  const uint64_t floorBytes = alignUp(static_cast<uint64_t>(std::max<int64_t>(workspaceFloor, 1)), align);
  const uint64_t capBytes = std::max(floorBytes, static_cast<uint64_t>(std::max<int64_t>(workspaceCap, 1)));
  auto powerOfTwoAtMost = [](uint64_t v) { return v ? uint64_t(1) << llvm::Log2_64(v) : 0; };
  struct Workspace {
    uint64_t offset, bytes;
    bool floored;
    int64_t lo, hi; // the positions it is live over
  };
  std::vector<Workspace> workspaces;
  auto place = [&](int64_t lo, int64_t hi) {
    std::vector<std::pair<uint64_t, uint64_t>> busy;
    for (const Interval &iv : intervals)
      if (iv.begin <= hi && lo <= iv.end) {
        uint64_t at = static_cast<uint64_t>(offsets[iv.tensor]);
        busy.push_back({at, at + alignUp(std::max<uint64_t>(iv.bytes, 1), align)});
      }
    for (const Workspace &w : workspaces) // another stream's, live meanwhile
      if (w.lo <= hi && lo <= w.hi)
        busy.push_back({w.offset, w.offset + w.bytes});
    std::sort(busy.begin(), busy.end());
    uint64_t gapAt = 0, gap = 0, cursor = 0;
    auto consider = [&](uint64_t a, uint64_t z) {
      if (z > a && z - a > gap)
        gapAt = a, gap = z - a;
    };
    for (auto [a, z] : busy) {
      consider(cursor, a);
      cursor = std::max(cursor, z);
    }
    consider(cursor, tensorArena);
    Workspace w{gapAt, powerOfTwoAtMost(std::min(gap, capBytes)), false, lo, hi};
    if (w.bytes < floorBytes)
      w = {cursor, floorBytes, true, lo, hi}; // above every tensor live here
    return w;
  };
  // Ops on further compute streams first: their workspace is theirs from the
  // last compute op they follow until the compute stream follows them (as
  // their results are), and the compute stream's ops (each live at its own
  // position only) keep clear of it.
  for (bool aside : {true, false})
    for (auto [at, op] : llvm::enumerate(steps)) {
      auto library = op->getAttrOfType<StringAttr>("forge.library");
      if (!library || library.getValue() != "cudnn" || (order.stream[at] != 0) != aside)
        continue;
      const int64_t lo = aside ? order.after[at] + 1 : static_cast<int64_t>(at);
      const int64_t hi = aside ? order.until[at] : static_cast<int64_t>(at);
      Workspace w = place(lo, hi);
      arena = std::max(arena, w.offset + w.bytes);
      workspaces.push_back(w);
      op->setAttr("forge.workspace", b.getDenseI64ArrayAttr({static_cast<int64_t>(w.offset),
                                                              static_cast<int64_t>(w.bytes)}));
    }
  // One write per routine: the routines of a module are planned in parallel.
  std::string text;
  llvm::raw_string_ostream reportText(text);
  if (report)
    printReport(
        reportText, func, intervals, arena, [&](int64_t t) { return tensors[t].value; },
        [&](int64_t r) {
          int64_t last = r, count = 0;
          for (size_t t = 0; t < tensors.size(); ++t)
            if (root[t] == r) {
              last = static_cast<int64_t>(t);
              ++count;
            }
          return std::pair<int64_t, int64_t>(last, count - 1);
        });
  if (report && !workspaces.empty()) {
    uint64_t least = UINT64_MAX, most = 0;
    int64_t floored = 0;
    for (const Workspace &w : workspaces) {
      least = std::min(least, w.bytes);
      most = std::max(most, w.bytes);
      floored += w.floored;
    }
    reportText << "  cuDNN workspace of " << workspaces.size() << " op"
                 << (workspaces.size() > 1 ? "s" : "") << " in the arena: "
                 << formatBytes(least) << " to " << formatBytes(most) << "; " << floored
                 << " at the floor (" << formatBytes(floorBytes) << "), which added "
                 << formatBytes(arena - tensorArena) << " to the arena\n";
  }
  if (report) {
    static std::mutex stdoutMutex;
    std::lock_guard<std::mutex> lock(stdoutMutex);
    llvm::outs() << text;
    llvm::outs().flush();
  }

  auto offsetOf = [&](Value v) -> int64_t {
    auto it = indexOf.find(v);
    return it == indexOf.end() ? -1
                               : offsets[root[it->second]] +
                                     static_cast<int64_t>(aliasOffset[it->second]);
  };
  for (auto [i, arg] : llvm::enumerate(func.getArguments()))
    if (!isPersistent(func, i))
      func.setArgAttr(i, "forge.offset", b.getI64IntegerAttr(offsetOf(arg)));
  for (Operation *op : steps) {
    SmallVector<int64_t> resultOffsets;
    for (Value r : op->getResults())
      resultOffsets.push_back(offsetOf(r));
    op->setAttr("forge.offsets", b.getDenseI64ArrayAttr(resultOffsets));
  }
  func->setAttr("forge.arena_size", b.getI64IntegerAttr(static_cast<int64_t>(arena)));
  return success();
}

void PlanMemoryPass::printReport(llvm::raw_ostream &os, func::FuncOp func,
                                 ArrayRef<Interval> intervals,
                                 uint64_t arena, function_ref<Value(int64_t)> valueOf,
                                 function_ref<std::pair<int64_t, int64_t>(int64_t)> lastOf) {
  // Live bytes per position (-1: before the first op), by a sweep.
  int64_t last = 0;
  for (const Interval &iv : intervals)
    last = std::max(last, iv.end);
  std::vector<int64_t> delta(static_cast<size_t>(last + 3), 0);
  auto size = [](const Interval &iv) {
    return static_cast<int64_t>(
        alignUp(std::max<uint64_t>(iv.bytes, 1), ::forge::rt::kSectionAlignment));
  };
  for (const Interval &iv : intervals) {
    delta[iv.begin + 1] += size(iv);
    delta[iv.end + 2] -= size(iv);
  }
  int64_t live = 0, peak = 0, at = -1;
  for (int64_t p = -1; p <= last; ++p) {
    live += delta[p + 1];
    if (live > peak) {
      peak = live;
      at = p;
    }
  }
  std::vector<const Interval *> atPeak;
  for (const Interval &iv : intervals)
    if (iv.begin <= at && at <= iv.end)
      atPeak.push_back(&iv);
  llvm::stable_sort(atPeak, [](const Interval *a, const Interval *b) { return a->bytes > b->bytes; });
  Operation *peakOp = nullptr;
  int64_t position = 0;
  for (Operation &op : func.getBody().front().without_terminator())
    if (!isa<ConstantOp>(op) && position++ == at)
      peakOp = &op;
  os << "memory plan of @" << func.getSymName() << ": arena " << formatBytes(arena)
     << ", peak of live tensors " << formatBytes(static_cast<uint64_t>(peak)) << " ("
     << intervals.size() << " buffers)";
  if (peakOp && peakOp->getNumResults() > 0)
    os << ", at op " << at << " (" << describe(func, peakOp->getResult(0)) << ")";
  os << "\n  live at the peak, largest first (" << std::min<int64_t>(reportTop, atPeak.size())
     << " of " << atPeak.size() << "):\n";
  for (int64_t i = 0; i < std::min<int64_t>(reportTop, atPeak.size()); ++i) {
    const Interval &iv = *atPeak[i];
    os << llvm::formatv("    {0,10}  ops {1}..{2}  ", formatBytes(iv.bytes), iv.begin, iv.end)
       << describe(func, valueOf(iv.tensor));
    auto [last, more] = lastOf(iv.tensor);
    if (more > 0)
      os << " (then " << more << " more value" << (more > 1 ? "s" : "") << " in its bytes, last "
         << describe(func, valueOf(last)) << ")";
    os << "\n";
  }
}

void PlanMemoryPass::runOnOperation() {
  func::FuncOp func = getOperation();
  if (!func.getBody().hasOneBlock() || !isa<func::ReturnOp>(func.getBody().front().getTerminator())) {
    func.emitError("routines must have a single block ending in return");
    return signalPassFailure();
  }
  if (func->hasAttr("forge.arena_size")) {
    func.emitError("the routine already has a memory plan");
    return signalPassFailure();
  }
  llvm::DenseSet<Value> inPlace = placeUpdates(func);
  // The copies just added run on the compute stream: a copy of a collective's
  // result waits for it like any reader (the edges are derived again). An op
  // writing a persistent tensor in place (or its copy) waits for the readers
  // of the old value on other streams (placeUpdates put them all before it).
  StreamOrder order = deriveStreamOrder(func, overwrites(func, inPlace));
  if (func->hasAttr("forge.streams"))
    writeStreamOrder(func, order);
  if (failed(planArena(func, inPlace, order)))
    signalPassFailure();
}

} // namespace
