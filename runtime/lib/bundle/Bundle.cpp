// Reading and writing `.forge` bundles (Bundle.h, ../shared/DESIGN.md §6).
//
// Invariants:
//  * A Bundle object exists only after parse() accepted every byte it will
//    ever hand out: header fields, region bounds, checksums, the Program
//    message and every reference inside it (tensor indices, sections, byte
//    ranges, arena bounds, routines: unique non-empty names, INPUT-kind
//    inputs, each arena tensor owned by at most one routine). Consumers (executors, forge-train) may therefore
//    index tensors and sections without re-checking.
//  * All arithmetic on untrusted 64-bit values goes through the overflow-safe
//    helpers below: a fuzzed file must produce an error, never UB or a crash.
//  * Every error message starts with the bundle's origin (its path or
//    "<memory>") and names the field, offset, section or tensor at fault.
//  * The writer produces byte-identical files for identical programs
//    (deterministic protobuf serialization, zeroed padding).
#include "forge/runtime/Bundle.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/ranges.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/stubs/logging.h>
#include <zlib.h>

#include "forge/runtime/FileUtil.h"

static_assert(std::endian::native == std::endian::little,
              "the bundle format is little-endian; a big-endian host needs byte swapping");

namespace forge::rt {

namespace {

// --- overflow-safe helpers ---------------------------------------------------

/// a + b, or false when it does not fit.
bool addOk(uint64_t a, uint64_t b, uint64_t &out) { return !__builtin_add_overflow(a, b, &out); }

/// [offset, offset + size) lies inside [0, limit).
bool rangeInside(uint64_t offset, uint64_t size, uint64_t limit) {
  uint64_t end;
  return addOk(offset, size, end) && end <= limit;
}

uint32_t crc32Of(std::span<const uint8_t> bytes) {
  // crc32_z takes a size_t length, so multi-GiB sections need no chunking.
  return static_cast<uint32_t>(::crc32_z(::crc32_z(0, nullptr, 0), bytes.data(), bytes.size()));
}

/// Bytes of a tensor with `shape` and `dtype`, or false on a negative
/// dimension or overflow.
bool tensorBytes(const bundle::TensorInfo &t, uint64_t &out) {
  uint64_t n = 1;
  bool empty = false;
  for (int64_t d : t.shape()) {
    if (d < 0)
      return false;
    empty |= d == 0;
  }
  if (!empty) {
    for (int64_t d : t.shape())
      if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n))
        return false;
  } else {
    n = 0;
  }
  return !__builtin_mul_overflow(n, static_cast<uint64_t>(dtypeSize(t.dtype())), &out);
}

std::string tensorLabel(const bundle::Program &p, int64_t index) {
  const std::string &name = p.tensors(static_cast<int>(index)).name();
  return name.empty() ? fmt::format("tensor #{}", index)
                      : fmt::format("tensor #{} '{}'", index, name);
}

std::string instructionLabel(const bundle::Instruction &inst, int index) {
  if (inst.name().empty())
    return fmt::format("instruction #{} ({})", index, inst.op());
  return fmt::format("instruction #{} ({} '{}')", index, inst.op(), inst.name());
}

bool isArenaKind(bundle::TensorInfo::Kind k) {
  return k == bundle::TensorInfo::INTERMEDIATE || k == bundle::TensorInfo::INPUT ||
         k == bundle::TensorInfo::OUTPUT;
}

// --- validation of the Program message --------------------------------------

Status validateSections(const bundle::Program &p, std::span<const uint8_t> data) {
  struct Range {
    uint64_t begin, end;
    int index;
  };
  std::vector<Range> ranges;
  ranges.reserve(p.sections_size());
  for (int i = 0; i < p.sections_size(); ++i) {
    const bundle::Section &s = p.sections(i);
    if (s.offset() % kSectionAlignment != 0)
      return Status::error("section #{} '{}': offset {} is not {}-byte aligned", i, s.name(),
                           s.offset(), kSectionAlignment);
    if (!rangeInside(s.offset(), s.size(), data.size()))
      return Status::error("section #{} '{}': bytes [{}, +{}) lie outside the {}-byte data region",
                           i, s.name(), s.offset(), s.size(), data.size());
    if (s.size() > 0)
      ranges.push_back({s.offset(), s.offset() + s.size(), i});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range &a, const Range &b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].begin < ranges[i - 1].end)
      return Status::error("sections #{} and #{} overlap (at data offset {})", ranges[i - 1].index,
                           ranges[i].index, ranges[i].begin);
  for (int i = 0; i < p.sections_size(); ++i) {
    const bundle::Section &s = p.sections(i);
    uint32_t crc = crc32Of(data.subspan(s.offset(), s.size()));
    if (crc != s.crc32())
      return Status::error("section #{} '{}': CRC32 mismatch (stored {:#010x}, computed {:#010x}); "
                           "the file is corrupted",
                           i, s.name(), s.crc32(), crc);
  }
  return Status::ok();
}

