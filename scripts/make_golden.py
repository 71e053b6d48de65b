#!/usr/bin/python3
"""Writes the golden cases that the C++ harness compares against: models/golden/.

For each case: <name>.pt, the reference module with its weights (torch.jit.save of the scripted
module), <name>.state_dict.pt, the same weights as torch.save(dict(m.state_dict())), and
<name>.tensors.pt, a plain dict of tensors (torch.save): the inputs ("input.<arg>"),
the upstream gradient ("grad_output"), the output ("output") and the gradient of the output
against every input and parameter ("grad.<arg>", "grad.<parameter name>"). manifest.json lists
every case. Two runs write identical tensors.

    scripts/make_golden.py                 # rewrite models/golden/
    scripts/make_golden.py --out DIR       # write elsewhere
    scripts/make_golden.py --verify        # regenerate into a temporary folder and compare with
                                           # models/golden/; exit 1 naming every drifted case
"""

import argparse
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "models", "golden")

TOLERANCE = {"float32": {"atol": 1e-5, "rtol": 1e-5}, "float64": {"atol": 1e-12, "rtol": 1e-12}}
DTYPES = {"float32": torch.float32, "float64": torch.float64}
INPUT_NAMES = {"CrossAttention": ["x_1", "x_2"]}


def article_embedding():
    sentence = "Life is short, eat dessert first"
    words = sentence.replace(",", "").split()
    dc = {s: i for i, s in enumerate(sorted(words))}
    torch.manual_seed(123)
    embed = torch.nn.Embedding(50_000, 3)
    return embed(torch.tensor([dc[s] for s in words])).detach()


def case_list():
    """Every case: name, module, constructor args, input shapes, dtype, input magnitude."""
    cases = []

    def add(name, module, args, shapes, dtype="float32", magnitude=1.0, article=False):
        cases.append(dict(name=name, module=module, args=args, shapes=shapes, dtype=dtype,
                          magnitude=magnitude, article=article))

    # The article's own configurations, on its embedded sentence.
    add("article_self_attention", "SelfAttention", dict(d_in=3, d_out_kq=2, d_out_v=4), [[6, 3]],
        article=True)
    add("article_single_head", "SelfAttention", dict(d_in=3, d_out_kq=2, d_out_v=1), [[6, 3]],
        article=True)
    add("article_wrapper_4_heads", "MultiHeadAttentionWrapper",
        dict(d_in=3, d_out_kq=2, d_out_v=1, num_heads=4), [[6, 3]], article=True)
    add("article_causal", "CausalSelfAttention", dict(d_in=3, d_out_kq=2, d_out_v=4), [[6, 3]],
        article=True)
    add("article_cross_attention", "CrossAttention", dict(d_in=3, d_out_kq=2, d_out_v=4),
        [[6, 3], [8, 3]], article=True)

    # Every module over T in {1, 2, 6, 37, 128}, unbatched and batched, float32 and float64.
    batches = {1: 4, 2: 3, 6: 2, 37: 2, 128: 1}
    for t, b in batches.items():
        for dtype in ("float32", "float64"):
            tag = f"T{t}_{dtype}"
            add(f"self_unbatched_{tag}", "SelfAttention", dict(d_in=5, d_out_kq=3, d_out_v=4),
                [[t, 5]], dtype)
            add(f"self_batched_{tag}", "SelfAttention", dict(d_in=5, d_out_kq=4, d_out_v=2),
                [[b, t, 5]], dtype)
            add(f"causal_unbatched_{tag}", "CausalSelfAttention",
                dict(d_in=4, d_out_kq=3, d_out_v=5), [[t, 4]], dtype)
            add(f"causal_batched_{tag}", "CausalSelfAttention", dict(d_in=6, d_out_kq=2, d_out_v=3),
                [[b, t, 6]], dtype)
            t_kv = {1: 3, 2: 1, 6: 8, 37: 20, 128: 64}[t]
            add(f"cross_batched_{tag}", "CrossAttention",
                dict(d_in=4, d_out_kq=3, d_out_v=2, d_in_kv=7), [[b, t, 4], [b, t_kv, 7]], dtype)

    for heads in range(1, 9):
        add(f"wrapper_{heads}_heads", "MultiHeadAttentionWrapper",
            dict(d_in=8, d_out_kq=4, d_out_v=3, num_heads=heads), [[2, 9, 8]],
            "float64" if heads % 2 == 0 else "float32")
    add("wrapper_unbatched_T37", "MultiHeadAttentionWrapper",
        dict(d_in=6, d_out_kq=2, d_out_v=5, num_heads=3), [[37, 6]])
    add("cross_unbatched_same_width", "CrossAttention", dict(d_in=5, d_out_kq=4, d_out_v=6),
        [[7, 5], [3, 5]])
    add("cross_unbatched_wider_kv", "CrossAttention", dict(d_in=3, d_out_kq=2, d_out_v=4, d_in_kv=9),
        [[6, 3], [11, 9]], "float64")

    # Saturated softmax: inputs of magnitude up to 30.
    for dtype in ("float32", "float64"):
        add(f"saturated_self_{dtype}", "SelfAttention", dict(d_in=4, d_out_kq=3, d_out_v=3),
            [[2, 6, 4]], dtype, magnitude=30.0)
        add(f"saturated_causal_{dtype}", "CausalSelfAttention", dict(d_in=4, d_out_kq=3, d_out_v=3),
            [[2, 6, 4]], dtype, magnitude=30.0)
        add(f"saturated_cross_{dtype}", "CrossAttention", dict(d_in=4, d_out_kq=3, d_out_v=3, d_in_kv=2),
            [[2, 6, 4], [2, 5, 2]], dtype, magnitude=30.0)
        add(f"saturated_wrapper_{dtype}", "MultiHeadAttentionWrapper",
            dict(d_in=4, d_out_kq=3, d_out_v=2, num_heads=2), [[2, 6, 4]], dtype, magnitude=30.0)

    for i, case in enumerate(cases):
        case["seed"] = 123 if case["article"] else 1000 + i
    return cases


