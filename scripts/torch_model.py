"""The PyTorch module of a ddptrain config, built from its description
(`ddptrain check --config X --json`), for the oracle (torch_parity.py) and
the benchmark (bench_torch.py).

The module tree follows the dotted node names: `layer1.0` is child `0` of
`layer1`, an `nn.Sequential` when all of a block's children are numbered
(as `nn.Sequential` names them), a plain `nn.Module` with attributes
otherwise. So `state_dict()` has ddptrain's keys, in its order, and a
ddptrain checkpoint's `model.safetensors` loads with `strict=True`. The
forward pass walks the nodes by the values they read (0 is the input, i+1
the output of node i), so a node may read any earlier value: an `add` sums
its inputs, the way a residual block joins its branches.

A description with a `causal_self_attention` node is a GPT: it builds as
nanoGPT's `GPT` (model.py, written out below with its module names), whose
config (n_layer, n_head, n_embd, block_size, vocab_size, bias, dropout) is
read from the description, and whose state_dict must then have ddptrain's
keys and shapes in ddptrain's order.

    python scripts/torch_model.py --bin target/release/ddptrain --config configs/mnist_o0.toml
    python scripts/torch_model.py --json model.json
prints the module and its state_dict keys after checking them against the
description (exit 1 on a difference).
"""
import argparse
import json
import subprocess
import sys

import torch
import torch.nn as nn
from torch.nn import functional as F

# ddptrain's layer types as the modules PyTorch users write; the description's
# args are these constructors' keyword arguments.
MODULES = {
    "conv2d": nn.Conv2d,
    "batchnorm2d": nn.BatchNorm2d,
    "relu": nn.ReLU,
    "maxpool2d": nn.MaxPool2d,
    "avgpool2d": nn.AvgPool2d,
    "adaptive_avgpool2d": nn.AdaptiveAvgPool2d,
    "flatten": nn.Flatten,
    "linear": nn.Linear,
    # Its masks are not PyTorch's (ddptrain draws them from its own Philox
    # counters): training comparisons need p = 0 (see dropout_masks).
    "dropout": nn.Dropout,
    "rmsnorm": nn.RMSNorm,
}
# Nodes without a module (no parameters, no state_dict keys): they combine values.
FUNCTIONS = {
    "add": lambda xs: sum(xs[1:], xs[0]),
}


def describe(binary, config, sets=(), env=None):
    """The description of `config` (with `--set` overrides `sets`) as ddptrain
    resolves it; exits with ddptrain's message when the config is refused."""
    cmd = [binary, "check", "--config", config, "--json"]
    for s in sets:
        cmd += ["--set", s]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    except OSError as e:
        sys.exit(f"cannot run {binary}: {e.strerror} (cargo build --release builds it; or pass --json FILE)")
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    return json.loads(r.stdout)


def read_description(path):
    with open(path) as f:
        return json.load(f)


def add_description_args(p):
    """--bin/--config/--set or --json: where a script gets its description."""
    p.add_argument("--bin", help="the ddptrain binary that describes --config")
    p.add_argument("--config", help="the ddptrain config whose model to build")
    p.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE",
                   help="a ddptrain --set override for --config (repeatable)")
    p.add_argument("--json", help="a saved `ddptrain check --json` output, instead of --bin and --config")


def description_from_args(p, a):
    if a.json:
        return read_description(a.json)
    if not (a.bin and a.config):
        p.error("give --json FILE, or --bin and --config")
    return describe(a.bin, a.config, a.sets)


