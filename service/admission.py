"""What only the service can check about a submitted job, beyond `trainer.spec`.

The spec model checks a job on its own; these checks need to know this host: towers
(and a parameter device `gpu0`) against the devices the service can give, a data path
against the allowed data roots and the files actually there (for .npz and IDX files,
what their headers say: the arrays, their shapes and sizes; for TFRecord files, each
one's first record header, and the first training and eval record as the worker parses
it; and what the image shape they give rules out: a crop padding or a built-in model
too large for it), and a custom model's module against what the worker
can import (and, where its source shows the function, that it takes the arguments the
worker calls it with). A job the service accepts must not fail in the worker for a reason that could
have been checked here.

A custom model's module is looked for, never imported (its import may need TensorFlow,
or run anything): on the worker's path (the project, PYTHONPATH, the installed packages)
when workers run on the service's own interpreter; on their PYTHONPATH alone when they run
on another of the same Python version; otherwise the worker alone checks it. Its
top-level package is looked for, its source compiled as the worker's import would compile
it (not run: a syntax error is refused with its line, where the worker found it only at
the job's turn; only where the worker's Python is this one's version, as another's
grammar differs), and its function read in that source with `ast`
(`service.modulesource`): a module whose source cannot say (an extension, a star import,
a module `__getattr__`) is left to the worker.

A relative data path is taken relative to the data roots (the first root where it exists),
and the job is stored with the absolute path, since the worker runs in its run directory.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path

from service.devices import DevicePool
from service.modulesource import (
    call_refusal,
    defines,
    module_source,
    syntax_error,
    top_level_spec,
)
from trainer import modelmodules
from trainer.datafiles import (
    DataFilesError,
    check_idx_headers,
    check_npz_headers,
    check_tfrecord_files,
    check_under_roots,
    is_glob,
    resolve_files,
)
from trainer.modelsize import too_large
from trainer.spec import PATH_CHARS, JobSpec, shown_value


@dataclass(frozen=True)
class WorkerImports:
    """Where a worker imports a custom model's module from, as far as the service knows."""

    path: list[str]  # the worker's PYTHONPATH: first on its sys.path, whatever its interpreter
    # Its interpreter is this one: its installed packages are the service's, so a module
    # found nowhere is missing, and one found is the one it imports.
    installed: bool
    # Its Python is this one's version (`workers.this_python`): a module that does not
    # compile here does not import there. Another version's grammar differs (a `match` or
    # `except*` is a SyntaxError before 3.10 and 3.11), so there the worker alone checks.
    compiles: bool


