#!/usr/bin/env python3
"""Summarize one GPU check run: Tandem against PyTorch and the hardware ceilings.

What it reads (each file optional; a missing, empty or malformed file, or a
missing key, is reported in the output and never stops the script):

  --kernels PATH  Google Benchmark JSON of tandem's kernels_cuda_bench: a
                  top-level "benchmarks" list whose entries have "name"
                  (suffixes such as "/manual_time" are ignored), "real_time",
                  "time_unit" and user counters as top-level keys ("GBps",
                  "TFLOPs").  The ceilings are the best "ceiling/d2d_copy*"
                  GBps and the best "ceiling/sgemm_fp32*" TFLOPs; every other
                  entry is a kernel.  A kernel's time is its "us_per_call"
                  counter where present (one iteration may time several
                  calls), else real_time.  With repetitions, the median
                  aggregate is used.
  --tandem PATH   tandem's step benchmark JSON:
                  {"device": ..., "results": [{"batch": B, "precision": "fp32",
                   "steps_per_s": ..., "ms_per_step": ..., "flops_per_step": ...}]}
                  Where a batch has several fp32 results (CUDA Graphs and
                  eager launches, "graph": true/false) the fastest is shown,
                  with its mode; other precisions (tf32, bf16) go to their own
                  table, against PyTorch at the same precision.
  --torch PATH    bench/torch_gpu_bench.py's JSON (impls eager, eager_fused,
                  compile, graph).
  --torch-other PATH
                  the same script's JSON for --precisions tf32,bf16: compared
                  with Tandem's tf32 and bf16 steps in a table of their own.
  --feed PATH     tandem_train_step_cuda_bench --store's JSON (the data feed).
  --group PATH    tandem_group_step_cuda_bench's JSON: {"results": [{"batch",
                  "way": plain | group-host | group-nccl, "us_per_step",
                  "ratio_to_plain"}]}.
  --search-dir D  the GPU check's $OUT holding search_{cuda,cpu}_p{1,2}.json
                  (tandem search --json) and predict.json (a list of {"command",
                  "backend", "processes", "split", "rows", "best_seconds",
                  "samples_per_s"}).

What it prints (the last thing bench/gpu_check.sh prints):

  Table 1, training steps in fp32, per batch: Tandem, PyTorch eager and
  compile steps/s; Tandem/eager and Tandem/compile; Tandem's FLOP floor
  (flops_per_step / the sgemm_fp32 ceiling rate, in ms) and Tandem's ms/step
  as a multiple of that floor.
  Table 2, kernels: time (us), GB/s and % of the copy ceiling, TFLOP/s and %
  of the sgemm ceiling where the benchmark reports them.
  Goals, each PASS, MISS or n/a (with what is missing):
    batch 10000: Tandem/eager >= 2.0 and Tandem/compile >= 1.2;
    batch 60000: Tandem ms/step <= 2.0 x its FLOP floor;
    adam at its largest N: GB/s >= 70% of the copy ceiling.

--markdown PATH writes the same as Markdown.  The exit status is 0 unless
the arguments are wrong: it reports, it does not gate.

How to run:

  python3 bench/gpu_table.py --kernels /tmp/kernels.json \\
      --tandem /tmp/tandem_gpu.json --torch /tmp/torch_gpu.json \\
      --markdown /tmp/gpu_table.md

Only the Python standard library is used.
"""

import argparse
import json
import math
import os
import re
import sys

COPY_CEILING = "ceiling/d2d_copy"
SGEMM_CEILING = "ceiling/sgemm_fp32"

GOAL_EAGER = (10000, 2.0)      # batch, Tandem/eager at least
GOAL_COMPILE = (10000, 1.2)    # batch, Tandem/compile at least
GOAL_FLOOR = (60000, 2.0)      # batch, ms/step at most this multiple of the floor
GOAL_ADAM_SHARE = 0.70         # adam GB/s share of the copy ceiling, at least

# Model 784-100-10: FLOPs per sample of a training step (see compare_cpu.py),
# used only when tandem's JSON lacks flops_per_step.
DEFAULT_FLOPS_PER_SAMPLE = 319600

