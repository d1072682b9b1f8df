#!/usr/bin/env bash
# Dataset stores end to end through the command line: prepare (v2 and v3, compressors, copies),
# inspect checked against NumPy, training and evaluation from a store, and bad input refused.
# usage: store_cli_test.sh TANDEM PYTHON HERE_PYTHON_DIR
set -uo pipefail
tandem=$1 python=$2 pydir=$3
dir=$(mktemp -d) || exit 1  # never an empty $dir: cleanup would act on "" and "/"
trap 'rm -rf "$dir"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/test_helpers.sh" || exit 1

for spec in "3 none uint8" "2 blosc-lz4 uint8" "3 zstd float32" "3 gzip uint8" "2 zlib:3 uint8"; do
  read -r format compressor dtype <<<"$spec"
  store=$dir/fm-$format-$compressor-$dtype.zarr
  "$tandem" prepare --out "$store" --copies 2 --chunk-rows 7000 --format "$format" \
    --compressor "$compressor" --dtype "$dtype" >/dev/null 2>&1
  check "prepare v$format $compressor $dtype" test -d "$store"
  ins=$("$tandem" inspect "$store" --out "$dir/png-$format" --json 2>/dev/null)
  check "inspect v$format $compressor $dtype agrees with NumPy" "$python" "$pydir/inspect_check.py" "$store" "$ins"
  check "inspect wrote three PNGs" test -s "$dir/png-$format/sample.png" -a -s "$dir/png-$format/mean.png" -a -s "$dir/png-$format/variance.png"
done

# Progress: a line redrawn on a terminal (script(1) gives the command one), none in a file.
if command -v script >/dev/null; then
  shown=$(script -qc "'$tandem' prepare --out '$dir/progress.zarr' --copies 2" /dev/null \
    </dev/null | tr '\r' '\n')
  check "prepare draws its progress on a terminal" \
    grep -q "writing $dir/progress.zarr: 125000/125000 rows (100%)" <<<"$shown"
else
  echo "skipped: prepare's progress on a terminal (no script(1) here)"
fi
"$tandem" prepare --out "$dir/quiet.zarr" --copies 2 >/dev/null 2>"$dir/quiet.err"
check "... and none into a file" test ! -s "$dir/quiet.err"

store=$dir/fm-3-none-uint8.zarr
out=$("$tandem" train --data "$store" --epochs 1 --batch 1000 --json 2>/dev/null)
check "train from a store: 110000 samples (2 copies)" test "$(json_field "$out" samples)" = 110000
acc=$(grep -o '"test":{[^}]*}' <<<"$out" | grep -o '"accuracy":[0-9.]*' | cut -d: -f2)
check "train from a store learns (test accuracy $acc > 0.8)" awk -v a="$acc" 'BEGIN{exit !(a > 0.8)}'
# Same rows in the same order: a one-copy store without shuffling trains exactly as the IDX files.
"$tandem" prepare --out "$dir/one.zarr" >/dev/null 2>&1
a=$("$tandem" train --data "$dir/one.zarr" --epochs 2 --shuffle off --json 2>/dev/null)
b=$("$tandem" train --epochs 2 --shuffle off --json 2>/dev/null)
check "store and IDX files train bit-identically" \
  same_value "$(json_field "$a" loss)" "$(json_field "$b" loss)"
