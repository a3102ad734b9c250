"""The README and docs/architecture.md say what the code does.

Mechanical checks, each well under a second, with no server and no TensorFlow: the
settings, modules, API routes, command lines, spec fields, optimizer options, TensorBoard
tags, run-directory files, exit codes, dependencies and paths the docs name are read out
of the Markdown and held against the code (the settings class, the app's routes built over
a temporary data dir but never started, the CLI's own parser, the spec's pydantic models,
the tag descriptions, `RunDir`, pyproject.toml, the files in the tree). A change to either
side that leaves the other behind fails here, naming what to fix.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
import socket
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.routing import BaseRoute, Mount

from service import schemas
from service.cli import EXIT_BAD_SETTING, EXIT_CANNOT_START, build_parser, main
from service.main import create_app
from service.progress import SERIES
from service.settings import OTHER_VARIABLES, Settings
from trainer import descriptions, rundir
from trainer import spec as job_spec
from trainer.rundir import ExitCode, RunDir

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
DOCS = (README, ARCHITECTURE)
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")

# --- reading Markdown ------------------------------------------------------------------


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _fenced(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)


def _prose(text: str) -> str:
    """The text without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _spans(text: str) -> list[str]:
    """Every inline `code` span, whitespace (line breaks in a span) collapsed."""
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", text)]


def _section(text: str, heading: str) -> str:
    """From the heading line that contains `heading` to the next heading of its level or above."""
    lines = text.splitlines()
    for start, line in enumerate(lines):
        if line.startswith("#") and heading in line:
            level = len(line) - len(line.lstrip("#"))
            end = next(
                (
                    i
                    for i in range(start + 1, len(lines))
                    if lines[i].startswith("#")
                    and len(lines[i]) - len(lines[i].lstrip("#")) <= level
                ),
                len(lines),
            )
            return "\n".join(lines[start:end])
    raise AssertionError(f"No heading containing {heading!r}")


def _table(text: str) -> list[list[str]]:
    """The cells of the first Markdown table in `text`, header and divider left out."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    assert len(rows) > 2, f"No table in:\n{text[:300]}"
    return rows[2:]


# --- settings --------------------------------------------------------------------------

ENV_PREFIX = "TOWERBOARD_"
SETTINGS_FIELDS = Settings.model_fields


def _settings_table() -> dict[str, str]:
    """README's settings table: variable -> its default cell."""
    documented = {}
    for variable, _meaning, default in _table(_section(_text(README), "### Settings")):
        names = [span for span in _spans(variable) if span.startswith(ENV_PREFIX)]
        defaults = _spans(default.split("(")[0]) if default.startswith("`") else None
        for i, name in enumerate(names):
            # `A`, `B` | `a`, `b`: each variable its own default, still a literal (its
            # backticks kept: without them `./data`, `127.0.0.1` read as prose, unchecked);
            # otherwise the cell as said.
            documented[name] = (
                f"`{defaults[i]}`" if defaults and len(defaults) == len(names) else default
            )
    return documented


@pytest.mark.parametrize("field", SETTINGS_FIELDS)
def test_every_setting_is_in_the_readme_settings_table(field: str) -> None:
    variable = ENV_PREFIX + field.upper()
    assert variable in _settings_table(), (
        f"service/settings.py reads {variable}; add a row for it to the README's settings table"
    )


def _as_default(text: str) -> object:
    """A default cell's value: `literal`, a number, true/false, empty, unset; `...` for prose."""
    text = text.strip()
    if text.startswith("`"):
        return text.strip("`")
    word = text.split(" ")[0].rstrip(":,;")  # "unset: any (...)" is unset
    words: dict[str, object] = {"true": True, "false": False, "empty": [], "unset": None}
    if word in words:
        return words[word]
    with contextlib.suppress(ValueError):
        return float(word)
    return ...  # prose ("the data dir's `datasets/`"): said in words, not checked


@pytest.mark.parametrize("variable", sorted(_settings_table()))
def test_readme_settings_table_names_real_settings_and_their_defaults(variable: str) -> None:
    field = variable.removeprefix(ENV_PREFIX).lower()
    assert field in SETTINGS_FIELDS, (
        f"The README's settings table names {variable}, which service/settings.py does not read"
    )
    said = _as_default(_settings_table()[variable])
    actual = SETTINGS_FIELDS[field].get_default(call_default_factory=True)
    if said is ...:
        return
    if isinstance(actual, Path):
        assert isinstance(said, str) and Path(said) == actual, (variable, said, actual)
    elif isinstance(actual, bool) or said is None or isinstance(said, list):
        assert said == actual, f"README says {variable} defaults to {said!r}; it is {actual!r}"
    elif isinstance(said, float):
        assert said == float(actual), f"README says {variable} defaults to {said:g}; it is {actual}"
    else:
        assert said == str(actual), f"README says {variable} defaults to {said!r}; it is {actual!r}"


