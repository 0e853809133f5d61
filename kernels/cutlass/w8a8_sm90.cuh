// W8A8 scaled GEMM for sm90a from the CUTLASS 3.x collective builders.
//
//   out[m, n] = bf16_rne( s_a[m] * fp32( s_w[n] * fp32(acc[m, n]) ) )   (the CUTLASS order)
//   acc[m, n] = sum_k a[m, k] * w[n, k]                                  (exact int32)
//
// Mainloop: TMA warp-specialized (Pingpong or Cooperative, chosen per tile config),
// int8 x int8 -> int32 wgmma. Integer accumulation is exact (|acc| < 2^31 is checked
// by the caller, K <= MAX_K), so neither the tile shape, the K split inside a tile, nor
// the schedule can change a single bit: tile choice is a pure performance decision.
//
// Epilogue: an epilogue visitor tree (EVT), written so the two multiplies stay two
// separately rounded fp32 operations, in this order:
//
//   Sm90EVT< Compute<multiplies, bf16, float, RN>,          u -> bf16_rne(s_a * t)
//            ColBroadcast(s_a),                              per output row
//            Sm90EVT< Compute<multiplies, float, float, RN>, t = fp32_rn(s_w * float(acc))
//                     RowBroadcast(s_w),                     per output column
//                     AccFetch > >
//
//  * int32 -> float conversion: NumericConverter<float, int32_t, round_to_nearest> is a
//    static_cast, i.e. cvt.rn.f32.s32 (round to nearest even).
//  * No add anywhere, so nvcc has nothing to contract into an FMA; each multiply is
//    one IEEE-rounded mul.rn.f32 (CUDA's default -fmad only fuses mul+add).
//  * float -> bf16: NumericArrayConverter<bfloat16_t, float, N, round_to_nearest>,
//    i.e. cvt.rn.bf16x2.f32 (round to nearest even).
//
// Small-M ("decode") configs compute the transposed problem out^T = w . a^T (swap AB),
// so that the token dimension sits in the narrow N slot of the wgmma tile (16 or 64)
// instead of wasting a 64-row tile on one token. The output is then written
// column-major as [N, M], which is exactly row-major [M, N]; s_w becomes the column
// broadcast and s_a the row broadcast. The EVT keeps the same order (s_w first, then
// s_a), so the bits are the same as the unswapped kernel.
//
// Alignment (TMA): rows of a and w must be 16-byte aligned (K % 16 == 0) and rows of the
// output too (N % 8 == 0 for bf16); the host binding refuses other shapes clearly.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "w8a8_sm90.h"

namespace requant {

// One GEMM type per tile configuration.
//   TileShape_    CTA tile (M, N, K) of the problem the kernel sees (after any swap)
//   Cluster_      thread-block cluster; >1 along M multicasts the B tile over TMA
//   Mainloop_     KernelTmaWarpSpecializedPingpong / KernelTmaWarpSpecializedCooperative
//   Epilogue_     the matching TmaWarpSpecialized / TmaWarpSpecializedCooperative
//   kSwapAB       compute out^T = w . a^T (see the file comment)
template <class TileShape_, class Cluster_, class Mainloop_, class Epilogue_, bool kSwapAB>
struct W8A8Sm90 {
  using TileShape = TileShape_;
  using ClusterShape = Cluster_;
  using ElementIn = int8_t;
  using ElementAcc = int32_t;
  using ElementCompute = float;
  using ElementOut = cutlass::bfloat16_t;
  static constexpr auto RN = cutlass::FloatRoundStyle::round_to_nearest;

  // Unswapped: A = a [M,K] row-major, B = w [N,K] ("column-major K x N"), D = out row-major.
  // Swapped:   A = w [N,K] row-major, B = a [M,K],                      D = out^T column-major.
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = cute::conditional_t<kSwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlignIn = 16;   // 16 bytes of int8 per TMA row
  static constexpr int kAlignOut = 8;   // 16 bytes of bf16

