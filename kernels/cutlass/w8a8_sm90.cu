// Dispatch over the tile configurations of w8a8_sm90.cuh. Each configuration is compiled
// in its own translation unit (w8a8_sm90_tile_*.cu) so that the JIT build runs them in
// parallel; this file only routes a tile index (w8a8_sm90_select.h) to them.
#include "w8a8_sm90.h"

namespace requant {

#define REQUANT_W8A8_DECLARE(NAME)                                          \
  size_t w8a8_sm90_workspace_##NAME(const W8A8Problem& p);                  \
  int w8a8_sm90_run_##NAME(const W8A8Problem& p, void* ws, cudaStream_t s);
REQUANT_W8A8_DECLARE(decode)
REQUANT_W8A8_DECLARE(small)
REQUANT_W8A8_DECLARE(medium)
REQUANT_W8A8_DECLARE(large)
REQUANT_W8A8_DECLARE(mid)
#undef REQUANT_W8A8_DECLARE

size_t w8a8_sm90_workspace(int tile, const W8A8Problem& p) {
  switch (tile) {
    case kW8A8TileDecode: return w8a8_sm90_workspace_decode(p);
    case kW8A8TileSmall: return w8a8_sm90_workspace_small(p);
    case kW8A8TileMedium: return w8a8_sm90_workspace_medium(p);
    case kW8A8TileLarge: return w8a8_sm90_workspace_large(p);
    case kW8A8TileMid: return w8a8_sm90_workspace_mid(p);
    default: return 0;
  }
}

int w8a8_sm90_run(int tile, const W8A8Problem& p, void* workspace, cudaStream_t stream) {
  switch (tile) {
    case kW8A8TileDecode: return w8a8_sm90_run_decode(p, workspace, stream);
    case kW8A8TileSmall: return w8a8_sm90_run_small(p, workspace, stream);
    case kW8A8TileMedium: return w8a8_sm90_run_medium(p, workspace, stream);
    case kW8A8TileLarge: return w8a8_sm90_run_large(p, workspace, stream);
    case kW8A8TileMid: return w8a8_sm90_run_mid(p, workspace, stream);
    default: return kW8A8UnknownTile;
  }
}

}  // namespace requant
