"""Tests of `trainer.tfexample`, the service's reading of a TFRecord file's first record,
`trainer.datafiles.check_tfrecord_files`, and the worker's walk of every record header
(`check_tfrecord_framing`), against records and files TensorFlow writes."""

from __future__ import annotations

import gzip
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.damaged_files import damage_first_member, tfrecord_header
from tests.tfrecords import write_examples, write_tfrecord
from trainer.data import DataError, load_arrays
from trainer.datafiles import (
    FIRST_RECORD_CAP,
    FRAMING_CHUNK,
    DataFilesError,
    check_tfrecord_files,
    check_tfrecord_framing,
    resolve_files,
)
from trainer.spec import DataSpec
from trainer.tfexample import example_features, first_record_shape

# --- protobuf's wire format, written by hand where TensorFlow writes no such record ----


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # a negative int64 as its 64 bits, as protobuf writes it
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes([*out, value])


def _field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _example(**features: bytes) -> bytes:
    """An Example of `features`, each a Feature message's bytes."""
    entries = b"".join(_field(1, _field(1, k.encode()) + _field(2, v)) for k, v in features.items())
    return _field(1, entries)


def _unpacked_int64s(*values: int) -> bytes:
    """A Feature holding an Int64List of `values` one field each, as proto2 writers do."""
    return _field(3, b"".join(b"\x08" + _varint(value) for value in values))


def _unpacked_floats(*values: float) -> bytes:
    return _field(2, b"".join(b"\x0d" + struct.pack("<f", value) for value in values))


def _read(record: bytes) -> dict[str, tuple[str | None, int, object]]:
    """What `example_features` makes of a record: each feature's kind, count, first value
    (a string's as bytes)."""
    read: dict[str, tuple[str | None, int, object]] = {}
    for name, feature in example_features(record).items():
        if feature.kind is None:  # a Feature with no list: the worker's parser asks no more
            read[name] = (None, 0, None)
            continue
        count, first = feature.values()
        read[name] = (feature.kind, count, bytes(first) if isinstance(first, memoryview) else first)
    return read


def _by_tensorflow(record: bytes) -> dict[str, tuple[str | None, int, object]]:
    """The same, as TensorFlow's own protobuf classes read the record."""
    read: dict[str, tuple[str | None, int, object]] = {}
    for name, feature in tf.train.Example.FromString(record).features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind is None:
            read[name] = (None, 0, None)
            continue
        values = list(getattr(feature, kind).value)
        first = values[0] if values else None
        if kind == "float_list" and first is not None:  # read here as its 4 bytes
            first = int.from_bytes(struct.pack("<f", first), "little")
        dtype = {"bytes_list": "string", "float_list": "float", "int64_list": "int64"}[kind]
        count = min(len(values), 2) if dtype == "string" else len(values)
        read[name] = (dtype, count, first)
    return read


def _tf_feature(kind: str, values: list) -> tf.train.Feature:
    lists = {"bytes": tf.train.BytesList, "float": tf.train.FloatList, "int64": tf.train.Int64List}
    return tf.train.Feature(**{f"{kind}_list": lists[kind](value=values)})


def test_example_features_read_as_tensorflow_reads_its_own_records(tmp_path: Path) -> None:
    # All three kinds, with 0, 1 and many values, int64s past 2^63 and below 0, written by
    # TensorFlow (its int64 and float lists packed), and features the worker does not parse.
    features = {
        "image_raw": _tf_feature("bytes", [bytes(range(256)) * 3]),
        "label": _tf_feature("int64", [-3]),
        "pixels": _tf_feature("int64", [2**63 - 1, -(2**63), 0, 300]),
        "height": _tf_feature("float", [1.5, -2.0]),
        "width": _tf_feature("bytes", [b"a", b"", b"c"]),
        "channels": _tf_feature("int64", []),
        "depth": tf.train.Feature(),
        "caption": _tf_feature("bytes", [b"a cat"]),
    }
    path = write_examples(tmp_path / "a.tfrecord", [features])
    [record] = list(tf.data.TFRecordDataset(str(path)).as_numpy_iterator())
    read = _read(record)
    assert read == {k: v for k, v in _by_tensorflow(record).items() if k != "caption"}
    assert read["pixels"] == ("int64", 4, 2**63 - 1)
    assert read["label"] == ("int64", 1, -3)


