"""Cluster-wide metrics: every Serve replica pushes its `metrics.snapshot()` to one small
actor per application; the ingress renders them all for `GET /metrics`.

    LLMServer replica ─┐ push every metrics_push_interval_s
    LLMServer replica ─┼─▶ MetricsHub ("hybrid_serve_metrics:<app>") ◀─ ingress /metrics
    ingress replica  ──┘

Snapshots not refreshed within `ttl_s` (a replica gone) are dropped. An ingress that cannot
reach the hub for a scrape serves the last collection it got, up to the same `ttl_s`
(`HubReader`), not its own metrics alone: a scrape without the engine replicas' series
would end them in Prometheus (a staleness marker) and blank every gauge panel until the
next. The hub is a
detached, zero-CPU named actor so that any replica can find it and it survives replica
restarts; `serve shutdown` leaves it (it is tiny), `ray stop` ends it.
"""
from __future__ import annotations

import asyncio
import logging
import time

import ray

from .. import metrics

logger = logging.getLogger(__name__)

NAMESPACE = "hybrid_serve"
SNAPSHOT_TTL_S = 30.0  # a snapshot not refreshed for this long is from a process gone


@ray.remote(num_cpus=0, max_restarts=-1)
class MetricsHub:
    def __init__(self, ttl_s: float = SNAPSHOT_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._snapshots: dict[str, tuple[float, list]] = {}

    def push(self, source: str, families: list) -> None:
        self._snapshots[source] = (time.monotonic(), families)

    def drop(self, source: str) -> None:
        self._snapshots.pop(source, None)

    def collect(self, exclude: str | None = None) -> list[list]:
        now = time.monotonic()
        for source in [s for s, (t, _) in self._snapshots.items() if now - t > self.ttl_s]:
            del self._snapshots[source]
        return [fams for source, (_, fams) in sorted(self._snapshots.items()) if source != exclude]


def get_hub(app_name: str):
    return MetricsHub.options(name=f"hybrid_serve_metrics:{app_name}", namespace=NAMESPACE,
                              lifetime="detached", get_if_exists=True).remote()


class HubReader:
    """The other processes' snapshots for one ingress's `GET /metrics`: the hub's collection,
    or, when the hub does not answer within `timeout_s`, the last one it gave, while younger
    than `ttl_s` (the hub's own ttl, so nothing older than the hub would keep is shown).
    `timeout_s` stays well under the scrape timeout (5 s in dashboards/prometheus.yml): a
    fallback answered after Prometheus gave up on the scrape would help nobody."""

    def __init__(self, hub, source: str, timeout_s: float = 2.0, ttl_s: float = SNAPSHOT_TTL_S) -> None:
        self.hub, self.source, self.timeout_s, self.ttl_s = hub, source, timeout_s, ttl_s
        self._last: tuple[float, list[list]] | None = None  # (monotonic time, collection)

    async def collect(self) -> list[list]:
        try:
            others = await asyncio.wait_for(self.hub.collect.remote(exclude=self.source), timeout=self.timeout_s)
        except Exception:  # noqa: BLE001 - a scrape still answers, with what we last had
            last = self._last
            fresh = last is not None and time.monotonic() - last[0] <= self.ttl_s
            logger.warning("metrics hub unreachable; serving %s", "its last collection" if fresh else
                           "this process's metrics only", exc_info=True)
            return last[1] if fresh else []
        self._last = (time.monotonic(), others)
        return others


class MetricsPusher:
    """Pushes this process's snapshot to the hub every `interval_s` from an asyncio task."""

    def __init__(self, hub, source: str, interval_s: float) -> None:
        self.hub, self.source, self.interval_s = hub, source, interval_s
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def push_now(self) -> None:
        await self.hub.push.remote(self.source, metrics.snapshot())

    async def _loop(self) -> None:
        while True:
            try:
                await self.push_now()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - metrics must never take the replica down
                logger.warning("pushing metrics to the hub failed", exc_info=True)
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        try:
            await self.hub.drop.remote(self.source)
        except Exception:  # noqa: BLE001
            pass