TIME_UNIT_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
SUFFIX_SEGMENT = re.compile(
    r"^(manual_time|real_time|process_time|(iterations|repeats|threads|min_time|"
    r"min_warmup_time):[^/]*)$")
AGGREGATE_SUFFIX = re.compile(r"_(mean|median|stddev|cv)$")


# --------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------

def load_json(path, what, notes):
    """The parsed document, or None with a note saying why."""
    if not path:
        notes.append("%s: not given" % what)
        return None
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        notes.append("%s: missing (%s: %s)" % (what, path, e.strerror or e))
        return None
    if not text.strip():
        notes.append("%s: empty file (%s)" % (what, path))
        return None
    try:
        return json.loads(text)
    except ValueError as e:
        # Fall back to one JSON object per line (the CPU benchmarks' style).
        records = []
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    records.append(json.loads(line))
                except ValueError:
                    pass
        if records:
            notes.append("%s: not one JSON document; read %d JSON lines (%s)"
                         % (what, len(records), path))
            return {"results": records}
        notes.append("%s: unreadable JSON (%s: %s)" % (what, path, e))
        return None


def num(value):
    """A finite float, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        v = float(value)
        return v if math.isfinite(v) else None
    if isinstance(value, str):
        try:
            v = float(value)
        except ValueError:
            return None
        return v if math.isfinite(v) else None
    return None


def results_of(doc):
    if isinstance(doc, list):
        items = doc
    elif isinstance(doc, dict):
        items = doc.get("results")
    else:
        items = None
    return [r for r in items if isinstance(r, dict)] if isinstance(items, list) else []


def step_rates(r):
    """(steps_per_s, ms_per_step) from whichever of them (or samples_per_s) is there."""
    sps, ms = num(r.get("steps_per_s")), num(r.get("ms_per_step"))
    batch = num(r.get("batch"))
    if sps is None and num(r.get("samples_per_s")) and batch:
        sps = num(r.get("samples_per_s")) / batch
    if sps is None and ms and ms > 0:
        sps = 1e3 / ms
    if ms is None and sps and sps > 0:
        ms = 1e3 / sps
    return sps, ms


def as_batch(value):
    v = num(value)
    return int(v) if v is not None and v == int(v) else None


def read_tandem(doc, notes):
    """(fp32, other): fp32 is batch -> {"sps", "ms", "flops", "error", "mode"}
    for fp32 training results, other (precision, batch) -> (sps, mode) for the
    rest.

    With several results for a batch (CUDA Graphs and eager launches,
    "graph": true/false), the fastest is kept and its mode recorded."""
    out, other = {}, {}
    if doc is None:
        return out, other
    rows = results_of(doc)
    if not rows:
        notes.append("tandem: no results list")
    for r in rows:
        prec = str(r.get("precision", "fp32")).lower()
        if r.get("mode") not in (None, "train"):
            continue
        batch = as_batch(r.get("batch"))
        if batch is None:
            if r.get("error"):  # a configuration that failed as a whole (its backend, say)
                notes.append("tandem %s %s: failed: %s" % (
                    prec, "graph" if r.get("graph", True) else "eager", r.get("error")))
            else:
                notes.append("tandem: a result without a batch was skipped")
            continue
        sps, ms = step_rates(r)
        graph = r.get("graph")
        mode = None if graph is None else ("graph" if graph else "eager")
        if prec != "fp32":
            if sps is not None and sps > other.get((prec, batch), (0, None))[0]:
                other[(prec, batch)] = (sps, mode)
            continue
        rec = {"sps": sps, "ms": ms, "flops": num(r.get("flops_per_step")),
               "error": r.get("error"), "mode": mode}
        old = out.get(batch)
        if old is None or (sps is not None and (old["sps"] is None or sps > old["sps"])):
            out[batch] = rec
    if rows and not out:
        notes.append("tandem: no fp32 training results")
    return out, other


def read_torch(doc, notes):
    """(fp32, other): fp32 is (impl, batch) -> {"sps", "ms", "error"} for the
    fp32 results, other (precision, impl, batch) -> the same for the rest."""
    out, other = {}, {}
    if doc is None:
        return out, other
    if isinstance(doc, dict) and doc.get("skipped"):
        notes.append("torch: skipped (%s)" % doc.get("skipped"))
    rows = results_of(doc)
    if not rows and not (isinstance(doc, dict) and doc.get("skipped")):
        notes.append("torch: no results list")
    for r in rows:
        batch = as_batch(r.get("batch"))
        impl = r.get("impl")
        if batch is None or not isinstance(impl, str):
            notes.append("torch: a result without impl or batch was skipped")
            continue
        sps, ms = step_rates(r)
        rec = {"sps": sps, "ms": ms, "error": r.get("error")}
        prec = str(r.get("precision", "fp32")).lower()
        table, key = (out, (impl, batch)) if prec == "fp32" else (other, (prec, impl, batch))
        if key not in table or table[key]["sps"] is None:
            table[key] = rec
    return out, other


def other_precisions_table(tandem_other, torch_other, errors):
    """Tandem's tf32 and bf16 steps against PyTorch's at float32 matmul precision
    high and medium (torch_gpu_bench.py --precisions; both TF32 on CUDA): (head,
    rows, right)."""
    impls = [i for i in ("eager", "eager_fused", "graph") if any(k[1] == i for k in torch_other)]
    head = (["precision", "batch", "tandem/s", "mode"] + ["%s/s" % i for i in impls]
            + ["vs %s" % i for i in impls])
    rows = []
    for prec, b in sorted(set(tandem_other) | {(p, b) for p, _, b in torch_other}):
        t_sps, mode = tandem_other.get((prec, b), (None, None))
        cells = [prec, format(b, ","), fmt(t_sps, ",.1f"), mode or "-"]
        rates = []
        for i in impls:
            r = torch_other.get((prec, i, b), {})
            if r.get("error"):
                errors.append("torch %s %s batch %d: %s" % (i, prec, b, r["error"]))
            rates.append(r.get("sps"))
            cells.append("error" if r.get("error") and r.get("sps") is None
                         else fmt(r.get("sps"), ",.1f"))
        cells += [fmt(ratio(t_sps, v), ".2f", "x") for v in rates]
        rows.append(cells)
    return head, rows, [h not in ("precision", "mode") for h in head]


def base_name(entry):
    name = entry.get("run_name") or entry.get("name") or ""
    name = str(name)
    if entry.get("run_type") == "aggregate" and not entry.get("run_name"):
        name = AGGREGATE_SUFFIX.sub("", name)
    parts = [p for p in name.split("/") if not SUFFIX_SEGMENT.match(p)]
    return "/".join(parts)


def counter(entry, *names):
    """A user counter by name, case-insensitive."""
    for n in names:
        if n in entry:
            v = num(entry[n])
            if v is not None:
                return v
    lower = {str(k).lower(): k for k in entry}
    for n in names:
        k = lower.get(n.lower())
        if k is not None:
            v = num(entry[k])
            if v is not None:
                return v
    return None


def read_kernels(doc, notes):
    """List of {"name", "us", "gbps", "tflops", "error"} in file order, one per run."""
    if doc is None:
        return []
    benches = doc.get("benchmarks") if isinstance(doc, dict) else None
    if not isinstance(benches, list):
        notes.append("kernels: no \"benchmarks\" list")
        return []
    # One entry per run: the median aggregate, else the mean, else the first iteration.
    rank = {"median": 0, "mean": 1, None: 2}
    chosen, order = {}, []
    for e in benches:
        if not isinstance(e, dict):
            continue
        agg = e.get("aggregate_name") if e.get("run_type") == "aggregate" else None
        if agg not in rank:
            continue  # stddev, cv, ...
        name = base_name(e)
        if not name:
            continue
        if name not in chosen:
            order.append(name)
            chosen[name] = e
        else:
            old = chosen[name]
            old_agg = old.get("aggregate_name") if old.get("run_type") == "aggregate" else None
            if rank[agg] < rank[old_agg]:
                chosen[name] = e
    out = []
    for name in order:
        e = chosen[name]
        # Time of one kernel call: the us_per_call counter where the benchmark
        # reports one (an iteration may time several calls), else real_time.
        us = counter(e, "us_per_call")
        t, unit = num(e.get("real_time")), e.get("time_unit", "ns")
        if us is None and t is not None and unit in TIME_UNIT_US:
            us = t * TIME_UNIT_US[unit]
        gbps = counter(e, "GBps", "GB/s")
        if gbps is None and counter(e, "bytes_per_second") is not None:
            gbps = counter(e, "bytes_per_second") / 1e9
        tflops = counter(e, "TFLOPs", "TFLOP/s", "TFLOPS")
        err = e.get("error_message") if e.get("error_occurred") else None
        label = e.get("label")
        out.append({"name": name, "us": us, "gbps": gbps, "tflops": tflops, "error": err,
                    "label": " ".join(str(label).split()) if label else ""})
    if not out:
        notes.append("kernels: the benchmarks list is empty")
    return out


def best(entries, prefix, key):
    vals = [e[key] for e in entries if e["name"].startswith(prefix) and e[key] is not None]
    return max(vals) if vals else None


def size_of(name):
    """The first numeric argument after the benchmark's own name (adam/1048576 -> 1048576)."""
    for part in name.split("/")[1:]:
        m = re.fullmatch(r"(?:[A-Za-z_]\w*:)?(\d+)", part)
        if m:
            return int(m.group(1))
    return None


