"""What the PyTorch oracles (torch_parity.py, gpt_recipe.py,
resnet_recipe.py) share of ddptrain's training recipe: the config as
ddptrain resolves it, its learning-rate schedule, nanoGPT's AdamW parameter
groups, the loss, and a language model's token windows."""
import json
import math
import os
import subprocess
import sys
import tomllib

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


def resolved_config(binary, config, sets):
    """`config` with the --set overrides `sets` as ddptrain resolves it,
    defaults included: the TOML `ddptrain check` prints under "# resolved
    config". Exits with ddptrain's message when it refuses the config."""
    cmd = [binary, "check", "--config", config] + [x for s in sets for x in ("--set", s)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    lines = r.stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("# resolved config")), None)
    end = next((i for i, line in enumerate(lines) if line == "# model"), None)
    if start is None or end is None:
        sys.exit(f"{' '.join(cmd)} printed no '# resolved config' ... '# model' section:\n{r.stdout}")
    return tomllib.loads("\n".join(lines[start + 1 : end]))


def recipe_command(binary, config, sets, init, out, extra=()):
    """ddptrain on `config`'s own recipe (with `sets` and `extra`) from the
    weights at `init`, writing to `out`, quiet, with one checkpoint: the
    final model (a long run would otherwise write one per epoch). A kept
    `--out` of an earlier recipe run is trained over: its files go first."""
    run = [
        f"model.init_from={init}", f"run.out_dir={out}", 'logging.progress="never"', "logging.tensorboard=false",
        "checkpoint.every_steps=0", "checkpoint.every_epochs=0", "checkpoint.keep_last=1",
        'checkpoint.resume="never"', "run.overwrite=true",
    ]
    return [binary, "--config", config] + [x for s in [*sets, *run, *extra] for x in ("--set", s)]


def refuse(config, refusals):
    """Exits naming `config` and the first `(refused, why)` of `refusals`
    that holds: what a recipe script does not implement."""
    for refused, why in refusals:
        if refused:
            sys.exit(f"{config}: {why}")


def run_records(out):
    """The records of ddptrain's run in `out` (metrics.jsonl), its summary,
    and how many steps its loss scaler skipped."""
    with open(os.path.join(out, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    overflows = max((m.get("overflow_steps", 0) for m in records if m.get("kind") == "train"), default=0)
    return records, summary, overflows
