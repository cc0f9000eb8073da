// The `.forge` bundle file (../shared/DESIGN.md §6).
//
// Layout (all integers little-endian):
//   [0, 64)          BundleHeader
//   [program_offset, +program_size)   serialized forge.bundle.Program
//   [data_offset, +data_size)         sections, each 64-byte aligned relative to
//                                     data_offset (which is itself 64-aligned)
// Invariants checked by Bundle::open/fromBytes before anything else touches
// the data: magic, format version, header size, every offset and size inside
// the file, the program checksum, each section's CRC32, and every tensor and
// instruction reference (tensor indices, sections, byte ranges, arena bounds)
// and the routines (docs/bundle-format.md).
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "forge/runtime/Status.h"
#include "forge/runtime/Tensor.h"
#include "program.pb.h"

namespace forge::rt {

inline constexpr char kBundleMagic[8] = {'F', 'O', 'R', 'G', 'E', 'B', 'N', 0};
/// Version 2: instructions live in named routines (Program.routines) and
/// tensors may be STATE. Version-1 files are refused ("recompile").
inline constexpr uint32_t kBundleFormatVersion =
    8; // 3: placements, kernel module, external data; 4: kernel faults; 5: copy_input launches
       // (scatters), eval sample weights, dropout masks; 6: fusion instructions with bodies, LOCAL
       // tensors; 7: low-precision copies of parameters (TensorInfo.copy_of); 8: kernels' dynamic
       // shared memory (KernelLaunch.shared_bytes)
/// The oldest version readers still take: a version 7 bundle is a version 8
/// one without dynamic shared memory (writers always write kBundleFormatVersion).
inline constexpr uint32_t kOldestBundleFormatVersion = 7;
/// The most dynamic shared memory a kernel launch may ask for (an sm_90
/// block's: 227 KiB; the executor checks the device's own limit).
inline constexpr uint32_t kMaxDynamicSharedBytes = 227 * 1024;
inline constexpr uint64_t kSectionAlignment = 64;

/// Bytes per row of a ReLU bitmask over rows of n elements (the RELU_AUX
/// epilogue's output, the relu_bitmask op's): n bits rounded up to 128.
inline int64_t reluBitmaskRowBytes(int64_t n) { return (n + 127) / 128 * 16; }

/// A tensor's static shape, as a vector.
inline std::vector<int64_t> shapeOf(const bundle::TensorInfo &t) {
  return {t.shape().begin(), t.shape().end()};
}

/// TensorInfo.layout_perm: a stored-permuted persistent tensor's canonical
/// (ONNX) shape, and the inverse permutation that gives it from the stored one.
inline std::vector<int64_t> inversePerm(const bundle::TensorInfo &t) {
  std::vector<int64_t> inv(static_cast<size_t>(t.layout_perm_size()));
  for (int i = 0; i < t.layout_perm_size(); ++i)
    inv[static_cast<size_t>(t.layout_perm(i))] = i;
  return inv;
}
inline std::vector<int64_t> canonicalShape(const bundle::TensorInfo &t) {
  std::vector<int64_t> shape = shapeOf(t);
  if (t.layout_perm_size() == 0)
    return shape;
  std::vector<int64_t> out;
  for (int64_t p : inversePerm(t))
    out.push_back(shape[static_cast<size_t>(p)]);
  return out;
}

/// A tensor's bytes (of a loaded bundle: the loader checked that they fit).
inline uint64_t byteSize(const bundle::TensorInfo &t) {
  return static_cast<uint64_t>(numElements(shapeOf(t))) * dtypeSize(t.dtype());
}

/// A build option's value (forgec's `build_options`); empty when absent.
inline std::string buildOption(const bundle::Program &p, const std::string &key) {
  auto it = p.build_options().find(key);
  return it == p.build_options().end() ? std::string() : it->second;
}

/// v rounded up to a multiple of a (sections, the arena, device buffers).
inline uint64_t alignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/// The CUDA executor's one device allocation: the arena, then each
/// parameter, state and constant tensor, each at a multiple of
/// kDeviceAlign, then the library workspace (kGemmWorkspaceBytes for
/// cuBLASLt, or more when a cuDNN call fits in no arena workspace) once per
/// compute stream, and a fault word.
constexpr uint64_t kDeviceAlign = 256;
constexpr uint64_t kGemmWorkspaceBytes = uint64_t(32) << 20;
/// The compute stream a schedule's stream name is: 0 for "compute", N for
/// "compute.N" (1 to kMaxComputeStreams - 1), -1 for anything else (the
/// "collective" stream, or a name no executor knows).
constexpr int kMaxComputeStreams = 17;
inline int computeStreamIndex(const std::string &name) {
  if (name == "compute")
    return 0;
  if (name.rfind("compute.", 0) != 0 || name.size() == 8)
    return -1;
  int n = 0;
  for (size_t i = 8; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9')
      return -1;
    n = n * 10 + (name[i] - '0');
    if (n >= kMaxComputeStreams)
      return -1;
  }
  return n >= 1 ? n : -1;
}
/// Compute streams of the routines' schedules: 1 + the largest N of their
/// "compute.N" streams; each has a library workspace of its own.
inline uint64_t computeStreamCount(const bundle::Program &p) {
  int n = 1;
  for (const bundle::Routine &r : p.routines())
    for (const std::string &name : r.streams())
      n = std::max(n, computeStreamIndex(name) + 1);
  return static_cast<uint64_t>(n);
}
/// The scratch a linear_cross_entropy_with_grad of x [rows, K] and w [columns, K] takes from
/// its compute stream's library workspace: cuda/LinearCrossEntropy.cu's layout, a (max, sum)
/// f32 pair a row and 128 columns, then an f32 a row, each 256-byte aligned (CUTLASS's own
/// workspace is 0 for its scheduler; LinearCrossEntropyGpuTest checks the two agree).
inline uint64_t linearCrossEntropyScratchBytes(int64_t rows, int64_t columns) {
  const uint64_t groups = static_cast<uint64_t>((columns + 127) / 128);
  return alignUp(static_cast<uint64_t>(rows) * groups * 8, 256) +
         alignUp(static_cast<uint64_t>(rows) * 4, 256);
}
/// The library workspace each compute stream gets before any cuDNN call asks for more at
/// load: kGemmWorkspaceBytes, or a linear_cross_entropy_with_grad's larger scratch.
inline uint64_t plannedWorkspaceBytes(const bundle::Program &p) {
  uint64_t bytes = kGemmWorkspaceBytes;
  for (const bundle::Routine &r : p.routines())
    for (const bundle::Instruction &inst : r.instructions())
      if (inst.op() == "linear_cross_entropy_with_grad" && inst.inputs_size() >= 2 &&
          inst.inputs(0) >= 0 && inst.inputs(0) < p.tensors_size() && inst.inputs(1) >= 0 &&
          inst.inputs(1) < p.tensors_size() && p.tensors(inst.inputs(0)).shape_size() == 2 &&
          p.tensors(inst.inputs(1)).shape_size() == 2)
        bytes = std::max(bytes, linearCrossEntropyScratchBytes(p.tensors(inst.inputs(0)).shape(0),
                                                               p.tensors(inst.inputs(1)).shape(0)));
  return bytes;
}
/// Those bytes before the workspace (what the bundle alone decides).
inline uint64_t plannedTensorBytes(const bundle::Program &p) {
  uint64_t total = alignUp(p.arena_size(), kDeviceAlign);
  for (const bundle::TensorInfo &t : p.tensors())
    if (t.kind() == bundle::TensorInfo::PARAMETER || t.kind() == bundle::TensorInfo::STATE ||
        t.kind() == bundle::TensorInfo::CONSTANT)
      total += alignUp(std::max<uint64_t>(byteSize(t), 1), kDeviceAlign);
  return total;
}

struct BundleHeader {
  char magic[8];
  uint32_t formatVersion;
  uint32_t headerSize;
  uint64_t programOffset;
  uint64_t programSize;
  uint64_t dataOffset;
  uint64_t dataSize;
  uint64_t fileSize;
  uint32_t programCrc32;
  uint32_t reserved;
};
static_assert(sizeof(BundleHeader) == 64);

/// Builds a bundle in memory and writes it atomically.
class BundleWriter {
public:
  bundle::Program &program() { return program_; }
  /// Appends a raw data section; returns its index in program().sections().
  uint32_t addSection(std::string name, std::span<const uint8_t> bytes);
  /// The complete file image.
  std::vector<uint8_t> serialize();
  /// Writes to `path` atomically and durably (writeFileAtomically, FileUtil.h).
  Status writeFile(const std::string &path);

private:
  bundle::Program program_;
  std::vector<uint8_t> data_;
};

/// Checks a CUDA bundle's schedule against its memory plan: any two instructions
/// that may run at once (on different streams, neither waiting for the other,
/// directly or through other streams' events) must not touch the same bytes when
/// one of them writes them (arena tensors and workspaces, and each persistent
/// tensor). Returns the first such pair, naming both instructions and the bytes.
Status checkScheduleRaces(const bundle::Program &p);

/// A validated, read-only bundle (memory-mapped when opened from a file).
class Bundle {
public:
  static Expected<std::unique_ptr<Bundle>> open(const std::string &path);
  static Expected<std::unique_ptr<Bundle>> fromBytes(std::vector<uint8_t> bytes,
                                                     std::string origin = "<memory>");
  ~Bundle();

  const bundle::Program &program() const { return program_; }
  std::span<const uint8_t> section(uint32_t index) const;
  /// Bytes of a CONSTANT, PARAMETER or STATE tensor's initial value (empty
  /// for a zero-initialized STATE tensor).
  std::span<const uint8_t> tensorData(const bundle::TensorInfo &tensor) const;
  const std::string &origin() const { return origin_; }

private:
  Bundle() = default;
  Status parse(std::span<const uint8_t> file);

  bundle::Program program_;
  std::string origin_;
  std::vector<uint8_t> owned_;
  const uint8_t *mapped_ = nullptr;
  size_t mappedSize_ = 0;
  std::span<const uint8_t> data_;
};

} // namespace forge::rt
