"""Writes the fuzz targets' seed corpus (corpus/<target>/seed-*): valid inputs of each kind, made
by the tools users make them with (zarr-python 3 for metadata in both formats, numcodecs for
compressed chunks, the safetensors package) or packed by hand from the format's description (the
wire protocol, the trial-slot protocol, search grids). The fuzzers start from these; the replay
tests (fuzz.*) run them in every build. Run with the test environment's Python:

    .venv-test/bin/python tests/fuzz/make_seeds.py

Found crashes are kept beside the seeds as corpus/<target>/crash-* once fixed; this script
leaves those alone.
"""
import gzip
import json
import os
import struct
import tempfile

import numcodecs
import numpy as np
import safetensors.numpy
import zarr
from zarr.codecs import BytesCodec, GzipCodec, ShardingCodec, ZstdCodec

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "seed-" + name), "wb") as f:
        f.write(data)


def zarr_metadata():
    # The input's first byte: even for v2 (.zarray), odd for v3 (zarr.json).
    with tempfile.TemporaryDirectory() as tmp:
        cases = [
            ("v2-uint8-blosc", 2, "uint8", (70, 784), (10, 784), "default"),
            ("v2-float32-zstd", 2, "float32", (7, 10), (3, 4), numcodecs.Zstd(level=3)),
            ("v2-int64-none", 2, "int64", (5,), (2,), None),
            ("v3-uint8-zstd", 3, "uint8", (70, 784), (10, 784), "default"),
            ("v3-float32-none", 3, "float32", (7, 10), (3, 4), None),
            ("v3-int64", 3, "int64", (5,), (2,), "default"),
            ("v2-uint8-gzip", 2, "uint8", (70, 784), (10, 784), numcodecs.GZip(level=1)),
            ("v2-float32-zlib", 2, "float32", (7, 10), (3, 4), numcodecs.Zlib(level=1)),
            ("v3-float32-gzip", 3, "float32", (7, 10), (3, 4), GzipCodec(level=5)),
        ]
        # zarr-python's sharding (its index last, with a checksum), and one with the index first.
        path = os.path.join(tmp, "v3-uint8-sharded")
        zarr.create_array(path, shape=(70, 784), chunks=(10, 784), shards=(30, 784),
                          dtype="uint8", fill_value=0)
        with open(os.path.join(path, "zarr.json"), "rb") as f:
            write("zarr_metadata", "v3-uint8-sharded", b"\1" + f.read())
        path = os.path.join(tmp, "v3-float32-sharded-index-first")
        zarr.create_array(path, shape=(7, 10), chunks=(4, 10), dtype="float32", fill_value=0,
                          serializer=ShardingCodec(chunk_shape=(2, 5), index_location="start"))
        with open(os.path.join(path, "zarr.json"), "rb") as f:
            write("zarr_metadata", "v3-float32-sharded-index-first", b"\1" + f.read())
        for name, fmt, dtype, shape, chunks, codec in cases:
            path = os.path.join(tmp, name)
            kwargs = {}
            if codec is None:
                kwargs["compressors"] = None
            elif codec != "default":
                kwargs["compressors"] = codec
            zarr.create_array(path, shape=shape, chunks=chunks, dtype=dtype, zarr_format=fmt,
                              fill_value=0, **kwargs)
            meta = os.path.join(path, ".zarray" if fmt == 2 else "zarr.json")
            with open(meta, "rb") as f:
                write("zarr_metadata", name, bytes([fmt & 1]) + f.read())
    # Dimension separators and v3's v2 key encoding.
    v2 = {"zarr_format": 2, "shape": [4, 6], "chunks": [2, 3], "dtype": "<f4",
          "compressor": None, "fill_value": "NaN", "order": "C", "filters": None,
          "dimension_separator": "/"}
    write("zarr_metadata", "v2-nested-nan", b"\0" + json.dumps(v2).encode())
    v3 = {"zarr_format": 3, "node_type": "array", "shape": [4, 6], "data_type": "float32",
          "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 3]}},
          "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "."}},
          "fill_value": "NaN", "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                                          {"name": "zstd", "configuration": {"level": 5}}],
          "attributes": {"by": "hand"}}
    write("zarr_metadata", "v3-v2-keys", b"\1" + json.dumps(v3).encode())


