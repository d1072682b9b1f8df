"""TensorBoard event files written by Tandem (tests/tensorboard_tool.cpp, TensorBoardWriter) are
read by TensorBoard's own reader, the `tensorboard` package from PyPI, with every tag, step,
value (float32, bit-exact) and wall time as written.

usage: tensorboard_read_test.py TENSORBOARD_TOOL

Three readers of the same file:
  - RawEventFileLoader: the TFRecord framing and both CRCs (TensorBoard's reader raises
    DataLossError on a bad CRC and stops there), each record parsed by protobuf as
    tensorboard.Event and serialized again to the very same bytes (so no unknown or misnumbered
    field slips through);
  - LegacyEventFileLoader / EventFileLoader: the Events as written, and as TensorBoard migrates
    them (simple_value to a scalar tensor, as its scalars dashboard reads them);
  - EventAccumulator: Tags(), Scalars(tag), the file version and the first event's time.
The checks are then run on broken copies (a flipped data byte, a flipped length-CRC byte, a
value one ulp off and a step field renumbered, both with valid CRCs) and must fail on each, so
the test cannot pass by reading nothing.
"""

import math
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

from tensorboard.backend.event_processing import event_accumulator, event_file_loader
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.util import tensor_util


def f32(x):
    """x rounded to float32, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f32_bits(x):
    return struct.pack("<f", x)


def expected_scalars():
    """(tag, step, value, wall_time): a training run's score, accuracy and throughput per epoch,
    then awkward values. Steps never go down (TensorBoard purges points after a step that does)."""
    out = []
    wall = 1_700_000_000.0
    for epoch in range(1, 16):
        step = 55 * epoch
        wall += 0.123456789  # fractional wall times, distinct in the last bits
        out.append(("validation/loss", step, f32(2274.1 - 30.3 * epoch), wall))
        out.append(("validation/accuracy", step, f32(0.8378 + 0.0026 * epoch), wall + 1e-6))
        out.append(("train/samples_per_s", step, f32(438_300.0 + 3_321.7 * epoch), wall + 2e-6))
    step = 55 * 15
    for tag, value in [
        ("edge/zero", 0.0),
        ("edge/negative_zero", -0.0),
        ("edge/subnormal", f32(1.5e-42)),
        ("edge/max", f32(3.4028234663852886e38)),
        ("edge/inf", math.inf),
        ("edge/minus_inf", -math.inf),
        ("edge/nan", math.nan),
        ("edge/t\u00e4g/\u20ac", f32(-0.1)),  # UTF-8 tag
        ("edge/" + "x" * 200, f32(1.0 / 3.0)),  # tag longer than 127 bytes: two-byte length
    ]:
        wall += 0.5
        out.append((tag, step, value, wall))
    out.append(("edge/big_step", 1 << 40, f32(2.0), wall + 1.0))
    return out


def tool_args(scalars):
    args = []
    for tag, step, value, wall in scalars:
        value_text = "nan" if math.isnan(value) else float(value).hex()
        args += [tag, str(step), value_text, float(wall).hex()]
    return args


def run_tool(tool, log_dir, scalars):
    before = time.time()
    proc = subprocess.Popen([tool, log_dir] + tool_args(scalars), stdout=subprocess.PIPE)
    out, _ = proc.communicate()
    after = time.time()
    if proc.returncode != 0:
        sys.exit(f"FAIL: {tool} exited with {proc.returncode}")
    return out.decode().strip(), proc.pid, before, after


def same_value(got, want):
    """float32 bit equality; any NaN matches NaN (protobuf and Python may requiet it)."""
    if math.isnan(want):
        return math.isnan(got)
    return f32_bits(got) == f32_bits(want)


def check(log_dir, scalars, pid, before, after):
    """Every problem TensorBoard's readers show with log_dir; empty when all is as written."""
    problems = []
    files = sorted(os.listdir(log_dir))
    if len(files) != 1:
        return [f"expected one event file in {log_dir}, found {files}"]
    name = files[0]
    path = os.path.join(log_dir, name)
    prefix = "events.out.tfevents."
    parts = name[len(prefix):].split(".", 1) if name.startswith(prefix) else None
    if not parts or len(parts) != 2 or not parts[0].isdigit():
        problems.append(f"file name {name!r} is not {prefix}<seconds>.<host>.<pid>")
    else:
        if not int(before) <= int(parts[0]) <= int(after):
            problems.append(f"file name time {parts[0]} outside [{before}, {after}]")
        if parts[1] != f"{socket.gethostname()}.{pid}":
            problems.append(f"file name ends {parts[1]!r}, not {socket.gethostname()}.{pid}")

    # 1. Raw records: framing and CRCs (the loader stops at a DataLossError), and protobuf's
    # own serialization of each parsed Event equals the record.
    raw = list(event_file_loader.RawEventFileLoader(path).Load())
    if len(raw) != len(scalars) + 1:
        problems.append(f"RawEventFileLoader read {len(raw)} records, expected {len(scalars) + 1}")
    for i, record in enumerate(raw):
        try:
            event = event_pb2.Event.FromString(record)
        except Exception as e:  # protobuf's DecodeError
            problems.append(f"record {i}: not an Event: {e}")
            continue
        again = event.SerializeToString(deterministic=True)
        if again != record:
            problems.append(f"record {i}: reserialized {again!r} differs from {record!r}")

    # 2. Events as written.
    events = list(event_file_loader.LegacyEventFileLoader(path).Load())
    if not events:
        return problems + ["LegacyEventFileLoader read no events"]
    first = events[0]
    if first.file_version != "brain.Event:2":
        problems.append(f"first event's file_version is {first.file_version!r}")
    if not before - 1e-3 <= first.wall_time <= after + 1e-3:
        problems.append(f"first event's wall_time {first.wall_time} outside [{before}, {after}]")
    for i, (event, (tag, step, value, wall)) in enumerate(zip(events[1:], scalars)):
        where = f"event {i + 1} ({tag!r} step {step})"
        if event.WhichOneof("what") != "summary":
            problems.append(f"{where}: holds {event.WhichOneof('what')}, not a summary")
            continue
        if event.wall_time != wall:
            problems.append(f"{where}: wall_time {event.wall_time!r}, expected {wall!r}")
        if event.step != step:
            problems.append(f"{where}: step {event.step}, expected {step}")
        values = event.summary.value
        if len(values) != 1:
            problems.append(f"{where}: {len(values)} summary values")
            continue
        v = values[0]
        if v.tag != tag:
            problems.append(f"{where}: tag {v.tag!r}")
        if v.WhichOneof("value") != "simple_value" or not same_value(v.simple_value, value):
            problems.append(f"{where}: value {v.simple_value!r} ({v.WhichOneof('value')}), "
                            f"expected {value!r}")
    if len(events) != len(scalars) + 1:
        problems.append(f"LegacyEventFileLoader read {len(events)} events, "
                        f"expected {len(scalars) + 1}")

    # 3. Events as TensorBoard's data pipeline sees them: simple_value migrated to a scalar tensor.
    migrated = list(event_file_loader.EventFileLoader(path).Load())[1:]
    for i, (event, (tag, step, value, wall)) in enumerate(zip(migrated, scalars)):
        v = event.summary.value[0]
        got = tensor_util.make_ndarray(v.tensor).item() if v.HasField("tensor") else None
        if (v.metadata.plugin_data.plugin_name != "scalars" or got is None or
                not same_value(got, value) or event.step != step or event.wall_time != wall):
            problems.append(f"migrated event {i + 1}: {v.tag!r} step {event.step} value {got!r}, "
                            f"expected {tag!r} step {step} value {value!r}")
    if len(migrated) != len(scalars):
        problems.append(f"EventFileLoader read {len(migrated) + 1} events")

    # 4. EventAccumulator.
    acc = event_accumulator.EventAccumulator(
        log_dir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    if acc.file_version != 2.0:
        problems.append(f"EventAccumulator file_version {acc.file_version!r}")
    try:
        if acc.FirstEventTimestamp() != first.wall_time:
            problems.append(f"FirstEventTimestamp {acc.FirstEventTimestamp()!r}")
    except ValueError as e:
        problems.append(f"FirstEventTimestamp: {e}")
    want_tags = sorted({s[0] for s in scalars})
    got_tags = sorted(acc.Tags()["scalars"])
    if got_tags != want_tags:
        problems.append(f"EventAccumulator scalar tags {got_tags}, expected {want_tags}")
    for tag in want_tags:
        want = [(wall, step, value) for t, step, value, wall in scalars if t == tag]
        got = [(e.wall_time, e.step, e.value) for e in acc.Scalars(tag)] if tag in got_tags else []
        if len(got) != len(want) or not all(
                gw == ww and gs == ws and same_value(gv, wv)
                for (gw, gs, gv), (ww, ws, wv) in zip(got, want)):
            problems.append(f"EventAccumulator.Scalars({tag!r}) = {got}, expected {want}")
    return problems


def reframe(record):
    """One TFRecord around `record`, with valid CRCs (TensorBoard's own masked_crc32c)."""
    header = struct.pack("<Q", len(record))
    return (header + struct.pack("<I", masked_crc32c(header)) + record +
            struct.pack("<I", masked_crc32c(record)))


def records_with_offsets(data):
    out, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        out.append((pos, data[pos + 12:pos + 12 + n]))
        pos += 16 + n
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    tool = sys.argv[1]
    import tensorboard
    print(f"tensorboard {tensorboard.__version__}")
    scalars = expected_scalars()
    tmp = tempfile.mkdtemp(prefix="tandem-tb-")
    try:
        log_dir = os.path.join(tmp, "runs", "tandem")  # the writer creates the parents
        path, pid, before, after = run_tool(tool, log_dir, scalars)
        problems = check(log_dir, scalars, pid, before, after)
        for p in problems:
            print("FAIL:", p)
        if problems:
            sys.exit(f"tensorboard read: {len(problems)} problem(s) in {path}")
        print(f"ok: TensorBoard read {len(scalars)} scalars + the file version from {path}")

        # The default sequence of the tool (no scalars given) reads too.
        default_dir = os.path.join(tmp, "default")
        run_tool(tool, default_dir, [])
        acc = event_accumulator.EventAccumulator(default_dir)
        acc.Reload()
        got = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
        want = {"validation/loss": [(55, f32(1865.6))],
                "validation/accuracy": [(55, f32(0.8742))],
                "train/samples_per_s": [(55, f32(488100.0))]}
        if got != want:
            sys.exit(f"FAIL: default sequence read as {got}, expected {want}")
        print("ok: the tool's default sequence")

        # Broken copies must be reported, or the checks above prove nothing.
        with open(path, "rb") as f:
            good = f.read()
        records = records_with_offsets(good)
        target = 1 + 3 * 7 + 1  # epoch 8's validation/accuracy
        offset, record = records[target]
        event = event_pb2.Event.FromString(record)
        one_ulp = event_pb2.Event()
        one_ulp.CopyFrom(event)
        bits = struct.unpack("<I", f32_bits(event.summary.value[0].simple_value))[0]
        one_ulp.summary.value[0].simple_value = struct.unpack("<f", struct.pack("<I", bits + 1))[0]
        step_key = bytes([2 << 3 | 0])
        assert record.count(step_key) >= 1 and record[9:10] == step_key, record[:12]
        renumbered = record[:9] + bytes([4 << 3 | 0]) + record[10:]  # step as field 4
        end = offset + 16 + len(record)
        mutants = {
            "flipped data byte": good[:offset + 14] + bytes([good[offset + 14] ^ 0x01]) +
                                 good[offset + 15:],
            "flipped length-CRC byte": good[:offset + 9] + bytes([good[offset + 9] ^ 0x80]) +
                                       good[offset + 10:],
            "value one ulp off (valid CRCs)":
                good[:offset] + reframe(one_ulp.SerializeToString()) + good[end:],
            "step renumbered to field 4 (valid CRCs)":
                good[:offset] + reframe(renumbered) + good[end:],
        }
        for label, data in mutants.items():
            mutant_dir = os.path.join(tmp, "mutant")
            shutil.rmtree(mutant_dir, ignore_errors=True)
            os.makedirs(mutant_dir)
            with open(os.path.join(mutant_dir, os.path.basename(path)), "wb") as f:
                f.write(data)
            found = check(mutant_dir, scalars, pid, before, after)
            if not found:
                sys.exit(f"FAIL: a copy with a {label} passed the checks")
            print(f"ok: a {label} is caught ({found[0]})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("tensorboard read: all checks passed")


if __name__ == "__main__":
    main()