def test_every_towerboard_variable_the_docs_name_is_read_somewhere() -> None:
    named = {name for doc in DOCS for name in re.findall(r"TOWERBOARD_[A-Z_]+", _text(doc))}
    unknown = named - {ENV_PREFIX + f.upper() for f in SETTINGS_FIELDS} - set(OTHER_VARIABLES)
    assert not unknown, f"The docs name variables nothing reads: {sorted(unknown)}"
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "${TOWERBOARD_DATASETS" in compose
    url_help = _verbs()["status"].format_help()
    assert "TOWERBOARD_URL" in url_help and "http://127.0.0.1:8000" in url_help, (
        "The README says --url defaults to TOWERBOARD_URL, else http://127.0.0.1:8000:\n" + url_help
    )


def test_readme_compose_env_block_matches_docker_compose() -> None:
    """The `.env` example's variables are the ones docker-compose.yml reads, with its defaults."""
    compose = (ROOT / "docker-compose.yml").read_text()
    section = _section(_text(README), "## One GPU host with Docker Compose")
    (block,) = [body for _lang, body in _fenced(section)]
    for line in block.splitlines():
        name, _, rest = line.partition("=")
        assert f"${{{name}" in compose, (
            f"README's .env sets {name}; docker-compose.yml never reads it"
        )
        said = re.search(r"\(default (\S+)\)", rest)
        if said is not None:
            assert f"${{{name}:-{said.group(1)}}}" in compose, (
                f"README says {name} defaults to {said.group(1)}; see docker-compose.yml"
            )


# --- modules ---------------------------------------------------------------------------


def _module_rows(package: str) -> list[list[str]]:
    """The rows of architecture.md's module table for `package` (service or trainer)."""
    return _table(_section(_text(ARCHITECTURE), f"(`{package}/`)"))


def _modules_on_disk(package: str) -> list[str]:
    base = ROOT / package
    return sorted(
        str(path.relative_to(base))
        for path in base.rglob("*.py")
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    )


def _documented(package: str, module: str) -> bool:
    """A top-level module is named in a row's first cell; one in a sub-package is named in a
    row whose first cell names the sub-package (`routes/`), as `file.py` or `sub/file.py`."""
    sub, _, name = module.rpartition("/")
    for first, *rest in _module_rows(package):
        names = _spans(first)
        if not sub and module in names:
            return True
        if sub and (module in names or f"{sub}/" in names):
            row = {span for cell in (first, *rest) for span in _spans(cell)}
            if module in row or name in row:
                return True
    return False


@pytest.mark.parametrize(
    "package, module",
    [
        (package, module)
        for package in ("service", "trainer")
        for module in _modules_on_disk(package)
    ],
)
def test_every_module_is_in_the_architecture_tables(package: str, module: str) -> None:
    assert _documented(package, module), (
        f"{package}/{module} is in no row of docs/architecture.md's `{package}/` table"
    )


@pytest.mark.parametrize("package", ["service", "trainer"])
def test_every_module_the_architecture_tables_name_exists(package: str) -> None:
    missing = []
    for first, *rest in _module_rows(package):
        subs = [span.rstrip("/") for span in _spans(first) if span.endswith("/")]
        for span in _spans(first):
            if not (ROOT / package / span).exists():
                missing.append(span)
        # A sub-package's row names its files bare (`verbs.py`) or with the folder.
        for cell in (first, *rest):
            for span in _spans(cell):
                if re.fullmatch(r"[\w/]+\.py", span) and not any(
                    (ROOT / package / where / span).is_file() for where in ("", *subs)
                ):
                    missing.append(span)
    assert not missing, f"docs/architecture.md's `{package}/` table names no such module: {missing}"


