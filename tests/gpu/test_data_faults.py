#!/usr/bin/env python3
"""Bad data that a kernel finds (ctest data_faults on the CPU, gpu_data_faults on CUDA).

Small models, each compiled once for cuda:sm_90 (CUDA bundles run on the CPU executor
too) and replayed by forge-replay with good data, which must match NumPy, and with bad data,
which must fail with an error naming the node and the problem:

  lookup  Gather with an index outside [-size, size)
  loss    NegativeLogLikelihoodLoss with a target class outside [0, C)
  ratio   integer Div by zero
  remainder  integer Mod by zero
  wide    Gather / NegativeLogLikelihoodLoss with int64 values past 2^32 (2^32 + 3 must fault,
          not read element 3: kernels index in 32 bits, so checks happen in the index's width)
  nd      GatherND with one index component outside its dim ([0, 5] into [3, 4]: folded into
          one linear index it would read element [1, 1])

a queued case, lookup_queued: three runs back to back (forge-replay --queue) and one wait, the
first with a bad index; its fault must be reported although two good runs followed (the fault
word is sticky, not cleared per run), and cases with good data only, where the GPU once disagreed with the CPU:

  nan_to_bool  Cast float -> bool (NaN is true)
  pad_fill     Pad int64 with constant_value INT64_MAX (the fill keeps its value)
  gemm_beta0   Gemm with beta 0 and a broadcast C holding NaN/inf (C is not read)
  pool_index   MaxPool's Indices of an all-zero uint8 input with padding (the pad value equals
               the data: an index must still name a real element)
  lse_inf      ReduceLogSumExp of [inf, 0] and [-inf, -inf] (inf and -inf, not NaN)

On CUDA the kernels report through the fault word (the run's error names the instruction,
op, node and kernel); on the CPU the kernels return the error themselves.

  test_data_faults.py --forgec F --replay R --device cpu|cuda        (compiles, then runs)
  test_data_faults.py --forgec F --bundles DIR --compile-only         (here, for a GPU machine)
  test_data_faults.py --bundles DIR --replay R --device cuda          (there)
"""
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import forge_e2e as e2e  # noqa: E402