# --------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------

def fmt(v, spec, suffix=""):
    return "-" if v is None else format(v, spec) + suffix


def ratio(a, b):
    return a / b if a is not None and b else None


def short_error(e, limit=300):
    e = " ".join(str(e).split())
    return e if len(e) <= limit else e[:limit] + " ..."


def goal_line(text, value_text, ok, missing):
    if ok is None:
        return "%s: n/a (%s)" % (text, missing)
    return "%s: %s %s" % (text, value_text, "PASS" if ok else "MISS")


def render_text(headers, rows, right):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(str(c).rjust(w) if right[i] else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    return "\n".join(out)


def render_md(headers, rows, right):
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out)


# --------------------------------------------------------------------------

def build(args):
    notes = []
    kdoc = load_json(args.kernels, "kernels", notes)
    tdoc = load_json(args.tandem, "tandem", notes)
    pdoc = load_json(args.torch, "torch", notes)
    fdoc = load_json(getattr(args, "feed", None), "feed", notes)
    kernels = read_kernels(kdoc, notes)
    tandem, tandem_other = read_tandem(tdoc, notes)
    torch, torch_other = read_torch(pdoc, notes)
    odoc = load_json(args.torch_other, "torch, tf32 and bf16", notes) \
        if getattr(args, "torch_other", None) else None
    more_fp32, more_other = read_torch(odoc, notes)
    torch_other.update(more_other)
    for key, rec in more_fp32.items():
        torch.setdefault(key, rec)

    copy_gbps = best(kernels, COPY_CEILING, "gbps")
    sgemm_tflops = best(kernels, SGEMM_CEILING, "tflops")
    if kdoc is not None:
        if copy_gbps is None:
            notes.append("kernels: no %s GBps ceiling" % COPY_CEILING)
        if sgemm_tflops is None:
            notes.append("kernels: no %s TFLOPs ceiling" % SGEMM_CEILING)

    devices = []
    for label, doc in (("tandem", tdoc), ("torch", pdoc)):
        if isinstance(doc, dict) and doc.get("device"):
            devices.append("%s on %s" % (label, doc["device"]))
    if isinstance(pdoc, dict) and pdoc.get("torch"):
        devices.append("torch %s" % pdoc["torch"])

    # ---- Table 1: training steps
    impls = ["eager", "compile"]
    if any(i == "eager_fused" for i, _ in torch):
        impls.insert(1, "eager_fused")
    with_graph = any(i == "graph" for i, _ in torch)
    if with_graph:
        impls.append("graph")
    batches = sorted(set(tandem) | {b for _, b in torch})
    short = {"eager": "eager/s", "eager_fused": "fused/s", "compile": "compile/s",
             "graph": "graph/s"}
    modes = any(t.get("mode") for t in tandem.values())
    t1_head = (["batch", "tandem/s"] + (["mode"] if modes else []) + [short[i] for i in impls]
               + ["vs eager", "vs compile"] + (["vs graph"] if with_graph else [])
               + ["floor ms", "tandem ms", "x floor"])
    # "vs eager": against the faster of PyTorch's two eager ways (foreach Adam, fused Adam), so
    # the ratio is not flattered by the slower one. "vs graph": against PyTorch's step captured
    # in a CUDA Graph, like for like with Tandem's graph replays (the goals are set against
    # eager and compile, which launch every kernel from the host).
    t1_right = [h != "mode" for h in t1_head]
    t1_rows, derived, errors = [], {}, []
    flops_note = False
    for b in batches:
        t = tandem.get(b, {})
        t_sps, t_ms = t.get("sps"), t.get("ms")
        if t.get("error"):
            errors.append("tandem batch %d: %s" % (b, t["error"]))
        cells = [format(b, ","), fmt(t_sps, ",.1f")] + ([t.get("mode") or "-"] if modes else [])
        rates = {}
        for i in impls:
            r = torch.get((i, b), {})
            rates[i] = r.get("sps")
            if r.get("error"):
                errors.append("torch %s batch %d: %s" % (i, b, r["error"]))
                cells.append("error" if r.get("sps") is None else fmt(r["sps"], ",.1f"))
            else:
                cells.append(fmt(r.get("sps"), ",.1f"))
        eager_rates = [v for v in (rates.get("eager"), rates.get("eager_fused")) if v is not None]
        r_eager = ratio(t_sps, max(eager_rates) if eager_rates else None)
        r_compile = ratio(t_sps, rates.get("compile"))
        flops = t.get("flops")
        if flops is None and t_sps is not None:
            flops = DEFAULT_FLOPS_PER_SAMPLE * b
            flops_note = True
        floor_ms = flops / (sgemm_tflops * 1e12) * 1e3 if flops and sgemm_tflops else None
        x_floor = ratio(t_ms, floor_ms)
        derived[b] = {"eager": r_eager, "compile": r_compile, "x_floor": x_floor,
                      "tandem": t_sps is not None, "floor_ms": floor_ms}
        cells += [fmt(r_eager, ".2f", "x"), fmt(r_compile, ".2f", "x")]
        if with_graph:
            cells.append(fmt(ratio(t_sps, rates.get("graph")), ".2f", "x"))
        cells += [fmt(floor_ms, ".4f"), fmt(t_ms, ".4f"), fmt(x_floor, ".2f", "x")]
        t1_rows.append(cells)
    if flops_note:
        notes.append("tandem: flops_per_step missing; used %d x batch (784-100-10)"
                     % DEFAULT_FLOPS_PER_SAMPLE)

    # ---- Table 2: kernels
    t2_head = ["kernel", "time us", "GB/s", "% copy", "TFLOP/s", "% sgemm", "label"]
    t2_right = [False, True, True, True, True, True, False]
    t2_rows = []
    for k in kernels:
        if k["name"].startswith("ceiling/"):
            continue
        if k["error"]:
            errors.append("kernel %s: %s" % (k["name"], k["error"]))
        t2_rows.append([k["name"], fmt(k["us"], ",.2f"), fmt(k["gbps"], ",.1f"),
                        fmt(ratio(k["gbps"], copy_gbps) and 100 * ratio(k["gbps"], copy_gbps),
                            ".1f", "%"),
                        fmt(k["tflops"], ".2f"),
                        fmt(ratio(k["tflops"], sgemm_tflops)
                            and 100 * ratio(k["tflops"], sgemm_tflops), ".1f", "%"),
                        k["label"][:40] + ("..." if len(k["label"]) > 40 else "")])
    if kdoc is not None and kernels and not t2_rows:
        notes.append("kernels: only ceilings, no kernel benchmarks")

    # ---- Goals
    goals = []

    def missing_for(b, what):
        d = derived.get(b)
        if d is None or not d["tandem"]:
            return "no tandem result at batch %d" % b
        if what in ("eager", "compile"):
            r = torch.get((what, b))
            if r is None:
                return "no torch %s result at batch %d" % (what, b)
            return "torch %s failed at batch %d" % (what, b)
        if sgemm_tflops is None:
            return "no sgemm ceiling"
        return "no ms/step"

    for impl, (b, need) in (("eager", GOAL_EAGER), ("compile", GOAL_COMPILE)):
        v = derived.get(b, {}).get(impl)
        # Tandem's fastest mode counts (its default, a CUDA Graph when one is captured), and
        # PyTorch's eager and compile launch from the host: the line says which mode it was, and
        # table 1's "vs graph" holds the like-for-like ratio.
        mode = tandem.get(b, {}).get("mode")
        goals.append(goal_line("batch %d tandem%s/%s >= %.1fx" % (
                                   b, " (%s)" % mode if mode else "", impl, need),
                               fmt(v, ".2f", "x"), None if v is None else v >= need,
                               missing_for(b, impl)))
    b, most = GOAL_FLOOR
    v = derived.get(b, {}).get("x_floor")
    goals.append(goal_line("batch %d tandem ms/step <= %.1fx FLOP floor" % (b, most),
                           fmt(v, ".2f", "x"), None if v is None else v <= most,
                           missing_for(b, "floor")))

    adam = [k for k in kernels if "adam" in k["name"].split("/")[0].lower()
            and k["gbps"] is not None]
    if adam:
        top = max(size_of(k["name"]) or 0 for k in adam)
        pick = max((k for k in adam if (size_of(k["name"]) or 0) == top),
                   key=lambda k: k["gbps"])
        share = ratio(pick["gbps"], copy_gbps)
        goals.append(goal_line(
            "adam (%s) GB/s >= %d%% of copy ceiling" % (pick["name"], GOAL_ADAM_SHARE * 100),
            "%.1f%% (%.1f of %s GB/s)" % (100 * share, pick["gbps"], fmt(copy_gbps, ".1f"))
            if share is not None else "",
            None if share is None else share >= GOAL_ADAM_SHARE,
            "no copy ceiling"))
    else:
        goals.append(goal_line("adam GB/s >= %d%% of copy ceiling" % (GOAL_ADAM_SHARE * 100),
                               "", None, "no adam benchmark with GBps"
                               if kdoc is not None else "no kernels file"))

    # ---- Table 3: the chunk manager feeding the GPU (issue 4's figures)
    t3_head = ["batch", "pinned H2D GB/s", "stream->GPU GB/s", "% pinned", "fed samples/s",
               "resident samples/s", "fed/resident"]
    t3_right = [True] * len(t3_head)
    t3_rows = []
    feed = fdoc.get("feed") if isinstance(fdoc, dict) else None
    if fdoc is not None and not isinstance(feed, list):
        notes.append("feed: no 'feed' list (was --store given?)")
        feed = []
    for f in feed or []:
        if not isinstance(f, dict):
            continue
        if f.get("error"):
            notes.append("feed batch %s: failed: %s" % (f.get("batch"), f.get("error")))
            continue
        share = num(f.get("stream_fraction_of_pinned"))
        fed = num(f.get("fed_over_resident"))
        t3_rows.append([fmt(num(f.get("batch")), ",.0f"), fmt(num(f.get("pinned_copy_GBps")), ".1f"),
                        fmt(num(f.get("stream_copy_GBps")), ".1f"),
                        fmt(share and 100 * share, ".0f", "%"),
                        fmt(num(f.get("stream_fed_samples_per_s")), ",.0f"),
                        fmt(num(f.get("resident_samples_per_s")), ",.0f"), fmt(fed, ".2f", "x")])
        b = f.get("batch")
        goals.append(goal_line("feed batch %s: stream->GPU >= 80%% of pinned H2D" % b,
                               fmt(share and 100 * share, ".0f", "%"),
                               None if share is None else share >= 0.8, "no figure"))
        goals.append(goal_line("feed batch %s: samples/s fed by the stream >= 95%% of resident" % b,
                               fmt(fed, ".2f", "x"), None if fed is None else fed >= 0.95,
                               "no figure"))

    # ---- Table 4: a worker group of one GPU against the plain worker (issue 8)
    gdoc = load_json(getattr(args, "group", None), "group", notes)
    t4_head = ["batch", "way", "us/step", "x plain"]
    t4_right = [True, False, True, True]
    t4_rows = []
    for r in (gdoc.get("results") if isinstance(gdoc, dict) else None) or []:
        if isinstance(r, dict) and r.get("error"):
            notes.append("group %s: failed: %s" % (
                r.get("way") or "batch %s" % r.get("batch"), r.get("error")))
        elif isinstance(r, dict):
            t4_rows.append([fmt(num(r.get("batch")), ",.0f"), str(r.get("way", "?")),
                            fmt(num(r.get("us_per_step")), ",.1f"),
                            fmt(num(r.get("ratio_to_plain")), ".2f", "x")])

    # ---- Table 5: search and predict on the GPU and the CPU (issue 7)
    t5_head = ["command", "backend", "x", "figure", "x eval"]
    t5_right = [False, False, True, True, True]
    t5_rows = []
    search_dir = getattr(args, "search_dir", None)
    if search_dir:
        for backend in ("cuda", "cpu"):
            for p in (1, 2):
                doc = load_json(os.path.join(search_dir, "search_%s_p%d.json" % (backend, p)),
                                "search %s x%d" % (backend, p), notes)
                if isinstance(doc, dict):
                    t5_rows.append(["search (%s of %s trials ok)" % (doc.get("succeeded", "?"),
                                                                     doc.get("trials", "?")),
                                    backend, str(p),
                                    # no figure from a search whose trials all failed
                                    fmt(num(doc.get("trials_per_hour")) if doc.get("succeeded")
                                        else None, ",.0f", " trials/h"), ""])
        pred = load_json(os.path.join(search_dir, "predict.json"), "predict", notes)
        entries = [e for e in (pred if isinstance(pred, list) else []) if isinstance(e, dict)]
        # tandem eval of the test split, measured in the same run: each test-split rate against it.
        evals = [num(e.get("samples_per_s")) for e in entries
                 if e.get("command") == "eval" and e.get("split") == "test"]
        eval_rate = evals[0] if evals else None
        for e in entries:
            rate = num(e.get("samples_per_s"))
            t5_rows.append(["%s %s (%s rows)" % (e.get("command", "?"), e.get("split", "?"),
                                                 fmt(num(e.get("rows")), ",.0f")),
                            str(e.get("backend", "?")), str(e.get("processes", "?")),
                            fmt(rate, ",.0f", " samples/s"),
                            fmt(ratio(rate, eval_rate), ".2f", "x")
                            if e.get("split") == "test" else ""])

    ceilings = "ceilings: copy %s GB/s, sgemm fp32 %s TFLOP/s" % (
        fmt(copy_gbps, ",.1f"), fmt(sgemm_tflops, ".2f"))
    others = []
    for k in kernels:
        n = k["name"]
        if n.startswith("ceiling/") and not n.startswith((COPY_CEILING, SGEMM_CEILING)):
            if k["tflops"] is not None:
                others.append("%s %.2f TFLOP/s" % (n[len("ceiling/"):], k["tflops"]))
            elif k["gbps"] is not None:
                others.append("%s %.1f GB/s" % (n[len("ceiling/"):], k["gbps"]))
    if others:
        ceilings += " (also: %s)" % ", ".join(others)
    return {"devices": devices, "ceilings": ceilings, "notes": notes, "errors": errors,
            "goals": goals, "t1": (t1_head, t1_rows, t1_right),
            "t2": (t2_head, t2_rows, t2_right), "t3": (t3_head, t3_rows, t3_right),
            "t4": (t4_head, t4_rows, t4_right), "t5": (t5_head, t5_rows, t5_right),
            "t6": other_precisions_table(tandem_other, torch_other, errors)}


