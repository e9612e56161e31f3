"""PyTorch twin of scripts/bench.sh: the model of --config (default the seed
ConvNet, configs/mnist_o0.toml, as scripts/torch_model.py builds it from
`BIN check --json`, BIN being --bin, else $BIN, else target/release/ddptrain;
or --json FILE, a saved description), SGD(momentum 0.9, wd 5e-4; --nesterov for Nesterov momentum), synthetic
data, the same batch and thread count. Prints training images/s.
--device cuda runs it on the GPU (data on the device, as ddptrain keeps it);
--amp adds autocast(float16) + GradScaler, PyTorch's own mixed precision.
On the CPU, --layout channels_last keeps the model and the images in NHWC
(oneDNN's preferred layout), and --compile wraps the model in torch.compile
(compiled during the --warmup steps, default 20, not timed).
--world N (CPU only) runs N processes (torch.multiprocessing) under
DistributedDataParallel with the gloo backend on loopback, each with
--threads threads and batch --batch/N, so --batch stays the global batch; it
prints the global images/s (timed by rank 0 between barriers after the warmup
steps). --bucket-cap-mb sets DDP's bucket_cap_mb (PyTorch's default when
left out).
--layouts nchw,channels_last measures the layouts one after the other in this
one process (each from a fresh model, optimizer and data, with its own warmup)
and prints one "LAYOUT images/s" line per layout, in the order given.
A language model (a text config, input [block_size]; nanoGPT's GPT as
torch_model.py builds it) trains on random token windows with AdamW (lr
1e-3, betas (0.9, 0.99), weight decay 0.1 on the 2-D and larger parameters,
as nanoGPT's groups), cross-entropy over [B*T, V], and the figure printed is
training tokens/s."""
import argparse
import os
import socket
import time

import torch
import torch.nn as nn
from torch_model import add_description_args, build, description_from_args


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--device", default="cpu")
    p.add_argument("--amp", action="store_true")
    p.add_argument("--layout", choices=["nchw", "channels_last"], default="nchw")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--bucket-cap-mb", type=float, default=None)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--layouts", type=lambda v: v.split(","), default=None)
    p.add_argument("--nesterov", action="store_true")
    add_description_args(p)
    p.set_defaults(
        bin=os.environ.get("BIN") or os.path.join(os.environ.get("CARGO_TARGET_DIR") or "target", "release", "ddptrain"),
        config="configs/mnist_o0.toml",
    )
    a = p.parse_args()
    # Described once, here: the ranks of --world fork from this process.
    a.desc = description_from_args(p, a)
    if a.layouts and not set(a.layouts) <= {"nchw", "channels_last"}:
        p.error(f"--layouts {','.join(a.layouts)}: each must be nchw or channels_last")
    if a.world < 1:
        p.error("--world must be at least 1")
    if a.world > 1 and a.device != "cpu":
        p.error("--world > 1 runs on the CPU only")
    if a.batch % a.world:
        p.error(f"--batch {a.batch} does not split evenly over --world {a.world}")
    return a


def train(a, layout, rank=0, world=1):
    """a.warmup steps, then a.steps timed steps in LAYOUT; returns the global images/s (tokens/s for a language model; on rank 0)."""
    torch.set_num_threads(a.threads)
    torch.manual_seed(rank)
    batch = a.batch // world

    dev = torch.device(a.device)
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    text = len(a.desc["input_shape"]) == 1
    if text:
        fmt = torch.contiguous_format
    model = build(a.desc).to(dev, memory_format=fmt)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_cap_mb)
    if text:
        ps = list(model.parameters())
        groups = [{"params": [p for p in ps if p.dim() >= 2], "weight_decay": 0.1},
                  {"params": [p for p in ps if p.dim() < 2], "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.99))
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4, nesterov=a.nesterov)
    net = torch.compile(model) if a.compile else model
    loss_fn = nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler(a.device, enabled=a.amp)
    n = 50 * batch
    classes = a.desc["nodes"][a.desc["output"] - 1]["out_shape"][-1]
    if text:
        windows = torch.randint(0, classes, (n, a.desc["input_shape"][0] + 1), device=dev)
        images, labels = windows[:, :-1], windows[:, 1:]
    else:
        images = torch.randn(n, *a.desc["input_shape"], device=dev).contiguous(memory_format=fmt)
        labels = torch.randint(0, classes, (n,), device=dev)

    def step(i):
        j = (i * batch) % n
        x, y = images[j : j + batch], labels[j : j + batch]
        with torch.autocast(a.device, dtype=torch.float16, enabled=a.amp):
            logits = net(x)
            loss = loss_fn(logits.reshape(-1, classes), y.reshape(-1))
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if world > 1:
            torch.distributed.barrier()

    for i in range(a.warmup):
        step(i)
    sync()
    t = time.perf_counter()
    for i in range(a.steps):
        step(i)
    sync()
    per_sample = a.desc["input_shape"][0] if text else 1
    return a.steps * batch * world * per_sample / (time.perf_counter() - t)


def rank_main(rank, a, port, results):
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.world
    )
    try:
        for layout in a.layouts or [a.layout]:
            ips = train(a, layout, rank, a.world)
            if rank == 0:
                results.put(ips)
    finally:
        torch.distributed.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    a = parse_args()
    if a.world == 1:
        ips = [train(a, layout) for layout in a.layouts or [a.layout]]
    else:
        import torch.multiprocessing as mp

        # fork: the children start without importing torch again; this process
        # has run no torch op yet, so there is no thread pool to inherit.
        results = mp.get_context("fork").SimpleQueue()
        mp.start_processes(rank_main, args=(a, free_port(), results), nprocs=a.world, start_method="fork")
        ips = [results.get() for _ in a.layouts or [a.layout]]
    if a.layouts:
        for layout, v in zip(a.layouts, ips):
            print(layout, round(v))
    else:
        print(round(ips[0]))


if __name__ == "__main__":
    main()
