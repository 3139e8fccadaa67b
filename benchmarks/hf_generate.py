"""Greedy `generate()` of small Hugging Face models (random weights, built from configs) on tpu against CPU.

Every row is a fresh process. tpu runs twice per round: `empty` with an empty compile cache directory
(TPUTOOL_CACHE_DIR: what a user's very first run pays) and `disk` reusing the directory the `empty` run just filled
(a second run of the script). In each process three calls: `first` (prompt of 8 tokens), `again` (another prompt of
8 tokens: warm in-process) and `other` (a prompt of 12 tokens: a new prompt length, warm otherwise). Rows run
interleaved, round by round; the best of the rounds is printed.

CPU runs twice per round, with PyTorch's default threads (`cpu`) and with one (`cpu:1thread`): on this 2-core machine
the default two threads slow down many times over while another process holds a core, one thread does not; each
share is against the faster of the two, call by call.

Usage: python benchmarks/hf_generate.py [--models llama,qwen3,qwen3_moe] [--tokens 32] [--rounds 1]
                                        [--caches default,dynamic]
Prints tokens/s per call and as a share of CPU's, the XLA programs each call built (lowered; `miss`: compiled
because the disk cache lacked them), the Dynamo graphs compiled, the machine's load average, and whether tpu's
tokens equal CPU's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

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
programs = []
stats = None
if device != "cpu":
    import jax
    from torch._dynamo.utils import counters
    from tputool.backend.graph import persistent_cache
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, secs, **_: programs.append(1) if name == "/jax/core/compile/jaxpr_to_mlir_module_duration" else None)
    stats = persistent_cache.stats
g = torch.Generator().manual_seed(0)
out = {}
for name, length in (("first", 8), ("again", 8), ("other", 12)):
    prompt = torch.randint(1, 128, (1, length), generator=g).to(device)
    programs.clear()
    misses = stats["misses"] if stats is not None else 0
    graphs = counters["stats"]["unique_graphs"] if stats is not None else 0
    t0 = time.perf_counter()
    ids = model.generate(prompt, **kw).cpu()
    out[name] = time.perf_counter() - t0
    out[name + "_tokens"] = ids[0].tolist()
    out[name + "_programs"] = len(programs)
    out[name + "_misses"] = (stats["misses"] - misses) if stats is not None else 0
    out[name + "_graphs"] = (counters["stats"]["unique_graphs"] - graphs) if stats is not None else 0
print("RESULT " + json.dumps(out))
"""

CALLS = ("first", "again", "other")


def _measure(kind: str, device: str, cache: str, tokens: int, cache_dir: str, threads: str | None = None) -> dict:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TPUTOOL_CACHE_DIR": cache_dir}
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    run = subprocess.run([sys.executable, "-c", _CHILD, kind, device, cache, str(tokens)], capture_output=True,
                         text=True, env=env, timeout=3600)
    line = next((ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        return {"error": (run.stderr.strip().splitlines() or ["no output"])[-1][:160]}
    return json.loads(line[len("RESULT "):])


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama,qwen3,qwen3_moe")
    ap.add_argument("--caches", default="default",
                    help="default: what generate() picks (static on tpu); dynamic/static: forced (comma list)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args(argv)
    rows = [(m, c, d) for m in args.models.split(",") for c in args.caches.split(",")
            for d in ("cpu", "cpu:1thread", "tpu:empty", "tpu:disk")]
    results: dict[tuple, list[dict]] = {r: [] for r in rows}
    print(f"load average (1/5/15 min) before: {_load()}")
    with tempfile.TemporaryDirectory(prefix="tputool-hfgen-") as tmp:
        for r in range(args.rounds):
            for m, c, d in rows:
                # `tpu:empty` creates its directory, `tpu:disk` (the next row) reuses it; CPU has its own
                cache_dir = os.path.join(tmp, f"{m}-{c}-{r}" + (f"-{d}" if d.startswith("cpu") else ""))
                if d == "tpu:empty" and os.path.exists(cache_dir):
                    raise SystemExit(f"{cache_dir} should be new")
                threads = "1" if d == "cpu:1thread" else None
                results[(m, c, d)].append(_measure(m, d.split(":")[0], c, args.tokens, cache_dir, threads))
    print(f"load average (1/5/15 min) after:  {_load()}")
    print(f"{args.tokens} new tokens; tok/s (share of CPU's same call); programs built / of them compiled (not on "
          "disk); Dynamo graphs")
    head = "".join(f" {c + ' tok/s':>19} {'prog/miss/gr':>12}" for c in CALLS)
    print(f"{'model':<10} {'cache':<8} {'run':<10}{head}  tokens = CPU's")
    for m, c, d in rows:
        rs = [r for r in results[(m, c, d)] if "error" not in r]
        if not rs:
            print(f"{m:<10} {c:<8} {d:<10} error: {results[(m, c, d)][0]['error']}")
            continue
        ref = [r for d2 in ("cpu", "cpu:1thread") for r in results[(m, c, d2)] if "error" not in r]
        cells = ""
        for call in CALLS:
            best = min(rs, key=lambda r, call=call: r[call])
            tps = args.tokens / best[call]
            share = f"({100 * min(r[call] for r in ref) / best[call]:.1f}%)" if ref and not d.startswith("cpu") else ""
            counts = f"{best[call + '_programs']}/{best[call + '_misses']}/{best[call + '_graphs']}"
            cells += f" {tps:>10.1f} {share:>8} {counts:>12}"
        same = bool(ref) and all(r[k + "_tokens"] == ref[0][k + "_tokens"] for r in rs for k in CALLS)
        print(f"{m:<10} {c:<8} {d:<10}{cells}  {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