def admit(
    spec: JobSpec,
    *,
    pool: DevicePool,
    data_roots: list[Path],
    worker: WorkerImports | None = None,
    model_modules: tuple[str, ...] | None = None,
) -> tuple[JobSpec, list[dict[str, str]]]:
    """The spec as it will be stored, and every reason this service cannot run it as
    `{"field", "message"}` (none when it can). `worker`: where workers import from, so a
    custom model's module can be looked for (None: nowhere); `model_modules`: the modules
    custom models may come from (None: any)."""
    errors = []
    refused = spec.model.is_custom and modelmodules.refusal(spec.model.name, model_modules)
    if refused:
        errors.append({"field": "model.name", "message": refused})
    elif spec.model.is_custom and worker and (problem := _module_problem(spec, worker)):
        errors.append({"field": problem[0], "message": problem[1]})
    if spec.towers > pool.max_towers:
        errors.append(
            {
                "field": "towers",
                "message": f"Expected at most {pool.max_towers} "
                f"tower{'s' if pool.max_towers != 1 else ''}, the devices this "
                f"service can give on {pool.describe()}. Received: {spec.towers}",
            }
        )
    if spec.parameter_device == "gpu0" and not pool.gpu:
        # The worker would say so in its log and keep the variables on the CPU, while the
        # stored spec went on saying gpu0.
        errors.append(
            {
                "field": "parameter_device",
                "message": "Expected 'cpu' on this host, whose jobs get no GPU "
                "(TOWERBOARD_GPUS is empty). Received: 'gpu0'",
            }
        )
    if (given := spec.data.path) is not None:
        path, held = _absolute(given, data_roots)
        spec = spec.model_copy(update={"data": spec.data.model_copy(update={"path": path})})
        try:
            check_under_roots(path, data_roots)
            files = resolve_files(spec.data)
            shape = None
            if spec.data.format == "npz":
                # Each file's arrays, from its zip directory and their .npy headers (no
                # array is read): a lone .npy, a file that is no zip, arrays under other
                # names or of shapes that do not go together, or a damaged header failed
                # only in the worker, after the job's wait for its turn.
                shape = check_npz_headers(files)
            elif spec.data.format == "tfrecord":
                # The first record of the first training file (and of the first eval
                # file) as the worker parses it, without TensorFlow: a record that is no
                # tf.train.Example, lacks `image_raw` or `label`, or an image shape that
                # `image_raw` fits, failed only in the worker, after the job's wait.
                shape = check_tfrecord_files(files)
            elif spec.data.format == "idx":
                # The same of each IDX file's header and size: a file cut short, or images
                # and labels of other counts, failed only in the worker.
                shape = check_idx_headers(files)
            if shape is not None:
                errors.extend(_image_shape_problems(spec, shape))
        except DataFilesError as error:
            message = str(error)
            if not held and len(data_roots) > 1:
                # The message names the first root's path alone: say the others had none.
                looked = ", ".join(str(root) for root in data_roots)
                message += f" (a relative path is looked for under each data root: {looked})"
            if not held and given.startswith("~"):
                # As a shell would have it: the spec is JSON, and nothing expands it.
                message += (
                    "; a `~` is not expanded: give the path in full, or relative to a data root"
                )
            errors.append({"field": "data.path", "message": message})
        except (ValueError, OSError) as error:
            # A NUL byte in the path (ValueError), or a folder this service may not read,
            # a name too long, a symlink loop (OSError): the job's fault, not the service's.
            errors.append({"field": "data.path", "message": _unreadable(path, error)})
    return spec, errors


def _image_shape_problems(spec: JobSpec, shape: tuple[int, ...]) -> list[dict[str, str]]:
    """What the data's image shape (H, W, C), read from its files' headers (a TFRecord
    file's first record), shows the worker would refuse: a `random_crop_padding` of a whole side or more, a built-in model
    too large for images of that shape (counted on 2 classes, the fewest any labels give,
    as the labels are data, not headers). Both failed only in the worker, exit 2."""
    errors = []
    height, width, _ = shape
    if (crop := spec.data.augment.crop_problem(height, width)) is not None:
        errors.append({"field": "data.augment.random_crop_padding", "message": crop})
    if not spec.model.is_custom:
        images = "x".join(str(side) for side in shape)
        data = f"on the data's {images} images and 2 classes, the fewest any labels give"
        reason = too_large(spec.model.name, spec.model.params, shape, 2, data)
        if reason is not None:
            errors.append({"field": "model.params", "message": reason})
    return errors


def _unreadable(path: str, error: ValueError | OSError) -> str:
    if isinstance(error, OSError) and error.strerror:
        cause = error.strerror
        if error.filename is not None and os.fsdecode(error.filename) != path:
            cause += f" (at {os.fsdecode(error.filename)})"
    else:
        cause = str(error)
    return (
        "Expected `path` to name a file, folder or glob this service can read. "
        f"Received: {shown_value(path, PATH_CHARS)}, which cannot be read: {cause}"
    )


def _absolute(path: str, data_roots: list[Path]) -> tuple[str, bool]:
    """`path` under the first data root that holds it (the first root where none does),
    and whether a root held it (an absolute path: True, whatever is there)."""
    if Path(path).is_absolute() or not data_roots:
        return path, True
    candidates = [root / path for root in data_roots]
    # os.path.exists is False for a path it cannot even stat (a NUL byte, a name too
    # long): the checks that follow say why. A glob is held by a root it matches in.
    held = next((c for c in candidates if _holds(c)), None)
    return str(held or candidates[0]), held is not None


