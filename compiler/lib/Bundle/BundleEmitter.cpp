//===- BundleEmitter.cpp - forge IR -> .forge bundle ----------------------===//
//
// Serializes what the pipeline decided: placement and kernels
// (forge-generate-kernels), in-place updates, copies and arena offsets
// (forge-plan-memory). Invariants of the emitted Program (checked again by the
// runtime loader):
//  * every instruction's operands are defined by an earlier instruction, an
//    input or a constant;
//  * two arena tensors share bytes only if their live ranges are disjoint
//    (forge-plan-memory), except a reshape, whose result is its operand's
//    bytes (the copy is then from a buffer to itself, which executors skip).
//
//===----------------------------------------------------------------------===//
#include "forge/Bundle/BundleEmitter.h"

#include "forge/Conversion/Conversion.h"
#include "forge/Codegen/KernelGen.h"
#include "forge/Dialect/ForgeDialect.h"
#include "forge/runtime/Bundle.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <functional>
#include <map>

using namespace mlir;
using namespace mlir::forge;
namespace pb = ::forge::bundle;

namespace {

/// Emits the module's functions as routines sharing one tensor table.
class ProgramEmitter {
public:
  /// `cuda`: every instruction gets the placement the IR gives it
  /// (forge-select-library, forge-generate-kernels).
  ProgramEmitter(pb::Program &program, bool cuda) : program(program), cuda(cuda) {}

  LogicalResult emitRoutine(func::FuncOp func);
  std::vector<uint8_t> takeConstantData() { return std::move(constantData); }
  uint64_t arenaSize() const { return arena; }
  uint64_t localSize() const { return localBytes; }

private:
  FailureOr<int32_t> addTensor(Value v, pb::TensorInfo::Kind kind, std::string name);
  FailureOr<int32_t> persistentTensor(func::FuncOp func, unsigned argIndex);

  /// The body of a fused instruction (program.proto Instruction.body): the
  /// region's ops on LOCAL tensors, then a copy of each yielded value into
  /// the instruction's output. Writing the outputs last keeps in-place updates
  /// correct when the body runs op by op: every read of an updated tensor's
  /// old value comes first.
  LogicalResult emitBody(FusionOp fusion, pb::Instruction &inst, const std::string &node);

  /// Where a CUDA bundle runs `op`: the placement attributes of the IR.
  LogicalResult place(Operation &op, pb::Instruction &inst);

  // The steps of emitRoutine, in order.
  /// forge-schedule's streams and event edges (none: all on the compute stream).
  void emitStreams(func::FuncOp func, pb::Routine &routine);
  /// Arguments: routine inputs, or persistent tensors shared by name.
  LogicalResult emitArguments(func::FuncOp func, pb::Routine &routine);
  /// Results that update a persistent tensor, each written in place by its
  /// op (forge-plan-memory made a copy where that is not safe): value -> tensor.
  FailureOr<llvm::DenseMap<Value, int32_t>> inPlaceUpdates(func::FuncOp func);
  /// The routine's constants, in the constant section.
  LogicalResult emitConstants(Block &body);
  /// One op: an instruction (a fusion region with its body), or for a view
  /// placement only its results' tensors.
  LogicalResult emitOp(Operation &op, pb::Routine &routine,
                       const llvm::DenseMap<Value, int32_t> &inPlace);
  /// Outputs: op results returned once (forge-plan-memory copied the others).
  LogicalResult emitOutputs(func::FuncOp func, pb::Routine &routine);

  /// Result i of `op` as an arena tensor at the offset forge-plan-memory gave it.
  FailureOr<int32_t> addResult(Operation &op, unsigned i, const std::string &name);
  /// `bytes` as `info`'s data in the constant section (aligned).
  void appendSectionData(pb::TensorInfo &info, const std::vector<uint8_t> &bytes);

