#!/usr/bin/env python3
"""Optimizer, clipping, LR-schedule and --freeze math of training bundles (ctest e2e_optimizers).

The PyTorch parity fixtures (test_parity.py) cover AdamW and SGD+momentum with a constant LR
and no clipping. This test checks the rest of the training-step math on the mlp fixture's model
(tests/fixtures/mlp_adamw/: model.onnx, batches.npz, init_params.npz; a 64-32-10 Gemm/ReLU MLP)
against an independent numpy float64 reference of the model and of PyTorch's optimizer formulas
(torch.optim.SGD/Adam/AdamW, foreach=False; torch.nn.utils.clip_grad_norm_). Every case:
  forgec model.onnx --target cpu --batch 8 --loss cross_entropy:logits,labels \
         --expose-gradients --optimizer SPEC [--lr-schedule S] [--clip-grad-norm C] \
         [--freeze P] -o T/m.forge
  forge-train T/m.forge --data batches.npz --no-shuffle --threads 1 --steps N \
         --metrics T/m.jsonl --dump-params T/p.npz --dump-grads T/g.npz
Step k uses rows [8(k-1), 8k) of batches.npz.

The reference: the model's forward/backward in numpy float64 (y = relu(x W1^T + b1) W2^T + b2,
mean softmax cross-entropy; itself checked against the fixture's PyTorch logits_step1.npy and
grads_step1.npz), and per parameter, step t (1-based), gradient g (after clipping):
  clip     g *= min(1, C / (||g_all|| + 1e-6)) over all parameters at once
  sgd      g += wd p (decayed params);  momentum: buf = g (t = 1) else mu buf + g;
           nesterov: d = g + mu buf, else d = buf;  p -= lr d
  adam     g += wd p (L2, decayed params);  adamw: p *= 1 - lr wd (decoupled, decayed params)
           m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
           p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
  decayed  params whose role (fixture manifest) is weight or embedding: the 2-D weights here
  lr_t     lr * warm * (min + (1-min) decay), warm = min(t / warmup, 1),
           p = clamp((t - warmup) / (total - warmup), 0, 1), decay = 0.5 (1 + cos(pi p)) (cosine)
           or 1 - p (linear); lr for constant

Checks and bounds (norms L2 per tensor, float64; "update" = tensor minus its initial value):
  one step     Forge's step-1 gradients (--dump-grads) + init -> reference update; per tensor
               params ||a-b||/||b|| <= 1e-6 and update ||da-db||/||db|| <= 1e-4; optimizer
               state (NAME.momentum / .exp_avg / .exp_avg_sq) ||a-b||/||b|| <= 1e-5. The
               dumped gradients equal the numpy ones within 1e-5.
  several steps  numpy float64 trajectory with its own gradients (and schedule LR): losses per
               step |a-b|/|b| <= 1e-5, final params <= 1e-5, update <= 1e-4
  sensitivity  every case also evaluates wrong variants of its formula (no decay, decay on
               biases too, L2 vs decoupled, nesterov vs plain momentum, dampening, Adam bias
               correction stuck at t = 1, no clipping, constant instead of scheduled LR) and
               requires each to miss Forge's update by > 10x the bound (1e-3), so the case
               can tell the formulas apart
  clipping     metrics grad_norm of step 1 == ||dumped gradients|| (and the numpy norm) within
               1e-5; the update == lr g C/(norm + 1e-6) (+ weight decay after clipping); the
               dumped gradients are the unclipped ones
  grad norm    without clipping (or loss scaling) a bundle computes no gradient norm: metrics
               grad_norm null; with forgec --grad-norm it is reported (== ||dumped gradients||
               within 1e-5) and the update is the unclipped one (the same parameters)
  schedules    metrics lr per step vs the formula within 1e-5 relative (1e-6 lr absolute where
               the formula gives 0), and the parameters after 10 steps follow the scheduled LR
  freeze       --freeze 'fc1.*': the bundle has 2 PARAMETER tensors; fc1.* are in none of
               --dump-params, --dump-grads, the checkpoint, train_step's outputs; --export-onnx
               leaves their initializers byte-identical; fc2.* change and follow the reference
               with fc1 fixed at its initial value
  bad options  forgec exits non-zero with a message naming the problem, writes no bundle, and
               does not crash: unknown optimizer, lr=-1, unknown optimizer option, nesterov
               without momentum, schedule total <= warmup, unknown schedule, --micro-batches 0,
               --loss on a missing output, --freeze matching every parameter

Usage:
  test_optimizers.py [--bin-dir DIR | --forgec F --forge-train F] [--fixture-dir DIR] [--keep]
                     [CASE ...]
Prints one line per check and 'N passed, N failed'; exit status 1 if anything failed.
Needs numpy only.
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np

import forge_e2e as e2e
from forge_e2e import Report, rel, tail

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_FIXTURE = os.path.normpath(os.path.join(HERE, "..", "fixtures", "mlp_adamw"))
TIMEOUT_S = 120
BATCH = 8
LOSS = "cross_entropy:logits,labels"

TOL_PARAMS = 1e-6        # one step, per tensor ||a-b||/||b||
TOL_UPDATE = 1e-4        # per tensor, on p - p0
TOL_STATE = 1e-5         # optimizer moments after one step
TOL_GRADS = 1e-5         # dumped gradients vs numpy float64
TOL_GRAD_NORM = 1e-5     # metrics grad_norm vs norm of the dumped gradients
TOL_LR = 1e-5            # metrics lr vs schedule formula
TOL_MULTI_PARAMS = 1e-5  # several steps, own gradients: fp32 vs fp64 drift
TOL_MULTI_LOSS = 1e-5
SENSITIVITY = 10.0       # a wrong formula must miss by more than this times the bound


# --------------------------------------------------------------------------- helpers

def run(cmd):
    """(returncode, None if it timed out; combined output)."""
    rc, _, out = e2e.run(cmd, TIMEOUT_S)
    return rc, out


# --------------------------------------------------------------------------- numpy reference

class Mlp:
    """The fixture model in float64: logits = relu(x W1^T + b1) W2^T + b2 (PyTorch Linear
    exported as Gemm(transB=1)); loss = mean softmax cross-entropy over the batch."""

    def __init__(self, data):
        self.x = data["x"].astype(np.float64)
        self.y = data["labels"].astype(np.int64)

    def batch(self, step):
        s = slice((step - 1) * BATCH, step * BATCH)
        return self.x[s], self.y[s]

    @staticmethod
    def forward(p, x):
        h_pre = x @ p["fc1.weight"].T + p["fc1.bias"]
        h = np.maximum(h_pre, 0.0)
        return h_pre, h, h @ p["fc2.weight"].T + p["fc2.bias"]

    def loss_and_grads(self, p, step):
        x, y = self.batch(step)
        h_pre, h, logits = self.forward(p, x)
        z = logits - logits.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        n = x.shape[0]
        loss = -logp[np.arange(n), y].mean()
        d = np.exp(logp)
        d[np.arange(n), y] -= 1.0
        d /= n
        dh = (d @ p["fc2.weight"]) * (h_pre > 0)
        g = {"fc2.weight": d.T @ h, "fc2.bias": d.sum(axis=0),
             "fc1.weight": dh.T @ x, "fc1.bias": dh.sum(axis=0)}
        return float(loss), g


def schedule_lr(lr, sched, step):
    """sched: None/'constant' or (kind, warmup, total, min_ratio)."""
    if sched is None:
        return lr
    kind, warmup, total, min_ratio = sched
    warm = min(step / warmup, 1.0) if warmup > 0 else 1.0
    prog = min(max((step - warmup) / (total - warmup), 0.0), 1.0)
    decay = 0.5 * (1.0 + math.cos(math.pi * prog)) if kind == "cosine" else 1.0 - prog
    return lr * warm * (min_ratio + (1.0 - min_ratio) * decay)


class RefOptimizer:
    """PyTorch's single-tensor SGD / Adam / AdamW in float64. `variant` selects deliberately
    wrong formulas for the sensitivity checks."""

    def __init__(self, hp, decayed, variant=None):
        self.hp = dict(hp)
        self.decayed = set(decayed)
        self.variant = variant
        self.state = {}
        if variant == "no_decay":
            self.hp["weight_decay"] = 0.0
        elif variant == "decay_all":
            self.decayed = None  # every parameter
        elif variant == "swap_adam":
            self.hp["kind"] = {"adam": "adamw", "adamw": "adam"}[hp["kind"]]
        elif variant == "swap_nesterov":
            self.hp["nesterov"] = not hp.get("nesterov", False)
        elif variant == "dampening":  # torch's dampening = momentum
            self.hp["dampening"] = hp["momentum"]

    def wd_for(self, name):
        if self.decayed is None or name in self.decayed:
            return self.hp.get("weight_decay", 0.0)
        return 0.0

    def step(self, params, grads, t, lr, clip=None):
        """Returns the new params (dict of float64); updates self.state; t is 1-based."""
        hp = self.hp
        grads = {k: np.asarray(v, np.float64) for k, v in grads.items()}
        if clip is not None and self.variant != "no_clip":
            norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
            scale = min(1.0, clip / (norm + 1e-6))
            grads = {k: g * scale for k, g in grads.items()}
        out = {}
        for k, g in grads.items():
            p = np.asarray(params[k], np.float64)
            wd = self.wd_for(k)
            if hp["kind"] == "sgd":
                if wd:
                    g = g + wd * p
                mu = hp.get("momentum", 0.0)
                if mu > 0:
                    buf = self.state.get(k + ".momentum")
                    buf = g.copy() if buf is None else mu * buf + (1 - hp.get("dampening", 0)) * g
                    self.state[k + ".momentum"] = buf
                    d = g + mu * buf if hp.get("nesterov", False) else buf
                else:
                    d = g
                out[k] = p - lr * d
            else:
                b1, b2, eps = hp["beta1"], hp["beta2"], hp["eps"]
                if hp["kind"] == "adam" and wd:
                    g = g + wd * p
                if hp["kind"] == "adamw" and wd:
                    p = p * (1.0 - lr * wd)
                m = b1 * self.state.get(k + ".exp_avg", 0.0) + (1 - b1) * g
                v = b2 * self.state.get(k + ".exp_avg_sq", 0.0) + (1 - b2) * g * g
                self.state[k + ".exp_avg"], self.state[k + ".exp_avg_sq"] = m, v
                tb = 1 if self.variant == "bias_correction_t1" else t
                bc1, bc2 = 1 - b1 ** tb, 1 - b2 ** tb
                out[k] = p - (lr / bc1) * m / (np.sqrt(v) / math.sqrt(bc2) + eps)
        return out


def trajectory(model, init, hp, decayed, steps, sched=None, clip=None, frozen=(), variant=None):
    """numpy float64 training with its own gradients: (losses, grad_norms, lrs, params)."""
    p = {k: np.asarray(v, np.float64) for k, v in init.items()}
    opt = RefOptimizer(hp, decayed, variant)
    losses, norms, lrs = [], [], []
    for t in range(1, steps + 1):
        loss, g = model.loss_and_grads(p, t)
        g = {k: v for k, v in g.items() if k not in frozen}
        losses.append(loss)
        norms.append(math.sqrt(sum(float((v * v).sum()) for v in g.values())))
        lr = schedule_lr(hp["lr"], None if variant == "constant_lr" else sched, t)
        lrs.append(lr)
        p.update(opt.step(p, g, t, lr, clip))
    return losses, norms, lrs, p


# --------------------------------------------------------------------------- cases

def hp_of(kind, **kw):
    h = {"kind": kind, "lr": 1e-3, "momentum": 0.0, "nesterov": False, "beta1": 0.9,
         "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01 if kind == "adamw" else 0.0}
    h.update(kw)
    return h


# name -> (forgec --optimizer, reference hyperparameters, wrong variants to tell apart)
OPTIMIZER_CASES = {
    "sgd": ("sgd:lr=0.1", hp_of("sgd", lr=0.1), ["decay_all_0.05"]),
    "sgd_wd": ("sgd:lr=0.1,weight_decay=0.05", hp_of("sgd", lr=0.1, weight_decay=0.05),
               ["no_decay", "decay_all"]),
    "momentum": ("sgd:lr=0.05,momentum=0.9,nesterov=0,weight_decay=0.05",
                 hp_of("sgd", lr=0.05, momentum=0.9, weight_decay=0.05),
                 ["no_decay", "decay_all", "swap_nesterov"]),
    "nesterov": ("sgd:lr=0.05,momentum=0.9,nesterov=1,weight_decay=0.05",
                 hp_of("sgd", lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.05),
                 ["no_decay", "decay_all", "swap_nesterov"]),
    "adam_l2": ("adam:lr=0.01,beta1=0.9,beta2=0.999,eps=1e-8,weight_decay=0.1",
                hp_of("adam", lr=0.01, weight_decay=0.1),
                ["no_decay", "decay_all", "swap_adam"]),
    "adamw": ("adamw:lr=0.01,beta1=0.9,beta2=0.999,eps=1e-8,weight_decay=0.1",
              hp_of("adamw", lr=0.01, weight_decay=0.1),
              ["no_decay", "decay_all", "swap_adam"]),
}

# Several steps with the numpy trajectory (own gradients): momentum buffers and Adam's bias
# corrections beyond t = 1, and the optimizer kind aliases with their defaults.
# name -> (forgec --optimizer, reference hyperparameters, steps, wrong variants to tell apart)
MULTI_CASES = {
    "momentum_alias": ("momentum:lr=0.05", hp_of("sgd", lr=0.05, momentum=0.9), 6,
                       ["dampening", "swap_nesterov"]),
    "nesterov_alias": ("nesterov:lr=0.05,weight_decay=0.05",
                       hp_of("sgd", lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.05), 6,
                       ["dampening", "swap_nesterov", "decay_all"]),
    "adam_l2": ("adam:lr=0.01,weight_decay=0.1", hp_of("adam", lr=0.01, weight_decay=0.1), 6,
                ["bias_correction_t1", "swap_adam"]),
    "adamw_default_wd": ("adamw:lr=0.01", hp_of("adamw", lr=0.01), 6,
                         ["bias_correction_t1", "no_decay"]),
    "adamw_beta": ("adamw:lr=0.005,beta1=0.8,beta2=0.99,eps=1e-6,weight_decay=0.2",
                   hp_of("adamw", lr=0.005, beta1=0.8, beta2=0.99, eps=1e-6,
                         weight_decay=0.2), 6, ["bias_correction_t1", "swap_adam"]),
}

CLIP = 0.5  # below the step-1 gradient norm (~1.31; asserted)
CLIP_CASES = {
    # name -> (optimizer spec, hp, clip, steps)
    "clip_sgd": ("sgd:lr=0.1", hp_of("sgd", lr=0.1), CLIP, 1),
    "clip_sgd_wd": ("sgd:lr=0.1,weight_decay=0.05", hp_of("sgd", lr=0.1, weight_decay=0.05),
                    CLIP, 1),
    "clip_inactive": ("sgd:lr=0.1", hp_of("sgd", lr=0.1), 100.0, 1),
    "clip_momentum_6": ("sgd:lr=0.05,momentum=0.9", hp_of("sgd", lr=0.05, momentum=0.9), CLIP, 6),
    "clip_adamw_6": ("adamw:lr=0.01,weight_decay=0.1", hp_of("adamw", lr=0.01, weight_decay=0.1),
                     CLIP, 6),
}

SCHEDULE_STEPS = 10
SCHEDULE_CASES = {
    # name -> (--lr-schedule or None, reference schedule, optimizer spec, hp)
    "cosine": ("cosine:warmup=3,total=10,min_ratio=0.1", ("cosine", 3, 10, 0.1),
               "sgd:lr=0.1", hp_of("sgd", lr=0.1)),
    "linear": ("linear:warmup=2,total=8", ("linear", 2, 8, 0.0),
               "sgd:lr=0.1", hp_of("sgd", lr=0.1)),
    "cosine_nowarmup": ("cosine:total=10", ("cosine", 0, 10, 0.0),
                        "sgd:lr=0.1", hp_of("sgd", lr=0.1)),
    "linear_min": ("linear:warmup=0,total=6,min_ratio=0.25", ("linear", 0, 6, 0.25),
                   "sgd:lr=0.1,momentum=0.9", hp_of("sgd", lr=0.1, momentum=0.9)),
    "constant_default": (None, None, "sgd:lr=0.1", hp_of("sgd", lr=0.1)),
    "constant": ("constant", None, "momentum:lr=0.05", hp_of("sgd", lr=0.05, momentum=0.9)),
    # AdamW's decoupled decay and step size use the scheduled LR.
    "cosine_adamw": ("cosine:warmup=3,total=10,min_ratio=0.1", ("cosine", 3, 10, 0.1),
                     "adamw:lr=0.01,weight_decay=0.1", hp_of("adamw", lr=0.01, weight_decay=0.1)),
}

BAD_CASES = [
    # name, extra forgec args (replacing the default --optimizer when they give one), words
    # the message must contain (all, case-insensitive)
    ("unknown optimizer", ["--optimizer", "rmsprop:lr=0.1"], ["optimizer", "rmsprop"]),
    ("negative lr", ["--optimizer", "sgd:lr=-1"], ["lr"]),
    ("zero lr", ["--optimizer", "adamw:lr=0"], ["lr"]),
    ("unknown optimizer option", ["--optimizer", "adam:lr=0.1,betas=0.9"], ["betas"]),
    ("optimizer option not a number", ["--optimizer", "sgd:lr=fast"], ["lr", "number"]),
    ("nesterov without momentum", ["--optimizer", "sgd:lr=0.1,nesterov=1"], ["nesterov",
                                                                              "momentum"]),
    ("cosine total == warmup", ["--lr-schedule", "cosine:warmup=5,total=5"], ["total", "warmup"]),
    ("linear total < warmup", ["--lr-schedule", "linear:warmup=5,total=3"], ["total", "warmup"]),
    ("unknown schedule", ["--lr-schedule", "step:total=5"], ["schedule", "step"]),
    ("micro-batches 0", ["--micro-batches", "0"], ["micro-batches"]),
    ("loss on a missing output", ["--loss", "cross_entropy:probs,labels"], ["probs", "logits"]),
    ("freeze everything", ["--freeze", "*"], ["trainable", "freeze"]),
]


# --------------------------------------------------------------------------- running

class Env:
    def __init__(self, forgec, forge_train, fixture, tmp):
        self.forgec, self.forge_train, self.fixture, self.tmp = forgec, forge_train, fixture, tmp
        self.onnx = os.path.join(fixture, "model.onnx")
        self.data = os.path.join(fixture, "batches.npz")
        self.init = dict(np.load(os.path.join(fixture, "init_params.npz")))
        with open(os.path.join(fixture, "manifest.json")) as f:
            self.manifest = json.load(f)
        self.model = Mlp(np.load(self.data))
        roles = {e["name"]: e["role"] for e in self.manifest["initializers"]}
        self.decayed = sorted(k for k in self.init if roles.get(k) in ("weight", "embedding"))

    def compile(self, name, spec, extra=()):
        d = os.path.join(self.tmp, name)
        os.makedirs(d, exist_ok=True)
        bundle = os.path.join(d, "m.forge")
        cmd = [self.forgec, self.onnx, "--target", "cpu", "--batch", str(BATCH), "--loss", LOSS,
               "--expose-gradients", "--optimizer", spec, *extra, "-o", bundle]
        rc, out = run(cmd)
        return (bundle if rc == 0 else None), f"exit {rc}: {tail(out)}"

    def train(self, name, bundle, steps, extra=()):
        d = os.path.dirname(bundle)
        files = {k: os.path.join(d, f) for k, f in
                 (("metrics", "m.jsonl"), ("params", "p.npz"), ("grads", "g.npz"))}
        cmd = [self.forge_train, bundle, "--data", self.data, "--no-shuffle", "--threads", "1",
               "--steps", str(steps), "--metrics", files["metrics"],
               "--dump-params", files["params"], "--dump-grads", files["grads"], *extra]
        rc, out = run(cmd)
        if rc != 0:
            return None, f"exit {rc}: {tail(out)}"
        metrics = {}
        with open(files["metrics"]) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    metrics[int(r["step"])] = r
        return {"metrics": metrics, "params": dict(np.load(files["params"])),
                "grads": dict(np.load(files["grads"]))}, ""

    def compile_and_train(self, rep, name, spec, steps, compile_extra=(), train_extra=()):
        bundle, msg = self.compile(name, spec, compile_extra)
        if not rep.check(f"{name} forgec", bundle is not None,
                         msg if bundle is None else f"--optimizer {spec} {' '.join(compile_extra)}"):
            return None
        res, msg = self.train(name, bundle, steps, train_extra)
        if not rep.check(f"{name} forge-train --steps {steps}", res is not None and
                         sorted(res["metrics"]) == list(range(1, steps + 1)),
                         msg or f"{len(res['metrics'])} metrics lines"):
            return None
        res["bundle"] = bundle
        return res


def compare_params(got, ref, init, keys, tol_p, tol_u):
    """(problems, worst param rel, worst update rel)."""
    problems, wp, wu = [], 0.0, 0.0
    for k in keys:
        if k not in got:
            problems.append(f"{k} missing")
            continue
        a = np.asarray(got[k], np.float64)
        if a.shape != ref[k].shape or not np.all(np.isfinite(a)):
            problems.append(f"{k}: shape {a.shape} or non-finite")
            continue
        ep = rel(a, ref[k])
        eu = rel(a - init[k], ref[k] - init[k])
        wp, wu = max(wp, ep), max(wu, eu)
        if ep > tol_p:
            problems.append(f"{k}: params rel {ep:.2e} > {tol_p:g}")
        if eu > tol_u:
            problems.append(f"{k}: update rel {eu:.2e} > {tol_u:g}")
    return problems, wp, wu


def update_err(got, ref, init, keys):
    return max(rel(np.asarray(got[k], np.float64) - init[k], ref[k] - init[k]) for k in keys)


def check_grads(rep, name, env, grads, step_params=None, keys=None):
    """Dumped step-1 gradients vs numpy float64 (with the initial parameters)."""
    _, g = env.model.loss_and_grads(step_params or env.init, 1)
    keys = keys or sorted(env.init)
    bad = [k for k in keys if k not in grads or rel(grads[k], g[k]) > TOL_GRADS]
    worst = max((rel(grads[k], g[k]) for k in keys if k in grads), default=float("nan"))
    return rep.check(f"{name} grads step 1", not bad and set(grads) == set(keys),
                     f"max rel {worst:.2e} vs numpy; keys {sorted(grads)}"
                     + (f"; bad {bad}" if bad else ""))


# --------------------------------------------------------------------------- checks

def check_reference(rep, env):
    """The numpy model reproduces the fixture's PyTorch numbers (so it can judge Forge)."""
    p = {k: v.astype(np.float64) for k, v in env.init.items()}
    x, _ = env.model.batch(1)
    e_logits = rel(Mlp.forward(p, x)[2], np.load(os.path.join(env.fixture, "logits_step1.npy")))
    loss, g = env.model.loss_and_grads(p, 1)
    torch_g = np.load(os.path.join(env.fixture, "grads_step1.npz"))
    e_g = max(rel(g[k], torch_g[k]) for k in torch_g.files)
    e_l = abs(loss - np.load(os.path.join(env.fixture, "losses.npy"))[0]) / loss
    ok = e_logits < 1e-5 and e_g < 1e-5 and e_l < 1e-5 and set(torch_g.files) == set(g)
    roles_ok = env.decayed == sorted(k for k, v in env.init.items() if v.ndim >= 2)
    rep.check("numpy reference vs PyTorch fixture", ok and roles_ok,
              f"logits rel {e_logits:.2e}, loss rel {e_l:.2e}, grads max rel {e_g:.2e}; "
              f"decayed (role weight/embedding) = {env.decayed}")
    return ok and roles_ok