class DescribedModel(nn.Module):
    """The network a description describes; see the module docstring."""

    def __init__(self, desc):
        super().__init__()
        # Underscored: a block of the model may be called `nodes` or `output`.
        self._graph = []  # (type, module or None, inputs), in execution order
        for node in desc["nodes"]:
            ty, name = node["type"], node["name"]
            if ty in FUNCTIONS:
                self._graph.append((ty, None, node["inputs"]))
                continue
            if ty not in MODULES:
                raise ValueError(f"node {name}: no PyTorch module for type {ty!r}")
            self._graph.append((ty, MODULES[ty](**node["args"]), node["inputs"]))
        # state_dict() lists modules in the order they were registered, which
        # need not be the order they run in (a shortcut may run before the
        # branch it joins): register them in the order of the description's
        # state_dict, each module without state after the one before it.
        first_key = {}
        for i, e in enumerate(desc["state_dict"]):
            first_key.setdefault(e["name"].rpartition(".")[0], i)
        place, rank = [], -1
        for i, node in enumerate(desc["nodes"]):
            rank = first_key.get(node["name"], rank)
            place.append((rank, i))
        for _, i in sorted(place):
            name, module = desc["nodes"][i]["name"], self._graph[i][1]
            if module is not None:
                parent, _, local = name.rpartition(".")
                self._block(parent, desc).add_module(local, module)
        self._output = desc["output"]
        # `tie`: the module's weight is an earlier module's Parameter, as
        # nanoGPT's `self.transformer.wte.weight = self.lm_head.weight`
        # (state_dict keeps both keys; parameters() yields it once).
        for (_, module, _), node in zip(self._graph, desc["nodes"]):
            if node.get("tie"):
                path, _, attr = node["tie"].rpartition(".")
                module.weight = getattr(self.get_submodule(path), attr)

    def _block(self, path, desc):
        """The block at dotted `path` ('' is the model), created on first use:
        nn.Sequential when every child the description gives it is numbered."""
        block = self
        walked = []
        for part in path.split(".") if path else []:
            walked.append(part)
            prefix = ".".join(walked) + "."
            if part not in block._modules:
                children = {n["name"][len(prefix):].split(".")[0] for n in desc["nodes"]
                            if n["name"].startswith(prefix)}
                block.add_module(part, nn.Sequential() if all(c.isdigit() for c in children) else nn.Module())
            block = block._modules[part]
        return block

    def values(self, x):
        """Every value of the forward pass: the input, then each node's output."""
        out = [x]
        for ty, module, inputs in self._graph:
            xs = [out[i] for i in inputs]
            out.append(FUNCTIONS[ty](xs) if module is None else module(*xs))
        return out

    def forward(self, x):
        return self.values(x)[self._output]


def check(model, desc):
    """The differences between `model` and the description: state_dict keys
    (in order) and shapes, and each node's output shape on a batch of 2."""
    problems = check_state_dict(model, desc)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        values = model.values(torch.zeros(2, *desc["input_shape"]))
    model.train(was_training)
    for node, v in zip(desc["nodes"], values[1:]):
        if list(v.shape[1:]) != node["out_shape"]:
            problems.append(f"node {node['name']} outputs {list(v.shape[1:])}, ddptrain {node['out_shape']}")
    return problems


def dropout_masks(desc):
    """The dropout nodes of `desc` that drop something (p > 0): their masks
    differ from PyTorch's, so a training-mode comparison with them would
    differ by more than rounding (evaluation is the identity on both sides)."""
    return [n["name"] for n in desc["nodes"] if n["type"] == "dropout" and n["args"]["p"] > 0]


