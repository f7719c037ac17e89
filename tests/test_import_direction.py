"""Imports point one way (shared/DESIGN.md, "Layout"): every module of a room imports only
the rooms its row allows (and what those allow in turn), module-level and function-level
imports alike; importing the kernels loads nothing else of ours; the HTTP ingress loads no
torch."""
from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

PKG = "hybrid_serve"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# room -> rooms it may import directly (DESIGN.md's table; ground-floor utilities added):
# device_io (host<->device copies), metrics (the Prometheus definitions) and demo (the demo
# model's directory) are leaves that import nothing of ours.
MAY_IMPORT = {
    "kernels": set(),
    "distributed": set(),
    "device_io": set(),
    "metrics": set(),
    "demo": set(),
    "dashboards": set(),
    "mem_cache": {"kernels", "device_io"},
    "models": {"kernels", "distributed", "mem_cache", "device_io"},
    "engine": {"models", "mem_cache", "kernels", "distributed", "device_io", "metrics"},
    "routing": set(),
    "cluster": {"distributed"},
    "actors": {"engine", "routing", "cluster"},
    "deploy": {"actors", "engine", "routing", "cluster", "metrics", "demo"},
    "llm": {"engine", "actors", "demo"},
    "cli": {"deploy", "llm", "engine"},
}


def _closure(room: str) -> set[str]:
    seen, todo = set(), [room]
    while todo:
        for dep in MAY_IMPORT[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def _modules():
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel = os.path.relpath(dirpath, ROOT)
        top = rel.split(os.sep)[0]
        if top in ("tests", "benchmarks", "build") or top.startswith(".") and top != "." or "egg-info" in rel:
            dirnames[:] = []
            continue
        for name in filenames:
            if name.endswith(".py") and not (rel == "." and name == "setup.py"):  # the build's, not shipped
                parts = [] if rel == "." else rel.split(os.sep)
                module = ".".join([PKG, *parts] + ([] if name == "__init__.py" else [name[:-3]]))
                yield module, os.path.join(dirpath, name), name == "__init__.py"


def _imported(module: str, path: str, is_package: bool) -> set[str]:
    """Absolute names of the hybrid_serve modules `path` imports, wherever the import stands."""
    package = module if is_package else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith(PKG)}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.startswith(PKG):
                out |= {name} | {f"{name}.{a.name}" for a in node.names}
    return out


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_room_is_in_the_table():
    rooms = {_room(m) for m, _, _ in _modules()} - {None}
    assert rooms <= set(MAY_IMPORT), sorted(rooms - set(MAY_IMPORT))


def test_imports_point_one_way():
    wrong = []
    for module, path, is_package in _modules():
        room = _room(module)
        if room is None:
            continue
        allowed = _closure(room) | {room}
        for target in _imported(module, path, is_package):
            target_room = _room(target)
            if target_room is not None and target_room in MAY_IMPORT and target_room not in allowed:
                wrong.append(f"{module} imports {target}")
    assert not wrong, "\n".join(wrong)


def _loaded_after(statement: str) -> list[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return out.stdout.split()


def test_kernels_load_nothing_else_of_ours():
    ours = [m for m in _loaded_after("import hybrid_serve.kernels") if m.startswith(f"{PKG}.")]
    assert all(m.startswith(f"{PKG}.kernels") for m in ours), ours


@pytest.mark.parametrize("statement", [
    "import hybrid_serve.deploy.ingress",
    "from hybrid_serve import SamplingParams",
    "from hybrid_serve.engine import EngineConfig, SamplingParams, validate_prompt",
    "from hybrid_serve.engine.tokenizer import load_tokenizer; from hybrid_serve.demo import DEMO_DIR; "
    "load_tokenizer(DEMO_DIR).apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=False)",
])
def test_the_ingress_side_loads_no_torch(statement):
    loaded = _loaded_after(statement)
    assert "torch" not in loaded and "triton" not in loaded


def test_the_engine_side_loads_no_dynamo():
    """A Ray shard, an engine process and the CLI import the engine, actors and deploy rooms
    at start; torch._dynamo (loaded by torch.nn.attention.bias, for one) adds ~1.8 s to each
    process's start-up, so it stays out until a code path needs it."""
    loaded = _loaded_after("import hybrid_serve.actors.shard_worker, hybrid_serve.engine.engine, "
                           "hybrid_serve.engine.core_process, hybrid_serve.deploy.app, hybrid_serve.cli")
    assert "torch" in loaded and "torch._dynamo" not in loaded
