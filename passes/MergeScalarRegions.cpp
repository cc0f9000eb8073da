//===- MergeScalarRegions.cpp - scalar regions ride in other kernels -------===//
//
// A scalar region (a loop region whose results have one element each: a
// loss's mean, the gradient norm's square root, Adam's bias corrections) is
// a launch for a few flops. forge-fuse already groups such regions into one
// horizontal region; this pass gives them no launch at all where one of two
// places is free:
//   * early: the member reads only the routine's arguments and constants
//     (functions of the step count) -> it joins the first pointwise region
//     before its first reader;
//   * late: only the routine's return reads it (metrics) -> it joins the
//     last pointwise region after it.
// A member that is neither (a clip scale between the gradient norm and the
// optimizer) keeps its region. "Joins" means the host becomes a horizontal
// region with one more member: a 1-element member gets one block of the
// host's kernel, and the host's block size (chosen from its largest member)
// is unchanged.
//
// A loop that writes a piece of a concat through a reshape (dk's centring
// beside cuDNN's dq and dv) is no host: forge-fold-attention-views makes
// that concat a view only when each piece's maker is an attention_grad or a
// one-result loop region, and a rider would turn the loop into a horizontal
// region (the concat would copy 3 x [B, T, C] again).
//
// Invariants: no op moves but constants (hoisted above an early host); the
// routine computes the same values; a host keeps its members' order, riders
// follow them. Runs at placement (CUDA), after every pass that rewrites
// regions (precision casts into them by kind, the accumulation split
// recomputes pure scalars per routine).
//===----------------------------------------------------------------------===//
#include "Passes.h"

#include "mlir/IR/IRMapping.h"

namespace mlir::forge {
#define GEN_PASS_DEF_MERGESCALARREGIONS
#include "Passes.h.inc"
} // namespace mlir::forge

using namespace mlir;
using namespace mlir::forge;