def _named_paths() -> Iterator[tuple[Path, str]]:
    """Repository paths the docs name in code spans, code blocks and links."""
    top = r"(?:service|trainer|static|tests|bench|docs|scripts)/[\w./-]*"
    for doc in DOCS:
        text = _text(doc)
        for span in _spans(_prose(text)):
            if re.fullmatch(top, span) or span in ("pyproject.toml", "docker-compose.yml"):
                yield doc, span
        for _lang, body in _fenced(text):
            for path in re.findall(rf"(?<![\w/.])({top})", body):
                yield doc, path.rstrip(".")
        for link in re.findall(r"\]\(([^)\s]+)\)", _prose(text)):
            if not re.match(r"[a-z]+:", link):
                target = (doc.parent / link.split("#")[0]).resolve()
                if target.is_relative_to(ROOT):  # links out of the repo: see the report
                    yield doc, str(target.relative_to(ROOT))


def test_every_repository_path_the_docs_name_exists() -> None:
    missing = sorted(
        {f"{doc.name}: {path}" for doc, path in _named_paths() if not (ROOT / path).exists()}
    )
    assert not missing, f"The docs name paths that do not exist: {missing}"


# --- the API ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    """The app as `towerboard serve` builds it, over an empty data dir; never started."""
    return create_app(Settings(data_dir=tmp_path_factory.mktemp("docs") / "data"))


def _routes(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path template) of every route: the OpenAPI ones and those outside it."""
    routes = [(m.upper(), p) for p, ops in app.openapi()["paths"].items() for m in ops]
    for route in app.routes:
        if isinstance(route, Mount):  # the dashboard's files, everything below it
            routes += [("GET", route.path), ("GET", f"{route.path}/{{file:path}}")]
        elif isinstance(route, BaseRoute) and (path := getattr(route, "path", None)):
            routes += [(method, path) for method in getattr(route, "methods", None) or ()]
    return routes


def _matches(template: str, path: str) -> bool:
    """Whether a documented path (`/api/v1/jobs/<id>/checkpoints/40`) fits a route template."""
    pattern = re.sub(r"\\\{[^}]*:path\\\}", ".*", re.escape(template))
    pattern = re.sub(r"\\\{[^}]*\\\}", "[^/]+", pattern)
    return re.fullmatch(pattern, path) is not None


_HOST = re.compile(r"(?:https?://)?(?:localhost|127\.0\.0\.1|HOST)(?::\d+)?(?=/)")
_PATH = r"/(?:api/v1|healthz|metrics|docs|tensorboard|static)\b[\w/<>{}.-]*"


def _commands(block: str) -> Iterator[list[str]]:
    """A shell block's commands as words: lines joined across `\\` and open quotes."""
    pending = ""
    for line in block.splitlines():
        pending += line + "\n"
        if line.endswith("\\"):
            continue
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on
            continue
        pending = ""
        if words:
            yield words


def _curl_words() -> Iterator[list[str]]:
    """The words of each curl command in the docs' code blocks."""
    for doc in DOCS:
        for _lang, block in _fenced(_text(doc)):
            yield from (words for words in _commands(block) if words[0] == "curl")


def _curls() -> Iterator[tuple[str, str, str | None]]:
    """(method, path, JSON body) of each curl the docs show."""
    for words in _curl_words():
        method, body, path = "GET", None, None
        for i, word in enumerate(words):
            if word == "-X":
                method = words[i + 1]
            elif word == "-d":
                body = words[i + 1]
            elif re.fullmatch(r"-[A-Za-z]*I[A-Za-z]*", word):
                method = "HEAD"
            elif found := re.search(_PATH, _HOST.sub("", word)):
                path = found.group(0)
        assert path is not None, f"A curl in the docs names no API path: {shlex.join(words)}"
        yield method, path.rstrip("/") or "/", body


def _mentions() -> set[tuple[str | None, str]]:
    """(method or None, path) of every API path the docs mention."""
    found: set[tuple[str | None, str]] = set()
    for doc in DOCS:
        text = _HOST.sub("", _text(doc))
        for path in re.findall(rf"(?<![\w>.}}/-])({_PATH})", text):
            found.add((None, path.rstrip("/*.") or "/"))
        for method, path in re.findall(rf"\b({'|'.join(METHODS)}) ({_PATH})", text):
            found.add((method, path.rstrip("/*.") or "/"))
    found.update((method, path) for method, path, _body in _curls())
    return found


def test_every_api_path_the_docs_mention_exists(app: FastAPI) -> None:
    routes = _routes(app)
    wrong = [
        f"{method or 'any'} {path}"
        for method, path in sorted(_mentions(), key=str)
        if not any(
            _matches(template, path) and method in (None, route_method)
            for route_method, template in routes
        )
    ]
    assert not wrong, f"The docs mention routes the app does not have: {wrong}"


