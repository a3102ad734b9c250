"""The service's HTTP client to its own TensorBoard, made on first use.

Only the TensorBoard launcher (its readiness probes) and the proxy talk to TensorBoard, and
a service may never open it. Importing httpx costs about 0.1 s here, an eighth of the
service's start to its first answer, so it is imported when TensorBoard is first asked
for, not at start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

# Long reads: the proxy streams TensorBoard's answers, some of them large (traces).
_READ_SECONDS = 300.0
_CONNECT_SECONDS = 5.0


class Upstream:
    """One `httpx.AsyncClient` for the service's life, made when first asked for."""

    def __init__(self) -> None:
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            import httpx

            # No pooled keep-alive limit worth having: TensorBoard is one local upstream.
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(_READ_SECONDS, connect=_CONNECT_SECONDS)
            )
        return self._client

    @property
    def errors(self) -> tuple[type[Exception], ...]:
        """What a request to TensorBoard raises when it fails: httpx's errors."""
        import httpx  # already imported by `client` whenever a request was made

        return (httpx.HTTPError,)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