# The optional tables after the data feed: (key, title).
EXTRA_TABLES = (("t4", "Worker group of one GPU against the plain GPU worker (step up to the push)"),
                ("t5", "Search and predict on the GPU and the CPU (x: processes)"),
                ("t6", "Training steps in tf32 and bf16 (no goal): tandem against PyTorch at "
                       "float32 matmul precision high and medium; PyTorch runs both as TF32 "
                       "on CUDA, so the bf16 rows set Tandem's bfloat16 products beside "
                       "PyTorch's TF32 ones"))


def text_report(rep):
    out = ["GPU check summary" + (" (" + "; ".join(rep["devices"]) + ")" if rep["devices"] else ""),
           rep["ceilings"], "",
           "Training steps, fp32: steps/s of tandem and torch eager / eager_fused / compile / "
           "graph (the step captured in a CUDA Graph);",
           "vs = tandem/torch (eager: the faster of eager and fused); "
           "floor = flops_per_step / sgemm rate; x floor = tandem ms / floor ms"]
    head, rows, right = rep["t1"]
    out.append(render_text(head, rows, right) if rows else "  (no step results)")
    out += ["", "Kernels"]
    head, rows, right = rep["t2"]
    out.append(render_text(head, rows, right) if rows else "  (no kernel results)")
    head, rows, right = rep["t3"]
    if rows:
        out += ["", "Data feed: chunk manager -> GPU (uint8 store, uncompressed)",
                render_text(head, rows, right)]
    for key, title in EXTRA_TABLES:
        head, rows, right = rep[key]
        if rows:
            out += ["", title, render_text(head, rows, right)]
    if rep["errors"]:
        out += ["", "Errors:"] + ["  " + short_error(e) for e in rep["errors"]]
    if rep["notes"]:
        out += ["", "Notes (missing, skipped, other precisions):"] + ["  " + n for n in rep["notes"]]
    out += ["", "Goals:"] + ["  " + g for g in rep["goals"]]
    return "\n".join(out)


