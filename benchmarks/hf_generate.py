"""Greedy `generate()` of small Hugging Face models (random weights, built from configs) on tpu against CPU.

Each measurement runs in a fresh process, so "cold" includes every compile a user's first call pays; "warm" is a
second call with another prompt of the same length in the same process. Rows run interleaved (round by round).

Usage: python benchmarks/hf_generate.py [--models llama,qwen3,qwen3_moe] [--tokens 32] [--rounds 1]
                                        [--caches default,dynamic]
Prints tokens/s per (model, device, cache), cold and warm, and checks that tpu's tokens equal CPU's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_CHILD = r"""
import json, os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch, transformers
kind, device, cache, tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
torch.manual_seed(0)  # the same random weights in every process
common = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256)
if kind == "llama":
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
elif kind == "qwen3":
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=8, **common))
elif kind == "qwen3_moe":
    model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
        head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, **common))
elif kind == "mixtral":
    model = transformers.MixtralForCausalLM(transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2,
                                                                        **common))
else:
    sys.exit(f"unknown model {kind}")
model = model.eval().to(device)
kw = dict(max_new_tokens=tokens, do_sample=False)
if cache != "default":
    kw["cache_implementation"] = cache
g = torch.Generator().manual_seed(0)
out = {}
for name in ("cold", "warm"):
    prompt = torch.randint(1, 128, (1, 8), generator=g).to(device)
    t0 = time.perf_counter()
    ids = model.generate(prompt, **kw).cpu()
    out[name] = time.perf_counter() - t0
    out[name + "_tokens"] = ids[0].tolist()
print("RESULT " + json.dumps(out))
"""


def _measure(kind: str, device: str, cache: str, tokens: int) -> dict:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    run = subprocess.run([sys.executable, "-c", _CHILD, kind, device, cache, str(tokens)], capture_output=True,
                         text=True, env=env, timeout=3600)
    line = next((ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        return {"error": (run.stderr.strip().splitlines() or ["no output"])[-1][:160]}
    return json.loads(line[len("RESULT "):])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama,qwen3,qwen3_moe")
    ap.add_argument("--caches", default="default,dynamic",
                    help="default: what generate() picks (static on tpu); dynamic/static: forced")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args(argv)
    rows = [(m, d, c) for m in args.models.split(",") for c in args.caches.split(",") for d in ("cpu", "tpu")]
    results: dict[tuple, list[dict]] = {r: [] for r in rows}
    for _ in range(args.rounds):
        for row in rows:
            results[row].append(_measure(*row, args.tokens))
    print(f"{'model':<10} {'cache':<8} {'device':<6} {'cold tok/s':>10} {'warm tok/s':>10}  tokens = CPU's")
    for m, d, c in rows:
        rs = [r for r in results[(m, d, c)] if "error" not in r]
        if not rs:
            print(f"{m:<10} {c:<8} {d:<6} error: {results[(m, d, c)][0]['error']}")
            continue
        cold = min(r["cold"] for r in rs)
        warm = min(r["warm"] for r in rs)
        ref = next((r for r in results[(m, "cpu", c)] if "error" not in r), None)
        same = ref is not None and rs[0]["cold_tokens"] == ref["cold_tokens"] and rs[0]["warm_tokens"] == ref["warm_tokens"]
        print(f"{m:<10} {c:<8} {d:<6} {args.tokens / cold:>10.1f} {args.tokens / warm:>10.1f}  {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
