"""Can a short fine-tune make a trained demo checkpoint quieter under bf16 (issue 16)? An
experiment: continue training a checkpoint with, beside its own losses (next-token CE + 0.3 x MTP
CE, as demo/train.py), a consistency term

    kl_weight * KL(p_fp32 (no gradient) || p_perturbed)

where the perturbed forward is the same model with every activation at the sites a bf16 engine
rounds (``bf16_noise_sites.SITES["all of the above but the logits"]``) moved by ``amp`` times its
own bf16 rounding error, straight through (the perturbation is a constant to the gradient). The
gradient then lowers the model's sensitivity to exactly that noise. Before and after: held-out
perplexity (64 windows of 512), the all-sites noise KL of ``bf16_noise_sites`` on 24 prompts, and
the demo-text check (``demo/quality.py``). Writes the fine-tuned model directory and a JSON record.

    python benchmarks/bf16_consistency_finetune.py --out DIR [--init demo] [--steps 150] [--batch 8]
        [--seq 256] [--kl-weight 300] [--amp 4] [--corpus .corpus] [--device cpu]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch

from hybrid_serve.benchmarks.bf16_noise_sites import SITES, mean_kl, perturb_at
from hybrid_serve.benchmarks.provenance import cpu_device, git_commit

ALL_SITES = SITES["all of the above but the logits"]


def straight_through_noise(amp: float):
    """x -> x + amp * (bf16(x) - x), the added part a constant to autograd."""
    def perturb(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x + amp * (x.to(torch.bfloat16).float() - x).detach()
        return x
    return perturb


def consistency_kl(model, ids: torch.Tensor, amp: float) -> torch.Tensor:
    """Mean over positions of KL(p || p~) for input ids [B, T]: p the plain forward (held fixed),
    p~ the forward perturbed at ALL_SITES by ``amp`` x the bf16 rounding error; differentiable in p~."""
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits.float().log_softmax(-1)
    hooks = perturb_at(model, ALL_SITES, straight_through_noise(amp))
    try:
        noisy = model(input_ids=ids, use_cache=False).logits.float().log_softmax(-1)
    finally:
        for h in hooks:
            h.remove()
    return (ref.exp() * (ref - noisy)).sum(-1).mean()


def noise_kl(model, prompts) -> float:
    model.eval()
    with torch.no_grad():
        ref = [model(ids).logits.float().log_softmax(-1) for ids in prompts]
    kl = mean_kl(model, prompts, ref, ALL_SITES)
    model.train()
    return kl


def main(argv=None) -> dict:
    from hybrid_serve.demo import DEMO_DIR, corpus
    from hybrid_serve.demo import train as demo_train
    from hybrid_serve.demo.corpus import heldout_prompts
    from hybrid_serve.demo.model import load
    from hybrid_serve.demo.quality import check
    from hybrid_serve.engine.tokenizer import load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--init", default=DEMO_DIR, help="the checkpoint to fine-tune")
    ap.add_argument("--out", required=True, help="the fine-tuned model directory")
    ap.add_argument("--corpus", default=".corpus", help="python -m hybrid_serve.demo.corpus DIR")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-4, help="AdamW, 10 warm-up steps, then constant")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--kl-weight", type=float, default=300.0)
    ap.add_argument("--amp", type=float, default=4.0, help="the perturbation in units of the bf16 rounding error")
    ap.add_argument("--noise-prompts", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out-name", default="bf16_consistency_finetune.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model, mtp = load(args.init, args.device)
    model.train()  # from_pretrained gives eval mode
    with open(os.path.join(args.init, "config.json")) as f:
        config = json.load(f)  # written back as it was
    train_ids, heldout_ids, _ = corpus.read_tokens(args.corpus)
    train_ids = torch.as_tensor(train_ids, dtype=torch.long, device=device)
    heldout_ids = torch.as_tensor(heldout_ids, dtype=torch.long, device=device)
    tok = load_tokenizer(args.init)
    prompts = [torch.tensor([tok.encode(t, add_special_tokens=False)], device=device)
               for t in heldout_prompts(args.noise_prompts, seed=0)]

    def snapshot() -> dict:
        ev = demo_train.evaluate(model, mtp, heldout_ids, 512, 8, max_windows=64)
        return {"heldout_perplexity": ev["perplexity"], "heldout_mtp_top1": ev["mtp_top1"],
                "noise_kl_all_sites": noise_kl(model, prompts),
                "weight_norm": math.sqrt(sum(float((p.detach().float() ** 2).sum()) for p in model.parameters()))}

    before = snapshot()
    print("before", json.dumps(before), flush=True)
    params = list(model.parameters()) + list(mtp.parameters())
    opt = demo_train.optimizer(model, mtp, args.lr, args.weight_decay, fused=device.type == "cuda")
    gen = torch.Generator().manual_seed(args.seed)
    offsets = torch.arange(args.seq + 2, device=device)
    log, start = [], time.perf_counter()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / 10)
        starts = torch.randint(0, len(train_ids) - args.seq - 2, (args.batch,), generator=gen).to(device)
        window = train_ids[starts[:, None] + offsets]
        out = demo_train.forward_losses(model, mtp, window)
        tokens = window.shape[0] * (window.shape[1] - 2)
        loss = out["main_nll"] / tokens + 0.3 * out["mtp_nll"] / tokens
        kl = consistency_kl(model, window[:, :-2], args.amp) if args.kl_weight else torch.zeros(())
        (loss + args.kl_weight * kl).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        log.append({"step": step + 1, "loss": float(out["main_nll"].detach() / tokens), "kl_amp": float(kl.detach())})
        if (step + 1) % 10 == 0:
            print(f"step {step + 1} loss {log[-1]['loss']:.3f} kl(amp {args.amp}) {log[-1]['kl_amp']:.2e} "
                  f"{time.perf_counter() - start:.0f}s", flush=True)
    seconds = time.perf_counter() - start
    after = snapshot()
    print("after", json.dumps(after), flush=True)
    demo_train.save(model, mtp, config, args.out)
    text = {"before": check(args.init, args.device), "after": check(args.out, args.device)}
    result = {"metric": "bf16_consistency_finetune", "date": time.strftime("%Y-%m-%d"), "commit": git_commit(),
              "device": torch.cuda.get_device_name() if device.type == "cuda" else cpu_device(args.threads),
              "init": args.init, "args": vars(args),
              "workload": f"{args.steps} steps of {args.batch} x {args.seq} stdlib tokens; held-out perplexity on 64 "
                          f"windows of 512; noise KL: bf16_noise_sites' all sites on {args.noise_prompts} prompts",
              "baseline": "the same checkpoint before the fine-tune, measured by the same code in the same run",
              "before": before, "after": after, "demo_text": text, "train_seconds": seconds, "log": log}
    out_dir = os.environ.get("OUT", "./bench_out")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, args.out_name), "w") as f:
        json.dump(result, f, indent=1)
    print("demo text before:", text["before"]["ok"], "after:", text["after"]["ok"], repr(text["after"]["completion"]))
    return result


if __name__ == "__main__":
    main()
