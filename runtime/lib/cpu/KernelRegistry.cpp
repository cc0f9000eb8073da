// The CPU kernel table and the checks every kernel call goes through.
//
// Invariants: the table is built once, explicitly (each kernel file exposes a
// register*Kernels function; no static-initializer self-registration, which a
// static library would silently drop); runCpuKernel validates operand counts,
// presence, dtypes and storage before a kernel runs and prefixes every error
// with the op and instruction name.
#include "KernelUtil.h"

#include <algorithm>
#include <cstring>
#include <exception>

namespace forge::rt {

//===----------------------------------------------------------------------===//
// AttrReader
//===----------------------------------------------------------------------===//

namespace {
const bundle::Attribute *findAttr(const bundle::Instruction &inst, std::string_view name) {
  auto it = inst.attrs().find(std::string(name));
  return it == inst.attrs().end() ? nullptr : &it->second;
}
} // namespace

bool AttrReader::has(std::string_view name) const { return findAttr(inst_, name) != nullptr; }

Expected<int64_t> AttrReader::getInt(std::string_view name) const {
  const bundle::Attribute *a = findAttr(inst_, name);
  if (!a)
    return Status::error("missing int attribute '{}'", name);
  if (a->value_case() != bundle::Attribute::kI)
    return Status::error("attribute '{}' is not an int", name);
  return a->i();
}

Expected<double> AttrReader::getFloat(std::string_view name) const {
  const bundle::Attribute *a = findAttr(inst_, name);
  if (!a)
    return Status::error("missing float attribute '{}'", name);
  if (a->value_case() == bundle::Attribute::kF)
    return a->f();
  if (a->value_case() == bundle::Attribute::kI) // an integral F64Attr written as int
    return static_cast<double>(a->i());
  return Status::error("attribute '{}' is not a float", name);
}

Expected<std::string> AttrReader::getString(std::string_view name) const {
  const bundle::Attribute *a = findAttr(inst_, name);
  if (!a)
    return Status::error("missing string attribute '{}'", name);
  if (a->value_case() != bundle::Attribute::kS)
    return Status::error("attribute '{}' is not a string", name);
  return a->s();
}

Expected<std::vector<int64_t>> AttrReader::getInts(std::string_view name) const {
  const bundle::Attribute *a = findAttr(inst_, name);
  if (!a)
    return Status::error("missing int list attribute '{}'", name);
  if (a->value_case() != bundle::Attribute::kInts)
    return Status::error("attribute '{}' is not an int list", name);
  return std::vector<int64_t>(a->ints().values().begin(), a->ints().values().end());
}

Expected<DType> AttrReader::getDType(std::string_view name) const {
  const bundle::Attribute *a = findAttr(inst_, name);
  if (!a)
    return Status::error("missing dtype attribute '{}'", name);
  if (a->value_case() != bundle::Attribute::kDtype)
    return Status::error("attribute '{}' is not a dtype", name);
  return a->dtype();
}

namespace cpu {

//===----------------------------------------------------------------------===//
// Shared helpers
//===----------------------------------------------------------------------===//

Status unsupportedDType(DType t, std::string_view what) {
  return Status::error("unsupported dtype {} for {}", dtypeName(t), what);
}

Expected<std::array<uint8_t, 8>> scalarBytes(DType t, double value) {
  std::array<uint8_t, 8> bytes{};
  if (t == bundle::BOOL) {
    bytes[0] = value != 0.0;
    return bytes;
  }
  Status st = visitNumeric(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v = convertValue<T>(value);
    std::memcpy(bytes.data(), &v, sizeof(T));
    return Status::ok();
  });
  if (!st)
    return st;
  return bytes;
}

std::vector<int64_t> contiguousStrides(const std::vector<int64_t> &shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;)
    s[d - 1] = s[d] * shape[d];
  return s;
}

Expected<std::vector<int64_t>> broadcastStrides(const std::vector<int64_t> &in,
                                                const std::vector<int64_t> &out) {
  if (in.size() > out.size())
    return Status::error("shape {} does not broadcast to {}", shapeString(in), shapeString(out));
  std::vector<int64_t> dense = contiguousStrides(in), result(out.size(), 0);
  size_t lead = out.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d) {
    if (in[d] == out[lead + d])
      result[lead + d] = in[d] == 1 ? 0 : dense[d];
    else if (in[d] != 1)
      return Status::error("shape {} does not broadcast to {}", shapeString(in), shapeString(out));
  }
  return result;
}