def test_example_features_read_unpacked_lists_as_tensorflow_does() -> None:
    # Protobuf parsers must take a repeated scalar one field per value too (proto2 writers
    # write them so): TensorFlow's classes read these bytes as the lists they hold.
    record = _example(
        image_raw=_field(1, _field(1, b"\x00" * 4)),
        label=_unpacked_int64s(7),
        pixels=_unpacked_int64s(4, -1, 2**40),
        height=_unpacked_floats(2.5),
        width=_field(3, b""),  # an empty Int64List
    )
    read = _read(record)
    assert read == _by_tensorflow(record)
    assert read["pixels"] == ("int64", 3, 4)
    assert read["height"][:2] == ("float", 1)


def test_example_features_count_lists_of_millions_packed_or_not() -> None:
    # Counted in C (a Python loop over these took seconds of the service's request).
    record = _example(label=_field(3, _field(1, b"\x01" * 8_000_000)))
    assert _read(record)["label"] == ("int64", 8_000_000, 1)
    unpacked = _example(label=_field(3, b"\x08\x81\x01" * 2_000_000))
    assert _read(unpacked)["label"] == ("int64", 2_000_000, 129)


def test_first_record_shape_refuses_a_record_cut_short_only_where_the_worker_does(
    tmp_path: Path,
) -> None:
    # TensorFlow's parser reads the Example, its features and each Feature's list to the
    # end of the message around them, where protobuf refuses a length that runs past it:
    # a record cut at an entry's end is read, with the features before the cut.
    x = np.arange(12, dtype=np.uint8).reshape(1, 2, 2, 3)
    path = write_tfrecord(tmp_path / "a.tfrecord", x, [1])
    [record] = list(tf.data.TFRecordDataset(str(path)).as_numpy_iterator())
    refused = 0
    for cut in range(1, len(record)):
        try:
            first_record_shape(record[:cut], path)
        except ValueError:
            refused += 1
            _write_record(path, record[:cut])
            with pytest.raises(DataError):
                load_arrays(_files(path), seed=0)
    assert refused > len(record) // 2  # most cuts fall inside a key or a value


def test_first_record_shape_leaves_to_the_worker_what_tensorflow_and_protobuf_read_apart(
    tmp_path: Path,
) -> None:
    # TensorFlow's parser takes a Feature's first list and the first of two packed runs,
    # where protobuf takes the last list and both runs: the worker reads the first two of
    # these, which a refusal here would have refused.
    fives = _field(1, _varint(5))
    labels = {
        "two lists": _field(3, fives) + _field(1, _field(1, b"x")),
        "two packed runs": _field(3, fives + _field(1, _varint(6))),
        "packed, then not": _field(3, fives + b"\x08\x06"),
    }
    for what, label in labels.items():
        record = _example(
            image_raw=_field(1, _field(1, bytes(4))), label=label, pixels=_unpacked_int64s(4)
        )
        assert first_record_shape(record, Path("a")) is None, what
        path = tmp_path / f"{what}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as writer:
            writer.write(record)
        if what != "packed, then not":
            assert load_arrays(_files(path), seed=0).y_train.tolist() == [5], what


def _files(path: Path) -> DataSpec:
    return DataSpec(format="tfrecord", path=str(path))


def _service_says(path: Path) -> str:
    with pytest.raises(DataFilesError) as error:
        check_tfrecord_files(resolve_files(_files(path)))
    return str(error.value)


def _worker_says(path: Path) -> str:
    with pytest.raises(DataError) as error:
        load_arrays(_files(path), seed=0)
    return str(error.value)


def _ints(*values: int) -> tf.train.Feature:
    return _tf_feature("int64", list(values))


IMAGE = {"image_raw": _tf_feature("bytes", [bytes(4)])}
PNG_2X2 = tf.io.encode_png(np.zeros((2, 2, 1), np.uint8)).numpy()


