// Dispatch over the tile configurations of w8a8_sm90.cuh. Each configuration is compiled
// in its own translation unit (w8a8_sm90_tile_*.cu) so that the JIT build runs them in
// parallel; this file only routes a tile index to them.
#include "w8a8_sm90.h"

namespace requant {

#define REQUANT_W8A8_DECLARE(NAME)                                          \
  size_t w8a8_sm90_workspace_##NAME(const W8A8Problem& p);                  \
  int w8a8_sm90_run_##NAME(const W8A8Problem& p, void* ws, cudaStream_t s);
REQUANT_W8A8_DECLARE(decode)
REQUANT_W8A8_DECLARE(small)
REQUANT_W8A8_DECLARE(medium)
REQUANT_W8A8_DECLARE(large)
REQUANT_W8A8_DECLARE(large2)
REQUANT_W8A8_DECLARE(medium_k256)
REQUANT_W8A8_DECLARE(large3)
#undef REQUANT_W8A8_DECLARE

const char* w8a8_sm90_tile_name(int tile) {
  switch (tile) {
    case 0: return "decode: swapAB 64x16x128 pingpong c1x1";
    case 1: return "small: swapAB 64x64x128 pingpong c1x1";
    case 2: return "medium: 128x128x128 pingpong c2x1";
    case 3: return "large: 128x256x128 cooperative c2x1";
    case 4: return "large2: 256x128x128 cooperative c1x2";
    case 5: return "medium_k256: 128x128x256 pingpong c2x1";
    case 6: return "large3: 256x128x128 cooperative c2x1";
    default: return "unknown";
  }
}

size_t w8a8_sm90_workspace(int tile, const W8A8Problem& p) {
  switch (tile) {
    case 0: return w8a8_sm90_workspace_decode(p);
    case 1: return w8a8_sm90_workspace_small(p);
    case 2: return w8a8_sm90_workspace_medium(p);
    case 3: return w8a8_sm90_workspace_large(p);
    case 4: return w8a8_sm90_workspace_large2(p);
    case 5: return w8a8_sm90_workspace_medium_k256(p);
    case 6: return w8a8_sm90_workspace_large3(p);
    default: return 0;
  }
}

int w8a8_sm90_run(int tile, const W8A8Problem& p, void* workspace, cudaStream_t stream) {
  switch (tile) {
    case 0: return w8a8_sm90_run_decode(p, workspace, stream);
    case 1: return w8a8_sm90_run_small(p, workspace, stream);
    case 2: return w8a8_sm90_run_medium(p, workspace, stream);
    case 3: return w8a8_sm90_run_large(p, workspace, stream);
    case 4: return w8a8_sm90_run_large2(p, workspace, stream);
    case 5: return w8a8_sm90_run_medium_k256(p, workspace, stream);
    case 6: return w8a8_sm90_run_large3(p, workspace, stream);
    default: return kW8A8UnknownTile;
  }
}

}  // namespace requant
