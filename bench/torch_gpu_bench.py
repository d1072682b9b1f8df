#!/usr/bin/env python3
"""PyTorch GPU baseline for Tandem's whole training steps (data resident on the GPU).

What it measures
----------------
Steps per second of the seed's model trained in plain PyTorch, side by side
with Tandem's own GPU step benchmark (bench/gpu_table.py puts the two
together):

  * MLP --layers (default 784,100,10): Linear + bias + ReLU for every hidden
    layer, Linear + bias for the last; weights truncated normal with stddev
    1/sqrt(fan_in) (redrawn beyond 2 stddev), zero biases.
  * loss: softmax cross-entropy summed over the batch,
    F.cross_entropy(logits, labels, reduction="sum").
  * torch.optim.Adam(lr=0.01, betas=(0.9, 0.999), eps=1e-8).
  * float32 everywhere, TF32 off (allow_tf32 = False for cuBLAS and cuDNN,
    set_float32_matmul_precision("highest")).  --precisions adds tf32 and
    bf16, Tandem's other two: float32 tensors whose matrix products may round
    their operands on the tensor cores, PyTorch's float32 matmul precisions
    "high" (TF32) and "medium"; parameters, gradients and Adam stay float32 in
    both.  PyTorch has no bfloat16-product mode for float32 tensors on CUDA:
    its cuBLAS path turns "medium" into TF32, as "high" (bfloat16 inside is
    the CPU's oneDNN path only).  So the bf16 runs measure PyTorch in TF32,
    and a table that sets Tandem's bf16 steps beside them compares bfloat16
    products with TF32 ones; autocast would instead make the activations
    bfloat16, another workload.
  * data: a random uint8 data set of 60,000 x layers[0] pixels and int64
    labels, generated on the device with a fixed torch.Generator seed and
    kept there as uint8.  A random permutation of the rows is drawn once;
    batch B takes the slices perm[0:B], perm[B:2B], ... in turn (wrapping),
    so every step gathers its rows with index_select.

One step = gather (index_select) + x.float() * (1/255) + forward + loss +
backward + optimizer.step() + zero_grad(set_to_none=True).

Implementations (--impls, comma list):

  eager        plain eager PyTorch, Adam's default implementation (foreach).
  eager_fused  the same with Adam(fused=True).
  compile      torch.compile (default mode, dynamic=False) of the gather +
               forward + loss (its backward is compiled by AOTAutograd when
               loss.backward() runs), plus opt.step() wrapped in
               torch.compile as the PyTorch optimizer tutorial shows.
               Compilation happens during warm-up.  A failure is caught, its
               text recorded in the JSON, and the other impls still run.
               (The default mode launches every kernel from the host: no
               CUDA Graphs, unlike Tandem's graph replays.)
  graph        the eager step (Adam with capturable=True) captured whole in
               a CUDA Graph per batch size, as PyTorch's "whole network
               capture" recipe does (three warm-up steps on a side stream,
               then torch.cuda.graph), and replayed with the batch's row
               indices copied into the captured index tensor: the
               like-for-like comparison with Tandem's CUDA Graph steps.
               CUDA only.

Timing: per (impl, batch), --warmup-steps steps (compilation included), a
short calibration run, then --repeats (3) timed loops of N steps, N chosen
so that one loop lasts about --seconds.  On CUDA the loop is timed with
torch.cuda.Event pairs after a synchronize, with no host sync inside the
loop; the median loop gives steps/s and ms/step.  Peak memory is
torch.cuda.max_memory_allocated() since the start of that (impl, batch).

Output: one compact line per result on stdout as it goes, and with --json
PATH (rewritten after every result, so a run cut short keeps what it had):

  {"device": "NVIDIA H200", "torch": "2.x", ...,
   "results": [{"impl": "eager"|"eager_fused"|"compile", "batch": B,
                "precision": "fp32"|"tf32"|"bf16", "matmul_precision":
                "highest"|"high"|"medium", "steps_per_s": ..., "ms_per_step": ...,
                "repeats_ms": [ms per step of each repeat], "steps": N,
                "peak_mem_bytes": ..., "flops_per_step": ...,
                "warmup_s": ..., "error": "..." (only on failure)}]}

Without a CUDA device it prints so and exits 0, writing
{"device": null, "results": [], "skipped": "no CUDA device"} to --json;
only an explicit --device cpu runs the same code on the CPU (for testing).

How to run (bench/gpu_check.sh calls it like this):

  python3 bench/torch_gpu_bench.py --batches 1000,10000,60000 --seconds 2 \\
      --json /tmp/torch_gpu.json
  # CPU smoke test:
  python3 bench/torch_gpu_bench.py --device cpu --batches 64,128 \\
      --seconds 0.2 --warmup-steps 2 --impls eager --json /tmp/t.json

Only torch and the Python standard library are used.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_args import positive_int_list  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ROWS = 60000
LEARNING_RATE = 0.01
BETAS = (0.9, 0.999)
EPS = 1e-8
KNOWN_IMPLS = ("eager", "eager_fused", "compile", "graph")
# Tandem's --precision names -> torch.set_float32_matmul_precision's ("medium" runs as TF32 on
# CUDA: see the docstring).
MATMUL_PRECISION = {"fp32": "highest", "tf32": "high", "bf16": "medium"}


def impl_list(text):
    impls = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in impls if v not in KNOWN_IMPLS]
    if not impls or bad:
        raise argparse.ArgumentTypeError(
            "'%s': expected a comma list of %s" % (text, ", ".join(KNOWN_IMPLS)))
    return impls


def precision_list(text):
    values = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in values if v not in MATMUL_PRECISION]
    if not values or bad or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(
            "'%s': expected a comma list of distinct %s" % (text, ", ".join(MATMUL_PRECISION)))
    return values


def layer_list(text):
    values = positive_int_list(text)
    if len(values) < 2:
        raise argparse.ArgumentTypeError("'%s': need at least input,output" % text)
    return values


def flops_per_step(layers, batch):
    """Multiply-add = 2 FLOPs: forward, weight gradients, input gradients of
    every layer but the first (784-100-10: 319,600 per sample)."""
    mac = [a * b for a, b in zip(layers[:-1], layers[1:])]
    return 2 * batch * (2 * sum(mac) + sum(mac[1:]))


def set_precision(precision):
    """fp32: strict, no TF32 anywhere; tf32 and bf16: the float32 matmul
    precision that lets products round their operands (MATMUL_PRECISION).
    Only the legacy switches are used; mixing them with the newer
    fp32_precision attributes makes recent PyTorch raise when inductor reads
    the setting back."""
    strict = precision == "fp32"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.backends.cuda.matmul.allow_tf32 = not strict
        torch.backends.cudnn.allow_tf32 = not strict
        if hasattr(torch, "set_float32_matmul_precision"):
            torch.set_float32_matmul_precision(MATMUL_PRECISION[precision])
        elif precision == "bf16":
            raise RuntimeError("torch %s has no set_float32_matmul_precision: no bf16 matmuls "
                               "for float32 tensors" % torch.__version__)


def precision_state():
    state = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for key, get in (("cuda_matmul_allow_tf32",
                          lambda: torch.backends.cuda.matmul.allow_tf32),
                         ("cudnn_allow_tf32", lambda: torch.backends.cudnn.allow_tf32),
                         ("float32_matmul_precision",
                          lambda: torch.get_float32_matmul_precision())):
            try:
                state[key] = get()
            except Exception as e:  # noqa: BLE001 - report, never fail on this
                state[key] = "unreadable: %s" % e
    return state


def allow_more_recompiles():
    """dynamic=False recompiles once per batch size; keep the limit clear of that."""
    try:
        import torch._dynamo as dynamo
    except Exception:  # noqa: BLE001
        return
    for name in ("recompile_limit", "cache_size_limit"):
        try:
            if hasattr(dynamo.config, name):
                setattr(dynamo.config, name, max(64, getattr(dynamo.config, name)))
        except Exception:  # noqa: BLE001
            pass


def reset_dynamo():
    try:
        import torch._dynamo as dynamo
        dynamo.reset()
    except Exception:  # noqa: BLE001
        pass


def error_text(exc):
    """Exception type and message, plus where it was raised, kept short."""
    msg = "%s: %s" % (type(exc).__name__, str(exc).strip())
    if len(msg) > 2000:
        msg = msg[:2000] + " ...[truncated]"
    tb = traceback.extract_tb(exc.__traceback__)
    if tb:
        last = tb[-1]
        msg += " (at %s:%d)" % (os.path.basename(last.filename), last.lineno)
    return msg


# --------------------------------------------------------------------------
# Model, data, step
# --------------------------------------------------------------------------

def make_model(layers, device):
    mods = []
    for i, (fan_in, fan_out) in enumerate(zip(layers[:-1], layers[1:])):
        lin = torch.nn.Linear(fan_in, fan_out, device=device, dtype=torch.float32)
        std = 1.0 / math.sqrt(fan_in)
        with torch.no_grad():
            torch.nn.init.trunc_normal_(lin.weight, mean=0.0, std=std,
                                        a=-2.0 * std, b=2.0 * std)
            lin.bias.zero_()
        mods.append(lin)
        if i < len(layers) - 2:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods)


def make_data(layers, device, seed):
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    images = torch.randint(0, 256, (ROWS, layers[0]), dtype=torch.uint8,
                           generator=g, device=device)
    labels = torch.randint(0, layers[-1], (ROWS,), dtype=torch.int64,
                           generator=g, device=device)
    perm = torch.randperm(ROWS, generator=g, device=device)
    return images, labels, perm


def loss_fn(model, images, labels, idx):
    x = images.index_select(0, idx).float() * (1.0 / 255.0)
    y = labels.index_select(0, idx)
    logits = model(x)
    # Equals the seed's -sum(onehot(y) * log(clip(softmax(z), 1e-10, 1))) except
    # where the true class has p < 1e-10 (there the clipped form caps the term at
    # -log(1e-10) = 23.03); this is how a PyTorch user writes it.
    return F.cross_entropy(logits, y, reduction="sum")


class Trainer:
    """One implementation: model + optimizer + a step(idx) that enqueues one
    whole training step and does not synchronize with the host."""

    def __init__(self, impl, layers, device, images, labels):
        self.impl = impl
        self.model = make_model(layers, device)
        params = list(self.model.parameters())
        self.images, self.labels, self.graphs = images, labels, {}
        if impl == "eager_fused":
            self.opt = torch.optim.Adam(params, lr=LEARNING_RATE, betas=BETAS,
                                        eps=EPS, fused=True)
        elif impl == "graph":
            if device.type != "cuda":
                raise RuntimeError("graph needs a CUDA device (torch.cuda.graph)")
            # capturable: the step count stays on the device, so a replay steps it.
            self.opt = torch.optim.Adam(params, lr=LEARNING_RATE, betas=BETAS, eps=EPS,
                                        capturable=True)
        else:
            # Default implementation (foreach on CUDA).
            self.opt = torch.optim.Adam(params, lr=LEARNING_RATE, betas=BETAS, eps=EPS)
        model, opt = self.model, self.opt

        if impl == "compile":
            if not hasattr(torch, "compile"):
                raise RuntimeError("torch.compile is not available in torch %s"
                                   % torch.__version__)

            # Dynamo graph-breaks at loss.backward(), so the compiled region is
            # the gather + forward + loss; AOTAutograd compiles its backward.
            def fwd_loss(idx):
                return loss_fn(model, images, labels, idx)

            self.fwd_loss = torch.compile(fwd_loss, dynamic=False)

            @torch.compile(fullgraph=False)
            def opt_step():
                opt.step()

            self.opt_step = opt_step
        else:
            self.fwd_loss = lambda idx: loss_fn(model, images, labels, idx)
            self.opt_step = opt.step

    def step(self, idx):
        if self.impl == "graph":
            self.graph_step(idx)
            return
        loss = self.fwd_loss(idx)
        loss.backward()
        self.opt_step()
        self.opt.zero_grad(set_to_none=True)

    def graph_step(self, idx):
        entry = self.graphs.get(idx.numel())
        if entry is None:
            entry = self.graphs[idx.numel()] = self.capture(idx)
        graph, static_idx = entry
        static_idx.copy_(idx)
        graph.replay()

    def capture(self, idx):
        """PyTorch's whole-network capture: warm up on a side stream, then
        capture forward, backward and Adam's step.  The gradients are
        allocated inside the capture (set_to_none before it), so each replay
        writes them afresh."""
        static_idx = idx.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.opt.zero_grad(set_to_none=True)
                loss_fn(self.model, self.images, self.labels, static_idx).backward()
                self.opt.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        self.opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            loss_fn(self.model, self.images, self.labels, static_idx).backward()
            self.opt.step()
        return graph, static_idx


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------

def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_loop(trainer, slices, start_i, n, device):
    """Seconds for n steps (device time between events on CUDA)."""
    k = len(slices)
    step = trainer.step
    sync(device)
    if device.type == "cuda":
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record()
        for i in range(start_i, start_i + n):
            step(slices[i % k])
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    for i in range(start_i, start_i + n):
        step(slices[i % k])
    return time.perf_counter() - t0


def measure(trainer, batch, perm, args, device):
    slices = [perm[off:off + batch] for off in range(0, ROWS - batch + 1, batch)]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    t0 = time.perf_counter()
    for i in range(args.warmup_steps):
        trainer.step(slices[i % len(slices)])
    sync(device)
    warmup_s = time.perf_counter() - t0
    pos = args.warmup_steps

    # Calibrate: grow the run until it lasts a tenth of the target (or 0.05 s).
    n = 3
    target = max(0.05, 0.1 * args.seconds)
    while True:
        elapsed = timed_loop(trainer, slices, pos, n, device)
        pos += n
        if elapsed >= target or n >= 1 << 20:
            break
        n *= 4 if elapsed < target / 4 else 2
    per_step = max(elapsed / n, 1e-9)
    steps = max(1, int(round(args.seconds / per_step)))

    repeats = []
    for _ in range(args.repeats):
        elapsed = timed_loop(trainer, slices, pos, steps, device)
        pos += steps
        repeats.append(elapsed / steps)
    med = statistics.median(repeats)
    rec = {
        "steps_per_s": 1.0 / med,
        "ms_per_step": med * 1e3,
        "repeats_ms": [r * 1e3 for r in repeats],
        "steps": steps,
        "warmup_s": warmup_s,
    }
    if device.type == "cuda":
        rec["peak_mem_bytes"] = int(torch.cuda.max_memory_allocated(device))
    return rec


# --------------------------------------------------------------------------

def write_json(path, doc):
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def print_result(r):
    if r.get("error"):
        err = " ".join(str(r["error"]).split())
        if len(err) > 300:
            err = err[:300] + " ..."
        print("torch %-11s %s batch %6d: ERROR %s" % (r["impl"], r["precision"], r["batch"], err),
              flush=True)
        return
    mem = r.get("peak_mem_bytes")
    print("torch %-11s %s batch %6d: %10.1f steps/s %9.4f ms/step  repeats %s ms  "
          "N=%d warmup %.1fs%s"
          % (r["impl"], r["precision"], r["batch"], r["steps_per_s"], r["ms_per_step"],
             ",".join("%.4f" % v for v in r["repeats_ms"]), r["steps"],
             r["warmup_s"],
             "" if mem is None else "  peak %.0f MiB" % (mem / 2**20)),
          flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(
        description="PyTorch baseline: whole MLP training steps with data on the GPU.")
    p.add_argument("--batches", type=positive_int_list, default=[1000, 10000, 60000],
                   help="comma-separated batch sizes (default 1000,10000,60000)")
    p.add_argument("--seconds", type=float, default=2.0,
                   help="target seconds of one timed loop (default 2)")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed loops per (impl, batch); the median is reported (default 3)")
    p.add_argument("--warmup-steps", type=int, default=20,
                   help="untimed steps first, compilation included (default 20)")
    p.add_argument("--json", metavar="PATH", help="write the results here")
    p.add_argument("--impls", type=impl_list, default=["eager", "compile"],
                   help="comma list of %s (default eager,compile)" % ",".join(KNOWN_IMPLS))
    p.add_argument("--precisions", type=precision_list, default=["fp32"],
                   help="comma list of fp32, tf32, bf16 (default fp32): every impl runs in "
                        "each, in turn")
    p.add_argument("--device", default=None,
                   help="torch device (default cuda; cpu only when given explicitly)")
    p.add_argument("--layers", type=layer_list, default=[784, 100, 10],
                   help="layer widths (default 784,100,10)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.seconds <= 0:
        p.error("--seconds must be positive")
    if args.repeats <= 0:
        p.error("--repeats must be positive")
    if args.warmup_steps < 0:
        p.error("--warmup-steps must be >= 0")

    try:
        device = torch.device(args.device or "cuda")
    except (RuntimeError, ValueError) as e:
        p.error("--device: %s" % e)

    if device.type == "cuda" and not torch.cuda.is_available():
        print("torch_gpu_bench: no CUDA device available (torch %s, built with CUDA %s); "
              "skipping.  Pass --device cpu to run the same steps on the CPU."
              % (torch.__version__, torch.version.cuda), flush=True)
        write_json(args.json, {"device": None, "torch": torch.__version__,
                               "results": [], "skipped": "no CUDA device"})
        return 0
    torch.manual_seed(args.seed)
    set_precision("fp32")
    if "compile" in args.impls:
        allow_more_recompiles()

    if device.type == "cuda":
        if device.index is not None:
            torch.cuda.set_device(device)
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = "cpu"
    images, labels, perm = make_data(args.layers, device, args.seed)
    sync(device)

    doc = {
        "device": device_name,
        "device_type": device.type,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "layers": args.layers,
        "rows": ROWS,
        "seconds": args.seconds,
        "warmup_steps": args.warmup_steps,
        "repeats": args.repeats,
        "precision_settings": precision_state(),
        "results": [],
    }
    print("torch_gpu_bench: %s, torch %s, layers %s, impls %s, precisions %s, batches %s"
          % (device_name, torch.__version__, ",".join(map(str, args.layers)),
             ",".join(args.impls), ",".join(args.precisions), ",".join(map(str, args.batches))),
          flush=True)
    write_json(args.json, doc)

    for precision in args.precisions:
        try:
            set_precision(precision)
        except Exception as e:  # noqa: BLE001 - that precision's results say why
            for impl in args.impls:
                for batch in args.batches:
                    rec = {"impl": impl, "batch": batch, "precision": precision,
                           "steps_per_s": None, "ms_per_step": None, "repeats_ms": [],
                           "error": error_text(e)}
                    doc["results"].append(rec)
                    print_result(rec)
            write_json(args.json, doc)
            continue
        doc.setdefault("precision_settings_by_precision", {})[precision] = precision_state()
        run_impls(args, device, images, labels, perm, precision, doc)
    set_precision("fp32")
    return 0


def run_impls(args, device, images, labels, perm, precision, doc):
    """Every impl at every batch in one precision, appending to doc's results."""
    for impl in args.impls:
        trainer, build_error, compile_error = None, None, None
        try:
            trainer = Trainer(impl, args.layers, device, images, labels)
        except Exception as e:  # noqa: BLE001
            build_error = error_text(e)
        for batch in args.batches:
            base = {"impl": impl, "batch": batch, "precision": precision,
                    "matmul_precision": MATMUL_PRECISION[precision],
                    "flops_per_step": flops_per_step(args.layers, batch)}
            if batch > ROWS:
                rec = dict(base, steps_per_s=None, ms_per_step=None, repeats_ms=[],
                           error="batch %d larger than the data set (%d rows)"
                           % (batch, ROWS))
            elif build_error or compile_error:
                rec = dict(base, steps_per_s=None, ms_per_step=None, repeats_ms=[],
                           error=build_error or compile_error)
            else:
                try:
                    rec = dict(base, **measure(trainer, batch, perm, args, device))
                except Exception as e:  # noqa: BLE001
                    rec = dict(base, steps_per_s=None, ms_per_step=None,
                               repeats_ms=[], error=error_text(e))
                    if impl == "compile" and "out of memory" not in rec["error"].lower():
                        # Do not spend the session recompiling into the same failure.
                        compile_error = "not run: compile failed at batch %d: %s" % (
                            batch, rec["error"])
                    if trainer is not None and trainer.opt is not None:
                        trainer.opt.zero_grad(set_to_none=True)
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
            doc["results"].append(rec)
            print_result(rec)
            write_json(args.json, doc)
        del trainer
        if impl == "compile":
            reset_dynamo()
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