Status validateTensors(const bundle::Program &p) {
  for (int i = 0; i < p.tensors_size(); ++i) {
    const bundle::TensorInfo &t = p.tensors(i);
    std::string label = tensorLabel(p, i);
    if (!bundle::DType_IsValid(t.dtype()) || t.dtype() == bundle::DTYPE_UNSPECIFIED)
      return Status::error("{}: invalid dtype {}", label, static_cast<int>(t.dtype()));
    if (!bundle::TensorInfo::Kind_IsValid(t.kind()))
      return Status::error("{}: invalid kind {}", label, static_cast<int>(t.kind()));
    for (int d = 0; d < t.shape_size(); ++d)
      if (t.shape(d) < 0)
        return Status::error("{}: dimension {} is negative ({})", label, d, t.shape(d));
    uint64_t bytes;
    if (!tensorBytes(t, bytes))
      return Status::error("{}: shape [{}] x {} overflows 64-bit byte count", label,
                           fmt::join(t.shape(), ", "), dtypeName(t.dtype()));
    // numElements() returns int64: keep every element count representable.
    if (numElements({t.shape().begin(), t.shape().end()}) < 0)
      return Status::error("{}: element count overflows int64", label);

    if (t.kind() == bundle::TensorInfo::LOCAL) {
      if (t.arena_offset() < 0 || static_cast<uint64_t>(t.arena_offset()) % kSectionAlignment != 0)
        return Status::error("{}: local offset {} is negative or not {}-byte aligned", label,
                             t.arena_offset(), kSectionAlignment);
      if (!rangeInside(static_cast<uint64_t>(t.arena_offset()), bytes, p.local_size()))
        return Status::error("{}: local bytes [{}, +{}) exceed local_size {}", label,
                             t.arena_offset(), bytes, p.local_size());
    } else if (isArenaKind(t.kind())) {
      if (t.arena_offset() < 0)
        return Status::error("{}: negative arena_offset {}", label, t.arena_offset());
      if (static_cast<uint64_t>(t.arena_offset()) % kSectionAlignment != 0)
        return Status::error("{}: arena_offset {} is not {}-byte aligned", label, t.arena_offset(),
                             kSectionAlignment);
      if (!rangeInside(static_cast<uint64_t>(t.arena_offset()), bytes, p.arena_size()))
        return Status::error("{}: arena bytes [{}, +{}) exceed arena_size {}", label,
                             t.arena_offset(), bytes, p.arena_size());
    } else {
      // A split tensor (forgec --tp) is one of shard.size slices along
      // shard.axis; its initial bytes are the whole tensor's.
      if (t.has_shard()) {
        const bundle::Shard &s = t.shard();
        if ((t.kind() != bundle::TensorInfo::PARAMETER && t.kind() != bundle::TensorInfo::STATE) ||
            !t.copy_of().empty())
          return Status::error("{}: only parameters and their optimizer state can be split "
                               "(shard)",
                               label);
        if (s.size() < 1 || s.size() > (1 << 20) || s.axis() < 0 || s.axis() >= t.shape_size() ||
            s.group().empty() || s.blocks() < 0 || s.blocks() > (1 << 20) ||
            (s.blocks() > 1 && t.shape(static_cast<int>(s.axis())) % s.blocks() != 0))
          return Status::error("{}: shard axis {} of {} ranks of group '{}' is malformed for "
                               "shape [{}]",
                               label, s.axis(), s.size(), s.group(), fmt::join(t.shape(), ", "));
        if (bytes > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(s.size()))
          return Status::error("{}: the whole of a {}-way split overflows a 64-bit byte count",
                               label, s.size());
        bytes *= static_cast<uint64_t>(s.size());
      }
      // A STATE tensor without bytes starts as zeros; with bytes it is
      // checked like a parameter.
      if (t.kind() == bundle::TensorInfo::STATE && t.data_size() == 0)
        continue;
      // A thin bundle's parameter: its bytes come from an external-data file.
      if (t.has_external()) {
        const bundle::ExternalData &e = t.external();
        if (t.kind() != bundle::TensorInfo::PARAMETER || t.data_size() != 0)
          return Status::error("{}: external data on a {} tensor with {} embedded bytes", label,
                               t.kind() == bundle::TensorInfo::PARAMETER ? "parameter" : "non-parameter",
                               t.data_size());
        if (e.length() != bytes)
          return Status::error("{}: external data length {} does not match shape {} x {} ({} "
                               "bytes)",
                               label, e.length(), shapeString({t.shape().begin(), t.shape().end()}),
                               dtypeName(t.dtype()), bytes);
        if (e.location().empty() || e.location()[0] == '/' ||
            e.location().find("..") != std::string::npos)
          return Status::error("{}: external data location '{}' must be a relative path inside "
                               "the weights directory",
                               label, e.location());
        continue;
      }
      if (t.section() >= static_cast<uint32_t>(p.sections_size()))
        return Status::error("{}: section index {} out of range ({} sections)", label, t.section(),
                             p.sections_size());
      const bundle::Section &s = p.sections(static_cast<int>(t.section()));
      if (!rangeInside(t.data_offset(), t.data_size(), s.size()))
        return Status::error("{}: data bytes [{}, +{}) lie outside section #{} '{}' ({} bytes)",
                             label, t.data_offset(), t.data_size(), t.section(), s.name(),
                             s.size());
      if (t.data_size() != bytes)
        return Status::error("{}: data_size {} does not match shape {} x {} ({} bytes)", label,
                             t.data_size(), shapeString({t.shape().begin(), t.shape().end()}),
                             dtypeName(t.dtype()), bytes);
    }
  }
  // A stored permutation: of the tensor's rank, on persistent tensors only
  // (the runtime converts their values at its edges), each dim once; a copy
  // is stored as its parameter.
  for (int i = 0; i < p.tensors_size(); ++i) {
    const bundle::TensorInfo &t = p.tensors(i);
    if (t.layout_perm_size() == 0)
      continue;
    std::vector<bool> seen(static_cast<size_t>(t.shape_size()), false);
    bool ok = (t.kind() == bundle::TensorInfo::PARAMETER ||
               t.kind() == bundle::TensorInfo::STATE) &&
              t.layout_perm_size() == t.shape_size() && !t.has_shard();
    for (int64_t d : t.layout_perm()) {
      ok = ok && d >= 0 && d < t.shape_size() && !seen[static_cast<size_t>(d)];
      if (ok)
        seen[static_cast<size_t>(d)] = true;
    }
    if (!ok)
      return Status::error("{}: layout_perm [{}] is not a permutation of its {} dims on an "
                           "unsplit parameter or state tensor",
                           tensorLabel(p, i), fmt::join(t.layout_perm(), ", "), t.shape_size());
  }
  // Low-precision copies: a zero-initialized STATE tensor, float, named after
  // an f32 PARAMETER of its shape.
  for (int i = 0; i < p.tensors_size(); ++i) {
    const bundle::TensorInfo &t = p.tensors(i);
    if (t.copy_of().empty())
      continue;
    std::string label = tensorLabel(p, i);
    if (t.kind() != bundle::TensorInfo::STATE || t.data_size() != 0 || t.has_external() ||
        (t.dtype() != bundle::BF16 && t.dtype() != bundle::F16 && t.dtype() != bundle::F32))
      return Status::error("{}: a copy of parameter '{}' must be a STATE tensor of bf16, f16 or "
                           "f32 without initial bytes",
                           label, t.copy_of());
    const bundle::TensorInfo *master = nullptr;
    for (const bundle::TensorInfo &m : p.tensors())
      if (m.kind() == bundle::TensorInfo::PARAMETER && m.name() == t.copy_of())
        master = &m;
    if (!master)
      return Status::error("{}: copy_of names no parameter '{}'", label, t.copy_of());
    if (master->dtype() != bundle::F32 ||
        !std::equal(master->shape().begin(), master->shape().end(), t.shape().begin(),
                    t.shape().end()) ||
        !std::equal(master->layout_perm().begin(), master->layout_perm().end(),
                    t.layout_perm().begin(), t.layout_perm().end()))
      return Status::error("{}: copy of parameter '{}' ({} {}) must have its shape and stored "
                           "layout, and it must be f32",
                           label, t.copy_of(), dtypeName(master->dtype()),
                           shapeString({master->shape().begin(), master->shape().end()}));
  }
  return Status::ok();
}

