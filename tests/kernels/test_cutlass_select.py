"""The CUTLASS tile and swizzle choice (kernels/cutlass/w8a8_sm90_select.h), without a GPU:
the header is plain C++, compiled here with the system C++ compiler into a small harness.

Reference: the choices the header's comments document for every Qwen3-1.7B/8B/14B Linear
(and 8192^3), written out below; the GPU run checks that each tile computes the same bits.
"""

import shutil
import subprocess

import pytest

from requant.kernels import cutlass

CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
pytestmark = pytest.mark.skipif(CXX is None, reason="needs a C++ compiler")

HARNESS = r"""
#include <cstdio>
#include "w8a8_sm90_select.h"
int main() {
  int m, n, k;
  while (std::scanf("%d %d %d", &m, &n, &k) == 3) {
    const int t = requant::w8a8_sm90_default_tile(m, n);
    std::printf("%d %d %s\n", t, requant::w8a8_sm90_default_swizzle(m, n, k, t), requant::w8a8_sm90_tile_name(t));
  }
  return 0;
}
"""

# (N, K) per Linear of each model.
QWEN3 = {
    "1.7B": {"q,o": (2048, 2048), "k,v": (1024, 2048), "gate,up": (6144, 2048), "down": (2048, 6144)},
    "8B": {"q,o": (4096, 4096), "k,v": (1024, 4096), "gate,up": (12288, 4096), "down": (4096, 12288)},
    "14B": {"q,o": (5120, 5120), "k,v": (1024, 5120), "gate,up": (17408, 5120), "down": (5120, 17408)},
}
# The documented choices at M = 512 (w8a8_sm90_default_tile's comment).
AT_512 = {
    ("1.7B", "q,o"): "small",
    ("1.7B", "k,v"): "small",
    ("1.7B", "gate,up"): "mid",
    ("1.7B", "down"): "small",
    ("8B", "q,o"): "mid",
    ("8B", "k,v"): "small",
    ("8B", "gate,up"): "medium",
    ("8B", "down"): "mid",
    ("14B", "q,o"): "mid",
    ("14B", "k,v"): "small",
    ("14B", "gate,up"): "medium",
    ("14B", "down"): "mid",
}


@pytest.fixture(scope="module")
def select(tmp_path_factory):
    d = tmp_path_factory.mktemp("select")
    (d / "h.cpp").write_text(HARNESS)
    exe = d / "h"
    inc = cutlass._HERE
    subprocess.run(
        [CXX, "-std=c++17", "-O1", f"-I{inc}", str(d / "h.cpp"), "-o", str(exe)], check=True, capture_output=True
    )

    def run(shapes):
        text = "".join(f"{m} {n} {k}\n" for m, n, k in shapes)
        out = subprocess.run([str(exe)], input=text, capture_output=True, text=True, check=True).stdout.splitlines()
        return [(cutlass.TILES[int(t)], int(sw), name) for t, sw, name in (line.split(" ", 2) for line in out)]

    return run


def test_tile_names_match_the_python_table(select):
    got = select([(1, 64, 64), (64, 64, 64), (4096, 4096, 64), (512, 4096, 64)])
    for tile, _, name in got:
        assert name.startswith(tile + ":"), (tile, name)


def test_choices_on_every_qwen3_linear(select):
    cases, want = [], []
    for model, lins in QWEN3.items():
        for lin, (n, k) in lins.items():
            for m in (1, 16, 17, 128, 512, 1024, 2048, 4096, 8192):
                cases.append((m, n, k))
                if m <= 16:
                    tile = "decode"
                elif m <= 128:
                    tile = "small"
                elif m == 512:
                    tile = AT_512[(model, lin)]
                elif m == 1024:
                    tile = {"1.7B": {"q,o": "mid", "down": "mid"}}.get(model, {}).get(
                        lin, "small" if lin == "k,v" else "medium"
                    )
                elif m == 2048 and lin == "k,v":
                    tile = "mid"
                else:
                    tile = "medium"
                swizzle = 8 if (model, lin) == ("14B", "down") and m >= 4096 else 1
                want.append((tile, swizzle))
    got = [(t, sw) for t, sw, _ in select(cases)]
    bad = [(c, g, w) for c, g, w in zip(cases, got, want) if g != w]
    assert not bad, f"{len(bad)} choices differ from the documented ones, e.g. {bad[:5]}"


def test_square_8192_and_edges(select):
    got = select([(8192, 8192, 8192), (200, 8192, 64), (300, 1000, 128), (129, 100000, 16)])
    assert got[0][:2] == ("medium", 8)  # 64 MiB of w swept per raster line
    assert got[1][:2] == ("mid", 1)  # 2 x 64 = 128 tiles of 128x128 (< 198), 4 x 64 = 256 of 64x128
    assert got[2][:2] == ("small", 1)  # 24 tiles of 128x128, 40 of 64x128: too few for both
    assert got[3][:2] == ("medium", 1)  # 2 x 782 tiles
