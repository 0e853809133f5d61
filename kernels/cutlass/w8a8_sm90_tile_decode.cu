// Tile config 0 (decode: swap AB, 64(n) x 16(m) x 128 Pingpong): see w8a8_sm90_select.h.
#include "w8a8_sm90.cuh"
using namespace cute;  // Shape, _64, ...
using Tile_decode = requant::W8A8Sm90<Shape<_64, _16, _128>, Shape<_1, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized, true>;
REQUANT_W8A8_DEFINE(decode, Tile_decode)
