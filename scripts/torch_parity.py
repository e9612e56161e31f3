"""ddptrain vs PyTorch on the model of --config (default configs/mnist_o0.toml),
tensor by tensor.

PyTorch's model is built from ddptrain's description of the config
(`ddptrain check --json`, scripts/torch_model.py). Both start from the same
weights (PyTorch's default init, handed to ddptrain through
model.init_from), see the same MNIST digits in the same order and take
--steps optimizer steps (SGD with the seed config's momentum and weight
decay, or AdamW) under the same warmup + cosine learning rate, in fp32, at
batch 100. The config contributes its model, its seed (through --order) and
its gradient clipping; the rest of the recipe is set on ddptrain's command
line, so any config with 1x28x28 inputs and 10 classes is checked the same
way. ddptrain checkpoints every step. Three checks:

1. Step by step. For each step k, PyTorch loads ddptrain's checkpoint of step
   k-1 (model with load_state_dict(strict=True), optimizer state, step count),
   takes step k on the same batch and must land on ddptrain's checkpoint of
   step k. Both sides start each step from the same bits, so one step of fp32
   rounding is all that separates them:
   - the loss and the BatchNorm running statistics come from the forward
     pass and are compared to FORWARD_TOL of their scale (seen: 2e-7 for
     the loss); num_batches_tracked must be equal;
   - the gradient norm is compared to NORM_TOL (seen: 2e-6, and 1.2e-5 at
     the step where a max-pool window's gradient went to another pixel on
     each side, below);
   - each parameter's update (its change over the step) and the optimizer
     state come from the gradients and are compared to GRAD_TOL of their
     scale; under AdamW, which moves every element by about lr whatever its
     gradient's size, the update is PyTorch's AdamW step on ddptrain's own
     gradient (adamw_replay says why) and the gradients are held to
     PyTorch's through the moments. PyTorch's own fp32 gradients differ by up to 3e-4 of their scale
     between 1 and 2 threads (conv1's, whose gradient comes out of
     BatchNorm's backward as a difference of near-equal terms), and ddptrain
     differs from PyTorch by about as much (1e-4). Where a max-pool window
     holds two values within the two sides' rounding difference, each side
     can route that window's gradient to a different pixel: with conv2 as
     Winograd F(4x4, 5x5) (~2e-6 rms rounding against ~4e-7 direct), AdamW's
     step 20 measured 1.7e-3 in layer2.0.weight.exp_avg and step 5 4.3e-4,
     every other step and tensor at most 2.2e-4; configs/ci_smoke.toml's
     AdamW step 10 3.4e-3 in layer2.0.weight.exp_avg, whose gradient there
     differs from PyTorch's float64 one by 9e-3 in output channel 26 and by
     at most 4e-6 in every other channel: one window routed differently.
     GRAD_TOL is 5e-3: a 1% error in the learning rate moves every update
     by 1e-2 and still fails it. A ReLU whose input lies within the two
     sides' rounding difference of zero passes its gradient on one side and
     blocks it on the other, and every layer below inherits the difference:
     with Winograd F(6x6, 3x3) (3x3 convs, ~2-3e-6 rms rounding) the MNIST
     ResNet's AdamW step 1 differed by 0.14 of an update. So ddptrain trains
     here on its direct conv kernels (`--direct-convs`), as in the device
     parity tests; Winograd is held to those kernels conv by conv and
     through a ReLU-free ResNet-20 (src/ops/conv2d/tests_winograd.rs,
     tests/cli_train.rs).
2. Free running. PyTorch trains alone from the shared init; ddptrain's final
   checkpoint and per-step losses are compared against it. Over 20 steps the
   training itself amplifies step 1's rounding differences (about 10x a step
   at first), so PyTorch lands about as far from itself as from ddptrain.
   Measured at 20 steps on this machine, worst tensor / worst loss:
   PyTorch at 1 thread against 2 threads, SGD 4e-2 / 4e-3, AdamW 1.4e-1 /
   3e-4; ddptrain against PyTorch, SGD 3e-2 to 1.3e-1 / 1e-3 to 1.3e-2,
   AdamW 1.9e-1 / 2e-4. FREE_TOL and FREE_LOSS_TOL are ~3x the worst of
   those: this check only catches a gross drift (a 1% larger SGD learning
   rate moves a loss by 1.8e-1); check 1 is the sharp one.
3. The final checkpoint in PyTorch. Its model.safetensors, loaded with
   load_state_dict(strict=True) and evaluated on the test digits, must count
   the same correct digits as ddptrain's own final evaluation. The two
   forward passes agree to ~1e-6 (check 1), so only a digit whose two
   largest logits are that close can be counted on one side only: each one
   within MARGIN (1e-3) is allowed to (seen: 0 or 1 such digits, and equal
   counts every time).

A conv bias that only BatchNorm reads (BN_CANCELLED) has a gradient of exactly 0 in
real arithmetic (BatchNorm subtracts the batch mean), so what either side
computes for it is rounding noise: its gradient-derived tensors are measured
against its layer's weight's scale, and under AdamW, which divides that noise
by its own size and so moves the bias by about lr in a random direction, its
value is left to check 3 (its effect survives only in running_mean, which is
compared).

--device cuda trains ddptrain on the GPU (the emulated one under
scripts/emulated-gpu.sh) against the same PyTorch on the CPU, with the same
tolerances: the device path keeps the CPU's numerics contract.

--order names a JSON list of training-set indices in the order ddptrain visits
them (tests/torch_parity.rs writes it from ddptrain's DistributedSampler);
without it both sides read the digits in file order (data.shuffle = false).

A language model (a config with dataset = "text", built as nanoGPT's GPT by
torch_model.py) is fed --windows instead of digits: a JSON object whose
"train" is the token windows (block_size + 1 ids each) ddptrain's steps
read, in order, and whose "val" is its validation windows
(tests/torch_parity.rs draws both with ddptrain's own sampler and window
draws). ddptrain reads the config's text at --data; the loss is nanoGPT's
cross-entropy over [B*T, V]; AdamW has nanoGPT's two parameter groups (weight
decay on parameters of 2 or more dimensions only). Check 3 becomes the
validation loss of the final checkpoint, loaded strict=True, against
ddptrain's final evaluation, within VAL_LOSS_TOL.
Exit 0 when everything agrees, 1 otherwise (each mismatch on a MISMATCH line).

    PYTHON_WITH_TORCH scripts/torch_parity.py --bin target/release/ddptrain --config configs/mnist_o2.toml \
        --optimizer adamw --steps 20
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import tomllib
import warnings

# PyTorch runs on the CPU: keep it from opening a device (the emulated
# libcuda when scripts/emulated-gpu.sh runs this), and hand ddptrain the
# devices this process was given.
DEVICES = os.environ.get("CUDA_VISIBLE_DEVICES")
os.environ["CUDA_VISIBLE_DEVICES"] = ""
# Autograd still asks the CUDA runtime for a device count; the emulated
# libcuda does not implement what that query calls, and PyTorch warns.
warnings.filterwarnings("ignore", message="CUDA initialization")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from torch_model import build, describe, dropout_masks  # noqa: E402
import torch_train as train_lib  # noqa: E402

FORWARD_TOL = 1e-5
NORM_TOL = 1e-4
GRAD_TOL = 5e-3
FREE_TOL = 0.5
FREE_LOSS_TOL = 0.05
MARGIN = 1e-3
VAL_LOSS_TOL = 1e-3
WARMUP = 5
# The seed config's SGD, and torch.optim.AdamW's defaults but for the learning rate.
OPTIMIZERS = {
    "sgd": dict(lr=0.05, momentum=0.9, weight_decay=5e-4),
    "adamw": dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
}
STATE_KEYS = {"sgd": ["momentum_buffer"], "adamw": ["exp_avg", "exp_avg_sq"]}
# The MNIST normalization the data is read with here (the seed configs' data.mean / data.std).
MEAN, STD = 0.1307, 0.3081

p = argparse.ArgumentParser()
p.add_argument("--bin", required=True)
p.add_argument("--config", default="configs/mnist_o0.toml", help="the config whose model is checked")
p.add_argument("--data", default="data/mnist")
p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="sgd")
p.add_argument("--steps", type=int, default=1)
p.add_argument("--order", help="JSON list of the training indices ddptrain visits, in order")
p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where ddptrain trains (PyTorch: the CPU)")
p.add_argument("--lr-scale", type=float, default=1.0, help="multiplies PyTorch's lr only (to see the checks fail)")
p.add_argument("--windows", help="a text config's token windows as JSON: {train: [...], val: [...]}")
p.add_argument("--batch", type=int, default=100, help="data.batch_size (the seed config's by default)")
a = p.parse_args()
hp = OPTIMIZERS[a.optimizer]
BATCH = a.batch
TEXT = a.windows is not None


def ddptrain_env():
    """This process's environment with the devices it was given restored."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    if DEVICES is not None:
        env["CUDA_VISIBLE_DEVICES"] = DEVICES
    return env