def sensitivity(rep, name, env, hp, variants, got, grads, tol, ref_fn):
    """Each wrong variant of the formula must miss Forge's result by > SENSITIVITY x tol."""
    res = []
    for v in variants:
        vhp = dict(hp)
        variant = v
        if v.startswith("decay_all_"):  # decay applied although the spec has none
            vhp["weight_decay"] = float(v.split("_")[-1])
            variant = "decay_all"
        ref = ref_fn(RefOptimizer(vhp, env.decayed, variant))
        res.append((v, update_err(got, ref, env.init, sorted(env.init))))
    ok = all(e > SENSITIVITY * tol for _, e in res)
    rep.check(f"{name} tells wrong formulas apart", ok,
              ", ".join(f"{v}: update rel {e:.1e}" for v, e in res)
              + f" (each must be > {SENSITIVITY * tol:g})")


def check_one_step(rep, env, name, spec, hp, variants):
    res = env.compile_and_train(rep, name, spec, 1)
    if res is None:
        return
    keys = sorted(env.init)
    check_grads(rep, name, env, res["grads"])
    g1 = res["grads"]
    opt = RefOptimizer(hp, env.decayed)
    ref = opt.step(env.init, g1, 1, hp["lr"])
    problems, wp, wu = compare_params(res["params"], ref, env.init, keys, TOL_PARAMS, TOL_UPDATE)
    rep.check(f"{name} params after step 1", not problems,
              "; ".join(problems[:6] + [f"max params rel {wp:.2e}, max update rel {wu:.2e}"]))
    # Optimizer state: exactly the moments this optimizer has.
    want = sorted(opt.state)
    have = sorted(k for k in res["params"] if k not in env.init)
    bad = [k for k in want if k not in res["params"]
           or rel(res["params"][k], opt.state[k]) > TOL_STATE]
    worst = max((rel(res["params"][k], opt.state[k]) for k in want if k in res["params"]),
                default=0.0)
    rep.check(f"{name} optimizer state after step 1", not bad and have == want,
              f"{len(want)} tensors, max rel {worst:.2e}" + (f"; bad {bad}" if bad else "")
              + ("" if have == want else f"; dumped {have}, expected {want}"))
    sensitivity(rep, name, env, hp, variants, res["params"], g1, TOL_UPDATE,
                lambda o: o.step(env.init, g1, 1, hp["lr"]))


