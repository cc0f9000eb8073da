// forge-replay: runs bundles written by `forge-conformance --emit-dir` on a device and checks
// every output against ONNX's expected values and against the CPU's outputs. Links the
// runtime only, so it runs on GPU machines without MLIR (tests/gpu/README.md).
//
//   forge-replay DIR [--device cuda] [--rtol 1e-3] [--atol 1e-7] [--cpu-rtol 1e-4]
//                    [--cpu-atol 1e-6] [--queue] [-v]
//   forge-replay --check-library BUNDLE...   (no GPU: each library call's stated problem
//                                              against its tensors, as the CUDA executor does,
//                                              and the schedule against the memory plan: no
//                                              two instructions that may run at once on
//                                              different streams touch the same bytes)
//
// DIR/NAME/model.forge with DIR/NAME/set_K.npz holding the routine's inputs by tensor name,
// `expected:O` (ONNX's reference, the runner's tolerance) and `cpu:O` (the CPU executor's
// output: floats within cpu-rtol/cpu-atol, other types exact). Prints a line per failure and
// "replay: N passed, N failed"; exit status 1 when anything failed. --queue runs a case's sets
// back to back (as a pipelined trainer does) and waits only after the last, whose outputs it
// checks: a fault in any earlier run must still fail the case.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include <fmt/format.h>

#include "forge/runtime/Bundle.h"
#include "forge/runtime/Executor.h"
#include "forge/runtime/Npy.h"

namespace fs = std::filesystem;
using namespace forge::rt;
namespace bundle = forge::bundle;

namespace {

double element(const uint8_t *p, DType t, size_t i) {
  switch (t) {
  case bundle::F32: { float v; std::memcpy(&v, p + 4 * i, 4); return v; }
  case bundle::F64: { double v; std::memcpy(&v, p + 8 * i, 8); return v; }
  case bundle::F16: {
    uint16_t h; std::memcpy(&h, p + 2 * i, 2);
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? std::ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY)
                                                      : std::ldexp(m + 1024, e - 25);
    return (h & 0x8000) ? -v : v;
  }
  case bundle::BF16: {
    uint16_t h; std::memcpy(&h, p + 2 * i, 2);
    uint32_t b = uint32_t(h) << 16; float v; std::memcpy(&v, &b, 4); return v;
  }
  case bundle::I64: { int64_t v; std::memcpy(&v, p + 8 * i, 8); return double(v); }
  case bundle::I32: { int32_t v; std::memcpy(&v, p + 4 * i, 4); return v; }
  case bundle::I16: { int16_t v; std::memcpy(&v, p + 2 * i, 2); return v; }
  case bundle::U16: { uint16_t v; std::memcpy(&v, p + 2 * i, 2); return v; }
  case bundle::U32: { uint32_t v; std::memcpy(&v, p + 4 * i, 4); return v; }
  case bundle::U64: { uint64_t v; std::memcpy(&v, p + 8 * i, 8); return double(v); }
  case bundle::F8E5M2: { // the high byte of an f16
    uint8_t b = p[i];
    uint16_t h = uint16_t(b) << 8;
    uint8_t f16[2];
    std::memcpy(f16, &h, 2);
    return element(f16, bundle::F16, 0);
  }
  case bundle::F8E4M3: { // bias 7, no infinity, S.1111.111 is NaN
    uint8_t b = p[i];
    int e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7)
      return NAN;
    double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(m + 8, e - 10);
    return (b & 0x80) ? -v : v;
  }
  case bundle::F8E4M3FNUZ:
  case bundle::F8E5M2FNUZ: { // bias 8 / 16, no infinity or -0, 0x80 is NaN
    uint8_t b = p[i];
    int mbits = t == bundle::F8E4M3FNUZ ? 3 : 2, bias = t == bundle::F8E4M3FNUZ ? 8 : 16;
    if (b == 0x80)
      return NAN;
    int e = (b & 0x7f) >> mbits, m = b & ((1 << mbits) - 1);
    double v = e == 0 ? std::ldexp(m, 1 - bias - mbits) : std::ldexp(m + (1 << mbits), e - bias - mbits);
    return (b & 0x80) ? -v : v;
  }
  case bundle::I8: return double(int8_t(p[i]));
  default: return double(p[i]); // U8, BOOL, float8 bit patterns
  }
}

