"""A `tf.train.Example`'s features as the worker parses them, read without TensorFlow.

The service checks the first record of a job's TFRecord files at submit with this (it
never imports TensorFlow), and the worker words what it finds with the same rules and
messages (`trainer.data`): an Example without `image_raw` or `label`, or with them of
another kind or count, or without an image shape, failed only in the worker, after the
job's wait for its turn.

An Example is a small protobuf (`tensorflow/core/example/{example,feature}.proto`):

    Example  {1: Features}
    Features {1: map<string, Feature>}   (each entry a message {1: key, 2: value})
    Feature  oneof {1: BytesList, 2: FloatList, 3: Int64List}
    BytesList {1: repeated bytes}; FloatList {1: repeated float}; Int64List {1: repeated int64}

read here from its wire format: varints, 4- and 8-byte fixed fields, length-delimited
ones; a repeated scalar packed (one length-delimited run) or not (a field per value), as
protobuf parsers must take both.

Where TensorFlow's parser (its "fast" one) and protobuf's rules part, the record is left
to the worker (`Unsure`) rather than refused, so the service never refuses what the
worker reads: TensorFlow takes a Feature's first list where protobuf takes its last, and
only the first of two packed runs; it refuses unknown fields inside a Feature, a list or
Features, and a map entry without its key or value, or with either twice, all of which
protobuf reads. Some malformed messages protobuf refuses TensorFlow reads, and so are
they read here: the Example's features, a map entry, a Feature's list or a list's packed
run whose length runs past its end (TensorFlow reads each under a limit, to the end of
the message around it), and among the Example's own fields a field numbered 0, or the
features under a tag of more than one byte (skipped as unknown fields); a length of 2^32
or more, of which it keeps the low 32 bits, is `Unsure`. Any other malformed message (a
key, value or string that runs past its end, a varint that does not end, wire types 3,
4, 6 and 7), which TensorFlow refuses too, is no Example.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

# The image shape features, 0 where absent: `pixels` (square, one channel) or `height`,
# `width` and `channels`; `depth` is read as `channels`, as TF's old MNIST converter wrote it.
SHAPE_FEATURES = ("pixels", "height", "width", "channels", "depth")
# What the worker parses each record into (`tf.io.FixedLenFeature([], dtype)`): the
# dtype as TensorFlow names it, and whether the feature is required (no default).
PARSED = {
    "image_raw": ("string", True),
    "label": ("int64", True),
    **{name: ("int64", False) for name in SHAPE_FEATURES},
}
_KINDS = {1: "string", 2: "float", 3: "int64"}  # Feature's oneof, by field number

Shape = tuple[int, ...]


class NotAnExample(ValueError):
    """The record is no protobuf message: a varint or length runs past its end, a field has
    a wire type protobuf does not have (or a group, which TensorFlow refuses)."""


class Unsure(ValueError):
    """The record is encoded in a way TensorFlow's parser and protobuf's rules read
    differently: left to the worker."""


@dataclass(frozen=True)
class Feature:
    """One feature as the record holds it: its kind (`string`, `float`, `int64`; None for
    a Feature with no list) and its list's encoded fields, read on demand."""

    kind: str | None
    data: memoryview

    def values(self) -> tuple[int, int | memoryview | None]:
        """How many values the list holds (of strings: 0, 1, or 2 for 2 or more) and its
        first (None: none): an int64 as its signed int, a float as its 4 bytes' int (only
        counted), a string as a view of its bytes. Read at C speed where a list holds
        millions (a loop here took seconds), keeping nothing but the count.

        Raises:
            Unsure: a field other than the values, or a list both packed and not, or
                packed in two runs: TensorFlow reads the first run alone, protobuf all.
        """
        if self.kind == "string":
            count, first = 0, None
            for number, wire, value in itertools.islice(_fields(self.data), 2):
                if number != 1 or wire != 2:
                    raise Unsure("a BytesList with a field other than its values")
                assert isinstance(value, memoryview)
                count, first = count + 1, value if first is None else first
            return count, first
        pattern, width = _UNPACKED[self.kind or ""]
        if pattern.fullmatch(self.data):  # a field per value, each tag one byte
            if width:
                count = len(self.data) // (1 + width)
                return count, int.from_bytes(self.data[1 : 1 + width], "little")
            # A tag and a varint's last byte are below 0x80; the varint's others are not.
            count = _low_bytes(self.data) // 2
            return count, _int64(_varint(self.data, 1)[0])
        fields = list(itertools.islice(_fields(self.data, clamp=True), 2))
        if not fields:
            return 0, None
        if len(fields) == 1 and fields[0][:2] == (1, 2):
            run = fields[0][2]
            assert isinstance(run, memoryview)
            return _packed(run, width)
        raise Unsure("a list of other fields, packed in two runs, or both packed and not")


