"""Ray refusing a connection ends `hybrid-serve serve` with exit code 2 and one paragraph
naming the fix, in seconds: token authentication, a version mismatch, no cluster at the
address (Ray's real exception classes, mapped by `deploy/ray_connect.explain`)."""
from __future__ import annotations

import time

import pytest

from hybrid_serve.deploy.ray_connect import _host_port, explain, no_cluster_message, probe


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _raised_by_ray_init(inner: BaseException) -> ConnectionError:
    """What `ray.init` raises when the GCS connect loop gives up: ConnectionError from
    RuntimeError("Failed to connect to GCS ... Last connection error: <traceback>")."""
    try:
        try:
            raise RuntimeError(f"Failed to connect to GCS. Last connection error: {type(inner).__name__}: {inner}")
        except RuntimeError as exc:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from exc
    except ConnectionError as exc:
        return exc


@pytest.mark.parametrize("mode", ["token", None])
def test_auth_refusal_names_the_token(mode, monkeypatch):
    from ray.exceptions import AuthenticationError

    if mode:
        monkeypatch.setenv("RAY_AUTH_MODE", mode)
    else:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    for exc in (AuthenticationError("RPC error: InvalidAuthToken: Authentication token is missing or incorrect"),
                _raised_by_ray_init(AuthenticationError("RPC error: InvalidAuthToken: token is missing"))):
        message = explain(exc, "10.0.0.1:6379")
        assert "10.0.0.1:6379" in message and "RAY_AUTH_TOKEN" in message and "~/.ray/auth_token" in message
        assert ("RAY_AUTH_MODE=token" in message) == (mode is None)


def test_version_mismatch_names_the_version_to_install():
    import ray._private.utils as ray_utils

    with pytest.raises(RuntimeError) as info:  # Ray's own check, as ray.init runs it
        ray_utils.check_version_info({"ray_version": "2.9.3", "python_version": "3.10.12"}, "this-host")
    message = explain(info.value, "10.0.0.1:6379")
    assert "ray[serve]==2.9.3" in message and "3.10.12" in message and "10.0.0.1:6379" in message


def test_no_cluster_names_ray_start():
    message = explain(_raised_by_ray_init(OSError("Timed out while waiting for GCS")), "10.0.0.1:6380")
    assert message == no_cluster_message("10.0.0.1:6380")
    assert "ray start --head --port=6380" in message and "--address local" in message
    assert explain(ValueError("something else"), "x:1") is None


def test_probe_and_addresses():
    port = _free_port()
    assert f"no Ray cluster at 127.0.0.1:{port}" in probe(f"127.0.0.1:{port}")
    assert _host_port("ray://head:10001") == ("head", 10001) and _host_port("[::1]:6379") == ("::1", 6379)
    assert _host_port("auto") is None and probe("auto") is None


def test_serve_with_a_wrong_address_exits_2_fast(capsys):
    from hybrid_serve.cli import main

    port = _free_port()
    start = time.monotonic()
    assert main(["serve", "--address", f"127.0.0.1:{port}"]) == 2
    assert time.monotonic() - start < 30
    err = capsys.readouterr().err
    assert f"error: no Ray cluster at 127.0.0.1:{port}" in err and "ray start --head" in err
    import ray

    assert not ray.is_initialized()