namespace {

/// A loop region as a member of a kernel: the region itself (standalone, or
/// inside a horizontal region) with the values it reads and makes outside
/// any region.
struct Member {
  FusionOp loop;
  SmallVector<Value> inputs, results;
};

bool oneElement(Type t) {
  auto r = dyn_cast<RankedTensorType>(t);
  return r && r.hasStaticShape() && r.getNumElements() == 1;
}

/// The loop members of `unit` (a loop region or a horizontal region of
/// them), or none when it is neither or a member's results are not each
/// yielded once.
SmallVector<Member> membersOf(FusionOp unit) {
  if (unit.getKind() == "loop") {
    if (unit.isViewRegion())
      return {};
    return {Member{unit, SmallVector<Value>(unit.getInputs()),
                   SmallVector<Value>(unit->getResults())}};
  }
  if (unit.getKind() != "horizontal")
    return {};
  SmallVector<Member> members;
  Operation *yield = unit.getBlock().getTerminator();
  for (Operation &op : unit.getBlock().without_terminator()) {
    auto loop = dyn_cast<FusionOp>(op);
    if (!loop || loop.getKind() != "loop" || loop.isViewRegion())
      return {};
    Member m{loop, {}, {}};
    for (Value v : loop.getInputs()) {
      auto arg = dyn_cast<BlockArgument>(v);
      if (!arg || arg.getOwner() != &unit.getBlock())
        return {};
      m.inputs.push_back(unit.getInputs()[arg.getArgNumber()]);
    }
    for (Value r : loop->getResults()) {
      SmallVector<unsigned> at;
      for (OpOperand &use : yield->getOpOperands())
        if (use.get() == r)
          at.push_back(use.getOperandNumber());
      if (at.size() != 1)
        return {};
      m.results.push_back(unit.getResult(at.front()));
    }
    members.push_back(std::move(m));
  }
  // Every result a member's (no argument yielded through): rebuilt from its
  // members, the region must give back all of them.
  size_t covered = 0;
  for (const Member &m : members)
    covered += m.results.size();
  if (covered != unit->getNumResults())
    return {};
  return members;
}

bool isScalar(const Member &m) { return llvm::all_of(m.loop->getResultTypes(), oneElement); }

/// Values replaced so far (a member's inputs were collected before): old -> new.
using Renamed = DenseMap<Value, Value>;

Value resolve(const Renamed &renamed, Value v) {
  for (auto it = renamed.find(v); it != renamed.end(); it = renamed.find(v))
    v = it->second;
  return v;
}

void replace(Renamed &renamed, Value old, Value now) {
  old.replaceAllUsesWith(now);
  renamed[old] = now;
}

/// One forge.fusion "horizontal" at `b`'s point with `members` in order; each
/// member's outside results are replaced by the new region's. `like` (the
/// host) lends its attributes.
FusionOp buildHorizontal(OpBuilder &b, Location loc, ArrayRef<Member> members, Operation *like,
                         Renamed &renamed) {
  SmallVector<Value> inputs;
  SmallVector<Type> types;
  for (const Member &m : members) {
    for (Value v : m.inputs)
      inputs.push_back(resolve(renamed, v));
    for (Value r : m.results)
      types.push_back(r.getType());
  }
  auto region = b.create<FusionOp>(loc, types, inputs, b.getStringAttr("horizontal"));
  for (NamedAttribute a : like->getDiscardableAttrs())
    region->setAttr(a.getName(), a.getValue());
  Block *body = new Block();
  region.getBody().push_back(body);
  OpBuilder inner = OpBuilder::atBlockEnd(body);
  SmallVector<Value> yielded;
  for (const Member &m : members) {
    IRMapping map;
    for (auto [own, outside] : llvm::zip(FusionOp(m.loop).getInputs(), m.inputs))
      map.map(own, body->addArgument(outside.getType(), outside.getLoc()));
    llvm::append_range(yielded, inner.clone(*m.loop, map)->getResults());
  }
  inner.create<YieldOp>(loc, yielded);
  unsigned r = 0;
  for (const Member &m : members)
    for (Value v : m.results)
      replace(renamed, v, region.getResult(r++));
  return region;
}

/// A lone member at `b`'s point as a loop region of its own again.
void rebuildLoop(OpBuilder &b, const Member &m, Renamed &renamed) {
  IRMapping map;
  for (auto [own, outside] : llvm::zip(FusionOp(m.loop).getInputs(), m.inputs))
    map.map(own, resolve(renamed, outside));
  Operation *clone = b.clone(*m.loop, map);
  for (auto [v, c] : llvm::zip(m.results, clone->getResults()))
    replace(renamed, v, c);
}

/// Whether loop region `u` makes a piece of a concat through a reshape read
/// only by it: a maker forge-fold-attention-views may write in place (dk's
/// centring beside cuDNN's dq and dv), if it stays a one-result loop. The
/// fold's other conditions (cuDNN, layout, alignment) are not known yet
/// (forge-select-library runs later): a concat it will not fold only costs
/// a host here.
bool makesConcatPiece(FusionOp u) {
  if (u.getKind() != "loop" || u->getNumResults() != 1 || !u->getResult(0).hasOneUse())
    return false;
  auto reshape = dyn_cast<ReshapeOp>(*u->getResult(0).getUsers().begin());
  return reshape && reshape->hasOneUse() && isa<ConcatOp>(*reshape->getUsers().begin());
}

struct MergeScalarRegionsPass
    : public mlir::forge::impl::MergeScalarRegionsBase<MergeScalarRegionsPass> {
  using MergeScalarRegionsBase::MergeScalarRegionsBase;

  void runOnOperation() override {
    bool changed = false;
    for (Block &block : getOperation().getBody())
      changed |= run(block);
    if (!changed)
      markAllAnalysesPreserved();
  }

  bool run(Block &block) {
    // Values replaced so far: members are collected before the rewrites; the
    // replaced ops are erased last (`renamed` keys on their values).
    Renamed renamed;
    SmallVector<Operation *> dead;
    // Units: the block's loop and horizontal regions with their members.
    SmallVector<FusionOp> units;
    DenseMap<Operation *, SmallVector<Member>> membersOfUnit;
    for (auto f : block.getOps<FusionOp>()) {
      SmallVector<Member> members = membersOf(f);
      if (members.empty())
        continue;
      units.push_back(f);
      membersOfUnit[f] = std::move(members);
    }
    auto allScalar = [&](FusionOp u) { return llvm::all_of(membersOfUnit[u], isScalar); };
    // Hosts: units with work beyond scalars (riders would only regroup scalars).
    SmallVector<FusionOp> hosts;
    DenseMap<Operation *, int64_t> operands; // per host: inputs plus results so far
    for (FusionOp u : units)
      if (!allScalar(u) && !makesConcatPiece(u)) {
        hosts.push_back(u);
        operands[u] = u->getNumOperands() + u->getNumResults();
      }
    if (hosts.empty())
      return false;
    // A lone pointwise op of one element (a loss's mean: sum / n) that can
    // ride becomes a loop region of its own first, at its place.
    bool wrapped = false;
    for (Operation &op : llvm::make_early_inc_range(block)) {
      auto iface = dyn_cast<ForgeOpInterface>(op);
      if (!iface || iface.getFusionClass() != FusionClass::Elementwise ||
          op.getNumResults() != 1 || !oneElement(op.getResult(0).getType()))
        continue;
      Member loose{nullptr, SmallVector<Value>(op.getOperands()),
                   SmallVector<Value>(op.getResults())};
      if (!hostFor(block, &op, loose, hosts))
        continue;
      FusionOp region = cloneIntoLoopRegion(&op);
      replace(renamed, op.getResult(0), region.getResult(0)); // members collected above read it
      dead.push_back(&op); // erased last: `renamed` keys on its result
      units.push_back(region);
      membersOfUnit[region] = membersOf(region);
      wrapped = true;
    }
    if (wrapped) // program order again
      llvm::sort(units, [](FusionOp a, FusionOp b) { return a->isBeforeInBlock(b); });

    DenseMap<Operation *, SmallVector<Member>> riders; // per host
    DenseMap<Operation *, SmallVector<Member>> stays;   // per donor unit
    SmallVector<FusionOp> donors;
    for (FusionOp u : units) {
      if (!allScalar(u))
        continue;
      bool moved = false;
      SmallVector<Member> kept;
      for (Member &m : membersOfUnit[u]) {
        FusionOp host = hostFor(block, u, m, hosts);
        int64_t cost = static_cast<int64_t>(m.inputs.size() + m.results.size());
        if (!host || operands[host] + cost > maxHorizontalOperands) {
          kept.push_back(m);
          continue;
        }
        operands[host] += cost;
        riders[host].push_back(m);
        moved = true;
      }
      if (moved) {
        donors.push_back(u);
        stays[u] = std::move(kept);
      }
    }
    if (donors.empty())
      return false;

    // Hosts first (their riders are cloned out of the donors), then what
    // stays of each donor, then the old regions (by then without uses).
    for (FusionOp host : hosts) {
      auto it = riders.find(host);
      if (it == riders.end())
        continue;
      SmallVector<Member> members = membersOfUnit[host];
      for (Member &m : it->second) {
        for (Value v : m.inputs) // early riders read constants, maybe defined below
          if (Operation *def = resolve(renamed, v).getDefiningOp();
              def && host->isBeforeInBlock(def))
            def->moveBefore(host);
        members.push_back(m);
      }
      OpBuilder b(host);
      buildHorizontal(b, host.getLoc(), members, host, renamed);
      dead.push_back(host);
    }
    for (FusionOp donor : donors) {
      ArrayRef<Member> kept = stays[donor];
      OpBuilder b(donor);
      if (kept.size() == 1 && donor.getKind() == "horizontal")
        rebuildLoop(b, kept.front(), renamed);
      else if (kept.size() > 1)
        buildHorizontal(b, donor.getLoc(), kept, donor, renamed);
      dead.push_back(donor);
    }
    for (Operation *op : dead) {
      assert(op->use_empty() && "every result was replaced");
      op->erase();
    }
    return true;
  }

  /// Where member `m` of the all-scalar unit `u` rides: late (only the
  /// return reads it) in the last host after `u`, early (it reads only
  /// arguments and constants) in the first host before its first reader;
  /// null when neither.
  FusionOp hostFor(Block &block, Operation *u, const Member &m, ArrayRef<FusionOp> hosts) {
    bool late = true;
    Operation *firstUser = nullptr;
    for (Value r : m.results)
      for (Operation *user : r.getUsers()) {
        user = block.findAncestorOpInBlock(*user);
        if (!user)
          return nullptr;
        late &= isa<func::ReturnOp>(user);
        if (!firstUser || user->isBeforeInBlock(firstUser))
          firstUser = user;
      }
    if (late) {
      for (FusionOp h : llvm::reverse(hosts))
        if (u->isBeforeInBlock(h))
          return h;
    }
    bool early = llvm::all_of(m.inputs, [&](Value v) {
      auto arg = dyn_cast<BlockArgument>(v);
      if (arg)
        return arg.getOwner() == &block;
      return isa_and_nonnull<ConstantOp>(v.getDefiningOp());
    });
    if (early && firstUser) {
      for (FusionOp h : hosts)
        if (h->isBeforeInBlock(firstUser))
          return h;
    }
    return nullptr;
  }
};

} // namespace
