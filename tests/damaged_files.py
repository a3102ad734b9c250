"""Damaged data files, as the worker's reader and the service's check both meet them."""

import io
import struct
import zipfile
from pathlib import Path

import numpy as np

from trainer.datafiles import _masked_crc32c


def write_lying_npz(path: Path) -> Path:
    """An .npz whose `x.npy` header says shape (10^6, 1000, 1000) of uint8 (10^12 bytes),
    over 100 bytes of data; `y.npy` is 10 labels."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "|u1", "fortran_order": False, "shape": (1_000_000, 1000, 1000)}
    )
    labels = io.BytesIO()
    np.save(labels, np.zeros(10, np.int64))
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", header.getvalue() + bytes(100))
        archive.writestr("y.npy", labels.getvalue())
    return path


def damage_first_member(path: Path) -> None:
    """Sets the first data byte of a gzip file's or zip archive's first member to 0xFF: a
    stored member then fails its CRC, a deflated one starts with an invalid block type."""
    data = bytearray(path.read_bytes())
    if data[:2] == b"\x1f\x8b":  # gzip: a 10-byte header, then the file name if flagged
        start = data.index(0, 10) + 1 if data[3] & 0x08 else 10
    else:  # zip: a 30-byte local header, then the member's name and extra field
        name_length, extra_length = struct.unpack("<HH", data[26:30])
        start = 30 + name_length + extra_length
    data[start] = 0xFF if data[start] != 0xFF else 0x00
    path.write_bytes(bytes(data))


def flag_first_member_encrypted(path: Path) -> None:
    """Marks a zip archive's first member encrypted (bit 0 of its flags, in its local header
    and its directory entry): zipfile refuses to open it (RuntimeError), as a member written
    with a password."""
    data = bytearray(path.read_bytes())
    data[6] |= 0x01  # the local header's flags
    entry = data.index(b"PK\x01\x02")  # the first member's directory entry
    data[entry + 8] |= 0x01
    path.write_bytes(bytes(data))


def tfrecord_header(length: int) -> bytes:
    """A TFRecord record's 12-byte header claiming `length` bytes of data: the length and
    its masked CRC-32C, right, so TensorFlow's reader takes it for a record's."""
    size = length.to_bytes(8, "little")
    return size + _masked_crc32c(size)