def crc32c(data):
    """CRC-32C (Castagnoli), bit by bit: what Zarr v3's crc32c codec appends."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def zarr_chunk():
    # [selector][expected size, uint16 LE][stored chunk]; the selector's low 3 bits and bit 5
    # (as the fourth) are the compressor in the target's order: none, zstd, blosc-lz4,
    # blosc-zstd, blosc-lz4hc, blosc-blosclz, blosc-zlib, blosc-zstd-bitshuffle, gzip, zlib;
    # bit 3: the chunk ends with its crc32c checksum; bit 4: the target appends the right one.
    rng = np.random.default_rng(7)
    plain = (np.arange(3000) % 251).astype(np.uint8).tobytes()
    floats = rng.standard_normal(500).astype(np.float32).tobytes()
    codecs = [
        (1, "zstd", numcodecs.Zstd(level=3)),
        (2, "blosc-lz4", numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1)),
        (3, "blosc-zstd", numcodecs.Blosc(cname="zstd", clevel=5, shuffle=1)),
        (4, "blosc-lz4hc", numcodecs.Blosc(cname="lz4hc", clevel=5, shuffle=1)),
        (5, "blosc-blosclz", numcodecs.Blosc(cname="blosclz", clevel=5, shuffle=1)),
        (6, "blosc-zlib", numcodecs.Blosc(cname="zlib", clevel=5, shuffle=1)),
        (7, "blosc-zstd-bitshuffle", numcodecs.Blosc(cname="zstd", clevel=5, shuffle=2)),
        (0x20, "gzip", numcodecs.GZip(level=5)),
        (0x21, "zlib", numcodecs.Zlib(level=1)),
    ]
    write("zarr_chunk", "none", bytes([0]) + struct.pack("<H", len(plain)) + plain)
    for index, name, codec in codecs:
        for kind, data in (("bytes", plain), ("floats", floats)):
            stored = codec.encode(np.frombuffer(data, np.float32 if kind == "floats" else np.uint8))
            write("zarr_chunk", f"{name}-{kind}",
                  bytes([index]) + struct.pack("<H", len(data)) + bytes(stored))
    # A gzip stream of two members, zero-padded: Python's gzip module reads it as one.
    two = gzip.compress(plain[:1000], mtime=0) + gzip.compress(plain[1000:], mtime=0) + bytes(8)
    write("zarr_chunk", "gzip-two-members", bytes([0x20]) + struct.pack("<H", len(plain)) + two)
    # Shards of an 8 x 8 uint8 chunk as zarr-python writes them (bit 6): inner chunks of 4 x 4
    # (size's low bit 0) or 2 x 8 (1), zstd or gzip inside, the index last with its checksum
    # (bit 3) or first (bit 7).
    with tempfile.TemporaryDirectory() as tmp:
        for name, selector, inner, codec, location in (
                ("shard-zstd-4x4", 0x40 | 1 | 0x08, (4, 4), ZstdCodec(level=3), "end"),
                ("shard-gzip-2x8-index-first", 0x40 | 0x20 | 0x08 | 0x80, (2, 8),
                 GzipCodec(level=5), "start")):
            path = os.path.join(tmp, name)
            z = zarr.create_array(path, shape=(8, 8), chunks=(8, 8), dtype="uint8", fill_value=0,
                                  serializer=ShardingCodec(chunk_shape=inner,
                                                           codecs=[BytesCodec(), codec],
                                                           index_location=location))
            z[...] = (np.arange(64) % 7).astype(np.uint8).reshape(8, 8)
            with open(os.path.join(path, "c", "0", "0"), "rb") as f:
                stored = f.read()
            size = 64 | (1 if inner == (2, 8) else 0)  # the low bit picks the inner chunks
            write("zarr_chunk", name, bytes([selector]) + struct.pack("<H", size) + stored)
    # With the checksum: stored (as zarr-python writes it), and appended by the target.
    for index, name, data in ((0, "none", plain), (1, "zstd-bytes", plain),
                              (2, "blosc-lz4-floats", floats)):
        codec = dict((i, c) for i, _, c in codecs).get(index)
        stored = data if codec is None else bytes(codec.encode(
            np.frombuffer(data, np.float32 if name.endswith("floats") else np.uint8)))
        head = struct.pack("<H", len(data))
        write("zarr_chunk", f"{name}-crc32c",
              bytes([index | 0x08]) + head + stored + struct.pack("<I", crc32c(stored)))
        write("zarr_chunk", f"{name}-crc32c-appended", bytes([index | 0x18]) + head + stored)


def checkpoint():
    # What encode_checkpoint writes (checkpoint.cpp): the parameters under their names, Adam's
    # moments as NAME.adam_m / NAME.adam_v, the best state as best/NAME, the rest in metadata.
    from safetensors.numpy import save
    rng = np.random.default_rng(11)
    shapes = {"hid_w": (4, 3), "hid_b": (3,), "sm_w": (3, 2), "sm_b": (2,)}
    base = {"format": "tandem-checkpoint", "format_version": "1", "layers": "4-3-2",
            "learning_rate": "0.00999999978", "beta1": "0.899999976", "beta2": "0.999000013",
            "epsilon": "9.99999994e-09", "step": "7", "epoch": "1", "seed": "42", "batch": "8"}

    def tensors(prefix, adam):
        out = {}
        for name, shape in shapes.items():
            out[prefix + name] = rng.standard_normal(shape).astype(np.float32)
            if adam:
                out[prefix + name + ".adam_m"] = rng.standard_normal(shape).astype(np.float32)
                out[prefix + name + ".adam_v"] = rng.random(shape).astype(np.float32)
        return out

    write("checkpoint", "sgd", save(tensors("", False), metadata=dict(base, optimizer="sgd")))
    write("checkpoint", "adam", save(tensors("", True), metadata=dict(base, optimizer="adam")))
    both = tensors("", True)
    both.update(tensors("best/", True))
    write("checkpoint", "adam-best", save(both, metadata=dict(
        base, optimizer="adam", best_step="5", best_epoch="1", best_validation_loss="0.5",
        best_validation_samples="10")))


def ps_checkpoint():
    # What a parameter server writes (ps_checkpoint_file.cpp): the shard's parameters under their
    # names, Adam's moments as NAME.adam_m / NAME.adam_v, the rest in metadata.
    from safetensors.numpy import save
    rng = np.random.default_rng(12)
    shapes = {"hidden/weights": (4, 3), "hidden/bias": (3,), "softmax/weights": (3, 2),
              "scale": ()}
    order = "\n".join(shapes)

    def tensors(adam):
        out = {}
        for name, shape in shapes.items():
            out[name] = rng.standard_normal(shape).astype(np.float32)
            if adam:
                out[name + ".adam_m"] = rng.standard_normal(shape).astype(np.float32)
                out[name + ".adam_v"] = rng.random(shape).astype(np.float32)
        return out

    def meta(optimizer, step):
        return {"format": "tandem-ps-shard", "step": step, "mode": "async", "shard": "ps0",
                "optimizer": optimizer, "model_order": order}

    write("ps_checkpoint", "adam", save(tensors(True), metadata=meta("adam", "120")))
    write("ps_checkpoint", "sgd", save(tensors(False), metadata=meta("sgd", "7")))
    # From an older version: no model order.
    old = meta("adam", "0")
    del old["model_order"]
    write("ps_checkpoint", "adam-no-order", save(tensors(True), metadata=old))


def frames(*parts):
    return b"".join(struct.pack("<H", len(p)) + p for p in parts)


def header_frame(type_, request_id, version, tensors, extra=b""):
    body = b""
    for name, shape in tensors:
        count = int(np.prod(shape)) if shape else 1
        body += struct.pack("<H", len(name)) + name.encode() + struct.pack("<BB", 1, len(shape))
        body += b"".join(struct.pack("<q", d) for d in shape) + struct.pack("<Q", 4 * count)
    body += struct.pack("<I", len(extra)) + extra
    return struct.pack("<IHHQQII", 0x53504454, 1, type_, request_id, version, len(tensors),
                       len(body)) + body


def wire_frames():
    # Types: Init 1, Pull 2, Push 3, PushPull 4, Stats 5, Checkpoint 6, Shutdown 7, Reply 8,
    # Error 9. Frames are cut from the input as uint16 LE length + bytes.
    tensors = [("hidden/weights", [3, 4]), ("hidden/bias", [4]), ("global_step", [])]
    data = [np.arange(12, dtype=np.float32), np.ones(4, np.float32), np.zeros(1, np.float32)]
    write("wire_frames", "pull", frames(header_frame(2, 7, 0, [])))
    write("wire_frames", "pushpull", frames(header_frame(4, 8, 3, tensors),
                                            *[d.tobytes() for d in data]))
    write("wire_frames", "reply", frames(header_frame(8, 8, 4, tensors[:2]),
                                         *[d.tobytes() for d in data[:2]]))
    write("wire_frames", "error", frames(header_frame(9, 9, 4, [], b"unknown parameter 'x'")))
    write("wire_frames", "stats", frames(header_frame(8, 1, 2, [], b'{"pushes": 3}')))
    nan = np.array([1.0, np.nan, np.inf, 2.0] * 5, np.float32)
    write("wire_frames", "push-nan", frames(header_frame(3, 2, 1, [("g", [20])]), nan.tobytes()))


def ps_shard():
    # [optimizer: bit 0 SGD][records: uint16 LE length + one message's frames]; the shard holds
    # "w" 3x20, "b" 20 and a scalar "s". Request id bit 0: summed (sync), bit 1: then applied.
    def record(*parts):  # one message's frames, framed once more as one record
        return frames(frames(*parts))

    names = [("w", [3, 20]), ("b", [20]), ("s", [])]
    grads = [np.linspace(-1, 1, 60, dtype=np.float32), np.full(20, 0.5, np.float32),
             np.array([0.25], np.float32)]
    push = record(header_frame(4, 0, 1, names), *[g.tobytes() for g in grads])
    summed = record(header_frame(3, 1, 1, names), *[g.tobytes() for g in grads])
    summed_applied = record(header_frame(3, 3, 1, names), *[g.tobytes() for g in grads])
    wrong_shape = record(header_frame(4, 0, 1, [("w", [20, 3])] + names[1:]),
                         *[g.tobytes() for g in grads])
    nan = grads[0].copy()
    nan[5] = np.nan
    non_finite = record(header_frame(4, 0, 1, names), nan.tobytes(),
                        *[g.tobytes() for g in grads[1:]])
    missing = record(header_frame(4, 0, 1, names[:2]), *[g.tobytes() for g in grads[:2]])
    unknown = record(header_frame(4, 0, 1, names[:2] + [("x", [])]),
                     *[g.tobytes() for g in grads])
    pull = record(header_frame(2, 5, 1, [("w", [3, 20])]), grads[0].tobytes())
    write("ps_shard", "adam-pushes", b"\0" + push + summed + summed_applied + push)
    write("ps_shard", "sgd-pushes", b"\1" + push + summed + summed_applied)
    write("ps_shard", "refused", b"\0" + wrong_shape + non_finite + missing + unknown + push)
    write("ps_shard", "pull", b"\0" + pull + push)


def coordinator_requests():
    # One request per line, in order, to a coordinator expecting 1 server, 1 worker, 1 scorer.
    def lines(*requests):
        return "\n".join(json.dumps(r) for r in requests).encode()

    register = [{"type": "register", "role": "ps", "pid": 11, "host": "h", "seq": 1},
                {"type": "register", "role": "worker", "pid": 12, "host": "h", "seq": 2},
                {"type": "register", "role": "scorer", "pid": 13, "host": "h", "seq": 3}]
    write("coordinator_requests", "startup", lines(
        *register, {"type": "ready", "name": "ps0", "address": "tcp://127.0.0.1:5555"},
        {"type": "spec"}, {"type": "work", "name": "worker0"},
        {"type": "heartbeat", "name": "worker0", "status": {"task": 1, "done": 2}},
        {"type": "score", "step": 10, "loss": 1.5, "accuracy": 0.5, "samples": 100},
        {"type": "status"}))
    write("coordinator_requests", "stop-and-goodbye", lines(
        *register, {"type": "ready", "name": "ps0", "address": "tcp://127.0.0.1:5555"},
        {"type": "progress", "name": "worker0", "task": 1, "done": 1},
        {"type": "stop", "reason": "enough"},
        {"type": "work", "name": "worker0", "finished": 1, "done": 3},
        {"type": "goodbye", "name": "worker0", "status": {"steps": 3}},
        {"type": "heartbeat", "name": "worker0", "status": {"stalled": "backend call"}}))
    write("coordinator_requests", "refused", b'{"type": "work", "name": "nobody"}\n[1, 2]\n'
                                             b'not json\n{"type": 5}')


def coordinator_replies():
    # The input's first byte: 0 for a reply to "register", 1 to "spec", 2 to "work"; then the
    # reply as a coordinator sends it (coordinator.cpp). The run's settings as this release's
    # to_json(RunSettings) writes its defaults.
    config = {"assemblers": 1, "backend": "cpu", "batch": 1000, "best_model_path": "",
              "beta1": 0.8999999761581421, "beta2": 0.9990000128746033, "checkpoint_dir": "",
              "checkpoint_every_s": 0.0, "checkpoint_every_steps": 0, "curve_allowed_path": "",
              "curve_client_file": "", "curve_secret_file": "", "curve_server_public": "",
              "data": "", "epsilon": 9.99999993922529e-09, "fed": False,
              "init_timeout_ms": 60000, "lr": 0.009999999776482582, "model": "784-100-10",
              "optimizer": "adam", "overlap": False, "precision": "fp32", "ps_device": "auto",
              "ps_mode": "async", "ps_timeout_ms": 10000, "readers": 1,
              "replicas_to_aggregate": 1, "score_interval_s": 1.0, "scorer_threads": 1,
              "seed": 1, "shuffle": True, "staleness_bound": 0, "step_timeout_s": 600.0,
              "worker_group": 1, "worker_threads": 1}

    def reply(kind, message):
        return bytes([kind]) + json.dumps(message).encode()

    write("coordinator_replies", "register", reply(0, {
        "name": "worker0", "index": 0, "chief": True, "config": config, "phase": "starting",
        "run": "1764921600-4242"}))
    member = {"host": "h", "pid": 11}
    write("coordinator_replies", "spec", reply(1, {
        "ready": True, "phase": "training", "waiting_for": [],
        "spec": {"coordinator": "tcp://127.0.0.1:5000", "scores": "tcp://127.0.0.1:5001",
                 "ps": [dict(member, name="ps0", address="tcp://127.0.0.1:5002")],
                 "worker": [dict(member, name="worker0", address="")],
                 "scorer": [dict(member, name="scorer0", address="")]}}))
    write("coordinator_replies", "work-task", reply(2, {
        "task": {"id": 7, "epoch": 1, "batches": [0, 3, 6, 9]}}))
    write("coordinator_replies", "work-wait", reply(2, {"wait_ms": 100}))
    write("coordinator_replies", "work-stop", reply(2, {"stop": True}))


def slot_message():
    messages = [
        {"v": 1, "type": "hello"},
        {"v": 1, "type": "hello", "slots": 2, "running": 1, "threads": 1,
         "heartbeat_timeout_ms": 5000},
        {"v": 1, "type": "start", "job": "trial-3", "args": ["train", "--lr", "0.01"],
         "log": "/tmp/trial-3.log"},
        {"v": 1, "type": "started", "job": "trial-3", "pid": 4242},
        {"v": 1, "type": "exited", "job": "trial-3", "exit_code": 0},
        {"v": 1, "type": "exited", "job": "trial-3", "signal": 9},
        {"v": 1, "type": "cancel", "job": "trial-3"},
        {"v": 1, "type": "heartbeat", "running": 1},
        {"v": 1, "type": "bye"},
        {"v": 1, "type": "error", "error": "every slot is taken", "job": "trial-4", "busy": True},
    ]
    for i, m in enumerate(messages):
        write("slot_message", f"{i:02d}-{m['type']}", json.dumps(m).encode())


def safetensors_seeds():
    tensors = {"hidden/weights": np.arange(12, dtype=np.float32).reshape(3, 4),
               "hidden/bias": np.zeros(4, np.float32),
               "global_step": np.array(5, np.int64),
               "labels": np.arange(6, dtype=np.uint8)}
    write("safetensors", "model", safetensors.numpy.save(tensors, metadata={"format": "tandem"}))
    write("safetensors", "empty", safetensors.numpy.save({}))
    write("safetensors", "f16", safetensors.numpy.save({"h": np.ones((2, 2), np.float16)}))


def trial_configs():
    write("trial_configs", "grid", b"\1lr=0.001,0.003,0.01 hidden=100,300 batch=100,1000")
    write("trial_configs", "grid-all-keys", b"\1lr=1e-3 hidden=256x128 batch=64 optimizer=sgd "
                                            b"seed=1,2")
    trials = [{"lr": 0.01, "hidden": "100", "batch": 100},
              {"lr": "0.003", "hidden": [256, 128], "optimizer": "adam", "seed": 3}]
    write("trial_configs", "list", b"\0" + json.dumps(trials).encode())


def idx_file():
    # Two zero bytes, the type code, the number of dimensions, big-endian uint32 dimensions, then
    # big-endian elements; a gzip-compressed copy of some.
    cases = [
        ("images-uint8", 0x08, ">u1", (3, 4, 4)),
        ("labels-uint8", 0x08, ">u1", (10,)),
        ("int8", 0x09, ">i1", (5,)),
        ("int16", 0x0B, ">i2", (2, 3)),
        ("int32", 0x0C, ">i4", (2, 2)),
        ("float32", 0x0D, ">f4", (3, 2)),
        ("float64", 0x0E, ">f8", (2,)),
        ("scalar", 0x08, ">u1", ()),
    ]
    for name, code, dtype, dims in cases:
        values = (np.arange(int(np.prod(dims)) if dims else 1) % 100).astype(dtype)
        data = bytes([0, 0, code, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims)
        data += values.tobytes()
        write("idx_file", name, data)
        if name in ("images-uint8", "float32"):
            write("idx_file", name + ".gz", gzip.compress(data, mtime=0))


if __name__ == "__main__":
    zarr_metadata()
    zarr_chunk()
    checkpoint()
    ps_checkpoint()
    wire_frames()
    ps_shard()
    slot_message()
    coordinator_requests()
    coordinator_replies()
    safetensors_seeds()
    trial_configs()
    idx_file()
