// Tile config 5 (medium_k256, benchmark alternative): see w8a8_sm90.h.
#include "w8a8_sm90.cuh"
using namespace cute;  // Shape, _64, ...
using Tile_medium_k256 = requant::W8A8Sm90<Shape<_128, _128, _256>, Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized, false>;
REQUANT_W8A8_DEFINE(medium_k256, Tile_medium_k256)
