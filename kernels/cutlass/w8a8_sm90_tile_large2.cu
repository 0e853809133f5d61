// Tile config 4 (large2, benchmark alternative): see w8a8_sm90.h.
#include "w8a8_sm90.cuh"
using namespace cute;  // Shape, _64, ...
using Tile_large2 = requant::W8A8Sm90<Shape<_256, _128, _128>, Shape<_1, _2, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative, cutlass::epilogue::TmaWarpSpecializedCooperative, false>;
REQUANT_W8A8_DEFINE(large2, Tile_large2)