Expected<std::vector<int64_t>> broadcastShape(const std::vector<int64_t> &a,
                                              const std::vector<int64_t> &b) {
  size_t rank = std::max(a.size(), b.size());
  std::vector<int64_t> out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1)
      return Status::error("shapes {} and {} are not broadcast-compatible", shapeString(a),
                           shapeString(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Status checkShape(const TensorView &t, const std::vector<int64_t> &expected,
                  std::string_view what) {
  if (t.shape != expected)
    return Status::error("{} has shape {}, expected {}", what, shapeString(t.shape),
                         shapeString(expected));
  return Status::ok();
}

Status checkDType(const TensorView &t, DType expected, std::string_view what) {
  if (t.dtype != expected)
    return Status::error("{} has dtype {}, expected {}", what, dtypeName(t.dtype),
                         dtypeName(expected));
  return Status::ok();
}

//===----------------------------------------------------------------------===//
// copy
//===----------------------------------------------------------------------===//

namespace {
/// copy(x) -> y: y = x, same dtype and shape. The bundle emitter uses it to
/// write a computed value back into a PARAMETER/STATE tensor when an in-place
/// write is not safe. Source and destination may be the same buffer.
Status copyKernel(KernelContext &ctx) {
  const TensorView &x = ctx.inputs[0];
  TensorView &y = ctx.outputs[0];
  FORGE_RETURN_IF_ERROR(checkDType(y, x.dtype, "result"));
  FORGE_RETURN_IF_ERROR(checkShape(y, x.shape, "result"));
  size_t bytes = x.bytes();
  if (bytes > 0 && x.data != y.data)
    std::memmove(y.data, x.data, bytes);
  return Status::ok();
}
} // namespace

//===----------------------------------------------------------------------===//
// Registry
//===----------------------------------------------------------------------===//

void Registry::add(std::string name, KernelFn fn, int minInputs, int maxInputs, int minOutputs,
                   int maxOutputs) {
  kernels_[std::move(name)] = KernelInfo{fn, minInputs, maxInputs, minOutputs, maxOutputs};
}

const KernelInfo *Registry::find(std::string_view name) const {
  auto it = kernels_.find(name);
  return it == kernels_.end() ? nullptr : &it->second;
}

std::vector<std::string> Registry::names() const {
  std::vector<std::string> out;
  for (const auto &[name, info] : kernels_)
    out.push_back(name);
  return out; // std::map keeps them sorted
}

const Registry &cpuRegistry() {
  static const Registry registry = [] {
    Registry r;
    registerElementwiseKernels(r);
    registerReduceKernels(r);
    registerMatMulKernels(r);
    registerConvKernels(r);
    registerPoolKernels(r);
    registerNormKernels(r);
    registerMovementKernels(r);
    registerLossKernels(r);
    registerBackwardKernels(r);
    registerAttentionKernels(r);
    registerRandomKernels(r);
    registerCollectiveKernels(r);
    r.add("copy", &copyKernel, 1, 1);
    return r;
  }();
  return registry;
}

namespace {
std::string arityString(int lo, int hi) {
  if (hi < 0)
    return fmt::format("at least {}", lo);
  if (lo == hi)
    return std::to_string(lo);
  return fmt::format("{} to {}", lo, hi);
}

Status checkTensor(const TensorView &t, std::string_view what, size_t index) {
  for (int64_t d : t.shape)
    if (d < 0)
      return Status::error("{} {} has a negative dim in shape {}", what, index,
                           shapeString(t.shape));
  if (t.numel() < 0)
    return Status::error("{} {} has too many elements: {}", what, index, shapeString(t.shape));
  if (dtypeSize(t.dtype) == 0)
    return Status::error("{} {} has unsupported dtype {}", what, index, dtypeName(t.dtype));
  if (t.numel() > 0 && t.data == nullptr)
    return Status::error("{} {} has no storage", what, index);
  return Status::ok();
}

Status checkOperands(const KernelInfo &info, std::span<const TensorView> inputs,
                     std::span<TensorView> outputs) {
  int nIn = static_cast<int>(inputs.size()), nOut = static_cast<int>(outputs.size());
  if (nIn < info.minInputs || (info.maxInputs >= 0 && nIn > info.maxInputs))
    return Status::error("expected {} operands, got {}",
                         arityString(info.minInputs, info.maxInputs), nIn);
  if (nOut < info.minOutputs || (info.maxOutputs >= 0 && nOut > info.maxOutputs))
    return Status::error("expected {} results, got {}",
                         arityString(info.minOutputs, info.maxOutputs), nOut);
  for (size_t i = 0; i < inputs.size(); ++i) {
    bool required = info.maxInputs < 0 || static_cast<int>(i) < info.minInputs;
    if (!inputs[i].present()) {
      if (required)
        return Status::error("required operand {} is absent", i);
      continue;
    }
    FORGE_RETURN_IF_ERROR(checkTensor(inputs[i], "operand", i));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].present())
      return Status::error("result {} is absent", i);
    FORGE_RETURN_IF_ERROR(checkTensor(outputs[i], "result", i));
  }
  return Status::ok();
}
} // namespace

} // namespace cpu

