"""A small training loop with four things that slow it on tpu: the loss read every step (a host sync), a
custom op with only a CPU kernel (a fallback), a batch built on the host and copied every step (transfers),
and a sequence length that changes in the second half (new XLA programs after warm-up)."""
import torch

torch.manual_seed(0)
lib = torch.library.Library("tputool_report_demo", "DEF")
lib.define("scale(Tensor x) -> Tensor")
lib.impl("scale", lambda x: x * 0.5, "CPU")
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
losses = []
for step in range(8):
    seq = 16 if step < 4 else 16 + 4 * step
    batch = torch.randn(8, seq, 64).to("tpu")
    inputs = torch.ops.tputool_report_demo.scale(batch)
    loss = model(inputs).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
print(f"final loss {losses[-1]:.4f}")
