"""Records what a PyTorch module computes, for a C++ program to check that it computes the same.

A recorded case is a folder:

    manifest.json         what was recorded: names, dtype, tolerances, seed, torch version
    weights.safetensors   the module's state_dict (parameters and buffers), by name
    tensors.safetensors   input.<name>, output.<name>, and for a case with gradients the fixed
                          upstream gradient grad_output.<name> and what it gives:
                          grad.input.<name> (every floating input), grad.param.<name> (every
                          parameter that requires a gradient; zeros where none reaches it)

attention/testing.h reads it (attention::testing::load_parity_case) and compares a C++ module's
outputs and gradients with it. Needs torch and the standard library, nothing else.

Example:

    import torch, attention_parity
    torch.manual_seed(123)
    model = MyModel()
    x = torch.randn(2, 16, 64)
    attention_parity.record(model, {"x": x}, "parity/my_model", seed=123)
"""

import json
import os

import torch

from . import safetensors_io

FORMAT = "attention-parity"
FORMAT_VERSION = 1
# Defaults by dtype: a few roundings of a float32 computation, many fewer in float64.
DEFAULT_TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-10, 1e-10),
                     torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}


def _named(values, what):
    """A dict of name -> tensor from a tensor, a sequence of tensors or a dict."""
    if isinstance(values, torch.Tensor):
        values = (values,)
    if isinstance(values, dict):
        named = dict(values)
    elif isinstance(values, (tuple, list)):
        named = {str(i): v for i, v in enumerate(values)}
    else:
        raise TypeError(f"attention_parity.record: {what} must be a tensor, a sequence of tensors "
                        f"or a dict of them, got {type(values).__name__}")
    for name, value in named.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"attention_parity.record: {what} '{name}' is a "
                            f"{type(value).__name__}, not a tensor")
        if "." in name and what == "input":
            raise ValueError(f"attention_parity.record: input name '{name}' has a '.'")
    return named


def record(module, inputs, directory, *, forward=None, seed=None, gradients=True, rtol=None,
           atol=None, grad_seed=0):
    """Runs `module` on `inputs` and writes the case to `directory` (created; files replaced).

    inputs: a tensor, a sequence of tensors (named "0", "1", ...) or a dict name -> tensor, in
    the order the forward takes them. forward(module, *inputs) computes the outputs (default:
    module(*inputs)); it may return a tensor, a sequence or a dict of tensors (None entries, such
    as attention weights not asked for, are left out). With `gradients`, a fixed upstream gradient
    (normal, from a generator seeded with `grad_seed`) is back-propagated from every floating
    output. rtol and atol default by the outputs' dtype. `seed` is recorded for the reader (call
    torch.manual_seed yourself before building the module and the inputs). Put a module with
    dropout in eval() first: the C++ side cannot draw the same random masks. Returns the manifest.
    """
    named_inputs = _named(inputs, "input")
    forward = forward or (lambda m, *args: m(*args))
    leaves = {}
    for name, value in named_inputs.items():
        value = value.detach().clone()
        if gradients and value.is_floating_point():
            value.requires_grad_(True)
        leaves[name] = value

    parameters = dict(module.named_parameters())
    if gradients:
        module.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(gradients):
        raw = forward(module, *leaves.values())
    if isinstance(raw, (tuple, list)):
        raw = {str(i): v for i, v in enumerate(raw) if v is not None}
    elif isinstance(raw, dict):
        raw = {k: v for k, v in raw.items() if v is not None}
    outputs = _named(raw, "output")
    if not outputs:
        raise ValueError("attention_parity.record: the forward returned no tensor")

    tensors = {f"input.{name}": value.detach() for name, value in leaves.items()}
    tensors.update({f"output.{name}": value.detach() for name, value in outputs.items()})
    differentiable = {name: value for name, value in outputs.items()
                      if gradients and value.is_floating_point() and value.requires_grad}
    if differentiable:
        generator = torch.Generator().manual_seed(grad_seed)
        upstream = {name: torch.randn(value.shape, generator=generator,
                                      dtype=torch.float64).to(value.dtype)
                    for name, value in differentiable.items()}
        torch.autograd.backward(list(differentiable.values()), list(upstream.values()))
        tensors.update({f"grad_output.{name}": value for name, value in upstream.items()})
        for name, value in leaves.items():
            if value.requires_grad:
                grad = value.grad if value.grad is not None else torch.zeros_like(value)
                tensors[f"grad.input.{name}"] = grad
        for name, param in parameters.items():
            if param.requires_grad:
                grad = param.grad if param.grad is not None else torch.zeros_like(param)
                tensors[f"grad.param.{name}"] = grad.detach()

    dtype = next(iter(outputs.values())).dtype
    default_rtol, default_atol = DEFAULT_TOLERANCE.get(dtype, (1e-5, 1e-5))
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": os.path.basename(os.path.normpath(directory)),
        "module": type(module).__name__,
        "torch_version": torch.__version__,
        "seed": seed,
        "grad_seed": grad_seed,
        "dtype": str(dtype).replace("torch.", ""),
        "rtol": default_rtol if rtol is None else float(rtol),
        "atol": default_atol if atol is None else float(atol),
        "inputs": list(leaves),
        "outputs": list(outputs),
        "gradients": bool(differentiable),
        "parameters": [name for name, p in parameters.items() if p.requires_grad],
        "shapes": {name: list(t.shape) for name, t in tensors.items()},
    }
    os.makedirs(directory, exist_ok=True)
    safetensors_io.save(dict(module.state_dict()), os.path.join(directory, "weights.safetensors"))
    safetensors_io.save(tensors, os.path.join(directory, "tensors.safetensors"))
    with open(os.path.join(directory, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    return manifest
