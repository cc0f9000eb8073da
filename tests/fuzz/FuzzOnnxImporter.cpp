//===- FuzzOnnxImporter.cpp - libFuzzer entry point for the ONNX importer ---===//
//
// Invariant under test: any byte string given to importOnnxBytes either
// imports or yields at least one diagnostic; it never crashes, hangs or
// aborts. Also runs under a plain driver (ImporterFuzzSmokeTest) in ctest.
//
//===----------------------------------------------------------------------===//
#include "forge/Dialect/ForgeDialect.h"
#include "forge/Import/OnnxImporter.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"

#include <cstdint>
#include <cstdlib>

extern "C" int forgeFuzzOnnxImporter(const uint8_t *data, size_t size) {
  // The importer's dialects only: the target links the importer and not the
  // pipeline, so that the fuzz-importer preset compiles a fraction of the compiler.
  mlir::DialectRegistry registry;
  registry.insert<mlir::forge::ForgeDialect, mlir::func::FuncDialect>();
  mlir::MLIRContext ctx(registry, mlir::MLIRContext::Threading::DISABLED);
  bool diagnosed = false;
  mlir::ScopedDiagnosticHandler handler(&ctx, [&](mlir::Diagnostic &) {
    diagnosed = true;
    return mlir::success();
  });
  mlir::forge::ImportOptions options;
  options.batch = 2;
  options.externalDataDir = "/nonexistent-forge-fuzz"; // never read real files
  auto module = mlir::forge::importOnnxBytes(
      &ctx, llvm::StringRef(reinterpret_cast<const char *>(data), size), "fuzz.onnx", options);
  if (!module && !diagnosed)
    std::abort(); // a silent failure is a bug too
  return 0;
}

#ifdef FORGE_LIBFUZZER
extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  return forgeFuzzOnnxImporter(data, size);
}
#endif