# A FloatList's or Int64List's values one field each (not packed): the tag (field 1, wire
# type 5 or 0, one byte), then 4 bytes or a varint of at most 10; and the fixed width.
_UNPACKED = {
    "float": (re.compile(rb"(?:\x0d[\x00-\xff]{4})+"), 4),
    "int64": (re.compile(rb"(?:\x08[\x80-\xff]{0,9}[\x00-\x7f])+"), 0),
}


def example_features(record: bytes | memoryview) -> dict[str, Feature]:
    """The features of a serialized `tf.train.Example` that the worker parses (`PARSED`),
    by name; a later entry of one name replaces an earlier one, as in TensorFlow.

    Raises:
        NotAnExample: the record is no protobuf message.
        Unsure: TensorFlow and protobuf would read it differently (see the module).
    """
    wanted = {name.encode(): name for name in PARSED}
    found: dict[str, Feature] = {}
    walked = 0
    for number, wire, features in _fields(memoryview(record), top=True, clamp=True):
        walked = _walk(walked)
        if number != 1 or wire != 2:
            continue  # an unknown field (or field 1 of another type): skipped, as by both
        assert isinstance(features, memoryview)
        for entry_number, entry_wire, entry in _fields(features, clamp=True):
            walked = _walk(walked)
            if entry_number != 1 or entry_wire != 2:
                raise Unsure("a Features message with a field other than its map")
            assert isinstance(entry, memoryview)
            key, value = _map_entry(entry)
            if (name := wanted.get(bytes(key))) is not None:
                found[name] = _feature(value)
    return found


def _walk(walked: int) -> int:
    if walked >= MAX_FIELDS:
        raise Unsure(f"more than {MAX_FIELDS:,} fields")
    return walked + 1


# The most fields of an Example and its features' map read: a few microseconds each here,
# so that a first record of millions of tiny features costs the service a fraction of a
# second (and is left to the worker) rather than seconds. Real records hold a handful.
MAX_FIELDS = 100_000


def _map_entry(entry: memoryview) -> tuple[memoryview, memoryview]:
    """A map entry's key and value: each once, as TensorFlow reads them (protobuf would
    take a missing one as empty, a repeated one's last)."""
    fields = sorted(itertools.islice(_fields(entry), 3), key=lambda field: field[0])
    if [(number, wire) for number, wire, _ in fields] != [(1, 2), (2, 2)]:
        raise Unsure("a map entry of other than one key and one value")
    (_, _, key), (_, _, value) = fields
    assert isinstance(key, memoryview) and isinstance(value, memoryview)
    return key, value


def _feature(value: memoryview) -> Feature:
    fields = list(itertools.islice(_fields(value, clamp=True), 2))
    if not fields:
        return Feature(None, value)
    if len(fields) > 1 or fields[0][0] not in _KINDS or fields[0][1] != 2:
        raise Unsure("a Feature with other than one list")
    number, _, data = fields[0]
    assert isinstance(data, memoryview)
    return Feature(_KINDS[number], data)


class Refused(ValueError):
    """What the worker's parser says of a record it refuses."""


