"""The demo model's training text: the source of the running interpreter's standard library.

Every machine with Python has it, so training needs no download. The corpus is every UTF-8
``.py`` file under ``sysconfig.get_paths()["stdlib"]`` (its own tests included; third-party
``site-packages`` left out), in sorted path order. A file is held out of training, for
perplexity and for the demo's evaluation prompts, when the hash of its relative path falls in
one bucket of ``HELDOUT_BUCKETS``: the split depends on the path alone, so it is the same on
every machine, and a file new in another Python version lands on a side by the same rule.

    files = stdlib_files()                  # [(relative path, text)], sorted
    train, heldout = split(files)
    manifest(files)                         # Python version, paths, sizes and hashes

Tokenized once, the corpus can travel to a machine with another Python (``train.py --corpus``)::

    python -m hybrid_serve.demo.corpus OUT_DIR   # train_tokens.npy, heldout_tokens.npy (uint16), manifest.json
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import sysconfig
from pathlib import Path

HELDOUT_BUCKETS = 64  # one file in 64 (by path hash) is held out
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[tuple[str, str]]:
    """(path relative to the stdlib, text) of every UTF-8 ``.py`` file, sorted by path."""
    root = root or stdlib_dir()
    out = []
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root)
        if _SKIP_DIRS.intersection(rel.parts[:-1]) or not path.is_file():
            continue
        try:
            out.append((rel.as_posix(), path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):  # a few test files are deliberately not UTF-8
            continue
    return out


def is_heldout(rel_path: str) -> bool:
    return int(hashlib.sha256(rel_path.encode()).hexdigest(), 16) % HELDOUT_BUCKETS == 0


def split(files: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(training files, held-out files), each in the input's order."""
    return [f for f in files if not is_heldout(f[0])], [f for f in files if is_heldout(f[0])]


def manifest(files: list[tuple[str, str]], heldout: set[str] | None = None) -> dict:
    """What the corpus was: interpreter, stdlib path, and each file's size, content hash and
    side of the split (``heldout``: the held-out paths, by default ``is_heldout``'s);
    ``corpus_sha256`` hashes the whole list, so two runs on the same text compare by one string."""
    held = heldout if heldout is not None else {p for p, _ in files if is_heldout(p)}
    rows = [{"path": p, "bytes": len(t.encode()), "sha256": hashlib.sha256(t.encode()).hexdigest(),
             "heldout": p in held} for p, t in files]
    digest = hashlib.sha256("".join(f"{r['path']}\0{r['sha256']}\n" for r in rows).encode()).hexdigest()
    return {"python_version": sys.version, "implementation": platform.python_implementation(),
            "stdlib": str(stdlib_dir()), "num_files": len(rows),
            "num_heldout": sum(r["heldout"] for r in rows), "bytes": sum(r["bytes"] for r in rows),
            "corpus_sha256": digest, "heldout_rule": f"sha256(path) % {HELDOUT_BUCKETS} == 0", "files": rows}


def encode_files(tokenizer, files: list[tuple[str, str]], separator_id: int) -> list[int]:
    """One token stream: each file's tokens followed by ``separator_id`` (<|endoftext|>).
    ``tokenizer`` is a ``tokenizers.Tokenizer``."""
    ids: list[int] = []
    for enc in tokenizer.encode_batch([t for _, t in files], add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(separator_id)
    return ids


def heldout_prompts(n: int, seed: int = 0, max_chars: int = 600) -> list[str]:
    """``n`` prompts cut from the held-out files of the local stdlib: each starts at a random
    non-blank line and runs 2 to 12 lines (at most ``max_chars``), files taken in turn."""
    import random

    rng = random.Random(seed)
    files = [t.splitlines(keepends=True) for _, t in split(stdlib_files())[1]]
    files = [lines for lines in files if sum(1 for line in lines if line.strip()) >= 12]
    prompts = []
    while len(prompts) < n:
        lines = files[len(prompts) % len(files)]
        start = rng.choice([i for i, line in enumerate(lines[:-2]) if line.strip()])
        text = "".join(lines[start:start + rng.randint(2, 12)])[:max_chars]
        prompts.append(text)
    return prompts


def tokenize(tokenizer_path: str, separator_id: int = 0, max_files: int | None = None):
    """(training tokens, held-out tokens, manifest) of the running interpreter's stdlib (its
    first ``max_files`` files for a smoke run, the first of them held out if the rule holds out none)."""
    from tokenizers import Tokenizer

    files = stdlib_files()[:max_files]
    train, heldout = split(files)
    if not heldout:
        train, heldout = train[1:], train[:1]
    tokenizer = Tokenizer.from_file(tokenizer_path)
    return (encode_files(tokenizer, train, separator_id), encode_files(tokenizer, heldout, separator_id),
            manifest(files, {p for p, _ in heldout}))


def write_tokens(out_dir: str, tokenizer_path: str, separator_id: int = 0) -> dict:
    import numpy as np

    train, heldout, info = tokenize(tokenizer_path, separator_id)
    os.makedirs(out_dir, exist_ok=True)
    np.save(os.path.join(out_dir, "train_tokens.npy"), np.asarray(train, dtype=np.uint16))
    np.save(os.path.join(out_dir, "heldout_tokens.npy"), np.asarray(heldout, dtype=np.uint16))
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(info, f, indent=0)
    return info


def read_tokens(corpus_dir: str):
    """What ``write_tokens`` wrote: (training tokens, held-out tokens: int64 arrays, manifest)."""
    import numpy as np

    with open(os.path.join(corpus_dir, "manifest.json")) as f:
        info = json.load(f)
    return (np.load(os.path.join(corpus_dir, "train_tokens.npy")).astype(np.int64),
            np.load(os.path.join(corpus_dir, "heldout_tokens.npy")).astype(np.int64), info)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "corpus"
    info = write_tokens(out, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer.json"))
    print(f"{info['num_files']} files ({info['num_heldout']} held out), {info['bytes']:,} bytes, Python "
          f"{info['python_version'].split()[0]}: {out}")
