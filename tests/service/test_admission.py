"""`service.admission.admit` on its own: what it makes of a relative data path."""

import gzip
import io
import struct
import zipfile
from pathlib import Path

import numpy as np
import tensorflow as tf

from service.admission import admit
from service.devices import DevicePool
from tests.damaged_files import (
    damage_first_member,
    flag_first_member_encrypted,
    write_lying_npz,
)
from tests.tfrecords import write_examples, write_tfrecord
from trainer.spec import AugmentSpec, JobSpec, ModelSpec

POOL = DevicePool(devices=("cpu:0",), gpu=False, max_towers=8)


def _spec(path: str) -> JobSpec:
    return JobSpec.model_validate({"data": {"format": "npz", "path": path}})


def _roots(tmp_path: Path) -> list[Path]:
    roots = [tmp_path / "first", tmp_path / "second"]
    for root in roots:
        root.mkdir()
    (roots[1] / "set").mkdir()
    np.savez(roots[1] / "set" / "a.npz", x=np.zeros((2, 4, 4), np.uint8), y=np.zeros(2, int))
    return roots


def test_admit_takes_a_relative_path_under_the_root_that_holds_it(tmp_path: Path) -> None:
    roots = _roots(tmp_path)
    spec, errors = admit(_spec("set/a.npz"), pool=POOL, data_roots=roots)
    assert errors == [] and spec.data.path == str(roots[1] / "set" / "a.npz")


def test_admit_takes_a_relative_glob_under_the_root_it_matches_in(tmp_path: Path) -> None:
    # The glob was looked for under the first root only: "matches no such file".
    roots = _roots(tmp_path)
    spec, errors = admit(_spec("set/*.npz"), pool=POOL, data_roots=roots)
    assert errors == [] and spec.data.path == str(roots[1] / "set" / "*.npz")


def test_admit_names_every_root_for_a_relative_path_found_under_none(tmp_path: Path) -> None:
    # The message named the first root's path alone, as if the others were not searched.
    roots = _roots(tmp_path)
    looked = f"(a relative path is looked for under each data root: {roots[0]}, {roots[1]})"
    for path, says in (("set/*.nothing.npz", "matches no such file"), ("gone.npz", "not exist")):
        spec, [error] = admit(_spec(path), pool=POOL, data_roots=roots)
        assert spec.data.path == str(roots[0] / path)
        assert error["field"] == "data.path" and says in error["message"], error
        assert error["message"].endswith(looked), error
    # One root: its path says where it was looked for; a path found fails for its own reason.
    _, [alone] = admit(_spec("gone.npz"), pool=POOL, data_roots=roots[:1])
    assert "data root" not in alone["message"]
    (roots[1] / "bad.npz").write_bytes(b"not a zip")
    _, [bad] = admit(_spec("bad.npz"), pool=POOL, data_roots=roots)
    assert str(roots[1] / "bad.npz") in bad["message"] and "data root" not in bad["message"]


def test_admit_says_a_tilde_is_not_expanded(tmp_path: Path) -> None:
    # "~/data/a.npz" was looked for as a folder named "~" under the root, and the message
    # said only that it does not exist.
    roots = _roots(tmp_path)
    _, [error] = admit(_spec("~/set/a.npz"), pool=POOL, data_roots=roots[:1])
    assert error["message"].endswith(
        "; a `~` is not expanded: give the path in full, or relative to a data root"
    ), error
    # A file named so under a root is found, and said nothing of.
    (roots[0] / "~").mkdir()
    np.savez(roots[0] / "~" / "b.npz", x=np.zeros((2, 4, 4), np.uint8), y=np.zeros(2, int))
    _, errors = admit(_spec("~/b.npz"), pool=POOL, data_roots=roots[:1])
    assert errors == []


def test_admit_counts_one_device_in_the_singular(tmp_path: Path) -> None:
    one_gpu = DevicePool(devices=("gpu:3",), gpu=True, max_towers=1)
    spec = JobSpec.model_validate({"data": {"format": "synthetic"}, "towers": 2})
    _, errors = admit(spec, pool=one_gpu, data_roots=[tmp_path])
    assert errors == [
        {
            "field": "towers",
            "message": "Expected at most 1 tower, the devices this service can give "
            "on 1 GPU (TOWERBOARD_GPUS=3). Received: 2",
        }
    ]


