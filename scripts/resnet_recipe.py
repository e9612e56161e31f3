"""An image classifier's whole training recipe, ddptrain against PyTorch: the
final test accuracies must agree within --tol.

torch_parity.py checks a few steps tensor by tensor on unaugmented digits;
this runs a config's own recipe (configs/resnet20_fashion_o2.toml by
default: its data, random crops and flips, SGD with Nesterov momentum,
warmup + cosine, epochs) once on each side and compares what the recipe is
for: the test accuracy after every epoch. PyTorch's model is built from
ddptrain's description of the config (torch_model.py) with PyTorch's
default init under torch.manual_seed(0); ddptrain starts from those weights
(model.init_from). Beyond that ddptrain trains with the config as it is (the
--set overrides, for a shorter run, go to both sides), only told where to
write, to stay quiet, to log every step and to checkpoint only the end.

PyTorch trains in fp32 on the same batches: --plan holds, for every epoch,
the training indices in the order ddptrain's sampler visits them and each
sample's crop corner and flip as ddptrain draws them (tests/
torch_parity_resnet.rs writes it with ddptrain's own sampler and
augmentation), applied as torchvision's RandomCrop(size, padding, fill) and
RandomHorizontalFlip would apply them. So the two runs see the same pixels in
the same order and differ only in arithmetic (ddptrain at the config's opt
level: O2 is fp16 compute with fp32 masters).

--loss-steps K also compares the training losses of the first K steps, which
depend on the init, the batches, the crops and flips, the learning rate and
the optimizer (relative tolerance --loss-tol): the check that the two runs
train on the same thing, before any accuracy is compared.

Prints each evaluation on both sides, the wall times and images/s; exit 0
when the final test accuracies differ by at most --tol (and the first losses
agree), 1 otherwise.

    PYTHON_WITH_TORCH scripts/resnet_recipe.py --bin target/release/ddptrain --plan plan.bin
"""
import argparse
import gzip
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import warnings

# Both sides train on the CPU: PyTorch must not open a device, and neither
# may ddptrain under run.device = "auto".
os.environ["CUDA_VISIBLE_DEVICES"] = ""
warnings.filterwarnings("ignore", message="CUDA initialization")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch_train as train_lib  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from torch_model import build, describe, dropout_masks  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--bin", required=True, help="the ddptrain binary (a release build: this is the whole recipe)")
p.add_argument("--config", default="configs/resnet20_fashion_o2.toml")
p.add_argument("--plan", required=True,
               help="little-endian u32 records (index, top, left, flip), one per visited sample, epoch after epoch")
p.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE",
               help="a ddptrain --set override, for both sides (repeatable; e.g. train.epochs=1)")
p.add_argument("--tol", type=float, default=0.003, help="largest allowed |final test accuracy difference|")
p.add_argument("--loss-steps", type=int, default=0, help="compare the training losses of this many first steps")
p.add_argument("--loss-tol", type=float, default=1e-3, help="largest relative difference of those losses")
p.add_argument("--threads", type=int, default=2, help="threads of each side (RAYON_NUM_THREADS, torch)")
p.add_argument("--concurrent", action="store_true",
               help="run ddptrain while PyTorch trains (give each side half the cores with --threads)")
p.add_argument("--out", help="ddptrain's run.out_dir, kept (default: a temporary directory)")
a = p.parse_args()
SETS = a.sets


