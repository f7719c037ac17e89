"""Diagnostics: where a request's time goes between the serving path's processes.

With `HYBRID_SERVE_HOP_LOG=PREFIX` in the environment of the Ray workers (set before
`ray start`, or in the job's runtime env), each process of the path appends a line per
request event to `PREFIX.<pid>`:

    <CLOCK_MONOTONIC seconds> <hop> <event> <request id>

    hop "ingress": in (the request parsed and checked, before its call to a replica), started
                   (a replica took it), first (its first tokens reached the ingress), last (its
                   final tokens did, and its last chunk goes out)
    hop "replica": in (LLMServer.generate called), first (the engine's first tokens), last (the
                   finished delta handed to Serve, or to the delta channel)

CLOCK_MONOTONIC is one clock for every process of a machine, so the files join with the
client's own marks (`benchmarks/serve_bench.py --hop-log PREFIX` writes `PREFIX.client`: send,
first, last) and the engine's step log (HYBRID_SERVE_STEP_LOG) on one timeline;
`benchmarks/hop_report.py PREFIX` prints each hop's latency at the start and the end of a
request. A request id is the ingress's (`cmpl-...`, the response's `id`); a replica's is the
ingress's with the prompt's index (`cmpl-...-0`; a retry's `cmpl-...-0.2`), which the report
strips. Unset: one branch per event.
"""
from __future__ import annotations

import logging
import os
import time

logger = logging.getLogger(__name__)

ENV = "HYBRID_SERVE_HOP_LOG"

_UNREAD = object()  # the environment not read yet in this process
_file = _UNREAD


def _open():
    global _file
    _file = None
    prefix = os.environ.get(ENV)
    if prefix:
        path = f"{prefix}.{os.getpid()}"
        try:
            _file = open(path, "a", buffering=1)  # line-buffered: a killed replica loses nothing
        except OSError as exc:
            logger.warning("%s=%r: cannot open %s (%s): no hop log", ENV, prefix, path, exc)
    return _file


def reset() -> None:
    """Closes this process's log; the next mark reads the environment again."""
    global _file
    if _file is not None and _file is not _UNREAD:
        _file.close()
    _file = _UNREAD


def mark(hop: str, event: str, request_id: str) -> None:
    """Appends `event` of `request_id` at `hop` with the time now (no-op unless the
    environment names a log)."""
    f = _open() if _file is _UNREAD else _file
    if f is not None:
        f.write(f"{time.monotonic():.6f} {hop} {event} {request_id}\n")


def read(paths) -> list[tuple[float, str, str, str]]:
    """(time, hop, event, request id) of every line of `paths`, replica ids as the ingress's."""
    rows = []
    for path in paths:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) != 4:
                    continue  # a line cut by a killed process
                t, hop, event, rid = parts
                if hop == "replica":
                    rid = rid.rsplit("-", 1)[0]
                rows.append((float(t), hop, event, rid))
    return rows