//===----------------------------------------------------------------------===//
// Public entry points
//===----------------------------------------------------------------------===//

KernelFn findCpuKernel(std::string_view op) {
  const cpu::KernelInfo *info = cpu::cpuRegistry().find(op);
  return info ? info->fn : nullptr;
}

std::vector<std::string> cpuKernelNames() { return cpu::cpuRegistry().names(); }

namespace {
/// Copies `tokens` rows of `rowBytes` from rows `srcStride` bytes apart to
/// rows `dstStride` bytes apart: views a token stride apart packed, or back.
void copyRows(uint8_t *dst, size_t dstStride, const uint8_t *src, size_t srcStride, int64_t tokens,
              size_t rowBytes) {
  for (int64_t t = 0; t < tokens; ++t)
    std::memcpy(dst + static_cast<size_t>(t) * dstStride, src + static_cast<size_t>(t) * srcStride,
                rowBytes);
}
} // namespace

Status runCpuKernel(const bundle::Instruction &inst, std::span<const TensorView> inputs,
                    std::span<TensorView> outputs, ThreadPool &pool) {
  auto context = [&] {
    return inst.name().empty() ? fmt::format("op '{}'", inst.op())
                               : fmt::format("op '{}' ({})", inst.op(), inst.name());
  };
  const cpu::KernelInfo *info = cpu::cpuRegistry().find(inst.op());
  if (!info)
    return Status::error("{}: no CPU kernel", context());
  // Outputs written a token stride apart into a larger buffer (attribute
  // out_row_strides: a concat's pieces, forge-fold-attention-views; a CUDA
  // bundle run here): the kernel writes packed copies, scattered row by row
  // (rows of shape[2:]) after.
  if (auto rows = inst.attrs().find("out_row_strides"); rows != inst.attrs().end()) {
    if (rows->second.value_case() != bundle::Attribute::kInts ||
        rows->second.ints().values_size() != static_cast<int>(outputs.size()))
      return Status::error("{}: out_row_strides must be one token stride per output", context());
    std::vector<TensorView> outs(outputs.begin(), outputs.end());
    std::vector<std::vector<uint8_t>> packed(outputs.size());
    for (size_t j = 0; j < outputs.size(); ++j) {
      const int64_t stride = rows->second.ints().values(static_cast<int>(j));
      const TensorView &v = outputs[j];
      if (stride == 0)
        continue;
      const int64_t row =
          v.rank() >= 3 ? v.numel() / std::max<int64_t>(v.shape[0] * v.shape[1], 1) : 0;
      if (v.rank() < 3 || stride < row)
        return Status::error("{}: out_row_strides[{}] = {} is less than a token's row of {}",
                             context(), j, stride, row);
      packed[j].resize(static_cast<size_t>(v.numel()) * dtypeSize(v.dtype));
      outs[j].data = packed[j].data();
    }
    bundle::Instruction plain = inst;
    plain.mutable_attrs()->erase("out_row_strides");
    FORGE_RETURN_IF_ERROR(runCpuKernel(plain, inputs, outs, pool));
    for (size_t j = 0; j < outputs.size(); ++j) {
      if (packed[j].empty())
        continue;
      const TensorView &v = outputs[j];
      const int64_t tokens = v.shape[0] * v.shape[1];
      if (tokens == 0)
        continue;
      const size_t e = dtypeSize(v.dtype), row = static_cast<size_t>(v.numel() / tokens) * e;
      const size_t stride =
          static_cast<size_t>(rows->second.ints().values(static_cast<int>(j))) * e;
      copyRows(static_cast<uint8_t *>(v.data), stride, packed[j].data(), row, tokens, row);
    }
    return Status::ok();
  }
  // cuDNN attention reading q, k and v as views into a fused projection
  // (attribute row_strides, forge-fold-attention-views; a CUDA bundle run
  // here): gathered into packed copies, then the packed kernel runs.
  if (auto rows = inst.attrs().find("row_strides");
      rows != inst.attrs().end() && (inst.op() == "attention" || inst.op() == "attention_grad")) {
    auto layout = inst.attrs().find("layout");
    if (rows->second.value_case() != bundle::Attribute::kInts ||
        rows->second.ints().values_size() != 3 || inputs.size() < 3 ||
        layout == inst.attrs().end() || layout->second.s() != "bshd")
      return Status::error("{}: row_strides must be three token strides (q, k, v) of layout bshd",
                           context());
    std::vector<TensorView> ins(inputs.begin(), inputs.end());
    std::vector<std::vector<uint8_t>> packed(3);
    for (int i = 0; i < 3; ++i) {
      const TensorView &v = inputs[i];
      const int64_t stride = rows->second.ints().values(i);
      if (v.rank() != 4 || stride < v.shape[2] * v.shape[3])
        return Status::error("{}: row_strides[{}] = {} is less than a token's row of {}",
                             context(), i, stride, v.rank() == 4 ? v.shape[2] * v.shape[3] : 0);
      const size_t e = dtypeSize(v.dtype), row = static_cast<size_t>(v.shape[2] * v.shape[3]) * e;
      const int64_t tokens = v.shape[0] * v.shape[1];
      packed[i].resize(static_cast<size_t>(tokens) * row);
      copyRows(packed[i].data(), row, static_cast<const uint8_t *>(v.data),
               static_cast<size_t>(stride) * e, tokens, row);
      ins[i].data = packed[i].data();
    }
    bundle::Instruction plain = inst;
    plain.mutable_attrs()->erase("row_strides");
    return runCpuKernel(plain, ins, outputs, pool);
  }
  Status st = cpu::checkOperands(*info, inputs, outputs);
  if (st) {
    KernelContext ctx{inst, inputs, outputs, pool, AttrReader(inst)};
    // Mixed storage precision (forge-assign-precision: a bf16 GEMM writing
    // f32, a norm storing bf16): the op computes in f32 on f32 copies of its
    // half operands and results, as a GPU kernel computes in registers.
    auto has = [&](DType d) {
      auto is = [&](const TensorView &t) { return t.present() && t.dtype == d; };
      return std::any_of(inputs.begin(), inputs.end(), is) ||
             std::any_of(outputs.begin(), outputs.end(), is);
    };
    // (A cast converts between the types itself.)
    bool mixed = inst.op() != "cast" && has(bundle::F32) && (has(bundle::BF16) || has(bundle::F16));
    auto run = [&](KernelContext &c) -> Status {
      if (mixed && has(bundle::BF16))
        return cpu::runInFloat<cpu::BFloat16>(c, info->fn);
      if (mixed)
        return cpu::runInFloat<cpu::Half>(c, info->fn);
      return info->fn(c);
    };
    // forge-layout's channels-last convolutions run the channels-first kernels.
    bool channelsLast = ctx.attrs.has("channels_last") && *ctx.attrs.getInt("channels_last") != 0;
    try {
      st = channelsLast ? cpu::runChannelsFirst(ctx, run) : run(ctx);
    } catch (const std::exception &e) { // e.g. bad_alloc of a scratch buffer
      st = Status::error("{}", e.what());
    }
  }
  return st.prefix(context());
}

} // namespace forge::rt
