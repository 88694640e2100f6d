#!/usr/bin/env python3
"""Write a PyTorch model's weights as a safetensors file that rumus loads with
`net.load(path, #{ from: "pytorch", rename: #{ ... } })`.

Usage (needs `pip install torch safetensors`):

    python scripts/tools/export_torch.py MODEL.pt OUT.safetensors [--dtype f32|f16|bf16]
    python scripts/tools/export_torch.py --example OUT.safetensors

MODEL.pt is what `torch.save` wrote: a state dict (`model.state_dict()`), a whole module, or a
training checkpoint holding the state dict under "model" or "state_dict". `--example` writes
the state dict of `nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))` instead.

The file is what `safetensors.torch.save_file(model.state_dict(), OUT)` writes, with two
adjustments: tied tensors (one storage under two names, like GPT-2's `lm_head.weight` and
`transformer.wte.weight`) are saved once per name, which `save_file` refuses to do itself and
rumus accepts when both land on one of its names; and tensors that are not floating point
(`num_batches_tracked`, index buffers) are left out, since rumus's parameters are all f32.
Weights stay in PyTorch's layout (`nn.Linear` is `[out, in]`): rumus transposes them as it
loads. The names and shapes printed are what the `rename` map is written against.
"""

import argparse
import sys


def state_dict_of(obj):
    """The state dict inside whatever `torch.load` returned."""
    if hasattr(obj, "state_dict"):
        return obj.state_dict()
    if isinstance(obj, dict):
        for key in ("model", "state_dict", "model_state_dict"):
            if isinstance(obj.get(key), dict):
                return obj[key]
        return obj
    sys.exit(f"export_torch: {type(obj).__name__} is neither a module nor a state dict")


def main():
    import torch
    from safetensors.torch import save_file

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", help="a file torch.save wrote")
    ap.add_argument("out", help="the .safetensors file to write")
    ap.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32")
    ap.add_argument("--example", action="store_true", help="export a small nn.Sequential MLP")
    args = ap.parse_args()

    if args.example:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        sd = model.state_dict()
    elif args.model:
        sd = state_dict_of(torch.load(args.model, map_location="cpu", weights_only=False))
    else:
        sys.exit("export_torch: give MODEL.pt or --example")

    dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    out, skipped = {}, []
    for name, t in sd.items():
        if not torch.is_floating_point(t):
            skipped.append(name)
            continue
        out[name] = t.detach().to(dtype).contiguous().clone()  # clone: tied tensors saved twice
        print(f"{name} {list(t.shape)}")
    if skipped:
        print(f"left out (not floating point): {', '.join(skipped)}")
    save_file(out, args.out, metadata={"format": "pt"})
    print(f"wrote {len(out)} tensors to {args.out}")


if __name__ == "__main__":
    main()