CFG = train_lib.resolved_config(a.bin, a.config, SETS)
DESC = describe(a.bin, a.config, SETS)
opt, sched, train, data = CFG["optimizer"], CFG["scheduler"], CFG["train"], CFG["data"]
# What this script implements of a recipe; anything else would be compared against a different one.
refusals = [
    (data.get("dataset") not in ("mnist", "fashion_mnist", "cifar10"),
     f"data.dataset is {data.get('dataset')!r}: this reads mnist, fashion_mnist and cifar10"),
    (opt.get("name") != "sgd", f"optimizer.name is {opt.get('name')!r}: PyTorch's side here is SGD"),
    (opt.get("weight_decay_min_dim") is not None, "optimizer.weight_decay_min_dim is set: PyTorch's SGD "
                                                  "decays every parameter"),
    (sched.get("name") != "cosine", f"scheduler.name is {sched.get('name')!r}: PyTorch's side here is the cosine"),
    (train.get("grad_accum_steps", 1) != 1, "train.grad_accum_steps is not 1: PyTorch's side steps every batch"),
    (train.get("grad_clip_norm") is not None, "train.grad_clip_norm is set: PyTorch's side does not clip"),
    (data.get("drop_last", False), "data.drop_last is true: PyTorch's side keeps every epoch's last batch"),
    (bool(dropout_masks(DESC)), f"dropout with p > 0 at {', '.join(dropout_masks(DESC))}: its masks are not "
                                "PyTorch's; compare a copy of the config with p = 0"),
]
train_lib.refuse(a.config, refusals)
BATCH, EVAL_BATCH = data["batch_size"], data["eval_batch_size"]
MEAN, STD = np.array(data["mean"], np.float32), np.array(data["std"], np.float32)
CROP, FLIP = data.get("random_crop"), data.get("random_horizontal_flip")


def idx_file(name):
    """An IDX file of data.path, gzipped or not, as ddptrain finds it."""
    for path in (os.path.join(data["path"], name), os.path.join(data["path"], name + ".gz")):
        if os.path.exists(path):
            with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
                return f.read()
    sys.exit(f"{data['path']}: no {name} (or {name}.gz)")


def load(split):
    """(images [N, C, H, W] normalized f32, labels) of the train or test split, as ddptrain reads them."""
    if data["dataset"] == "cifar10":
        names = sorted((n for n in os.listdir(data["path"]) if n.startswith("data_batch_") and n.endswith(".bin")),
                       key=lambda n: int(n[len("data_batch_"):-len(".bin")]))
        names = names if split == "train" else ["test_batch.bin"]
        raw = np.concatenate([np.fromfile(os.path.join(data["path"], n), np.uint8) for n in names]).reshape(-1, 3073)
        labels, images = raw[:, 0].astype(np.int64), raw[:, 1:].reshape(-1, 3, 32, 32)
    else:
        prefix = "train" if split == "train" else "t10k"
        images = np.frombuffer(idx_file(f"{prefix}-images-idx3-ubyte"), np.uint8, offset=16).reshape(-1, 1, 28, 28)
        labels = np.frombuffer(idx_file(f"{prefix}-labels-idx1-ubyte"), np.uint8, offset=8).astype(np.int64)
    x = (images.astype(np.float32) / np.float32(255.0) - MEAN[None, :, None, None]) / STD[None, :, None, None]
    return x, labels