def bn_cancelled(desc):
    """{conv bias: its weight} for each conv2d whose output only a batchnorm2d reads."""
    readers = {}
    for node in desc["nodes"]:
        for v in node["inputs"]:
            readers.setdefault(v, []).append(node["type"])
    return {
        f"{n['name']}.bias": f"{n['name']}.weight"
        for i, n in enumerate(desc["nodes"])
        if n["type"] == "conv2d" and n["args"]["bias"] and readers.get(i + 1) == ["batchnorm2d"]
        and desc["output"] != i + 1
    }


# The data ddptrain trains on, on the device it trains on: check's preflight looks for both.
DESC = describe(a.bin, a.config, [f"data.path={a.data}", f'run.device="{a.device}"'], env=ddptrain_env())
if TEXT:
    if len(DESC["input_shape"]) != 1:
        sys.exit(f"{a.config}: the model takes {DESC['input_shape']} inputs; --windows feeds it [block_size] tokens")
elif DESC["input_shape"] != [1, 28, 28]:
    sys.exit(f"{a.config}: the model takes {DESC['input_shape']} inputs; this check feeds it 1x28x28 digits")
elif DESC["nodes"][DESC["output"] - 1]["out_shape"] != [10]:
    sys.exit(f"{a.config}: the model outputs {DESC['nodes'][DESC['output'] - 1]['out_shape']}; "
             "this check scores 10 digit classes")
