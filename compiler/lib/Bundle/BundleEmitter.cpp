//===- BundleEmitter.cpp - forge IR -> .forge bundle ----------------------===//
//
// Invariants of the emitted Program (checked again by the runtime loader):
//  * every instruction's operands are defined by an earlier instruction, an
//    input or a constant;
//  * two arena tensors share bytes only if their live ranges [definition,
//    last use] are disjoint, so a kernel never reads an operand that aliases
//    its own output.
//
//===----------------------------------------------------------------------===//
#include "forge/Bundle/BundleEmitter.h"

#include "forge/Bundle/Conversion.h"
#include "forge/Dialect/ForgeDialect.h"
#include "forge/runtime/Bundle.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"

using namespace mlir;
using namespace mlir::forge;
namespace pb = ::forge::bundle;

namespace {

std::string locName(Location loc) {
  if (auto name = dyn_cast<NameLoc>(loc))
    return name.getName().str();
  if (auto fused = dyn_cast<FusedLoc>(loc))
    for (Location inner : fused.getLocations())
      if (auto name = locName(inner); !name.empty())
        return name;
  return "";
}

uint64_t alignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

struct Interval {
  int32_t tensor;
  int64_t begin, end; // instruction indices, inclusive
  uint64_t bytes;
};

/// First-fit offsets for intervals sorted by size (largest first); returns the arena size.
uint64_t planArena(std::vector<Interval> intervals, pb::Program &program) {
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
    program.mutable_tensors(iv.tensor)->set_arena_offset(offset);
    arena = std::max(arena, offset + size);
  }
  return arena;
}

} // namespace

LogicalResult mlir::forge::emitBundle(ModuleOp module, const BundleEmitOptions &options,
                                      ::forge::rt::BundleWriter &writer) {
  auto func = module.lookupSymbol<func::FuncOp>("main");
  if (!func)
    return module.emitError("no @main function to emit");
  if (!func.getBody().hasOneBlock())
    return func.emitError("@main must have a single block");

  pb::Program &program = writer.program();
  program.set_target(options.target);
  program.set_producer("forgec 0.1.0");
  program.set_source_hash(options.sourceHash);
  for (const auto &[k, v] : options.buildOptions)
    (*program.mutable_build_options())[k] = v;

  llvm::DenseMap<Value, int32_t> tensorOf;
  std::vector<uint8_t> constantData;
  auto addTensor = [&](Value v, pb::TensorInfo::Kind kind, std::string name) -> FailureOr<int32_t> {
    auto type = dyn_cast<RankedTensorType>(v.getType());
    if (!type || !type.hasStaticShape())
      return emitError(v.getLoc()) << "bundle tensors need static shapes, got " << v.getType();
    pb::DType dtype = dtypeFromType(type.getElementType());
    if (dtype == pb::DTYPE_UNSPECIFIED)
      return emitError(v.getLoc()) << "element type " << type.getElementType()
                                   << " has no runtime representation";
    pb::TensorInfo *info = program.add_tensors();
    info->set_name(std::move(name));
    info->set_dtype(dtype);
    for (int64_t d : type.getShape())
      info->add_shape(d);
    info->set_kind(kind);
    int32_t index = program.tensors_size() - 1;
    tensorOf[v] = index;
    return index;
  };

  // Inputs.
  for (auto [i, arg] : llvm::enumerate(func.getArguments())) {
    auto name = func.getArgAttrOfType<StringAttr>(i, "forge.name");
    auto index = addTensor(arg, pb::TensorInfo::INPUT, name ? name.str() : "input" + std::to_string(i));
    if (failed(index))
      return failure();
    program.add_inputs(*index);
  }

  // Constants first (they have no instruction), then one instruction per op.
  Block &body = func.getBody().front();
  int constantCount = 0;
  for (Operation &op : body) {
    auto constant = dyn_cast<ConstantOp>(op);
    if (!constant)
      continue;
    std::string name;
    if (auto init = op.getAttrOfType<StringAttr>("forge.initializer"))
      name = init.str();
    else
      name = "const" + std::to_string(constantCount);
    ++constantCount;
    auto index = addTensor(constant.getResult(), pb::TensorInfo::CONSTANT, name);
    if (failed(index))
      return failure();
    std::vector<uint8_t> bytes = elementsToBytes(constant.getValue());
    constantData.resize(alignUp(constantData.size(), ::forge::rt::kSectionAlignment));
    pb::TensorInfo *info = program.mutable_tensors(*index);
    info->set_section(0);
    info->set_data_offset(constantData.size());
    info->set_data_size(bytes.size());
    constantData.insert(constantData.end(), bytes.begin(), bytes.end());
  }
  writer.addSection("constants", constantData);

  std::vector<int64_t> defined(program.tensors_size(), -1), lastUse(program.tensors_size(), -1);
  int64_t step = 0;
  for (Operation &op : body) {
    if (isa<ConstantOp>(op))
      continue;
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
        int32_t index = tensorOf.lookup(v);
        pb::TensorInfo *info = program.mutable_tensors(index);
        if (info->kind() == pb::TensorInfo::INTERMEDIATE) {
          info->set_kind(pb::TensorInfo::OUTPUT);
          if (auto name = func.getResultAttrOfType<StringAttr>(i, "forge.name"))
            info->set_name(name.str());
        }
        program.add_outputs(index);
      }
      continue;
    }
    if (op.getDialect()->getNamespace() != "forge")
      return op.emitError("only forge ops can be emitted into a bundle");
    pb::Instruction *inst = program.add_instructions();
    if (failed(encodeInstruction(&op, *inst)))
      return failure();
    std::string node = locName(op.getLoc());
    inst->set_name(node);
    for (Value v : op.getOperands()) {
      auto it = tensorOf.find(v);
      if (it == tensorOf.end())
        return op.emitError("operand defined outside @main's body");
      inst->add_inputs(it->second);
      lastUse[it->second] = step;
    }
    for (auto [i, r] : llvm::enumerate(op.getResults())) {
      std::string name = node.empty() ? "t" + std::to_string(program.tensors_size())
                                      : node + (op.getNumResults() > 1 ? ":" + std::to_string(i) : "");
      auto index = addTensor(r, pb::TensorInfo::INTERMEDIATE, name);
      if (failed(index))
        return failure();
      defined.push_back(step);
      lastUse.push_back(step);
      inst->add_outputs(*index);
    }
    ++step;
  }

  // Memory plan: inputs live from the start, outputs to the end.
  std::vector<Interval> intervals;
  for (int32_t t = 0; t < program.tensors_size(); ++t) {
    const pb::TensorInfo &info = program.tensors(t);
    if (info.kind() == pb::TensorInfo::CONSTANT || info.kind() == pb::TensorInfo::PARAMETER)
      continue;
    uint64_t bytes = ::forge::rt::numElements({info.shape().begin(), info.shape().end()}) *
                     ::forge::rt::dtypeSize(info.dtype());
    int64_t begin = info.kind() == pb::TensorInfo::INPUT ? -1 : defined[t];
    int64_t end = info.kind() == pb::TensorInfo::OUTPUT || info.kind() == pb::TensorInfo::INPUT
                      ? step
                      : std::max(lastUse[t], defined[t]);
    intervals.push_back({t, begin, end, bytes});
  }
  program.set_arena_size(planArena(intervals, program));
  return success();
}