def check_multi(rep, env, name, spec, hp, steps, compile_extra=(), sched=None, clip=None,
                frozen=(), variants=()):
    """Forge over `steps` steps vs the numpy float64 trajectory. Returns (result, reference)."""
    res = env.compile_and_train(rep, name, spec, steps, compile_extra)
    if res is None:
        return None, None
    losses, norms, lrs, ref = trajectory(env.model, env.init, hp, env.decayed, steps, sched,
                                         clip, frozen)
    got = [float(res["metrics"][t]["loss"]) for t in range(1, steps + 1)]
    errs = [abs(a - b) / abs(b) for a, b in zip(got, losses)]
    rep.check(f"{name} losses", max(errs) <= TOL_MULTI_LOSS,
              f"max rel {max(errs):.2e} over {steps} steps (step {int(np.argmax(errs)) + 1})")
    keys = sorted(k for k in env.init if k not in frozen)
    problems, wp, wu = compare_params(res["params"], ref, env.init, keys, TOL_MULTI_PARAMS,
                                      TOL_UPDATE)
    rep.check(f"{name} params after step {steps}", not problems,
              "; ".join(problems[:6] + [f"max params rel {wp:.2e}, max update rel {wu:.2e}"]))
    res["ref_norms"], res["ref_lrs"] = norms, lrs
    if variants:
        errs = [(v, update_err(res["params"], trajectory(env.model, env.init, hp, env.decayed,
                                                         steps, sched, clip, frozen, v)[3],
                               env.init, keys)) for v in variants]
        rep.check(f"{name} tells wrong formulas apart",
                  all(e > SENSITIVITY * TOL_UPDATE for _, e in errs),
                  ", ".join(f"{v}: update rel {e:.1e}" for v, e in errs)
                  + f" (each must be > {SENSITIVITY * TOL_UPDATE:g})")
    return res, ref