(x_train, y_train), (x_test, y_test) = load("train"), load("test")
N = len(y_train)
STEPS_PER_EPOCH = -(-N // BATCH)
# The trainer's run length: the shorter of train.epochs and train.max_steps.
STEPS = min(x for x in (train.get("epochs") and train["epochs"] * STEPS_PER_EPOCH, train.get("max_steps"))
            if x is not None)
EPOCHS = -(-STEPS // STEPS_PER_EPOCH)
PLAN = np.fromfile(a.plan, dtype="<u4")
if PLAN.size < EPOCHS * N * 4:
    sys.exit(f"{STEPS} steps over {N} samples need {EPOCHS} epochs of plan, {a.plan} has {PLAN.size / (4 * N):g}")
PLAN = PLAN[: EPOCHS * N * 4].reshape(EPOCHS, N, 4).astype(np.int64)


def augment(x, draws):
    """RandomCrop(size, padding, fill) then RandomHorizontalFlip of images `x`
    with ddptrain's draws (top, left, flip per image): padding with the
    normalized fill is torchvision padding the uint8 image, then normalizing."""
    if CROP is None and FLIP is None:
        return x
    b, c, h, w = x.shape
    pad, size = (CROP["padding"], CROP["size"]) if CROP else (0, h)
    fill = (np.float32(CROP.get("fill", 0) if CROP else 0) / np.float32(255.0) - MEAN) / STD
    padded = np.empty((b, c, h + 2 * pad, w + 2 * pad), np.float32)
    padded[:] = fill[None, :, None, None]
    padded[:, :, pad : pad + h, pad : pad + w] = x
    rows = draws[:, 0, None] + np.arange(size)
    cols = draws[:, 1, None] + np.arange(size)
    cols = np.where(draws[:, 2, None] == 1, cols[:, ::-1], cols)
    return padded[np.arange(b)[:, None, None, None], np.arange(c)[None, :, None, None],
                  rows[:, None, :, None], cols[:, None, None, :]]


def batch(step):
    """The images and labels of 0-based training step `step`."""
    e, s = divmod(step, STEPS_PER_EPOCH)
    rows = PLAN[e, s * BATCH : (s + 1) * BATCH]
    return torch.from_numpy(augment(x_train[rows[:, 0]], rows[:, 1:])), torch.from_numpy(y_train[rows[:, 0]])


def lr_at(step):
    return train_lib.lr_at(step, opt["lr"], sched.get("warmup_steps", 0), STEPS, sched.get("eta_min", 0.0))


def eval_steps():
    """ddptrain's evaluations: at the end of every epoch, and after the last step."""
    return sorted({min((e + 1) * STEPS_PER_EPOCH, STEPS) for e in range(EPOCHS)})


def ddptrain_results(out):
    """{step: test accuracy}, {step: training loss} and the summary of ddptrain's run in `out`."""
    records, summary, overflows = train_lib.run_records(out)
    evals = {m["step"]: m["test_accuracy"] for m in records if m.get("kind") == "eval"}
    losses = {m["step"]: m["loss"] for m in records if m.get("kind") == "train"}
    return evals, losses, summary, overflows


def accuracy(model):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y_test), EVAL_BATCH):
            logits = model(torch.from_numpy(x_test[i : i + EVAL_BATCH]))
            correct += int((logits.argmax(1) == torch.from_numpy(y_test[i : i + EVAL_BATCH])).sum())
    model.train()
    return correct / len(y_test)


def run_pytorch(init_state):
    """PyTorch on the same recipe, batches and init: {step: test accuracy}, {step: loss}, training s, wall s."""
    t0 = time.perf_counter()
    torch.set_num_threads(a.threads)
    model = build(DESC)
    model.load_state_dict(init_state, strict=True)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=opt["lr"], momentum=opt["momentum"],
                                dampening=opt["dampening"], nesterov=opt["nesterov"], weight_decay=opt["weight_decay"])
    at = set(eval_steps())
    evals, losses, train_s = {}, {}, 0.0
    for s in range(STEPS):
        ts = time.perf_counter()
        x, y = batch(s)
        for g in optimizer.param_groups:
            g["lr"] = lr_at(s)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        train_s += time.perf_counter() - ts
        losses[s + 1] = loss.item()
        if not math.isfinite(losses[s + 1]):
            sys.exit(f"PyTorch's loss is {losses[s + 1]} at step {s + 1}")
        if s + 1 in at:
            evals[s + 1] = accuracy(model)
            print(f"pytorch step {s + 1}: loss {losses[s + 1]:.4f}, test accuracy {evals[s + 1]:.4f}", flush=True)
    return evals, losses, train_s, time.perf_counter() - t0


torch.manual_seed(0)
init_state = {k: v.clone() for k, v in build(DESC).state_dict().items()}
tmp = tempfile.TemporaryDirectory()
out = a.out or os.path.join(tmp.name, "out")
os.makedirs(out, exist_ok=True)
init = os.path.join(out, "init.safetensors")
save_file(init_state, init)