@pytest.mark.parametrize(
    "features",
    [
        {"label": _ints(1), "pixels": _ints(4)},
        {**IMAGE, "pixels": _ints(4)},
        {**IMAGE, "label": _tf_feature("float", [1.0]), "pixels": _ints(4)},
        {**IMAGE, "label": _tf_feature("bytes", [b"cat"]), "pixels": _ints(4)},
        {**IMAGE, "label": _ints(1, 2), "pixels": _ints(4)},
        {**IMAGE, "label": _ints(), "pixels": _ints(4)},
        {"image_raw": _ints(4), "label": _ints(1), "pixels": _ints(4)},
        {"image_raw": _tf_feature("bytes", []), "label": _ints(1), "pixels": _ints(4)},
        {**IMAGE, "label": _ints(1), "height": _tf_feature("float", [2.0])},
        {**IMAGE, "label": _ints(1)},
        {**IMAGE, "label": _ints(1), "pixels": _ints(5)},
        {**IMAGE, "label": _ints(1), "height": _ints(2), "width": _ints(2), "depth": _ints(3)},
        {"image_raw": _tf_feature("bytes", [PNG_2X2]), "label": _ints(1), "pixels": _ints(4)},
        {},
    ],
    ids=[
        "no-image_raw",
        "no-label",
        "float-label",
        "bytes-label",
        "two-labels",
        "no-label-values",
        "int64-image_raw",
        "no-image_raw-values",
        "float-height",
        "no-shape",
        "pixels-not-square",
        "depth-as-channels",
        "png-image",
        "empty-example",
    ],
)
def test_check_tfrecord_files_says_what_the_worker_says_of_a_first_record(
    tmp_path: Path, features: dict[str, tf.train.Feature]
) -> None:
    # Each was admitted, then refused by the worker (exit 2) after the job's wait.
    path = write_examples(tmp_path / "a.tfrecord", [features])
    assert _service_says(path) == _worker_says(path)


def test_check_tfrecord_files_refuses_a_first_record_that_is_no_example(tmp_path: Path) -> None:
    # A TFRecord file of raw JPEG files, or of anything but tf.train.Example.
    path = tmp_path / "a.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(b"\xff\xd8\xff\xe0 a JPEG file")
    prefix = "Expected TFRecord files of tf.train.Example with `image_raw` (bytes) and `label` (int64). Received: "
    assert _worker_says(path).startswith(prefix + "Could not parse example input")
    assert _service_says(path) == (
        f"{prefix}a first record that is no tf.train.Example: a field of wire type 7 at byte 0 "
        f"({path})"
    )


def test_check_tfrecord_files_returns_the_first_records_shape_and_reads_gzip(
    tmp_path: Path,
) -> None:
    x = np.zeros((3, 5, 6, 3), np.uint8)
    folder = tmp_path / "set"
    folder.mkdir()
    (folder / "a-empty.tfrecord").write_bytes(b"")  # a shard a writer left empty: skipped
    write_tfrecord(folder / "b.tfrecord.gz", x, [0, 1, 2])
    write_tfrecord(folder / "c.tfrecord", x[:, :1], [0, 1, 2])  # only the first is read
    write_tfrecord(folder / "eval.tfrecord.GZ", x, [0, 1, 2], shape_features="hwc")
    assert check_tfrecord_files(resolve_files(_files(folder))) == (5, 6, 3)
    # A gzip'd first record the worker refuses, and eval images of another shape.
    write_tfrecord(folder / "b.tfrecord.gz", x, [0, 1, 2], shape_features="")
    assert _service_says(folder) == (
        "Expected `pixels` (a square number) or `height`, `width` and `channels` in every "
        f"record. Received: neither in record 0 ({folder / 'b.tfrecord.gz'})"
    )
    write_tfrecord(folder / "b.tfrecord.gz", x, [0, 1, 2])
    write_tfrecord(folder / "eval.tfrecord.GZ", x[:, :2, :2], [0, 1, 2])
    assert _service_says(folder) == (
        "Expected eval images of the train image shape (5, 6, 3). Received: (2, 2, 3) "
        f"({folder / 'eval.tfrecord.GZ'})"
    )


