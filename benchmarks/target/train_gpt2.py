"""A GPT-2 (124M) training script in the spirit of nanoGPT's train.py, written for these benchmarks, ported to
the `tpu` device: pre-LayerNorm blocks, causal SDPA, tied embeddings, AdamW (betas 0.9/0.95, weight decay 0.1
on matrices), DDP when launched as one of several ranks, random tokens instead of a dataset."""

import argparse
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--batch_size", type=int, default=12)
p.add_argument("--block_size", type=int, default=1024)
p.add_argument("--n_layer", type=int, default=12)
p.add_argument("--n_head", type=int, default=12)
p.add_argument("--n_embd", type=int, default=768)
p.add_argument("--vocab_size", type=int, default=50304)
p.add_argument("--max_iters", type=int, default=10)
args = p.parse_args()


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, a) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(a.vocab_size, a.n_embd), nn.Embedding(a.block_size, a.n_embd)
        self.h = nn.ModuleList(Block(a.n_embd, a.n_head) for _ in range(a.n_layer))
        self.ln_f = nn.LayerNorm(a.n_embd)
        self.lm_head = nn.Linear(a.n_embd, a.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, w in self.named_parameters():
            if w.dim() == 2:
                std = 0.02 / math.sqrt(2 * a.n_layer) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(w, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(w)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group(backend="tpu")
device = "tpu"
torch.manual_seed(1337)
with torch.device(device):
    model = GPT(args)
decay = [w for w in model.parameters() if w.dim() >= 2]
no_decay = [w for w in model.parameters() if w.dim() < 2]
optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                              lr=6e-4, betas=(0.9, 0.95))
train = DDP(model) if ddp else model
for it in range(args.max_iters):
    data = torch.randint(0, args.vocab_size, (args.batch_size, args.block_size + 1))
    x, y = data[:, :-1].to(device), data[:, 1:].to(device)
    loss = train(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"iter {it}: loss {loss.item():.4f}")