def test_admit_keeps_variables_on_a_gpu_only_where_jobs_get_one(tmp_path: Path) -> None:
    # On a CPU-only host the worker put them on the CPU, saying so only in its log, while
    # the job's spec went on saying gpu0.
    spec = JobSpec.model_validate({"data": {"format": "synthetic"}, "parameter_device": "gpu0"})
    _, errors = admit(spec, pool=POOL, data_roots=[tmp_path])
    assert errors == [
        {
            "field": "parameter_device",
            # The host's tower limit has nothing to do with it, and nested brackets
            # read badly: said as what the setting is.
            "message": "Expected 'cpu' on this host, whose jobs get no GPU "
            "(TOWERBOARD_GPUS is empty). Received: 'gpu0'",
        }
    ]
    one_gpu = DevicePool(devices=("gpu:3",), gpu=True, max_towers=1)
    assert admit(spec, pool=one_gpu, data_roots=[tmp_path])[1] == []


def _npz(path: Path, **arrays: np.ndarray) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)  # type: ignore[arg-type]  # numpy's stub: allow_pickle is 2nd
    return str(path)


def test_admit_refuses_npz_arrays_the_worker_would_refuse_from_their_headers(
    tmp_path: Path,
) -> None:
    # Each was a 201, then a failed job once it had waited for its turn: the .npy headers
    # alone say so, and the worker's own first check (`shape_problem`) is run on them.
    images, labels = np.zeros((8, 4, 4), np.uint8), np.zeros(8, np.int64)
    cases = {
        "counts": (
            _npz(tmp_path / "counts.npz", x=images, y=labels[:7]),
            "Expected `x` and `y` to have the same number of examples. Received: x has 8, y has 7",
        ),
        "one-hot": (
            _npz(tmp_path / "onehot.npz", x=images, y=np.zeros((8, 3))),
            "Expected `y` of shape (N,) holding class ids. Received: shape (8, 3)",
        ),
        "eval shape": (
            _npz(
                tmp_path / "evalshape.npz",
                x=images,
                y=labels,
                x_eval=np.zeros((2, 5, 5), np.uint8),
                y_eval=labels[:2],
            ),  # fmt: skip
            "Expected eval images of the train image shape (4, 4, 1). Received: (5, 5, 1)",
        ),
        # String labels, as class names are often saved: the headers give the dtype.
        "class names": (
            _npz(tmp_path / "names.npz", x=images, y=np.array(["cat", "dog"] * 4)),
            "Expected integer class ids in `y`, numbered from 0 (class names are numbered by "
            "np.unique(y, return_inverse=True)[1]). Received: dtype <U3",
        ),
        "complex pixels": (
            _npz(tmp_path / "complex.npz", x=images + 0j, y=labels),
            "Expected numeric pixels `x`. Received: dtype complex128",
        ),
        "validation counts": (
            _npz(tmp_path / "val.npz", x=images, y=labels, x_val=images[:2], y_val=labels[:3]),
            "Expected `x_val` and `y_val` to have the same number of examples. "
            "Received: x_val has 2, y_val has 3",
        ),
        "files of two shapes": (
            (
                _npz(tmp_path / "two" / "a.npz", x=images, y=labels),
                _npz(tmp_path / "two" / "b.npz", x=np.zeros((8, 6, 6), np.uint8), y=labels),
            )[0].rpartition("/")[0],
            "Expected every file to hold images of one shape. Received: (4, 4, 1) in ",
        ),
    }
    for what, (path, says) in cases.items():
        _, errors = admit(_spec(path), pool=POOL, data_roots=[tmp_path])
        assert [e["field"] for e in errors] == ["data.path"], (what, errors)
        assert says in errors[0]["message"], (what, errors)
    # The same arrays, consistent: admitted.
    good = _npz(tmp_path / "good.npz", x=images, y=labels[:, None])  # labels (N, 1) are fine
    assert admit(_spec(good), pool=POOL, data_roots=[tmp_path])[1] == []


def test_admit_refuses_an_npz_header_that_claims_more_than_its_member_holds(
    tmp_path: Path,
) -> None:
    path = write_lying_npz(tmp_path / "lying.npz")  # the worker's test reads it too
    _, [error] = admit(_spec(str(path)), pool=POOL, data_roots=[tmp_path])
    assert error["field"] == "data.path"
    assert "and the member holds 100: damaged, or written cut short" in error["message"], error


