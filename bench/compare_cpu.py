#!/usr/bin/python3
"""Compare Tandem's CPU training/inference throughput against PyTorch.

What it measures
----------------
In one invocation, for --rounds rounds (default 2), it runs as child
processes, alternating between them:

  1. the Tandem benchmark binary (--tandem-bench, default
     build/bench/tandem_train_bench under the repository root), with
     --threads 2 and --threads 1 (each a separate process):
         TANDEM_BENCH --batch B1,B2,B3 --seconds S --threads T --json
     which prints JSON lines
         {"impl": "tandem", "mode": "train"|"infer", "batch": B,
          "samples_per_s": ..., "steps": ..., "seconds": ...}
     and sgemm rates at the model's shapes
         {"impl": "openblas", "mode": "sgemm", "shape": "...", "gflops": ...}
  2. bench/torch_reference.py with --threads 2 and --threads 1 (each a
     separate process, with OMP_WAIT_POLICY=passive so PyTorch's OpenMP
     workers do not spin and starve OpenBLAS), run by --python
     (default /usr/bin/python3, Debian's python3-torch).  Both sides use
     Debian's OpenBLAS: unless OPENBLAS_CORETYPE is set already, PyTorch
     runs with OPENBLAS_CORETYPE set to the kernels Tandem's benchmark
     reports (it switches them where OpenBLAS's own choice is older than
     the CPU: engine/src/blas_kernels.h), so both run the same kernels.

The order within a round is tandem, tandem, torch, torch; each side's two
thread settings swap places every other round.  Each configuration keeps
the best of its rounds.  Each side is credited with its faster thread
setting per (mode, batch); every setting is shown.  Timings suffer on a
machine whose cores are busy with something else: the load average at the
start is printed, and a warning when it is above half the cores.

It then prints, per (mode, batch): Tandem samples/s, PyTorch best samples/s
(and its thread setting), the ratio, the goal, PASS/MISS, and the
sgemm-bound floor:

  step FLOPs per sample: train 319,600, infer 158,800
  floor samples/s = best sgemm GFLOP/s reported * 1e9 / FLOPs per sample

with Tandem's fraction of that floor.  Goals (Tandem / best PyTorch):
train >= 2.5x at batch 100, >= 1.25x at 1000, >= 1.2x at 10000;
infer >= 1.1x at 10000.

It reports, it does not gate: the exit status is 0 even if a goal is
missed, but non-zero (1) if a child fails, times out, or does not report
every expected measurement.  --json-out FILE writes the machine, command
lines, every raw measurement and the table as JSON.

How to run (from the repository root, after building the benchmark):

  /usr/bin/python3 bench/compare_cpu.py --batch 100,1000,10000 --seconds 3 \
      --rounds 2 --json-out bench/results/DATE-cpu-compare.json

Only the Python standard library is used here; torch is imported only by
the torch_reference.py children.
"""

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time

from bench_args import positive_int_list

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
DEFAULT_TANDEM_BENCH = os.path.join(REPO_ROOT, "build", "bench",
                                    "tandem_train_bench")
DEFAULT_TORCH_SCRIPT = os.path.join(HERE, "torch_reference.py")

# FLOPs per sample of one step (multiply-add = 2 FLOPs):
#   forward  2*(784*100 + 100*10)                      = 158,800
#   backward dW_hid 2*784*100 + dW_sm 2*100*10 + dH 2*100*10 = 160,800
FLOPS_PER_SAMPLE = {"train": 319600, "infer": 158800}

# (mode, batch) -> required Tandem / best-PyTorch ratio.
GOALS = {
    ("train", 100): 2.5,
    ("train", 1000): 1.25,
    ("train", 10000): 1.2,
    ("infer", 10000): 1.1,
}

MODES = ("train", "infer")


class ChildError(RuntimeError):
    pass


# --------------------------------------------------------------------------
# Machine description
# --------------------------------------------------------------------------