def test_every_public_api_route_is_in_the_docs(app: FastAPI) -> None:
    mentioned = [(m, p) for m, p in _mentions() if m is not None]
    missing = [
        f"{method} {template}"
        for method, template in _routes(app)
        if template.startswith("/api/v1/")
        and method != "HEAD"  # the README says HEAD for every download at once
        and not any(m == method and _matches(template, p) for m, p in mentioned)
    ]
    assert not missing, f"Public routes the README and architecture.md never show: {missing}"


def test_no_curl_example_resumes_under_the_servers_file_name() -> None:
    """curl refuses `-C` with `-J` (it cannot know the name before it asks), exit 2."""
    curls = list(_curl_words())
    for doc in DOCS:
        curls += [shlex.split(s) for s in _spans(_prose(_text(doc))) if s.startswith("curl ")]
    for words in curls:
        short = {c for w in words if re.fullmatch(r"-[A-Za-z]+", w) for c in w[1:]}
        resumes = "C" in short or "--continue-at" in words
        names = "J" in short or "--remote-header-name" in words
        assert not (resumes and names), f"curl refuses this: {shlex.join(words)}"


def _body_model(app: FastAPI, method: str, path: str) -> str:
    """The name of the schema of a route's JSON body, from the OpenAPI document."""
    for template, operations in app.openapi()["paths"].items():
        if _matches(template, path) and method.lower() in operations:
            schema = operations[method.lower()]["requestBody"]["content"]["application/json"]
            refs = re.findall(r"#/components/schemas/(\w+)", json.dumps(schema))
            assert len(refs) == 1, schema
            return str(refs[0])
    raise AssertionError(f"No {method} {path} with a body")


def test_readme_curl_bodies_are_accepted(app: FastAPI) -> None:
    bodies = [(m, p, b) for m, p, b in _curls() if b is not None]
    assert bodies, "the README's curl examples post no body any more"
    for method, path, body in bodies:
        name = _body_model(app, method, path)
        model: type[BaseModel] = getattr(job_spec, name, None) or getattr(schemas, name)
        model.model_validate_json(body)  # raises, naming the field, if the docs drifted


# Spec fields the docs name bare, in a code span, without their parents.
SPEC_FIELDS_NAMED_ALONE = ("ema_decay", "towers", "batch_size", "shuffle_buffer", "deterministic")


def test_readme_spec_field_paths_exist() -> None:
    """`data.path`, `summaries.trace_steps`, `ema_decay`: the spec fields the docs name."""
    top = job_spec.JobSpec.model_fields
    named = {span for doc in DOCS for span in _spans(_prose(_text(doc)))}
    dotted = [
        s
        for s in named
        if re.fullmatch(r"[a-z_]+(\.[a-z_]+)+", s)
        and s.split(".")[0] in top
        and s.rsplit(".")[-1] not in ("py", "js", "json", "jsonl", "md", "npz")  # `data.py`: a file
    ]
    assert "data.path" in dotted and "summaries.trace_steps" in dotted  # the parser still works
    for name in dotted:
        model: Any = job_spec.JobSpec
        for part in name.split("."):
            assert issubclass(model, BaseModel) and part in model.model_fields, (
                f"The docs name spec field `{name}`; trainer/spec.py has none"
            )
            model = model.model_fields[part].annotation
    every = set()  # every field name of the spec, at any depth
    models: list[Any] = [job_spec.JobSpec]
    while models:
        fields = models.pop().model_fields
        every |= set(fields)
        models += [
            f.annotation
            for f in fields.values()
            if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)
        ]
    for name in SPEC_FIELDS_NAMED_ALONE:
        if name in named:
            assert name in every, f"The docs name spec field `{name}`; trainer/spec.py has none"


def test_readme_says_only_data_is_required() -> None:
    assert "only `data` is required" in " ".join(_text(README).split())
    required = [n for n, f in job_spec.JobSpec.model_fields.items() if f.is_required()]
    assert required == ["data"]


def test_readme_field_error_example_is_what_the_spec_says() -> None:
    example = re.search(r'`(\{"field": "[^`]*\})`', _text(README))
    assert example is not None
    said = json.loads(" ".join(example.group(1).split()))
    try:
        job_spec.JobSpec.model_validate({"data": {"format": "synthetic"}, said["field"]: 0})
    except job_spec.ValidationError as error:
        assert said in job_spec.field_errors(error)
    else:
        raise AssertionError(f"{said['field']}=0 is accepted; the README's example is a 422")


