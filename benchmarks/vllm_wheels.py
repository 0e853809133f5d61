"""Fill the ignored folder .vllm/ with vLLM 0.26.0 and the wheels its offline path needs, in
parts small enough to travel with one device call each (benchmarks/gpu_vllm.sh joins them).

    python3 -m benchmarks.vllm_wheels [--part-mb 20] [--dir .vllm]

vLLM 0.26.0 pins torch 2.11.0, the GPU machine's. Its wheel (304 MB) is repacked without what
a dense Qwen3 on sm90 never loads: the FlashAttention-2 kernels (sm80; FA3 serves sm90), the
MoE extension and the Rust front end (`vllm-rs`, used only with VLLM_RUST_FRONTEND_PATH). Their
imports are guarded in vLLM. The repacked wheel and the dependency wheels go into one tar,
split into parts of --part-mb MB; SHA256SUMS names every part and the whole tar.

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

__all__ = ["VLLM", "DEPENDENCIES", "DROPPED", "repack", "split"]

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
DROPPED = (
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    "vllm/_moe_C_stable_libtorch.abi3.so",
    "vllm/vllm-rs",
)
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


def repack(wheel: Path, out: Path) -> Path:
    """`wheel` without DROPPED, its RECORD rewritten to match (pip checks nothing else)."""
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        record = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        for info in src.infolist():
            if info.filename in DROPPED or info.filename == record:
                continue
            dst.writestr(info, src.read(info.filename))
        kept = [line for line in src.read(record).decode().splitlines() if line and line.split(",")[0] not in DROPPED]
        dst.writestr(record, "\n".join(kept) + "\n")
    return out


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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
    ap.add_argument("--part-mb", type=int, default=23)
    args = ap.parse_args()
    dl, wheels = args.dir / "dl", args.dir / "wheels"
    dl.mkdir(parents=True, exist_ok=True)
    wheels.mkdir(parents=True, exist_ok=True)
    if not list(dl.glob("vllm-0.26.0-*.whl")):
        download([VLLM], dl)
    download(DEPENDENCIES, wheels)
    (src,) = dl.glob("vllm-0.26.0-*.whl")
    repack(src, wheels / src.name)
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
