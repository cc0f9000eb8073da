#!/usr/bin/env python3
"""Data parallelism on CPU ranks (issue #14; ctest e2e_data_parallel).

Each case compiles a fixture's model twice (hyperparameters from its manifest.json):
  forgec model.onnx --batch B --dp D [--micro-batches K] -o T/dp.forge    (per rank: K x B)
  forgec model.onnx --batch D*K*B                       -o T/one.forge   (one process)
and trains both 20 steps with shuffling (--seed 3), the first as `forge-train --nproc D` (D
processes over Gloo/TCP on this host), the second alone. Step s of both consumes the same
D*K*B samples (every rank draws the global order and takes its share), and the mean of the
ranks' gradients is the gradient of the global batch, so the runs differ by fp32 summation
order only. Required (relative, L2 per tensor, float64):
  losses            rank 0's metrics (the loss averaged over the ranks) vs one process: 1e-5
  final parameters  rank 0's --dump-params vs one process: 1e-5
Cases: mlp_adamw D=2; mlp_adamw D=3 with K=2; gpt_adamw D=2 (token data, layer norms); and
with ZeRO-1 (--zero 1: Adam's moments split over the ranks, gradients reduce-scattered,
parameters all-gathered), mlp_adamw and gpt_adamw D=2 (the D=2 mlp's checkpoint, holding
whole moments, resumes in one process).

Resume on another group size: the D=2 mlp run writes a checkpoint at step 10 (rank 0
alone writes it); the one-process bundle resumes from it and trains to step 20: losses of
steps 11-20 and the final parameters as the uninterrupted D=2 run's (1e-5).

Errors, each a clear message: the D=2 bundle without a group ("compiled for 2 data-parallel
ranks", naming --nproc); --nproc 3 for it ("this run has 3"); a rank whose peer never
arrives (WORLD_SIZE=2 RANK=0 alone, --timeout 2) stops within the timeout naming the
rendezvous; --nproc with --info is refused.

  test_data_parallel.py [--bin-dir DIR | --forgec F --forge-train T] [--fixtures-dir DIR]
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

import forge_e2e as e2e

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 20
TOL = 1e-5


def compile_(forgec, fixture, out, batch, extra):
    m = json.load(open(os.path.join(fixture, "manifest.json")))
    loss = m["loss"]["forge"].split()[-1] if isinstance(m.get("loss"), dict) else \
        "cross_entropy:logits,labels"
    cmd = [forgec, os.path.join(fixture, "model.onnx"), "--batch", str(batch), "--loss", loss,
           "--optimizer", e2e.optimizer_spec(m["optimizer_hparams"]), "-o", out] + extra
    rc, _, log = e2e.run(cmd, 300)
    return rc, log


def train(forge_train, bundle, data, tmp, tag, extra, env=None):
    metrics, params = (os.path.join(tmp, f"{tag}.{x}") for x in ("jsonl", "npz"))
    cmd = [forge_train, bundle, "--data", data, "--seed", "3", "--threads", "1",
           "--metrics", metrics, "--dump-params", params] + extra
    old = dict(os.environ)
    if env:
        os.environ.update(env)
    try:
        rc, _, log = e2e.run(cmd, 300)
    finally:
        os.environ.clear()
        os.environ.update(old)
    if rc != 0:
        return rc, log, None, None
    return rc, log, e2e.metric_losses(metrics), dict(np.load(params))


def fault_run(forge_train, bundle, data, sig, extra=()):
    """Trains `bundle` on 2 ranks for a long time, sends `sig` to rank 1 once both are
    stepping, and waits for the launcher: (status, output, seconds after the signal)."""
    p = subprocess.Popen([forge_train, bundle, "--data", data, "--steps", "1000000", "--nproc",
                          "2", "--threads", "1", "--timeout", "3", "--log-every", "1000"] +
                         list(extra),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rank1 = None
    deadline = time.monotonic() + 60
    while rank1 is None and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.2)
        for child in os.popen(f"pgrep -P {p.pid}").read().split():
            try:
                env = open(f"/proc/{child}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            if b"RANK=1" in env:
                rank1 = int(child)
    time.sleep(1.0)  # both ranks past the rendezvous, stepping
    t0 = time.monotonic()
    if rank1 is not None:
        os.kill(rank1, sig)
    try:
        out, _ = p.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        return None, out, time.monotonic() - t0
    if sig == signal.SIGSTOP and rank1 is not None:
        try:
            os.kill(rank1, signal.SIGKILL)
        except OSError:
            pass
    return p.returncode, out, time.monotonic() - t0


def worst_rel(a, b):
    return max((abs(x - y) / abs(y) for x, y in zip(a, b)), default=float("inf"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    e2e.add_tool_args(ap)
    ap.add_argument("--fixtures-dir", default=os.path.join(HERE, "..", "fixtures"))
    a = ap.parse_args()
    tools = e2e.find_tools(a, "test_data_parallel")
    if not tools:
        return 2
    forgec, forge_train = tools
    rep = e2e.Report()
    cases = [("mlp_adamw", 2, 1, 4, []), ("mlp_adamw", 3, 2, 2, []), ("gpt_adamw", 2, 1, 2, []),
             ("mlp_adamw", 2, 1, 4, ["--zero", "1"]), ("gpt_adamw", 2, 1, 2, ["--zero", "1"])]
    with tempfile.TemporaryDirectory(prefix="forge-dp-") as tmp:
        for fixture_name, d, k, b, flags in cases:
            fixture = os.path.join(a.fixtures_dir, fixture_name)
            data = os.path.join(fixture, "batches.npz")
            zero = "--zero" in flags
            tag = f"{fixture_name} --dp {d}" + (f" --micro-batches {k}" if k > 1 else "") + \
                (" --zero 1" if zero else "")
            dp, one = (os.path.join(tmp, f"{fixture_name}_{d}_{k}{'_z' if zero else ''}_{x}.forge")
                       for x in ("dp", "one"))
            extra = ["--dp", str(d)] + (["--micro-batches", str(k)] if k > 1 else []) + flags
            rc1, log1 = compile_(forgec, fixture, dp, b, extra)
            rc2, log2 = compile_(forgec, fixture, one, d * k * b, [])
            if not rep.check(f"{tag}: forgec", rc1 == 0 and rc2 == 0,
                             e2e.failure(rc1, log1) if rc1 else e2e.failure(rc2, log2)):
                continue
            if zero:  # Adam's two moments, split over D ranks where dim 0 divides by D
                _, _, info = e2e.run([forge_train, "--info", dp], 60)
                m = re.search(r"(\d+) parameter \((\d+) bytes\), (\d+) state \((\d+) bytes\)",
                              info)
                pbytes, sbytes = (int(m.group(2)), int(m.group(4))) if m else (0, -1)
                # The mlp's every dim 0 is even: its state is 2/D of the parameters'.
                want = sbytes == 2 * pbytes // d if fixture_name == "mlp_adamw" else \
                    0 < sbytes < 2 * pbytes
                rep.check(f"{tag}: the optimizer state is split", want,
                          f"parameters {pbytes} bytes, state {sbytes} bytes per rank")
            ckpt = os.path.join(tmp, f"ckpt_{fixture_name}_{d}_{k}{'_z' if zero else ''}")
            resume = fixture_name == "mlp_adamw" and d == 2
            rc, log, losses, params = train(
                forge_train, dp, data, tmp, f"dp{d}{k}{fixture_name}{'z' if zero else ''}",
                ["--nproc", str(d), "--steps", str(STEPS)] +
                (["--ckpt-dir", ckpt, "--ckpt-every", "10"] if resume else []) +
                # Sharded checkpoints (a file per rank) by default; one whole file on request.
                (["--ckpt-format", "whole"] if resume and not zero else []))
            if not rep.check(f"{tag}: forge-train --nproc {d}", rc == 0, e2e.failure(rc, log)):
                continue
            rc, log, ref_losses, ref_params = train(forge_train, one, data, tmp,
                                                    f"one{d}{k}{fixture_name}",
                                                    ["--steps", str(STEPS)])
            if not rep.check(f"{tag}: one process, batch {d * k * b}", rc == 0,
                             e2e.failure(rc, log)):
                continue
            w = worst_rel(losses, ref_losses)
            rep.check(f"{tag}: losses == one process", len(losses) == STEPS and w <= TOL,
                      f"{len(losses)} steps, worst rel {w:.2e} (<= {TOL:g}), last "
                      f"{losses[-1]!r} vs {ref_losses[-1]!r}")
            worst = max(e2e.rel(params[n], ref_params[n]) for n in ref_params)
            rep.check(f"{tag}: parameters == one process", set(params) == set(ref_params) and
                      worst <= TOL, f"{len(params)} tensors, worst rel {worst:.2e}")
            if resume:
                files = sorted(os.listdir(ckpt)) if os.path.isdir(ckpt) else []
                if zero:
                    rep.check(f"{tag}: the ranks wrote sharded checkpoints (a file each)",
                              all(e2e.sharded_checkpoint(ckpt, f"ckpt-{s}.forgeckpt", d)
                                  for s in (10, 20)), str(files))
                else:
                    rep.check(f"{tag}: --ckpt-format whole: rank 0 wrote one file each",
                              all(os.path.isfile(os.path.join(ckpt, f"ckpt-{s}.forgeckpt"))
                                  for s in (10, 20)), str(files))
                e2e.keep_only_checkpoint(ckpt, "ckpt-10.forgeckpt")
                rc, log, res_losses, res_params = train(
                    forge_train, one, data, tmp, f"resumed{'z' if zero else ''}",
                    ["--steps", str(STEPS), "--ckpt-dir", ckpt, "--resume"])
                ok = rc == 0
                if rep.check(f"{tag}: resume the D={d} checkpoint in one process", ok,
                             e2e.failure(rc, log)):
                    w = worst_rel(res_losses[-10:], losses[-10:])
                    rep.check(f"{tag}: resumed losses 11-20 == the D={d} run's",
                              len(res_losses) >= 10 and w <= TOL, f"worst rel {w:.2e}")
                    worst = max(e2e.rel(res_params[n], params[n]) for n in params)
                    rep.check(f"{tag}: resumed parameters == the D={d} run's", worst <= TOL,
                              f"worst rel {worst:.2e}")

        # Errors.
        fixture = os.path.join(a.fixtures_dir, "mlp_adamw")
        data = os.path.join(fixture, "batches.npz")
        dp2 = os.path.join(tmp, "mlp_adamw_2_1_dp.forge")
        rc, _, log = e2e.run([forge_train, dp2, "--data", data, "--steps", "2"], 120)
        rep.check("dp bundle without a group", rc not in (0, None) and
                  "compiled for 2 data-parallel ranks" in log and "--nproc 2" in log,
                  e2e.tail(log, 2))
        rc, _, log = e2e.run([forge_train, dp2, "--data", data, "--steps", "2", "--nproc", "3"],
                             120)
        rep.check("--nproc 3 for a --dp 2 bundle", rc not in (0, None) and "this run has 3" in log
                  and "rank" in log, e2e.tail(log, 2))
        with socket.socket() as sk:  # a port nobody listens on
            sk.bind(("127.0.0.1", 0))
            port = sk.getsockname()[1]
        env = {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        t0 = time.monotonic()
        rc, log, _, _ = train(forge_train, dp2, data, tmp, "alone", ["--steps", "2", "--timeout",
                                                                        "2"], env)
        rep.check("rank 0 alone stops within --timeout", rc not in (0, None) and
                  time.monotonic() - t0 < 60 and "within 2 s" in log, e2e.tail(log, 2))
        # A rank that dies (SIGKILL) or hangs (SIGSTOP) mid-run: the other stops with an
        # error, and the launcher ends within its bounds, naming the rank.
        for sig, name in ((signal.SIGKILL, "killed"), (signal.SIGSTOP, "stopped")):
            rc, log, dt = fault_run(forge_train, dp2, data, sig)
            # Killed: the launcher names rank 1's signal. Stopped: rank 0's collective times
            # out (Gloo's "Timed out waiting ..."), and the launcher names rank 0's exit.
            want = ("rank 1 of 2 was killed by signal 9" if sig == signal.SIGKILL
                    else "rank 0 of 2 exited with status 1")
            rep.check(f"a rank {name} mid-run stops the group", rc not in (0, None) and
                      dt < 60 and want in log and
                      (sig == signal.SIGKILL or "timed out" in log.lower()),
                      f"{dt:.1f} s: " + e2e.tail(log, 3))
        # Ctrl-C reaching one rank only: the ranks agree on the step to stop after, rank 0
        # writes the checkpoint of that step, every rank exits 130 (no failure), and the
        # checkpoint resumes.
        ckpt = os.path.join(tmp, "ckpt_interrupted")
        rc, log, dt = fault_run(forge_train, dp2, data, signal.SIGINT, ["--ckpt-dir", ckpt])
        m = re.search(r"interrupted after step (\d+)", log or "")
        stopped = int(m.group(1)) if m else -1
        rep.check("Ctrl-C to one rank stops both after the same step", rc == 130 and dt < 60 and
                  stopped > 0 and "stopping the other" not in log and "timed out" not in log,
                  f"status {rc}, {dt:.1f} s: " + e2e.tail(log, 3))
        rep.check("... and the ranks wrote that step's checkpoint",
                  e2e.sharded_checkpoint(ckpt, f"ckpt-{stopped}.forgeckpt", 2),
                  str(sorted(os.listdir(ckpt)) if os.path.isdir(ckpt) else "no directory"))
        rc, _, log = e2e.run([forge_train, dp2, "--data", data, "--nproc", "2", "--threads", "1",
                              "--steps", str(stopped + 2), "--ckpt-dir", ckpt, "--resume"], 120)
        rep.check("... which resumes on 2 ranks", rc == 0 and f"at step {stopped}" in log,
                  e2e.tail(log, 2))
        rc, _, log = e2e.run([forge_train, dp2, "--info", "--nproc", "2"], 60)
        rep.check("--nproc with --info", rc not in (0, None) and "--nproc" in log,
                  e2e.tail(log, 1))
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
