#!/usr/bin/python3
"""Writes the seeded tiny models of the zoo (tiny_configs.py) and what greedy decoding makes of
them, for the C++ example decoder to load and reproduce.

    write_models.py OUT_DIR [FAMILY...] [--dtype float32|bfloat16|both]   (default: all, both)

For each family and dtype, OUT_DIR/<family>-<dtype>/ gets:
  config.json   the book's config keys for the family, plus "family" and "dtype" (a string)
  model.pth     torch.save(model.state_dict()): the book's names (a tied head appears twice)
  generation.pt {"prompt": int64 (1, P), "tokens": int64 (1, P + N), "logits": float32 (N, vocab)}:
                greedy decoding without a cache; logits[i] chose tokens[0, P + i]
  hf/           the same weights under Hugging Face names (the inverse of the book's
                load_weights_into_<family>), sharded as Hugging Face does:
                model-00001-of-00002.safetensors, model-00002-of-00002.safetensors and
                model.safetensors.index.json {"metadata": {"total_size"}, "weight_map"}.
                A tied head has no lm_head.weight. Every tensor is stored in the model dtype, as
                a checkpoint stores them (the float32 norm weights of a bfloat16 model are ones
                or zeros, so nothing is lost; this is asserted). Qwen3.5 and Gemma 4 use the
                prefix of their real, multimodal checkpoints (model.language_model.), the others
                model.; the book's loaders accept either.
The build is seeded and runs on the CPU, so two runs write the same tensors.
"""

import argparse
import json
import os
import re
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from attention_parity import safetensors_io  # noqa: E402

import book_zoo  # noqa: E402
import tiny_configs  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# Block-relative renames, first match wins; what matches none keeps its name (Gemma 4 uses the
# Hugging Face names already, OLMo 3 and Gemma 3 their norms' names).
LAYER_RULES = [("att.W_query.", "self_attn.q_proj."), ("att.W_key.", "self_attn.k_proj."),
               ("att.W_value.", "self_attn.v_proj."), ("att.out_proj.", "self_attn.o_proj."),
               ("att.", "self_attn."), ("ff.fc1.", "mlp.gate_proj."), ("ff.fc2.", "mlp.up_proj."),
               ("ff.fc3.", "mlp.down_proj."), ("norm1.", "input_layernorm."),
               ("norm2.", "post_attention_layernorm.")]
TOP_NAMES = {"tok_emb.weight": "embed_tokens.weight", "final_norm.weight": "norm.weight",
             "final_norm.scale": "norm.weight"}
PREFIX = {"qwen3_5": "model.language_model.", "gemma4": "model.language_model."}


def hf_name(family, name, layer_types):
    """The Hugging Face name of the book's state_dict entry `name`."""
    if name == "out_head.weight":
        return "lm_head.weight"
    prefix = PREFIX.get(family, "model.")
    match = re.fullmatch(r"(?:trf_blocks|blocks)\.(\d+)\.(.+)", name)
    if not match:
        return prefix + TOP_NAMES.get(name, name)
    layer, rest = match.groups()
    if rest.startswith("token_mixer."):  # Qwen3.5: self_attn on full layers, else linear_attn
        full = layer_types[int(layer)] == "full_attention"
        rest = ("att." if full else "linear_attn.") + rest[len("token_mixer."):]
    for old, new in LAYER_RULES:
        if rest.startswith(old):
            rest = new + rest[len(old):]
            break
    if rest.endswith(".scale"):  # Qwen3 and Gemma 3 call their norms' weight `scale`
        rest = rest[: -len("scale")] + "weight"
    return f"{prefix}layers.{layer}.{rest}"


def hf_state_dict(family, model):
    """{Hugging Face name: tensor in the model dtype}, in state_dict order, lm_head left out
    when the head is tied to the embedding."""
    dtype, layer_types = model.cfg["dtype"], model.cfg.get("layer_types") or []
    tied = model.out_head.weight is model.tok_emb.weight
    out = {}
    for name, tensor in model.state_dict().items():
        if tied and name == "out_head.weight":
            continue
        stored = tensor.to(dtype)
        if not torch.equal(stored.to(tensor.dtype), tensor):
            raise ValueError(f"{name} does not survive a cast to {dtype}")
        out[hf_name(family, name, layer_types)] = stored
    return out


def write_sharded(tensors, directory, shards=2):
    """Hugging Face's sharded layout: consecutive tensors, a new file after each 1/shards of the
    bytes, and an index naming each tensor's file (keys sorted, as transformers writes it)."""
    os.makedirs(directory, exist_ok=True)
    sizes = {name: t.numel() * t.element_size() for name, t in tensors.items()}
    total, files, done = sum(sizes.values()), [dict() for _ in range(shards)], 0
    for name, tensor in tensors.items():
        files[min(shards - 1, done * shards // total)][name] = tensor
        done += sizes[name]
    weight_map = {}
    for i, part in enumerate(files):
        filename = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        safetensors_io.save(part, os.path.join(directory, filename))
        weight_map.update({name: filename for name in part})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")


def load_sharded(directory):
    """The tensors of a directory write_sharded wrote, merged."""
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    merged = {}
    for filename in files:
        merged.update(safetensors_io.load(os.path.join(directory, filename)))
    return merged


def write(out_dir, family, dtype_name):
    """Writes one model's folder; returns (folder, tokens, logits)."""
    model = tiny_configs.seeded_model(family, DTYPES[dtype_name])
    prompt = tiny_configs.prompt()
    tokens, logits = book_zoo.generate(model, prompt, tiny_configs.NEW_TOKENS)
    folder = os.path.join(out_dir, f"{family}-{dtype_name}")
    os.makedirs(folder, exist_ok=True)
    config = {"family": family, **tiny_configs.config(family), "dtype": dtype_name}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    torch.save(model.state_dict(), os.path.join(folder, "model.pth"))
    torch.save({"prompt": prompt, "tokens": tokens, "logits": logits},
               os.path.join(folder, "generation.pt"))
    write_sharded(hf_state_dict(family, model), os.path.join(folder, "hf"))
    return folder, tokens, logits


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("families", nargs="*", metavar="FAMILY",
                        help=f"any of {', '.join(book_zoo.FAMILIES)} (default: all)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "both"], default="both")
    args = parser.parse_args(argv)
    unknown = [f for f in args.families if f not in book_zoo.FAMILIES]
    if unknown:
        parser.error(f"unknown family {', '.join(unknown)}")
    dtypes = ["float32", "bfloat16"] if args.dtype == "both" else [args.dtype]
    for family in args.families or list(book_zoo.FAMILIES):
        for dtype_name in dtypes:
            _, tokens, logits = write(args.out_dir, family, dtype_name)
            generated = tokens[0, len(tiny_configs.PROMPT):].tolist()
            if len(set(generated)) == 1:
                raise RuntimeError(f"{family} {dtype_name} repeats one token: {generated}")
            top2 = logits.topk(2, dim=-1).values
            margin = (top2[:, 0] - top2[:, 1]).min().item()
            print(f"{family:8s} {dtype_name:8s} {generated}  "
                  f"(smallest top-2 logit gap {margin:.3g})")


if __name__ == "__main__":
    main()
