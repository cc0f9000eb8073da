//===- forgec.cpp - the Forge compiler driver ------------------------------===//
//
// ONNX file -> import -> pass pipeline -> .forge bundle. Options are LLVM
// command-line options so that MLIR's own flags (--mlir-print-ir-after-all,
// --mlir-print-ir-after-change, --mlir-timing, crash reproducers) work as in
// every MLIR tool.
//
//===----------------------------------------------------------------------===//
#include "forge/Bundle/BundleEmitter.h"
#include "forge/Import/OnnxImporter.h"
#include "forge/Pipeline/Pipeline.h"
#include "forge/runtime/Bundle.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/Timing.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SHA256.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
namespace cl = llvm::cl;

static cl::OptionCategory forgecCategory("forgec options");
static cl::opt<std::string> inputFile(cl::Positional, cl::desc("<model.onnx>"), cl::Required,
                                      cl::cat(forgecCategory));
static cl::opt<std::string> outputFile("o", cl::desc("Output file (default: <model>.forge)"),
                                       cl::value_desc("file"), cl::cat(forgecCategory));
static cl::opt<std::string> target("target", cl::desc("Target device: cpu (default)"),
                                   cl::init("cpu"), cl::cat(forgecCategory));
static cl::opt<bool> inferenceOnly("inference-only",
                                   cl::desc("Compile the forward graph only (no training step)"),
                                   cl::cat(forgecCategory));
static cl::opt<int64_t> batch("batch", cl::desc("Value of dim 0 of every input whose dim 0 is symbolic"),
                              cl::init(0), cl::cat(forgecCategory));
static cl::list<std::string> shapes("shape", cl::desc("Static shape of an input: NAME=d0,d1,..."),
                                    cl::value_desc("NAME=DIMS"), cl::cat(forgecCategory));
static cl::list<std::string> dims("dim", cl::desc("Value of a symbolic dim: NAME=N"),
                                  cl::value_desc("NAME=N"), cl::cat(forgecCategory));
static cl::opt<std::string> dumpDir("dump-dir",
                                    cl::desc("Write NN-passname.mlir/.onnx after import and every pass"),
                                    cl::value_desc("DIR"), cl::cat(forgecCategory));
enum class EmitKind { Bundle, Mlir };
static cl::opt<EmitKind> emit("emit", cl::desc("What to write"), cl::init(EmitKind::Bundle),
                              cl::values(clEnumValN(EmitKind::Bundle, "bundle", ".forge bundle"),
                                         clEnumValN(EmitKind::Mlir, "mlir", "final IR as text")),
                              cl::cat(forgecCategory));

static bool parseDims(StringRef text, std::vector<int64_t> &out) {
  for (StringRef part : llvm::split(text, ',')) {
    int64_t v;
    if (part.trim().getAsInteger(10, v) || v < 0)
      return false;
    out.push_back(v);
  }
  return !out.empty();
}

static int fail(const Twine &message) {
  llvm::errs() << "forgec: error: " << message << "\n";
  return 1;
}

int main(int argc, char **argv) {
  llvm::InitLLVM initLLVM(argc, argv);
  registerMLIRContextCLOptions();
  registerPassManagerCLOptions();
  registerDefaultTimingManagerCLOptions();
  registerAsmPrinterCLOptions();
  cl::ParseCommandLineOptions(argc, argv, "forgec: compile an ONNX model into a .forge bundle\n");

  mlir::forge::ImportOptions importOptions;
  importOptions.batch = batch;
  for (const std::string &s : shapes) {
    auto [name, value] = StringRef(s).split('=');
    std::vector<int64_t> d;
    if (name.empty() || !parseDims(value, d))
      return fail("--shape expects NAME=d0,d1,... (got '" + s + "')");
    importOptions.inputShapes[name.str()] = d;
  }
  for (const std::string &s : dims) {
    auto [name, value] = StringRef(s).split('=');
    int64_t v;
    if (name.empty() || value.getAsInteger(10, v) || v < 0)
      return fail("--dim expects NAME=N (got '" + s + "')");
    importOptions.dimValues[name.str()] = v;
  }
  if (target != "cpu")
    return fail("target '" + target + "' is not available yet; use --target cpu");
  if (!inferenceOnly)
    return fail("training bundles are not available yet; pass --inference-only");

  DialectRegistry registry;
  mlir::forge::registerForgeDialects(registry);
  MLIRContext context(registry);
  context.loadAllAvailableDialects();

  auto source = llvm::MemoryBuffer::getFile(inputFile, false, false);
  if (!source)
    return fail("cannot read '" + inputFile + "': " + source.getError().message());
  llvm::SHA256 sha;
  sha.update((*source)->getBuffer());
  std::string sourceHash = llvm::toHex(sha.final(), /*LowerCase=*/true);

  DefaultTimingManager timing;
  applyDefaultTimingManagerCLOptions(timing);
  TimingScope rootTiming = timing.getRootScope();

  OwningOpRef<ModuleOp> module;
  {
    TimingScope importTiming = rootTiming.nest("import");
    module = mlir::forge::importOnnxBytes(&context, (*source)->getBuffer(), inputFile, importOptions);
  }
  if (!module)
    return 1;
  if (!dumpDir.empty() && failed(mlir::forge::writeStageDump(*module, dumpDir, 0, "import")))
    return 1;

  PassManager pm(&context);
  if (failed(applyPassManagerCLOptions(pm)))
    return 1;
  TimingScope pipelineTiming = rootTiming.nest("pipeline");
  pm.enableTiming(pipelineTiming);
  if (!dumpDir.empty())
    mlir::forge::addDumpInstrumentation(pm, dumpDir, 1);
  mlir::forge::PipelineOptions pipelineOptions;
  pipelineOptions.target = target;
  mlir::forge::buildInferencePipeline(pm, pipelineOptions);
  if (failed(pm.run(*module)))
    return 1;

  std::string output = outputFile;
  if (output.empty()) {
    SmallString<256> p(inputFile.getValue());
    llvm::sys::path::replace_extension(p, emit == EmitKind::Mlir ? "mlir" : "forge");
    output = p.str().str();
  }
  if (emit == EmitKind::Mlir) {
    std::error_code ec;
    llvm::raw_fd_ostream out(output, ec);
    if (ec)
      return fail("cannot write '" + output + "': " + ec.message());
    module->print(out);
    return 0;
  }

  TimingScope emitTiming = rootTiming.nest("emit bundle");
  ::forge::rt::BundleWriter writer;
  mlir::forge::BundleEmitOptions emitOptions;
  emitOptions.target = target;
  emitOptions.sourceHash = sourceHash;
  emitOptions.buildOptions["mode"] = "inference";
  if (batch > 0)
    emitOptions.buildOptions["batch"] = std::to_string(batch);
  if (failed(mlir::forge::emitBundle(*module, emitOptions, writer)))
    return 1;
  ::forge::rt::Status status = writer.writeFile(output);
  if (!status.isOk())
    return fail(status.message());
  return 0;
}
