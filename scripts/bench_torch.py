"""PyTorch twin of scripts/bench.sh: the seed ConvNet, SGD(momentum 0.9, wd 5e-4),
synthetic data, the same batch and thread count. Prints training images/s."""
import argparse
import time

import torch
import torch.nn as nn
from torch_convnet import ConvNet

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=300)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--batch", type=int, default=100)
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)


model = ConvNet()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
loss_fn = nn.CrossEntropyLoss()
n = 50 * a.batch
images = torch.randn(n, 1, 28, 28)
labels = torch.randint(0, 10, (n,))


def step(i):
    j = (i * a.batch) % n
    x, y = images[j : j + a.batch], labels[j : j + a.batch]
    loss = loss_fn(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


for i in range(20):
    step(i)
t = time.perf_counter()
for i in range(a.steps):
    step(i)
print(round(a.steps * a.batch / (time.perf_counter() - t)))
