//===- CheckCoalescing.cpp - global accesses of generated kernels --------===//
//
// forge-check-coalescing (Passes.td): evaluates each global load, store and
// atomic's index for the threads of a warp and checks that the indices form
// one contiguous range.
//
// Coalesced means the warp's indices are one contiguous range, or two
// ascending runs with one drop to the lowest index (a broadcast row read
// across its end: the cost of a misaligned contiguous access), or ascending
// runs jumping forward, each of whole 32-byte sectors (rows a stride apart).
//
// Invariants the evaluation relies on, all true of forge-generate-kernels'
// output: kernels are 1-d (thread id x, block id x), global memrefs are 1-d
// (a flat tensor, elements or 16-byte vectors), and indices are arith
// expressions of thread and block ids, constants and scf.for induction
// variables (evaluated at the loop's first value, which may itself depend on
// the thread). Anything else (a value loaded from memory, a loop-carried
// value) makes the index data-dependent.
//
//===----------------------------------------------------------------------===//
#include "forge/Codegen/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "llvm/ADT/DenseMap.h"

#include <optional>

namespace mlir::forge {
#define GEN_PASS_DEF_CHECKCOALESCING
#include "forge/Codegen/Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;

namespace {

/// Evaluates index expressions of one kernel for one thread.
class IndexEvaluator {
public:
  IndexEvaluator(int64_t tid, int64_t bid, int64_t blockDim)
      : tid(tid), bid(bid), blockDim(blockDim) {}

  std::optional<int64_t> eval(Value v) {
    if (auto it = memo.find(v); it != memo.end())
      return it->second;
    std::optional<int64_t> r = compute(v);
    memo[v] = r;
    return r;
  }

private:
  std::optional<int64_t> compute(Value v) {
    if (auto arg = dyn_cast<BlockArgument>(v)) {
      // An scf.for's induction variable: its first value; iter_args are data.
      if (auto loop = dyn_cast<scf::ForOp>(arg.getOwner()->getParentOp()))
        if (arg == loop.getInductionVar())
          return eval(loop.getLowerBound());
      return std::nullopt;
    }
    Operation *op = v.getDefiningOp();
    if (auto id = dyn_cast<gpu::ThreadIdOp>(op))
      return id.getDimension() == gpu::Dimension::x ? tid : 0;
    if (auto id = dyn_cast<gpu::BlockIdOp>(op))
      return id.getDimension() == gpu::Dimension::x ? bid : 0;
    if (auto dim = dyn_cast<gpu::BlockDimOp>(op))
      return dim.getDimension() == gpu::Dimension::x ? blockDim : 1;
    if (isa<gpu::GridDimOp>(op))
      return 1 << 16;
    if (auto c = dyn_cast<arith::ConstantOp>(op)) {
      if (auto i = dyn_cast<IntegerAttr>(c.getValue()))
        return i.getValue().getSExtValue();
      return std::nullopt;
    }
    if (isa<arith::IndexCastOp, arith::IndexCastUIOp, arith::ExtUIOp, arith::ExtSIOp,
            arith::TruncIOp>(op))
      return eval(op->getOperand(0));
    if (auto sel = dyn_cast<arith::SelectOp>(op)) {
      std::optional<int64_t> c = eval(sel.getCondition());
      if (!c)
        return std::nullopt;
      return eval(*c ? sel.getTrueValue() : sel.getFalseValue());
    }
    if (auto cmp = dyn_cast<arith::CmpIOp>(op)) {
      auto a = eval(cmp.getLhs()), b = eval(cmp.getRhs());
      if (!a || !b)
        return std::nullopt;
      uint64_t ua = *a, ub = *b;
      switch (cmp.getPredicate()) {
      case arith::CmpIPredicate::eq: return *a == *b;
      case arith::CmpIPredicate::ne: return *a != *b;
      case arith::CmpIPredicate::slt: return *a < *b;
      case arith::CmpIPredicate::sle: return *a <= *b;
      case arith::CmpIPredicate::sgt: return *a > *b;
      case arith::CmpIPredicate::sge: return *a >= *b;
      case arith::CmpIPredicate::ult: return ua < ub;
      case arith::CmpIPredicate::ule: return ua <= ub;
      case arith::CmpIPredicate::ugt: return ua > ub;
      case arith::CmpIPredicate::uge: return ua >= ub;
      }
      return std::nullopt;
    }
    if (op->getNumOperands() != 2 || op->getNumResults() != 1)
      return std::nullopt;
    auto a = eval(op->getOperand(0)), b = eval(op->getOperand(1));
    if (!a || !b)
      return std::nullopt;
    if (isa<arith::AddIOp>(op)) return *a + *b;
    if (isa<arith::SubIOp>(op)) return *a - *b;
    if (isa<arith::MulIOp>(op)) return *a * *b;
    if (isa<arith::AndIOp>(op)) return *a & *b;
    if (isa<arith::OrIOp>(op)) return *a | *b;
    if (isa<arith::XOrIOp>(op)) return *a ^ *b;
    if (isa<arith::MinUIOp>(op)) return static_cast<int64_t>(std::min<uint64_t>(*a, *b));
    if (isa<arith::MaxUIOp>(op)) return static_cast<int64_t>(std::max<uint64_t>(*a, *b));
    if (isa<arith::MinSIOp>(op)) return std::min(*a, *b);
    if (isa<arith::MaxSIOp>(op)) return std::max(*a, *b);
    if (isa<arith::ShLIOp>(op)) return *a << *b;
    if (isa<arith::ShRUIOp>(op)) return static_cast<int64_t>(static_cast<uint64_t>(*a) >> *b);
    if (*b == 0)
      return std::nullopt;
    if (isa<arith::DivUIOp>(op)) return static_cast<int64_t>(uint64_t(*a) / uint64_t(*b));
    if (isa<arith::RemUIOp>(op)) return static_cast<int64_t>(uint64_t(*a) % uint64_t(*b));
    if (isa<arith::DivSIOp>(op)) return *a / *b;
    if (isa<arith::RemSIOp>(op)) return *a % *b;
    return std::nullopt;
  }

