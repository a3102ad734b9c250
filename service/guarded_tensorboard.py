"""TensorBoard's own `main`, answering only requests that carry the service's secret.

Run as `python -m service.guarded_tensorboard <tensorboard flags>` with the secret in
`TOWERBOARD_TB_SECRET`: the process the service starts for its TensorBoard
(`service.tensorboard`). The service imports this module for its two names only;
TensorBoard (and with it TensorFlow, where installed) is imported in `main`, which runs
in TensorBoard's process alone.

Why: TensorBoard listens on a loopback port, which every user of the host can reach. The
service's token and the proxy's refusals (the profile plugin's capture from an address,
its folder parameters, query values that leave the logdir) guard only requests that pass
through the proxy, so a local user could go round all of them by asking the port itself.
The proxy adds the secret as a header (`SECRET_HEADER`) to each request it forwards, and
TensorBoard refuses any request without it (403). The secret is random per start and
reaches TensorBoard in its environment, which only its own user can read
(`/proc/<pid>/environ`), never in its argv, which every user can.
"""

from __future__ import annotations

import hmac
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

# The header the proxy sends the secret in, and the environment variable TensorBoard
# reads it from.
SECRET_HEADER = "X-Towerboard-Secret"
SECRET_ENV = "TOWERBOARD_TB_SECRET"

_REFUSAL = b"Forbidden: this TensorBoard answers through the Towerboard service only.\n"

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def guarded(app: WsgiApp, secret: str) -> WsgiApp:
    """`app`, answering 403 to a request whose `SECRET_HEADER` is not `secret`."""
    expected = secret.encode()
    key = "HTTP_" + SECRET_HEADER.upper().replace("-", "_")

    def guarded_app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        # Compared in constant time: a timing difference would spell the secret out.
        if not hmac.compare_digest(environ.get(key, "").encode(), expected):
            start_response(
                "403 Forbidden",
                [("Content-Type", "text/plain"), ("Content-Length", str(len(_REFUSAL)))],
            )
            return [_REFUSAL]
        return app(environ, start_response)

    return guarded_app


def main() -> None:
    """TensorBoard's `tensorboard.main.run_main`, with the guarded app in its server."""
    # Taken out of the environment, so nothing TensorBoard starts inherits it.
    secret = os.environ.pop(SECRET_ENV, "")
    if not secret:
        sys.exit(f"{SECRET_ENV} is not set: this TensorBoard would answer anyone on the host.")
    from absl import app
    from tensorboard import default, main_lib, program
    from tensorboard.plugins import base_plugin

    def server(wsgi_app: WsgiApp, flags: Any) -> Any:  # noqa: ANN401 - TensorBoard's types
        return program.create_port_scanning_werkzeug_server(guarded(wsgi_app, secret), flags)

    main_lib.global_init()
    board = program.TensorBoard(plugins=default.get_plugins(), server_class=server)
    try:
        app.run(board.main, flags_parser=board.configure)
    except base_plugin.FlagsError as e:
        sys.exit(f"Error: {e}")


if __name__ == "__main__":
    main()
