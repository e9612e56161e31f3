"""PyTorch twin of scripts/bench.sh: the seed ConvNet, SGD(momentum 0.9, wd 5e-4),
synthetic data, the same batch and thread count. Prints training images/s."""
import argparse
import time

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=300)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--batch", type=int, default=100)
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = nn.Sequential(nn.Conv2d(1, 16, 5, 1, 2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2, 2))
        self.layer2 = nn.Sequential(nn.Conv2d(16, 32, 5, 1, 2), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2, 2))
        self.fc = nn.Linear(7 * 7 * 32, 10)

    def forward(self, x):
        return self.fc(self.layer2(self.layer1(x)).reshape(x.size(0), -1))


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
