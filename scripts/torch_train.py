"""What the PyTorch oracles (torch_parity.py, gpt_recipe.py) share of
ddptrain's training recipe: its learning-rate schedule, nanoGPT's AdamW
parameter groups, the loss, and a language model's token windows."""
import math

import numpy as np
import torch
import torch.nn as nn


def lr_at(step, base, warmup, total, eta_min=0.0):
    """ddptrain's warmup + cosine schedule (src/optim/schedule.rs) for 0-based
    `step`: a linear warmup from the first step, then cosine from `base` to
    `eta_min` over the steps after warmup, held at `eta_min` from `total` on;
    computed in f64 and rounded once to f32, the rate ddptrain's optimizer
    uses. `base` and `eta_min` are the values as written in the config (what
    ddptrain widens its f32s back to)."""
    if step < warmup:
        lr = base * (step + 1) / warmup
    else:
        t_max = max(total - warmup, 0)
        s = step - warmup
        lr = eta_min if s >= t_max else eta_min + (base - eta_min) * (1.0 + math.cos(math.pi * s / t_max)) / 2.0
    return float(np.float32(lr))


def nanogpt_groups(model, weight_decay, min_dim=2):
    """nanoGPT's configure_optimizers: only parameters of `min_dim` or more
    dimensions (matmul and embedding weights) decay."""
    ps = list(model.parameters())
    return [{"params": [p for p in ps if p.dim() >= min_dim], "weight_decay": weight_decay},
            {"params": [p for p in ps if p.dim() < min_dim], "weight_decay": 0.0}]


def loss_of(model, x, y):
    """Cross-entropy of the batch: nanoGPT's over [B*T, V] for a language model."""
    logits = model(x)
    return nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))


def windows(rows):
    """Windows of block_size + 1 ids as (inputs, targets), nanoGPT's get_batch."""
    w = torch.tensor(rows, dtype=torch.int64)
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def mean_loss(model, x, y, batch):
    """The mean loss per target of `model` in eval mode over (x, y) in batches
    of `batch`: ddptrain's validation loss (nats per token)."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        total = sum(float(loss_of(model, x[i : i + batch], y[i : i + batch])) * len(x[i : i + batch])
                    for i in range(0, len(x), batch))
    model.train(was_training)
    return total / len(x)
