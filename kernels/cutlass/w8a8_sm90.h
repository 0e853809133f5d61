// Host-side interface of the sm90 W8A8 kernels: plain C++ (no CUTLASS, no torch), so the
// torch binding and the CUDA translation units share it. See w8a8_sm90.cuh for numerics.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace requant {

// Raw operands, all on one device, contiguous row-major:
//   a [m, k] int8, w [n, k] int8, s_a [m] fp32, s_w [n] fp32, out [m, n] bf16 (as uint16 bits).
struct W8A8Problem {
  const int8_t* a;
  const int8_t* w;
  const float* s_a;
  const float* s_w;
  uint16_t* out;
  int m, n, k;
  int swizzle;  // persistent tile scheduler's max_swizzle_size (1, 2, 4, 8): L2 reuse only
};

enum W8A8Status : int {
  kW8A8Ok = 0,
  kW8A8CannotImplement = 1,
  kW8A8InitFailed = 2,
  kW8A8LaunchFailed = 3,
  kW8A8UnknownTile = 4,
};

// Tile configurations (index = the `tile` argument of the Python API). Every one computes
// the same bits: int32 accumulation is exact, and the epilogue is the same EVT.
//   0 decode : swap AB, CTA 64(n) x 16(m) x 128, Pingpong, cluster 1x1     (m <= 16)
//   1 small  : swap AB, CTA 64(n) x 64(m) x 128, Pingpong, cluster 1x1     (16 < m <= 128, and
//              m <= 1024 when 128x128 tiles would not fill one wave of 132 SMs)
//   2 medium : CTA 128 x 128 x 128, Pingpong,    cluster 2x1 (w multicast) (every other m > 128)
//   3 large  : CTA 128 x 256 x 128, Cooperative, cluster 2x1               (benchmark alternative)
//   4 large2 : CTA 256 x 128 x 128, Cooperative, cluster 1x2               (benchmark alternative)
//   5 medium_k256 : CTA 128 x 128 x 256, Pingpong, cluster 2x1            (benchmark alternative)
//   6 large3 : CTA 256 x 128 x 128, Cooperative, cluster 2x1               (benchmark alternative)
// Measured on an H200 (benchmarks/results/kernels_bench.md): on Qwen3 shapes the 128x128
// Pingpong tile beat every Cooperative tile at every m > 128 once the grid fills the chip;
// below one wave (e.g. Qwen3-1.7B q/o at m = 512: 64 tiles) the swapped 64x64 tile won.
// (At 8192^3 the Cooperative 128x256 tile with swizzle 8 was faster; see the README.)
constexpr int kW8A8NumTiles = 7;
constexpr int kW8A8Sms = 132;  // H100/H200 SXM

inline int w8a8_sm90_default_tile(int m, int n) {
  if (m <= 16) return 0;
  if (m <= 128) return 1;
  const long tiles_128 = static_cast<long>((m + 127) / 128) * ((n + 127) / 128);
  if (m <= 1024 && tiles_128 < kW8A8Sms) return 1;
  return 2;
}

size_t w8a8_sm90_workspace(int tile, const W8A8Problem& p);
int w8a8_sm90_run(int tile, const W8A8Problem& p, void* workspace, cudaStream_t stream);
const char* w8a8_sm90_tile_name(int tile);

}  // namespace requant