def test_readme_metric_series_are_the_services() -> None:
    sentence = re.search(r"gives every series \(([^)]*)\)", _text(README))
    assert sentence is not None
    assert set(_spans(sentence.group(1))) == set(SERIES)


def test_readme_tensorboard_fields_are_the_apis() -> None:
    text = " ".join(_text(README).split())
    replaced = re.search(r"`replaced`: the (.*?) of the TensorBoard that restart stopped", text)
    assert replaced is not None
    assert set(_spans(replaced.group(1))) == set(schemas.TensorBoardReplaced.model_fields)
    assert {"job_ids", "merge"} <= set(schemas.TensorBoardCreate.model_fields)
    assert "last_error" in schemas.TensorBoardPublic.model_fields


# --- the command lines -----------------------------------------------------------------

PLACEHOLDERS = {"ID": "j1", "STEP": "40", "N": "5"}


def _verbs() -> dict[str, argparse.ArgumentParser]:
    (verbs,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(verbs.choices)


def _parse(argv: list[str]) -> str | None:
    """None when `towerboard ARGV` parses; else argparse's complaint."""
    argv = [PLACEHOLDERS.get(word, word) for word in argv]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            build_parser().parse_args(argv)
    except SystemExit:
        return f"towerboard {shlex.join(argv)}: {stderr.getvalue().strip()}"
    return None


def _positionals(verb: str) -> list[str]:
    """Placeholders for the arguments `verb` requires (a job id), to parse its options alone."""
    actions = _verbs()[verb]._actions
    return ["j1" for a in actions if not a.option_strings and a.nargs in (None, "+")]


def _readme_towerboard_commands() -> list[list[str]]:
    text = _text(README)
    commands = []
    for _lang, block in _fenced(text):
        for line in block.splitlines():
            code = line.split(" #")[0]
            # A command ends at a shell operator: `towerboard status ID --json > job.json`.
            found = re.findall(r"towerboard (\w[^)&|;>]*)", code)
            commands += [shlex.split(c) for c in found]
    for span in _spans(_prose(text)):
        if span.startswith("towerboard ") and "VERB" not in span:
            commands.append(shlex.split(span)[1:])
        elif span.split(" ")[0] in _verbs() and " --" in span:  # `status --state running`
            verb, *words = shlex.split(span)
            commands.append([verb, *_positionals(verb), *words])
    return commands


def test_every_towerboard_command_in_the_readme_parses() -> None:
    commands = _readme_towerboard_commands()
    assert len(commands) > 10, commands  # the extraction still finds the examples
    errors = [error for argv in commands if (error := _parse(argv))]
    assert not errors, "\n".join(errors)


def test_every_flag_the_readme_names_is_an_option() -> None:
    """A lone `--flag value` span is taken by some verb (`--port 8001`: serve's)."""
    verbs = _verbs()
    trainer_help = _trainer_run_help()
    for span in _spans(_prose(_text(README))):
        if not span.startswith("--"):
            continue
        words = shlex.split(span)
        if words[0] in trainer_help:  # `--job-dir`: the worker's, `python -m trainer run`
            continue
        takers = [v for v, p in verbs.items() if words[0] in p._option_string_actions]
        assert takers, f"No towerboard verb takes {words[0]}"
        if len(words) > 1:  # with a value: one of them must take that value
            tried = [_parse([v, *_positionals(v), *words]) for v in takers]
            assert None in tried, "\n".join(str(error) for error in tried)


def _trainer_run_help() -> str:
    """`python -m trainer run --help` (it stops there, before TensorFlow is imported)."""
    from trainer.__main__ import main as trainer_main

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), pytest.raises(SystemExit):
        trainer_main(["run", "--help"])
    return stdout.getvalue()


def test_every_trainer_command_in_the_docs_uses_real_options() -> None:
    run_help = _trainer_run_help()
    found = 0
    for doc in DOCS:
        for _lang, block in _fenced(_text(doc)):
            for words in _commands(block):
                if "trainer" in words and words[words.index("trainer") - 1] == "-m":
                    found += 1
                    rest = words[words.index("trainer") + 1 :]
                    assert rest[0] == "run", words
                    for word in rest:
                        if word.startswith("--"):
                            assert word in run_help, f"`python -m trainer run` takes no {word}"
    assert found >= 2  # the README's one job without the service, and one across hosts


