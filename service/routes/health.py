"""/healthz (liveness, never behind auth) and /metrics (Prometheus text format)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from service.deps import RuntimeDep
from service.schemas import HealthPublic
from service.store import JobState

router = APIRouter(tags=["health"])


# HEAD too: uptime monitors and load balancers often probe with it. Two routes, not one
# of two methods, so each has its own OpenAPI operation id.
@router.head("/healthz", response_model=HealthPublic)
@router.get("/healthz", response_model=HealthPublic)
async def read_health() -> HealthPublic:
    """200 while the service answers (GET or HEAD)."""
    return HealthPublic(status="ok")


def _gauge(name: str, help: str, samples: list[tuple[str, float]], kind: str = "gauge") -> str:
    lines = [f"# HELP {name} {help}", f"# TYPE {name} {kind}"]
    lines += [f"{name}{labels} {value:g}" for labels, value in samples]
    return "\n".join(lines) + "\n"


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {}}}},
)
async def read_prometheus_metrics(runtime: RuntimeDep) -> PlainTextResponse:
    """Jobs by state, queue length, busy devices and open event streams, for Prometheus
    to scrape."""
    counts = runtime.store.count_by_state()
    busy = sum(len(job.devices) for job in runtime.store.running())
    text = "".join(
        [
            _gauge(
                "towerboard_jobs",
                "Jobs in the store by state.",
                [(f'{{state="{state.value}"}}', counts[state]) for state in JobState],
            ),
            _gauge(
                "towerboard_queue_length", "Jobs waiting to run.", [("", counts[JobState.QUEUED])]
            ),
            _gauge("towerboard_devices_busy", "Devices held by running jobs.", [("", busy)]),
            _gauge(
                "towerboard_devices_total",
                "Devices the service gives to jobs.",
                [("", len(runtime.pool.devices))],
            ),
            _gauge(
                "towerboard_tensorboard_up",
                "1 while the service's TensorBoard runs.",
                [("", int(runtime.launcher.instance is not None))],
            ),
            _gauge(
                "towerboard_event_streams",
                "Server-Sent-Events streams open (dashboards, job pages, watching clients).",
                [("", runtime.broker.listening)],
            ),
            _gauge(
                "towerboard_event_streams_lagged_total",
                "Event streams ended for falling too far behind (their clients reconnect).",
                [("", runtime.broker.lagged_total)],
                kind="counter",
            ),
        ]
    )
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")