  pb::Program &program;
  bool cuda;
  llvm::DenseMap<Value, int32_t> tensorOf;
  llvm::StringMap<int32_t> persistentByName;
  std::vector<uint8_t> constantData;
  int constantCount = 0;
  uint64_t arena = 0;
  uint64_t localBytes = 0; // the largest body's LOCAL tensors
};

FailureOr<int32_t> ProgramEmitter::addTensor(Value v, pb::TensorInfo::Kind kind, std::string name) {
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
}

/// PARAMETER / STATE arguments are shared by name across routines.
FailureOr<int32_t> ProgramEmitter::persistentTensor(func::FuncOp func, unsigned i) {
  Value arg = func.getArgument(i);
  auto name = func.getArgAttrOfType<StringAttr>(i, "forge.name");
  auto kindAttr = func.getArgAttrOfType<StringAttr>(i, "forge.kind");
  if (!name)
    return func.emitError() << "persistent argument " << i << " has no forge.name";
  bool isParameter = kindAttr.getValue() == "parameter";
  auto it = persistentByName.find(name.getValue());
  if (it != persistentByName.end()) {
    const pb::TensorInfo &info = program.tensors(it->second);
    auto type = cast<RankedTensorType>(arg.getType());
    if (info.dtype() != dtypeFromType(type.getElementType()) ||
        !std::equal(info.shape().begin(), info.shape().end(), type.getShape().begin(),
                    type.getShape().end()))
      return func.emitError() << "persistent tensor '" << name.getValue()
                              << "' has different types in different routines";
    tensorOf[arg] = it->second;
    return it->second;
  }
  auto index = addTensor(arg, isParameter ? pb::TensorInfo::PARAMETER : pb::TensorInfo::STATE,
                         name.str());
  if (failed(index))
    return failure();
  pb::TensorInfo *info = program.mutable_tensors(*index);
  if (auto role = func.getArgAttrOfType<StringAttr>(i, "forge.role"))
    info->set_role(role.str());
  if (auto master = func.getArgAttrOfType<StringAttr>(i, "forge.copy_of"))
    info->set_copy_of(master.str());
  // Stored permuted (forge-permute-parameters): the initial value stays canonical in
  // the IR and the external file; the section gets the stored bytes.
  std::vector<int64_t> layoutPerm;
  if (auto perm = func.getArgAttrOfType<DenseI64ArrayAttr>(i, "forge.layout_perm")) {
    layoutPerm.assign(perm.asArrayRef().begin(), perm.asArrayRef().end());
    for (int64_t p : layoutPerm)
      info->add_layout_perm(p);
  }
  if (auto shard = func.getArgAttrOfType<DictionaryAttr>(i, "forge.shard")) {
    auto axis = shard.getAs<IntegerAttr>("axis"), size = shard.getAs<IntegerAttr>("size");
    auto group = shard.getAs<StringAttr>("group");
    if (!axis || !size || !group)
      return func.emitError() << "forge.shard of '" << name.getValue()
                              << "' needs axis, group and size";
    pb::Shard *s = info->mutable_shard();
    s->set_axis(axis.getInt());
    s->set_group(group.str());
    s->set_size(size.getInt());
    if (auto blocks = shard.getAs<IntegerAttr>("blocks"))
      s->set_blocks(blocks.getInt());
  }
  // Thin bundle: the initial value stays in the model's external-data file.
  auto module = func->getParentOfType<ModuleOp>();
  auto thin = module ? module->getAttrOfType<DictionaryAttr>("forge.external_weights") : nullptr;
  if (auto ref = thin && isParameter ? thin.getAs<ArrayAttr>(name.getValue()) : nullptr) {
    pb::ExternalData *ext = info->mutable_external();
    ext->set_location(cast<StringAttr>(ref[0]).str());
    ext->set_offset(static_cast<uint64_t>(cast<IntegerAttr>(ref[1]).getInt()));
    ext->set_length(static_cast<uint64_t>(cast<IntegerAttr>(ref[2]).getInt()));
    int64_t crc = cast<IntegerAttr>(ref[3]).getInt();
    ext->set_has_crc32(crc >= 0);
    ext->set_crc32(crc >= 0 ? static_cast<uint32_t>(crc) : 0);
    persistentByName[name.getValue()] = *index;
    return *index;
  }
  // Initial value: parameters always have one; state only when given.
  if (auto init = func.getArgAttrOfType<ElementsAttr>(i, "forge.initial_value")) {
    std::vector<uint8_t> bytes = elementsToBytes(init);
    if (!layoutPerm.empty()) {
      auto canonical = cast<ShapedType>(init.getType());
      bytes = ::forge::rt::transposeBytes(
          bytes, std::vector<int64_t>(canonical.getShape().begin(), canonical.getShape().end()),
          layoutPerm, ::forge::rt::dtypeSize(info->dtype()));
    }
    appendSectionData(*info, bytes);
  } else if (isParameter) {
    return func.emitError() << "parameter '" << name.getValue() << "' has no initial value";
  }
  persistentByName[name.getValue()] = *index;
  return *index;
}

LogicalResult ProgramEmitter::place(Operation &op, pb::Instruction &inst) {
  if (!cuda)
    return success();
  if (auto launch = op.getAttrOfType<DictionaryAttr>("forge.launch")) {
    auto kernel = launch.getAs<StringAttr>("kernel");
    auto grid = launch.getAs<IntegerAttr>("grid");
    auto block = launch.getAs<IntegerAttr>("block");
    if (!kernel || !grid || !block)
      return op.emitError("forge.launch needs kernel, grid and block");
    inst.set_placement(pb::KERNEL);
    pb::KernelLaunch *l = inst.mutable_launch();
    l->set_kernel(kernel.str());
    l->set_grid(static_cast<uint32_t>(grid.getInt()));
    l->set_block(static_cast<uint32_t>(block.getInt()));
    l->set_zero_outputs(launch.contains("zero_outputs"));
    l->set_copy_input(launch.contains("copy_input"));
    if (auto only = launch.getAs<DenseI64ArrayAttr>("zero_only"))
      for (int64_t o : only.asArrayRef()) {
        if (o < 0 || o >= op.getNumResults())
          return op.emitError("forge.launch zero_only names output ") << o << " of "
                                                                       << op.getNumResults();
        l->add_zero_only(static_cast<uint32_t>(o));
      }
    if (auto fault = launch.getAs<StringAttr>("fault"))
      l->set_fault(fault.str());
    if (auto shared = launch.getAs<IntegerAttr>("shared_bytes")) {
      if (shared.getInt() < 0 || shared.getInt() > ::forge::rt::kMaxDynamicSharedBytes)
        return op.emitError("forge.launch shared_bytes ")
               << shared.getInt() << " is outside 0.." << ::forge::rt::kMaxDynamicSharedBytes;
      l->set_shared_bytes(static_cast<uint32_t>(shared.getInt()));
    }
    return success();
  }
  if (op.hasAttr("forge.library")) {
    inst.set_placement(pb::LIBRARY);
    if (auto ws = op.getAttrOfType<DenseI64ArrayAttr>("forge.workspace")) {
      if (ws.size() != 2 || ws[0] < 0 || ws[1] <= 0)
        return op.emitError("forge.workspace must be [offset, bytes] in the arena");
      inst.set_workspace_offset(static_cast<uint64_t>(ws[0]));
      inst.set_workspace_bytes(static_cast<uint64_t>(ws[1]));
    }
    // cuDNN attention reading q/k/v in a fused projection (forge-fold-attention-views).
    if (auto rows = op.getAttrOfType<DenseI64ArrayAttr>("forge.row_strides")) {
      if (rows.size() != 3 || llvm::any_of(rows.asArrayRef(), [](int64_t r) { return r <= 0; }))
        return op.emitError("forge.row_strides must be three positive token strides (q, k, v)");
      auto *values = (*inst.mutable_attrs())["row_strides"].mutable_ints();
      for (int64_t r : rows.asArrayRef())
        values->add_values(r);
    }
    if (auto form = op.getAttrOfType<DictionaryAttr>("forge.matmul")) {
      auto i64 = [&](StringRef key) -> std::optional<int64_t> {
        auto a = form.getAs<IntegerAttr>(key);
        return a ? std::optional<int64_t>(a.getInt()) : std::nullopt;
      };
      auto f64 = [&](StringRef key) -> std::optional<double> {
        auto a = form.getAs<FloatAttr>(key);
        return a ? std::optional<double>(a.getValueAsDouble()) : std::nullopt;
      };
      auto m = i64("m"), n = i64("n"), k = i64("k"), batch = i64("batch");
      auto lhsStride = i64("lhs_batch_stride"), rhsStride = i64("rhs_batch_stride");
      auto transA = form.getAs<BoolAttr>("trans_a"), transB = form.getAs<BoolAttr>("trans_b");
      auto c = form.getAs<StringAttr>("c");
      auto epilogue = form.getAs<StringAttr>("epilogue");
      auto alpha = f64("alpha"), beta = f64("beta");
      if (!m || !n || !k || !batch || !lhsStride || !rhsStride || !transA || !transB || !c ||
          !alpha || !beta ||
          (c.getValue() != "none" && c.getValue() != "full" && c.getValue() != "bias"))
        return op.emitError("forge.matmul must have m, n, k, batch, trans_a, trans_b, "
                            "lhs_batch_stride, rhs_batch_stride, c (none|full|bias), alpha "
                            "and beta");
      pb::MatmulProblem *pr = inst.mutable_matmul();
      pr->set_m(*m);
      pr->set_n(*n);
      pr->set_k(*k);
      pr->set_batch(*batch);
      pr->set_trans_a(transA.getValue());
      pr->set_trans_b(transB.getValue());
      pr->set_lhs_batch_stride(*lhsStride);
      pr->set_rhs_batch_stride(*rhsStride);
      pr->set_c(c.getValue() == "full"   ? pb::MatmulProblem::FULL_C
                : c.getValue() == "bias" ? pb::MatmulProblem::BIAS_ROW
                                         : pb::MatmulProblem::NO_C);
      if (epilogue) {
        std::optional<pb::MatmulProblem::Epilogue> e =
            llvm::StringSwitch<std::optional<pb::MatmulProblem::Epilogue>>(epilogue.getValue())
                .Case("relu", pb::MatmulProblem::RELU)
                .Case("bias", pb::MatmulProblem::BIAS)
                .Case("bgrad_lhs", pb::MatmulProblem::BGRAD_LHS)
                .Case("bgrad_rhs", pb::MatmulProblem::BGRAD_RHS)
                .Case("gelu", pb::MatmulProblem::GELU)
                .Case("gelu_aux", pb::MatmulProblem::GELU_AUX)
                .Case("dgelu", pb::MatmulProblem::DGELU)
                .Case("dgelu_bgrad", pb::MatmulProblem::DGELU_BGRAD)
                .Case("relu_aux", pb::MatmulProblem::RELU_AUX)
                .Case("drelu", pb::MatmulProblem::DRELU)
                .Default(std::nullopt);
        if (!e)
          return op.emitError("forge.matmul's epilogue must be relu, relu_aux, drelu, bias, "
                              "bgrad_lhs, bgrad_rhs, gelu, gelu_aux, dgelu or dgelu_bgrad");
        pr->set_epilogue(*e);
      }
      pr->set_alpha(*alpha);
      pr->set_beta(*beta);
      // The operands' type; the runtime reads the output's from its tensor.
      pr->set_dtype(dtypeFromType(cast<RankedTensorType>(op.getOperand(0).getType()).getElementType()));
      if (auto scaled = form.getAs<BoolAttr>("scaled"); scaled && scaled.getValue()) {
        pr->set_scaled(true);
        pr->set_rhs_dtype(
            dtypeFromType(cast<RankedTensorType>(op.getOperand(1).getType()).getElementType()));
      }
    }
    return success();
  }
  auto placement = op.getAttrOfType<StringAttr>("forge.placement");
  if (placement && placement.getValue() == "copy") {
    inst.set_placement(pb::DEVICE_COPY);
    return success();
  }
  if (placement && placement.getValue() == "host") {
    inst.set_placement(pb::HOST);
    return success();
  }
  if (placement && placement.getValue() == "collective") {
    inst.set_placement(pb::COLLECTIVE);
    return success();
  }
  return op.emitError("has no placement for the CUDA target (forge-generate-kernels places "
                      "every op)");
}

LogicalResult ProgramEmitter::emitBody(FusionOp fusion, pb::Instruction &inst,
                                       const std::string &node) {
  llvm::DenseMap<Value, int32_t> local;
  for (auto [i, arg] : llvm::enumerate(fusion.getBlock().getArguments()))
    local[arg] = inst.inputs(static_cast<int>(i));
  uint64_t offset = 0;
  // The region's ops in order; a horizontal region's members inline, their
  // arguments bound to what the member reads and their results to what they yield.
  std::function<LogicalResult(Block &)> emitOps = [&](Block &block) -> LogicalResult {
    for (Operation &op : block.without_terminator()) {
      if (auto member = dyn_cast<FusionOp>(op)) {
        for (auto [arg, input] : llvm::zip(member.getBlock().getArguments(), member.getInputs()))
          local[arg] = local.lookup(input);
        if (failed(emitOps(member.getBlock())))
          return failure();
        for (auto [r, y] : llvm::zip(member.getResults(),
                                     member.getBlock().getTerminator()->getOperands()))
          local[r] = local.lookup(y);
        continue;
      }
      pb::Instruction *inner = inst.add_body();
      if (failed(encodeInstruction(&op, *inner)))
        return failure();
      inner->set_name(node);
      for (Value v : op.getOperands())
        inner->add_inputs(local.lookup(v));
      for (Value r : op.getResults()) {
        auto index = addTensor(r, pb::TensorInfo::LOCAL,
                               node + ":local" + std::to_string(local.size()));
        if (failed(index))
          return failure();
        pb::TensorInfo *info = program.mutable_tensors(*index);
        info->set_arena_offset(static_cast<int64_t>(offset));
        offset += ::forge::rt::alignUp(std::max<uint64_t>(::forge::rt::numElements(
                                                 {info->shape().begin(), info->shape().end()}) *
                                                 ::forge::rt::dtypeSize(info->dtype()),
                                             1),
                          ::forge::rt::kSectionAlignment);
        local[r] = *index;
        inner->add_outputs(*index);
      }
    }
    return success();
  };
  if (failed(emitOps(fusion.getBlock())))
    return failure();
  auto rows = fusion->getAttrOfType<DenseI64ArrayAttr>("forge.out_row_strides");
  if (rows && rows.size() != static_cast<int64_t>(fusion->getNumResults()))
    return fusion.emitError("forge.out_row_strides must be one token stride (or 0) per result");
  for (auto [i, v] : llvm::enumerate(fusion.getBlock().getTerminator()->getOperands())) {
    pb::Instruction *copy = inst.add_body();
    copy->set_op("copy");
    copy->set_name(node);
    copy->add_inputs(local.lookup(v));
    copy->add_outputs(inst.outputs(static_cast<int>(i)));
    if (rows && rows[i] > 0)
      (*copy->mutable_attrs())["out_row_strides"].mutable_ints()->add_values(rows[i]);
  }
  localBytes = std::max(localBytes, offset);
  return success();
}

void ProgramEmitter::appendSectionData(pb::TensorInfo &info, const std::vector<uint8_t> &bytes) {
  constantData.resize(::forge::rt::alignUp(constantData.size(), ::forge::rt::kSectionAlignment));
  info.set_section(0);
  info.set_data_offset(constantData.size());
  info.set_data_size(bytes.size());
  constantData.insert(constantData.end(), bytes.begin(), bytes.end());
}

FailureOr<int32_t> ProgramEmitter::addResult(Operation &op, unsigned i, const std::string &name) {
  auto offsets = op.getAttrOfType<DenseI64ArrayAttr>("forge.offsets");
  if (!offsets || offsets.size() != static_cast<int64_t>(op.getNumResults()))
    return op.emitError("has no arena offsets (forge-plan-memory did not run)");
  auto index = addTensor(op.getResult(i), pb::TensorInfo::INTERMEDIATE, name);
  if (failed(index))
    return failure();
  program.mutable_tensors(*index)->set_arena_offset(offsets[i]);
  return static_cast<int32_t>(*index);
}

void ProgramEmitter::emitStreams(func::FuncOp func, pb::Routine &routine) {
  auto streams = func->getAttrOfType<ArrayAttr>("forge.streams");
  if (!streams)
    return;
  for (Attribute a : streams)
    routine.add_streams(cast<StringAttr>(a).str());
  if (auto events = func->getAttrOfType<IntegerAttr>("forge.events"))
    routine.set_events(static_cast<uint32_t>(events.getInt()));
  if (auto joins = func->getAttrOfType<DenseI64ArrayAttr>("forge.joins"))
    for (int64_t e : joins.asArrayRef())
      routine.add_joins(static_cast<uint32_t>(e));
}

LogicalResult ProgramEmitter::emitArguments(func::FuncOp func, pb::Routine &routine) {
  for (auto [i, arg] : llvm::enumerate(func.getArguments())) {
    auto kind = func.getArgAttrOfType<StringAttr>(i, "forge.kind");
    if (kind && (kind.getValue() == "parameter" || kind.getValue() == "state")) {
      if (failed(persistentTensor(func, i)))
        return failure();
      continue;
    }
    auto name = func.getArgAttrOfType<StringAttr>(i, "forge.name");
    auto index = addTensor(arg, pb::TensorInfo::INPUT, name ? name.str() : "input" + std::to_string(i));
    if (failed(index))
      return failure();
    auto offset = func.getArgAttrOfType<IntegerAttr>(i, "forge.offset");
    if (!offset)
      return func.emitError() << "input " << i
                              << " has no arena offset (forge-plan-memory did not run)";
    program.mutable_tensors(*index)->set_arena_offset(offset.getInt());
    routine.add_inputs(*index);
  }
  return success();
}

FailureOr<llvm::DenseMap<Value, int32_t>> ProgramEmitter::inPlaceUpdates(func::FuncOp func) {
  auto ret = cast<func::ReturnOp>(func.getBody().front().getTerminator());
  llvm::DenseMap<Value, int32_t> inPlace;
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    auto updates = func.getResultAttrOfType<StringAttr>(i, "forge.updates");
    if (!updates)
      continue;
    auto target = persistentByName.find(updates.getValue());
    if (target == persistentByName.end())
      return func.emitError() << "result " << i << " updates unknown persistent tensor '"
                              << updates.getValue() << "'";
    Operation *def = v.getDefiningOp();
    if (!def || isa<ConstantOp>(def) || inPlace.count(v))
      return func.emitError() << "result " << i << " (updates '" << updates.getValue()
                              << "') is not written in place by an op of the routine";
    inPlace[v] = target->second;
  }
  return inPlace;
}

