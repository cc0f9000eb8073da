// CPU kernels: one per forge dialect op, keyed by the op's mnemonic.
//
// Contract (shared with compiler/include/forge/Dialect/ForgeOps.td):
//  * attributes arrive under the dialect op's attribute names (bool as int 0/1,
//    F64Attr as double, DenseI64ArrayAttr as ints, StrAttr as string, TypeAttr
//    as dtype);
//  * output buffers are preallocated by the caller with their final shapes;
//    a kernel never allocates tensors visible to the caller;
//  * an absent optional operand is a TensorView with dtype DTYPE_UNSPECIFIED;
//  * kernels are the numerical reference for the GPU: accumulate in at least
//    the input precision (f32 sums of many terms use double or pairwise).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "forge/runtime/Status.h"
#include "forge/runtime/Tensor.h"
#include "forge/runtime/ThreadPool.h"

namespace forge::rt {

/// Typed access to an instruction's attributes with clear errors.
class AttrReader {
public:
  explicit AttrReader(const bundle::Instruction &inst) : inst_(inst) {}
  bool has(std::string_view name) const;
  Expected<int64_t> getInt(std::string_view name) const;
  Expected<double> getFloat(std::string_view name) const;
  Expected<std::string> getString(std::string_view name) const;
  Expected<std::vector<int64_t>> getInts(std::string_view name) const;
  Expected<DType> getDType(std::string_view name) const;

private:
  const bundle::Instruction &inst_;
};

struct KernelContext {
  const bundle::Instruction &inst;
  std::span<const TensorView> inputs;
  std::span<TensorView> outputs;
  ThreadPool &pool;
  AttrReader attrs;
};

using KernelFn = Status (*)(KernelContext &);

/// The kernel for `op`, or nullptr when the CPU device has none.
KernelFn findCpuKernel(std::string_view op);
/// All op names with a CPU kernel (sorted).
std::vector<std::string> cpuKernelNames();

/// Runs one instruction: looks up the kernel, checks operand counts and dtypes
/// against what the kernel supports, and prefixes errors with op and name.
Status runCpuKernel(const bundle::Instruction &inst, std::span<const TensorView> inputs,
                    std::span<TensorView> outputs, ThreadPool &pool);

} // namespace forge::rt