if dropout_masks(DESC):
    sys.exit(f"{a.config}: dropout with p > 0 at {', '.join(dropout_masks(DESC))}: its masks are not "
             "PyTorch's, so training steps cannot agree; compare a copy of the config with p = 0")
# Every key a parameter is known by (a tied weight by both of its names).
PARAM_NAMES = [n for n, _ in build(DESC).named_parameters(remove_duplicate=False)]
BN_CANCELLED = bn_cancelled(DESC)
with open(a.config, "rb") as f:
    # Gradient clipping is part of a config's recipe that --set cannot turn
    # off (train.grad_clip_norm has no "none" value), so PyTorch clips as it does.
    GRAD_CLIP = tomllib.load(f).get("train", {}).get("grad_clip_norm")


def idx(path, offset):
    with open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def mnist(split):
    images = idx(os.path.join(a.data, f"{split}-images-idx3-ubyte"), 16).reshape(-1, 1, 28, 28)
    labels = idx(os.path.join(a.data, f"{split}-labels-idx1-ubyte"), 8).astype(np.int64)
    x = (torch.from_numpy(images.astype(np.float32)) / 255.0 - MEAN) / STD
    return x, torch.from_numpy(labels)


def lr_at(step):
    """ddptrain's schedule for 0-based `step`: warmup, then cosine to 0 over the rest."""
    return train_lib.lr_at(step, hp["lr"], WARMUP, a.steps) * a.lr_scale


