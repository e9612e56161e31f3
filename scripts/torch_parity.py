"""ddptrain vs PyTorch on the seed ConvNet, tensor by tensor.

Both start from the same weights (PyTorch's default init, handed to ddptrain
through model.init_from), see the same digits in the same order (shuffle off),
and take N SGD steps (momentum 0.9, weight decay 5e-4, constant lr). Every
state_dict tensor (weights, BN running stats, num_batches_tracked) is then
compared. Exit 0 when all agree within --tol, 1 otherwise.

    PYTHON_WITH_TORCH scripts/torch_parity.py --bin target/release/ddptrain
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn
from torch_convnet import ConvNet
from safetensors.torch import load_file, save_file

p = argparse.ArgumentParser()
p.add_argument("--bin", required=True)
p.add_argument("--data", default="data/mnist")
p.add_argument("--steps", type=int, default=1)
p.add_argument("--tol", type=float, default=1e-5)
a = p.parse_args()
torch.set_num_threads(2)
torch.manual_seed(0)


def idx(path, offset):
    with open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


n = a.steps * 100
images = idx(os.path.join(a.data, "train-images-idx3-ubyte"), 16)[: n * 784].reshape(n, 1, 28, 28)
labels = idx(os.path.join(a.data, "train-labels-idx1-ubyte"), 8)[:n].astype(np.int64)
x_all = (torch.from_numpy(images.astype(np.float32)) / 255.0 - 0.1307) / 0.3081
y_all = torch.from_numpy(labels)

model = ConvNet()
with tempfile.TemporaryDirectory() as tmp:
    init = os.path.join(tmp, "init.safetensors")
    save_file(model.state_dict(), init)
    out = os.path.join(tmp, "out")
    sets = [
        f"model.init_from={init}", f"data.path={a.data}", "data.shuffle=false", f"train.max_steps={a.steps}",
        'scheduler.name="constant"', "scheduler.warmup_steps=0", f"run.out_dir={out}",
        "expect.min_test_accuracy=0.0", "logging.progress=never",
    ]
    cmd = [a.bin, "--config", "configs/mnist_o0.toml"] + [x for s in sets for x in ("--set", s)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"ddptrain failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    ours = load_file(os.path.join(out, "model.safetensors"))

opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
loss_fn = nn.CrossEntropyLoss()
model.train()
for s in range(a.steps):
    x, y = x_all[s * 100 : (s + 1) * 100], y_all[s * 100 : (s + 1) * 100]
    loss = loss_fn(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()

worst = 0.0
print(f"{'tensor':32} {'max |ddptrain - pytorch|':>26} {'max |pytorch|':>14}")
for name, t in model.state_dict().items():
    o = ours[name]
    if o.shape != t.shape:
        sys.exit(f"{name}: shape {tuple(o.shape)} vs pytorch {tuple(t.shape)}")
    d = (o.double() - t.double()).abs().max().item()
    scale = max(t.double().abs().max().item(), 1.0)
    worst = max(worst, d / scale)
    print(f"{name:32} {d:26.3e} {t.double().abs().max().item():14.4g}")
print(f"after {a.steps} SGD steps: worst relative difference {worst:.3e} (tolerance {a.tol:g})")
sys.exit(0 if worst <= a.tol else 1)
