"""Whether a custom model's module compiles, whether it defines its function, and whether
the function takes the worker's arguments, told from the module's source.

The service never imports a job's module: it may import TensorFlow (which the service
never loads), and its top level is code the worker, not the service, is there to run. So
the module's `.py` file is found the way the worker's import would find it, without
running any package's `__init__`, and read with `ast` for the names its top level binds.
Wherever the source cannot say for sure, the answer is "cannot tell" and the worker
decides, as before: a module that is not a plain `.py` file (an extension, a namespace
package, a submodule a package makes at import), a module that can bind names no reader
sees (a star import, a module `__getattr__`, `globals()`, `setattr`, `exec`, `global`
statements, `sys.modules`), or one that does not parse.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from importlib.machinery import (
    BuiltinImporter,
    FrozenImporter,
    ModuleSpec,
    PathFinder,
    SourceFileLoader,
)
from pathlib import Path

# Names whose use lets a module bind top-level names that no reading of its source sees.
_DYNAMIC_NAMES = frozenset({"globals", "vars", "locals", "setattr", "exec", "eval", "__import__"})


def top_level_spec(module: str, path: list[str]) -> ModuleSpec | None:
    """The spec of `module`'s top-level package as the worker would find it: on `path` (its
    PYTHONPATH, which comes first in its sys.path), then the service's own `sys.path`.
    None when there is none; raises ImportError or ValueError when a finder cannot say.
    Never runs the package's code."""
    top = module.split(".")[0]
    return PathFinder.find_spec(top, path) or importlib.util.find_spec(top)


def module_source(module: str, path: list[str], *, installed: bool = True) -> Path | None:
    """The `.py` file the worker would import as `module` (dotted), looked for on `path`
    then (where `installed`: the worker runs on the service's interpreter) the service's
    own `sys.path`, or None when that cannot be told without running a package's code
    (the module is not there either: the worker says so)."""
    parts = module.split(".")
    top = parts[0]
    try:
        if installed:
            spec = top_level_spec(module, path)
        elif BuiltinImporter.find_spec(top) or FrozenImporter.find_spec(top):
            return None  # another interpreter takes its own before any file on its path
        else:
            spec = PathFinder.find_spec(top, path)
        for depth in range(1, len(parts)):
            locations = spec.submodule_search_locations if spec is not None else None
            if not locations:
                return None
            spec = PathFinder.find_spec(".".join(parts[: depth + 1]), list(locations))
    except (ImportError, ValueError):
        return None
    if spec is None or not isinstance(spec.loader, SourceFileLoader) or not spec.origin:
        return None
    return Path(spec.origin)


def defines(source: Path, name: str) -> bool | None:
    """Whether the module in `source` binds `name` at its top level (True or False), or
    None when its source cannot say. Over-counts rather than under: a name bound in any
    branch of an `if` or `try`, or by a loop or comprehension, counts as bound."""
    tree = _readable_tree(source)
    if tree is None:
        return None
    if source.name == "__init__.py" and _submodule(source.parent, name):
        return None  # a submodule: the package has it as an attribute once it is imported
    return name in _top_level_names(tree)


def syntax_error(source: Path) -> SyntaxError | None:
    """The SyntaxError the worker's import of `source` would raise (an IndentationError, a
    bad encoding, `return` outside a function: what its compiler says, not only its
    parser), or None when it compiles. Compiled as import compiles it, never run: only
    valid for a worker of this interpreter's version. Some 15 ms a 1,000 lines."""
    try:
        compile(source.read_bytes(), str(source), "exec", dont_inherit=True)
    except SyntaxError as error:
        return error
    # Unreadable, NUL bytes, or nested past what the parser (MemoryError) or the compiler
    # (RecursionError) takes: no SyntaxError to say, and the worker says what it finds.
    except (OSError, ValueError, MemoryError, RecursionError):
        return None
    return None


@dataclass(frozen=True)
class Refusal:
    """Why a call would not bind: `text`, as `inspect.Signature.bind` says it with the
    function as its source shows it, and the `argument` it names (missing, unexpected or
    positional only)."""

    text: str
    argument: str
    missing: bool  # the function requires `argument` and the call does not give it
    # Every keyword of the call the function takes by no name of its own (where it has no
    # `**kwargs`), the first complaint's or not.
    unexpected: tuple[str, ...]


