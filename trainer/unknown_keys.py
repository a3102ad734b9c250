"""What an error says of a key no spec model takes: the key it was probably meant to be.

`trainer.spec.field_errors` asks here for every unknown key of a job spec or a request
body. In order, the first that applies:
- a key holding a path (`"optimizer.learning_rate": 0.1`): how to nest it;
- a known alias (`lr`), or keys of this level it is close to, misspelt or in another case
  (`tower`, `BATCH_SIZE`) or cut short (`warmup` for `warmup_steps`): "Did you mean";
- the same key at other levels (`learning_rate` at the top): where it belongs;
- keys of other levels it is close to (`learning_rat`): "Did you mean" with their paths;
- else the keys this level takes.
A key whose value is an object is only matched with keys that take one, and the reverse:
`"checkpoint": 3` would be refused again.

Cheap by construction, since a request may hold thousands of unknown keys: difflib's
ratio costs the product of two lengths, so keys longer than `MAX_KEY_CHARS` are not
matched, and past `MAX_SUGGESTIONS` unknown keys in one error the rest get the plain
message (10,000 unknown keys of 1 KB took 17 s to match before these limits).
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

UNKNOWN = "Unknown key. Remove it or check its spelling."
CLOSE = 0.75  # how alike two keys must be to suggest one for the other (difflib's ratio)
MAX_KEY_CHARS = 64
MAX_SUGGESTIONS = 20
MAX_SHOWN = 4  # paths named in one suggestion
# What other libraries call a setting of the spec.
ALIASES = {"lr": "learning_rate", "max_to_keep": "keep"}


@dataclass(frozen=True)
class Known:
    """A key a spec takes: its path from the top, and whether its value is an object."""

    path: tuple[str, ...]
    is_object: bool


def model_of(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (`EvalSpec`; `EvalSpec | None`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(filter(None, map(model_of, typing.get_args(annotation))), None)


def _holds_object(annotation: Any) -> bool:
    if model_of(annotation) is not None:
        return True
    origin = typing.get_origin(annotation)
    return origin is dict or any(_holds_object(arg) for arg in typing.get_args(annotation))


def known_keys(
    model: type[BaseModel],
    nested: Mapping[tuple[str, ...], Sequence[type[BaseModel]]] | None = None,
    prefix: tuple[str, ...] = (),
) -> list[Known]:
    """Every key `model` takes, at every level. `nested`: the models whose keys a free-form
    object field takes (`model.params`: each built-in model's), by the field's path."""
    nested = nested or {}
    out: dict[tuple[str, ...], Known] = {}
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        out[path] = Known(path, _holds_object(field.annotation))
        inner = [m] if (m := model_of(field.annotation)) is not None else nested.get(path, ())
        for sub in inner:
            for known in known_keys(sub, nested, path):
                out.setdefault(known.path, known)
    return list(out.values())


def shown_path(path: Sequence[Any]) -> str:
    """A field path as errors show it: each key as it is, or quoted where it would
    mislead (a dot, blank or invisible characters, nothing at all) and cut when long."""
    return ".".join(_shown_key(part) for part in path)


def _shown_key(part: Any) -> str:
    if not isinstance(part, str):
        return str(part)  # a list index
    text = part if len(part) <= MAX_KEY_CHARS else part[:MAX_KEY_CHARS]
    plain = text and text.isprintable() and " " not in text and "." not in text
    shown = text if plain else repr(text)
    if len(part) > MAX_KEY_CHARS:
        shown += f"... ({len(part):,} characters)"
    return shown


def _named(path: tuple[str, ...]) -> str:
    return f"the top-level `{path[0]}`" if len(path) == 1 else f"`{'.'.join(path)}`"


def _level_name(path: tuple[str, ...]) -> str:
    return "the top level" if not path else f"`{'.'.join(path)}`"


def _either(items: Iterable[str], word: str = "or") -> str:
    items = list(items)
    return (
        f" {word} ".join(items) if len(items) < 3 else f"{', '.join(items[:-1])} {word} {items[-1]}"
    )


class UnknownKeys:
    """The messages for one validation's unknown keys. `known`: every key of the model
    validated (`known_keys`); `budget`: how many unknown keys get matched at all."""

    def __init__(self, known: Sequence[Known], budget: int = MAX_SUGGESTIONS) -> None:
        self.known = known
        self.budget = budget

    def message(self, loc: Sequence[Any], value: Any, level: Sequence[Known] | None = None) -> str:
        """What to say of the key at `loc`, given `value`. `level`: the keys its level
        takes, where they are not those `known` holds there (a built-in model's params)."""
        here, key = tuple(loc[:-1]), loc[-1]
        if level is None:
            level = [k for k in self.known if k.path[:-1] == here]
            if not level and not any(k.path == here and k.is_object for k in self.known) and here:
                return UNKNOWN  # a level no model describes (a custom model's params)
        if not level:
            return "Unknown key: nothing is taken here. Remove it."
        if self.budget <= 0:
            return UNKNOWN
        self.budget -= 1
        expected = f"{UNKNOWN} Expected one of: {', '.join(k.path[-1] for k in level)}."
        if not isinstance(key, str) or len(key) > MAX_KEY_CHARS:
            return expected
        return self._suggestion(here, key, value, level) or expected

    def _suggestion(
        self, here: tuple[str, ...], key: str, value: Any, level: Sequence[Known]
    ) -> str | None:
        if "." in key:
            parts = tuple(key.split("."))
            if any(k.path == (*here, *parts) for k in self.known):
                nesting = "".join(f'{{"{p}": ' for p in parts) + "..." + "}" * len(parts)
                return f"Unknown key: a key is one name, not a path. Nest it: `{nesting}`."
        fits = [k for k in level if value is None or k.is_object == isinstance(value, dict)]
        wanted = key.lower()
        alias = ALIASES.get(wanted)
        if near := [k for k in fits if k.path[-1] in (alias, key.lower())]:
            return f"Unknown key. Did you mean `{near[0].path[-1]}`?"  # an alias, or the case
        elsewhere = [
            k
            for k in self.known
            if k.path[:-1] != here and (value is None or k.is_object == isinstance(value, dict))
        ]
        # The same name at another level before a name like it here: `learning_rate`
        # under `optimizer.schedule` is `optimizer`'s, not a misspelt `end_learning_rate`.
        if same := [k for k in elsewhere if k.path[-1].lower() in (wanted, alias)]:
            name, levels = same[0].path[-1], [k.path[:-1] for k in same[:MAX_SHOWN]]
            if levels == [()]:
                return f"Unknown key here: `{name}` is a top-level key."
            places = _either((_level_name(level) for level in levels), "and")
            return f"Unknown key here: `{name}` is a key of {places}."
        if near := _closest(wanted, fits):
            return f"Unknown key. Did you mean {_either(f'`{k.path[-1]}`' for k in near)}?"
        if near := _closest(wanted, elsewhere, prefixes=False):
            return f"Unknown key here. Did you mean {_either(_named(k.path) for k in near)}?"
        return None


def _closest(wanted: str, keys: Sequence[Known], prefixes: bool = True) -> list[Known]:
    """The keys whose names are most like `wanted` (lower case), all of them on a tie; or,
    with none close enough, those it begins or that begin with it (4 letters at least)."""
    scored = []
    for known in keys:
        matcher = difflib.SequenceMatcher(None, wanted, known.path[-1].lower())
        # The quick bounds first: each is an upper bound of the ratio, and far cheaper.
        if (
            matcher.real_quick_ratio() >= CLOSE
            and matcher.quick_ratio() >= CLOSE
            and (score := matcher.ratio()) >= CLOSE
        ):
            scored.append((score, known))
    if scored:
        best = max(score for score, _ in scored)
        return [known for score, known in scored if score == best][:MAX_SHOWN]
    if not prefixes or len(wanted) < 4:
        return []
    return [
        known
        for known in keys
        if len(name := known.path[-1].lower()) >= 4
        and (name.startswith(wanted) or wanted.startswith(name))
    ][:MAX_SHOWN]