# --- exit codes ------------------------------------------------------------------------


def test_docs_worker_exit_codes_are_the_trainers() -> None:
    readme = " ".join(_text(README).split())
    said = re.search(r"exits ((?:\d [^,]+, )+\d [a-z ]+)", readme)
    assert said is not None
    assert [int(n) for n in re.findall(r"(?:^|, )(\d) ", said.group(1))] == sorted(ExitCode)
    architecture = " ".join(_text(ARCHITECTURE).split())
    listed = ", ".join(f"{c.value} {c.name.lower().replace('_', ' ')}" for c in sorted(ExitCode))
    assert f"the exit codes ({listed})" in architecture


def test_readme_serve_exit_codes_are_the_clis() -> None:
    readme = " ".join(_text(README).split())
    assert f"holds the data dir (exit {EXIT_CANNOT_START})" in readme
    assert f"a setting is invalid (exit {EXIT_BAD_SETTING})" in readme


def _cli_exit_codes() -> dict[str, int]:
    """README's `Exit codes: 0 done; 1 ...; 2 usage error ...; 3 service unreachable.`"""
    readme = " ".join(_text(README).split())
    said = re.search(r"Exit codes: (.*?)\.", readme)
    assert said is not None
    return {
        meaning.strip(): int(code) for code, meaning in re.findall(r"(\d+) ([^;]+)", said.group(1))
    }


def test_readme_cli_exit_codes_for_usage_and_unreachable() -> None:
    codes = _cli_exit_codes()
    usage = next(code for meaning, code in codes.items() if meaning.startswith("usage error"))
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit) as exited:
        main(["status", "--limit", "none"])
    assert exited.value.code == usage
    # A port nothing listens on: bound here, never listening, so the connection is refused.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        with contextlib.redirect_stderr(io.StringIO()):
            unreachable = next(c for m, c in codes.items() if m.startswith("service unreachable"))
            assert main(["status", "--url", url]) == unreachable
    assert {codes[m] for m in codes if m.startswith(("interrupted", "the reader of stdout"))} == {
        130,
        141,
    }


# --- what a job writes -----------------------------------------------------------------


def _literal(word: str) -> object:
    """A README default: `false`, `1e-7`, `1000`."""
    return json.loads(word) if word in ("true", "false") else float(word)


def test_readme_optimizer_options_table_is_the_specs() -> None:
    """Each option's row says which optimizer or schedule reads it (`options_not_read`
    refuses it with any other) and its default; every option the spec has is in a row."""
    names: dict[str, type[BaseModel]] = {
        "optimizer": job_spec.OptimizerSpec,
        "optimizer.schedule": job_spec.ScheduleSpec,
    }
    rows = _table(_section(_text(README), "### Optimizer and schedule options"))
    documented = set()
    for option, readers, defaults in rows:
        first, *rest = _spans(re.sub(r"\(.*?\)", "", option))
        where, _, key = first.rpartition(".")
        keys = [key, *rest]
        model = names[where]
        for key, default in zip(keys, defaults.split(", "), strict=True):
            documented.add(f"{where}.{key}")
            assert model.model_fields[key].default == _literal(default), (
                f"README: {where}.{key} defaults to {default}; "
                f"trainer/spec.py: {model.model_fields[key].default!r}"
            )
            value = model.model_fields[key].default
            reading = set()
            for name in get_args(model.model_fields["name"].annotation):
                part = {"name": name, key: value}
                given = {"schedule": part} if where == "optimizer.schedule" else part
                spec = job_spec.JobSpec.model_validate(
                    {"data": {"format": "synthetic"}, "optimizer": given}
                )
                if not job_spec.options_not_read(spec):
                    reading.add(name)
            assert set(_spans(readers)) == reading, (
                f"README: {where}.{key} is read by {_spans(readers)}; the spec: {sorted(reading)}"
            )
    options = {
        f"{where}.{key}"
        for where, model in names.items()
        for key, field in model.model_fields.items()
        if key != "name" and field.annotation is not job_spec.ScheduleSpec
    }
    options -= {"optimizer.learning_rate", "optimizer.warmup_steps"}  # every optimizer's
    assert options == documented, (
        f"README's options table and trainer/spec.py differ: {sorted(options ^ documented)}"
    )