def run_ddptrain(init, out, trace_path):
    # Everything of the recipe but the model, the seed and the clipping, whatever the config says.
    # A text config keeps its dataset, vocabulary and validation stream: the windows come from them.
    data = [] if TEXT else ['data.dataset="mnist"', f"data.shuffle={'true' if a.order else 'false'}",
                            f"data.mean=[{MEAN}]", f"data.std=[{STD}]"]
    sets = data + [
        f"model.init_from={init}", f"data.path={a.data}", f"data.batch_size={BATCH}",
        'amp.opt_level="O0"', "train.grad_accum_steps=1",
        f"train.max_steps={a.steps}", 'scheduler.name="cosine"', f"scheduler.warmup_steps={WARMUP}",
        "scheduler.eta_min=0.0", f'optimizer.name="{a.optimizer}"', f"optimizer.lr={hp['lr']}",
        f"optimizer.weight_decay={hp['weight_decay']}", f"optimizer.momentum={hp.get('momentum', 0.0)}",
        "optimizer.dampening=0.0", "optimizer.nesterov=false",
        f"run.out_dir={out}", f'run.device="{a.device}"', "checkpoint.every_steps=1", f"checkpoint.keep_last={a.steps + 1}",
        "logging.progress=never", "logging.tensorboard=false",
    ]
    if a.optimizer == "adamw":
        sets += [f"optimizer.betas=[{hp['betas'][0]}, {hp['betas'][1]}]", f"optimizer.eps={hp['eps']}"]
    # --direct-convs: no Winograd F(6x6, 3x3) (see check 1 in the docstring).
    cmd = [a.bin, "--config", a.config, "--record-trace", trace_path, "--direct-convs"]
    r = subprocess.run(cmd + [x for s in sets for x in ("--set", s)], capture_output=True, text=True,
                       env=ddptrain_env())
    # 3: the run finished, but a gate of the config's [expect] (set for its
    # own recipe, not 20 steps of this one) was missed; that is no failure here.
    if r.returncode not in (0, 3):
        sys.exit(f"ddptrain failed ({r.returncode}):\n{r.stdout}{r.stderr}")


def make_optimizer(model):
    params = train_lib.nanogpt_groups(model, hp["weight_decay"]) if TEXT else model.parameters()
    if a.optimizer == "sgd":
        return torch.optim.SGD(params, foreach=False, **hp)
    return torch.optim.AdamW(params, foreach=False, **hp)


def train_step(model, opt, s):
    """PyTorch's step s (0-based); returns its loss and the total gradient norm
    (what clip_grad_norm_ returns, summed in f64 as ddptrain's trace is)."""
    batch = order[s * BATCH : (s + 1) * BATCH]
    for g in opt.param_groups:
        g["lr"] = lr_at(s)
    loss = train_lib.loss_of(model, x_train[batch], y_train[batch])
    opt.zero_grad()
    loss.backward()
    grad_norm = math.sqrt(sum(p.grad.double().pow(2).sum().item() for p in model.parameters()))
    if GRAD_CLIP is not None:
        nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP, foreach=False)
    opt.step()
    return loss.item(), grad_norm


def state_of(model, opt):
    """A PyTorch model and optimizer as ddptrain checkpoints them: state_dict
    tensors, and optimizer state under optim.safetensors' names."""
    tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for name, param in model.named_parameters():
        for key in STATE_KEYS[a.optimizer]:
            if key in opt.state[param]:
                tensors[f"{name}.{key}"] = opt.state[param][key].clone()
    return tensors


def load_into(model, opt, ckpt, step):
    """ddptrain's checkpoint after `step` steps into PyTorch's model and optimizer."""
    model.load_state_dict({k: v for k, v in ckpt.items() if k in model.state_dict()}, strict=True)
    for name, param in model.named_parameters():
        # PyTorch creates a parameter's state at its first step, from an empty dict.
        st = {key: ckpt[f"{name}.{key}"].clone() for key in STATE_KEYS[a.optimizer] if f"{name}.{key}" in ckpt}
        if st and a.optimizer == "adamw":
            st["step"] = torch.tensor(float(step))
        opt.state[param] = st


def kind(name):
    if name in PARAM_NAMES:
        return "param"
    if name.endswith("num_batches_tracked"):
        return "count"
    if name.startswith(tuple(f"{p}." for p in PARAM_NAMES)):
        return "optim"
    return "buffer"


