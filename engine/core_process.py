"""An engine process: the `EngineCore` of one replica in a child process of its own, driven
by the replica's front end (`AsyncLLMEngine`) over a socket pair.

    proc = EngineProcess(config, on_report, on_exit)   # returns once the engine is loaded
    proc.send(("add", request_id, prompt_token_ids, params)); proc.send(("abort", request_id))
    proc.stop(timeout_s)

Why a process: in the replica's process every torch op and kernel launch of a host-bound
step releases the GIL and must take it back, so the replica's event loop, Serve's and Ray's
work (hundreds of streams) stretch each engine step by about their own CPU time; measured on
a GPU through Serve, steps took 1.4-1.8x their offline time. Apart, the core's loop runs at
offline speed and the front end's work runs beside it on another core.

Protocol (pickled tuples, `multiprocessing.connection.Connection` framing):
  parent -> child: ("init", EngineConfig, tp_setup | None, torch_num_threads | None) once
                   (tp_setup: tp > 1, this process is rank 0; an object whose `join()` enters
                   the replica's group and returns the plan channel, and `leave(engine)`
                   stops the other ranks: actors/replica.Rank0Setup), then
                   commands ("add", ...), ("abort", id), ("stop",) and ("go",) (tp > 1: the
                   other ranks serve: rank 0 may send them its pools)
  child -> parent: ("shard_loaded",) (tp > 1), ("ready", max_model_len, vocab_size, first report) or
                   ("failed", traceback) once, then ("report", StepReport.to_wire()) per pass of
                   the core loop, and ("dead", traceback) if a step raised.
The child exits when its socket closes (the replica died) or after "stop"; the parent sees a
child that died (killed, out of memory, a crash in a kernel) as end of file and fails every
open request with EngineDeadError naming the exit code.

Run as `python -m hybrid_serve.engine.core_process FD` (spawned here, never by hand): a fresh
interpreter, so nothing of the parent (CUDA, Ray's threads) is inherited.

Diagnostics: with `HYBRID_SERVE_STEP_LOG=PATH` in the environment, the engine process appends
one line per pass of its loop to PATH: its pid, the monotonic time the pass ended, the deltas
and tokens it reported, and the load after it (running, waiting, waiting prompt tokens,
running prompt tokens still to compute). Consecutive times give the step's wall time.
"""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Callable

from .config import EngineConfig
from .engine_core import EngineCore, StepReport, run_core
from .validation import ModelLimits

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 1800.0  # loading a large checkpoint and warming up all kernel shapes


class EngineProcess:
    """The parent's handle of an engine process (the `AsyncLLMEngine` back end)."""

    def __init__(self, config: EngineConfig, on_report: Callable[[StepReport], None],
                 on_exit: Callable[[BaseException | None], None], tp_setup=None,
                 on_shard_loaded: Callable[[], None] | None = None, torch_num_threads: int | None = None,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.on_report, self.on_exit = on_report, on_exit
        self._send_lock = threading.Lock()
        self._closed = False
        parent_sock, child_sock = socket.socketpair()
        env = dict(os.environ)  # the child imports what this process imports (Ray's runtime_env paths too)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.proc = subprocess.Popen([sys.executable, "-m", "hybrid_serve.engine.core_process",
                                      str(child_sock.fileno())], pass_fds=[child_sock.fileno()], env=env)
        child_sock.close()
        self.conn = Connection(parent_sock.detach())
        try:
            self.conn.send(("init", config, tp_setup, torch_num_threads))
            self.limits = self._await_ready(on_shard_loaded, start_timeout_s)
        except BaseException:
            self._kill()
            raise
        self._reader = threading.Thread(target=self._read, name="hybrid-serve-engine-reports", daemon=True)
        self._reader.start()

    def _await_ready(self, on_shard_loaded, timeout_s: float) -> ModelLimits:
        while True:
            if not self.conn.poll(timeout_s):
                raise RuntimeError(f"the engine process did not start within {timeout_s:.0f} s")
            try:
                message = self.conn.recv()
            except EOFError:
                raise RuntimeError(f"the engine process exited while starting (exit code "
                                   f"{self.proc.wait(timeout=30)}); its log says why") from None
            if message[0] == "ready":
                self.first_report = StepReport.from_wire(message[3])  # the load and counters at the start
                return ModelLimits(max_model_len=message[1], vocab_size=message[2])
            if message[0] == "failed":
                raise RuntimeError(f"the engine process failed to start:\n{message[1]}")
            if message[0] == "shard_loaded":
                if on_shard_loaded is not None:
                    on_shard_loaded()
                self.conn.send(("go",))
            else:
                raise RuntimeError(f"unexpected message from the engine process: {message[0]!r}")

    def send(self, command: tuple) -> bool:
        """Send a command; False once the process no longer takes them."""
        with self._send_lock:
            if self._closed:
                return False
            try:
                self.conn.send(command)
                return True
            except (OSError, EOFError, ValueError):
                self._closed = True
                return False

    def _read(self) -> None:
        from .async_engine import EngineDeadError

        error: BaseException | None = None
        try:
            while True:
                message = self.conn.recv()
                if message[0] == "report":
                    self.on_report(StepReport.from_wire(message[1]))
                elif message[0] == "stopped":
                    break
                elif message[0] == "dead":
                    error = EngineDeadError(f"engine step failed:\n{message[1]}")
                    break
        except (EOFError, OSError):  # its end of the socket closed: it exited, or is exiting
            error = EngineDeadError(f"the engine process exited (exit code {self._exit_code()})")
        except BaseException as exc:  # noqa: BLE001 - a report the front end could not take
            logger.exception("engine process reports")
            error = exc
        with self._send_lock:
            self._closed = True
        self.on_exit(error)

    def _exit_code(self, wait_s: float = 5.0) -> int | str:
        try:
            return self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:  # closed its socket but still running: of no use, and holds the GPU
            self.proc.kill()
            return f"none: it closed its socket, did not exit within {wait_s:.0f} s and was killed"

    def alive(self) -> bool:
        return self._reader.is_alive() and self.proc.poll() is None

    def stop(self, timeout_s: float) -> None:
        """Ask the engine to stop (open requests end with a final "abort" delta), then wait
        for the process; kill it if it does not exit in time."""
        self.send(("stop",))
        self._reader.join(timeout_s)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("engine process %d did not exit within %.0f s; killing it", self.proc.pid, timeout_s)
            self._kill()

    def _kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.conn.close()