def call_refusal(source: Path, name: str, keywords: list[str]) -> Refusal | None:
    """Why calling the module's function `name` with `keywords` (by keyword) would raise
    a TypeError, as `inspect.Signature.bind` says it ("missing a required argument:
    'depth'"), with the function as its source shows it; or None when the call binds, or
    the source cannot say: `name` is not a plain function bound once at the top level
    (a decorator may change what it takes; a class's `__init__`, an import or a second
    binding may be anything)."""
    tree = _readable_tree(source)
    if tree is None:
        return None
    defs = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name
    ]
    if len(defs) != 1 or defs[0].decorator_list or _bindings(tree, name) != 1:
        return None
    function = defs[0]
    unbound = _unbound_keywords(function.args, keywords)
    if unbound is None:
        return None
    reason, argument, missing = unbound
    text = f"a function {name}({ast.unparse(function.args)}) ({reason})"
    return Refusal(text, argument, missing, _unexpected(function.args, keywords))


def _readable_tree(source: Path) -> ast.Module | None:
    """The module's syntax tree, or None when it does not parse or may bind names its
    statements do not show (`_binds_unseen`)."""
    try:
        tree = ast.parse(source.read_bytes(), filename=str(source))
    except (OSError, SyntaxError, ValueError, MemoryError, RecursionError):  # `syntax_error`
        return None
    return None if _binds_unseen(tree) else tree


def _bindings(tree: ast.Module, name: str) -> int:
    """How many statements at the module's top level bind `name` (anywhere in them)."""
    return sum(1 for node in tree.body if name in _top_level_names(ast.Module([node], [])))


def _unbound_keywords(args: ast.arguments, keywords: list[str]) -> tuple[str, str, bool] | None:
    """What `inspect.Signature.bind(**{k: ... for k in keywords})` would raise for a
    function of `args` (its first complaint, in its order), the argument it names and
    whether that is missing; or None when it binds."""
    positional = [*args.posonlyargs, *args.args]
    first_defaulted = len(positional) - len(args.defaults)
    for index, arg in enumerate(positional):
        if arg in args.posonlyargs and arg.arg in keywords and args.kwarg is None:
            reason = f"{arg.arg!r} parameter is positional only, but was passed as a keyword"
            return reason, arg.arg, False
        given = arg.arg in keywords and arg not in args.posonlyargs
        if not given and index < first_defaulted:
            return f"missing a required argument: {arg.arg!r}", arg.arg, True
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        if arg.arg not in keywords and default is None:
            return f"missing a required argument: {arg.arg!r}", arg.arg, True
    if unexpected := _unexpected(args, keywords):
        return f"got an unexpected keyword argument {unexpected[0]!r}", unexpected[0], False
    return None


def _unexpected(args: ast.arguments, keywords: list[str]) -> tuple[str, ...]:
    """The `keywords` a function of `args` takes by no name of its own: none where it has
    `**kwargs`."""
    if args.kwarg is not None:
        return ()
    by_keyword = {arg.arg for arg in [*args.args, *args.kwonlyargs]}
    return tuple(keyword for keyword in keywords if keyword not in by_keyword)


def _binds_unseen(tree: ast.Module) -> bool:
    """Whether the module may bind top-level names its statements do not show."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names):
            return True
        if isinstance(node, ast.Global):
            return True
        if isinstance(node, ast.Name) and node.id in _DYNAMIC_NAMES:
            return True
        if isinstance(node, ast.Attribute) and node.attr in ("modules", "__dict__"):
            return True
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "__getattr__"
        for node in tree.body
    )


def _submodule(package: Path, name: str) -> bool:
    return (package / f"{name}.py").exists() or (package / name).is_dir()


def _top_level_names(tree: ast.Module) -> set[str]:
    """Every name the module's own scope binds: not those of its functions, classes and
    lambdas, which have scopes of their own."""
    names: set[str] = set()
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
            # Decorators and defaults run in the module's scope (a walrus there binds).
            pending.extend(node.decorator_list)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        pending.extend(ast.iter_child_nodes(node))
    return names