bool isFloat(DType t) {
  return t == bundle::F32 || t == bundle::F64 || t == bundle::F16 || t == bundle::BF16 ||
         t == bundle::F8E4M3 || t == bundle::F8E5M2 || t == bundle::F8E4M3FNUZ ||
         t == bundle::F8E5M2FNUZ;
}

/// First mismatch of `got` against `ref` ("" when they agree).
std::string compare(const TensorView &got, const HostTensor &ref, DType refType, double rtol,
                    double atol) {
  if (got.shape != ref.shape)
    return fmt::format("shape {} != {}", shapeString(got.shape), shapeString(ref.shape));
  if (got.numel() * dtypeSize(refType) != static_cast<int64_t>(ref.bytes.size()))
    return "size differs";
  const auto *g = static_cast<const uint8_t *>(got.data);
  for (int64_t i = 0; i < got.numel(); ++i) {
    double a = element(g, got.dtype, i), b = element(ref.bytes.data(), refType, i);
    bool ok = !isFloat(got.dtype) ? a == b
              : std::isnan(b)     ? std::isnan(a)
              : std::isinf(b)     ? a == b
                                  : std::fabs(a - b) <= atol + rtol * std::fabs(b);
    if (!ok)
      return fmt::format("element {}: {} vs {}", i, a, b);
  }
  return "";
}

/// "op 'node' (dtype[shape], ...) attrs": what a HOST instruction works on.
std::string describe(const Executor &x, const bundle::Instruction &inst) {
  std::string out = fmt::format("{} '{}' (", inst.op(), inst.name());
  for (int i = 0; i < inst.inputs_size(); ++i) {
    if (i)
      out += ", ";
    if (inst.inputs(i) < 0) {
      out += "-";
      continue;
    }
    const auto &info = x.tensorInfo(inst.inputs(i));
    out += fmt::format("{}[{}]", dtypeName(info.dtype()), fmt::join(info.shape(), "x"));
  }
  out += ")";
  for (const auto &[key, value] : inst.attrs())
    out += fmt::format(" {}={}", key, value.ShortDebugString());
  return out;
}

} // namespace

