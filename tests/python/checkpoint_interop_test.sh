#!/usr/bin/env bash
# Checkpoints written by Tandem, read by the safetensors package and PyTorch.
# usage: checkpoint_interop_test.sh PYTHON WRITE_REFERENCE_CHECKPOINT TANDEM PYTHON_DIR
set -euo pipefail
python=$1 writer=$2 tandem=$3 here=$4
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
for layers in 784-100-10 50-33-17-10; do
  "$writer" "$dir/ref-$layers.safetensors" "$layers"
  "$python" "$here/check_checkpoint.py" "$dir/ref-$layers.safetensors" "$layers"
done
# A model trained by tandem, evaluated by PyTorch and by tandem eval: the same loss and accuracy.
data=/usr/share/datasets/fashion-mnist
"$tandem" train --data "$data" --epochs 1 --batch 1000 --threads 2 --checkpoint "$dir/trained.safetensors" >/dev/null 2>&1
json=$("$tandem" eval --model "$dir/trained.safetensors" --data "$data" --split test --json)
"$python" "$here/check_trained_model.py" "$dir/trained.safetensors" "$data" "$json"
