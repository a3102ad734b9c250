"""Tests of `trainer.datafiles`: which files a data spec names, and the data-root check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.datafiles import (
    ROOTS_ENV,
    DataFiles,
    DataFilesError,
    check_under_roots,
    resolve_files,
    roots_from_environ,
    roots_to_environ,
)
from trainer.spec import DataSpec

REPO = Path(__file__).resolve().parents[2]
MNIST_T10K = REPO.parent / "shared" / "data" / "mnist-t10k"


def touch(folder: Path, *names: str) -> list[Path]:
    """Empty files: resolving looks at names only, never at contents."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / name for name in names]
    for path in paths:
        path.write_bytes(b"")
    return paths


def spec(fmt: str, path: Path | str) -> DataSpec:
    return DataSpec(format=fmt, path=str(path))


# --- idx -----------------------------------------------------------------------------


def test_resolve_files_idx_folder_splits_train_and_eval_pairs(tmp_path: Path) -> None:
    train_x, train_y, test_x, test_y, _ = touch(
        tmp_path,
        "train-images-idx3-ubyte.gz",
        "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
        "README.md",
    )

    files = resolve_files(spec("idx", tmp_path))

    assert files == DataFiles(
        train=[train_x], eval=[test_x], pairs={test_x: test_y, train_x: train_y}
    )


def test_resolve_files_idx_test_prefix_is_eval(tmp_path: Path) -> None:
    train_x, _, test_x, _ = touch(
        tmp_path,
        "digits-images-idx3-ubyte",
        "digits-labels-idx1-ubyte",
        "test-images-idx3-ubyte",
        "test-labels-idx1-ubyte",
    )

    files = resolve_files(spec("idx", tmp_path))

    assert (files.train, files.eval) == ([train_x], [test_x])


def test_resolve_files_idx_single_pair_is_train(tmp_path: Path) -> None:
    images, labels = touch(tmp_path, "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")

    files = resolve_files(spec("idx", tmp_path))

    assert files == DataFiles(train=[images], eval=[], pairs={images: labels})


def test_resolve_files_idx_images_file_finds_labels_of_other_compression(tmp_path: Path) -> None:
    images, labels = touch(tmp_path, "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte")

    files = resolve_files(spec("idx", images))

    assert files == DataFiles(train=[images], eval=[], pairs={images: labels})


def test_resolve_files_idx_takes_names_with_a_dot_before_idx3(tmp_path: Path) -> None:
    # MNIST as Kaggle and Windows unpackers name it: refused as "a folder holding
    # `*-images-idx3-ubyte[.gz]` files", so users had to rename four files.
    train_x, train_y, test_x, test_y = touch(
        tmp_path,
        "train-images.idx3-ubyte",
        "train-labels.idx1-ubyte",
        "t10k-images.idx3-ubyte",
        "t10k-labels.idx1-ubyte",
    )

    files = resolve_files(spec("idx", tmp_path))

    assert files == DataFiles(
        train=[train_x], eval=[test_x], pairs={train_x: train_y, test_x: test_y}
    )