def parsed(features: Mapping[str, Feature]) -> dict[str, int | memoryview]:
    """The one value of each feature the worker parses a record of `features` into
    (`example_features`): a shape feature it lacks is 0, `image_raw` a view of its bytes.

    Raises:
        Refused: the worker's parser refuses it, said in TensorFlow's words: a required
            feature absent, a feature of another kind, or of other than one value.
        Unsure: see `Feature.values`.
    """
    values: dict[str, int | memoryview] = {}
    for name, (dtype, required) in PARSED.items():
        feature = features.get(name)
        if feature is None or feature.kind is None:
            if required:
                raise Refused(
                    f"Feature: {name} (data type: {dtype}) is required but could not be found."
                )
            values[name] = 0
            continue
        if feature.kind != dtype:
            raise Refused(
                f"Key: {name}, Index: 0.  Data types don't match. Data type: {feature.kind} "
                f"but expected type: {dtype}"
            )
        count, first = feature.values()
        if count != 1 or first is None:
            noun, size = (
                ("bytes", "2 or more" if count else 0) if dtype == "string" else (dtype, count)
            )
            raise Refused(
                f"Key: {name}, Index: 0.  Number of {noun} values != expected.  "
                f"Values size: {size} but output shape: []"
            )
        values[name] = first
    return values


def image_shape(values: Mapping[str, int]) -> Shape | None:
    """The (H, W, C) of a record's shape features (`SHAPE_FEATURES`, 0 where absent):
    `height` and `width` with `channels` (else `depth`, else 1) where both are positive,
    else a square `pixels` of one channel; None where neither is there."""
    height, width, pixels = values["height"], values["width"], values["pixels"]
    if height > 0 and width > 0:
        channels = next((c for c in (values["channels"], values["depth"]) if c > 0), 1)
        return (height, width, channels)
    side = math.isqrt(pixels) if pixels > 0 else 0
    if side and side * side == pixels:
        return (side, side, 1)
    return None


def no_image_shape(pixels: int, record: int, path: Path) -> str:
    """What the worker and the service say of a record `image_shape` finds no shape in."""
    received = f"`pixels`={pixels}, not a square" if pixels > 0 else "neither"
    return (
        "Expected `pixels` (a square number) or `height`, `width` and `channels` in every "
        f"record. Received: {received} in record {record} ({path})"
    )


def image_raw_problem(shape: Shape, size: int, record: int, head: bytes, path: Path) -> str | None:
    """What the worker and the service say of an `image_raw` of `size` bytes (its first
    bytes `head`) for images of `shape` (None: it fits)."""
    expected = math.prod(shape)
    if size == expected:
        return None
    return (
        f"Expected `image_raw` of {expected} bytes (image shape {shape}). "
        f"Received: {size} bytes in record {record}{_encoded_hint(head)} ({path})"
    )


def example_problem(reason: str, path: Path) -> str:
    """What the worker and the service say of a record its parser refuses for `reason`."""
    return (
        "Expected TFRecord files of tf.train.Example with `image_raw` (bytes) and `label` "
        f"(int64). Received: {reason} ({path})"
    )


# The first bytes of the encoded image files a TFRecord writer often stores instead.
_ENCODED_IMAGES = {
    b"\x89PNG\r\n\x1a\n": "PNG",
    b"\xff\xd8\xff": "JPEG",
    b"GIF8": "GIF",
    b"BM": "BMP",
}


def _encoded_hint(head: bytes) -> str:
    """Why an `image_raw` of the wrong size may be so: it holds an encoded image file."""
    for magic, kind in _ENCODED_IMAGES.items():
        if head.startswith(magic):
            return (
                f", which begin as a {kind} file does: `image_raw` holds raw uint8 pixels "
                "(height x width x channels, row by row), so decode each image "
                "(tf.io.decode_image) and write its .numpy().tobytes()"
            )
    return ""


def first_record_shape(record: bytes | memoryview, path: Path) -> Shape | None:
    """The image shape of a TFRecord file's first record, checked as the worker checks
    it; None where the record is `Unsure`, left to the worker.

    Raises:
        ValueError: what the worker would refuse of it, said as the worker says it (its
            parser's reason in TensorFlow's words), naming `path`.
    """
    try:
        values = parsed(example_features(record))
    except NotAnExample as error:
        raise ValueError(
            example_problem(f"a first record that is no tf.train.Example: {error}", path)
        ) from None
    except Refused as error:
        raise ValueError(example_problem(str(error), path)) from None
    except Unsure:
        return None
    # `parsed` let only int64 shape features through.
    ints = {name: v for name in SHAPE_FEATURES if isinstance(v := values[name], int)}
    shape = image_shape(ints)
    if shape is None:
        raise ValueError(no_image_shape(ints["pixels"], 0, path))
    image = values["image_raw"]
    assert isinstance(image, memoryview)
    if (problem := image_raw_problem(shape, len(image), 0, bytes(image[:16]), path)) is not None:
        raise ValueError(problem)
    return shape


