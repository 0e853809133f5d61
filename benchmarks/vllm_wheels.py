"""Fill the ignored folder .vllm/ with vLLM 0.26.0 and the wheels its offline path needs, in
parts small enough to travel with one device call each (benchmarks/gpu_vllm.sh joins them).

    python3 -m benchmarks.vllm_wheels [--part-mb 20] [--dir .vllm] [--moe]

vLLM 0.26.0 pins torch 2.11.0, the GPU machine's. Its wheel (304 MB) is repacked without what
a dense Qwen3 on sm90 never loads: the FlashAttention-2 kernels (sm80; FA3 serves sm90), the
MoE extension, the Rust front end (`vllm-rs`, used only with VLLM_RUST_FRONTEND_PATH) and the
sm100 attention sources (`third_party/fmha_sm100`, imported by MiniMax-M3 only) and the vendored
DeepGEMM (`third_party/deep_gemm`, FP8 only). Their imports are guarded in vLLM. `--moe` keeps the
MoE extension (41 MB compressed), which a Qwen3-MoE checkpoint needs. The repacked wheel and the dependency wheels go into one tar,
split into parts of --part-mb MB; SHA256SUMS names every part and the whole tar. A part travels
beside the working tree, 64 MiB in all: the default part is as large as fits beside this checkout's
tree (tracked and untracked files git does not ignore) with 1 MB to spare (26 MB beside a 39 MB tree:
5 calls for the ~125 MB tar).

Assumptions: pip reaches PyPI here; the GPU machine has Python 3.12 (cp312, manylinux_2_28).
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

__all__ = ["VLLM", "DEPENDENCIES", "DROPPED", "DROPPED_DIRS", "dropped", "part_bytes", "repack", "split"]

CARRY_LIMIT = 64 << 20  # the working tree and the carried paths of one device call
SPARE = 1_000_000

VLLM = "vllm==0.26.0"
# The wheels the offline path imports that the GPU image lacks (measured on a CPU up to device
# init: `from vllm import LLM`, the v1 engine core over zmq, Qwen3, the W8A8 int8 scheme).
DEPENDENCIES = [
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "cbor2==6.3.0",
    "pyzmq==27.3.0",
    "msgspec==0.22.0",
    "openai==3.22.1",
    "httpx2==2.13.1",
    "sniffio==1.3.1",
    "openai-harmony==0.0.8",
    "pybase64==1.4.3",
    "cachetools==7.2.0",
    "partial-json-parser==0.2.1.1.post7",
    "fastapi==0.136.3",
    "starlette==1.7.0",
    "llguidance==1.6.1",
    "xgrammar==0.2.7",
    "apache-tvm-ffi==0.1.10",
    "compressed-tensors==0.17.0",
    "loguru==0.7.3",
    "blake3==1.0.8",
]
MOE_EXTENSION = "vllm/_moe_C_stable_libtorch.abi3.so"  # 41 MB in the wheel; --moe keeps it
DROPPED = (
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    MOE_EXTENSION,
    "vllm/vllm-rs",
)
# every member under these folders: sm100 attention (MiniMax-M3 only); DeepGEMM (FP8 block GEMMs,
# off by VLLM_USE_DEEP_GEMM=0; its import falls back to None when missing, vllm/utils/deep_gemm.py)
DROPPED_DIRS = ("vllm/third_party/fmha_sm100/", "vllm/third_party/deep_gemm/")


def dropped(name: str, moe: bool = False) -> bool:
    """Whether the repack leaves `name` out; moe: keep the MoE extension (a Qwen3-MoE checkpoint's
    fused-MoE path calls its moe_align_block_size and topk_softmax: vllm/_custom_ops.py)."""
    if moe and name == MOE_EXTENSION:
        return False
    return name in DROPPED or name.startswith(DROPPED_DIRS)


PLATFORM = [
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--platform",
    "manylinux_2_28_x86_64",
    "--platform",
    "manylinux_2_17_x86_64",
    "--platform",
    "manylinux2014_x86_64",
]


def download(names: list[str], dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PLATFORM, "-d", str(dest), *names]
    subprocess.run(cmd, check=True)


def repack(wheel: Path, out: Path, moe: bool = False) -> Path:
    """`wheel` without DROPPED (moe: with the MoE extension), its RECORD rewritten to match (pip
    checks nothing else)."""
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        record = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        for info in src.infolist():
            if dropped(info.filename, moe) or info.filename == record:
                continue
            dst.writestr(info, src.read(info.filename))
        lines = src.read(record).decode().splitlines()
        kept = [line for line in lines if line and not dropped(line.split(",")[0], moe)]
        dst.writestr(record, "\n".join(kept) + "\n")
    return out


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_bytes(root: Path) -> int:
    """Bytes of what travels with every device call: tracked files and untracked ones git does
    not ignore (an un-ignored .vllm/ would count here: ignore it first)."""
    out = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout
    names = {n for n in out.decode().split("\0") if n}
    return sum((root / n).stat().st_size for n in names if (root / n).is_file())


def part_bytes(tree: int, limit: int = CARRY_LIMIT, spare: int = SPARE) -> int:
    """The largest part (whole MB) that travels beside a tree of `tree` bytes with `spare` left."""
    mb = (limit - tree - spare) // 1_000_000
    if mb < 1:
        raise ValueError(f"the working tree ({tree / 1e6:.1f} MB) leaves no room for a part in {limit >> 20} MiB")
    return mb * 1_000_000


def split(path: Path, part_bytes: int) -> list[Path]:
    parts = []
    with open(path, "rb") as f:
        for i, block in enumerate(iter(lambda: f.read(part_bytes), b"")):
            p = path.with_name(f"{path.name}.part{i:02d}")
            p.write_bytes(block)
            parts.append(p)
    return parts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path(".vllm"))
    ap.add_argument("--part-mb", type=int, default=None, help="default: as large as fits beside the tree")
    ap.add_argument(
        "--moe",
        action="store_true",
        help="keep the MoE extension (41 MB: about two more parts), for serving a Qwen3-MoE checkpoint",
    )
    args = ap.parse_args()
    if args.part_mb is None:
        tree = tree_bytes(Path.cwd())
        args.part_mb = part_bytes(tree) // 1_000_000
        print(f"working tree {tree / 1e6:.1f} MB: parts of {args.part_mb} MB")
    dl, wheels = args.dir / "dl", args.dir / "wheels"
    dl.mkdir(parents=True, exist_ok=True)
    wheels.mkdir(parents=True, exist_ok=True)
    if not list(dl.glob("vllm-0.26.0-*.whl")):
        download([VLLM], dl)
    download(DEPENDENCIES, wheels)
    (src,) = dl.glob("vllm-0.26.0-*.whl")
    repack(src, wheels / src.name, moe=args.moe)
    tar = args.dir / "vllm-wheels.tar"
    with tarfile.open(tar, "w") as t:
        for w in sorted(wheels.glob("*.whl")):
            t.add(w, arcname=f"wheels/{w.name}")
    for old in args.dir.glob("vllm-wheels.tar.part*"):
        old.unlink()
    parts = split(tar, args.part_mb * 1_000_000)
    sums = [f"{sha256(p)}  {p.name}" for p in [tar, *parts]]
    (args.dir / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    print(f"{tar}: {tar.stat().st_size / 1e6:.1f} MB in {len(parts)} parts of <= {args.part_mb} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