cmd = train_lib.recipe_command(a.bin, a.config, SETS, init, out, ["logging.every_steps=1"])
print("ddptrain:", " ".join(cmd), flush=True)
env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads))
t0 = time.perf_counter()
ended = {}


def wait_for(proc):
    proc.wait()
    ended["ddptrain"] = time.perf_counter()


with open(os.path.join(out, "ddptrain.log"), "w") as log:
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    # ddptrain's wall time is its own even while PyTorch trains beside it.
    waiter = threading.Thread(target=wait_for, args=(proc,))
    waiter.start()
    if not a.concurrent:
        waiter.join()
    theirs, their_losses, torch_train_s, torch_wall = run_pytorch(init_state)
    waiter.join()
our_wall = ended["ddptrain"] - t0
# 3: the run finished but missed a gate of the config's [expect]; the comparison still stands.
if proc.returncode not in (0, 3):
    with open(os.path.join(out, "ddptrain.log")) as f:
        sys.exit(f"ddptrain failed ({proc.returncode}):\n{f.read()}")
ours, our_losses, summary, overflows = ddptrain_results(out)

failures = []
if a.loss_steps:
    print(f"{'step':>6} {'loss ddptrain':>14} {'loss pytorch':>14} {'rel':>9}")
    for s in range(1, min(a.loss_steps, STEPS) + 1):
        o, t = our_losses.get(s), their_losses[s]
        rel = abs(o - t) / abs(t) if o is not None else math.inf
        print(f"{s:6} {o if o is not None else float('nan'):14.6f} {t:14.6f} {rel:9.2e}")
        if rel > a.loss_tol:
            failures.append(f"step {s}'s loss: ddptrain {o}, PyTorch {t} (relative {rel:.2e} > {a.loss_tol:g})")

images = sum(min(BATCH, N - (s % STEPS_PER_EPOCH) * BATCH) for s in range(STEPS))
print(f"\n{a.config} {' '.join(SETS)}: {STEPS} steps of {BATCH} ({images} training images), "
      f"{len(y_test)} test images")
print(f"{'step':>6} {'ddptrain':>9} {'pytorch':>9} {'diff':>8}")
for s in eval_steps():
    o, t = ours.get(s), theirs[s]
    print(f"{s:6} {o:9.4f} {t:9.4f} {o - t:+8.4f}" if o is not None else f"{s:6} {'-':>9} {t:9.4f}")
ips = summary.get("images_per_s") or float("nan")
side = "concurrently, " if a.concurrent else ""
print(f"ddptrain ({CFG['amp']['opt_level']}, {side}{a.threads} threads): wall {our_wall:.1f} s, {ips:.0f} images/s "
      f"training ({overflows} steps skipped on fp16 overflow)")
print(f"pytorch (fp32, {side}{a.threads} threads): wall {torch_wall:.1f} s, {images / torch_train_s:.0f} images/s "
      "training")
if a.out:
    print(f"ddptrain's run: {out} (final checkpoint, metrics.jsonl, ddptrain.log, init.safetensors)")

final = ours.get(STEPS)
if final is None:
    failures.append(f"ddptrain wrote no test accuracy at step {STEPS}")
elif abs(final - theirs[STEPS]) > a.tol:
    failures.append(f"final test accuracy: ddptrain {final:.4f}, PyTorch {theirs[STEPS]:.4f} "
                    f"(|difference| {abs(final - theirs[STEPS]):.4f} > {a.tol:g})")
else:
    print(f"OK final test accuracy: ddptrain {final:.4f}, PyTorch {theirs[STEPS]:.4f}, "
          f"|difference| {abs(final - theirs[STEPS]):.4f} (tolerance {a.tol:g})")
for f in failures:
    print(f"MISMATCH {f}")
sys.exit(1 if failures else 0)
