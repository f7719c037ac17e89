"""`hybrid-serve serve` as a user runs it: a new local Ray, the demo model, the URL printed
once it answers, the API key from the environment, a clean exit 0 on SIGINT."""
import sys

import pytest
from e2e_helpers import serve_cli_round_trip

pytest.importorskip("openai")


@pytest.mark.slow
def test_cli_serve_demo_then_sigint(tmp_path):
    serve_cli_round_trip([sys.executable, "-m", "hybrid_serve.cli", "serve"], tmp_path / "stderr.log")