int main(int argc, char **argv) {
  if (argc >= 2 && std::string(argv[1]) == "--check-library") {
    int bad = 0;
    for (int i = 2; i < argc; ++i) {
      auto bundle = Bundle::open(argv[i]);
      Status st = bundle ? checkLibraryCalls(**bundle) : bundle.status();
      if (st.isOk())
        st = checkScheduleRaces((*bundle)->program());
      if (!st.isOk()) {
        fmt::print(stderr, "forge-replay: {}: {}\n", argv[i], st.message());
        ++bad;
      }
    }
    fmt::print("check-library: {} bundles, {} refused\n", argc - 2, bad);
    return bad || argc < 3 ? 1 : 0;
  }
  std::string dir, device = "cuda";
  double rtol = 1e-3, atol = 1e-7, cpuRtol = 1e-4, cpuAtol = 1e-6;
  bool verbose = false, queue = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--device") device = next();
    else if (a == "--rtol") rtol = std::stod(next());
    else if (a == "--atol") atol = std::stod(next());
    else if (a == "--cpu-rtol") cpuRtol = std::stod(next());
    else if (a == "--cpu-atol") cpuAtol = std::stod(next());
    else if (a == "-v") verbose = true;
    else if (a == "--queue") queue = true;
    else if (dir.empty()) dir = a;
    else { fmt::print(stderr, "forge-replay: unexpected argument '{}'\n", a); return 2; }
  }
  if (dir.empty() || !fs::is_directory(dir)) {
    fmt::print(stderr, "usage: forge-replay DIR [--device cuda] [--rtol R] [--atol A] "
                       "[--cpu-rtol R] [--cpu-atol A] [--queue] [-v]\n");
    return 2;
  }
  std::map<std::string, fs::path> tests;
  for (const auto &e : fs::directory_iterator(dir))
    if (fs::exists(e.path() / "model.forge"))
      tests[e.path().filename().string()] = e.path();
  int passed = 0, failed = 0;
  std::map<int, int64_t> placements; // instructions per placement, over all bundles
  std::map<std::string, int64_t> hostOps;
  for (const auto &[name, path] : tests) {
    std::string why = [&]() -> std::string {
      auto bundle = Bundle::open((path / "model.forge").string());
      if (!bundle)
        return "load: " + bundle.status().message();
      auto ex = createExecutor(**bundle, ExecutorOptions{device, 1, false});
      if (!ex)
        return "executor: " + ex.status().message();
      Executor &x = **ex;
      for (const auto &r : (*bundle)->program().routines())
        for (const auto &inst : r.instructions()) {
          ++placements[static_cast<int>(inst.placement())];
          if (inst.placement() == bundle::HOST) {
            ++hostOps[inst.op()];
            if (verbose)
              fmt::print("HOST {}: {}\n", name, describe(x, inst));
          }
        }
      for (int set = 0;; ++set) {
        fs::path data = path / fmt::format("set_{}.npz", set);
        if (!fs::exists(data))
          return set == 0 ? "no data set" : "";
        auto arrays = readNpz(data.string());
        if (!arrays)
          return arrays.status().message();
        if (queue && set > 0) // the previous run's inputs are uploaded: reuse the buffers
          if (Status s = x.waitInputsConsumed(); !s.isOk())
            return "run: " + s.message();
        for (int32_t t : x.inputs(0)) {
          const auto &info = x.tensorInfo(t);
          auto it = arrays->find(info.name());
          if (it == arrays->end())
            return "no data for input " + info.name();
          TensorView v = it->second.view();
          if (v.dtype != info.dtype() && dtypeSize(v.dtype) == dtypeSize(info.dtype()))
            v.dtype = info.dtype(); // raw bits (bfloat16, float8) travel as unsigned ints
          if (Status s = x.setInput(0, info.name(), v); !s.isOk())
            return s.message();
        }
        if (Status s = x.run(0); !s.isOk())
          return "run: " + s.message();
        if (queue && fs::exists(path / fmt::format("set_{}.npz", set + 1)))
          continue; // not the last: no wait
        if (Status s = x.wait(); !s.isOk())
          return "run: " + s.message();
        for (size_t o = 0; o < x.outputs(0).size(); ++o) {
          TensorView got = x.view(x.outputs(0)[o]);
          auto expected = arrays->find(fmt::format("expected:{}", o));
          auto cpu = arrays->find(fmt::format("cpu:{}", o));
          if (expected == arrays->end() || cpu == arrays->end())
            return fmt::format("no reference for output {}", o);
          DType refType = got.dtype; // same bits, possibly labelled as unsigned ints
          std::string bad = compare(got, expected->second, refType, rtol, atol);
          if (!bad.empty())
            return fmt::format("set {} output {} vs ONNX: {}", set, o, bad);
          bad = compare(got, cpu->second, refType, cpuRtol, cpuAtol);
          if (!bad.empty())
            return fmt::format("set {} output {} vs CPU: {}", set, o, bad);
        }
      }
    }();
    if (why.empty()) {
      ++passed;
      if (verbose)
        fmt::print("PASS {}\n", name);
    } else {
      ++failed;
      fmt::print("FAIL {}: {}\n", name, why);
    }
  }
  fmt::print("replay ({}): {} passed, {} failed; instructions: {} generated kernels, {} library "
             "calls, {} device copies, {} on the host\n",
             device, passed, failed, placements[bundle::KERNEL], placements[bundle::LIBRARY],
             placements[bundle::DEVICE_COPY],
             placements[bundle::HOST] + placements[bundle::PLACEMENT_DEFAULT]);
  if (!hostOps.empty()) {
    std::string list;
    for (const auto &[op, n] : hostOps)
      list += fmt::format("{}{} x{}", list.empty() ? "" : ", ", op, n);
    fmt::print("host instructions by op: {}\n", list);
  }
  return failed ? 1 : 0;
}