Status validateInstruction(const bundle::Program &p, const bundle::Instruction &inst, int i);

/// The body of a fused instruction: plain instructions that read the fused
/// instruction's inputs or LOCAL tensors written earlier in the body, and
/// write LOCAL tensors or the fused instruction's outputs.
Status validateBody(const bundle::Program &p, const bundle::Instruction &fused, int i) {
  if (fused.op() != "fusion")
    return Status::error("{}: only op 'fusion' has a body", instructionLabel(fused, i));
  if (fused.body_size() == 0)
    return Status::error("{}: a fusion has an empty body", instructionLabel(fused, i));
  std::set<int32_t> readable(fused.inputs().begin(), fused.inputs().end());
  std::set<int32_t> outputs(fused.outputs().begin(), fused.outputs().end());
  for (int j = 0; j < fused.body_size(); ++j) {
    const bundle::Instruction &inner = fused.body(j);
    std::string where = fmt::format("{}: body {}", instructionLabel(fused, i),
                                    instructionLabel(inner, j));
    if (inner.body_size() > 0 || inner.placement() != bundle::PLACEMENT_DEFAULT)
      return Status::error("{}: body instructions have no body and no placement", where);
    FORGE_RETURN_IF_ERROR(validateInstruction(p, inner, j).prefix(where));
    for (int32_t t : inner.inputs())
      if (t >= 0 && !readable.count(t))
        return Status::error("{} reads {}, which is neither an input of the fusion nor a local "
                             "written before",
                             where, tensorLabel(p, t));
    for (int32_t t : inner.outputs()) {
      if (p.tensors(t).kind() != bundle::TensorInfo::LOCAL && !outputs.count(t))
        return Status::error("{} writes {}, which is neither local nor an output of the fusion",
                             where, tensorLabel(p, t));
      readable.insert(t);
    }
  }
  return Status::ok();
}