def test_resolve_files_idx_reads_plain_twin_of_gz(tmp_path: Path) -> None:
    touch(tmp_path, "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
    images, labels = touch(tmp_path, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

    files = resolve_files(spec("idx", tmp_path))

    assert files == DataFiles(train=[images], eval=[], pairs={images: labels})


def test_resolve_files_idx_glob_keeps_same_named_pairs_of_every_folder(tmp_path: Path) -> None:
    # Taken for twins by name alone, all but one folder's pair was dropped without a word.
    first = touch(tmp_path / "part1", "train-images-idx3-ubyte", "train-labels-idx1-ubyte")
    second = touch(tmp_path / "part2", "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")

    files = resolve_files(spec("idx", tmp_path / "**" / "*-images-idx3-ubyte*"))

    assert files == DataFiles(
        train=[first[0], second[0]], eval=[], pairs={first[0]: first[1], second[0]: second[1]}
    )


def test_resolve_files_idx_glob_keeps_images_files(tmp_path: Path) -> None:
    a_x, a_y, b_x, b_y = touch(
        tmp_path,
        "a-images-idx3-ubyte",
        "a-labels-idx1-ubyte",
        "b-images-idx3-ubyte.gz",
        "b-labels-idx1-ubyte.gz",
    )

    files = resolve_files(spec("idx", tmp_path / "*"))

    assert files == DataFiles(train=[a_x, b_x], eval=[], pairs={a_x: a_y, b_x: b_y})


def test_resolve_files_idx_missing_labels(tmp_path: Path) -> None:
    touch(tmp_path, "train-images-idx3-ubyte.gz")

    with pytest.raises(DataFilesError) as error:
        resolve_files(spec("idx", tmp_path))

    assert str(error.value) == (
        "Expected the labels file train-labels-idx1-ubyte[.gz] beside the images file. "
        f"Received: no such file in {tmp_path} (for train-images-idx3-ubyte.gz)"
    )


def test_resolve_files_idx_folder_without_images(tmp_path: Path) -> None:
    touch(tmp_path, "README.md", "t10k-labels-idx1-ubyte.gz")

    with pytest.raises(DataFilesError) as error:
        resolve_files(spec("idx", tmp_path))

    assert str(error.value) == (
        "Expected a folder holding `*-images-idx3-ubyte[.gz]` files with their "
        "`*-labels-idx1-ubyte[.gz]` files. "
        f"Received: README.md, t10k-labels-idx1-ubyte.gz in {tmp_path}"
    )


def test_resolve_files_idx_labels_file_path(tmp_path: Path) -> None:
    _, labels = touch(tmp_path, "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")

    with pytest.raises(DataFilesError) as error:
        resolve_files(spec("idx", labels))

    assert str(error.value) == (
        "Expected an idx `path` to name a folder or a `*-images-idx3-ubyte[.gz]` file. "
        f"Received: {labels}"
    )


def test_resolve_files_idx_mnist_t10k() -> None:
    if not MNIST_T10K.is_dir():
        pytest.skip(f"MNIST test set not found at {MNIST_T10K}")

    files = resolve_files(spec("idx", MNIST_T10K))

    images = MNIST_T10K / "t10k-images-idx3-ubyte.gz"
    assert files == DataFiles(
        train=[images], eval=[], pairs={images: MNIST_T10K / "t10k-labels-idx1-ubyte.gz"}
    )


# --- any path --------------------------------------------------------------------------


def test_resolve_files_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope"

    with pytest.raises(DataFilesError) as error:
        resolve_files(spec("npz", missing))

    assert str(error.value) == (
        f"Expected `path` to name an existing file, folder or glob. Received: '{missing}', "
        "which does not exist"
    )


def test_resolve_files_says_a_tilde_is_not_expanded() -> None:
    # A spec given to the worker straight (`python -m trainer run --spec`) is JSON: no shell
    # expands its `~`.
    with pytest.raises(DataFilesError) as error:
        resolve_files(spec("npz", "~/no-such-towerboard-data/a.npz"))

    assert str(error.value).endswith(
        "which does not exist; a `~` is not expanded: give the path in full"
    )


def test_resolve_files_glob_matching_nothing(tmp_path: Path) -> None:
    touch(tmp_path, "data.txt")
    pattern = str(tmp_path / "*.npz")

    with pytest.raises(DataFilesError) as error:
        resolve_files(spec("npz", pattern))

    assert str(error.value) == (
        f"Expected the glob `path` to match `.npz` files. Received: '{pattern}' matches no such file"
    )


def test_resolve_files_path_that_is_neither_file_nor_folder(tmp_path: Path) -> None:
    # A FIFO was said not to exist.
    fifo = tmp_path / "pipe.npz"
    os.mkfifo(fifo)

    with pytest.raises(DataFilesError) as error:
        resolve_files(spec("npz", fifo))

    assert str(error.value).endswith(f"Received: '{fifo}', which is not a regular file or a folder")


def test_resolve_files_folder_of_folders_says_a_glob_reaches_into_them(tmp_path: Path) -> None:
    touch(tmp_path / "sub", "a.npz")

    with pytest.raises(DataFilesError) as error:
        resolve_files(spec("npz", tmp_path))

    assert str(error.value) == (
        f"Expected a folder holding `.npz` files. Received: nothing in {tmp_path} "
        f"(folders inside it are not searched: a glob such as '{tmp_path}/**/*' is)"
    )


def test_resolve_files_double_star_glob_reaches_every_depth(tmp_path: Path) -> None:
    # `**` matched one level only, and the files deeper were left out without a word.
    top, middle, deep = (
        touch(tmp_path, "a.npz"),
        touch(tmp_path / "x", "b.npz"),
        touch(tmp_path / "x" / "y", "c.npz"),
    )

    files = resolve_files(spec("npz", tmp_path / "**" / "*.npz"))

    assert files == DataFiles(train=[*top, *middle, *deep], eval=[])


def test_resolve_files_takes_existing_name_with_glob_characters_literally(tmp_path: Path) -> None:
    (path,) = touch(tmp_path, "set[1].npz")

    assert resolve_files(spec("npz", path)) == DataFiles(train=[path], eval=[])


def test_resolve_files_synthetic_has_no_files() -> None:
    assert resolve_files(DataSpec(format="synthetic")) == DataFiles(train=[], eval=[])


def test_raise_data_files_error_as_value_error() -> None:
    assert issubclass(DataFilesError, ValueError)


# --- npz and tfrecord -------------------------------------------------------------------


def test_resolve_files_npz_folder_splits_eval_by_name(tmp_path: Path) -> None:
    a, b, evals, latest, test, joined, _ = touch(
        tmp_path, "a.npz", "b.npz", "eval.npz", "latest.npz", "mnist_test.npz",
        "mnisttest.npz", "notes.txt",
    )  # fmt: skip

    files = resolve_files(spec("npz", tmp_path))

    # Names that contain `eval` or `test` anywhere, as JOB_SPEC.md says: `mnisttest` was
    # once trained on, read as a word that does not start with `test`.
    assert files == DataFiles(train=[a, b], eval=[evals, latest, test, joined])


def test_resolve_files_npz_lone_eval_named_file_is_train(tmp_path: Path) -> None:
    (path,) = touch(tmp_path, "mnist_test.npz")

    assert resolve_files(spec("npz", path)) == DataFiles(train=[path], eval=[])


def test_resolve_files_npz_glob(tmp_path: Path) -> None:
    first, second, test = touch(tmp_path, "part-1.npz", "part-2.npz", "part-test.npz")
    touch(tmp_path, "other.npz")

    files = resolve_files(spec("npz", tmp_path / "part-*.npz"))

    assert files == DataFiles(train=[first, second], eval=[test])


def test_resolve_files_tfrecord_folder_keeps_record_files(tmp_path: Path) -> None:
    a, b, evals = touch(tmp_path, "a.tfrecord", "b.tfrecords.gz", "eval.tfrec")
    touch(tmp_path, "README.md", "dataset_info.json")

    files = resolve_files(spec("tfrecord", tmp_path))

    # A README or TFDS's dataset_info.json is no shard: not named as one left out (the
    # glob the note gives would have read them as TFRecord files, and failed).
    assert files == DataFiles(train=[a, b], eval=[evals], skipped=[])


def test_resolve_files_tfrecord_folder_shards_beside_a_readme_get_a_narrower_glob(
    tmp_path: Path,
) -> None:
    touch(tmp_path, "train.tfrecord", "README.md")
    shards = touch(tmp_path, "train-00000-of-00002", "mnist-train.tfrecord-00001-of-00002")

    files = resolve_files(spec("tfrecord", tmp_path))

    assert files.skipped == sorted(shards)
    note = files.skipped_note()
    assert note is not None and f"give a glob such as '{tmp_path}/*-of-*'" in note, note


def test_resolve_files_tfrecord_folder_names_the_files_it_skips(tmp_path: Path) -> None:
    # Shards named without a suffix beside `train.tfrecord` were left out without a word:
    # the job trained on a third of the folder. Still left out, but named (for the log).
    (train,) = touch(tmp_path, "train.tfrecord")
    shards = touch(tmp_path, "train-00000-of-00002", "train-00001-of-00002")
    touch(tmp_path, ".DS_Store")  # hidden: no data, and `folder/*` does not match it
    touch(tmp_path / "sub", "deeper-00000-of-00001")  # a folder's own files only

    files = resolve_files(spec("tfrecord", tmp_path))

    assert files == DataFiles(train=[train], eval=[], skipped=shards)
    # A glob reads every file it matches, and a file is itself: neither skips any.
    assert resolve_files(spec("tfrecord", tmp_path / "*")).skipped == []
    assert resolve_files(spec("tfrecord", train)).skipped == []


def test_resolve_files_tfrecord_folder_of_shards_without_suffix_suggests_a_glob(
    tmp_path: Path,
) -> None:
    # The 422 said only "Expected a folder holding `.tfrecord` files": not that these are
    # refused for their names, nor how to read them.
    touch(tmp_path, "train-00000-of-00002", "train-00001-of-00002")

    with pytest.raises(DataFilesError) as error:
        resolve_files(spec("tfrecord", tmp_path))

    assert str(error.value) == (
        "Expected a folder holding files named `.tfrecord`, `.tfrecords` or `.tfrec` "
        "(optionally `.gz`). Received: train-00000-of-00002, "
        f"train-00001-of-00002 in {tmp_path} (a folder gives only files named `.tfrecord`, "
        f"`.tfrecords` or `.tfrec` (optionally `.gz`): a glob such as '{tmp_path}/*' reads "
        "every file it matches)"
    )

    touch(tmp_path / "sub", "c.tfrecord")
    with pytest.raises(DataFilesError) as error:
        resolve_files(spec("tfrecord", tmp_path))
    assert str(error.value).endswith(
        f"reads every file it matches; folders inside it are not searched: a glob such as "
        f"'{tmp_path}/**/*' is)"
    )


def test_resolve_files_tfrecord_glob_takes_shards_without_suffix(tmp_path: Path) -> None:
    shards = touch(tmp_path, "train-00000-of-00002", "train-00001-of-00002")
    (test,) = touch(tmp_path, "test-00000-of-00001")

    files = resolve_files(spec("tfrecord", tmp_path / "*-of-*"))

    assert files == DataFiles(train=shards, eval=[test])


def test_resolve_files_glob_takes_a_test_folder_it_matches_as_eval(tmp_path: Path) -> None:
    # `data/train/` and `data/test/` read by file name alone: the test set was trained on.
    base = tmp_path / "test-runs" / "cifar"  # folders above the glob's wildcards do not count
    train = touch(base / "train", "part-0.tfrecord", "part-1.tfrecord")
    test = touch(base / "test", "part-0.tfrecord")
    evals = touch(base / "x" / "eval", "part-0.tfrecord")

    files = resolve_files(spec("tfrecord", base / "**" / "*.tfrecord"))

    assert files == DataFiles(train=train, eval=[*test, *evals])


def test_resolve_files_idx_glob_takes_a_t10k_folder_it_matches_as_eval(tmp_path: Path) -> None:
    train_x, _ = touch(tmp_path / "train", "a-images-idx3-ubyte", "a-labels-idx1-ubyte")
    test_x, _ = touch(tmp_path / "t10k", "b-images-idx3-ubyte", "b-labels-idx1-ubyte")

    files = resolve_files(spec("idx", tmp_path / "*" / "*-images-idx3-ubyte"))

    assert (files.train, files.eval) == ([train_x], [test_x])


def test_resolve_files_glob_in_a_test_folder_is_all_train(tmp_path: Path) -> None:
    shards = touch(tmp_path / "test", "a.npz", "b.npz")

    files = resolve_files(spec("npz", tmp_path / "test" / "*.npz"))

    assert files == DataFiles(train=shards, eval=[])


# --- check_under_roots ---------------------------------------------------------------


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    """An allowed data root holding `mnist/`, and a folder outside it (both real paths)."""
    base = tmp_path.resolve()
    root, outside = base / "data", base / "outside"
    touch(root / "mnist", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
    touch(outside, "secret.npz", "t10k-labels-idx1-ubyte.gz")
    return root, outside


def rejection(path: str | Path, resolved: Path, root: Path, via: str = "which") -> str:
    return (
        f"Expected `path` inside one of the data roots: {root}. "
        f"Received: {str(path)!r}, {via} resolves to {resolved}"
    )


def test_check_under_roots_accepts_paths_inside(roots: tuple[Path, Path]) -> None:
    root, _ = roots
    mnist = root / "mnist"
    for path in (root, mnist, mnist / "*.gz", mnist / "t10k-images-idx3-ubyte.gz", root / "new"):
        check_under_roots(str(path), [root])


def test_check_under_roots_accepts_root_behind_symlink(roots: tuple[Path, Path]) -> None:
    root, _ = roots
    link = root.parent / "data-link"
    link.symlink_to(root)

    check_under_roots(str(link / "mnist"), [root])
    check_under_roots(str(root / "mnist"), [link])


def test_check_under_roots_rejects_dotdot(roots: tuple[Path, Path]) -> None:
    root, outside = roots
    path = f"{root}/mnist/../../outside/secret.npz"

    with pytest.raises(DataFilesError) as error:
        check_under_roots(path, [root])

    assert str(error.value) == rejection(path, outside / "secret.npz", root)


def test_check_under_roots_rejects_symlink_escape(roots: tuple[Path, Path]) -> None:
    root, outside = roots
    link = root / "link"
    link.symlink_to(outside)

    with pytest.raises(DataFilesError) as error:
        check_under_roots(str(link / "secret.npz"), [root])

    assert str(error.value) == rejection(link / "secret.npz", outside / "secret.npz", root)


def test_check_under_roots_rejects_symlinked_file_in_folder(roots: tuple[Path, Path]) -> None:
    root, outside = roots
    member = root / "mnist" / "stolen.npz"
    member.symlink_to(outside / "secret.npz")

    with pytest.raises(DataFilesError) as error:
        check_under_roots(str(root / "mnist"), [root])

    assert str(error.value) == rejection(
        root / "mnist", outside / "secret.npz", root, via=f"whose file {member}"
    )


def test_check_under_roots_rejects_symlinked_labels_of_images_file(
    roots: tuple[Path, Path],
) -> None:
    root, outside = roots
    (images,) = touch(root / "split", "t10k-images-idx3-ubyte.gz")
    labels = root / "split" / "t10k-labels-idx1-ubyte.gz"
    labels.symlink_to(outside / "t10k-labels-idx1-ubyte.gz")

    with pytest.raises(DataFilesError) as error:
        check_under_roots(str(images), [root])

    assert str(error.value) == rejection(
        images, outside / "t10k-labels-idx1-ubyte.gz", root, via=f"whose labels file {labels}"
    )


def test_check_under_roots_rejects_symlinked_labels_of_glob_match(roots: tuple[Path, Path]) -> None:
    root, outside = roots
    touch(root / "split", "t10k-images-idx3-ubyte.gz")
    labels = root / "split" / "t10k-labels-idx1-ubyte.gz"
    labels.symlink_to(outside / "t10k-labels-idx1-ubyte.gz")
    pattern = f"{root}/split/*-images-idx3-ubyte.gz"

    with pytest.raises(DataFilesError) as error:
        check_under_roots(pattern, [root])

    assert str(error.value) == rejection(
        pattern, outside / "t10k-labels-idx1-ubyte.gz", root, via=f"whose labels file {labels}"
    )


def test_check_under_roots_rejects_glob_outside(roots: tuple[Path, Path]) -> None:
    root, outside = roots
    pattern = f"{outside}/*.npz"

    with pytest.raises(DataFilesError) as error:
        check_under_roots(pattern, [root])

    assert str(error.value) == rejection(pattern, outside, root, via=f"whose folder {outside}")


def test_check_under_roots_rejects_glob_match_outside(roots: tuple[Path, Path]) -> None:
    root, outside = roots
    (root / "elsewhere").symlink_to(outside)
    pattern = f"{root}/*/secret.npz"

    with pytest.raises(DataFilesError) as error:
        check_under_roots(pattern, [root])

    match = root / "elsewhere" / "secret.npz"
    assert str(error.value) == rejection(
        pattern, outside / "secret.npz", root, via=f"whose match {match}"
    )


def test_check_under_roots_rejects_everything_without_roots(roots: tuple[Path, Path]) -> None:
    root, _ = roots

    with pytest.raises(DataFilesError) as error:
        check_under_roots(str(root), [])

    assert str(error.value) == (
        "Expected `path` inside one of the data roots: (none configured). "
        f"Received: {str(root)!r}, which resolves to {root}"
    )


def test_import_datafiles_without_tensorflow() -> None:
    code = "import sys, trainer.datafiles; print('tensorflow' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )

    assert result.stdout.strip() == "False"


def test_the_workers_data_roots_travel_whole_whatever_their_characters() -> None:
    # TOWERBOARD_DATA_ROOTS is comma-separated, so a root may hold a `:` (os.pathsep): joined
    # with it, a worker split such a root in two and refused every job.
    roots = [Path("/data/a:b"), Path("/data/c,d"), Path("/data/é")]
    environ = {ROOTS_ENV: roots_to_environ(roots)}
    assert roots_from_environ(environ) == roots
    assert roots_from_environ({}) is None  # a job run by hand
    for bad in ("/data", '{"a": 1}', "[1]"):
        with pytest.raises(ValueError, match="to be a JSON list of folders"):
            roots_from_environ({ROOTS_ENV: bad})


def test_resolve_files_says_a_link_leads_nowhere_rather_than_that_it_does_not_exist(
    tmp_path: Path,
) -> None:
    loop, dangling = tmp_path / "loop.npz", tmp_path / "dangling.npz"
    loop.symlink_to(loop)
    dangling.symlink_to(tmp_path / "gone.npz")
    for link in (loop, dangling):
        with pytest.raises(DataFilesError) as error:
            resolve_files(spec("npz", link))
        assert str(error.value).endswith(
            "which is a link that leads to nothing that exists (a loop, or a missing target)"
        ), error.value