@pytest.mark.parametrize("name", ["a.tfrecord", "a.tfrecord.gz"])
def test_check_tfrecord_files_refuses_a_first_record_cut_short(tmp_path: Path, name: str) -> None:
    whole = write_tfrecord(tmp_path / "whole.tfrecord", np.zeros((2, 8, 8, 1)), [0, 1])
    data = whole.read_bytes()
    length = int.from_bytes(data[:8], "little")
    for keep in (20, 12 + length + 2):  # inside the data, inside its checksum
        path = tmp_path / name
        cut = data[:keep]
        path.write_bytes(gzip.compress(cut) if name.endswith(".gz") else cut)
        # The worker walks every record's header before TensorFlow reads the file, and
        # says of the first what the service says.
        assert (
            _worker_says(path)
            == _service_says(path)
            == (
                "Expected readable TFRecord files. Received: a damaged, cut-short or non-TFRecord "
                f"file: its first record's header says {length} bytes of data and a 4-byte "
                f"checksum follow it, and {keep - 12} bytes do ({path})"
            )
        )


def test_check_tfrecord_files_reads_no_more_of_a_first_record_than_its_cap(
    tmp_path: Path,
) -> None:
    # A header that claims 2^40 bytes (its checksum right) in a 100-byte file: refused
    # from the file's size, unread. The worker's TensorFlow died of it (SIGSEGV, no word).
    plain = tmp_path / "plain" / "a.tfrecord"
    plain.parent.mkdir()
    plain.write_bytes(tfrecord_header(2**40) + bytes(100))
    assert _service_says(plain).endswith(
        f"its first record's header says {2**40:,} bytes of data and a 4-byte checksum follow "
        f"it, and 100 bytes do ({plain})"
    )
    # A gzip'd file's size says nothing of what it inflates to: past the cap, the record is
    # not read (zeros are no Example: read, it would be refused) and nothing is allocated.
    packed = tmp_path / "packed" / "a.tfrecord.gz"
    packed.parent.mkdir()
    with gzip.open(packed, "wb") as stream:
        stream.write(tfrecord_header(FIRST_RECORD_CAP + 1))
        for _ in range(FIRST_RECORD_CAP // 2**20 + 1):
            stream.write(bytes(2**20))
        stream.write(bytes(4))
    tracemalloc.start()
    try:
        assert check_tfrecord_files(resolve_files(_files(packed))) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20, peak
    # At the cap, it is read, and refused.
    with gzip.open(packed, "wb") as stream:
        # A field of wire type 7 (zeros alone are fields numbered 0, which TensorFlow skips,
        # more of them than `tfexample.MAX_FIELDS`: left to the worker).
        stream.write(tfrecord_header(FIRST_RECORD_CAP) + b"\x07" + bytes(FIRST_RECORD_CAP + 3))
    assert "a first record that is no tf.train.Example: a field of wire type 7" in _service_says(
        packed
    )


def _write_record(path: Path, record: bytes) -> Path:
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(record)
    return path


def _label_record(label: bytes, image_raw: bytes | None = None) -> bytes:
    """An Example of a 2x2 image, `label` a Feature's bytes (`image_raw` too, if given)."""
    image = _field(1, _field(1, bytes(4))) if image_raw is None else image_raw
    return _example(image_raw=image, label=label, pixels=_unpacked_int64s(4))


# Malformed records TensorFlow's parser reads, which protobuf refuses.
READ_BY_TENSORFLOW = {
    # An unknown field of the Example's that runs past its end: TensorFlow stops there.
    "unknown-field-past-the-end": _label_record(_field(3, _field(1, b"\x01"))) + b"\x12\x7f",
    # A field numbered 0, skipped as an unknown field.
    "field-0": b"\x00\x05" + _label_record(_field(3, _field(1, b"\x01"))),
    # The features' length with bits past 2^32, which TensorFlow drops.
    "length-past-2^32": (lambda inner: b"\x0a" + _varint(len(inner) + 2**32) + inner)(
        _label_record(_field(3, _field(1, b"\x01")))[2:]
    ),
    # The features' length past the Example's end, a map entry's past the features', a
    # list's, a packed run's and a BytesList's past their Feature's: each read to that end.
    "features-past-the-end": (lambda inner: b"\x0a" + _varint(len(inner) + 50) + inner)(
        _label_record(_field(3, _field(1, b"\x01")))[2:]
    ),
    "map-entry-past-its-features": _field(
        1,
        _field(1, _field(1, b"image_raw") + _field(2, _field(1, _field(1, bytes(4)))))
        + _field(1, _field(1, b"pixels") + _field(2, _unpacked_int64s(4)))
        + b"\x0a\x7f"
        + _field(1, b"label")
        + _field(2, _field(3, _field(1, b"\x01"))),
    ),
    "list-past-its-feature": _label_record(b"\x1a\x09" + _field(1, b"\x01")),
    "packed-run-past-its-list": _label_record(_field(3, b"\x0a\x69\x01")),
    "bytes-list-past-its-feature": _label_record(
        _field(3, _field(1, b"\x01")), image_raw=b"\x0a\x7f" + _field(1, bytes(4))
    ),
}


@pytest.mark.parametrize("record", READ_BY_TENSORFLOW.values(), ids=READ_BY_TENSORFLOW.keys())
def test_check_tfrecord_files_admits_malformed_records_the_worker_reads(
    tmp_path: Path, record: bytes
) -> None:
    # Each was refused at submit as "no tf.train.Example", which the worker trains on.
    path = _write_record(tmp_path / "a.tfrecord", record)
    assert load_arrays(_files(path), seed=0).y_train.tolist() == [1]
    assert check_tfrecord_files(resolve_files(_files(path))) in (None, (2, 2, 1))


def test_first_record_shape_leaves_a_map_entry_of_three_fields_to_the_worker() -> None:
    # A key, an unknown field and a value: protobuf reads it, TensorFlow refuses it. It
    # was refused here with Python's own words: "too many values to unpack (expected 2)".
    entry = _field(1, b"label") + b"\x18\x01" + _field(2, _field(3, _field(1, b"\x01")))
    record = _field(1, _field(1, entry) + _label_record(b"")[2:])
    assert first_record_shape(record, Path("a")) is None


def test_check_tfrecord_files_says_what_the_worker_says_of_a_record_of_zeros(
    tmp_path: Path,
) -> None:
    # Zeros are fields numbered 0, which TensorFlow skips: an Example with no features.
    path = _write_record(tmp_path / "a.tfrecord", bytes(64))
    assert _service_says(path) == _worker_says(path)
    assert "Feature: image_raw (data type: string) is required" in _service_says(path)


# --- the worker's walk of every record header (`check_tfrecord_framing`) ---------------

# Records of lengths that put headers on, across and past every boundary of small chunks.
LENGTHS = [0, 1, 5, 11, 12, 13, 100, 3000, 0, 7]


def _records(path: Path) -> bytes:
    """A TFRecord file of records of `LENGTHS` bytes, as TensorFlow writes it; its bytes
    (inflated, for a gzip'd one)."""
    plain = path.with_name(path.name + ".plain")
    with tf.io.TFRecordWriter(str(plain)) as writer:
        for length in LENGTHS:
            writer.write(bytes(range(256)) * (length // 256) + bytes(range(length % 256)))
    data = plain.read_bytes()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return data


CHUNKS = [1, 7, 12, 13, 64, 4096, FRAMING_CHUNK]


@pytest.mark.parametrize("name", ["a.tfrecord", "a.tfrecord.gz"])
def test_check_tfrecord_framing_walks_every_header_whatever_its_pieces(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / name
    data = _records(path)
    for chunk in CHUNKS:
        assert check_tfrecord_framing(path, chunk) == len(LENGTHS), chunk
        # How far into the file it is, after each piece: rising, within the file.
        reached: list[int] = []
        assert check_tfrecord_framing(path, chunk, reached.append) == len(LENGTHS)
        assert reached and reached == sorted(reached), chunk
        assert 0 < reached[-1] <= path.stat().st_size, chunk

    # A record whose header claims more than follows it, at any record: its index and
    # where it begins (in a gzip'd file, in the inflated stream) are named.
    inflated = " of the inflated stream" if name.endswith(".gz") else ""
    for claim, held in ((2**40, 100), (2**63, 100), (2**64 - 1, 0), (50, 49)):
        lying = data + tfrecord_header(claim) + bytes(held)
        path.write_bytes(gzip.compress(lying) if name.endswith(".gz") else lying)
        for chunk in CHUNKS:
            with pytest.raises(DataFilesError) as error:
                check_tfrecord_framing(path, chunk)
            assert str(error.value) == (
                "Expected readable TFRecord files. Received: a damaged, cut-short or "
                f"non-TFRecord file: record {len(LENGTHS)}'s header (at byte {len(data):,}"
                f"{inflated}) says {claim:,} bytes of data and a 4-byte checksum follow it, "
                f"and {held:,} bytes do ({path})"
            ), chunk

    # A file that ends inside a header, which TensorFlow read as one that ends before it.
    cut = data + tfrecord_header(10)[:5]
    path.write_bytes(gzip.compress(cut) if name.endswith(".gz") else cut)
    for chunk in CHUNKS:
        with pytest.raises(DataFilesError) as error:
            check_tfrecord_framing(path, chunk)
        assert str(error.value).endswith(
            f"file: {len(LENGTHS)} whole records end at byte {len(data):,} of "
            f"{len(data) + 5:,}{' inflated' if name.endswith('.gz') else ''}, then 5 bytes "
            f"that are no whole record ({path})"
        ), chunk


@pytest.mark.parametrize("name", ["a.tfrecord", "a.tfrecord.gz"])
def test_check_tfrecord_framing_leaves_a_header_that_fails_its_checksum_to_tensorflow(
    tmp_path: Path, name: str
) -> None:
    # Bytes that are no header claim nothing: TensorFlow checks a length's checksum before
    # it reads on, and says "corrupted record at N" (tests/trainer/test_data.py).
    path = tmp_path / name
    data = _records(path) + b"\xff" * 8 + b"\0" * 4 + bytes(10)
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    for chunk in CHUNKS:
        assert check_tfrecord_framing(path, chunk) == len(LENGTHS), chunk

    # A damaged length that claims less than the file holds leads the walk to bytes that
    # are no header: landing 5 bytes before the end, it said "6 whole records end at byte
    # N, then 5 bytes that are no whole record", where TensorFlow says "corrupted record".
    damaged = bytearray(_records(path))
    at = sum(12 + length + 4 for length in LENGTHS[:6])
    damaged[at : at + 8] = (len(damaged) - 5 - at - 16).to_bytes(8, "little")  # checksum stale
    path.write_bytes(gzip.compress(damaged) if name.endswith(".gz") else damaged)
    for chunk in CHUNKS:
        assert check_tfrecord_framing(path, chunk) == 6, chunk


def test_check_tfrecord_framing_of_a_gzip_bomb_holds_one_piece(tmp_path: Path) -> None:
    # TensorFlow's gzip reader held what the stream had left behind such a header (2 GiB
    # for a 2 MB file); the walk inflates it a piece at a time, holding none of it.
    path = tmp_path / "a.tfrecord.gz"
    with gzip.open(path, "wb") as stream:
        stream.write(tfrecord_header(2**40))
        for _ in range(32):
            stream.write(bytes(2**20))
    assert path.stat().st_size < 2**16
    tracemalloc.start()
    try:
        with pytest.raises(DataFilesError) as error:
            check_tfrecord_framing(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(error.value).endswith(
        f"its first record's header says {2**40:,} bytes of data and a 4-byte checksum follow "
        f"it, and {32 * 2**20:,} bytes do ({path})"
    )
    assert peak < 8 * FRAMING_CHUNK, peak  # a few copies of a piece, of 32 MiB inflated


def test_check_tfrecord_framing_of_a_damaged_gzip_stream_says_so(tmp_path: Path) -> None:
    path = tmp_path / "a.tfrecord.gz"
    _records(path)
    damage_first_member(path)
    with pytest.raises(DataFilesError) as error:
        check_tfrecord_framing(path)
    assert str(error.value) == (
        "Expected a readable gzip file. Received: Error -3 while decompressing data: invalid "
        f"block type ({path})"
    )