Status validateInstruction(const bundle::Program &p, const bundle::Instruction &inst, int i) {
  const int64_t numTensors = p.tensors_size();
  if (inst.op().empty())
    return Status::error("instruction #{}: empty op name", i);
  if (inst.body_size() > 0 || inst.op() == "fusion")
    FORGE_RETURN_IF_ERROR(validateBody(p, inst, i));
  for (int j = 0; j < inst.inputs_size(); ++j) {
    int64_t t = inst.inputs(j);
    if (t < -1 || t >= numTensors)
      return Status::error("{}: input {} refers to tensor {} (valid: -1 for absent, 0..{})",
                           instructionLabel(inst, i), j, t, numTensors - 1);
  }
  for (int j = 0; j < inst.outputs_size(); ++j) {
    int64_t t = inst.outputs(j);
    if (t < 0 || t >= numTensors)
      return Status::error("{}: output {} refers to tensor {} (valid: 0..{})",
                           instructionLabel(inst, i), j, t, numTensors - 1);
    // Constants live in the read-only (possibly mmap'd) file image.
    if (p.tensors(static_cast<int>(t)).kind() == bundle::TensorInfo::CONSTANT)
      return Status::error("{}: output {} writes {}, which is a constant",
                           instructionLabel(inst, i), j, tensorLabel(p, t));
  }
  if (inst.placement() < bundle::PLACEMENT_DEFAULT || inst.placement() > bundle::COLLECTIVE)
    return Status::error("{}: unknown placement {}", instructionLabel(inst, i),
                         static_cast<int>(inst.placement()));
  if (inst.placement() == bundle::KERNEL) {
    const bundle::KernelLaunch &l = inst.launch();
    const auto &kernels = p.kernel_module().kernels();
    if (std::find(kernels.begin(), kernels.end(), l.kernel()) == kernels.end())
      return Status::error("{}: kernel '{}' is not in the bundle's kernel module",
                           instructionLabel(inst, i), l.kernel());
    if (l.grid() < 1 || l.grid() > 0x7fffffffu || l.block() < 1 || l.block() > 1024)
      return Status::error("{}: kernel '{}' has launch grid {} block {} (need grid >= 1, block "
                           "1..1024)",
                           instructionLabel(inst, i), l.kernel(), l.grid(), l.block());
    if (l.shared_bytes() > kMaxDynamicSharedBytes)
      return Status::error("{}: kernel '{}' asks for {} bytes of shared memory a block (at most "
                           "{}: an sm_90 block's)",
                           instructionLabel(inst, i), l.kernel(), l.shared_bytes(),
                           kMaxDynamicSharedBytes);
  }
  // Outputs written with a token stride into a larger buffer (a concat's
  // pieces, forge-fold-attention-views): per output 0 (packed) or the
  // elements between the starts of consecutive rows of shape[2:], and every
  // row inside the arena.
  if (auto rows = inst.attrs().find("out_row_strides"); rows != inst.attrs().end()) {
    const std::string where = instructionLabel(inst, i);
    if (rows->second.value_case() != bundle::Attribute::kInts ||
        rows->second.ints().values_size() != inst.outputs_size())
      return Status::error("{}: attribute 'out_row_strides' must be one integer per output ({})",
                           where, inst.outputs_size());
    for (int j = 0; j < inst.outputs_size(); ++j) {
      const int64_t stride = rows->second.ints().values(j);
      if (stride == 0)
        continue;
      const bundle::TensorInfo &t = p.tensors(inst.outputs(j));
      int64_t tokens = 1, row = 1;
      for (int d = 0; d < t.shape_size(); ++d)
        (d < 2 ? tokens : row) *= t.shape(d);
      const uint64_t e = dtypeSize(t.dtype());
      if (!isArenaKind(t.kind()) || t.shape_size() < 3 || stride < row || tokens < 1 ||
          !rangeInside(static_cast<uint64_t>(t.arena_offset()),
                       (static_cast<uint64_t>(tokens - 1) * static_cast<uint64_t>(stride) +
                        static_cast<uint64_t>(row)) *
                           e,
                       p.arena_size()))
        return Status::error("{}: out_row_strides[{}] = {} does not place {}'s rows of {} "
                             "elements inside arena_size {} (needs an arena tensor of rank >= 3)",
                             where, j, stride, tensorLabel(p, inst.outputs(j)), row,
                             p.arena_size());
    }
  }
  if (inst.workspace_bytes() > 0 || inst.workspace_offset() > 0) {
    if (inst.placement() != bundle::LIBRARY)
      return Status::error("{}: only a library call has arena workspace",
                           instructionLabel(inst, i));
    if (inst.workspace_offset() % kSectionAlignment != 0 ||
        !rangeInside(inst.workspace_offset(), inst.workspace_bytes(), p.arena_size()))
      return Status::error("{}: workspace bytes [{}, +{}) are not {}-byte aligned inside "
                           "arena_size {}",
                           instructionLabel(inst, i), inst.workspace_offset(),
                           inst.workspace_bytes(), kSectionAlignment, p.arena_size());
  }
  return Status::ok();
}

