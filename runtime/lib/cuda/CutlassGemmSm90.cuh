// The CUTLASS sm90 GEMM the runtime's kernels (CutlassGemm.cu) and the epilogue probe
// (bench/cutlass_epilogue_probe.cu) instantiate: a TMA warp-specialized main loop on bf16
// A (LayoutA) and K-major bf16 B, f32 accumulation, a column-major D (and C) with the
// epilogue visitor tree FusionOp, in one of two configurations:
//   PingPong = false: cooperative, 128x256x64 tiles (two consumer warp groups share a tile)
//   PingPong = true:  ping-pong, 128x128x64 tiles (one warp group's epilogue overlaps the
//                     other's main loop)
// both with a 1x2 cluster (two CTAs along N share A's tiles: multicast). nvcc only (CUTLASS's
// headers).
#pragma once

#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/epilogue/thread/activation.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <type_traits>

namespace forge::cutlass_sm90 {

using bf16 = cutlass::bfloat16_t;
using ColMajor = cutlass::layout::ColumnMajor;
using RowMajor = cutlass::layout::RowMajor;

template <class LayoutA, class ElementC, class ElementD, class FusionOp, bool PingPong>
struct Gemm {
  using Tile = std::conditional_t<PingPong, cute::Shape<cute::_128, cute::_128, cute::_64>,
                                  cute::Shape<cute::_128, cute::_256, cute::_64>>;
  using Cluster = cute::Shape<cute::_1, cute::_2, cute::_1>;
  using EpilogueSchedule = std::conditional_t<PingPong, cutlass::epilogue::TmaWarpSpecialized,
                                              cutlass::epilogue::TmaWarpSpecializedCooperative>;
  using KernelSchedule =
      std::conditional_t<PingPong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                         cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  static constexpr int AlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  static constexpr int AlignC =
      std::is_void_v<ElementC> ? AlignD : 128 / cutlass::sizeof_bits<ElementC>::value;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, ColMajor, AlignC,
      ElementD, ColMajor, AlignD, EpilogueSchedule, FusionOp>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, bf16, LayoutA, 8, bf16, ColMajor, 8,
      float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Op = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::StrideA;
  using StrideB = typename Kernel::StrideB;
  using StrideC = typename Kernel::StrideC;
  using StrideD = typename Kernel::StrideD;
};

namespace fusion = cutlass::epilogue::fusion;

// The epilogues the runtime runs (CutlassGemm.h names them), in configuration PP:
// D bf16 = acc + bias (bf16)
template <bool PP>
using BiasGemm = Gemm<RowMajor, void, bf16, fusion::LinCombPerRowBias<bf16, float, bf16, void>, PP>;
// aux = acc + bias; D bf16 = gelu_tanh(aux). The bias is bf16 in the runtime (as
// cuBLASLt's); the probe also times an f32 one.
template <bool PP, class Bias>
using GeluAuxBiasTypeGemm =
    Gemm<RowMajor, void, bf16,
         fusion::LinCombPerRowBiasEltActAux<ColMajor, cutlass::epilogue::thread::GELU_taylor, bf16,
                                            float, bf16, Bias, void>,
         PP>;
template <bool PP> using GeluAuxGemm = GeluAuxBiasTypeGemm<PP, bf16>;
// D f32 = acc + beta C (f32) + bias (f32): the residual stream's GEMMs
template <bool PP>
using ResidualGemm =
    Gemm<RowMajor, float, float, fusion::LinCombPerRowBias<float, float, float, float>, PP>;
// D bf16 = acc * gelu_tanh'(aux); A M-major (the weight read untransposed)
template <bool PP>
using DgeluGemm = Gemm<
    ColMajor, void, bf16,
    fusion::LinCombDeEltAct<ColMajor, cutlass::epilogue::thread::dGELU, bf16, float, bf16, void>,
    PP>;

} // namespace forge::cutlass_sm90