def _holds(candidate: Path) -> bool:
    path = str(candidate)
    try:
        return os.path.exists(path) or (is_glob(path) and bool(glob.glob(path, recursive=True)))
    except (ValueError, OSError):  # glob on a name it cannot even scan
        return False


def _module_problem(spec: JobSpec, worker: WorkerImports) -> tuple[str, str] | None:
    """The field and the message of why the worker could not use the custom model's
    module: it is not there, does not compile, or its function does not fit
    (`_function_problem`). None when it can, or the service cannot tell. Only the module
    named is read (not its package's `__init__`, nor what it imports): one file a job."""
    if not (worker.installed or worker.compiles):
        return None  # another Python, of its own packages and grammar: the worker checks
    name = spec.model.name
    module = name.partition(":")[0]
    if worker.installed and (missing := _missing_module(module, worker.path)) is not None:
        return "model.name", (
            f"Expected 'module:function' with a module the worker can import. Received: "
            f"{shown_value(name)}, but {missing} (looked for on the worker's path: "
            f"{os.pathsep.join(worker.path)}, then the installed packages)"
        )
    source = module_source(module, worker.path, installed=worker.installed)
    if source is None:
        return None
    if worker.compiles and (error := syntax_error(source)) is not None:
        # The worker found this only at the job's turn, after TensorFlow's import (exit 2).
        where = "".join(
            f", {label} {value}"
            for label, value in (("line", error.lineno), ("column", error.offset))
            if value
        )
        return "model.name", (
            f"Expected 'module:function' with a module that compiles. Received: "
            f"{shown_value(name)}, but {source}{where}: {error.msg}"
        )
    return _function_problem(spec, source)


def _function_problem(spec: JobSpec, source: Path) -> tuple[str, str] | None:
    """The field and the message of why the custom model's function (`module:function`)
    cannot be called as the worker calls it: its module defines no such function, or it
    cannot take `input_shape`, `num_classes` and the spec's `model.params` by keyword.
    None when it can, or its source cannot say (`service.modulesource`): read, not
    imported. The field is where the spec would change: `model.params.width` for a param
    the function does not take, `model.params` for an argument it requires that no param
    gives, else `model.name` (a function that does not take the worker's own arguments,
    `input_shape` and `num_classes`, by those names)."""
    model = spec.model.name
    function = model.partition(":")[2]
    if defines(source, function) is False:
        return "model.name", (
            f"Expected 'module:function' with a function the module defines. Received: "
            f"{model!r}, but {source} defines no {function!r} at its top level"
        )
    keywords = ["input_shape", "num_classes", *spec.model.params]
    refused = call_refusal(source, function, keywords)
    if refused is None:
        return None
    if {"input_shape", "num_classes"} & set(refused.unexpected):
        field = "model.name"  # not a builder of the worker's: other params would not do
    elif refused.argument in spec.model.params:
        field = f"model.params.{refused.argument}"
    elif refused.missing and refused.argument not in ("input_shape", "num_classes"):
        field = "model.params"
    else:
        field = "model.name"
    # As the worker says it (`trainer.models`), where it found this at the job's turn.
    return field, (
        f"Expected model {model!r} to take the keyword arguments {', '.join(keywords)}. "
        f"Received: {refused.text}"
    )


def _missing_module(module: str, worker_path: list[str]) -> str | None:
    """Why the worker could not import `module` ("there is no module 'a'"), or None when it
    may. Only the top-level package is looked for: a parent package may make its
    submodules at import (os.path, tensorflow.keras), and looking for them the way
    importlib.util.find_spec('a.b') does would run a's __init__."""
    try:
        found = top_level_spec(module, worker_path)
    except (ImportError, ValueError):
        return None  # a finder that cannot say: leave it to the worker
    return None if found is not None else f"there is no module {shown_value(module.split('.')[0])}"