LogicalResult ProgramEmitter::emitConstants(Block &body) {
  for (auto constant : body.getOps<ConstantOp>()) {
    std::string name;
    if (auto init = constant->getAttrOfType<StringAttr>("forge.initializer"))
      name = init.str();
    else
      name = "const" + std::to_string(constantCount);
    ++constantCount;
    auto index = addTensor(constant.getResult(), pb::TensorInfo::CONSTANT, name);
    if (failed(index))
      return failure();
    appendSectionData(*program.mutable_tensors(*index), elementsToBytes(constant.getValue()));
  }
  return success();
}

LogicalResult ProgramEmitter::emitOp(Operation &op, pb::Routine &routine,
                                     const llvm::DenseMap<Value, int32_t> &inPlace) {
  if (op.getDialect()->getNamespace() != "forge")
    return op.emitError("only forge ops can be emitted into a bundle");
  auto fusion = dyn_cast<FusionOp>(op);
  if (fusion && !(cuda && (fusion->hasAttr("forge.launch") || fusion->hasAttr("forge.library"))))
    return op.emitError("fusion region without a kernel: the placement stage "
                        "(forge-generate-kernels, or forge-inline-fusions on the CPU) "
                        "did not run");
  if (auto placement = op.getAttrOfType<StringAttr>("forge.placement");
      placement && placement.getValue() == "view") {
    // No instruction: its results are its operand's bytes at the offsets
    // forge-plan-memory gave them (a split that cuDNN attention reads in place).
    if (!cuda)
      return op.emitError("a view placement is for CUDA bundles only");
    for (auto [i, r] : llvm::enumerate(op.getResults()))
      if (failed(addResult(op, static_cast<unsigned>(i),
                           sourceNodeName(op.getLoc()).str() + ":" + std::to_string(i))))
        return failure();
    return success();
  }
  pb::Instruction *inst = routine.add_instructions();
  if (failed(encodeInstruction(&op, *inst)))
    return failure();
  std::string node = sourceNodeName(op.getLoc()).str();
  inst->set_name(node);
  if (failed(place(op, *inst)))
    return failure();
  if (auto stream = op.getAttrOfType<IntegerAttr>("forge.stream"))
    inst->set_stream(static_cast<uint32_t>(stream.getInt()));
  if (auto event = op.getAttrOfType<IntegerAttr>("forge.event"))
    inst->set_event(static_cast<uint32_t>(event.getInt()));
  if (auto waits = op.getAttrOfType<DenseI64ArrayAttr>("forge.waits"))
    for (int64_t e : waits.asArrayRef())
      inst->add_waits(static_cast<uint32_t>(e));
  // Results written into a concat's bytes a token stride apart
  // (forge-fold-attention-views): cuDNN's output strides; a generated kernel
  // has them in its code, and a fusion's body states them on its final
  // copies (emitBody) for the CPU.
  if (auto rows = op.getAttrOfType<DenseI64ArrayAttr>("forge.out_row_strides")) {
    if (rows.size() != static_cast<int64_t>(op.getNumResults()) ||
        llvm::any_of(rows.asArrayRef(), [](int64_t r) { return r < 0; }))
      return op.emitError("forge.out_row_strides must be one token stride (or 0) per result");
    auto *values = (*inst->mutable_attrs())["out_row_strides"].mutable_ints();
    for (int64_t r : rows.asArrayRef())
      values->add_values(r);
  }
  OpCost cost;
  if (fusion)
    cost = fusion.getCost();
  else if (auto iface = dyn_cast<ForgeOpInterface>(op))
    cost = iface.getCost();
  inst->set_flops(static_cast<uint64_t>(std::max<int64_t>(cost.flops, 0)));
  inst->set_bytes(static_cast<uint64_t>(std::max<int64_t>(cost.bytes, 0)));
  for (Value v : op.getOperands()) {
    auto it = tensorOf.find(v);
    if (it == tensorOf.end())
      return op.emitError("operand defined outside the routine's body");
    inst->add_inputs(it->second);
  }
  for (auto [i, r] : llvm::enumerate(op.getResults())) {
    if (auto target = inPlace.find(r); target != inPlace.end()) {
      tensorOf[r] = target->second;
      inst->add_outputs(target->second);
      continue;
    }
    std::string name = node.empty()
                           ? "t" + std::to_string(program.tensors_size())
                           : node + (op.getNumResults() > 1 ? ":" + std::to_string(i) : "");
    FailureOr<int32_t> index = addResult(op, static_cast<unsigned>(i), name);
    if (failed(index))
      return failure();
    inst->add_outputs(*index);
  }
  if (fusion && failed(emitBody(fusion, *inst, node)))
    return failure();
  return success();
}

