//===- forge-opt.cpp - run any Forge pass or pipeline on .mlir input -------===//
//
// MlirOptMain with the forge dialect and passes, plus `--dump-dir D`, which
// writes NN-passname.mlir / .onnx after every pass exactly as forgec does.
//
//===----------------------------------------------------------------------===//
#include "forge/Pipeline/Pipeline.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/ToolOutputFile.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/MemoryBuffer.h"

static llvm::cl::opt<std::string>
    dumpDir("dump-dir", llvm::cl::desc("Write NN-passname.mlir/.onnx after every pass into DIR"),
            llvm::cl::value_desc("DIR"), llvm::cl::init(""));

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  mlir::forge::registerForgeDialects(registry);
  mlir::forge::registerForgePassesAndPipelines();

  auto [inputFile, outputFile] =
      mlir::registerAndParseCLIOptions(argc, argv, "Forge optimizer driver", registry);
  mlir::MlirOptMainConfig config = mlir::MlirOptMainConfig::createFromCLOptions();
  // Keep the pipeline that the command line describes; add the dumps after it.
  mlir::MlirOptMainConfig fromCommandLine = config;
  config.setPassPipelineSetupFn([fromCommandLine](mlir::PassManager &pm) -> mlir::LogicalResult {
    if (mlir::failed(fromCommandLine.setupPassPipeline(pm)))
      return mlir::failure();
    if (!dumpDir.empty())
      mlir::forge::addDumpInstrumentation(pm, dumpDir);
    return mlir::success();
  });
  std::string error;
  auto input = mlir::openInputFile(inputFile, &error);
  if (!input) {
    llvm::errs() << error << "\n";
    return 1;
  }
  auto output = mlir::openOutputFile(outputFile, &error);
  if (!output) {
    llvm::errs() << error << "\n";
    return 1;
  }
  if (mlir::failed(mlir::MlirOptMain(output->os(), std::move(input), registry, config)))
    return 1;
  output->keep();
  return 0;
}