# ----- the child ------------------------------------------------------------------------------
def _start_engine(conn: Connection, config: EngineConfig, tp_setup, torch_num_threads: int | None):
    import torch

    from .engine import LLMEngine
    from .tokenizer import load_tokenizer

    if torch_num_threads:
        torch.set_num_threads(torch_num_threads)
    channel = on_shard_loaded = None
    if tp_setup is not None:
        channel = tp_setup.join()

        def handshake() -> None:
            """The parent starts the other ranks' serve loops once every shard is loaded."""
            conn.send(("shard_loaded",))
            reply = conn.recv()
            if reply[0] != "go":
                raise RuntimeError(f"expected 'go' from the replica, got {reply[0]!r}")
        on_shard_loaded = handshake
    return LLMEngine(config, load_tokenizer(config.tokenizer or config.model), channel, on_shard_loaded)


def _exit_with_parent(period_s: float = 1.0) -> None:
    """A daemon thread that ends this process once its parent (the replica) is gone, even while
    the main thread is stuck in a step (a collective waiting for a dead rank), so a killed
    replica never leaves an engine holding the GPU."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(period_s)
            if os.getppid() != parent:
                os._exit(1)
    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _open_step_log():
    """The file `HYBRID_SERVE_STEP_LOG` names, opened to append a line per pass (None if unset,
    or if it cannot be opened: a warning naming it, and the engine serves without the log)."""
    path = os.environ.get("HYBRID_SERVE_STEP_LOG")
    if not path:
        return None
    try:
        return open(path, "a", buffering=1)  # line-buffered: a killed process loses nothing
    except OSError as exc:
        logger.warning("HYBRID_SERVE_STEP_LOG=%r cannot be opened (%s): no step log", path, exc)
        return None


def _log_pass(log, report: StepReport) -> None:
    tokens = sum(len(s.token_ids) for d in report.deltas for s in d.seqs)
    v = report.view
    load = (f"{v.num_running} {v.num_waiting} {v.num_waiting_tokens} {v.num_running_prefill_tokens}"
            if v is not None else "- - - -")
    log.write(f"{os.getpid()} {report.time:.6f} {len(report.deltas)} {tokens} {load}\n")


def child_main(fd: int) -> int:
    _exit_with_parent()
    conn = Connection(fd)
    try:
        kind, config, tp_setup, threads = conn.recv()
        assert kind == "init", kind
        engine = _start_engine(conn, config, tp_setup, threads)
        core = EngineCore(engine)
        conn.send(("ready", engine.limits.max_model_len, engine.limits.vocab_size, core.take_report().to_wire()))
    except EOFError:
        return 1  # the replica went away while this one started
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("failed", traceback.format_exc()))
        return 1

    def next_commands(block: bool) -> list[tuple]:
        commands = []
        try:
            while block or conn.poll():
                commands.append(conn.recv())
                block = False
        except (EOFError, OSError):  # the replica died: stop
            commands.append(("stop",))
        return commands

    step_log = _open_step_log()

    def emit(report: StepReport) -> None:
        if step_log is not None:  # before the send: once a stream has its tokens, their line is in the log
            _log_pass(step_log, report)
        conn.send(("report", report.to_wire()))

    code = 0
    try:
        run_core(core, next_commands, emit)
        conn.send(("stopped",))
    except (EOFError, OSError, BrokenPipeError):
        code = 1
    except BaseException:  # noqa: BLE001 - a failed step: the parent fails the open requests
        logger.exception("engine step failed")
        code = 1
        try:
            conn.send(("dead", traceback.format_exc()))
        except OSError:
            pass
    finally:
        if step_log is not None:
            step_log.close()
        if tp_setup is not None:
            tp_setup.leave(engine)
    return code


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s engine-process %(levelname)s %(name)s: %(message)s")
    sys.exit(child_main(int(sys.argv[1])))