def test_admit_refuses_npz_members_it_cannot_read(tmp_path: Path) -> None:
    # A compressed member whose data is damaged was a 500 (zlib.error escaped the check).
    for save, damage, says in (
        (np.savez_compressed, damage_first_member, "Error -3 while decompressing data"),
        (np.savez, flag_first_member_encrypted, "File 'x.npy' is encrypted"),
    ):
        path = tmp_path / f"{damage.__name__}.npz"
        save(path, x=np.zeros((100, 28, 28), np.uint8), y=np.zeros(100, np.int64))
        damage(path)
        _, [error] = admit(_spec(str(path)), pool=POOL, data_roots=[tmp_path])
        assert error["field"] == "data.path"
        assert error["message"].startswith(f"Expected a readable .npz file. Received: {says}")
        assert error["message"].endswith(f" ({path})")


def _idx(path: Path, array: np.ndarray, gz: bool = False) -> None:
    """An IDX file of uint8 `array` (its header: magic, type 0x08, dims)."""
    raw = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    raw += array.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(raw) if gz else raw)


def _idx_spec(path: Path) -> JobSpec:
    return JobSpec.model_validate({"data": {"format": "idx", "path": str(path)}})


def test_admit_refuses_idx_files_the_worker_would_refuse_from_their_headers(
    tmp_path: Path,
) -> None:
    # Each was a 201, then a failed job once it had waited for its turn.
    images, labels = np.zeros((8, 4, 4), np.uint8), np.zeros(8, np.uint8)
    counts, cut, lying = tmp_path / "counts", tmp_path / "cut", tmp_path / "lying"
    _idx(counts / "train-images-idx3-ubyte", images)
    _idx(counts / "train-labels-idx1-ubyte", labels[:7])
    _idx(cut / "train-images-idx3-ubyte", images)
    _idx(cut / "train-labels-idx1-ubyte", labels)
    (cut / "train-images-idx3-ubyte").write_bytes(
        (cut / "train-images-idx3-ubyte").read_bytes()[:-5]
    )
    _idx(lying / "train-labels-idx1-ubyte.gz", labels, gz=True)
    (lying / "train-images-idx3-ubyte.gz").write_bytes(
        gzip.compress(b"\x00\x00\x08\x03" + struct.pack(">3I", 10**6, 1000, 1000))
    )
    cases = {
        counts: "Expected `images` and `labels` to have the same number of examples. "
        "Received: images has 8, labels has 7",
        cut: "Expected 128 bytes of data for dims (8, 4, 4). Received: 123 bytes",
        lying: "Received: a gzip file that holds at most ",
    }
    for folder, says in cases.items():
        _, errors = admit(_idx_spec(folder), pool=POOL, data_roots=[tmp_path])
        assert [e["field"] for e in errors] == ["data.path"], (folder, errors)
        assert says in errors[0]["message"], (folder, errors)
    # A consistent pair, plain and gzip'd: admitted.
    good = tmp_path / "good"
    _idx(good / "train-images-idx3-ubyte.gz", images, gz=True)
    _idx(good / "train-labels-idx1-ubyte", labels)
    assert admit(_idx_spec(good), pool=POOL, data_roots=[tmp_path])[1] == []