def check_grad_norm_flag(rep, env):
    """No clipping: no gradient norm unless forgec --grad-norm asks for it; the update is
    the same either way."""
    spec = "sgd:lr=0.1"
    plain = env.compile_and_train(rep, "norm_off", spec, 1)
    asked = env.compile_and_train(rep, "norm_on", spec, 1, ["--grad-norm"])
    if plain is None or asked is None:
        return
    rep.check("grad_norm null without --clip-grad-norm or --grad-norm",
              plain["metrics"][1]["grad_norm"] is None, f"{plain['metrics'][1]['grad_norm']}")
    reported = asked["metrics"][1]["grad_norm"]
    norm = math.sqrt(sum(float((np.asarray(g, np.float64) ** 2).sum())
                         for g in asked["grads"].values()))
    e = abs(float(reported) - norm) / norm if reported is not None else math.inf
    rep.check("--grad-norm: grad_norm == ||dumped grads||", e <= TOL_GRAD_NORM,
              f"metrics {reported}, ||dumped grads|| {norm:.9g} (rel {e:.2e})")
    same = all(np.array_equal(plain["params"][k], asked["params"][k]) for k in plain["params"])
    rep.check("--grad-norm: the same parameters after the step", same,
              "the parameters differ" if not same else f"{len(plain['params'])} tensors equal")


