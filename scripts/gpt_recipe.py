"""A GPT config's whole training recipe, ddptrain against PyTorch: the final
validation losses must agree within --tol.

torch_parity.py checks a few steps tensor by tensor from per-step
checkpoints; this runs the config's own recipe to its end, once on each
side, and compares what the recipe is for: the validation loss at every
evaluation. PyTorch's model is nanoGPT's GPT built from ddptrain's
description of the config (torch_model.py), initialized as nanoGPT
initializes it (the config's init_std values are nanoGPT's) under
torch.manual_seed(0); ddptrain starts from those weights
(model.init_from). Beyond that, ddptrain trains with the config as it is
(the --set overrides here, for a shorter run, go to both sides), only told
where to write, to stay quiet, and to checkpoint only the end.

PyTorch trains in fp32 with the recipe read from the config as ddptrain
resolves it (`ddptrain check`): AdamW's lr, betas, eps and weight decay with
nanoGPT's parameter groups (optimizer.weight_decay_min_dim), ddptrain's
warmup + cosine to eta_min, the gradient clipping, batch_size and
max_steps. It reads the training windows of --windows in order, batch_size
a step (the windows ddptrain's sampler draws for those steps; tests/
torch_parity_gpt.rs writes them), and scores the "val" windows
(train.eval_iters batches of data.eval_batch_size, ddptrain's fixed
validation stream) every train.eval_every steps and at the end, as
ddptrain does. ddptrain trains at the config's own opt level (O2: fp16
compute, fp32 masters), so the two runs differ by more than rounding; the
tolerance is the requirement's.

Prints the validation loss of each evaluation on both sides and the wall
time and training tokens/s of each; exit 0 when the final validation losses
differ by at most --tol, 1 otherwise.

    PYTHON_WITH_TORCH scripts/gpt_recipe.py --bin target/release/ddptrain --windows windows.json
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings

# Both sides train on the CPU: PyTorch must not open a device, and neither
# may ddptrain under run.device = "auto".
os.environ["CUDA_VISIBLE_DEVICES"] = ""
# Autograd still asks the CUDA runtime for a device count; an emulated
# libcuda on the library path does not implement that query, and PyTorch warns.
warnings.filterwarnings("ignore", message="CUDA initialization")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch_train as train_lib  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from torch_model import build, describe, dropout_masks  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--bin", required=True, help="the ddptrain binary (a release build: this is the whole recipe)")
p.add_argument("--config", default="configs/gpt_sotu_o2.toml")
p.add_argument("--data", help="the text ddptrain reads (data.path; default: the config's)")
p.add_argument("--windows", required=True, help="JSON {train: [...], val: [...]} of ddptrain's token windows")
p.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE",
               help="a ddptrain --set override, for both sides (repeatable; e.g. train.max_steps=30)")
p.add_argument("--tol", type=float, default=0.03, help="largest allowed |final val loss difference|")
p.add_argument("--threads", type=int, default=2, help="PyTorch's intra-op threads")
p.add_argument("--out", help="ddptrain's run.out_dir, kept (default: a temporary directory)")
a = p.parse_args()
SETS = a.sets + ([f"data.path={a.data}"] if a.data else [])


CFG = train_lib.resolved_config(a.bin, a.config, SETS)
DESC = describe(a.bin, a.config, SETS)
opt, sched, train, data = CFG["optimizer"], CFG["scheduler"], CFG["train"], CFG["data"]
# What this script implements of a recipe; anything else would be compared against a different one.
refusals = [
    (data.get("dataset") != "text", f"data.dataset is {data.get('dataset')!r}: this compares language models"),
    (opt.get("name") != "adamw", f"optimizer.name is {opt.get('name')!r}: PyTorch's side here is AdamW"),
    (sched.get("name") != "cosine", f"scheduler.name is {sched.get('name')!r}: PyTorch's side here is the cosine"),
    ("max_steps" not in train, "train.max_steps is unset: the windows are drawn for a number of steps"),
    ("epochs" in train, "train.epochs is set: the run's length must be train.max_steps alone"),
    (train.get("grad_accum_steps", 1) != 1, "train.grad_accum_steps is not 1: PyTorch's side steps every batch"),
    (bool(dropout_masks(DESC)), f"dropout with p > 0 at {', '.join(dropout_masks(DESC))}: its masks are not "
                                "PyTorch's; compare a copy of the config with p = 0"),
]
train_lib.refuse(a.config, refusals)
STEPS, BATCH, EVAL_BATCH = train["max_steps"], data["batch_size"], data["eval_batch_size"]
EVAL_EVERY = train.get("eval_every")
# Defaults as the README gives them for a text config (a resolved config may leave them out).
EVAL_ITERS, MIN_DIM = train.get("eval_iters", 200), opt.get("weight_decay_min_dim", 2)
GRAD_CLIP = train.get("grad_clip_norm")
BLOCK = DESC["input_shape"][0]


def lr_at(step):
    return train_lib.lr_at(step, opt["lr"], sched.get("warmup_steps", 0), STEPS, sched.get("eta_min", 0.0))


def eval_steps():
    """ddptrain's evaluations: every train.eval_every steps before the last, and after the last."""
    every = [s for s in range(EVAL_EVERY, STEPS, EVAL_EVERY)] if EVAL_EVERY else []
    return every + [STEPS]


with open(a.windows) as f:
    WINDOWS = json.load(f)
(x_train, y_train), (x_val, y_val) = train_lib.windows(WINDOWS["train"]), train_lib.windows(WINDOWS["val"])
if len(x_train) < STEPS * BATCH:
    sys.exit(f"{STEPS} steps of {BATCH} windows need {STEPS * BATCH} training windows, {a.windows} has {len(x_train)}")