def test_admit_refuses_what_the_headers_image_shape_rules_out(tmp_path: Path) -> None:
    # Each was a 201 and then a job the worker refused (exit 2) once it had waited for its
    # turn: the image shape was in the headers the service had just read.
    npz = _npz(tmp_path / "wide.npz", x=np.zeros((2, 24, 40, 3), np.uint8), y=np.zeros(2, int))
    idx = tmp_path / "idx"
    _idx(idx / "train-images-idx3-ubyte", np.zeros((2, 24, 40)))
    _idx(idx / "train-labels-idx1-ubyte", np.zeros(2))
    # TFRecord files' first record gives their shape (`height`, `width`, `channels`).
    tfrecord = write_tfrecord(tmp_path / "wide.tfrecord", np.zeros((2, 24, 40, 3)), [0, 1])
    cases = [
        ("npz", npz, "24x40x3"),
        ("idx", str(idx), "24x40x1"),
        ("tfrecord", str(tfrecord), "24x40x3"),
    ]
    for fmt, path, images in cases:
        spec = JobSpec.model_validate(
            {
                "data": {"format": fmt, "path": path, "augment": {"random_crop_padding": 24}},
                "model": {"name": "mlp", "params": {"hidden": [65_536, 16_000]}},
            }
        )
        _, (crop, size) = admit(spec, pool=POOL, data_roots=[tmp_path])
        assert crop == {
            "field": "data.augment.random_crop_padding",
            "message": "Expected `random_crop_padding` below the images' height and width "
            "(24x40), so that a shifted image keeps some of its pixels. Received: 24, "
            "which would leave about 4% of the training images blank",
        }, fmt
        assert size["field"] == "model.params", fmt
        assert size["message"].startswith("Expected a model of at most 1,073,741,824 "), fmt
        assert size["message"].endswith(
            f"on the data's {images} images and 2 classes, the fewest any labels give"
        ), fmt
        # A padding under the shorter side and a model that fits: admitted.
        fits = spec.model_copy(
            update={
                "data": spec.data.model_copy(
                    update={"augment": AugmentSpec(random_crop_padding=23)}
                ),
                "model": ModelSpec(name="mlp", params={"hidden": [500], "dropout": 0.0}),
            }
        )
        assert admit(fits, pool=POOL, data_roots=[tmp_path])[1] == [], fmt


def test_admit_takes_npz_members_numpy_reads_that_the_header_check_does_not(
    tmp_path: Path,
) -> None:
    # A version 3.0 header (numpy's reader alone takes it: the check made a 500 of it), and
    # bytes after a member's data (np.load ignores them, and so does the worker).
    labels = io.BytesIO()
    np.save(labels, np.zeros(8, np.int64))
    v3, padded = io.BytesIO(), io.BytesIO()
    np.lib.format.write_array(v3, np.zeros((8, 4, 4), np.uint8), version=(3, 0))
    np.lib.format.write_array(padded, np.zeros((8, 4, 4), np.uint8))
    for name, x in (("v3.npz", v3.getvalue()), ("padded.npz", padded.getvalue() + bytes(16))):
        with zipfile.ZipFile(tmp_path / name, "w") as archive:
            archive.writestr("x.npy", x)
            archive.writestr("y.npy", labels.getvalue())
        with np.load(tmp_path / name) as loaded:
            assert loaded["x"].shape == (8, 4, 4)
        assert admit(_spec(str(tmp_path / name)), pool=POOL, data_roots=[tmp_path])[1] == []


def test_admit_refuses_tfrecord_files_that_are_all_empty(tmp_path: Path) -> None:
    # Was a 201, then "Expected at least one record" from the worker after the wait.
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "train.tfrecord").write_bytes(b"")
    (tmp_path / "set" / "eval.tfrecord").write_bytes(b"")
    spec = JobSpec.model_validate({"data": {"format": "tfrecord", "path": str(tmp_path / "set")}})
    _, [error] = admit(spec, pool=POOL, data_roots=[tmp_path])
    assert error == {
        "field": "data.path",
        "message": "Expected at least one record. Received: empty TFRecord files: "
        f"{tmp_path / 'set' / 'train.tfrecord'}",
    }
    # One file with records among empty ones: admitted (a sharded writer leaves some empty).
    _tfrecord(tmp_path / "set" / "more.tfrecord")
    assert admit(spec, pool=POOL, data_roots=[tmp_path])[1] == []
    # Empty once decompressed counts as empty too.
    (tmp_path / "gz").mkdir()
    _tfrecord(tmp_path / "gz" / "train.tfrecord.gz", records=0)
    gz = JobSpec.model_validate({"data": {"format": "tfrecord", "path": str(tmp_path / "gz")}})
    assert (
        "Expected at least one record"
        in admit(gz, pool=POOL, data_roots=[tmp_path])[1][0]["message"]
    )


def _tfrecord(path: Path, records: int = 1) -> bytes:
    """A TFRecord file of 4x4 images as TensorFlow writes it (gzip'd where named .gz); its
    bytes."""
    write_tfrecord(path, np.zeros((records, 4, 4, 1), np.uint8), [0] * records)
    return path.read_bytes()