def make_inputs(case, dtype):
    if case["article"]:
        x = article_embedding()
        inputs = [x]
        if case["module"] == "CrossAttention":
            # The article draws x_2 right after constructing the module under seed 123.
            reference.build(case["module"], case["args"], case["seed"], dtype)
            inputs.append(torch.rand(8, 3))
        return [t.to(dtype) for t in inputs]
    torch.manual_seed(case["seed"] + 1)
    return [((torch.rand(*shape, dtype=torch.float64) * 2 - 1) * case["magnitude"]).to(dtype)
            for shape in case["shapes"]]


def run_case(case):
    """The module, and every tensor of the case: inputs, output, upstream gradient, gradients."""
    dtype = DTYPES[case["dtype"]]
    module = reference.build(case["module"], case["args"], case["seed"], dtype)
    names = INPUT_NAMES.get(case["module"], ["x"])
    inputs = [t.requires_grad_() for t in make_inputs(case, dtype)]
    output = module(*inputs)
    torch.manual_seed(case["seed"] + 2)
    grad_output = torch.randn(output.shape, dtype=torch.float64).to(dtype)
    output.backward(grad_output)

    tensors = {}
    for name, t in zip(names, inputs):
        tensors[f"input.{name}"] = t.detach().clone()
        tensors[f"grad.{name}"] = t.grad.detach().clone()
    tensors["output"] = output.detach().clone()
    tensors["grad_output"] = grad_output
    for name, p in module.named_parameters():
        tensors[f"grad.{name}"] = p.grad.detach().clone()
        p.grad = None
    return module, tensors


def write(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    manifest = {"torch_version": torch.__version__, "cases": []}
    for case in case_list():
        module, tensors = run_case(case)
        name = case["name"]
        torch.jit.save(torch.jit.script(module.eval()), os.path.join(out_dir, f"{name}.pt"))
        torch.save(dict(module.state_dict()), os.path.join(out_dir, f"{name}.state_dict.pt"))
        torch.save(tensors, os.path.join(out_dir, f"{name}.tensors.pt"))
        manifest["cases"].append({
            "name": name,
            "module": case["module"],
            "args": case["args"],
            "seed": case["seed"],
            "dtype": case["dtype"],
            "inputs": INPUT_NAMES.get(case["module"], ["x"]),
            "shapes": {k: list(v.shape) for k, v in tensors.items()},
            "input_magnitude": case["magnitude"],
            "tolerance": TOLERANCE[case["dtype"]],
            "weights": f"{name}.pt",
            "state_dict": f"{name}.state_dict.pt",
            "tensors": f"{name}.tensors.pt",
        })
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    return manifest


def load_case(directory, entry):
    weights = torch.jit.load(os.path.join(directory, entry["weights"])).state_dict()
    state_dict = torch.load(os.path.join(directory, entry["state_dict"]))
    tensors = torch.load(os.path.join(directory, entry["tensors"]))
    return {**{f"weight.{k}": v for k, v in weights.items()},
            **{f"state_dict.{k}": v for k, v in state_dict.items()}, **tensors}


def verify():
    """Regenerates the goldens and compares them, bit for bit, with the committed ones."""
    with open(os.path.join(GOLDEN, "manifest.json")) as f:
        committed = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        fresh = write(tmp)
        drifted = []
        old = {c["name"]: c for c in committed["cases"]}
        for entry in fresh["cases"]:
            name = entry["name"]
            if name not in old:
                drifted.append(f"{name}: not in the committed manifest")
                continue
            if {k: v for k, v in entry.items()} != old.pop(name):
                drifted.append(f"{name}: manifest entry differs")
                continue
            a, b = load_case(tmp, entry), load_case(GOLDEN, entry)
            for key in sorted(set(a) | set(b)):
                if key not in a or key not in b or not torch.equal(a[key], b[key]):
                    diff = ((a[key] - b[key]).abs().max().item()
                            if key in a and key in b and a[key].shape == b[key].shape else "shape")
                    drifted.append(f"{name}: {key} differs (max |diff| {diff})")
        drifted += [f"{name}: committed but no longer generated" for name in old]
    if drifted:
        print("golden drift:\n  " + "\n  ".join(drifted))
        return 1
    print(f"goldens: {len(fresh['cases'])} cases regenerated, identical to models/golden")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=GOLDEN)
    parser.add_argument("--verify", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.verify:
        sys.exit(verify())
    manifest = write(args.out)
    print(f"wrote {len(manifest['cases'])} cases to {args.out}")


if __name__ == "__main__":
    main()