/// The kernel module's sections exist (or are -1: absent).
Status validateKernelModule(const bundle::Program &p) {
  if (!p.has_kernel_module())
    return Status::ok();
  const bundle::KernelModule &km = p.kernel_module();
  for (int32_t s : {km.ptx_section(), km.cubin_section()})
    if (s < -1 || s >= p.sections_size())
      return Status::error("kernel module: section {} does not exist ({} sections)", s,
                           p.sections_size());
  if (!km.kernels().empty() && km.ptx_section() < 0 && km.cubin_section() < 0)
    return Status::error("kernel module: {} kernels but no PTX or cubin section",
                         km.kernels_size());
  return Status::ok();
}

/// forge-schedule's streams and events: "compute" first, then known kinds;
/// each event recorded by one instruction and waited for only after it (a wait
/// for an event not yet recorded would hang or read stale work), on another
/// stream than the recorder's.
Status validateSchedule(const bundle::Routine &routine) {
  const int streams = routine.streams_size();
  for (int s = 0; s < streams; ++s) {
    const std::string &name = routine.streams(s);
    bool known = s == 0 ? name == "compute"
                        : name == "collective" || computeStreamIndex(name) >= 1;
    if (!known)
      return Status::error("stream {} is '{}' (the first is \"compute\", the others "
                           "\"collective\" or \"compute.N\", N from 1 to {})",
                           s, name, kMaxComputeStreams - 1);
  }
  if (routine.events() > (1u << 20))
    return Status::error("{} events is more than a routine has", routine.events());
  std::vector<int> recordedBy(routine.events() + 1, -1);
  for (int i = 0; i < routine.instructions_size(); ++i) {
    const bundle::Instruction &inst = routine.instructions(i);
    if (inst.stream() >= static_cast<uint32_t>(std::max(streams, 1)))
      return Status::error("{}: stream {} of {}", instructionLabel(inst, i), inst.stream(),
                           std::max(streams, 1));
    for (uint32_t e : inst.waits()) {
      if (e < 1 || e > routine.events() || recordedBy[e] < 0)
        return Status::error("{}: waits for event {}, which no earlier instruction records",
                             instructionLabel(inst, i), e);
      if (routine.instructions(recordedBy[e]).stream() == inst.stream())
        return Status::error("{}: waits for event {} of its own stream",
                             instructionLabel(inst, i), e);
    }
    if (inst.event() != 0) {
      if (inst.event() > routine.events() || recordedBy[inst.event()] >= 0)
        return Status::error("{}: event {} is out of range or recorded twice",
                             instructionLabel(inst, i), inst.event());
      recordedBy[inst.event()] = i;
    }
  }
  for (uint32_t e : routine.joins())
    if (e < 1 || e > routine.events() || recordedBy[e] < 0)
      return Status::error("the end waits for event {}, which no instruction records", e);
  return Status::ok();
}

/// Per routine: a unique non-empty name, valid instructions, inputs of kind
/// INPUT, outputs in range; and every arena tensor (INPUT, OUTPUT,
/// INTERMEDIATE) referenced by at most one routine, since each routine's
/// arena plan is independent of the others'.
Status validateRoutines(const bundle::Program &p) {
  const int64_t numTensors = p.tensors_size();
  std::vector<int> owner(static_cast<size_t>(numTensors), -1);
  auto claim = [&](int64_t t, int r) -> Status {
    if (t < 0 || !isArenaKind(p.tensors(static_cast<int>(t)).kind()))
      return Status::ok();
    int &o = owner[static_cast<size_t>(t)];
    if (o >= 0 && o != r)
      return Status::error("{} is used by routines '{}' and '{}'; an input, output or "
                           "intermediate tensor belongs to one routine",
                           tensorLabel(p, t), p.routines(o).name(), p.routines(r).name());
    o = r;
    return Status::ok();
  };
  std::set<std::string> names;
  for (int r = 0; r < p.routines_size(); ++r) {
    const bundle::Routine &routine = p.routines(r);
    if (routine.name().empty())
      return Status::error("routine #{} has an empty name", r);
    if (!names.insert(routine.name()).second)
      return Status::error("routine #{}: the name '{}' is used twice", r, routine.name());
    Status s = [&]() -> Status {
      for (int i = 0; i < routine.instructions_size(); ++i) {
        const bundle::Instruction &inst = routine.instructions(i);
        FORGE_RETURN_IF_ERROR(validateInstruction(p, inst, i));
        for (const auto *list : {&inst.inputs(), &inst.outputs()})
          for (int32_t t : *list)
            if (t >= 0 && p.tensors(t).kind() == bundle::TensorInfo::LOCAL)
              return Status::error("{} uses {}, a local of a fusion body, outside a body",
                                   instructionLabel(inst, i), tensorLabel(p, t));
        for (int32_t t : inst.inputs())
          FORGE_RETURN_IF_ERROR(claim(t, r));
        for (int32_t t : inst.outputs())
          FORGE_RETURN_IF_ERROR(claim(t, r));
      }
      FORGE_RETURN_IF_ERROR(validateSchedule(routine));
      for (int j = 0; j < routine.inputs_size(); ++j) {
        int64_t t = routine.inputs(j);
        if (t < 0 || t >= numTensors)
          return Status::error("input {} refers to tensor {} (valid: 0..{})", j, t,
                               numTensors - 1);
        // Inputs are written by the caller, so they must live in the arena.
        if (p.tensors(static_cast<int>(t)).kind() != bundle::TensorInfo::INPUT)
          return Status::error("input {} ({}) is not of kind INPUT", j, tensorLabel(p, t));
        FORGE_RETURN_IF_ERROR(claim(t, r));
      }
      for (int j = 0; j < routine.outputs_size(); ++j) {
        int64_t t = routine.outputs(j);
        if (t < 0 || t >= numTensors)
          return Status::error("output {} refers to tensor {} (valid: 0..{})", j, t,
                               numTensors - 1);
        if (p.tensors(static_cast<int>(t)).kind() == bundle::TensorInfo::LOCAL)
          return Status::error("output {} ({}) is a local of a fusion body", j,
                               tensorLabel(p, t));
        FORGE_RETURN_IF_ERROR(claim(t, r));
      }
      return Status::ok();
    }();
    if (!s.isOk())
      return s.prefix(fmt::format("routine #{} '{}'", r, routine.name()));
  }
  return Status::ok();
}

} // namespace