def models():
    """name -> (onnx ModelProto, good inputs, bad inputs, expected output of the good inputs,
    (op, regex per device) that the bad run's error must name and match)."""
    from onnx import TensorProto, helper

    def model(node, inputs, output):
        graph = helper.make_graph([node], node.name, inputs, [output])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    table = np.arange(15, dtype=np.float32).reshape(5, 3)
    good_idx = np.array([0, 4, -1, 2], dtype=np.int64)
    def gather(name):
        return model(helper.make_node("Gather", ["table", "idx"], ["rows"], name=name, axis=0),
                     [helper.make_tensor_value_info("table", TensorProto.FLOAT, [5, 3]),
                      helper.make_tensor_value_info("idx", TensorProto.INT64, [4])],
                     helper.make_tensor_value_info("rows", TensorProto.FLOAT, [4, 3]))
    lookup = gather("lookup")

    logits = np.log(np.array([[.1, .2, .3, .4], [.25, .25, .25, .25], [.7, .1, .1, .1]],
                             dtype=np.float32))
    good_target = np.array([3, 0, 0], dtype=np.int64)
    def nll(name):
        return model(helper.make_node("NegativeLogLikelihoodLoss", ["logp", "target"], ["nll"],
                                      name=name, reduction="mean"),
                     [helper.make_tensor_value_info("logp", TensorProto.FLOAT, [3, 4]),
                      helper.make_tensor_value_info("target", TensorProto.INT64, [3])],
                     helper.make_tensor_value_info("nll", TensorProto.FLOAT, []))
    loss = nll("loss")

    a = np.array([7, -9, 100, 5], dtype=np.int32)
    good_b = np.array([2, 4, -7, 1], dtype=np.int32)
    ratio = model(helper.make_node("Div", ["a", "b"], ["q"], name="ratio"),
                  [helper.make_tensor_value_info("a", TensorProto.INT32, [4]),
                   helper.make_tensor_value_info("b", TensorProto.INT32, [4])],
                  helper.make_tensor_value_info("q", TensorProto.INT32, [4]))
    # Integer division truncates toward zero (C, ONNX), not toward -inf (NumPy's //).
    quotient = (np.sign(a) * np.sign(good_b) * (np.abs(a) // np.abs(good_b))).astype(np.int32)

    x = np.array([np.nan, 0.0, -0.0, 1.5, np.inf, -2.0], dtype=np.float32)
    to_bool = model(helper.make_node("Cast", ["x"], ["b"], name="nan_to_bool", to=TensorProto.BOOL),
                    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
                    helper.make_tensor_value_info("b", TensorProto.BOOL, [6]))

    big = np.iinfo(np.int64).max
    v = np.array([[1, -2], [3, 4]], dtype=np.int64)
    pad = helper.make_model(helper.make_graph(
        [helper.make_node("Pad", ["v", "pads", "fill"], ["padded"], name="pad_fill")], "pad_fill",
        [helper.make_tensor_value_info("v", TensorProto.INT64, [2, 2])],
        [helper.make_tensor_value_info("padded", TensorProto.INT64, [3, 4])],
        [helper.make_tensor("pads", TensorProto.INT64, [4], [1, 1, 0, 1]),
         helper.make_tensor("fill", TensorProto.INT64, [], [int(big)])]),
        opset_imports=[helper.make_opsetid("", 17)])
    padded = np.pad(v, ((1, 0), (1, 1)), constant_values=big)

    ga = np.arange(6, dtype=np.float32).reshape(2, 3)
    gb = np.arange(12, dtype=np.float32).reshape(3, 4) / 4
    gc = np.array([[np.nan], [np.inf]], dtype=np.float32)  # [M, 1]: not cuBLASLt's bias form
    gemm = model(helper.make_node("Gemm", ["ga", "gb", "gc"], ["gy"], name="gemm_beta0",
                                  alpha=1.0, beta=0.0),
                 [helper.make_tensor_value_info("ga", TensorProto.FLOAT, [2, 3]),
                  helper.make_tensor_value_info("gb", TensorProto.FLOAT, [3, 4]),
                  helper.make_tensor_value_info("gc", TensorProto.FLOAT, [2, 1])],
                 helper.make_tensor_value_info("gy", TensorProto.FLOAT, [2, 4]))

    wide_idx = np.array([0, 2**32 + 3, 1, 2], dtype=np.int64)

    nd_data = np.arange(12, dtype=np.float32).reshape(3, 4)
    nd = model(helper.make_node("GatherND", ["nd_data", "nd_idx"], ["picked"], name="nd"),
               [helper.make_tensor_value_info("nd_data", TensorProto.FLOAT, [3, 4]),
                helper.make_tensor_value_info("nd_idx", TensorProto.INT64, [2, 2])],
               helper.make_tensor_value_info("picked", TensorProto.FLOAT, [2]))
    nd_good = np.array([[1, 2], [2, -1]], dtype=np.int64)

    pool = model(helper.make_node("MaxPool", ["img"], ["pooled", "where"], name="pool_index",
                                  kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                 [helper.make_tensor_value_info("img", TensorProto.UINT8, [1, 1, 3, 3])],
                 helper.make_tensor_value_info("where", TensorProto.INT64, [1, 1, 3, 3]))
    pool.graph.output.insert(0, helper.make_tensor_value_info("pooled", TensorProto.UINT8,
                                                              [1, 1, 3, 3]))
    del pool.graph.output[0]  # only the indices are checked
    pool.graph.node[0].output[0] = ""
    # ONNX: the first maximum in window order among the real elements (all are 0 here).
    first_real = np.array([[[[(max(oh - 1, 0)) * 3 + max(ow - 1, 0) for ow in range(3)]
                             for oh in range(3)]]], dtype=np.int64)

    lse = model(helper.make_node("ReduceLogSumExp", ["v"], ["lse"], name="lse_inf",
                                 axes=[1], keepdims=0),
                [helper.make_tensor_value_info("v", TensorProto.FLOAT, [2, 2])],
                helper.make_tensor_value_info("lse", TensorProto.FLOAT, [2]))
    lse.opset_import[0].version = 17
    lse_in = np.array([[np.inf, 0.0], [-np.inf, -np.inf]], dtype=np.float32)
    remainder = model(helper.make_node("Mod", ["a", "b"], ["r"], name="remainder"),
                      [helper.make_tensor_value_info("a", TensorProto.INT32, [4]),
                       helper.make_tensor_value_info("b", TensorProto.INT32, [4])],
                      helper.make_tensor_value_info("r", TensorProto.INT32, [4]))

    return {
        "lookup_wide": (gather("lookup_wide"), {"table": table, "idx": good_idx},
                        {"table": table, "idx": wide_idx}, table[good_idx],
                        ("gather", {"cpu": r"out of range for extent 5",
                                    "cuda": r"outside \[-size, size\)"})),
        "loss_wide": (nll("loss_wide"), {"logp": logits, "target": good_target},
                      {"logp": logits, "target": np.array([0, 2**32 + 1, 1], dtype=np.int64)},
                      np.float32(-logits[np.arange(3), good_target].mean()),
                      ("nll_loss", {"cpu": r"outside \[0, 4\)", "cuda": r"outside \[0, classes\)"})),
        "nd": (nd, {"nd_data": nd_data, "nd_idx": nd_good},
               {"nd_data": nd_data, "nd_idx": np.array([[0, 5], [1, 1]], dtype=np.int64)},
               nd_data[nd_good[:, 0], nd_good[:, 1]],
               ("gather", {"cpu": r"out of range for extent 12",
                           "cuda": r"outside \[-size, size\)"})),
        "pool_index": (pool, {"img": np.zeros((1, 1, 3, 3), np.uint8)}, None, first_real, None),
        "lse_inf": (lse, {"v": lse_in}, None, np.array([np.inf, -np.inf], np.float32), None),
        "nan_to_bool": (to_bool, {"x": x}, None, x != 0, None),
        "pad_fill": (pad, {"v": v}, None, padded, None),
        "gemm_beta0": (gemm, {"ga": ga, "gb": gb, "gc": gc}, None, ga @ gb, None),
        "lookup": (lookup, {"table": table, "idx": good_idx},
                   {"table": table, "idx": np.array([0, 5, 1, 2], dtype=np.int64)},
                   table[good_idx],
                   ("gather", {"cpu": r"out of range for extent 5", "cuda": r"outside \[-size, size\)"})),
        "loss": (loss, {"logp": logits, "target": good_target},
                 {"logp": logits, "target": np.array([0, 4, 1], dtype=np.int64)},
                 np.float32(-logits[np.arange(3), good_target].mean()),
                 ("nll_loss", {"cpu": r"outside \[0, 4\)", "cuda": r"outside \[0, classes\)"})),
        "ratio": (ratio, {"a": a, "b": good_b},
                  {"a": a, "b": np.array([1, 0, 2, 3], dtype=np.int32)}, quotient,
                  ("div", {"cpu": r"division by zero", "cuda": r"division by zero"})),
        # fmod=0: the divisor's sign, as NumPy's %.
        "remainder": (remainder, {"a": a, "b": good_b},
                      {"a": a, "b": np.array([1, 2, 0, 3], dtype=np.int32)},
                      np.mod(a, good_b).astype(np.int32),
                      ("mod", {"cpu": r"modulo by zero", "cuda": r"modulo by zero"})),
    }


def compile_cases(rep, forgec, bundles):
    import onnx
    os.makedirs(bundles, exist_ok=True)
    compile_queued(rep, forgec, bundles)
    for name, (proto, good, bad, expected, _) in models().items():
        onnx_path = os.path.join(bundles, name + ".onnx")
        onnx.save(proto, onnx_path)
        for kind, feeds in (("good", good), ("bad", bad)) if bad else (("good", good),):
            case = os.path.join(bundles, f"{name}_{kind}")
            os.makedirs(case, exist_ok=True)
            arrays = dict(feeds)
            arrays["expected:0"] = arrays["cpu:0"] = np.asarray(expected)
            np.savez(os.path.join(case, "set_0.npz"), **arrays)
        rc, t, log = e2e.run([forgec, onnx_path, "--inference-only", "--target", "cuda:sm_90",
                              "-o", os.path.join(bundles, f"{name}_good", "model.forge")])
        if rep.check(f"{name} forgec", rc == 0, f"{t:.1f}s {e2e.failure(rc, log)}"):
            if bad is None:
                continue
            with open(os.path.join(bundles, f"{name}_good", "model.forge"), "rb") as f:
                data = f.read()
            with open(os.path.join(bundles, f"{name}_bad", "model.forge"), "wb") as f:
                f.write(data)


QUEUED = "lookup_queued"


def queued_case():
    """(model, [inputs of each run]): a bad first run, then two good ones."""
    proto = models()["lookup_wide"][0]
    proto.graph.node[0].name = QUEUED
    good, bad = models()["lookup"][1], models()["lookup"][2]
    return proto, [bad, good, good], models()["lookup"][3]


def compile_queued(rep, forgec, bundles):
    import onnx
    proto, runs, expected = queued_case()
    case = os.path.join(bundles, QUEUED)
    os.makedirs(case, exist_ok=True)
    onnx.save(proto, os.path.join(bundles, QUEUED + ".onnx"))
    for k, feeds in enumerate(runs):
        np.savez(os.path.join(case, f"set_{k}.npz"), **feeds,
                 **{"expected:0": expected, "cpu:0": expected})
    rc, t, log = e2e.run([forgec, os.path.join(bundles, QUEUED + ".onnx"), "--inference-only",
                          "--target", "cuda:sm_90", "-o", os.path.join(case, "model.forge")])
    rep.check(f"{QUEUED} forgec", rc == 0, f"{t:.1f}s {e2e.failure(rc, log)}")


def replay_queued(rep, replay, bundles, device):
    with tempfile.TemporaryDirectory() as one:
        os.symlink(os.path.abspath(os.path.join(bundles, QUEUED)), os.path.join(one, QUEUED))
        rc, t, log = e2e.run([replay, one, "--device", device, "--queue"], timeout=300)
    failure = next((l for l in log.splitlines() if l.startswith("FAIL")), "")
    rep.check(f"{QUEUED} on {device}: a fault of the first of three queued runs is reported",
              rc == 1 and QUEUED in failure and "gather" in failure, e2e.tail(log, 3))


def replay_cases(rep, replay, bundles, device):
    replay_queued(rep, replay, bundles, device)
    for name, (_, _, bad, _, fault) in models().items():
        for kind in ("good", "bad") if bad else ("good",):
            case = os.path.join(bundles, f"{name}_{kind}")
            with tempfile.TemporaryDirectory() as one:  # forge-replay runs every case of a dir
                os.symlink(os.path.abspath(case), os.path.join(one, f"{name}_{kind}"))
                rc, t, log = e2e.run([replay, one, "--device", device], timeout=300)
            if kind == "good":
                rep.check(f"{name} good data on {device}", rc == 0 and "1 passed" in log,
                          e2e.failure(rc, log, 3))
            else:
                op, problem = fault
                failure = next((l for l in log.splitlines() if l.startswith("FAIL")), "")
                found = (f"'{name}'" in failure or f"({name})" in failure) and op in failure \
                    and re.search(problem[device], failure) is not None
                rep.check(f"{name} bad data on {device} fails naming node and problem",
                          rc == 1 and found, e2e.tail(log, 3))


if __name__ == "__main__":
    sys.exit(e2e.replay_check_main(__doc__, compile_cases, replay_cases))
