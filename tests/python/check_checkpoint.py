"""Loads a Tandem checkpoint with the safetensors package (NumPy and PyTorch front ends) and with
plain PyTorch (header parsed by hand, data through torch.frombuffer), and checks every tensor
against the formula write_reference_checkpoint used.

usage: check_checkpoint.py FILE LAYERS   e.g. check_checkpoint.py ref.safetensors 784-100-10
"""
import json
import struct
import sys

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import load_file as load_numpy
from safetensors.torch import load_file as load_torch


def names(layers):
    n = len(layers) - 1
    out = []
    for l in range(n):
        stem = "sm" if l == n - 1 else ("hid" if l == 0 else f"hid{l + 1}")
        out.append((f"{stem}_w", (layers[l], layers[l + 1])))
        out.append((f"{stem}_b", (layers[l + 1],)))
    return out


def reference(tensor, count, kind):
    i = np.arange(count, dtype=np.int64)
    k = (i * 7919 + tensor * 104729 + kind * 15485863) % 2001
    return ((k - 1000).astype(np.float32) / np.float32(1024.0))


def expected_tensors(layers):
    out = {}
    for t, (name, shape) in enumerate(names(layers)):
        count = int(np.prod(shape))
        out[name] = reference(t, count, 0).reshape(shape)
        out[name + ".adam_m"] = reference(t, count, 1).reshape(shape)
        out[name + ".adam_v"] = (reference(t, count, 2) + np.float32(1.0)).reshape(shape)
    return out


def torch_by_hand(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    assert (8 + n) % 8 == 0, "header not padded to 8 bytes"
    data = bytearray(blob[8 + n:])
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        assert entry["dtype"] == "F32", (name, entry["dtype"])
        begin, end = entry["data_offsets"]
        t = torch.frombuffer(data, dtype=torch.float32, offset=begin, count=(end - begin) // 4)
        out[name] = t.reshape(entry["shape"]).clone()
    return out, header.get("__metadata__", {})


def main():
    path, layers = sys.argv[1], [int(x) for x in sys.argv[2].split("-")]
    expected = expected_tensors(layers)
    loaders = {
        "safetensors.numpy": lambda: load_numpy(path),
        "safetensors.torch": lambda: {k: v.numpy() for k, v in load_torch(path).items()},
        "torch.frombuffer": lambda: {k: v.numpy() for k, v in torch_by_hand(path)[0].items()},
    }
    for label, load in loaders.items():
        got = load()
        assert set(got) == set(expected), f"{label}: names {sorted(got)} != {sorted(expected)}"
        for name, want in expected.items():
            assert got[name].dtype == np.float32, f"{label}: {name} dtype {got[name].dtype}"
            assert got[name].shape == want.shape, f"{label}: {name} shape {got[name].shape} != {want.shape}"
            assert np.array_equal(got[name], want), f"{label}: {name} values differ"
        print(f"{label}: {len(got)} tensors match")
    with safe_open(path, framework="np") as f:
        meta = f.metadata()
    assert meta["format"] == "tandem-checkpoint", meta
    assert meta["layers"] == "-".join(map(str, layers)), meta
    assert meta["step"] == "4321" and meta["epoch"] == "7" and meta["optimizer"] == "adam", meta
    assert torch_by_hand(path)[1] == meta
    print("metadata matches:", {k: meta[k] for k in ("format", "layers", "step", "optimizer")})


if __name__ == "__main__":
    main()
