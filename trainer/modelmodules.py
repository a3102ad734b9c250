"""Which modules a job's custom model (`module:function`) may come from, on a service that
says (`TOWERBOARD_MODEL_MODULES`). No TensorFlow: the service checks with it at submit, the
worker again before it imports anything.

A custom model is code the worker runs as the service's user. Unrestricted, a job may
name any function the worker can import with the keyword arguments of its choice:
`keras.saving:deserialize_keras_object` with `safe_mode: false` runs a shell command;
`logging:basicConfig` with `filename` truncates a file. Whoever holds the service's token
can do that unless the operator lists the modules jobs may use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from trainer.spec import shown_value

ENV = "TOWERBOARD_MODEL_MODULES"


def parse(value: str) -> tuple[str, ...]:
    """'a, b.c,,' -> ('a', 'b.c'); an empty string allows none."""
    return tuple(part.strip() for part in value.split(",") if part.strip())


def from_environ(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    """The modules a worker may take a custom model from: None (any) when the variable is
    not set, as for a job run by hand (`python -m trainer run`), whose code is its own."""
    value = environ.get(ENV)
    return None if value is None else parse(value)


def refusal(model_name: str, allowed: Sequence[str] | None) -> str | None:
    """Why a custom model `module:function` may not be used here, or None when it may: its
    module must be one of `allowed` or inside one (`allowed` 'models' takes 'models.cnn')."""
    if allowed is None:
        return None
    module = model_name.partition(":")[0]
    if any(module == top or module.startswith(top + ".") for top in allowed):
        return None
    listed = ", ".join(repr(top) for top in allowed)
    return (
        f"Expected a custom model from a module this service allows ({ENV}: "
        f"{listed or 'none'}). Received: {shown_value(model_name)}. Code in a custom model runs as the "
        f"service's user, so the service's operator lists the modules jobs may use"
    )
