// Writing trained values back into the source ONNX model (forge-train
// --export-onnx). Lives in its own library, ForgeOnnxExport
// (runtime/lib/export), the only runtime code that links onnx_proto; the
// core runtime stays free of it.
#pragma once

#include <string>
#include <vector>

#include "forge/runtime/Executor.h"
#include "forge/runtime/Shards.h"
#include "forge/runtime/Status.h"

namespace forge::rt {

struct OnnxExportReport {
  std::vector<std::string> replaced;         // initializers written
  std::vector<std::string> missingParameters; // PARAMETERs with no initializer of that name
};

/// Reads the ONNX model `sourcePath`, replaces the data of every graph
/// initializer named like a PARAMETER or STATE tensor of `ex` by the
/// tensor's current value (raw_data; external data becomes inline), and
/// writes the model to `outPath` atomically. The initializer's element type
/// and dims must match the tensor's; anything else is an error naming it, and
/// so is a model none of whose initializers names a tensor of `ex`. An empty
/// `outPath` only checks (forge-train does so before training). A tensor split
/// over ranks (forgec --tp, ZeRO-1's state) is matched and written whole: its
/// value from `whole` (gatherShards).
Expected<OnnxExportReport> exportOnnx(const std::string &sourcePath, const std::string &outPath,
                                      const Executor &ex, const WholeTensors *whole = nullptr);

} // namespace forge::rt