def check_clip(rep, env, name, spec, hp, clip, steps):
    if steps == 1:
        res = env.compile_and_train(rep, name, spec, 1, ["--clip-grad-norm", repr(clip)])
        if res is None:
            return
        check_grads(rep, name, env, res["grads"])  # dumped gradients are the unclipped ones
        g1 = res["grads"]
    else:
        res, _ = check_multi(rep, env, name, spec, hp, steps, ["--clip-grad-norm", repr(clip)],
                             clip=clip, variants=["no_clip"])
        if res is None:
            return
        g1 = res["grads"]
        errs = [abs(float(res["metrics"][t]["grad_norm"]) - n) / n
                for t, n in enumerate(res["ref_norms"], 1)]
        rep.check(f"{name} grad_norm per step vs numpy trajectory", max(errs) <= 1e-4,
                  f"max rel {max(errs):.2e}; norms {min(res['ref_norms']):.3f}.."
                  f"{max(res['ref_norms']):.3f}, clip {clip}")
    norm = math.sqrt(sum(float((np.asarray(g, np.float64) ** 2).sum()) for g in g1.values()))
    _, gnp = env.model.loss_and_grads(env.init, 1)
    norm_np = math.sqrt(sum(float((g * g).sum()) for g in gnp.values()))
    reported = float(res["metrics"][1]["grad_norm"])
    e, e_np = abs(reported - norm) / norm, abs(reported - norm_np) / norm_np
    rep.check(f"{name} grad_norm step 1", e <= TOL_GRAD_NORM and e_np <= TOL_GRAD_NORM,
              f"metrics {reported:.9g}, ||dumped grads|| {norm:.9g} (rel {e:.2e}), "
              f"numpy {norm_np:.9g} (rel {e_np:.2e}); clip {clip} "
              f"{'active' if clip < norm else 'inactive'}")
    if steps == 1:
        if clip < 100:
            rep.check(f"{name} clip below the norm", clip < norm, f"clip {clip} < norm {norm:.4f}")
        opt = RefOptimizer(hp, env.decayed)
        ref = opt.step(env.init, g1, 1, hp["lr"], clip)
        keys = sorted(env.init)
        problems, wp, wu = compare_params(res["params"], ref, env.init, keys, TOL_PARAMS,
                                          TOL_UPDATE)
        scale = min(1.0, clip / (norm + 1e-6))
        rep.check(f"{name} params after step 1", not problems,
                  "; ".join(problems[:6] + [f"scale {scale:.6f}, max params rel {wp:.2e}, "
                                            f"max update rel {wu:.2e}"]))
        if clip < norm:
            variants = ["no_clip"] + (["no_decay"] if hp["weight_decay"] else [])
            sensitivity(rep, name, env, hp, variants, res["params"], g1, TOL_UPDATE,
                        lambda o: o.step(env.init, g1, 1, hp["lr"], clip))


