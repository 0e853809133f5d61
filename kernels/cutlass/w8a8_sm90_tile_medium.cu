// Tile config 2 (medium: 128 x 128 x 128 Pingpong, cluster 2x1): see w8a8_sm90_select.h.
#include "w8a8_sm90.cuh"
using namespace cute;  // Shape, _64, ...
using Tile_medium = requant::W8A8Sm90<Shape<_128, _128, _128>, Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized, false>;
REQUANT_W8A8_DEFINE(medium, Tile_medium)