"$tandem" train --data "$dir/one.zarr" --epochs 1 --checkpoint "$dir/m.safetensors" >/dev/null 2>&1
ev=$("$tandem" eval --model "$dir/m.safetensors" --data "$dir/one.zarr" --split test --json)
check "eval on a store's test split" test "$(json_field "$ev" samples)" = 10000
# A chunk gone from a store tandem prepare wrote: predict and inspect refuse it, as training
# does, instead of reading zeros (predict once wrote classes of blank images, exiting 0).
mkdir "$dir/idx" && ln -s /usr/share/datasets/fashion-mnist/* "$dir/idx/"
cp -r "$dir/one.zarr" "$dir/holed.zarr"
rm "$(find "$dir/holed.zarr/test/images" -type f -path '*/c/*' | sort | head -1)"
expect_error "predict refuses a store with a missing chunk" "is missing" \
  "$tandem" predict --model "$dir/m.safetensors" --data "$dir/holed.zarr" --out "$dir/holed-p.zarr"
expect_error "inspect refuses a split with a missing images chunk" "is missing" \
  "$tandem" inspect "$dir/holed.zarr" --split test --out "$dir/png-holed"
# IDX files where a store is needed (predict, inspect): said, with the command that makes one,
# instead of the Zarr reader's "no Zarr group here"; nothing written.
expect_error "predict given IDX files says how to make a store of them" \
  "holds IDX files, not a dataset store: make one with \`tandem prepare --data" \
  "$tandem" predict --model "$dir/m.safetensors" --data "$dir/idx" --out "$dir/idx-p.zarr"
check "... writing nothing" test ! -e "$dir/idx-p.zarr"
expect_error "inspect given IDX files says so too" "$dir/idx holds IDX files" \
  "$tandem" inspect "$dir/idx" --out "$dir/png-idx"
# And the other way: a store given to prepare, which reads IDX files (it once said only that
# the IDX files were missing from the store's directory).
expect_error "prepare given a store says it is one already" \
  "--data $dir/one.zarr is a dataset store already" \
  "$tandem" prepare --data "$dir/one.zarr" --out "$dir/again.zarr"
# A store whose group metadata is damaged, and an array's path, are stores train refuses saying
# what is wrong: taken for directories of IDX files, they were refused for having none.
cp -r "$dir/one.zarr" "$dir/broken.zarr"
echo '{"zarr_format":3,"node_type":"group",' >"$dir/broken.zarr/zarr.json"
expect_error "train names a store's damaged metadata" "zarr.json" \
  "$tandem" train --data "$dir/broken.zarr" --epochs 1
expect_error "train on an array's path says it is no group" '"array"' \
  "$tandem" train --data "$dir/one.zarr/images" --epochs 1
# IDX files with a stray Zarr file beside them are still IDX files; a v2 store that lost its
# .zgroup is still a store, a damaged one.
mkdir "$dir/idx-stray" && ln -s /usr/share/datasets/fashion-mnist/* "$dir/idx-stray/"
echo '{}' >"$dir/idx-stray/.zattrs"
check "IDX files beside a stray .zattrs are read as IDX files" \
  "$tandem" eval --model "$dir/m.safetensors" --data "$dir/idx-stray" --split test
"$tandem" prepare --out "$dir/v2-nogroup.zarr" --format 2 --chunk-rows 20000 >/dev/null 2>&1
rm "$dir/v2-nogroup.zarr/.zgroup"
expect_error "a v2 store without its .zgroup is named as damaged, not taken for IDX files" \
  ".zgroup" "$tandem" eval --model "$dir/m.safetensors" --data "$dir/v2-nogroup.zarr"
cp -r "$dir/one.zarr" "$dir/holed-labels.zarr"
rm "$(find "$dir/holed-labels.zarr/labels" -type f -path '*/c/*' | sort | head -1)"
expect_error "inspect refuses a split with a missing labels chunk" "is missing" \
  "$tandem" inspect "$dir/holed-labels.zarr" --out "$dir/png-holed"

out=$("$tandem" prepare --out "$dir/bigchunk.zarr" --chunk-rows 99999999 --json 2>/dev/null)
check "prepare reports the chunks it wrote (a --chunk-rows past the training rows is cut)" \
  test "$(json_field "$out" chunk_rows)" = 55000
rm -rf "$dir/bigchunk.zarr"
expect_error "prepare refuses an existing store" "$dir/one.zarr" "$tandem" prepare --out "$dir/one.zarr"
check "overwrite replaces it" "$tandem" prepare --out "$dir/one.zarr" --overwrite --chunk-rows 5000
expect_error "unknown compressor" "lz5" "$tandem" prepare --out "$dir/x.zarr" --compressor blosc-lz5
check "no store left by a refused prepare" test ! -e "$dir/x.zarr"
expect_error "zlib is refused in Zarr v3, naming gzip" "use gzip" "$tandem" prepare \
  --out "$dir/x.zarr" --compressor zlib --format 3
check "no store left by a refused prepare" test ! -e "$dir/x.zarr"
# An interrupted prepare leaves no store: SIGTERM stops it between chunks with its temporary
# directory removed; kill -9 leaves a directory that is no store, removed by the next prepare.
# (SIGTERM, not SIGINT: a background job of a script starts with SIGINT ignored.)
# This machine's name as the temporary names carry it (uname -n: hostname may not be installed).
host=$(uname -n | tr -c 'A-Za-z0-9.\n-' _)
start_big_prepare() {  # sets big_pid once its temporary directory exists
  "$tandem" prepare --out "$dir/big.zarr" --copies 40 --compressor zstd >/dev/null 2>"$dir/big.err" &
  big_pid=$!
  for _ in $(seq 300); do
    [ -d "$dir/big.zarr.partial-$host-$big_pid" ] && break
    sleep 0.05
  done
  sleep 0.3
}
start_big_prepare
kill -TERM "$big_pid"
check "SIGTERM ends prepare with an error" failed_saying "$big_pid" "$dir/big.err" "prepare stopped by SIGTERM; nothing was written"
check "no store and no temporary directory after SIGTERM" test -z "$(ls -d "$dir"/big.zarr* 2>/dev/null)"
start_big_prepare
kill -9 "$big_pid"; wait "$big_pid" 2>/dev/null
partial=$dir/big.zarr.partial-$host-$big_pid
check "kill -9 leaves the temporary directory" test -d "$partial"
expect_error "which is no store" "a \`tandem prepare\` that was killed" "$tandem" inspect "$partial"
check "the next prepare of that store" "$tandem" prepare --out "$dir/big.zarr" --chunk-rows 20000
check "removes it" test ! -e "$partial" -a -d "$dir/big.zarr"

# Images to classify may come without labels: inspect shows them all the same.
cp -r "$dir/one.zarr" "$dir/nolabel.zarr"
rm -r "$dir/nolabel.zarr/test/labels"
ins=$("$tandem" inspect "$dir/nolabel.zarr" --split test --out "$dir/png-nolabel" --json \
  2>/dev/null)
check "inspect of a split without labels agrees with NumPy" \
  "$python" "$pydir/inspect_check.py" "$dir/nolabel.zarr" "$ins"
check "... and the text report says it has none" \
  grep -q "test/labels *none" <("$tandem" inspect "$dir/nolabel.zarr" --out "$dir/png-nolabel")

# A store holds its own validation split: --validation-rows, which eval silently ignored, is
# refused as train refuses it.
expect_error "eval --validation-rows with a store" "holds its own validation split" \
  "$tandem" eval --model "$dir/m.safetensors" --data "$dir/one.zarr" --split validation \
  --validation-rows 100

# A store's attributes are anyone's text: an image shape whose sides overflow 64 bits when
# multiplied (16 x (2^60 + 49) wraps to 784) is not taken for the images' shape.
cp -r "$dir/one.zarr" "$dir/odd-shape.zarr"
"$python" - "$dir/odd-shape.zarr/zarr.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
doc["attributes"]["image_shape"] = [16, 2**60 + 49]
json.dump(doc, open(sys.argv[1], "w"))
PY
check "inspect ignores an image shape whose sides overflow" \
  "$tandem" inspect "$dir/odd-shape.zarr" --out "$dir/png-odd"
check "... and draws square images of 784 features" "$python" -c "
import struct, sys
width, height = struct.unpack('>II', open(sys.argv[1], 'rb').read(24)[16:24])
sys.exit(width != height)" "$dir/png-odd/sample.png"

# The seed's layout, persisted by Dask as it is: images in [0, 1] and one-hot float32 labels
# [rows, 10] for the training split, class indices as float64 [rows, 1] for the test split, each
# array written to its own path with no group metadata above it, no num_classes attribute. The
# training images
# are float64, as Dask's `x / 255.` makes them (read narrowed to float32), the test ones
# float32, as the seed has them.
"$python" - "$dir/one.zarr" "$dir/seed.zarr" <<'PY'
import sys
import dask.array as da
import numpy as np
import zarr
src, out = sys.argv[1], sys.argv[2]
for split in ("", "test/"):
    images = da.from_zarr(zarr.open_array(src + "/" + split + "images", mode="r"))
    labels = da.from_zarr(zarr.open_array(src + "/" + split + "labels", mode="r"))
    scaled = images.astype(np.float32) / np.float32(255) if split else images / 255.0
    da.to_zarr(scaled, out + "/" + split + "images")
    if split:  # class indices as whole floats in a column, as pandas leaves them
        column = labels.astype(np.float64)[:, None]
        da.to_zarr(column.rechunk((5000, 1)), out + "/" + split + "labels")
    else:
        one_hot = (labels[:, None] == da.arange(10)[None, :]).astype(np.float32)
        da.to_zarr(one_hot.rechunk((5000, 10)), out + "/" + split + "labels")
PY
check "dask wrote the seed's layout (float64 training images)" \
  grep -q '"float64"' "$dir/seed.zarr/images/zarr.json"
out=$("$tandem" train --data "$dir/seed.zarr" --epochs 2 --batch 1000 --json 2>"$dir/seed.err")
acc=$(grep -o '"test":{[^}]*}' <<<"$out" | grep -o '"accuracy":[0-9.]*' | cut -d: -f2)
check "train on one-hot float32 labels learns (test accuracy $acc > 0.8)" \
  awk -v a="$acc" 'BEGIN{exit !(a > 0.8)}'
ins=$("$tandem" inspect "$dir/seed.zarr" --out "$dir/png-seed" --json 2>/dev/null)
check "inspect counts the classes of one-hot rows and of float indices" "$python" -c "
import json, sys
j = json.loads(sys.argv[1])
ok = j['num_classes'] == 10
for name, rows in (('labels', 55000), ('test/labels', 10000)):
    h = j['arrays'][name]['histogram']
    ok = ok and sorted(h) == [str(c) for c in range(10)] and sum(h.values()) == rows
sys.exit(not ok)" "$ins"

# Smoothed one-hot rows (0.9 for the class, 0.011 elsewhere): inspect's sample label is the class
# training reads (the row's largest entry), as its histogram is.
"$python" - "$dir/smooth.zarr" <<'PY'
import sys
import dask.array as da
import numpy as np
out = sys.argv[1]
classes = np.arange(100) % 10
smooth = np.full((100, 10), 0.011, np.float32)
smooth[np.arange(100), classes] = 0.9
da.to_zarr(da.from_array(np.zeros((100, 784), np.uint8)), out + "/images")
da.to_zarr(da.from_array(smooth), out + "/labels")
PY
ins=$("$tandem" inspect "$dir/smooth.zarr" --sample 7 --out "$dir/png-smooth" --json 2>/dev/null)
check "inspect's sample label of a smoothed one-hot row is its class" "$python" -c "
import json, sys
sys.exit(json.loads(sys.argv[1])['sample']['label'] != 7)" "$ins"

# Images [rows, height, width] that are not square, from a store without attributes: drawn at
# their own height and width (28 x 32, scaled 10 times).
"$python" - "$dir/wide.zarr" <<'PY'
import sys
import dask.array as da
import numpy as np
out = sys.argv[1]
da.to_zarr(da.from_array(np.arange(100 * 28 * 32).reshape(100, 28, 32) % 251).astype(np.uint8),
           out + "/images")
da.to_zarr(da.from_array(np.arange(100) % 10), out + "/labels")
PY
check "inspect of non-square [rows, 28, 32] images" \
  "$tandem" inspect "$dir/wide.zarr" --out "$dir/png-wide"
check "... draws them 320 wide and 280 high" "$python" -c "
import struct, sys
width, height = struct.unpack('>II', open(sys.argv[1], 'rb').read(24)[16:24])
sys.exit((width, height) != (320, 280))" "$dir/png-wide/sample.png"

key=$dir/one.zarr/images/c/3/0   # a v3 store's chunk key, as zarr-python writes it
check "chunk key exists" test -f "$key"
printf 'garbage' > "$key"
expect_error "a corrupt chunk names the store and key" "c/3/0" "$tandem" train --data "$dir/one.zarr" --epochs 1
expect_error "inspect of a missing store" "$dir/nothing.zarr" "$tandem" inspect "$dir/nothing.zarr"

# A NaN pixel in a float32 store: eval names its row, in a split read whole and in the training
# split streamed batch by batch (it once blamed the model: "its logits overflow ... diverged?").
"$python" - "$dir/nan.zarr" <<'PY'
import sys, numpy as np, zarr
x = np.random.default_rng(0).random((3000, 784), dtype=np.float32)
labels = (np.arange(3000) % 10).astype(np.uint8)
x[2345, 5] = np.nan
g = zarr.open_group(sys.argv[1], mode="w")
g.create_array("images", data=x, chunks=(1000, 784))
g.create_array("labels", data=labels, chunks=(1000,))
test = g.create_group("test")
x[1234, 7] = np.inf
test.create_array("images", data=x[1000:], chunks=(1000, 784))
test.create_array("labels", data=labels[1000:], chunks=(1000,))
PY
expect_error "eval names a streamed training split's row with a NaN pixel" \
  "zarr store '$dir/nan.zarr/images': row 2345 holds a pixel that is not finite (NaN or infinity)" \
  "$tandem" eval --model "$dir/m.safetensors" --data "$dir/nan.zarr" --split train
expect_error "... and a test split's row with an infinite one" \
  "the test split of $dir/nan.zarr: row 234 holds a pixel that is not finite" \
  "$tandem" eval --model "$dir/m.safetensors" --data "$dir/nan.zarr" --split test
# A group holding a test split alone: refused saying where the training split goes (it once
# said only that $dir/onlytest.zarr/images was no Zarr array).
"$python" - "$dir/onlytest.zarr" <<'PY'
import sys, numpy as np, zarr
test = zarr.open_group(sys.argv[1], mode="w").create_group("test")
test.create_array("images", data=np.zeros((20, 784), np.uint8), chunks=(10, 784))
PY
expect_error "a store of a test split alone says it has no training split" \
  "onlytest.zarr: no training split (an \`images\` array at the store's root); it holds a test" \
  "$tandem" predict --model "$dir/m.safetensors" --data "$dir/onlytest.zarr" --split test \
  --out "$dir/onlytest-p.zarr"
# Labels past the store's classes (num_classes 5, labels up to 9): inspect shows them, and warns
# that the commands using them refuse them (it showed "5 classes" beside "max 9", unsaid).
"$python" - "$dir/five.zarr" <<'PY'
import sys, numpy as np, zarr
g = zarr.open_group(sys.argv[1], mode="w")
g.attrs["num_classes"] = 5
g.create_array("images", data=np.zeros((30, 784), np.uint8), chunks=(10, 784))
g.create_array("labels", data=(np.arange(30) % 10).astype(np.uint8), chunks=(10,))
PY
"$tandem" inspect "$dir/five.zarr" --out "$dir/png-five" >/dev/null 2>"$dir/five.err"
check "inspect of labels past the store's classes succeeds" test $? -eq 0
check "... warning that they run past its classes" grep -qF \
  "the train split's labels run from 0 to 9, but the store has 5 classes (0 to 4)" \
  "$dir/five.err"
expect_error "... which train refuses" "label" \
  "$tandem" train --data "$dir/five.zarr" --epochs 1

# IDX files of no images: said so (it once said "expected 0 <= rows < 0").
"$python" - "$dir/empty" <<'PY'
import struct, sys
open(sys.argv[1] + "-images", "wb").write(struct.pack(">BBBBIII", 0, 0, 8, 3, 0, 28, 28))
open(sys.argv[1] + "-labels", "wb").write(struct.pack(">BBBBI", 0, 0, 8, 1, 0))
PY
expect_error "prepare of IDX files without images says so" \
  "$dir/empty-images holds no images: nothing to train on" \
  "$tandem" prepare --out "$dir/empty.zarr" --images "$dir/empty-images" \
  --labels "$dir/empty-labels" --validation-rows 0

# A store (zarr-python's) whose train split has no rows: train names the store (it said only
# "the training stream yields no rows").
"$python" - "$dir/empty-train.zarr" <<'PY'
import sys
import zarr
g = zarr.open_group(sys.argv[1], mode="w", zarr_format=2)
g.create_array("images", shape=(0, 784), dtype="u1", chunks=(500, 784))
g.create_array("labels", shape=(0,), dtype="u1", chunks=(500,))
PY
expect_error "train on a store of no training rows names it" \
  "$dir/empty-train.zarr: the train split has no rows: nothing to train on" \
  "$tandem" train --data "$dir/empty-train.zarr" --epochs 1

summarize