def check_schedule(rep, env, name, sched_arg, sched, spec, hp):
    extra = ["--lr-schedule", sched_arg] if sched_arg else []
    res, _ = check_multi(rep, env, name, spec, hp, SCHEDULE_STEPS, extra, sched=sched,
                         variants=["constant_lr"] if sched else [])
    if res is None:
        return
    bad, worst, shown = [], 0.0, []
    for t in range(1, SCHEDULE_STEPS + 1):
        want = schedule_lr(hp["lr"], sched, t)
        got = res["metrics"][t]["lr"]
        got = float("nan") if got is None else float(got)
        if want > 0:
            e = abs(got - want) / want
            ok = e <= TOL_LR
        else:
            e = abs(got) / hp["lr"]
            ok = e <= 1e-6
        worst = max(worst, e) if np.isfinite(e) else float("inf")
        if not ok:
            bad.append(f"step {t}: lr {got:.9g}, want {want:.9g}")
        shown.append(f"{got:.4g}")
    rep.check(f"{name} lr per step", not bad,
              "; ".join(bad[:4] + [f"max rel {worst:.2e}; lr = [{', '.join(shown)}]"]))


def check_freeze(rep, env):
    name = "freeze_fc1"
    frozen = ("fc1.weight", "fc1.bias")
    hp = hp_of("sgd", lr=0.05, momentum=0.9)
    ckpt = os.path.join(env.tmp, name, "ckpt")
    exported = os.path.join(env.tmp, name, "trained.onnx")
    bundle, msg = env.compile(name, "momentum:lr=0.05", ["--freeze", "fc1.*"])
    if not rep.check(f"{name} forgec", bundle is not None, msg if bundle is None else
                     "--freeze 'fc1.*'"):
        return
    steps = 4
    res, msg = env.train(name, bundle, steps, ["--ckpt-dir", ckpt, "--export-onnx", exported])
    if not rep.check(f"{name} forge-train --steps {steps}", res is not None, msg):
        return
    # The trainable set, four ways.
    rc, info = run([env.forge_train, bundle, "--info"])
    n_param = next((l for l in info.splitlines() if l.startswith("tensors:")), "")
    grad_outs = sorted(l.split()[1][len("forge.grad."):] for l in info.splitlines()
                       if l.strip().startswith("out forge.grad."))
    ckpts = [f for f in os.listdir(ckpt) if f.endswith(".forgeckpt")] if os.path.isdir(ckpt) \
        else []
    ck_params = sorted(k[len("param/"):] for k in np.load(os.path.join(ckpt, ckpts[0])).files
                       if k.startswith("param/")) if ckpts else None
    want = ["fc2.bias", "fc2.weight"]
    dumped = sorted(k for k in res["params"] if k in env.init)
    ok = (rc == 0 and " 2 parameter" in n_param and grad_outs == want and dumped == want
          and sorted(res["grads"]) == want and ck_params == want)
    rep.check(f"{name} trainable set", ok,
              f"--info '{n_param.strip()}'; train_step grads {grad_outs}; --dump-params "
              f"{dumped}; --dump-grads {sorted(res['grads'])}; checkpoint params {ck_params}; "
              f"optimizer state {sorted(k for k in res['params'] if k not in env.init)}")
    # Frozen values: byte-identical in the exported model (export replaces only trained
    # initializers) and in the bundle; the trained ones changed.
    with open(exported, "rb") as f:
        onnx_bytes = f.read()
    with open(bundle, "rb") as f:
        bundle_bytes = f.read()
    same = [k for k in frozen if env.init[k].tobytes() in onnx_bytes
            and env.init[k].tobytes() in bundle_bytes]
    changed = [k for k in want if not np.array_equal(res["params"][k], env.init[k])
               and res["params"][k].tobytes() in onnx_bytes
               and env.init[k].tobytes() not in onnx_bytes]
    rep.check(f"{name} frozen values bit-identical, others trained",
              same == list(frozen) and changed == want,
              f"byte-identical to init in the bundle and the exported ONNX: {same}; "
              f"trained and exported: {changed}")
    # Dynamics: the numpy trajectory with fc1 fixed at its initial value.
    check_grads(rep, name, env, res["grads"], keys=want)
    losses, _, _, ref = trajectory(env.model, env.init, hp, env.decayed, steps, frozen=frozen)
    got = [float(res["metrics"][t]["loss"]) for t in range(1, steps + 1)]
    e_l = max(abs(a - b) / b for a, b in zip(got, losses))
    problems, wp, wu = compare_params(res["params"], ref, env.init, want, TOL_MULTI_PARAMS,
                                      TOL_UPDATE)
    rep.check(f"{name} follows the reference with fc1 fixed",
              not problems and e_l <= TOL_MULTI_LOSS,
              "; ".join(problems[:4] + [f"losses max rel {e_l:.2e}, params max rel {wp:.2e}, "
                                        f"update max rel {wu:.2e}"]))

    # Two patterns: an exact name and a glob; fc1.weight still trains through the frozen bias.
    name2 = "freeze_two_patterns"
    res2 = env.compile_and_train(rep, name2, "sgd:lr=0.1,weight_decay=0.05", 1,
                                 ["--freeze", "fc2.weight", "--freeze", "*.bias"])
    if res2 is not None:
        keys = sorted(k for k in res2["params"] if k in env.init)
        check_grads(rep, name2, env, res2["grads"], keys=["fc1.weight"])
        opt = RefOptimizer(hp_of("sgd", lr=0.1, weight_decay=0.05), env.decayed)
        ref = opt.step(env.init, {"fc1.weight": res2["grads"].get("fc1.weight", 0.0)}, 1, 0.1)
        problems, wp, wu = compare_params(res2["params"], ref, env.init, ["fc1.weight"],
                                          TOL_PARAMS, TOL_UPDATE)
        rep.check(f"{name2} trainable set and update", keys == ["fc1.weight"] and not problems,
                  "; ".join(problems + [f"trainable {keys}, params rel {wp:.2e}, "
                                        f"update rel {wu:.2e}"]))