  int64_t tid, bid, blockDim;
  llvm::DenseMap<Value, std::optional<int64_t>> memo;
};

/// The global memref and the index an access reads or writes, if it is one.
std::optional<std::pair<Value, Value>> globalAccess(Operation *op) {
  Value mem, index;
  auto take = [&](Value m, ValueRange indices) {
    mem = m;
    if (indices.size() == 1) // flat memrefs; another form stays unevaluated
      index = indices[0];
  };
  if (auto l = dyn_cast<memref::LoadOp>(op))
    take(l.getMemRef(), l.getIndices());
  else if (auto s = dyn_cast<memref::StoreOp>(op))
    take(s.getMemRef(), s.getIndices());
  else if (auto a = dyn_cast<memref::AtomicRMWOp>(op))
    take(a.getMemref(), a.getIndices());
  else if (auto vl = dyn_cast<vector::LoadOp>(op))
    take(vl.getBase(), vl.getIndices());
  else if (auto vs = dyn_cast<vector::StoreOp>(op))
    take(vs.getBase(), vs.getIndices());
  else
    return std::nullopt;
  auto type = cast<MemRefType>(mem.getType());
  // Workgroup (shared) memory: address space 3 or a gpu address space attribute.
  if (Attribute space = type.getMemorySpace()) {
    if (auto as = dyn_cast<gpu::AddressSpaceAttr>(space);
        as && as.getValue() != gpu::AddressSpace::Global)
      return std::nullopt;
    if (auto i = dyn_cast<IntegerAttr>(space); i && i.getInt() == 3)
      return std::nullopt;
  }
  return std::make_pair(mem, index);
}

struct CheckCoalescingPass
    : public mlir::forge::impl::CheckCoalescingBase<CheckCoalescingPass> {
  using CheckCoalescingBase::CheckCoalescingBase;

  void runOnOperation() override {
    bool failed = false;
    getOperation().walk([&](gpu::GPUFuncOp fn) {
      if (!fn.isKernel())
        return;
      int64_t block = 128;
      if (auto known = fn.getKnownBlockSizeAttr())
        block = known[0];
      // Threads 0..31 of block 1 (block 0's first rows can hide a stride).
      int64_t warp = std::min<int64_t>(32, block);
      SmallVector<IndexEvaluator> threads;
      for (int64_t t = 0; t < warp; ++t)
        threads.emplace_back(t, /*bid=*/1, block);
      int coalesced = 0, broadcast = 0, dataDependent = 0, strided = 0;
      fn.walk([&](Operation *op) {
        auto access = globalAccess(op);
        if (!access)
          return;
        if (!access->second) { // not a 1-d index: nothing this check can say
          ++dataDependent;
          return;
        }
        SmallVector<std::optional<int64_t>> at;
        for (IndexEvaluator &e : threads)
          at.push_back(e.eval(access->second));
        if (llvm::any_of(at, [](auto v) { return !v; })) {
          ++dataDependent;
          return;
        }
        // Coalesced: the warp's indices are one contiguous range (each index
        // in it touched): the fewest transactions for its bytes. Consecutive
        // threads at consecutive elements, a broadcast, a small per-column
        // vector read cyclically (t % 8) and a 2-d walk whose next row starts
        // where a row ends inside the warp all are.
        llvm::SmallDenseSet<int64_t, 32> distinct;
        int64_t lo = *at[0], hi = *at[0];
        for (auto v : at) {
          distinct.insert(*v);
          lo = std::min(lo, *v);
          hi = std::max(hi, *v);
        }
        if (distinct.size() == 1) {
          ++broadcast;
          return;
        }
        if (hi - lo + 1 == static_cast<int64_t>(distinct.size())) {
          ++coalesced;
          return;
        }
        // A broadcast row read across the row's end: consecutive threads at
        // consecutive elements, once wrapping back to the row's start (a
        // [N, 1, 1, C] scale read per [N, H, W, C] element, C not a
        // multiple of the warp): two runs, each contiguous, as a misaligned
        // contiguous access costs.
        int wraps = 0;
        bool steps = true;
        for (size_t t = 1; t < at.size() && steps; ++t) {
          int64_t d = *at[t] - *at[t - 1];
          if (d < 0 && *at[t] == lo)
            ++wraps;
          else
            steps = d == 1;
        }
        if (steps && wraps == 1) {
          ++coalesced;
          return;
        }
        // Rows a stride apart (a concat's piece written in place: its rows
        // lie a token stride apart, forge-fold-attention-views): ascending
        // runs, contiguous within, jumping forward between, each of whole
        // 32-byte sectors: the warp moves exactly the sectors it fills.
        Type elem = cast<MemRefType>(access->first.getType()).getElementType();
        int64_t bytes = 0;
        if (auto v = dyn_cast<VectorType>(elem))
          bytes = v.getNumElements() * v.getElementTypeBitWidth() / 8;
        else if (elem.isIntOrFloat())
          bytes = elem.getIntOrFloatBitWidth() / 8;
        auto wholeSectors = [&](int64_t start, int64_t length) {
          return bytes > 0 && start * bytes % 32 == 0 && length * bytes % 32 == 0;
        };
        bool rows = bytes > 0;
        int64_t runStart = *at[0];
        for (size_t t = 1; t <= at.size() && rows; ++t) {
          if (t < at.size() && *at[t] - *at[t - 1] == 1)
            continue;
          rows = wholeSectors(runStart, *at[t - 1] - runStart + 1) &&
                 (t == at.size() || *at[t] > *at[t - 1]);
          if (t < at.size())
            runStart = *at[t];
        }
        if (rows) {
          ++coalesced;
          return;
        }
        ++strided;
        failed = true;
        // The first 8 strides between adjacent threads name the pattern.
        std::string text;
        llvm::raw_string_ostream os(text);
        int64_t shown = std::min<int64_t>(8, warp - 1);
        for (int64_t t = 0; t < shown; ++t)
          os << (t ? ", " : "") << *at[t + 1] - *at[t];
        op->emitError() << "forge-check-coalescing: kernel " << fn.getName() << ": "
                        << op->getName() << " on a global memref is not coalesced: index "
                           "strides between adjacent threads "
                        << text << (warp - 1 > shown ? ", ..." : "");
      });
      if (report)
        fn.emitRemark() << "forge-check-coalescing: kernel " << fn.getName() << ": " << coalesced
                        << " coalesced, " << broadcast << " broadcast, " << dataDependent
                        << " data-dependent, " << strided << " strided global accesses";
    });
    if (failed)
      signalPassFailure();
    markAllAnalysesPreserved();
  }
};

} // namespace
