"""Pack a CUDA vLLM small enough to carry to a GPU machine that has PyTorch but no vLLM and no network.

The lent H200 machine (python 3.12, torch 2.11.0+cu130) takes at most 64 MiB of files per call; the vLLM
wheel built for torch 2.11 (vLLM 0.26.0, the last one) is 290 MiB, most of it GPU code for every
architecture. This keeps what ``bench/gpu_smoke.py`` runs on a Hopper GPU with vLLM's Triton attention:

* the vLLM package without its C++/CUDA headers, the Rust frontend, the MoE/MLA/FP4 kernel libraries and
  FlashAttention-3; ``_C_stable_libtorch`` (vLLM's own ops) with every GPU image not built for ``--arch``
  zeroed (headers kept, so the library loads and the CUDA runtime picks the kept image); the FlashAttention-2
  library with every GPU image zeroed (vLLM imports it while inspecting a model, but the Triton backend
  never calls it), so both compress to little;
* the Python packages vLLM imports that the machine lacks (``DEPS``), unpacked from their 40 wheels into one
  ``deps.tar.xz`` (12.2 MiB against the wheels' 21.0 MiB);
* with ``--ray``, Ray (``RAY``) for a ``jointrl train`` run (``bench/gpu_train.py``): its core only (no Java,
  RLlib, Serve, Tune, Train, Data, LLM or dashboard web client, which ``import ray`` never loads) with the
  symbol tables stripped from its binaries (``strip``): 79 MiB as a wheel, 15.8 MiB here; and jointrl's
  ``peft`` pin (``RUN_DEPS``), so that LoRA runs there use the version the tests use.

    python bench/gpu_vllm_bundle.py --out .gpu --ray   # then, on the GPU machine (carry .gpu):
    mkdir -p /tmp/site; for f in .gpu/*.tar.xz; do tar xJf $f -C /tmp/site; done
    export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0
    python3 bench/gpu_smoke.py --attention TRITON_ATTN    # or: python3 bench/gpu_train.py --gpu

It downloads (``pip download``) and is never run by the tests.
"""

from __future__ import annotations

import argparse
import io
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

VLLM = "vllm==0.26.0"
DEPS = (
    "annotated-types==0.8.0 apache-tvm-ffi==0.1.10 cachetools==8.0.2 cbor2==6.3.0 fastapi==0.136.3 httpx2==2.16.2 "
    "jsonschema-specifications==2025.9.1 jsonschema==4.26.0 llguidance==1.7.6 msgspec==0.23.0 openai-harmony==0.0.8 "
    "openai==3.60.0 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions-ai==0.5.1 "
    "opentelemetry-semantic-conventions==0.66b2 partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 "
    "pydantic-core==2.50.5 pydantic==2.14.4 pyzmq==27.3.0 referencing==0.37.0 rpds-py==2026.9.1 sniffio==1.3.1 "
    "starlette==1.10.0 typing-inspection==0.4.5 xgrammar==0.2.7 blake3==1.0.11 setproctitle==1.3.8 gguf lark==1.2.2 "
    "outlines_core==0.2.14 diskcache depyf==0.20.0 compressed-tensors==0.17.0 ijson python-json-logger watchfiles "
    "prometheus-fastapi-instrumentator==8.1.0 typing-extensions==4.16.0"
).split()
PLATFORM = [
    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
    *[f"--platform=manylinux_2_{n}_x86_64" for n in (17, 24, 26, 27, 28, 31, 34, 35)],
    "--platform=manylinux2014_x86_64", "--platform=manylinux1_x86_64",
]  # fmt: skip
RAY = "ray==2.60.0"
RUN_DEPS = ["peft==0.21.2"]  # jointrl's pin (pyproject.toml): the machine's own peft is of unknown version
RAY_DROP = tuple(f"ray/{d}/" for d in ("jars", "rllib", "serve", "tune", "train", "llm", "data", "dashboard/client"))
DROP = ("/include/", "vllm/vllm-rs", "/__pycache__/")
DROP_LIBS = ("_moe_C", "_flashmla", "_qutlass_C", "_vllm_fa3_C", "deep_gemm/_C")
FATBIN_MAGIC = 0xBA55ED50


def fatbin_range(elf: bytes | bytearray) -> tuple[int, int]:
    """(offset, size) of the ``.nv_fatbin`` section of a 64-bit little-endian ELF; (0, 0) if none."""
    shoff, shentsize, shnum, shstrndx = (
        struct.unpack_from("<Q", elf, 0x28)[0],
        *struct.unpack_from("<HHH", elf, 0x3A),
    )
    sec = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    strtab = sec[shstrndx][4]
    for name, _, _, _, off, size in sec:
        end = elf.index(b"\0", strtab + name)
        if elf[strtab + name : end] == b".nv_fatbin":
            return off, size
    return 0, 0


