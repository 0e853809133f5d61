// Tile config 3 (large: 128 x 256 x 128 Cooperative, cluster 2x1; benchmark alternative): see w8a8_sm90_select.h.
#include "w8a8_sm90.cuh"
using namespace cute;  // Shape, _64, ...
using Tile_large = requant::W8A8Sm90<Shape<_128, _256, _128>, Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative, cutlass::epilogue::TmaWarpSpecializedCooperative, false>;
REQUANT_W8A8_DEFINE(large, Tile_large)
