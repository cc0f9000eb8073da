#!/usr/bin/env python3
"""Length bucketing (issue #13 item 5): variable-length token documents batched by length into a
few compiled shapes of one bundle (forgec --length-buckets, forge-train --doc-separator).

The model is models/gpt.onnx (TorchScript GPT, causal, 32 positions) with its sequence dim made
symbolic ("seq"); the TorchScript export computes positions and the causal mask from the input's
shape, so it is length-generic. The loss ignores padding (cross_entropy:...,ignore=-100). Checks:
  * forgec --length-buckets seq=8,16,32 builds train_step/eval (T = 32) and train_step@len8,
    eval@len8, train_step@len16, eval@len16, sharing the parameters (forge-train --info);
  * documents of at most 8 positions: the bucketed bundle runs train_step@len8 on [B, 8], the
    plain bundle (--dim seq=32) pads them to 32; under causal attention the padding changes no
    real position, so the two trajectories agree step for step (rel <= TOL), and so do the eval
    losses on documents of every length (each bucket's eval vs the plain eval, token-weighted);
  * documents of mixed lengths: every bucket runs (metrics' "length" field), the padding share is
    below the plain bundle's, the loss falls, and a run resumed from a checkpoint repeats the
    uninterrupted one's losses exactly (the bucketed order resumes from the checkpoint);
  * --dp 2 on CPU ranks: each step's global samples are one bucket's; it trains as one process
    with the global batch does (documents of equal length per bucket);
  * --tp 2 on CPU ranks (the MLPs and the vocabulary split; the split loss ignores padding):
    it trains as one process does, bucket for bucket;
  * --micro-batches 2 (the loop: accumulate@len<T> per bucket) trains as one batch of 4;
  * refusals: a --dim for the bucketed dim, documents for a loss without ignore=N or for
    unrolled micro-batches, a dim name the
    model lacks (the import names the symbolic dim it has).

  test_length_buckets.py [--bin-dir DIR | --forgec F --forge-train T]
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import onnx

import forge_e2e as e2e

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.normpath(os.path.join(HERE, "..", "..", "models", "gpt.onnx"))
SEP, VOCAB, BATCH = 0, 128, 4
LOSS = "cross_entropy:logits,labels,ignore=-100"
OPT = "adamw:lr=0.003,weight_decay=0.01"
TOL = 2e-5


def symbolic_seq(path):
    """models/gpt.onnx with dim 1 of its input and output named 'seq'."""
    m = onnx.load(MODEL)
    del m.graph.value_info[:]
    for v in list(m.graph.input[:1]) + list(m.graph.output):
        d = v.type.tensor_type.shape.dim[1]
        d.ClearField("dim_value")
        d.dim_param = "seq"
    onnx.save(m, path)


def documents(path, lengths, seed):
    """A uint16 token shard of documents of `lengths` tokens each, each ending with SEP."""
    rng = np.random.default_rng(seed)
    toks = []
    for n in lengths:
        # A learnable pattern: a document counts up from a random start (mod the vocabulary).
        start = int(rng.integers(1, VOCAB))
        toks += [1 + (start + i) % (VOCAB - 1) for i in range(n - 1)] + [SEP]
    np.asarray(toks, dtype=np.uint16).tofile(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    e2e.add_tool_args(ap)
    a = ap.parse_args()
    tools = e2e.find_tools(a, "test_length_buckets")
    if not tools:
        return 2
    forgec, forge_train = tools
    rep = e2e.Report()
    with tempfile.TemporaryDirectory(prefix="forge-buckets-") as tmp:
        model = os.path.join(tmp, "gpt_seq.onnx")
        symbolic_seq(model)
        p = lambda name: os.path.join(tmp, name)

        def compile(out, extra, loss=LOSS):
            return e2e.run([forgec, model, "--target", "cpu", "--batch", str(BATCH), "--loss",
                            loss, "--optimizer", OPT, "-o", out] + extra)

        rc, _, log = compile(p("b.forge"), ["--length-buckets", "seq=16,8,32"])
        if not rep.check("compile with --length-buckets seq=8,16,32", rc == 0,
                         e2e.failure(rc, log)):
            return rep.summary()
        rc, _, log = compile(p("plain.forge"), ["--dim", "seq=32"])
        if not rep.check("compile the plain bundle (--dim seq=32)", rc == 0, e2e.failure(rc, log)):
            return rep.summary()
        rc, _, info = e2e.run([forge_train, "--info", p("b.forge")])
        want = ["train_step@len8", "eval@len8", "train_step@len16", "eval@len16", "train_step",
                "eval"]
        rep.check("--info lists every bucket's routines",
                  rc == 0 and all(w in info for w in want) and "seq=8,16,32" in info,
                  e2e.tail(info, 6))

        def train(bundle, data, tag, steps, extra=(), evals=None):
            metrics = p(tag + ".jsonl")
            if os.path.exists(metrics):
                os.remove(metrics)
            cmd = [forge_train, bundle, "--data", data, "--doc-separator", str(SEP), "--steps",
                   str(steps), "--device", "cpu", "--seed", "3", "--metrics", metrics]
            if evals:
                cmd += ["--eval-data", evals, "--eval-every", str(steps)]
            rc, _, log = e2e.run(cmd + list(extra))
            if rc != 0:
                return None, e2e.failure(rc, log)
            return [json.loads(line) for line in open(metrics) if line.strip()], ""

        # Short documents (2..9 tokens: 1..8 positions): bucket 8 against T = 32 with padding.
        rng = np.random.default_rng(0)
        documents(p("short.bin"), rng.integers(2, 10, 120), 1)
        documents(p("mixed_eval.bin"), rng.integers(2, 40, 40), 2)
        steps = 6
        got, why = train(p("b.forge"), p("short.bin"), "short_b", steps, evals=p("mixed_eval.bin"))
        ref, why2 = train(p("plain.forge"), p("short.bin"), "short_p", steps,
                          evals=p("mixed_eval.bin"))
        if rep.check("short documents train in both bundles", got and ref, why or why2):
            lengths = sorted({r.get("length") for r in got})
            rep.check("... the bucketed bundle runs them at T = 8, the plain one at 32",
                      lengths == [8] and sorted({r.get("length") for r in ref}) == [32],
                      f"{lengths} / {sorted({r.get('length') for r in ref})}")
            err = max(e2e.rel(x["loss"], y["loss"]) for x, y in zip(got, ref))
            rep.check("... and train identically (train_step@len8 == padded train_step)",
                      len(got) == len(ref) == steps and err <= TOL,
                      f"{steps} steps, max rel {err:.1e} (<= {TOL})")
            eb, ep = got[-1].get("eval_loss"), ref[-1].get("eval_loss")
            rep.check("each bucket's eval == the plain eval on documents of every length",
                      eb is not None and ep is not None and e2e.rel(eb, ep) <= TOL,
                      f"{eb} vs {ep}")

        # Mixed lengths: every bucket, less padding, a falling loss, and an exact resume.
        documents(p("mixed.bin"), rng.integers(2, 60, 400), 3)
        steps = 24
        got, why = train(p("b.forge"), p("mixed.bin"), "mixed_b", steps)
        ref, why2 = train(p("plain.forge"), p("mixed.bin"), "mixed_p", steps)
        if rep.check("mixed documents train", got and ref, why or why2):
            lengths = sorted({r["length"] for r in got})
            rep.check("... through every bucket", lengths == [8, 16, 32], f"{lengths}")
            pad_b = np.mean([r["padding"] for r in got])
            pad_p = np.mean([r["padding"] for r in ref])
            rep.check("... with less padding than one length", pad_b < pad_p,
                      f"padding {pad_b:.2f} (buckets) vs {pad_p:.2f} (T = 32)")
            first, last = np.mean([r["loss"] for r in got[:4]]), np.mean([r["loss"] for r in got[-4:]])
            rep.check("... and the loss falls", last < 0.8 * first,
                      f"first 4 steps {first:.3f}, last 4 {last:.3f}")
            ckpt = p("ckpt")
            part, why = train(p("b.forge"), p("mixed.bin"), "part", 10,
                              ["--ckpt-dir", ckpt, "--ckpt-every", "10"])
            rest, why2 = train(p("b.forge"), p("mixed.bin"), "rest", steps,
                               ["--ckpt-dir", ckpt, "--resume"])
            ok = part and rest and [r["loss"] for r in part] == [r["loss"] for r in got[:10]] \
                and [r["loss"] for r in rest] == [r["loss"] for r in got[10:]] \
                and [r["length"] for r in rest] == [r["length"] for r in got[10:]]
            rep.check("a resumed run repeats the uninterrupted one (losses and buckets)", ok,
                      why or why2 or f"{[r['loss'] for r in (rest or [])][:3]} vs "
                                     f"{[r['loss'] for r in got[10:13]]}")
            shutil.rmtree(ckpt, ignore_errors=True)

        # Data parallelism: a step's global samples are one bucket's, so both CPU ranks run the
        # same routine; documents of one length (equal labels per rank, so the ranks' mean of
        # means is the global mean) train as one process with the global batch. Tensor
        # parallelism: both ranks of the group read the step's batch and run the bucket's
        # routine on their halves of the MLPs and of the vocabulary (the split loss ignores
        # padding by the loss option's label); it trains as one process does.
        documents(p("even.bin"), [7] * 80 + [13] * 40 + [30] * 40, 4)
        for flag, batch, ref_tag, name in (
                ("--dp", BATCH // 2, "one",
                 "--dp 2 on CPU ranks == one process with the global batch"),
                ("--tp", BATCH, "one_tp", "--tp 2 on CPU ranks == one process, bucket for bucket")):
            tag = flag[2:]
            rc, _, log = e2e.run([forgec, model, "--target", "cpu", "--batch", str(batch), flag,
                                  "2", "--loss", LOSS, "--optimizer", OPT,
                                  "--length-buckets", "seq=8,16,32", "-o", p(tag + ".forge")])
            if not rep.check(f"compile {flag} 2 with --length-buckets", rc == 0,
                             e2e.failure(rc, log)):
                continue
            got, why = train(p(tag + ".forge"), p("even.bin"), tag, 8, ["--nproc", "2"])
            ref, why2 = train(p("b.forge"), p("even.bin"), ref_tag, 8)
            ok = got and ref and len(got) == len(ref) == 8
            err = max(e2e.rel(x["loss"], y["loss"]) for x, y in zip(got, ref)) if ok else 1
            rep.check(name,
                      ok and err <= TOL and [r["length"] for r in got] == [r["length"] for r in ref]
                      and len({r["length"] for r in got}) >= 2,
                      f"max rel {err:.1e} (<= {TOL}), lengths {[r['length'] for r in got]}"
                      if ok else why or why2)

        # The accumulation loop: accumulate@len<T> (accumulate_first@len<T>) K times, then
        # train_step@len<T>; 2 micro-batches of 2 train as one batch of 4 (equal lengths).
        rc, _, log = e2e.run([forgec, model, "--target", "cpu", "--batch", str(BATCH // 2),
                              "--micro-batches", "2", "--loss", LOSS, "--optimizer", OPT,
                              "--length-buckets", "seq=8,16,32", "-o", p("micro.forge")])
        if rep.check("compile --micro-batches 2 with --length-buckets", rc == 0,
                     e2e.failure(rc, log)):
            rc, _, info = e2e.run([forge_train, "--info", p("micro.forge")])
            rep.check("... each bucket has its accumulation routines",
                      all(r in info for r in ("accumulate@len8", "accumulate_first@len8",
                                              "accumulate@len16", "accumulate_first", "train_step@len8")),
                      e2e.tail(info, 3))
            got, why = train(p("micro.forge"), p("even.bin"), "micro", 8)
            ref, why2 = train(p("b.forge"), p("even.bin"), "one4", 8)
            ok = got and ref and len(got) == len(ref) == 8
            err = max(e2e.rel(x["loss"], y["loss"]) for x, y in zip(got, ref)) if ok else 1
            rep.check("2 micro-batches of 2 == one batch of 4, in every bucket",
                      ok and err <= TOL and [r["length"] for r in got] == [r["length"] for r in ref]
                      and len({r["length"] for r in got}) == 3,
                      f"max rel {err:.1e} (<= {TOL}), lengths {[r['length'] for r in got]}"
                      if ok else why or why2)

        # Refusals.
        rc, _, log = compile(p("x.forge"), ["--length-buckets", "seq=8,32", "--dim", "seq=32"])
        rep.check("--dim for the bucketed dim is refused",
                  rc not in (0, None) and "drop --dim seq" in log, e2e.tail(log, 1))
        rc, _, log = compile(p("x.forge"), ["--length-buckets", "len=8,32"])
        rep.check("a dim the model lacks is refused, naming the model's symbolic dim",
                  rc not in (0, None) and "dim 1 is symbolic ('seq')" in log, e2e.tail(log, 1))
        rc, _, log = compile(p("noignore.forge"), ["--length-buckets", "seq=8,32"],
                             loss="cross_entropy:logits,labels")
        if rep.check("a bundle without ignore=N compiles", rc == 0, e2e.failure(rc, log)):
            got, why = train(p("noignore.forge"), p("short.bin"), "noignore", 1)
            rep.check("... and documents for it are refused, naming ignore=N",
                      got is None and "ignore=-100" in why, why)
        # Unrolled micro-batches would bind one micro-batch's documents per step: refused.
        rc, _, log = compile(p("unroll.forge"), ["--dim", "seq=32", "--micro-batches", "2",
                                                 "--accumulate", "unroll"])
        if rep.check("an unrolled --micro-batches 2 bundle compiles", rc == 0,
                     e2e.failure(rc, log)):
            got, why = train(p("unroll.forge"), p("short.bin"), "unroll", 1)
            rep.check("... and documents for it are refused, naming the loop",
                      got is None and "unrolled micro-batches" in why, why)
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
