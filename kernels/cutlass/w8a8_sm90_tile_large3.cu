// Tile config 6 (large3, benchmark alternative): see w8a8_sm90.h.
#include "w8a8_sm90.cuh"
using namespace cute;  // Shape, _64, ...
using Tile_large3 = requant::W8A8Sm90<Shape<_256, _128, _128>, Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative, cutlass::epilogue::TmaWarpSpecializedCooperative, false>;
REQUANT_W8A8_DEFINE(large3, Tile_large3)
