// Host-side interface of the sm90 W8A8 kernels: plain C++ (no CUTLASS, no torch), so the
// torch binding and the CUDA translation units share it. See w8a8_sm90.cuh for numerics.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "w8a8_sm90_select.h"

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
  int swizzle;  // persistent tile scheduler's max_swizzle_size (1, 2, 4, 8): L2 reuse only, never bits
};

enum W8A8Status : int {
  kW8A8Ok = 0,
  kW8A8CannotImplement = 1,
  kW8A8InitFailed = 2,
  kW8A8LaunchFailed = 3,
  kW8A8UnknownTile = 4,
};

// Tile configurations, their names and the default choice by shape: w8a8_sm90_select.h.
size_t w8a8_sm90_workspace(int tile, const W8A8Problem& p);
int w8a8_sm90_run(int tile, const W8A8Problem& p, void* workspace, cudaStream_t stream);

}  // namespace requant