// --- BundleWriter -------------------------------------------------------------

uint32_t BundleWriter::addSection(std::string name, std::span<const uint8_t> bytes) {
  uint64_t offset = alignUp(data_.size(), kSectionAlignment);
  data_.resize(offset, 0);
  data_.insert(data_.end(), bytes.begin(), bytes.end());
  bundle::Section *s = program_.add_sections();
  s->set_name(std::move(name));
  s->set_offset(offset);
  s->set_size(bytes.size());
  s->set_crc32(crc32Of(bytes));
  return static_cast<uint32_t>(program_.sections_size() - 1);
}

std::vector<uint8_t> BundleWriter::serialize() {
  std::string programBytes;
  {
    google::protobuf::io::StringOutputStream sos(&programBytes);
    google::protobuf::io::CodedOutputStream cos(&sos);
    cos.SetSerializationDeterministic(true);
    program_.SerializeToCodedStream(&cos);
  }
  BundleHeader h{};
  std::memcpy(h.magic, kBundleMagic, sizeof(h.magic));
  h.formatVersion = kBundleFormatVersion;
  h.headerSize = sizeof(BundleHeader);
  h.programOffset = sizeof(BundleHeader);
  h.programSize = programBytes.size();
  h.dataOffset = alignUp(h.programOffset + h.programSize, kSectionAlignment);
  h.dataSize = data_.size();
  h.fileSize = h.dataOffset + h.dataSize;
  h.programCrc32 =
      crc32Of({reinterpret_cast<const uint8_t *>(programBytes.data()), programBytes.size()});

  std::vector<uint8_t> out(h.fileSize, 0);
  std::memcpy(out.data(), &h, sizeof(h));
  std::memcpy(out.data() + h.programOffset, programBytes.data(), programBytes.size());
  if (!data_.empty())
    std::memcpy(out.data() + h.dataOffset, data_.data(), data_.size());
  return out;
}

Status BundleWriter::writeFile(const std::string &path) {
  return writeFileAtomically(path, serialize());
}

// --- Bundle -------------------------------------------------------------------

Bundle::~Bundle() {
  if (mapped_)
    ::munmap(const_cast<uint8_t *>(mapped_), mappedSize_);
}

Expected<std::unique_ptr<Bundle>> Bundle::open(const std::string &path) {
  // O_NONBLOCK: opening a FIFO (or other special file) must not wait for a
  // writer; it is refused as not a regular file below. No effect on regular files.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return Status::error("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    Status s = Status::error("{}: cannot stat: {}", path, std::strerror(errno));
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::error("{}: not a regular file", path);
  }
  if (st.st_size < static_cast<off_t>(sizeof(BundleHeader))) {
    // Too small to map usefully (or empty, which mmap refuses): read it and
    // let parse() produce the precise message (bad magic vs. truncated).
    std::vector<uint8_t> small(static_cast<size_t>(st.st_size));
    ssize_t n = small.empty() ? 0 : ::pread(fd, small.data(), small.size(), 0);
    ::close(fd);
    if (n != static_cast<ssize_t>(small.size()))
      return Status::error("{}: cannot read: {}", path, std::strerror(errno));
    return fromBytes(std::move(small), path);
  }
  size_t size = static_cast<size_t>(st.st_size);
  void *m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED)
    return Status::error("{}: mmap of {} bytes failed: {}", path, size, std::strerror(errno));
  std::unique_ptr<Bundle> b(new Bundle());
  b->origin_ = path;
  b->mapped_ = static_cast<const uint8_t *>(m);
  b->mappedSize_ = size;
  FORGE_RETURN_IF_ERROR(b->parse({b->mapped_, b->mappedSize_}));
  return b;
}