def compare(ours, ref, before=None):
    """{name: difference relative to its scale} over the tensors of both.
    Without `before`, each tensor is compared by max |diff| / max |PyTorch|
    (a BN-cancelled bias's tensors against its layer's weight's scale). With
    `before`, the state both sides started the step from, parameters are
    compared by their update over the step, as the norm of the difference over
    the norm of PyTorch's update: Adam divides each element by its own
    gradient's size, so an element whose gradient is nearly 0 turns the
    gradients' rounding noise into an O(1) change of its own update, which
    the norm weighs by its size only once the second moment has a history:
    AdamW's parameters are compared by adamw_replay instead. BN-cancelled
    biases' updates are rounding noise times lr and are left out here."""
    out = {}
    for name in sorted(set(ours) | set(ref)):
        if name not in ours or name not in ref:
            failures.append(f"{name} is missing on the {'ddptrain' if name not in ours else 'PyTorch'} side")
            continue
        o, t = ours[name].double(), ref[name].double()
        if o.shape != t.shape:
            failures.append(f"{name} has shape {tuple(o.shape)}, PyTorch {tuple(t.shape)}")
            continue
        if before is not None and kind(name) == "param":
            if name in BN_CANCELLED:
                continue
            du, dt = o - before[name].double(), t - before[name].double()
            out[name] = ratio((du - dt).norm().item(), dt.norm().item())
            continue
        scale = t.abs().max().item()
        for bias, weight in BN_CANCELLED.items():
            if name.startswith(bias) and weight + name[len(bias) :] in ref:
                scale = max(scale, ref[weight + name[len(bias) :]].double().abs().max().item())
        out[name] = ratio((o - t).abs().max().item(), scale)
    return out


def adamw_replay(k):
    """{parameter: difference of ddptrain's step-k update from PyTorch's
    AdamW given ddptrain's own gradient}, relative to the update's norm.
    AdamW moves an element by about lr * sign(g) whatever its gradient's
    size (at step 1 exactly: m / sqrt(v) = g / |g|), so an element whose
    gradient lies within the two sides' rounding difference of zero moves
    by +lr on one side and -lr on the other: the MNIST ResNet's conv1 at
    step 1 has gradients of 4.5e-7 and 8.2e-7 against a largest 0.051 (1e-5
    of its scale, where the two sides' gradients agree to 2.3e-4) whose
    signs differ, 0.14 of the update's norm. So the gradients are held to
    PyTorch's through the moments (exp_avg, exp_avg_sq against PyTorch's,
    element by element), and the update to PyTorch's AdamW step taken from
    ddptrain's checkpoint k-1 with the gradient ddptrain's moments imply
    (g = (m_k - beta1 m_{k-1}) / (1 - beta1), clipping already in it)."""
    load_into(replay, replay_opt, ckpts[k - 1], k - 1)
    beta1 = hp["betas"][0]
    for group in replay_opt.param_groups:
        group["lr"] = lr_at(k - 1)
    params = dict(replay.named_parameters())
    for name, p in params.items():
        m_prev = ckpts[k - 1].get(f"{name}.exp_avg")
        m = ckpts[k][f"{name}.exp_avg"].double()
        g = (m - beta1 * m_prev.double()) / (1 - beta1) if m_prev is not None else m / (1 - beta1)
        p.grad = g.to(p.dtype)
    replay_opt.step()
    out = {}
    for name, p in params.items():
        before = ckpts[k - 1][name].double()
        du, dt = ckpts[k][name].double() - before, p.detach().double() - before
        out[name] = ratio((du - dt).norm().item(), dt.norm().item())
    return out


def ratio(d, scale):
    return d / scale if scale > 0 else d


def rel(x, y):
    return abs(x - y) / max(abs(y), 1e-30)


if TEXT:
    with open(a.windows) as f:
        WINDOWS = json.load(f)
    x_train, y_train = train_lib.windows(WINDOWS["train"])
    x_test, y_test = train_lib.windows(WINDOWS["val"])