# --- the wire format -------------------------------------------------------------------


def _fields(
    message: memoryview, top: bool = False, clamp: bool = False
) -> Iterator[tuple[int, int, int | memoryview]]:
    """Each field of `message`: its number, wire type and value (an int for a varint or a
    fixed field, a view of a length-delimited one's bytes: nothing is copied).

    Read as TensorFlow's parser reads them where protobuf refuses them (the module doc):
    `top`, the Example's own fields: its features under the one-byte tag alone (another
    tag's are yielded as field 0, unknown, as a field numbered 0 is). `clamp`, the fields
    of a message TensorFlow reads each under a limit (the Example's, its features', a
    Feature's, a list's): one that runs past the end is read to the end; elsewhere (a map
    entry's key and value, a BytesList's strings) it is no Example. A length of 2^32 or
    more is `Unsure`."""
    at, end = 0, len(message)
    while at < end:
        field_at = at
        key, at = _varint(message, at)
        number, wire = key >> 3, key & 7
        if top and at - field_at > 1 and (key == 0x0A or at - field_at > 5):
            if at - field_at > 5:  # TensorFlow reads a tag as a 32-bit varint
                raise Unsure(f"a tag of {at - field_at} bytes at byte {field_at}")
            number = 0  # not the one-byte tag: an unknown field to TensorFlow
        if number == 0 and not top:
            raise NotAnExample(f"a field numbered 0 at byte {field_at}")
        if wire == 0:
            value, at = _varint(message, at)
            yield number, wire, value
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if at + width > end:
                raise NotAnExample(f"a {width}-byte field at byte {at} of a {end}-byte message")
            yield number, wire, int.from_bytes(message[at : at + width], "little")
            at += width
        elif wire == 2:
            length, start = _varint(message, at)
            if length >> 32:
                raise Unsure(f"a length of 2^32 bytes or more ({length:,}) at byte {at}")
            if start + length > end:
                if clamp:
                    length = end - start
                else:
                    raise NotAnExample(
                        f"a field of {length:,} bytes at byte {start} of a {end:,}-byte message"
                    )
            yield number, wire, message[start : start + length]
            at = start + length
        else:  # 3, 4: a group, which TensorFlow's parser refuses; 6, 7: none
            raise NotAnExample(f"a field of wire type {wire} at byte {field_at}")


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    """The varint at `at` (as protobuf reads it: at most 10 bytes, the bits past 64 dropped)
    and where the next field begins."""
    value = shift = 0
    for index in range(at, min(at + 10, len(data))):
        byte = data[index]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & 0xFFFF_FFFF_FFFF_FFFF, index + 1
        shift += 7
    raise NotAnExample(f"a varint at byte {at} that does not end")


def _int64(value: int) -> int:
    """A varint's 64 bits as the signed int64 they encode."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _packed(run: memoryview, width: int) -> tuple[int, int | None]:
    """A packed run's count of values and its first (None: none): fixed `width`-byte
    values, or varints (`width` 0)."""
    if width:
        if len(run) % width:
            raise NotAnExample(f"a packed run of {len(run)} bytes, not of {width}-byte values")
        return len(run) // width, int.from_bytes(run[:width], "little") if run else None
    if not run:
        return 0, None
    if run[-1] >= 0x80:
        raise NotAnExample("a packed run whose last varint does not end")
    return _low_bytes(run), _int64(_varint(run, 0)[0])  # each varint ends at one


def _low_bytes(data: memoryview) -> int:
    """How many bytes of `data` are below 0x80: counted in C, on a copy of at most the cap."""
    return len(bytes(data).translate(None, _HIGH_BYTES))


_HIGH_BYTES = bytes(range(0x80, 0x100))
