//===- OnnxExport.h - forge IR -> ONNX graph for viewing in Netron ---------===//
//
// Writes the forward graph (or, for training modules, @train_step) with each
// forge op as a node of domain "ai.forge" (op type = mnemonic,
// attributes carried over) with value_info for every tensor, so Netron shows
// the graph with shapes after any pass. Constants with more than
// `maxInlineElements` elements are written without their data.
//
//===----------------------------------------------------------------------===//
#ifndef FORGE_EXPORT_ONNXEXPORT_H
#define FORGE_EXPORT_ONNXEXPORT_H

#include <string>

#include "mlir/IR/BuiltinOps.h"

namespace mlir::forge {

LogicalResult exportGraphToOnnx(ModuleOp module, const std::string &path,
                                int64_t maxInlineElements = 64);

} // namespace mlir::forge

#endif // FORGE_EXPORT_ONNXEXPORT_H