class LayerNorm(nn.Module):
    """nanoGPT's LayerNorm: an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim, bias, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None
        self.eps = eps

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, self.eps)


class CausalSelfAttention(nn.Module):
    """nanoGPT's, on its flash path (no `attn.bias` mask buffer in the state_dict)."""

    def __init__(self, c):
        super().__init__()
        assert c["n_embd"] % c["n_head"] == 0
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"], bias=c["bias"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"], bias=c["bias"])
        self.attn_dropout = nn.Dropout(c["dropout"])
        self.resid_dropout = nn.Dropout(c["dropout"])
        self.n_head, self.n_embd, self.dropout = c["n_head"], c["n_embd"], c["dropout"]

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"], bias=c["bias"])
        self.gelu = nn.GELU(approximate=c["gelu"])
        self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"], bias=c["bias"])
        self.dropout = nn.Dropout(c["dropout"])

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = LayerNorm(c["n_embd"], bias=c["bias"], eps=c["eps"])
        self.attn = CausalSelfAttention(c)
        self.ln_2 = LayerNorm(c["n_embd"], bias=c["bias"], eps=c["eps"])
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's GPT (forward without targets: the logits of every position)."""

    def __init__(self, c):
        super().__init__()
        self.config = c
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c["vocab_size"], c["n_embd"]),
            wpe=nn.Embedding(c["block_size"], c["n_embd"]),
            drop=nn.Dropout(c["dropout"]),
            h=nn.ModuleList([Block(c) for _ in range(c["n_layer"])]),
            ln_f=LayerNorm(c["n_embd"], bias=c["bias"], eps=c["eps"]),
        ))
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def gpt_config(desc):
    """nanoGPT's GPTConfig of a GPT description, or None for another model."""
    nodes = {n["name"]: n for n in desc["nodes"]}
    attn = [n for n in desc["nodes"] if n["type"] == "causal_self_attention"]
    if not attn:
        return None
    wte, wpe = nodes.get("transformer.wte"), nodes.get("transformer.wpe")
    if wte is None or wpe is None:
        raise ValueError("a GPT needs nodes transformer.wte and transformer.wpe (nanoGPT's names)")
    gelus = {n["args"]["approximate"] for n in desc["nodes"] if n["type"] == "gelu"}
    drops = {n["args"]["p"] for n in desc["nodes"] if n["type"] == "dropout"}
    drops |= {n["args"]["dropout_p"] for n in attn}
    lns = [n for n in desc["nodes"] if n["type"] == "layernorm"]
    if len(gelus) > 1 or len(drops) > 1 or len({(n["args"]["bias"], n["args"]["eps"]) for n in lns}) > 1:
        raise ValueError("nanoGPT's GPT has one gelu, one dropout p and one layernorm (bias, eps) throughout")
    return dict(
        n_layer=len(attn), n_head=attn[0]["args"]["n_head"], n_embd=wte["args"]["embedding_dim"],
        block_size=wpe["args"]["num_embeddings"], vocab_size=wte["args"]["num_embeddings"],
        bias=lns[0]["args"]["bias"] if lns else False, eps=lns[0]["args"]["eps"] if lns else 1e-5,
        dropout=drops.pop() if drops else 0.0, gelu=gelus.pop() if gelus else "none",
    )


def check_state_dict(model, desc):
    """The differences between `model`'s state_dict keys (in order) and shapes and the description's."""
    ours = [(k, list(v.shape)) for k, v in model.state_dict().items()]
    theirs = [(e["name"], e["shape"]) for e in desc["state_dict"]]
    if [k for k, _ in ours] != [k for k, _ in theirs]:
        return [f"state_dict keys {[k for k, _ in ours]}, ddptrain {[k for k, _ in theirs]}"]
    return [f"{k} has shape {s}, ddptrain {t}" for (k, s), (_, t) in zip(ours, theirs) if s != t]


def build(desc):
    """The module of `desc`, checked against it (ValueError on a difference)."""
    gpt = gpt_config(desc)
    model = DescribedModel(desc) if gpt is None else GPT(gpt)
    problems = check(model, desc) if gpt is None else check_state_dict(model, desc)
    if problems:
        raise ValueError("the PyTorch model differs from ddptrain's description:\n" + "\n".join(problems))
    return model


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_description_args(p)
    a = p.parse_args()
    desc = description_from_args(p, a)
    try:
        model = build(desc)
    except ValueError as e:
        sys.exit(str(e))
    print(model)
    for k, v in model.state_dict().items():
        print(f"{k:40} {list(v.shape)}")


if __name__ == "__main__":
    main()
