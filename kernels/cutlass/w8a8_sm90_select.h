// Tile and scheduler-swizzle choice of the sm90 W8A8 kernels, by problem shape.
// Plain C++ (no CUDA, no CUTLASS, no torch): the binding includes it through w8a8_sm90.h, and
// tests/kernels/test_cutlass_select.py compiles it with the system C++ compiler to pin the
// choices on every Qwen3 shape without a GPU.
//
// Every tile and every swizzle computes the same bits: the int32 accumulation is exact and
// the epilogue (EVT) is the same in all of them. The choice is about speed only.
//
// Tiles (index = the `tile` argument of requant.kernels.cutlass.scaled_mm):
//   0 decode : swap AB, CTA 64(n) x 16(m) x 128, Pingpong, cluster 1x1
//   1 small  : swap AB, CTA 64(n) x 64(m) x 128, Pingpong, cluster 1x1
//   2 medium : CTA 128 x 128 x 128, Pingpong,    cluster 2x1 (w tile multicast to 2 CTAs)
//   3 large  : CTA 128 x 256 x 128, Cooperative, cluster 2x1 (benchmark alternative: at 8192^3
//              with swizzle 8 it led one sweep, 1426 vs 1338 TOPS for medium, and was level in
//              another, 1374 vs 1360; on Qwen3 shapes it never won)
//   4 mid    : CTA  64 x 128 x 128, Pingpong,    cluster 2x1 (new; the shape of vLLM's int8
//              sm90 config for 64 < m <= 128)
// Dropped after benchmarks/results/kernels_bench.md (never the fastest on a Qwen3 shape, and
// each one cost a translation unit on every JIT build): 256x128 Cooperative c1x2 and c2x1,
// 128x128x256 Pingpong.
#pragma once

namespace requant {

enum W8A8Tile : int {
  kW8A8TileDecode = 0,
  kW8A8TileSmall = 1,
  kW8A8TileMedium = 2,
  kW8A8TileLarge = 3,
  kW8A8TileMid = 4,
};
constexpr int kW8A8NumTiles = 5;
constexpr int kW8A8Sms = 132;  // H100/H200 SXM
// Tiles a persistent Pingpong grid (one CTA per SM) needs so that most CTAs get two: the
// two consumer warp groups of a Pingpong CTA work on different tiles, and one's epilogue
// hides behind the other's mainloop only when there is a second tile.
constexpr long kW8A8PingpongTiles = 3L * kW8A8Sms / 2;  // 198
// Operand bytes that one raster line of the persistent scheduler may sweep before the
// default tile turns on scheduler swizzle 8 (the H200's L2 is 50 MiB).
constexpr long kW8A8SwizzleBytes = 48L << 20;

constexpr long w8a8_cdiv(long a, long b) { return (a + b - 1) / b; }

// The default tile for an [m, n] output.
//   m <= 16        decode (the token dimension fits the 16-wide wgmma N slot)
//   17 <= m <= 128 small
//   m > 128        the largest of medium (128x128), mid (64x128), small (64x64) that gives
//                  at least kW8A8PingpongTiles tiles; small if none does.
// Measured before mid existed (kernels_bench.md, H200, TOPS): at m = 512 the old rule ran
// Qwen3-8B q,o and down (128 tiles of 128x128, one per CTA) on small: 819 and 882, while
// Triton's 64x128 tile gave 1046 and 1198; medium won wherever it had >= 2 tiles per CTA
// (8B gate,up 1359, 14B gate,up 1292). With this rule, at m = 512: q,o/down of 8B and 14B
// and 1.7B gate,up run mid; 8B/14B gate,up run medium; every k,v and 1.7B q,o/down small.
// At m = 2048, k,v (n = 1024: 128 tiles of 128x128) runs mid; every other Qwen3 Linear at
// m >= 1024 runs medium.
inline int w8a8_sm90_default_tile(int m, int n) {
  if (m <= 16) return kW8A8TileDecode;
  if (m <= 128) return kW8A8TileSmall;
  if (w8a8_cdiv(m, 128) * w8a8_cdiv(n, 128) >= kW8A8PingpongTiles) return kW8A8TileMedium;
  if (w8a8_cdiv(m, 64) * w8a8_cdiv(n, 128) >= kW8A8PingpongTiles) return kW8A8TileMid;
  return kW8A8TileSmall;
}

// The default scheduler swizzle (max_swizzle_size) for `tile` on an m x n x k problem.
// CUTLASS's persistent scheduler rasters along M when there are more N tiles than M tiles,
// else along N (RasterOrderOptions::Heuristic). Unswizzled, one raster line then sweeps the
// whole of the other operand: all of a (m*k bytes) along M, all of w (n*k bytes) along N.
// When that exceeds kW8A8SwizzleBytes it no longer stays in L2 from one line to the next,
// and swizzle 8 (groups of 8 tiles across the raster) keeps the working set small.
// Measured (kernels_bench.md, the same sweep, medium tile): 8192^3 (64 MiB swept) 1071 TOPS
// with swizzle 1, 1252 with 4, 1338 with 8; Qwen3-1.7B q,o at m = 8192 (4 MiB swept) 1425
// with 1 and 1258 with 8, so small problems keep swizzle 1. Of the Qwen3 Linears only 14B
// down crosses the threshold: from m = 2892 (m*k > 48 MiB while rastering along M), and
// n*k = 85 MiB once m >= 5120 rasters along N. Other tiles keep swizzle 1.
inline int w8a8_sm90_default_swizzle(int m, int n, int k, int tile) {
  if (tile != kW8A8TileMedium && tile != kW8A8TileLarge) return 1;
  const long tiles_m = w8a8_cdiv(m, 128);
  const long tiles_n = w8a8_cdiv(n, tile == kW8A8TileLarge ? 256 : 128);
  const long swept = tiles_n > tiles_m ? static_cast<long>(m) * k : static_cast<long>(n) * k;
  return swept > kW8A8SwizzleBytes ? 8 : 1;
}

inline const char* w8a8_sm90_tile_name(int tile) {
  switch (tile) {
    case kW8A8TileDecode: return "decode: swapAB 64x16x128 pingpong c1x1";
    case kW8A8TileSmall: return "small: swapAB 64x64x128 pingpong c1x1";
    case kW8A8TileMedium: return "medium: 128x128x128 pingpong c2x1";
    case kW8A8TileLarge: return "large: 128x256x128 cooperative c2x1";
    case kW8A8TileMid: return "mid: 64x128x128 pingpong c2x1";
    default: return "unknown";
  }
}

}  // namespace requant
