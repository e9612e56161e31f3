"""PyTorch twin of scripts/bench.sh: the seed ConvNet, SGD(momentum 0.9, wd 5e-4),
synthetic data, the same batch and thread count. Prints training images/s.
--device cuda runs it on the GPU (data on the device, as ddptrain keeps it);
--amp adds autocast(float16) + GradScaler, PyTorch's own mixed precision.
On the CPU, --layout channels_last keeps the model and the images in NHWC
(oneDNN's preferred layout), and --compile wraps the model in torch.compile
(compiled during the warmup steps, not timed)."""
import argparse
import time

import torch
import torch.nn as nn
from torch_convnet import ConvNet

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=300)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--batch", type=int, default=100)
p.add_argument("--device", default="cpu")
p.add_argument("--amp", action="store_true")
p.add_argument("--layout", choices=["nchw", "channels_last"], default="nchw")
p.add_argument("--compile", action="store_true")
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)


dev = torch.device(a.device)
fmt = torch.channels_last if a.layout == "channels_last" else torch.contiguous_format
model = ConvNet().to(dev, memory_format=fmt)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
net = torch.compile(model) if a.compile else model
loss_fn = nn.CrossEntropyLoss()
scaler = torch.amp.GradScaler(a.device, enabled=a.amp)
n = 50 * a.batch
images = torch.randn(n, 1, 28, 28, device=dev).contiguous(memory_format=fmt)
labels = torch.randint(0, 10, (n,), device=dev)


def step(i):
    j = (i * a.batch) % n
    x, y = images[j : j + a.batch], labels[j : j + a.batch]
    with torch.autocast(a.device, dtype=torch.float16, enabled=a.amp):
        loss = loss_fn(net(x), y)
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


for i in range(20):
    step(i)
sync()
t = time.perf_counter()
for i in range(a.steps):
    step(i)
sync()
print(round(a.steps * a.batch / (time.perf_counter() - t)))
