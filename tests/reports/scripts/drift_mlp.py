"""A small residual MLP whose tpu side drifts from the second step on: from step 1, block 2 scales its
output by 1.002 on tpu only (a device branch), so step 0 agrees and step 1 departs at block 2."""
import torch
from torch import nn

device = "tpu"


class Block(nn.Module):
    def __init__(self, width, drifts=False):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)
        self.act = nn.GELU()
        self.drifts = drifts
        self.step = 0

    def forward(self, x):
        h = self.act(self.fc(self.norm(x)))
        if self.drifts and self.step >= 1 and h.device.type == "tpu":
            h = h * 1.002
        return x + h


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.blocks = nn.ModuleList([Block(32), Block(32, drifts=True), Block(32)])
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


torch.manual_seed(0)
model = Net().to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(8, 16)
target = torch.randint(0, 4, (8,))
for step in range(4):
    for b in model.blocks:
        b.step = step
    x, y = data.to(device), target.to(device)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done")
