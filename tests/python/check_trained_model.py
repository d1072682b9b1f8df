"""Evaluates a checkpoint trained by `tandem train` with PyTorch and compares the test-set loss
and accuracy with what `tandem eval --json` printed for the same file and data.

usage: check_trained_model.py CHECKPOINT DATA_DIR TANDEM_EVAL_JSON
"""
import gzip
import json
import sys

import numpy as np
import torch
from safetensors.torch import load_file


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        blob = f.read()
    ndim = blob[3]
    dims = [int.from_bytes(blob[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(blob, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main():
    ckpt, data_dir, tandem_json = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    p = load_file(ckpt)
    images = read_idx(f"{data_dir}/t10k-images-idx3-ubyte.gz")
    labels = torch.from_numpy(read_idx(f"{data_dir}/t10k-labels-idx1-ubyte.gz").astype(np.int64))
    x = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32)) * np.float32(1.0 / 255.0)
    with torch.no_grad():
        hidden = torch.relu(x @ p["hid_w"] + p["hid_b"])
        logits = hidden @ p["sm_w"] + p["sm_b"]
        probs = torch.clamp(torch.softmax(logits.double(), dim=1), 1e-10, 1.0)
        loss = float(-torch.log(probs.gather(1, labels[:, None])).sum())
        accuracy = float((logits.argmax(1) == labels).double().mean())
    print(f"pytorch: loss {loss:.4f} accuracy {accuracy:.4f}; tandem: {tandem_json}")
    assert abs(loss - tandem_json["loss"]) <= 1e-4 * abs(loss), (loss, tandem_json["loss"])
    assert abs(accuracy - tandem_json["accuracy"]) <= 2e-4, (accuracy, tandem_json["accuracy"])


if __name__ == "__main__":
    main()