def check_bad_options(rep, env):
    for label, extra, words in BAD_CASES:
        d = os.path.join(env.tmp, "bad")
        os.makedirs(d, exist_ok=True)
        out_path = os.path.join(d, "bad.forge")
        if os.path.exists(out_path):
            os.remove(out_path)
        args = ["--optimizer", "sgd:lr=0.1"] if "--optimizer" not in extra else []
        if "--loss" not in extra:
            args += ["--loss", LOSS]
        cmd = [env.forgec, env.onnx, "--target", "cpu", "--batch", str(BATCH), *args, *extra,
               "-o", out_path]
        rc, out = run(cmd)
        text = out.strip()
        lower = text.lower()
        crashed = rc is None or rc < 0 or any(s in text for s in
                                              ("Stack dump", "PLEASE submit", "Assertion",
                                               "Segmentation", "terminate called"))
        missing = [w for w in words if w.lower() not in lower]
        ok = rc not in (None, 0) and not crashed and not missing and "error" in lower \
            and not os.path.exists(out_path)
        rep.check(f"bad option: {label}", ok,
                  f"{' '.join(extra)} -> exit {rc}: {tail(text, 2)}"
                  + (f" [message lacks {missing}]" if missing else "")
                  + (" [crashed]" if crashed else "")
                  + (" [wrote a bundle]" if os.path.exists(out_path) else ""))


