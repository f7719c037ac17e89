"""Start or join Ray for the CLI, with one paragraph naming the fix when Ray refuses.

    connect_ray(address, num_cpus=None)     # raises RayConnectError(message) in seconds

Three refusals are recognised (`explain` maps Ray's exceptions to the messages):

- token authentication: the cluster runs with RAY_AUTH_MODE=token and this process has no
  token, or another one, or does not have token mode on;
- a Ray or Python version that differs from the cluster's;
- no Ray cluster at the address (wrong host or port, nothing listening, a firewall).

Quickly: an explicit HOST:PORT is probed over TCP first (PROBE_TIMEOUT_S), and `ray.init`'s
GCS connect loop (about 1 s a try, 20 tries by default) is cut to CONNECT_TRIES unless
RAY_gcs_server_port_wait_time_s is set already.
"""
from __future__ import annotations

import os
import re
import socket

CONNECT_TRIES_ENV = "RAY_gcs_server_port_wait_time_s"  # Ray's own knob: GCS connect attempts, ~1 s each
CONNECT_TRIES = 5
PROBE_TIMEOUT_S = 3.0
_NEW_LOCAL = "local"


class RayConnectError(Exception):
    """Ray refused the connection; the message says what to do."""


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of `HOST:PORT` or `ray://HOST:PORT`; None for 'auto', 'local' and the like."""
    match = re.fullmatch(r"(?:ray://)?\[?([^\[\]]+?)\]?:(\d+)", address.strip())
    return (match.group(1), int(match.group(2))) if match else None


def no_cluster_message(address: str | None, detail: str = "") -> str:
    where = f"at {address}" if address not in (None, "auto") else "on this machine"
    port = (_host_port(address) or (None, 6379))[1] if address else 6379
    return (f"no Ray cluster {where}{f' ({detail})' if detail else ''}: start one there with "
            f"`ray start --head --port={port}`, check the host, port and firewall, or pass --address local "
            f"for a new Ray on this machine.")


def _auth_message(address: str | None) -> str:
    where = f" at {address}" if address not in (None, "auto") else ""
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        fix = ("run with RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN or in ~/.ray/auth_token "
               "(or a file named by RAY_AUTH_TOKEN_PATH)")
    else:
        fix = ("set RAY_AUTH_TOKEN or put the cluster's token in ~/.ray/auth_token (or a file named by "
               "RAY_AUTH_TOKEN_PATH); this process's token is missing or not the cluster's")
    return (f"the Ray cluster{where} refused the connection: it requires token authentication. To join it, "
            f"{fix}. `ray get-auth-token` on the head node prints the token.")


def _version_message(address: str | None, text: str) -> str:
    import platform

    import ray

    cluster = re.search(r"cluster was started with:\s*Ray:\s*(\S+)\s*Python:\s*(\S+)", text)
    ray_v, py_v = cluster.groups() if cluster else ("(the cluster's)", "(the cluster's)")
    where = f" at {address}" if address not in (None, "auto") else ""
    return (f"the Ray cluster{where} runs Ray {ray_v} on Python {py_v}, this machine "
            f"Ray {ray.__version__} on Python {platform.python_version()}: install ray[serve]=={ray_v} under "
            f"Python {py_v} here (pip install 'ray[serve]=={ray_v}'), or run hybrid-serve on a node of the cluster.")


def explain(exc: BaseException, address: str | None) -> str | None:
    """The message for a refusal `ray.init` raised, or None if `exc` is not one of the three."""
    from ray.exceptions import AuthenticationError

    chain = _chain(exc)
    text = "\n".join(f"{type(e).__name__}: {e}" for e in chain)
    if any(isinstance(e, AuthenticationError) for e in chain) or "InvalidAuthToken" in text \
            or "Unauthenticated" in text:
        return _auth_message(address)
    if "Version mismatch" in text:
        return _version_message(address, text)
    if any(isinstance(e, ConnectionError) for e in chain) or "Failed to connect to GCS" in text:
        return no_cluster_message(address)
    return None


def probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """A message if nothing accepts TCP connections at HOST:PORT within `timeout_s`, else None."""
    host_port = _host_port(address)
    if host_port is None:
        return None
    try:
        with socket.create_connection(host_port, timeout=timeout_s):
            return None
    except OSError as exc:
        return no_cluster_message(address, exc.strerror or str(exc) or type(exc).__name__)


def connect_ray(address: str | None, num_cpus: float | None = None) -> None:
    """`ray.init` for `address` (None: $RAY_ADDRESS, else the cluster `ray start` started here,
    else a new local Ray; 'auto'; 'local'; HOST:PORT), or RayConnectError with the fix."""
    import ray

    target = address if address is not None else os.environ.get("RAY_ADDRESS")
    joining = target not in (None, _NEW_LOCAL)
    if joining and (message := probe(target)):
        raise RayConnectError(message)
    kwargs = {"address": address}
    if address is None and num_cpus is not None:
        kwargs["num_cpus"] = num_cpus
    shorten = joining and CONNECT_TRIES_ENV not in os.environ
    if shorten:
        os.environ[CONNECT_TRIES_ENV] = str(CONNECT_TRIES)
    try:
        ray.init(**kwargs)
    except Exception as exc:  # noqa: BLE001 - mapped to a message, or raised as it was
        message = explain(exc, target)
        if message is None:
            raise
        raise RayConnectError(message) from exc
    finally:
        if shorten:
            os.environ.pop(CONNECT_TRIES_ENV, None)