if len(x_val) != EVAL_ITERS * EVAL_BATCH:
    sys.exit(f"ddptrain's validation stream is {EVAL_ITERS} x {EVAL_BATCH} windows, {a.windows} has {len(x_val)}")
if x_train.shape[1] != BLOCK:
    sys.exit(f"the model reads {BLOCK} tokens, {a.windows}'s windows give {x_train.shape[1]}")


def nanogpt_init(model):
    """nanoGPT's GPT.__init__: every weight N(0, 0.02), each residual
    projection (c_proj) N(0, 0.02 / sqrt(2 * n_layer)), the tied lm_head
    with wte."""
    n_layer = model.config["n_layer"]
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(param, 0.0, 0.02 / math.sqrt(2 * n_layer))
            elif param.dim() >= 2:
                nn.init.normal_(param, 0.0, 0.02)
            elif name.endswith(".bias"):
                nn.init.zeros_(param)
            else:
                nn.init.ones_(param)  # a layernorm's weight


def run_ddptrain(init, out):
    """ddptrain on the config's recipe from `init`: {step: val loss}, its summary, its wall time."""
    cmd = train_lib.recipe_command(a.bin, a.config, SETS, init, out)
    print("ddptrain:", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    with open(os.path.join(out, "ddptrain.log"), "w") as f:
        f.write(r.stdout + r.stderr)
    # 3: the run finished but missed a gate of the config's [expect]; the comparison still stands.
    if r.returncode not in (0, 3):
        sys.exit(f"ddptrain failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    records, summary, overflows = train_lib.run_records(out)
    evals = {m["step"]: m["val_loss"] for m in records if m.get("kind") == "eval"}
    return evals, summary, wall, overflows


def run_pytorch(init_state):
    """PyTorch on the same recipe, windows and init: {step: val loss}, training seconds, wall time."""
    t0 = time.perf_counter()
    torch.set_num_threads(a.threads)
    model = build(DESC)
    model.load_state_dict(init_state, strict=True)
    model.train()
    optimizer = torch.optim.AdamW(train_lib.nanogpt_groups(model, opt["weight_decay"], MIN_DIM), lr=opt["lr"],
                                  betas=tuple(opt["betas"]), eps=opt["eps"])
    at = set(eval_steps())
    evals, train_s = {}, 0.0
    for s in range(STEPS):
        ts = time.perf_counter()
        for g in optimizer.param_groups:
            g["lr"] = lr_at(s)
        rows = slice(s * BATCH, (s + 1) * BATCH)
        loss = train_lib.loss_of(model, x_train[rows], y_train[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if GRAD_CLIP is not None:
            nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        train_s += time.perf_counter() - ts
        if s + 1 in at:
            evals[s + 1] = train_lib.mean_loss(model, x_val, y_val, EVAL_BATCH)
            print(f"pytorch step {s + 1}: val loss {evals[s + 1]:.4f}", flush=True)
        if not math.isfinite(loss.item()):
            sys.exit(f"PyTorch's loss is {loss.item()} at step {s + 1}")
    return evals, train_s, time.perf_counter() - t0


torch.manual_seed(0)
model = build(DESC)
nanogpt_init(model)
init_state = {k: v.clone() for k, v in model.state_dict().items()}
tmp = tempfile.TemporaryDirectory()
out = a.out or os.path.join(tmp.name, "out")
os.makedirs(out, exist_ok=True)
init = os.path.join(out, "init.safetensors")
# The copies: a tied weight is one tensor under two keys, which safetensors
# refuses to write as shared memory.
save_file(init_state, init)

ours, summary, our_wall, overflows = run_ddptrain(init, out)
theirs, torch_train_s, torch_wall = run_pytorch(init_state)

tokens = STEPS * BATCH * BLOCK
print(f"\n{a.config} {' '.join(SETS)}: {STEPS} steps of {BATCH} x {BLOCK} tokens ({tokens} tokens), validation "
      f"{EVAL_ITERS} x {EVAL_BATCH} windows ({len(y_val) * BLOCK} tokens)")
print(f"{'step':>6} {'ddptrain':>10} {'pytorch':>10} {'diff':>8}")
for s in eval_steps():
    o, t = ours.get(s), theirs[s]
    print(f"{s:6} {o:10.4f} {t:10.4f} {o - t:+8.4f}" if o is not None else f"{s:6} {'-':>10} {t:10.4f}")
our_tps = summary.get("tokens_per_s") or float("nan")
print(f"ddptrain ({CFG['amp']['opt_level']}): wall {our_wall:.1f} s, {our_tps:.0f} tokens/s training "
      f"({overflows} steps skipped on fp16 overflow)")
print(f"pytorch (fp32, {a.threads} threads): wall {torch_wall:.1f} s, {tokens / torch_train_s:.0f} tokens/s training")
if a.out:
    print(f"ddptrain's run: {out} (final checkpoint, metrics.jsonl, ddptrain.log, init.safetensors)")

final = ours.get(STEPS)
if final is None:
    print(f"MISMATCH ddptrain wrote no validation loss at step {STEPS}")
    sys.exit(1)
diff = abs(final - theirs[STEPS])
verdict = "OK" if diff <= a.tol else "MISMATCH"
print(f"{verdict} final validation loss: ddptrain {final:.4f}, PyTorch {theirs[STEPS]:.4f}, "
      f"|difference| {diff:.4f} (tolerance {a.tol:g})")
sys.exit(0 if diff <= a.tol else 1)