def _sample(tag: str) -> str:
    """A tag as the table names it (`tower_i/loss`, `weights/<layer>/<var>`) as the trainer
    writes one (`tower_0/loss`, `weights/x/x`)."""
    return re.sub(r"<[^>]+>", "x", tag.replace("tower_i", "tower_0"))


def test_readme_tensorboard_table_names_every_described_tag() -> None:
    """Each tag `trainer/descriptions.py` describes is named in the README's row of its
    sub-directory (`tb/train` scalars, histograms or images; `tb/eval` scalars)."""
    rows = _table(_section(_text(README), "## What a job writes to TensorBoard"))
    named: dict[str, list[str]] = {}
    for where, what in rows:
        if match := re.match(r"`tb/(train|eval)`", where):
            named.setdefault(match.group(1), []).extend(_sample(s) for s in _spans(what))
    assert set(named) == {"train", "eval"}, named.keys()
    missing = [
        f"tb/{subdir} {pattern}"
        for subdir, pattern, _description in descriptions._TABLE
        if not any(re.fullmatch(pattern, tag) for tag in named[subdir])
    ]
    assert not missing, f"README's TensorBoard table names no tag for: {missing}"


# The run directory's files that the service writes, not the worker (`python -m trainer run`).
SERVICE_WRITES = ("log", "profile_request")


def test_readme_run_directory_lists_what_the_worker_writes() -> None:
    """README's `It writes runs/my-job/ — ...` names each file of `RunDir` the worker
    writes, and trainer/rundir.py's docstring names every file of `RunDir`."""
    paths = {
        name: getattr(RunDir(Path("job")), name).name
        for name, member in vars(RunDir).items()
        if isinstance(member, property)
    }
    assert set(SERVICE_WRITES) < set(paths), paths
    readme = " ".join(_text(README).split())
    said = re.search(r"It writes `runs/my-job/` — (.*?) — and exits", readme)
    assert said is not None
    listed = {s.rstrip("/") for s in _spans(said.group(1)) if re.fullmatch(r"\w[\w.]*/?", s)}
    worker = {file for name, file in paths.items() if name not in SERVICE_WRITES}
    assert listed == worker, (
        f"README's run directory and trainer/rundir.py differ: {sorted(listed ^ worker)}"
    )
    contract = rundir.__doc__ or ""
    unnamed = [
        file for file in paths.values() if not re.search(rf"^ +{re.escape(file)}\b", contract, re.M)
    ]
    assert not unnamed, f"trainer/rundir.py's docstring does not list {unnamed}"


# --- what the project is built from ----------------------------------------------------


def _pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    return dict(pin.split("==") for pin in pins)


def test_readme_dependency_table_is_pyproject() -> None:
    table = _table(_section(_text(README), "## Dependencies"))
    named: dict[str, str | None] = {}
    for package, _why in table:
        if "vendored" in package:
            continue
        for item in re.sub(r"\(.*?\)", "", package).split(","):
            name, _, version = item.strip().partition(" ")
            named[name] = version or None
    pins = _pins()
    assert set(named) == set(pins), "README's dependency table and pyproject.toml differ"
    for package, said in named.items():
        if said is not None:
            assert pins[package].startswith(said + "."), (
                f"README: {package} {said}; pinned {pins[package]}"
            )


def test_docs_name_the_vendored_uplot_and_tensorflow_image() -> None:
    uplot = re.match(r"uPlot (\S+)", (ROOT / "static/vendor/uplot/VERSION").read_text())
    assert uplot is not None
    for doc in DOCS:
        assert set(re.findall(r"uPlot (\d[\d.]*\d)", _text(doc))) == {uplot.group(1)}, doc.name
    base = re.search(r"^FROM (\S+)", (ROOT / "Dockerfile").read_text(), flags=re.M)
    assert base is not None and f"`{base.group(1)}`" in _text(README)


def test_readme_dashboard_labels_are_on_the_dashboard() -> None:
    dashboard = "\n".join(
        path.read_text()
        for path in (ROOT / "static").rglob("*")
        if path.suffix in (".js", ".html") and "vendor" not in path.parts
    )
    section = " ".join(_section(_text(README), "## The dashboard").split())
    labels = re.findall(r"\*\*([^*]+)\*\*", section)
    assert len(labels) > 5
    missing = [label for label in labels if label not in dashboard]
    assert not missing, f"The README names dashboard buttons static/ does not have: {missing}"