else:
    x_train, y_train = mnist("train")
    x_test, y_test = mnist("t10k")
if a.order:
    with open(a.order) as f:
        order = torch.tensor(json.load(f), dtype=torch.int64)
else:
    order = torch.arange(len(y_train))
if len(order) < a.steps * BATCH:
    sys.exit(f"{a.steps} steps of {BATCH} need {a.steps * BATCH} indices, --order has {len(order)}")

torch.manual_seed(0)
model = build(DESC)
init_state = {k: v.clone() for k, v in model.state_dict().items()}
with tempfile.TemporaryDirectory() as tmp:
    init = os.path.join(tmp, "init.safetensors")
    # The copies: a tied weight is one tensor under two keys, which
    # safetensors refuses to write as shared memory.
    save_file(init_state, init)
    trace_path = os.path.join(tmp, "trace.jsonl")
    out = os.path.join(tmp, "out")
    run_ddptrain(init, out, trace_path)
    ckpts = [init_state]
    for k in range(1, a.steps + 1):
        d = os.path.join(out, "ckpt", f"step_{k:08d}")
        ckpts.append({**load_file(os.path.join(d, "model.safetensors")), **load_file(os.path.join(d, "optim.safetensors"))})
    with open(trace_path) as f:
        trace = [json.loads(line) for line in f]
    with open(os.path.join(out, "metrics.jsonl")) as f:
        evals = [m for m in map(json.loads, f) if m.get("kind") == "eval"]

failures = []
if len(trace) != a.steps:
    failures.append(f"ddptrain's trace has {len(trace)} steps, expected {a.steps}")

# 1. Step by step, each from ddptrain's previous checkpoint.
torch.set_num_threads(2)
print(f"check 1: step k from ddptrain's checkpoint k-1 (forward {FORWARD_TOL:g}, gradient norm {NORM_TOL:g}, "
      f"gradients {GRAD_TOL:g})")
print(f"{'step':>4} {'lr':>10} {'loss ddptrain':>14} {'loss pytorch':>14} {'rel':>9} {'grad norm':>9} "
      f"{'buffers':>9} {'updates':>9} {'optim':>9}  worst gradient tensor")
stepper = build(DESC)
step_opt = make_optimizer(stepper)
replay = build(DESC)
replay_opt = make_optimizer(replay)
worst_step = {"forward": 0.0, "norm": 0.0, "grad": 0.0}
for k in range(1, min(a.steps, len(trace)) + 1):
    load_into(stepper, step_opt, ckpts[k - 1], k - 1)
    loss, grad_norm = train_step(stepper, step_opt, k - 1)
    per_kind = {"param": (0.0, ""), "buffer": (0.0, ""), "optim": (0.0, ""), "count": (0.0, "")}
    results = compare(ckpts[k], state_of(stepper, step_opt), before=ckpts[k - 1])
    if a.optimizer == "adamw":
        results.update(adamw_replay(k))
    for name, r in results.items():
        kd = kind(name)
        tol = {"buffer": FORWARD_TOL, "count": 0.0}.get(kd, GRAD_TOL)
        if not r <= tol:
            failures.append(f"step {k}: {name} differs by {r:.2e} of its scale (tolerance {tol:g})")
        per_kind[kd] = max(per_kind[kd], (r, name))
    dl, dg = rel(float(trace[k - 1]["loss"]), loss), rel(float(trace[k - 1]["grad_norm"]), grad_norm)
    for what, r, tol in (("loss", dl, FORWARD_TOL), ("gradient norm", dg, NORM_TOL)):
        if not r <= tol:
            failures.append(f"step {k}: the {what} differs by {r:.2e} (tolerance {tol:g})")
    worst_step["forward"] = max(worst_step["forward"], dl, per_kind["buffer"][0])
    worst_step["norm"] = max(worst_step["norm"], dg)
    worst_step["grad"] = max(worst_step["grad"], per_kind["param"][0], per_kind["optim"][0])
    print(f"{k:4} {lr_at(k - 1):10.3e} {float(trace[k - 1]['loss']):14.8f} {loss:14.8f} {dl:9.2e} {dg:9.2e} "
          f"{per_kind['buffer'][0]:9.2e} {per_kind['param'][0]:9.2e} {per_kind['optim'][0]:9.2e}  "
          f"{max(per_kind['param'], per_kind['optim'])[1]}")

