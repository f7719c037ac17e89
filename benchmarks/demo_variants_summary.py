"""The summary of benchmarks/device_train_demo_variants.sh (issue 16): every variant's training
log, demo text (demo/quality.py) and bf16 screen (bf16_agreement_trained_demo.py --ours-only)
gathered into one JSON, and the variants ranked for the trip back: a candidate whose demo text
fails ranks below every one whose text passes (a checkpoint that agrees in bf16 but writes noise
is no demo), then by its agreement on the 64 acceptance prompts, then on all screened prompts.

    python benchmarks/demo_variants_summary.py WORK_DIR OUT_DIR NAME [NAME ...]

reads WORK_DIR/NAME/train_log.json, WORK_DIR/text_NAME.json and WORK_DIR/agree_NAME.json (each
may be missing: a run that failed, or SCREEN=0), and the shipped demo's screen as ``shipped``;
writes OUT_DIR/variants.json and WORK_DIR/best (the two best names).
"""
from __future__ import annotations

import json
import os
import sys

PAIR = "ours bf16 vs ours fp32 ref"
UNSCREENED = -1.0


def _load(path: str):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def gather(work_dir: str, names: list[str]) -> dict[str, dict]:
    """Each name's (and ``shipped``'s) entry: ``train``, ``demo_text``, ``screen``, where present."""
    summary = {}
    for name in [*names, "shipped"]:
        entry = {}
        for key, path in (("train", os.path.join(work_dir, name, "train_log.json")),
                          ("demo_text", os.path.join(work_dir, f"text_{name}.json")),
                          ("screen", os.path.join(work_dir, f"agree_{name}.json"))):
            loaded = _load(path)
            if loaded is not None:
                entry[key] = loaded
        summary[name] = entry
    return summary


def score(entry: dict) -> tuple[int, float, float]:
    """(demo text ok, agreement on the first 64 prompts, on all screened prompts); an unscreened
    entry (SCREEN=0, or its screen failed) ranks by its text alone. A screen of 64 prompts (the
    issue's own check, SCREEN_ARGS="--fp32-triton --bf16-ref") has no subset rows: its rows are
    the acceptance set."""
    text_ok = int(bool(entry.get("demo_text", {}).get("ok", False)))
    screen = entry.get("screen")
    if not screen:
        return (text_ok, UNSCREENED, UNSCREENED)
    first64 = screen.get("rows_first_64_prompts") or screen["rows"]
    return (text_ok, first64[PAIR]["prompts_first16_agree"], screen["rows"][PAIR]["prompts_first16_agree"])


def rank(summary: dict[str, dict], names: list[str]) -> list[str]:
    """``names`` best first (a stable sort: equal scores keep their order)."""
    return sorted(names, key=lambda n: score(summary[n]), reverse=True)


def main(argv: list[str]) -> list[str]:
    work_dir, out_dir, names = argv[0], argv[1], argv[2:]
    if not names:
        raise ValueError("no variant names given: demo_variants_summary.py WORK_DIR OUT_DIR NAME [NAME ...]")
    summary = gather(work_dir, names)
    ranked = rank(summary, names)
    summary["ranked"] = ranked
    with open(os.path.join(out_dir, "variants.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("ranked (demo text ok, first-64 agreement, all-prompt agreement):",
          [(n, score(summary[n])) for n in [*ranked, "shipped"]])
    for n in [*ranked, "shipped"]:
        train = summary[n].get("train", {})
        held = train.get("heldout", {})
        print(f"{n:10} steps {train.get('args', {}).get('steps')} epochs {train.get('epochs', 0):.1f} "
              f"ppl {held.get('perplexity', 0):.3f} entropy {held.get('entropy', 0):.3f} "
              f"mtp top1 {held.get('mtp_top1', 0):.3f} near ties {summary[n].get('screen', {}).get('fp32_near_ties')}")
    with open(os.path.join(work_dir, "best"), "w") as f:
        f.write(" ".join(ranked[:2]))
    return ranked


if __name__ == "__main__":
    main(sys.argv[1:])