Expected<std::unique_ptr<Bundle>> Bundle::fromBytes(std::vector<uint8_t> bytes,
                                                    std::string origin) {
  std::unique_ptr<Bundle> b(new Bundle());
  b->origin_ = std::move(origin);
  b->owned_ = std::move(bytes);
  FORGE_RETURN_IF_ERROR(b->parse({b->owned_.data(), b->owned_.size()}));
  return b;
}

Status Bundle::parse(std::span<const uint8_t> file) {
  Status s = [&]() -> Status {
    if (file.size() < sizeof(kBundleMagic) ||
        std::memcmp(file.data(), kBundleMagic, sizeof(kBundleMagic)) != 0)
      return Status::error("not a forge bundle (bad magic; expected \"FORGEBN\\0\" at offset 0)");
    if (file.size() < sizeof(BundleHeader))
      return Status::error("truncated: {} bytes, smaller than the {}-byte header", file.size(),
                           sizeof(BundleHeader));
    BundleHeader h;
    std::memcpy(&h, file.data(), sizeof(h)); // the mapping need not be aligned for it
    if (h.formatVersion == 0)
      return Status::error("header field formatVersion (offset 8) is 0, which is invalid");
    if (h.formatVersion < kOldestBundleFormatVersion)
      return Status::error("bundle format version {} is older than this forge-train supports "
                           "({}..{}); recompile the model with this forgec",
                           h.formatVersion, kOldestBundleFormatVersion, kBundleFormatVersion);
    if (h.formatVersion > kBundleFormatVersion)
      return Status::error("bundle format version {} is newer than this forge-train supports "
                           "({}..{}); use a newer forge-train or recompile the model",
                           h.formatVersion, kOldestBundleFormatVersion, kBundleFormatVersion);
    if (h.headerSize != sizeof(BundleHeader))
      return Status::error("header field headerSize (offset 12) is {}, expected {}", h.headerSize,
                           sizeof(BundleHeader));
    if (h.fileSize != file.size())
      return Status::error(
          "{}: header field fileSize (offset 48) says {} bytes, the file has {} bytes",
          h.fileSize > file.size() ? "truncated" : "size mismatch", h.fileSize, file.size());
    if (h.reserved != 0)
      return Status::error("header field reserved (offset 60) is {:#x}, expected 0", h.reserved);
    if (h.programOffset < h.headerSize)
      return Status::error("header field programOffset (offset 16) is {}, inside the header",
                           h.programOffset);
    if (!rangeInside(h.programOffset, h.programSize, file.size()))
      return Status::error("program bytes [{}, +{}) (header offsets 16/24) lie outside the "
                           "{}-byte file",
                           h.programOffset, h.programSize, file.size());
    if (h.programSize > static_cast<uint64_t>(std::numeric_limits<int>::max()))
      return Status::error("header field programSize (offset 24) is {}, over the 2 GiB protobuf "
                           "limit",
                           h.programSize);
    if (h.dataOffset % kSectionAlignment != 0)
      return Status::error("header field dataOffset (offset 32) is {}, not {}-byte aligned",
                           h.dataOffset, kSectionAlignment);
    if (h.dataOffset < h.programOffset + h.programSize)
      return Status::error("header field dataOffset (offset 32) is {}, overlapping the program "
                           "bytes [{}, {})",
                           h.dataOffset, h.programOffset, h.programOffset + h.programSize);
    if (!rangeInside(h.dataOffset, h.dataSize, file.size()))
      return Status::error("data bytes [{}, +{}) (header offsets 32/40) lie outside the {}-byte "
                           "file",
                           h.dataOffset, h.dataSize, file.size());

    std::span<const uint8_t> programBytes = file.subspan(h.programOffset, h.programSize);
    uint32_t crc = crc32Of(programBytes);
    if (crc != h.programCrc32)
      return Status::error("program CRC32 mismatch (header offset 56 stores {:#010x}, computed "
                           "{:#010x}); the file is corrupted",
                           h.programCrc32, crc);
    bool parsed;
    {
      // Our own error says what failed; keep protobuf's log (e.g. invalid
      // UTF-8 in a string field) off the user's terminal.
      google::protobuf::LogSilencer silence;
      parsed = program_.ParseFromArray(programBytes.data(), static_cast<int>(programBytes.size()));
    }
    if (!parsed)
      return Status::error("the program message ({} bytes at offset {}) is not a valid "
                           "forge.bundle.Program",
                           h.programSize, h.programOffset);
    data_ = file.subspan(h.dataOffset, h.dataSize);

    FORGE_RETURN_IF_ERROR(validateSections(program_, data_));
    FORGE_RETURN_IF_ERROR(validateTensors(program_));
    FORGE_RETURN_IF_ERROR(validateKernelModule(program_));
    FORGE_RETURN_IF_ERROR(validateRoutines(program_));
    return Status::ok();
  }();
  if (!s.isOk()) {
    program_.Clear();
    data_ = {};
    s.prefix(origin_);
  }
  return s;
}

