"""benchmarks/demo_variants_summary.py: which trained variants come back from the GPU. A variant
whose demo text fails ranks below every one whose text passes, screened or not (session 39's
call brought back the first two unscreened runs in order, leaving a passing one behind)."""
import json

import pytest

from hybrid_serve.benchmarks.demo_variants_summary import main, rank, score


def _screen(first64: float, all_prompts: float) -> dict:
    pair = "ours bf16 vs ours fp32 ref"
    return {"rows_first_64_prompts": {pair: {"prompts_first16_agree": first64}},
            "rows": {pair: {"prompts_first16_agree": all_prompts}}, "fp32_near_ties": {}}


def _write(work, name, text_ok=None, screen=None, ppl=5.0):
    (work / name).mkdir()
    (work / name / "train_log.json").write_text(json.dumps({"args": {"steps": 540}, "epochs": 3.5,
                                                            "heldout": {"perplexity": ppl}}))
    if text_ok is not None:
        (work / f"text_{name}.json").write_text(json.dumps({"ok": text_ok}))
    if screen is not None:
        (work / f"agree_{name}.json").write_text(json.dumps(screen))


def test_unscreened_variants_rank_by_their_demo_text(tmp_path):
    for name, ok in (("seed1", False), ("seed2", True), ("seed3", True), ("seed4", False)):
        _write(tmp_path, name, text_ok=ok)
    ranked = main([str(tmp_path), str(tmp_path), "seed1", "seed2", "seed3", "seed4"])
    assert ranked == ["seed2", "seed3", "seed1", "seed4"]
    assert (tmp_path / "best").read_text() == "seed2 seed3"
    summary = json.loads((tmp_path / "variants.json").read_text())
    assert summary["ranked"] == ranked and summary["shipped"] == {}  # no shipped screen in this run


def test_a_failing_text_ranks_below_any_passing_one_whatever_its_agreement():
    summary = {"loud_ok": {"demo_text": {"ok": True}, "screen": _screen(0.80, 0.85)},
               "quiet_noise": {"demo_text": {"ok": False}, "screen": _screen(1.0, 1.0)},
               "unscreened_ok": {"demo_text": {"ok": True}},
               "quiet_ok": {"demo_text": {"ok": True}, "screen": _screen(0.97, 0.94)},
               "quiet_ok_narrower": {"demo_text": {"ok": True}, "screen": _screen(0.97, 0.92)},
               "no_text": {"screen": _screen(1.0, 1.0)}}
    assert rank(summary, list(summary)) == ["quiet_ok", "quiet_ok_narrower", "loud_ok", "unscreened_ok",
                                            "quiet_noise", "no_text"]
    assert score({}) == (0, -1.0, -1.0)


def test_a_screen_of_the_64_acceptance_prompts_alone_ranks_by_its_own_rows():
    pair = "ours bf16 vs ours fp32 ref"
    official = {"rows": {pair: {"prompts_first16_agree": 0.953}}}  # --fp32-triton --bf16-ref: no --subset
    assert score({"demo_text": {"ok": True}, "screen": official}) == (1, 0.953, 0.953)
    summary = {"a": {"demo_text": {"ok": True}, "screen": official},
               "b": {"demo_text": {"ok": True}, "screen": _screen(0.97, 0.90)}}
    assert rank(summary, ["a", "b"]) == ["b", "a"]


def test_no_variant_names_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no variant names"):
        main([str(tmp_path), str(tmp_path)])