# --------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description="Forge e2e: optimizer / schedule / clip / freeze math")
    ap.add_argument("cases", nargs="*",
                    help="groups to run: one_step multi clip grad_norm schedule freeze bad (default all)")
    e2e.add_tool_args(ap)
    ap.add_argument("--fixture-dir", default=DEFAULT_FIXTURE)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    groups = set(a.cases or ["one_step", "multi", "clip", "grad_norm", "schedule", "freeze", "bad"])

    tools = e2e.find_tools(a, "test_optimizers")
    if not tools:
        return 2
    forgec, forge_train = tools
    rep = Report()
    tmp = tempfile.mkdtemp(prefix="forge-optimizers-")
    try:
        env = Env(forgec, forge_train, a.fixture_dir, tmp)
        if check_reference(rep, env):
            def guarded(label, fn, *args):
                try:
                    fn(*args)
                except Exception as e:  # a broken case fails itself, not the run
                    rep.check(label, False, f"{type(e).__name__}: {e}")

            if "one_step" in groups:
                for n, (spec, hp, variants) in OPTIMIZER_CASES.items():
                    guarded(n, check_one_step, rep, env, n, spec, hp, variants)
            if "multi" in groups:
                for n, (spec, hp, steps, variants) in MULTI_CASES.items():
                    guarded(f"{n}_{steps}", check_multi, rep, env, f"{n}_{steps}", spec, hp,
                            steps, (), None, None, (), variants)
            if "clip" in groups:
                for n, (spec, hp, clip, steps) in CLIP_CASES.items():
                    guarded(n, check_clip, rep, env, n, spec, hp, clip, steps)
            if "grad_norm" in groups:
                guarded("grad_norm", check_grad_norm_flag, rep, env)
            if "schedule" in groups:
                for n, (arg, sched, spec, hp) in SCHEDULE_CASES.items():
                    guarded(f"schedule_{n}", check_schedule, rep, env, f"schedule_{n}", arg,
                            sched, spec, hp)
            if "freeze" in groups:
                guarded("freeze", check_freeze, rep, env)
            if "bad" in groups:
                guarded("bad options", check_bad_options, rep, env)
    finally:
        if a.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
