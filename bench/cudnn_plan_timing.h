// cudnn_plan_timing.h: one plan of a cuDNN frontend graph, built and timed: the loop the
// cuDNN probes (cudnn_fusion_probe.cpp, attention_plans_probe.cpp) share. Header-only, so
// each probe stays one g++ line (the include resolves beside the probe's source).
#pragma once

#include <cuda_runtime.h>
#include <cudnn_frontend.h>

#include <cstdint>
#include <unordered_map>

/// Why a plan has no time (timePlanAtIndex's negative results).
enum PlanFailure : int { kPlanNotBuilt = -1, kPlanWorkspace = -2, kPlanDidNotRun = -3 };

/// Builds plan `index` of `g` and, if its workspace (`need`) fits in `wsBytes` and it runs,
/// times it: 3 warm-up runs, then the mean of 20. Returns milliseconds, or a PlanFailure.
inline float timePlanAtIndex(cudnn_frontend::graph::Graph &g, cudnnHandle_t handle,
                             std::unordered_map<int64_t, void *> &pack, void *ws, size_t wsBytes,
                             int64_t index, int64_t &need) {
  need = 0;
  if (g.build_plan_at_index(index).is_bad())
    return kPlanNotBuilt;
  if (g.get_workspace_size_plan_at_index(index, need).is_bad() ||
      need > static_cast<int64_t>(wsBytes))
    return kPlanWorkspace;
  bool ok = true;
  for (int r = 0; r < 3 && ok; ++r)
    ok = g.execute_plan_at_index(handle, pack, ws, index).is_good();
  if (!ok || cudaDeviceSynchronize() != cudaSuccess) {
    cudaGetLastError();
    return kPlanDidNotRun;
  }
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int r = 0; r < 20; ++r)
    g.execute_plan_at_index(handle, pack, ws, index);
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / 20;
}
