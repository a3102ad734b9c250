"""Pack the pinned TensorFlow for a GPU host that has CUDA 13 but neither TensorFlow nor a
network, in pieces small enough for a transfer cap (not a test: run it by hand).

    .venv/bin/python bench/gpu_pack.py [--out .gpu] [--piece-mb 60] [--arch 90]

Then on the GPU host, from the repository's root, with the pieces gathered in one folder:

    PIECES=/tmp/tb-pieces source .gpu/kit/setup.sh
    python3 bench/towers_bench.py --split-gpu-mb 8192 --parameter-device gpu0 ...

TensorFlow 2.21's wheel is 573 MB, 1.8 GB unpacked, and the CUDA 12 libraries it loads
are as much again. What this keeps of it is every file `import tensorflow` and a GPU
step need, and what it leaves out costs nothing on a GPU of the one architecture named:
- `tensorflow/include`, the C++ headers (431 MB);
- the symbol tables of the shared libraries (`strip --strip-unneeded`: 220 MB of
  libtensorflow_cc's 1.05 GB; dynamic symbols stay, so loading and linking are as before);
- the GPU code for every other chip: each entry of the libraries' fatbins that is not
  machine code (ELF) for `--arch` has its payload zeroed, which xz then compresses to
  almost nothing. The wheel carries machine code for sm_60, 70, 80, 89 and 90, and PTX for
  compute_90; an sm_90 GPU (H100, H200) runs the sm_90 code and never reads the rest.
The result is 157 MiB of xz, in `--piece-mb` pieces.

Of CUDA 12 it carries the runtime and CUPTI (device traces), and empty stand-ins for
cuFFT, cuSOLVER, cuSPARSE and cuRAND, which TensorFlow opens at start but a `cnn` step
never calls. cuBLAS and cuDNN are the host's own CUDA 13 builds: cuDNN 9 keeps its name,
and `setup.sh` gives cuBLAS 13 the names TensorFlow asks for (libcublas.so.12), which
works because TensorFlow looks each function up by its unversioned name when first
called. Python packages TensorFlow, Keras and the trainer need and a CUDA image for
PyTorch lacks come as wheels, at the versions installed here.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = "3.12"  # the GPU host's (a CUDA image's python3)
# The CUDA 12 runtime and CUPTI that TensorFlow 2.21's `and-cuda` extra asks for.
CUDA_WHEELS = ("nvidia-cuda-runtime-cu12==12.5.82", "nvidia-cuda-cupti-cu12==12.5.82")
CUDA_LIBS = ("libcudart.so.12", "libcupti.so.12")
STAND_INS = ("libcufft.so.11", "libcusolver.so.11", "libcusparse.so.12", "libcurand.so.10")
# What TensorFlow, Keras and the trainer import that a CUDA image for PyTorch lacks, or
# has at versions they do not take (protobuf, typing_extensions); the rest (numpy, h5py,
# absl, grpcio, tensorboard...) is used as the host has it.
PACKAGES = (
    "tensorflow", "keras", "ml_dtypes", "protobuf", "optree", "namex", "astunparse", "gast",
    "google-pasta", "termcolor", "pydantic", "pydantic_core", "annotated-types",
    "typing-inspection", "typing_extensions",
)  # fmt: skip

FATBIN_MAGIC = 0xBA55ED50
ELF_KIND = 2  # a fatbin entry's kind: 1 is PTX, 2 machine code


def fatbin_entries(
    data: bytes | bytearray, start: int, end: int
) -> list[tuple[int, int, int, int]]:
    """(kind, arch, payload offset, payload size) of every entry of the fatbins in
    data[start:end] (an ELF's `.nv_fatbin` section): containers of a 16-byte header (magic,
    version, header size, size of the entries) followed by entries, each a header (kind at 0,
    its size at 4, the payload's padded size at 8, the architecture at 28) and a payload."""
    entries = []
    pos = start
    while pos + 16 <= end:
        magic, _, header_size, entries_size = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # containers are 8-byte aligned, with padding between them
            continue
        entry, stop = pos + header_size, pos + header_size + entries_size
        while entry < stop:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            arch = struct.unpack_from("<I", data, entry + 28)[0]
            entries.append((kind, arch, entry + entry_header, payload))
            entry += entry_header + payload
        pos = stop
    return entries


def section(path: Path, name: str) -> tuple[int, int] | None:
    """(file offset, size) of an ELF section, or None."""
    out = subprocess.run(["readelf", "-S", "-W", str(path)], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        fields = line.replace("[ ", "[").split()
        if len(fields) > 5 and fields[1] == name:
            return int(fields[4], 16), int(fields[5], 16)
    return None


def keep_only_arch(path: Path, arch: int) -> int:
    """Zeroes the payload of every fatbin entry of `path` but `arch`'s machine code, in
    place; returns the bytes zeroed."""
    where = section(path, ".nv_fatbin")
    if where is None:
        return 0
    data = bytearray(path.read_bytes())
    zeroed = 0
    for kind, entry_arch, offset, size in fatbin_entries(data, where[0], where[0] + where[1]):
        if (kind, entry_arch) != (ELF_KIND, arch):
            data[offset : offset + size] = bytes(size)
            zeroed += size
    if zeroed:
        path.write_bytes(data)
    return zeroed


def download(specs: list[str], into: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "--python-version", PYTHON, "--implementation", "cp",
         *(f"--platform={p}" for p in ("manylinux_2_27_x86_64", "manylinux_2_28_x86_64",
                                      "manylinux_2_17_x86_64", "manylinux2014_x86_64")),
         "--dest", str(into), *specs],
        check=True,
    )  # fmt: skip


def pack_tensorflow(wheel: Path, arch: int, work: Path) -> Path:
    """The TensorFlow package from `wheel`, trimmed as the module says, as one .tar.xz."""
    tree = work / "tensorflow-tree"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tree)
    shutil.rmtree(tree / "tensorflow" / "include")
    zeroed = 0
    for lib in sorted(tree.rglob("*.so*")):
        if lib.is_file() and lib.stat().st_size > 1 << 20:
            subprocess.run(["strip", "--strip-unneeded", str(lib)], check=True)
            zeroed += keep_only_arch(lib, arch)
    print(f"GPU code for other than sm_{arch} zeroed: {zeroed >> 20} MiB", flush=True)
    packed = work / "tensorflow.tar.xz"
    # xz -9 on every core: about 3 minutes on 2 cores, 157 MiB from 1.2 GB (Python's lzma
    # takes one core).
    with packed.open("wb") as f:
        tar = subprocess.Popen(["tar", "-C", str(tree), "-cf", "-", "."], stdout=subprocess.PIPE)
        subprocess.run(["xz", "-T0", "-9"], stdin=tar.stdout, stdout=f, check=True)
        if tar.wait() != 0:
            raise RuntimeError(f"tar of {tree} failed")
    return packed


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, default=REPO / ".gpu", help="default: .gpu (ignored)")
    p.add_argument("--piece-mb", type=int, default=60, help="MiB a piece (default 60)")
    p.add_argument("--arch", type=int, default=90, help="the GPU's sm_ number (default 90)")
    args = p.parse_args()
    if args.out.exists():
        if any(args.out.iterdir()) and not (args.out / "kit").is_dir():
            p.error(f"--out {args.out} holds files but no earlier pack: choose another folder")
        shutil.rmtree(args.out)  # an earlier pack, replaced whole
    kit = args.out / "kit"
    (kit / "lib").mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        versions = [f"{name}=={importlib.metadata.version(name)}" for name in PACKAGES]
        download(versions, kit / "whl")
        download(list(CUDA_WHEELS), work / "cuda")
        for wheel in (work / "cuda").glob("*.whl"):
            with zipfile.ZipFile(wheel) as z:
                for member in z.namelist():
                    if Path(member).name in CUDA_LIBS:
                        (kit / "lib" / Path(member).name).write_bytes(z.read(member))
        stub = work / "stand_in.c"
        stub.write_text("void towerboard_stand_in(void) {}\n")
        for name in STAND_INS:
            subprocess.run(
                ["cc", "-shared", "-fPIC", f"-Wl,-soname,{name}", "-o", str(kit / "lib" / name),
                 str(stub)],
                check=True,
            )  # fmt: skip
        shutil.copy(REPO / "bench" / "gpu_setup.sh", kit / "setup.sh")
        (tf_wheel,) = (kit / "whl").glob("tensorflow-*.whl")
        packed = pack_tensorflow(tf_wheel, args.arch, work)
        tf_wheel.unlink()  # carried as the pieces instead
        piece = args.piece_mb << 20
        with packed.open("rb") as f:
            for i, chunk in enumerate(iter(lambda: f.read(piece), b""), start=1):
                (args.out / f"piece{i}").mkdir()
                (args.out / f"piece{i}" / f"{i:02d}").write_bytes(chunk)
    sizes = {d.name: sum(f.stat().st_size for f in d.rglob("*")) for d in args.out.iterdir()}
    for name, size in sorted(sizes.items()):
        print(f"{args.out / name}: {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