std::span<const uint8_t> Bundle::section(uint32_t index) const {
  if (index >= static_cast<uint32_t>(program_.sections_size()))
    return {};
  const bundle::Section &s = program_.sections(static_cast<int>(index));
  return data_.subspan(s.offset(), s.size());
}

std::span<const uint8_t> Bundle::tensorData(const bundle::TensorInfo &tensor) const {
  if (tensor.kind() != bundle::TensorInfo::CONSTANT &&
      tensor.kind() != bundle::TensorInfo::PARAMETER &&
      tensor.kind() != bundle::TensorInfo::STATE)
    return {};
  if (tensor.kind() == bundle::TensorInfo::STATE && tensor.data_size() == 0)
    return {};
  std::span<const uint8_t> s = section(tensor.section());
  // Tensors of this bundle were validated; this guards foreign TensorInfos.
  if (!rangeInside(tensor.data_offset(), tensor.data_size(), s.size()))
    return {};
  return s.subspan(tensor.data_offset(), tensor.data_size());
}

} // namespace forge::rt

namespace forge::rt {

Status checkScheduleRaces(const bundle::Program &p) {
  // Byte ranges an instruction touches: arena tensors at their offsets, each
  // persistent tensor in an address space of its own above the arena.
  struct Range {
    uint64_t lo, hi;
    int32_t tensor; // -1: a workspace
  };
  const uint64_t persistentBase = p.arena_size() + kSectionAlignment;
  auto rangeOf = [&](int32_t t) -> Range {
    const bundle::TensorInfo &info = p.tensors(t);
    if (isArenaKind(info.kind())) {
      uint64_t lo = static_cast<uint64_t>(info.arena_offset());
      return {lo, lo + std::max<uint64_t>(byteSize(info), 1), t};
    }
    uint64_t lo = persistentBase + static_cast<uint64_t>(t) * 2;
    return {lo, lo + 1, t};
  };
  for (const bundle::Routine &r : p.routines()) {
    const int n = r.instructions_size();
    const size_t streams = std::max(r.streams_size(), 1);
    // seen[i][s]: the last instruction of stream s that completes before i
    // starts (-1: none; every stream starts after the inputs arrived).
    std::vector<std::vector<int>> seen(n), after(n);
    std::vector<std::vector<int>> cur(streams, std::vector<int>(streams, -1));
    std::vector<int> recorder(r.events() + 1, -1);
    for (int i = 0; i < n; ++i) {
      const bundle::Instruction &inst = r.instructions(i);
      const size_t s = inst.stream();
      for (uint32_t e : inst.waits()) {
        const std::vector<int> &then = after[recorder[e]];
        for (size_t u = 0; u < streams; ++u)
          cur[s][u] = std::max(cur[s][u], then[u]);
      }
      seen[i] = cur[s];
      cur[s][s] = i;
      after[i] = cur[s];
      if (inst.event())
        recorder[inst.event()] = i;
    }
    std::vector<std::vector<Range>> reads(n), writes(n);
    for (int i = 0; i < n; ++i) {
      const bundle::Instruction &inst = r.instructions(i);
      for (int32_t t : inst.inputs())
        if (t >= 0 && p.tensors(t).kind() != bundle::TensorInfo::CONSTANT)
          reads[i].push_back(rangeOf(t));
      // A reshape whose result is its operand's bytes (the plan's rule) copies nothing.
      const bool alias = inst.placement() == bundle::DEVICE_COPY && inst.inputs_size() == 1 &&
                         inst.outputs_size() == 1 && inst.inputs(0) >= 0 &&
                         rangeOf(inst.inputs(0)).lo == rangeOf(inst.outputs(0)).lo;
      for (int32_t t : inst.outputs())
        if (!alias)
          writes[i].push_back(rangeOf(t));
      if (inst.workspace_bytes())
        writes[i].push_back({inst.workspace_offset(), inst.workspace_offset() + inst.workspace_bytes(), -1});
    }
    auto overlap = [](const std::vector<Range> &a, const std::vector<Range> &b) -> const Range * {
      for (const Range &x : a)
        for (const Range &y : b)
          if (x.lo < y.hi && y.lo < x.hi)
            return &x;
      return nullptr;
    };
    for (int j = 0; j < n; ++j) {
      const size_t sj = r.instructions(j).stream();
      for (int i = 0; i < j; ++i) {
        const size_t si = r.instructions(i).stream();
        if (si == sj || seen[j][si] >= i)
          continue; // i completes before j starts
        const Range *hit = overlap(writes[i], reads[j]);
        if (!hit)
          hit = overlap(writes[i], writes[j]);
        if (!hit)
          hit = overlap(reads[i], writes[j]);
        if (hit)
          return Status::error(
              "routine '{}': {} (stream {}) and {} (stream {}) may run at once and both touch "
              "{} bytes [{}, {}), one writing them",
              r.name(), instructionLabel(r.instructions(i), i), si,
              instructionLabel(r.instructions(j), j), sj,
              hit->tensor >= 0 ? tensorLabel(p, hit->tensor) : std::string("workspace"),
              hit->lo, hit->hi);
      }
    }
  }
  return Status::ok();
}

} // namespace forge::rt