def zero_images(elf: bytearray, keep_arch: int) -> tuple[int, int]:
    """Zero every GPU image's payload in the fatbin not built for ``sm_<keep_arch>`` (headers kept).
    Returns (bytes zeroed, bytes kept)."""
    off, size = fatbin_range(elf)
    pos, zeroed, kept = off, 0, 0
    while pos < off + size - 16:
        magic, _, hsz, fsz = struct.unpack_from("<IHHQ", elf, pos)
        if magic != FATBIN_MAGIC:
            pos += 8
            continue
        p, end = pos + hsz, pos + hsz + fsz
        while p < end:
            _, _, ehs, padded, _, _, _, _, sm = struct.unpack_from("<HHIIIIIII", elf, p)
            if sm == keep_arch:
                kept += padded
            else:
                elf[p + ehs : p + ehs + padded] = bytes(padded)
                zeroed += padded
            p += ehs + padded
        pos = end
    return zeroed, kept


def wheel_members(wheel: Path, drop: tuple[str, ...] = ()):
    """(name in site-packages, bytes, mode) of every file a ``--target`` install of ``wheel`` writes: a
    wheel's ``*.data/purelib`` and ``*.data/platlib`` go to the top, its scripts, headers and data are
    left out (nothing here runs them)."""
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = info.filename
            if info.is_dir() or any(d in name for d in drop):
                continue
            head, _, rest = name.partition("/")
            if head.endswith(".data"):
                kind, _, rest = rest.partition("/")
                if kind not in ("purelib", "platlib"):
                    continue
                name = rest
            mode = (info.external_attr >> 16) & 0o777 or 0o644
            yield name, z.read(info), mode


def add(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode = len(data), mode
    tar.addfile(ti, io.BytesIO(data))


def stripped(data: bytes) -> bytes:
    """An ELF file without its symbol tables (``strip``; the dynamic symbols stay), else ``data``."""
    if data[:4] != b"\x7fELF":
        return data
    with tempfile.NamedTemporaryFile() as f:
        f.write(data)
        f.flush()
        subprocess.run(["strip", f.name], check=True)
        return Path(f.name).read_bytes()


def pack_vllm(pip: list[str], out: Path, arch: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([*pip, "-d", tmp, VLLM], check=True)
        wheel = next(Path(tmp).glob("vllm-*.whl"))
        with tarfile.open(out / "vllm.tar.xz", "w:xz") as tar:
            for name, data, mode in wheel_members(wheel, DROP + DROP_LIBS):
                if name.endswith((".hpp", ".h", ".cuh")):
                    continue
                if name.endswith("_C_stable_libtorch.abi3.so") or name.endswith("_vllm_fa2_C.abi3.so"):
                    elf = bytearray(data)
                    keep = arch if "_C_stable" in name else 0  # FA2 is loaded, never called: keep none
                    zeroed, kept = zero_images(elf, keep)
                    print(f"{name}: zeroed {zeroed / 2**20:.0f} MiB of GPU images, kept {kept / 2**20:.0f} MiB")
                    data = bytes(elf)
                add(tar, name, data, 0o755 if name.endswith(".so") else mode)


def pack_wheels(pip: list[str], out: Path, name: str, reqs: list[str], drop=(), strip=False) -> None:
    """Download ``reqs`` (no dependencies) and write their installed files as ``out/name``."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([*pip, "-d", tmp, *reqs], check=True)
        with tarfile.open(out / name, "w:xz", preset=9) as tar:
            for wheel in sorted(Path(tmp).glob("*.whl")):
                for member, data, mode in wheel_members(wheel, drop):
                    add(tar, member, stripped(data) if strip else data, mode)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".gpu", help="folder for the *.tar.xz files (keep it git-ignored)")
    ap.add_argument("--arch", type=int, default=90, help="the GPU architecture to keep (90: H100/H200)")
    ap.add_argument("--ray", action="store_true", help="also pack Ray's core (ray.tar.xz), for bench/gpu_train.py")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PLATFORM]
    pack_wheels(pip, out, "deps.tar.xz", DEPS)
    pack_vllm(pip, out, args.arch)
    if args.ray:
        pack_wheels(pip, out, "ray.tar.xz", [RAY, *RUN_DEPS], drop=RAY_DROP + ("/__pycache__/",), strip=True)
    files = sorted(out.iterdir())
    print(f"{out}: {', '.join(f.name for f in files)}: {sum(f.stat().st_size for f in files) / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
