//===- OnnxImporter.h - ONNX ModelProto -> forge dialect -------------------===//
//
// Produces a module with one `func.func @main` whose arguments are the graph
// inputs (attribute `forge.name`) and whose results are the graph outputs.
// Initializers become `forge.constant` ops tagged `forge.initializer = "name"`.
// Every shape is static after import: symbolic dims take their values from
// the options; shape-computing subgraphs are folded to constants.
//
//===----------------------------------------------------------------------===//
#ifndef FORGE_IMPORT_ONNXIMPORTER_H
#define FORGE_IMPORT_ONNXIMPORTER_H

#include <map>
#include <set>
#include <string>
#include <vector>

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace mlir::forge {

struct ImportOptions {
  /// Value for dim 0 of every graph input whose dim 0 is symbolic (0: unset).
  int64_t batch = 0;
  /// Full static shapes of named graph inputs (`--shape name=d0,d1,...`).
  std::map<std::string, std::vector<int64_t>> inputShapes;
  /// Values of named symbolic dims (`--dim seq=128`).
  std::map<std::string, int64_t> dimValues;
  /// Names in inputShapes that need not be graph inputs (`--shapes-from`
  /// arrays: a data file may hold labels too). Every other name in
  /// inputShapes and dimValues must be used, or the import fails.
  std::set<std::string> optionalShapeNames;
  /// Directory that external-data locations are relative to (defaults to the
  /// model file's directory).
  std::string externalDataDir;
  /// Graph inputs bound to compile-time values (they become constants, not
  /// program inputs): inputs that configure shapes, axes or pads must be
  /// known when the program is specialized.
  std::map<std::string, DenseElementsAttr> constantInputs;
  /// Never fold an op with a float initializer operand (training: those
  /// initializers become parameters, and folding e.g. Transpose(W) or
  /// Gather(W, constant indices) would leave W dead and train a constant copy
  /// instead). Ops on other constants still fold.
  bool keepFloatInitializers = false;
  /// Import-time constant evaluation materializes no result larger than this
  /// many elements (ConstantOfShape, Range, folded ops): larger ones stay ops
  /// and are listed in a warning. As forge-fold-constants' max-elements.
  int64_t maxFoldElements = int64_t(1) << 22; // forge::kMaxFoldElements
  /// Thin bundles (forgec --weights external): float initializers stored as
  /// ONNX external data are not read (their files need not exist); they
  /// import as zero placeholders and the module attribute
  /// `forge.external_weights` maps each name to [location, offset, length,
  /// crc32 or -1 when the file was absent]. Needs keepFloatInitializers.
  bool externalWeights = false;
  /// Training: torch.onnx.export (eval mode, its default) merges parameters
  /// of equal value (every zero bias, every LayerNorm weight of ones) into one
  /// initializer and leaves `Identity` nodes named after the others. With this
  /// set, each Identity of a float initializer becomes its own initializer
  /// (so its own parameter) with the shared value; the module attribute
  /// `forge.untied_initializers` maps each new name to the shared one. Truly
  /// tied weights (no Identity) stay tied. Needs keepFloatInitializers.
  bool untieSharedInitializers = false;
};

/// Imports an ONNX model file. Errors are reported through the context's
/// diagnostic handler (op, node name, file) and yield a null ref.
OwningOpRef<ModuleOp> importOnnxFile(MLIRContext *context, const std::string &path,
                                     const ImportOptions &options);
/// Imports serialized ModelProto bytes (`origin` names them in errors).
OwningOpRef<ModuleOp> importOnnxBytes(MLIRContext *context, llvm::StringRef bytes,
                                      const std::string &origin, const ImportOptions &options);

/// Decodes a serialized ONNX TensorProto (for example a backend test's
/// input_0.pb) into a constant; errors go to the context's diagnostics.
FailureOr<DenseElementsAttr> importTensorProto(MLIRContext *context, llvm::StringRef bytes,
                                               const std::string &origin);

/// ONNX op types (default domain) the importer handles, sorted.
std::vector<std::string> supportedOnnxOps();

} // namespace mlir::forge

#endif // FORGE_IMPORT_ONNXIMPORTER_H