  // Per-row and per-column scales of the problem the kernel sees. Alignment 1: scalar,
  // predicated loads, so any M (1 included) is safe for the scale vectors.
  using ColScale = cutlass::epilogue::fusion::Sm90ColBroadcast<
      0, TileShape, float, float, cute::Stride<cute::_1, cute::_0, cute::_0>, 1>;
  using RowScale = cutlass::epilogue::fusion::Sm90RowBroadcast<
      0, TileShape, float, float, cute::Stride<cute::_0, cute::_1, cute::_0>, 1>;
  // s_w lives on output columns (n) unswapped, on the kernel's rows when swapped.
  using ScaleW = cute::conditional_t<kSwapAB, ColScale, RowScale>;
  using ScaleA = cute::conditional_t<kSwapAB, RowScale, ColScale>;

  using Inner = cutlass::epilogue::fusion::Sm90EVT<  // t = fp32_rn(s_w * float(acc))
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, RN>,
      ScaleW, cutlass::epilogue::fusion::Sm90AccFetch>;
  using Evt = cutlass::epilogue::fusion::Sm90EVT<    // y = bf16_rne(fp32_rn(s_a * t))
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, ElementOut, float, RN>,
      ScaleA, Inner>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, ElementCompute,
      void, LayoutD, kAlignOut,          // no C operand
      ElementOut, LayoutD, kAlignOut,
      Epilogue_, Evt>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      ElementIn, LayoutA, kAlignIn, ElementIn, LayoutB, kAlignIn, ElementAcc,
      TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      Mainloop_>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<
      cute::Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue,
      cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const W8A8Problem& p) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    // Kernel-problem sizes: (rows, cols, K) after the optional swap.
    const int rows = kSwapAB ? p.n : p.m;
    const int cols = kSwapAB ? p.m : p.n;
    const int8_t* pa = kSwapAB ? p.w : p.a;
    const int8_t* pb = kSwapAB ? p.a : p.w;
    const float* s_rows = kSwapAB ? p.s_w : p.s_a;
    const float* s_cols = kSwapAB ? p.s_a : p.s_w;
    auto sa = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(rows, p.k, 1));
    auto sb = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(cols, p.k, 1));
    auto sd = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(rows, cols, 1));

    typename ColScale::Arguments col_args{s_rows};
    typename RowScale::Arguments row_args{s_cols};
    typename ScaleW::Arguments sw_args;
    typename ScaleA::Arguments sa_args;
    if constexpr (kSwapAB) {
      sw_args = col_args;
      sa_args = row_args;
    } else {
      sw_args = row_args;
      sa_args = col_args;
    }
    // EVT arguments mirror the tree: {children..., op}.
    typename Evt::Arguments evt{sa_args, {sw_args, {}, {}}, {}};

    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {rows, cols, p.k, 1},
        {pa, sa, pb, sb},
        {evt, nullptr, sd, reinterpret_cast<ElementOut*>(p.out), sd}};
    args.scheduler.max_swizzle_size = p.swizzle > 0 ? p.swizzle : 1;
    return args;
  }

  static size_t workspace_size(const W8A8Problem& p) {
    return Gemm::get_workspace_size(arguments(p));
  }

  static int run(const W8A8Problem& p, void* workspace, cudaStream_t stream) {
    Gemm gemm;
    auto args = arguments(p);
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return kW8A8CannotImplement;
    if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return kW8A8InitFailed;
    if (gemm.run(stream) != cutlass::Status::kSuccess) return kW8A8LaunchFailed;
    return cudaGetLastError() == cudaSuccess ? kW8A8Ok : kW8A8LaunchFailed;
  }
};

}  // namespace requant

// One translation unit per tile config (they compile in parallel): each defines the
// two entry points for its config through this macro.
#define REQUANT_W8A8_DEFINE(NAME, GEMM)                                                        \
  namespace requant {                                                                           \
  size_t w8a8_sm90_workspace_##NAME(const W8A8Problem& p) { return GEMM::workspace_size(p); }  \
  int w8a8_sm90_run_##NAME(const W8A8Problem& p, void* ws, cudaStream_t s) {                  \
    return GEMM::run(p, ws, s);                                                                 \
  }                                                                                             \
  }