def _command_output(cmd):
    try:
        return subprocess.run(cmd, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""


def machine_info():
    model = ""
    for line in _command_output(["lscpu"]).splitlines():
        if line.startswith("Model name:"):
            model = line.split(":", 1)[1].strip()
            break
    if not model:
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        model = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
    nproc = _command_output(["nproc"]).strip()
    try:
        load = " ".join("%.2f" % x for x in os.getloadavg())
    except OSError:
        load = ""
    return {
        "cpu_model": model or "unknown",
        "nproc": int(nproc) if nproc.isdigit() else os.cpu_count(),
        "kernel": platform.release(),
        "loadavg_at_start": load,
    }


# --------------------------------------------------------------------------
# Children
# --------------------------------------------------------------------------

def run_child(name, cmd, env_overrides, timeout, runs):
    """Run one child, append its run info to `runs`, return its records.

    Raises ChildError if it cannot be started, times out, prints a
    malformed JSON line or exits with a non-zero status.
    """
    env = dict(os.environ)
    env.update(env_overrides)
    shown = " ".join("%s=%s" % kv for kv in sorted(env_overrides.items()))
    shown = (shown + " " if shown else "") + shlex.join(cmd)
    print("  running %s: %s" % (name, shown), file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE,
                              stderr=None, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ChildError("%s timed out after %d s: %s" % (name, timeout, shown))
    except OSError as e:
        raise ChildError("%s could not be started: %s (%s)" % (name, e, shown))
    wall = time.perf_counter() - start

    records, other = [], []
    for line in proc.stdout.splitlines():
        text = line.strip()
        if not text.startswith("{"):
            if text:
                other.append(line)
                print("  [%s] %s" % (name, line), file=sys.stderr)
            continue
        try:
            records.append(json.loads(text))
        except json.JSONDecodeError as e:
            raise ChildError("%s printed a malformed JSON line (%s): %r"
                             % (name, e, line))
    runs.append({"name": name, "command": shown, "rc": proc.returncode,
                 "wall_s": wall, "records": records, "other_stdout": other})
    if proc.returncode != 0:
        raise ChildError("%s exited with status %d: %s"
                         % (name, proc.returncode, shown))
    return records


def check_records(name, records, impl, batches):
    """Every (mode, batch) must be reported exactly with a positive rate."""
    seen = set()
    for r in records:
        if r.get("impl") != impl or r.get("mode") not in MODES:
            continue
        rate = r.get("samples_per_s")
        if not isinstance(rate, (int, float)) or not rate > 0:
            raise ChildError("%s reported a bad samples_per_s: %r" % (name, r))
        seen.add((r["mode"], r.get("batch")))
    missing = [(m, b) for m in MODES for b in batches if (m, b) not in seen]
    if missing:
        raise ChildError("%s did not report %s"
                         % (name, ", ".join("%s@%d" % mb for mb in missing)))


# --------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------

def best_rates(records):
    """(impl, mode, batch, threads) -> best samples/s over all rounds."""
    best = {}
    for r in records:
        if r.get("mode") not in MODES:
            continue
        key = (r["impl"], r["mode"], r["batch"], r.get("threads"))
        best[key] = max(best.get(key, 0.0), float(r["samples_per_s"]))
    return best


def best_sgemm(records):
    """shape -> best GFLOP/s over all rounds."""
    best = {}
    for r in records:
        if r.get("impl") == "openblas" and r.get("mode") == "sgemm":
            g = r.get("gflops")
            if isinstance(g, (int, float)) and g > 0:
                shape = str(r.get("shape", "?"))
                best[shape] = max(best.get(shape, 0.0), float(g))
    return best


def best_sgemm_by_threads(records):
    """threads -> best GFLOP/s over shapes and rounds: the floor of a Tandem
    run on that many threads (its sgemm calls run that many side by side)."""
    best = {}
    for r in records:
        g = r.get("gflops")
        if (r.get("impl") == "openblas" and r.get("mode") == "sgemm"
                and isinstance(g, (int, float)) and g > 0):
            t = r.get("threads")
            best[t] = max(best.get(t, 0.0), float(g))
    return best

def best_of_settings(best, impl, mode, batch, threads):
    """({threads: samples/s}, the fastest setting, its samples/s).  A binary
    that reports no thread count (an older one) gives its rate unattributed."""
    per_thread = {t: best.get((impl, mode, batch, t)) for t in threads}
    avail = {t: v for t, v in per_thread.items() if v}
    if not avail and best.get((impl, mode, batch, None)):
        print("note: %s reported no thread count; its rate is shown unattributed" % impl,
              file=sys.stderr)
        return per_thread, None, best[(impl, mode, batch, None)]
    fastest = max(avail, key=avail.get) if avail else None
    return per_thread, fastest, (avail[fastest] if avail else None)


def build_table(batches, tandem_threads, torch_threads, best, sgemm,
                sgemm_by_threads):
    top_shape = max(sgemm, key=sgemm.get) if sgemm else None
    top_gflops = sgemm[top_shape] if top_shape else None
    rows = []
    for mode in MODES:
        for b in batches:
            td_per_thread, td_threads, tandem = best_of_settings(
                best, "tandem", mode, b, tandem_threads)
            per_thread, pt_threads, pt_best = best_of_settings(
                best, "pytorch", mode, b, torch_threads)
            ratio = tandem / pt_best if tandem and pt_best else None
            goal = GOALS.get((mode, b))
            if goal is None:
                result = "-"
            elif ratio is None:
                result = "n/a"
            else:
                result = "PASS" if ratio >= goal else "MISS"
            # The floor of the thread setting Tandem is credited with.
            floor_gflops = sgemm_by_threads.get(td_threads, top_gflops)
            floor = (floor_gflops * 1e9 / FLOPS_PER_SAMPLE[mode]
                     if floor_gflops else None)
            rows.append({
                "mode": mode,
                "batch": b,
                "tandem_samples_per_s": tandem,
                "tandem_best_threads": td_threads,
                "tandem_samples_per_s_by_threads":
                    {str(t): v for t, v in td_per_thread.items()},
                "pytorch_best_samples_per_s": pt_best,
                "pytorch_best_threads": pt_threads,
                "pytorch_samples_per_s_by_threads":
                    {str(t): v for t, v in per_thread.items()},
                "ratio": ratio,
                "goal": goal,
                "result": result,
                "flops_per_sample": FLOPS_PER_SAMPLE[mode],
                "sgemm_floor_samples_per_s": floor,
                "tandem_fraction_of_floor":
                    tandem / floor if tandem and floor else None,
            })
    return rows, top_shape, top_gflops


def _num(v, fmt="%.0f"):
    return fmt % v if v is not None else "n/a"


def print_table(rows, tandem_threads, torch_threads, top_shape, top_gflops,
                sgemm):
    td_cols = ["td t=%d/s" % t for t in tandem_threads]
    pt_cols = ["pt t=%d/s" % t for t in torch_threads]
    head = (["mode", "batch", "tandem best/s", "thr"] + td_cols
            + ["pytorch best/s", "thr"] + pt_cols
            + ["ratio", "goal", "result", "floor/s", "of floor"])
    lines = [head]
    for r in rows:
        td_by = r["tandem_samples_per_s_by_threads"]
        by = r["pytorch_samples_per_s_by_threads"]
        lines.append(
            [r["mode"], str(r["batch"]), _num(r["tandem_samples_per_s"]),
             str(r["tandem_best_threads"] or "-")]
            + [_num(td_by.get(str(t))) for t in tandem_threads]
            + [_num(r["pytorch_best_samples_per_s"]),
               str(r["pytorch_best_threads"] or "-")]
            + [_num(by.get(str(t))) for t in torch_threads]
            + [_num(r["ratio"], "%.2fx"),
               ">=%.2fx" % r["goal"] if r["goal"] else "-",
               r["result"],
               _num(r["sgemm_floor_samples_per_s"]),
               _num(r["tandem_fraction_of_floor"] and
                    100 * r["tandem_fraction_of_floor"], "%.1f%%")])
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    for i, row in enumerate(lines):
        print("  ".join(c.rjust(w) if j > 0 else c.ljust(w)
                        for j, (c, w) in enumerate(zip(row, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print()
    if sgemm:
        print("sgemm (OpenBLAS, best of rounds):")
        for shape in sorted(sgemm):
            print("  %-24s %8.2f GFLOP/s" % (shape, sgemm[shape]))
        print("floor = the best sgemm GFLOP/s at Tandem's credited thread count "
              "(that many calls side by side) * 1e9 / FLOPs per sample "
              "(train %d, infer %d); best overall %.2f GFLOP/s (%s)"
              % (FLOPS_PER_SAMPLE["train"], FLOPS_PER_SAMPLE["infer"], top_gflops,
                 top_shape))
    else:
        print("sgemm: the Tandem benchmark reported no sgemm rates; "
              "no floor computed")


# --------------------------------------------------------------------------





def main(argv=None):
    p = argparse.ArgumentParser(
        description="Compare Tandem's CPU MLP throughput against PyTorch.")
    p.add_argument("--tandem-bench", default=DEFAULT_TANDEM_BENCH,
                   help="Tandem benchmark binary (default: %(default)s)")
    p.add_argument("--batch", type=positive_int_list, default=[100, 1000, 10000],
                   help="comma-separated batch sizes (default 100,1000,10000)")
    p.add_argument("--seconds", type=float, default=3.0,
                   help="timed seconds per (mode, batch) in each child "
                        "(default 3)")
    p.add_argument("--rounds", type=int, default=2,
                   help="alternating rounds; best of rounds is kept "
                        "(default 2)")
    p.add_argument("--torch-threads", type=positive_int_list, default=[2, 1],
                   help="torch.set_num_threads settings to try (default 2,1)")
    p.add_argument("--tandem-threads", type=positive_int_list, default=[2, 1],
                   help="Tandem --threads settings to try (default 2,1)")
    p.add_argument("--python", default="/usr/bin/python3",
                   help="interpreter for torch_reference.py "
                        "(default %(default)s)")
    p.add_argument("--torch-script", default=DEFAULT_TORCH_SCRIPT,
                   help=argparse.SUPPRESS)
    p.add_argument("--child-timeout", type=float, default=None,
                   help="seconds before a child is considered hung "
                        "(default: generous, from --seconds and --batch)")
    p.add_argument("--json-out", metavar="FILE",
                   help="write all measurements and the table as JSON")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.seconds <= 0:
        p.error("--seconds must be positive")
    if not (os.path.isfile(args.tandem_bench)
            and os.access(args.tandem_bench, os.X_OK)):
        p.error("Tandem benchmark %r is not an executable file (build it, "
                "or pass --tandem-bench)" % args.tandem_bench)
    timeout = args.child_timeout or (
        120 + 4 * len(MODES) * len(args.batch) * (args.seconds + 2))

    command = shlex.join([sys.executable] + sys.argv) if argv is None \
        else shlex.join([sys.executable, sys.argv[0]] + list(argv))
    machine = machine_info()
    print("Tandem vs PyTorch, CPU MLP 784-100-10 throughput")
    print("machine: %s, nproc %s, kernel %s, load %s"
          % (machine["cpu_model"], machine["nproc"], machine["kernel"],
             machine["loadavg_at_start"]))
    print("command: %s" % command)
    load_warning = None
    try:
        load1 = float(str(machine["loadavg_at_start"]).split()[0])
        if load1 > 0.5 * int(machine["nproc"]):
            load_warning = ("load average %.2f on %s cores at the start: other "
                            "work holds the cores, and every timing suffers; "
                            "rerun on a quiet machine"
                            % (load1, machine["nproc"]))
            print("warning: " + load_warning)
    except (ValueError, KeyError, IndexError):
        pass
    print(flush=True)

    batch_arg = ",".join(str(b) for b in args.batch)
    seconds_arg = "%g" % args.seconds
    def tandem_cmd(threads):
        return [args.tandem_bench, "--batch", batch_arg, "--seconds", seconds_arg,
                "--threads", str(threads), "--json"]

    def torch_cmd(threads):
        return [args.python, args.torch_script, "--batch", batch_arg,
                "--seconds", seconds_arg, "--threads", str(threads),
                "--mode", "both", "--json"]

    runs, records, error = [], [], None
    # PyTorch (Debian's) runs on Debian's OpenBLAS too, which picks its kernels when it loads;
    # Tandem's binary switches them where OpenBLAS's own choice is older than the CPU
    # (engine/src/blas_kernels.h) and names them. PyTorch gets the same kernels, so that neither
    # side's matrix products are slowed by a choice the other does not make.
    torch_env = {"OMP_WAIT_POLICY": "passive"}
    try:
        for rnd in range(args.rounds):
            threads_order = list(args.torch_threads)
            tandem_order = list(args.tandem_threads)
            if rnd % 2:
                threads_order.reverse()
                tandem_order.reverse()
            plan = [("tandem t=%d" % t, tandem_cmd(t), {}, "tandem")
                    for t in tandem_order]
            # OPENBLAS_NUM_THREADS per child: torch.set_num_threads sets OpenMP's threads, not
            # those of Debian's OpenBLAS (pthreads), which would use every core in a "t=1" run
            # where Tandem's BLAS has one thread. (A function: torch_env grows below.)
            plan += [("pytorch t=%d" % t, torch_cmd(t),
                      lambda t=t: dict(torch_env, OPENBLAS_NUM_THREADS=str(t)), "pytorch")
                     for t in threads_order]
            print("round %d/%d" % (rnd + 1, args.rounds), file=sys.stderr)
            for name, cmd, env, impl in plan:
                recs = run_child(name, cmd, env() if callable(env) else env, timeout, runs)
                runs[-1]["round"] = rnd + 1
                check_records(name, recs, impl, args.batch)
                for r in recs:
                    r.setdefault("round", rnd + 1)
                    if ("kernels" in r and "OPENBLAS_CORETYPE" not in os.environ
                            and "OPENBLAS_CORETYPE" not in torch_env):
                        torch_env["OPENBLAS_CORETYPE"] = r["kernels"]
                        print("  PyTorch gets Tandem's OpenBLAS kernels: OPENBLAS_CORETYPE=%s"
                              % r["kernels"], file=sys.stderr)
                records.extend(recs)
    except ChildError as e:
        error = str(e)
        print("error: %s" % error, file=sys.stderr)

    if error is None:
        best = best_rates(records)
        sgemm = best_sgemm(records)
        rows, top_shape, top_gflops = build_table(
            args.batch, args.tandem_threads, args.torch_threads, best, sgemm,
            best_sgemm_by_threads(records))
        print("best of %d round(s); PyTorch with %s and OPENBLAS_NUM_THREADS=its threads; "
              "each side credited with its faster thread setting"
              % (args.rounds, ", ".join("%s=%s" % kv for kv in sorted(torch_env.items()))))
        print()
        print_table(rows, args.tandem_threads, args.torch_threads, top_shape,
                    top_gflops, sgemm)
        missed = [r for r in rows if r["result"] == "MISS"]
        print()
        print("goals: %d met, %d missed"
              % (sum(r["result"] == "PASS" for r in rows), len(missed)))
    else:
        rows, sgemm, top_shape, top_gflops = [], {}, None, None

    if args.json_out:
        doc = {
            "machine": machine,
            "command": command,
            "args": {"tandem_bench": args.tandem_bench, "batch": args.batch,
                     "seconds": args.seconds, "rounds": args.rounds,
                     "torch_threads": args.torch_threads,
                     "tandem_threads": args.tandem_threads,
                     "python": args.python},
            "flops_per_sample": FLOPS_PER_SAMPLE,
            "goals": [{"mode": m, "batch": b, "ratio": g}
                      for (m, b), g in sorted(GOALS.items())],
            "runs": runs,
            "measurements": records,
            "sgemm_best_gflops": sgemm,
            "sgemm_floor_from": {"shape": top_shape, "gflops": top_gflops},
            "table": rows,
            "error": error,
            "load_warning": load_warning,
        }
        with open(args.json_out, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        print("wrote %s" % args.json_out, file=sys.stderr)

    return 1 if error else 0


if __name__ == "__main__":
    sys.exit(main())