LogicalResult ProgramEmitter::emitOutputs(func::FuncOp func, pb::Routine &routine) {
  auto ret = cast<func::ReturnOp>(func.getBody().front().getTerminator());
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    if (func.getResultAttrOfType<StringAttr>(i, "forge.updates"))
      continue;
    int32_t index = tensorOf.lookup(v);
    pb::TensorInfo *info = program.mutable_tensors(index);
    if (info->kind() != pb::TensorInfo::INTERMEDIATE)
      return func.emitError() << "result " << i
                              << " is not an op result of its own (forge-plan-memory copies it)";
    info->set_kind(pb::TensorInfo::OUTPUT);
    if (auto name = func.getResultAttrOfType<StringAttr>(i, "forge.name"))
      info->set_name(name.str());
    routine.add_outputs(index);
  }
  return success();
}

LogicalResult ProgramEmitter::emitRoutine(func::FuncOp func) {
  if (!func.getBody().hasOneBlock())
    return func.emitError("routines must have a single block");
  pb::Routine *routine = program.add_routines();
  routine->set_name(func.getSymName() == "main" ? "forward" : func.getSymName().str());
  emitStreams(func, *routine);
  if (failed(emitArguments(func, *routine)))
    return failure();
  Block &body = func.getBody().front();
  auto arenaSize = func->getAttrOfType<IntegerAttr>("forge.arena_size");
  if (!arenaSize)
    return func.emitError("routine has no memory plan (forge-plan-memory did not run)");
  FailureOr<llvm::DenseMap<Value, int32_t>> inPlace = inPlaceUpdates(func);
  if (failed(inPlace) || failed(emitConstants(body)))
    return failure();
  // The instructions in program order (constants are not instructions): a
  // fusion region is one, with the kernel forge-generate-kernels gave it
  // (regions without one were inlined).
  for (Operation &op : body.without_terminator())
    if (!isa<ConstantOp>(op) && failed(emitOp(op, *routine, *inPlace)))
      return failure();
  if (failed(emitOutputs(func, *routine)))
    return failure();
  arena = std::max(arena, static_cast<uint64_t>(arenaSize.getInt()));
  return success();
}

} // namespace

