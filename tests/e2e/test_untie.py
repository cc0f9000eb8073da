#!/usr/bin/env python3
"""Parameters an exporter merged are trained untied (forgec's default), or shared on request.

torch.onnx.export in eval mode (its default) merges parameters of equal value into one
initializer and leaves Identity nodes named after the others. This builds such a model by hand
(a two-layer MLP whose zero biases and whose two equal weight matrices were merged, plus a
truly tied use of one weight without an Identity) and the same model with every parameter its
own initializer (as PyTorch has it), then trains both 10 SGD steps on the CPU:

  untied (default)             forgec says it untied 2; losses and every parameter equal the
                               reference model's bit for bit (same math, same order); the
                               untied copies differ from their source after training
  --keep-shared-initializers   the merged tensors train as one: the trajectory differs
  --export-onnx                the untied model exports each untied parameter as an
                               initializer of its own with its trained value (no Identity left)

  test_untie.py [--bin-dir DIR | --forgec F --forge-train T]
"""
import argparse
import os
import sys
import tempfile

import numpy as np

import forge_e2e as e2e


def models(tmp):
    """(merged model path, reference model path)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(7)
    w = rng.normal(0, 0.5, (6, 6)).astype(np.float32)
    zeros = np.zeros(6, np.float32)
    head = rng.normal(0, 0.5, (6, 3)).astype(np.float32)

    def build(path, merged):
        inits = [numpy_helper.from_array(w, "l1.weight"), numpy_helper.from_array(zeros, "l1.bias"),
                 numpy_helper.from_array(head, "head.weight")]
        nodes = []
        if merged:  # l2.* are Identity nodes of l1.*'s initializers, as the exporter leaves them
            nodes += [helper.make_node("Identity", ["l1.weight"], ["l2.weight"], name="Identity_0"),
                      helper.make_node("Identity", ["l1.bias"], ["l2.bias"], name="Identity_1")]
        else:
            inits += [numpy_helper.from_array(w, "l2.weight"),
                      numpy_helper.from_array(zeros, "l2.bias")]
        nodes += [
            helper.make_node("Gemm", ["x", "l1.weight", "l1.bias"], ["h1"], name="fc1"),
            helper.make_node("Tanh", ["h1"], ["a1"], name="act1"),
            helper.make_node("Gemm", ["a1", "l2.weight", "l2.bias"], ["h2"], name="fc2"),
            # A truly tied use (no Identity): l1.weight again, so it stays one parameter.
            helper.make_node("MatMul", ["h2", "l1.weight"], ["h3"], name="tied"),
            helper.make_node("Tanh", ["h3"], ["a3"], name="act3"),
            helper.make_node("MatMul", ["a3", "head.weight"], ["logits"], name="head"),
        ]
        graph = helper.make_graph(
            nodes, "merged" if merged else "reference",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                  producer_name="pytorch")
        onnx.save(model, path)

    merged, reference = os.path.join(tmp, "merged.onnx"), os.path.join(tmp, "reference.onnx")
    build(merged, True)
    build(reference, False)
    x = rng.normal(0, 1, (40, 6)).astype(np.float32)
    labels = rng.integers(0, 3, 40).astype(np.int64)
    np.savez(os.path.join(tmp, "data.npz"), x=x, labels=labels)
    return merged, reference


def train(rep, forgec, forge_train, tmp, model, tag, extra=(), export=False):
    """Compiles and trains 10 steps; (forgec output, losses, params npz) or None."""
    bundle = os.path.join(tmp, f"{tag}.forge")
    rc, t, log = e2e.run([forgec, model, "--batch", "8", "--loss", "cross_entropy:logits,labels",
                          "--optimizer", "sgd:lr=0.2", "-o", bundle, *extra])
    if not rep.check(f"{tag} forgec", rc == 0, e2e.failure(rc, log)):
        return None
    metrics, params = os.path.join(tmp, f"{tag}.jsonl"), os.path.join(tmp, f"{tag}.npz")
    cmd = [forge_train, bundle, "--data", os.path.join(tmp, "data.npz"), "--steps", "10",
           "--no-shuffle", "--threads", "1", "--metrics", metrics, "--dump-params", params]
    if export:
        cmd += ["--export-onnx", os.path.join(tmp, f"{tag}.trained.onnx")]
    rc2, t, log2 = e2e.run(cmd)
    if not rep.check(f"{tag} forge-train", rc2 == 0, e2e.failure(rc2, log2)):
        return None
    return log, e2e.metric_losses(metrics), dict(np.load(params))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    e2e.add_tool_args(ap)
    a = ap.parse_args()
    tools = e2e.find_tools(a, "test_untie")
    if not tools:
        return 2
    forgec, forge_train = tools
    rep = e2e.Report()
    names = ["l1.weight", "l1.bias", "l2.weight", "l2.bias", "head.weight"]
    with tempfile.TemporaryDirectory(prefix="forge-untie-") as tmp:
        merged, reference = models(tmp)
        ref = train(rep, forgec, forge_train, tmp, reference, "reference")
        untied = train(rep, forgec, forge_train, tmp, merged, "untied", export=True)
        shared = train(rep, forgec, forge_train, tmp, merged, "shared",
                       ("--keep-shared-initializers",))
        if ref and untied:
            rep.check("forgec reports the untied parameters", "untied 2 parameter(s)" in untied[0],
                      e2e.tail(untied[0], 2))
            rep.check("reference model: nothing to untie", "untied" not in ref[0],
                      e2e.tail(ref[0], 2))
            rep.check("untied losses == reference losses", untied[1] == ref[1],
                      f"untied {untied[1][-1]:.7f}, reference {ref[1][-1]:.7f}")
            same = [n for n in names if n in untied[2] and np.array_equal(untied[2][n], ref[2][n])]
            rep.check("untied parameters == reference parameters", same == names,
                      f"equal: {same}")
            moved = not np.array_equal(untied[2]["l2.bias"], untied[2]["l1.bias"]) and \
                not np.array_equal(untied[2]["l2.weight"], untied[2]["l1.weight"])
            rep.check("untied copies train apart from their source", moved,
                      f"|l2.bias - l1.bias| = {np.abs(untied[2]['l2.bias'] - untied[2]['l1.bias']).max():.3g}")
            import onnx
            from onnx import numpy_helper
            out = onnx.load(os.path.join(tmp, "untied.trained.onnx"))
            inits = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
            identities = [n.name for n in out.graph.node if n.op_type == "Identity"]
            rep.check("--export-onnx writes each untied parameter as its own initializer",
                      not identities and all(n in inits and np.array_equal(inits[n], untied[2][n])
                                             for n in names),
                      f"initializers {sorted(inits)}, Identity nodes left {identities}")
        if ref and shared:
            rep.check("--keep-shared-initializers trains them as one (trajectory differs)",
                      "l2.bias" not in shared[2] and shared[1][-1] != ref[1][-1],
                      f"shared {shared[1][-1]:.7f}, reference {ref[1][-1]:.7f}; "
                      f"parameters {sorted(shared[2])}")
    return rep.summary()


if __name__ == "__main__":
    sys.exit(main())
