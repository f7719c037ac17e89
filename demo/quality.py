"""What a new user sees first: the demo's greedy continuation of ``def fibonacci(n):`` (issue 16's
first acceptance point), as a check that a candidate checkpoint can be shipped.

    python -m hybrid_serve.demo.quality [MODEL_DIR] [--device cuda] [--out FILE.json]

``fibonacci_problems`` is the rule the demo's test applies to the shipped model
(tests/demo/test_demo_model.py); the training benchmarks apply it to every candidate before
their bf16 screen, since a checkpoint that agrees in bf16 but writes noise is no demo.
"""
from __future__ import annotations

import argparse
import ast
import json

FIBONACCI_PROMPT = "def fibonacci(n):"
FIBONACCI_TOKENS = 32


def fibonacci_problems(completion: str, prompt: str = FIBONACCI_PROMPT) -> list[str]:
    """What is wrong with ``completion`` as the body of ``prompt`` (empty: it looks like Python):
    the body must start on an indented new line, the complete lines (the last, cut short by the
    token limit, left out) must parse, and there must be at least three of them."""
    problems = []
    if not completion.startswith("\n    "):
        problems.append(f"the body does not start on an indented new line: {completion[:20]!r}")
    text = prompt + completion
    complete = text[: text.rindex("\n")] if "\n" in text else text
    try:
        ast.parse(complete)
    except SyntaxError as e:
        problems.append(f"the complete lines do not parse: {e.msg} (line {e.lineno})")
    if complete.count("\n") < 3:
        problems.append(f"fewer than 3 complete lines: {complete.count(chr(10))}")
    # a degenerate loop (".f.f.f", "the path to the path to") parses but is no demo
    words = complete.split()
    if len(words) >= 8 and len(set(words)) < len(words) / 3:
        problems.append(f"repetitive: {len(set(words))} distinct words of {len(words)}")
    return problems


def check(model_dir: str, device: str = "cpu") -> dict:
    """Greedy ``FIBONACCI_TOKENS`` tokens after ``FIBONACCI_PROMPT`` in fp32 (as
    ``hybrid-serve generate`` prints them on a CPU) and what ``fibonacci_problems`` says of them."""
    from hybrid_serve import LLM, SamplingParams

    llm = LLM(model=model_dir, device=device, dtype="float32", enable_cuda_graphs=False, max_num_seqs=4,
              gpu_memory_utilization=0.1)
    out = llm.generate([FIBONACCI_PROMPT], SamplingParams(max_tokens=FIBONACCI_TOKENS, temperature=0.0))[0]
    text = out.outputs[0].text
    problems = fibonacci_problems(text)
    return {"prompt": FIBONACCI_PROMPT, "completion": text, "ok": not problems, "problems": problems}


def main(argv=None) -> dict:
    from . import DEMO_DIR

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=DEMO_DIR)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None, help="write the result as JSON here")
    args = ap.parse_args(argv)
    result = check(args.model, args.device)
    print(FIBONACCI_PROMPT + result["completion"])
    print("demo text:", "ok" if result["ok"] else "; ".join(result["problems"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