# 2. Free running from the shared init.
free = build(DESC)
free.load_state_dict(init_state, strict=True)
free_opt = make_optimizer(free)
free_losses = [train_step(free, free_opt, s)[0] for s in range(a.steps)]
print(f"\ncheck 2: free running, ddptrain's final checkpoint against PyTorch's (tolerance {FREE_TOL:g})")
free_worst = 0.0
for name, r in compare(ckpts[-1], state_of(free, free_opt)).items():
    print(f"{name:40} {r:10.2e}")
    tol = 0.0 if kind(name) == "count" else FREE_TOL
    if not r <= tol:
        failures.append(f"free running: {name} differs by {r:.2e} of its scale (tolerance {tol:g})")
    free_worst = max(free_worst, r)
free_loss = max((rel(float(t["loss"]), x) for t, x in zip(trace, free_losses)), default=0.0)
print(f"{'worst per-step loss':40} {free_loss:10.2e} (tolerance {FREE_LOSS_TOL:g})")
if not free_loss <= FREE_LOSS_TOL:
    failures.append(f"free running: a step's loss differs by {free_loss:.2e} (tolerance {FREE_LOSS_TOL:g})")

# 3. The final checkpoint scored in PyTorch.
scored = build(DESC)
scored.load_state_dict({k: v for k, v in ckpts[-1].items() if k in scored.state_dict()}, strict=True)
scored.eval()
if TEXT:
    val = train_lib.mean_loss(scored, x_test, y_test, BATCH)
    last = evals[-1] if evals else None
    if last is None or "val_loss" not in last:
        failures.append("ddptrain wrote no validation loss to metrics.jsonl")
    else:
        print(f"\ncheck 3: validation loss: ddptrain {last['val_loss']:.6f} over {last['tokens']} tokens, its final "
              f"checkpoint in PyTorch {val:.6f} over {y_test.numel()} (tolerance {VAL_LOSS_TOL:g})")
        if last["tokens"] != y_test.numel() or not abs(last["val_loss"] - val) <= VAL_LOSS_TOL:
            failures.append(f"validation loss: ddptrain {last['val_loss']:.6f}, PyTorch {val:.6f}")
else:
    with torch.no_grad():
        logits = torch.cat([scored(x_test[i : i + 1000]) for i in range(0, len(y_test), 1000)])
    correct = int((logits.argmax(1) == y_test).sum())
    top2 = logits.topk(2, dim=1).values
    near_ties = int((top2[:, 0] - top2[:, 1] < MARGIN).sum())
    last = evals[-1] if evals else None
    if last is None:
        failures.append("ddptrain wrote no evaluation to metrics.jsonl")
    else:
        print(
            f"\ncheck 3: test set: ddptrain {last['correct']}/{last['total']} correct, its final checkpoint in PyTorch "
            f"{correct}/{len(y_test)} ({near_ties} near-ties under {MARGIN:g})"
        )
        if last["total"] != len(y_test) or abs(last["correct"] - correct) > near_ties:
            failures.append(
                f"test accuracy: ddptrain counts {last['correct']}/{last['total']}, PyTorch {correct}/{len(y_test)} "
                f"with {near_ties} near-ties"
            )

print(
    f"\n{a.steps} {a.optimizer} steps: step by step worst forward {worst_step['forward']:.2e} (tolerance "
    f"{FORWARD_TOL:g}), gradient norm {worst_step['norm']:.2e} (tolerance {NORM_TOL:g}), gradients "
    f"{worst_step['grad']:.2e} (tolerance {GRAD_TOL:g}); free running worst "
    f"{free_worst:.2e} (tolerance {FREE_TOL:g}), loss {free_loss:.2e} (tolerance {FREE_LOSS_TOL:g})"
)
for f in failures:
    print(f"MISMATCH {f}")
sys.exit(1 if failures else 0)