def md_report(rep):
    out = ["# GPU check summary", ""]
    if rep["devices"]:
        out += ["Run: " + "; ".join(rep["devices"]) + ".", ""]
    out += [rep["ceilings"][0].upper() + rep["ceilings"][1:] + ".", "",
            "## Training steps, fp32", "",
            "Steps/s of tandem and PyTorch (eager, eager with fused Adam, torch.compile, the "
            "eager step captured in a CUDA Graph); "
            "vs = tandem / PyTorch; floor = flops_per_step / the sgemm fp32 ceiling; "
            "x floor = tandem ms/step / floor ms.", ""]
    head, rows, right = rep["t1"]
    out += [render_md(head, rows, right) if rows else "(no step results)", "",
            "## Kernels", ""]
    head, rows, right = rep["t2"]
    out += [render_md(head, rows, right) if rows else "(no kernel results)", ""]
    head, rows, right = rep["t3"]
    if rows:
        out += ["## Data feed: chunk manager -> GPU", "", render_md(head, rows, right), ""]
    for key, title in EXTRA_TABLES:
        head, rows, right = rep[key]
        if rows:
            out += ["## " + title, "", render_md(head, rows, right), ""]
    if rep["errors"]:
        out += ["## Errors", ""] + ["- `%s`" % short_error(e).replace("`", "'")
                                 for e in rep["errors"]] + [""]
    if rep["notes"]:
        out += ["## Notes (missing, skipped, other precisions)", ""] + ["- " + n for n in rep["notes"]] + [""]
    out += ["## Goals", ""] + ["- " + g for g in rep["goals"]]
    return "\n".join(out) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description="Summarize a GPU check run as tables.")
    p.add_argument("--kernels", metavar="PATH", help="kernels_cuda_bench Google Benchmark JSON")
    p.add_argument("--tandem", metavar="PATH", help="tandem's step benchmark JSON")
    p.add_argument("--torch", metavar="PATH", help="bench/torch_gpu_bench.py JSON")
    p.add_argument("--torch-other", metavar="PATH",
                   help="bench/torch_gpu_bench.py --precisions tf32,bf16 JSON")
    p.add_argument("--feed", metavar="PATH", help="tandem_train_step_cuda_bench --store JSON")
    p.add_argument("--group", metavar="PATH", help="tandem_group_step_cuda_bench JSON")
    p.add_argument("--search-dir", metavar="DIR",
                   help="the GPU check's output: search_*_p*.json and predict.json")
    p.add_argument("--markdown", metavar="PATH", help="also write the summary as Markdown")
    args = p.parse_args(argv)

    rep = build(args)
    print(text_report(rep), flush=True)
    if args.markdown:
        try:
            parent = os.path.dirname(os.path.abspath(args.markdown))
            os.makedirs(parent, exist_ok=True)
            with open(args.markdown, "w") as f:
                f.write(md_report(rep))
        except OSError as e:
            print("gpu_table: could not write %s: %s" % (args.markdown, e), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
