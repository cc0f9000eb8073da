#!/usr/bin/env python3
"""forge-train's training command line, end to end, on hand-built bundles.

  forge_train_cli_test.py --forge-train BIN --make-bundles BIN --work-dir DIR

MakeTrainBundles writes the bundles of tests/unit/TrainTestUtil.h (a linear
model trained with SGD + momentum, no compiler needed); this script makes the
data with numpy and checks, through the CLI only: --help documents every
option, same seed => identical losses, a run stopped and resumed equals an
uninterrupted one, corrupt checkpoints are skipped and kept, another bundle's
checkpoints are refused, recipes (and CLI overrides), evaluation lines in the
metrics, data errors, --epochs, micro-batches, --dump-params, --dump-grads and
--export-onnx (when the onnx module is available). Exit status 0 when everything passes.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

FAILURES = []


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail and not ok else ""))
    if not ok:
        FAILURES.append(name)
    return ok


def run(args, expect_rc=0):
    p = subprocess.run([FORGE_TRAIN] + args, capture_output=True, text=True, timeout=120)
    if expect_rc is not None and p.returncode != expect_rc:
        print(f"  command: {' '.join(args)}\n  rc={p.returncode}\n  stderr:\n{p.stderr}")
    return p


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def losses(path):
    return [m["loss"] for m in metrics(path)]


def make_data(path, n, seed, dtype=np.float32, drop=None):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3)).astype(dtype)
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + 0.01 * rng.standard_normal((n, 1))).astype(
        np.float32)
    arrays = {"x": x, "y": y}
    if drop:
        arrays.pop(drop)
    np.savez(path, **arrays)


def main():
    global FORGE_TRAIN
    ap = argparse.ArgumentParser()
    ap.add_argument("--forge-train", required=True)
    ap.add_argument("--make-bundles", required=True)
    ap.add_argument("--work-dir", required=True)
    a = ap.parse_args()
    FORGE_TRAIN = a.forge_train
    w = a.work_dir
    shutil.rmtree(w, ignore_errors=True)
    os.makedirs(w)
    subprocess.run([a.make_bundles, w], check=True)
    b = os.path.join(w, "linear.forge")
    train, val = os.path.join(w, "train.npz"), os.path.join(w, "val.npz")
    make_data(train, 42, 0)
    make_data(val, 17, 1)
    J = lambda *p: os.path.join(w, *p)

    # --help documents every option.
    h = run(["--help"])
    opts = ["--info", "--forward", "--inputs", "--input", "--outputs", "--data", "--eval-data",
            "--token-dtype", "--seed", "--no-shuffle", "--steps", "--epochs", "--eval-every",
            "--threads", "--recipe", "--log-every", "--metrics", "--ckpt-dir", "--ckpt-every",
            "--resume", "--export-onnx", "--onnx-model", "--dump-params", "--dump-grads"]
    check("--help lists every option", h.returncode == 0 and all(o in h.stdout for o in opts),
          [o for o in opts if o not in h.stdout])

    # --info shows the routines.
    info = run([b, "--info"])
    check("--info lists train_step and eval",
          "train_step:" in info.stdout and "eval:" in info.stdout, info.stdout)

    # Same seed => identical losses; another seed => different.
    common = [b, "--data", train, "--steps", "25", "--threads", "2", "--log-every", "5"]
    r1 = run(common + ["--seed", "3", "--metrics", J("s1.jsonl")])
    r2 = run(common + ["--seed", "3", "--metrics", J("s2.jsonl")])
    r3 = run(common + ["--seed", "4", "--metrics", J("s3.jsonl")])
    if check("training runs", r1.returncode == 0 and r2.returncode == 0 and r3.returncode == 0):
        l1, l2, l3 = losses(J("s1.jsonl")), losses(J("s2.jsonl")), losses(J("s3.jsonl"))
        check("one metrics line per step", [m["step"] for m in metrics(J("s1.jsonl"))]
              == list(range(1, 26)))
        check("same seed, identical losses", l1 == l2)
        check("other seed, other losses", l1 != l3)
        check("the loss goes down", l1[-1] < l1[0], l1)
        m0 = metrics(J("s1.jsonl"))[0]
        check("metrics fields", all(k in m0 for k in
                                    ("step", "epoch", "loss", "lr", "grad_norm", "samples_per_s",
                                     "time_s")), m0)
        check("progress lines on a non-terminal", "step 25/25" in r1.stderr
              and "step 10/25" in r1.stderr, r1.stderr)

    # Stop at step 7, resume to 25: identical to the uninterrupted run.
    full = common + ["--seed", "3"]
    run(full + ["--ckpt-dir", J("ck_full"), "--ckpt-every", "5", "--dump-params",
                J("p_full.npz")])
    ck = J("ck")
    s = run(common[:3] + ["--steps", "7", "--threads", "2", "--seed", "3", "--ckpt-dir", ck,
                          "--ckpt-every", "5", "--metrics", J("r.jsonl")])
    check("checkpoints written", s.returncode == 0 and sorted(os.listdir(ck)) ==
          ["ckpt-5.forgeckpt", "ckpt-7.forgeckpt", "latest"], sorted(os.listdir(ck)))
    # An extra line as if the stopped run had gone on past its checkpoint.
    with open(J("r.jsonl"), "a") as f:
        f.write('{"step": 8, "loss": 123}\n')
    r = run(full + ["--ckpt-dir", ck, "--ckpt-every", "5", "--resume", "--metrics",
                    J("r.jsonl"), "--dump-params", J("p_resumed.npz")])
    if check("resume runs", r.returncode == 0, r.stderr):
        check("resume reports the step", "at step 7" in r.stderr, r.stderr)
        check("resumed losses == uninterrupted losses", losses(J("r.jsonl")) == l1,
              (losses(J("r.jsonl")), l1))
        pf, pr = np.load(J("p_full.npz")), np.load(J("p_resumed.npz"))
        check("resumed parameters == uninterrupted parameters",
              sorted(pf.files) == sorted(pr.files) and
              all(np.array_equal(pf[k], pr[k]) for k in pf.files))
        ckpt = np.load(os.path.join(ck, "ckpt-25.forgeckpt"))
        meta = json.loads(bytes(ckpt["forge_checkpoint"]).decode())
        check("checkpoint is a readable .npz", meta["step"] == 25 and "param/w" in ckpt.files
              and "state/opt.m.w" in ckpt.files, meta)

    # A corrupt latest checkpoint is skipped (and kept); the older one is used.
    latest = os.path.join(ck, "ckpt-25.forgeckpt")
    with open(latest, "rb") as f:
        good = f.read()
    bad = good[:len(good) // 2]
    with open(latest, "wb") as f:
        f.write(bad)
    r = run(full[:3] + ["--steps", "27", "--threads", "2", "--ckpt-dir", ck, "--ckpt-every", "5",
                        "--resume"])
    check("corrupt checkpoint skipped", r.returncode == 0 and "skipping" in r.stderr
          and "at step 20" in r.stderr, r.stderr)
    with open(latest, "rb") as f:
        check("corrupt checkpoint left in place", f.read() == bad)
    check("no checkpoint overwritten", os.path.exists(os.path.join(ck, "ckpt-25.1.forgeckpt")),
          sorted(os.listdir(ck)))

    # Another bundle's checkpoints are refused.
    r = run([J("linear_other.forge"), "--data", train, "--steps", "30", "--ckpt-dir",
             J("ck_full"), "--resume"], expect_rc=1)
    check("foreign checkpoint refused", r.returncode == 1 and "another model" in r.stderr,
          r.stderr)

    # Recipe, with a command-line override.
    with open(J("r.toml"), "w") as f:
        f.write(f'data = ["{train}"]\nsteps = 25\nseed = 3\nthreads = 2\n'
                f'metrics = "{J("recipe.jsonl")}"\nno-shuffle = false\n')
    r = run([b, "--recipe", J("r.toml")])
    check("recipe", r.returncode == 0 and losses(J("recipe.jsonl")) == l1, r.stderr)
    r = run([b, "--recipe", J("r.toml"), "--steps", "4"])
    check("command line overrides the recipe", r.returncode == 0 and
          len(metrics(J("recipe.jsonl"))) == 4, r.stderr)
    with open(J("bad.toml"), "w") as f:
        f.write("stepz = 3\n")
    r = run([b, "--recipe", J("bad.toml")], expect_rc=1)
    check("unknown recipe key", "unknown key 'stepz'" in r.stderr, r.stderr)

    # Evaluation.
    r = run([b, "--data", train, "--eval-data", val, "--steps", "10", "--eval-every", "4",
             "--metrics", J("e.jsonl")])
    if check("eval runs", r.returncode == 0, r.stderr):
        m = metrics(J("e.jsonl"))
        evals = [x["step"] for x in m if "eval_loss" in x]
        check("eval every 4 steps and at the end", evals == [4, 8, 10], evals)
        check("eval accuracy", all(0 <= x["eval_accuracy"] <= 1 for x in m if "eval_loss" in x))
        check("eval line", "eval loss" in r.stderr and "(15 samples)" in r.stderr, r.stderr)

    # --epochs: 42 samples, batch 4 -> 10 steps per epoch.
    r = run([b, "--data", train, "--epochs", "2", "--metrics", J("ep.jsonl")])
    check("--epochs", r.returncode == 0 and len(metrics(J("ep.jsonl"))) == 20, r.stderr)

    # Micro-batches: 2 x 2 over the same samples in file order ~ batch 4.
    r4 = run([b, "--data", train, "--steps", "6", "--no-shuffle", "--metrics", J("k1.jsonl")])
    rk = run([J("linear_k2.forge"), "--data", train, "--steps", "6", "--no-shuffle",
              "--metrics", J("k2.jsonl")])
    if check("micro-batch run", r4.returncode == 0 and rk.returncode == 0, rk.stderr):
        check("micro-batches == one larger batch",
              np.allclose(losses(J("k1.jsonl")), losses(J("k2.jsonl")), rtol=1e-5))

    # --dump-grads: the gradient of step 1 (w0, the first 4 samples in file order), not of a
    # later step; the exposed output changes nothing else.
    r = run([J("linear_grads.forge"), "--data", train, "--steps", "3", "--no-shuffle",
             "--metrics", J("g.jsonl"), "--dump-grads", J("g.npz")])
    if check("--dump-grads", r.returncode == 0 and "wrote the gradients of step 1" in r.stderr,
             r.stderr):
        d = np.load(train)
        x, y = d["x"][:4].astype(np.float64), d["y"][:4].astype(np.float64)
        w0 = np.array([[0.5], [-0.25], [0.125]])
        want = 2.0 / 4 * x.T @ (x @ w0 - y)
        g = np.load(J("g.npz"))
        check("--dump-grads writes d loss / d w of step 1",
              g.files == ["w"] and g["w"].shape == (3, 1) and g["w"].dtype == np.float32
              and np.allclose(g["w"], want, rtol=1e-5, atol=1e-6), (g.files, g["w"], want))
        r0 = run([b, "--data", train, "--steps", "3", "--no-shuffle", "--metrics",
                  J("g0.jsonl")])
        check("exposing gradients changes no loss",
              r0.returncode == 0 and losses(J("g.jsonl")) == losses(J("g0.jsonl")))
    r = run([b, "--data", train, "--steps", "1", "--dump-grads", J("none.npz")], expect_rc=1)
    check("--dump-grads needs forge.grad outputs",
          "has no gradient outputs" in r.stderr and "--expose-gradients" in r.stderr
          and not os.path.exists(J("none.npz")), r.stderr)

    # Data errors name the file and the array.
    make_data(J("no_y.npz"), 10, 0, drop="y")
    r = run([b, "--data", J("no_y.npz"), "--steps", "1"], expect_rc=1)
    check("missing array", "no_y.npz: no array for the bundle input 'y'" in r.stderr, r.stderr)
    make_data(J("f64.npz"), 10, 0, dtype=np.float64)
    r = run([b, "--data", J("f64.npz"), "--steps", "1"], expect_rc=1)
    check("wrong dtype", "f64.npz: array 'x' has dtype f64, the bundle input 'x' needs f32"
          in r.stderr, r.stderr)
    r = run([b, "--data", train, "--steps", "1", "--eval-every", "2"], expect_rc=1)
    check("--eval-every needs --eval-data", "--eval-every needs --eval-data" in r.stderr)
    r = run([b, "--data", train], expect_rc=1)
    check("--steps or --epochs required", "--steps N or --epochs E" in r.stderr)
    r = run([b, "--data", train, "--steps", "1", "--epochs", "1"], expect_rc=1)
    check("--steps excludes --epochs", r.returncode == 1)

    # --export-onnx.
    try:
        import onnx
        from onnx import helper, numpy_helper, TensorProto
    except ImportError:
        print("skip --export-onnx (no onnx module)")
        onnx = None
    if onnx:
        w0 = np.array([[0.5], [-0.25], [0.125]], np.float32)
        g = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["pred"])], "linear",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
            [helper.make_tensor_value_info("pred", TensorProto.FLOAT, [4, 1])],
            [numpy_helper.from_array(w0, "w")])
        onnx.save(helper.make_model(g), J("src.onnx"))
        r = run([b, "--data", train, "--steps", "5", "--export-onnx", J("out.onnx"),
                 "--onnx-model", J("src.onnx"), "--dump-params", J("p5.npz")])
        if check("--export-onnx", r.returncode == 0, r.stderr):
            out = {t.name: numpy_helper.to_array(t) for t in onnx.load(J("out.onnx")).graph.initializer}
            check("exported initializer == trained parameter",
                  np.array_equal(out["w"], np.load(J("p5.npz"))["w"]) and
                  not np.array_equal(out["w"], w0))
        r = run([b, "--data", train, "--steps", "1", "--export-onnx", J("x.onnx")], expect_rc=1)
        check("--export-onnx without a source model", "--onnx-model" in r.stderr, r.stderr)

    print(f"{len(FAILURES)} failure(s)" if FAILURES else "all passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