def test_admit_refuses_tfrecord_files_that_begin_with_no_record_header(tmp_path: Path) -> None:
    # Each was a 201, then a DataLossError in the worker once the job had waited its turn.
    good = _tfrecord(tmp_path / "good.tfrecord", records=2)
    bad = {
        "readme": (b"# My data set\nShards of MNIST.\n", ""),
        "gzip not named .gz": (gzip.compress(good), "; it begins as a gzip file does"),
        "npz": (_npz_bytes(), "; it begins as a zip (or .npz) file does"),
        "cut in the header": (good[:7], ""),
    }
    for what, (content, hint) in bad.items():
        folder = tmp_path / what.replace(" ", "-")
        folder.mkdir()
        _tfrecord(folder / "train.tfrecord")
        (folder / "eval.tfrecord").write_bytes(content)
        spec = JobSpec.model_validate({"data": {"format": "tfrecord", "path": str(folder)}})
        _, [error] = admit(spec, pool=POOL, data_roots=[tmp_path])
        assert error["field"] == "data.path"
        says = error["message"]
        assert says.startswith(
            "Expected TFRecord files. Received: a file whose first bytes are no record's "
            f"header, not a TFRecord file or one cut short{hint}"
        ), (what, says)
        assert says.endswith(f" ({folder / 'eval.tfrecord'})"), (what, says)
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "train.tfrecord.gz").write_bytes(b"\x1f\x8b\x08" + bytes(20))
    spec = JobSpec.model_validate({"data": {"format": "tfrecord", "path": str(damaged)}})
    [error] = admit(spec, pool=POOL, data_roots=[tmp_path])[1]
    assert error["message"].startswith("Expected a readable gzip file. Received: "), error
    # Real files, plain and gzip'd, and a glob over them: admitted.
    _tfrecord(damaged / "train.tfrecord.gz", records=3)
    _tfrecord(damaged / "more.tfrecord.GZ")  # `.GZ` as `.gz`, as the worker reads it
    _tfrecord(damaged / "eval.tfrecord")
    assert admit(spec, pool=POOL, data_roots=[tmp_path])[1] == []


def _npz_bytes() -> bytes:
    written = io.BytesIO()
    np.savez(written, x=np.zeros(2))
    return written.getvalue()


def test_admit_refuses_tfrecord_first_records_the_worker_would_refuse(tmp_path: Path) -> None:
    # Each was a 201, then "Expected TFRecord files of tf.train.Example ..." or another
    # refusal from the worker (exit 2) once the job had waited its turn.
    image = tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes(16)]))
    sixteen = tf.train.Feature(int64_list=tf.train.Int64List(value=[16]))
    cases = {
        "no label": (
            {"image_raw": image},
            "Received: Feature: label (data type: int64) is required but could not be found.",
        ),
        "label of bytes": (
            {"image_raw": image, "label": image, "pixels": sixteen},
            "Received: Key: label, Index: 0.  Data types don't match. Data type: string but "
            "expected type: int64",
        ),
    }
    prefix = (
        "Expected TFRecord files of tf.train.Example with `image_raw` (bytes) and `label` (int64). "
    )
    for what, (features, received) in cases.items():
        path = write_examples(tmp_path / f"{what}.tfrecord", [features])
        spec = JobSpec.model_validate({"data": {"format": "tfrecord", "path": str(path)}})
        _, errors = admit(spec, pool=POOL, data_roots=[tmp_path])
        assert errors == [{"field": "data.path", "message": f"{prefix}{received} ({path})"}], what
    # A first eval record of another shape than the first train record's.
    folder = tmp_path / "set"
    folder.mkdir()
    write_tfrecord(folder / "train.tfrecord", np.zeros((2, 4, 4, 1)), [0, 1])
    write_tfrecord(folder / "test.tfrecord.gz", np.zeros((2, 5, 5, 1)), [0, 1])
    spec = JobSpec.model_validate({"data": {"format": "tfrecord", "path": str(folder)}})
    assert admit(spec, pool=POOL, data_roots=[tmp_path])[1] == [
        {
            "field": "data.path",
            "message": "Expected eval images of the train image shape (4, 4, 1). Received: "
            f"(5, 5, 1) ({folder / 'test.tfrecord.gz'})",
        }
    ]
    write_tfrecord(folder / "test.tfrecord.gz", np.zeros((2, 4, 4, 1)), [0, 1])
    assert admit(spec, pool=POOL, data_roots=[tmp_path])[1] == []