LogicalResult mlir::forge::emitBundle(ModuleOp module, const BundleEmitOptions &options,
                                      ::forge::rt::BundleWriter &writer) {
  pb::Program &program = writer.program();
  program.set_target(options.target);
  program.set_producer("forgec 0.1.0");
  program.set_source_hash(options.sourceHash);
  for (const auto &[k, v] : options.buildOptions)
    (*program.mutable_build_options())[k] = v;
  program.set_training(options.buildOptions.count("mode") &&
                       options.buildOptions.at("mode") == "training");

  std::optional<CudaTarget> cuda = parseCudaTarget(options.target);
  if (!cuda && options.target != "cpu")
    return module.emitError() << "unknown target '" << options.target
                              << "' (cpu, cuda:sm_80, cuda:sm_89, cuda:sm_90)";

  ProgramEmitter emitter(program, cuda.has_value());
  bool any = false;
  for (auto func : module.getOps<func::FuncOp>()) {
    if (failed(emitter.emitRoutine(func)))
      return failure();
    any = true;
  }
  if (!any)
    return module.emitError("no function to emit");
  // A low-precision copy is stored as its parameter is (refreshCopies converts
  // elementwise); say so, so that readers show it canonical too.
  {
    llvm::StringMap<int> byName;
    for (int i = 0; i < program.tensors_size(); ++i)
      if (program.tensors(i).kind() == pb::TensorInfo::PARAMETER)
        byName[program.tensors(i).name()] = i;
    for (pb::TensorInfo &t : *program.mutable_tensors())
      if (!t.copy_of().empty() && t.layout_perm_size() == 0)
        if (auto it = byName.find(t.copy_of()); it != byName.end())
          *t.mutable_layout_perm() = program.tensors(it->second).layout_perm();
  }
  writer.addSection("constants", emitter.takeConstantData());

  if (cuda) {
    for (const pb::TensorInfo &t : program.tensors())
      if (::forge::rt::numElements({t.shape().begin(), t.shape().end()}) >= (int64_t(1) << 31))
        return module.emitError() << "tensor '" << t.name()
                                  << "' has 2^31 or more elements; CUDA kernels index with 32 bits";
    pb::KernelModule *km = program.mutable_kernel_module();
    km->set_arch(cuda->chip);
    km->set_ptx_section(-1);
    km->set_cubin_section(-1);
    if (!options.kernelDumpDir.empty() &&
        failed(dumpKernels(module, *cuda, options.kernelDumpDir)))
      return failure();
    TimingScope none;
    TimingScope &timing = options.timing ? *options.timing : none;
    TimingScope lowering = timing.nest("lower kernels to PTX");
    FailureOr<std::string> ptx = lowerKernelsToPtx(module, *cuda);
    lowering.stop();
    if (failed(ptx))
      return failure();
    // The module as bundled (kernels/ holds each kernel lowered alone).
    if (!options.kernelDumpDir.empty() && !ptx->empty()) {
      SmallString<256> path(options.kernelDumpDir);
      llvm::sys::path::append(path, "kernels.ptx");
      std::error_code ec;
      llvm::raw_fd_ostream os(path, ec);
      if (ec)
        return module.emitError() << "cannot write " << path << ": " << ec.message();
      os << *ptx;
    }
    if (!ptx->empty()) {
      km->set_ptx_section(static_cast<int32_t>(writer.addSection(
          "kernels.ptx", {reinterpret_cast<const uint8_t *>(ptx->data()), ptx->size()})));
      std::string error;
      TimingScope assembling = timing.nest("ptxas");
      FailureOr<std::optional<std::string>> cubin = assemblePtx(*ptx, cuda->chip, error);
      assembling.stop();
      if (failed(cubin))
        return module.emitError() << error;
      if (*cubin)
        km->set_cubin_section(static_cast<int32_t>(writer.addSection(
            "kernels.cubin",
            {reinterpret_cast<const uint8_t *>((*cubin)->data()), (*cubin)->size()})));
    }
    for (const pb::Routine &r : program.routines())
      for (const pb::Instruction &inst : r.instructions())
        if (inst.placement() == pb::KERNEL &&
            !llvm::is_contained(km->kernels(), inst.launch().kernel()))
          km->add_kernels(inst.launch().kernel());
  }
  program.set_arena_size(emitter.arenaSize());
  program.set_local_size(emitter.localSize());
  return success();
}
