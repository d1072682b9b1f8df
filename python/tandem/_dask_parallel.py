"""The seed's "simple parallelism" on a Dask cluster: many models trained on the same data, the
best kept (``client.map(train_and_evaluate, hyper_param_list)``), and a trained model applied to
a large array block by block (``df.map_partitions(predict)``). Re-exported by tandem.dask."""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import re
import time
import traceback
import warnings

import numpy as np

from ._tandem import Error, InputError, _OutputLock, _Predictions, _SuccessiveHalving, _class_ids
from ._tandem import train as _train

# A trial's last rung keeps the best epoch where the rungs before it kept the last: meant, so
# unsaid. Set once for this module's calls (catch_warnings around each call is not thread-safe,
# and Dask runs trials on threads).
warnings.filterwarnings("ignore", message="resuming with keep_best=", category=UserWarning,
                        module=__name__)


def expand_grid(grid):
    """{key: [values]} -> the list of every combination, in order (the last key varies fastest)."""
    keys = list(grid)
    for key in keys:
        if not isinstance(grid[key], (list, tuple)) or not grid[key]:
            raise InputError(f"grid entry '{key}' must be a non-empty list of values")
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def _trial_error(e):
    """An exception of a trial's tandem.train as the trial's error text. A keyword of the wrong
    type (learning_rate="fast") is pybind11's TypeError, whose "Invoked with:" part printed the
    whole training and validation arrays: cut, the rest names the keywords and their types."""
    text = str(e)
    if isinstance(e, TypeError) and "\nInvoked with:" in text:
        text = text.split("\nInvoked with:")[0] + "\n(a keyword of the trial has the wrong type)"
    return f"{type(e).__name__}: {text}"


def _trial(index, config, train, validation, common):
    """A Dask task: one training run; an error is a result, not a failure of the search."""
    started = time.time()
    settings = dict(common, **config)
    try:
        model, summary = _train(tuple(train), validation=tuple(validation), **settings)
    except Exception as e:  # noqa: BLE001 - a crashing trial is reported and the search goes on
        return {"trial": index, "config": config, "status": "failed",
                "error": _trial_error(e), "seconds": time.time() - started}
    return {"trial": index, "config": config, "status": "completed",
            "validation": summary["validation"], "epochs": summary["epochs"],
            "seconds": time.time() - started, "model": model}


def _rung_job(trial, config, epochs, final, state, train, validation, common):
    """A Dask task: one trial trained from its last state (None: from the start) to `epochs` in
    all. Between rungs the state must be the last epoch's, which the next rung continues; the
    last rung keeps the best epoch (keep_best, as tandem search does). An error is a result."""
    started = time.time()
    settings = dict(common, **config)
    keep_best = settings.pop("keep_best", True) and final
    history = []
    try:
        model, summary, new_state = _train(
            tuple(train), validation=tuple(validation), epochs=epochs, keep_best=keep_best,
            resume=state, return_state=True,
            on_epoch=lambda r: history.append((r["epoch"], r["validation"]["loss_mean"])),
            **settings)
    except Exception as e:  # noqa: BLE001 - a crashing trial is reported and the search goes on
        return {"error": _trial_error(e), "seconds": time.time() - started}
    return {"history": history, "validation": summary["validation"], "model": model,
            "state": new_state, "kept_epoch": summary["kept_epoch"],
            "seconds": time.time() - started}


_ASHA_RESERVED = ("epochs", "resume", "return_state", "on_epoch")

# tandem.train's keywords, from its signature line (the binding is their one list); train and
# validation are the search's own arguments.
_TRAIN_KEYWORDS = frozenset(
    re.findall(r"(\w+):", _train.__doc__.split("\n", 1)[0].split("(", 1)[1])) - {"train",
                                                                              "validation"}
# tandem search's names (a trials file) for tandem.train's.
_CLI_NAMES = {"lr": "learning_rate", "hidden": "layers (the whole list, e.g. [784, 100, 10])"}


def _check_train_keywords(configs, common):
    """Every trial's keywords are tandem.train's, before any data is sent: an unknown one
    would otherwise fail every trial, each after its task ran."""
    for where, keywords in [("common", common)] + [(f"trial {i}", c)
                                                   for i, c in enumerate(configs)]:
        if not isinstance(keywords, dict):
            raise InputError(f"{where}: expected a dict of tandem.train keywords, got "
                             f"{type(keywords).__name__}")
        for key in keywords:
            if key in _TRAIN_KEYWORDS:
                continue
            hint = (f" (tandem search's '{key}' is '{_CLI_NAMES[key]}' here)"
                    if key in _CLI_NAMES else
                    " (train and validation are search()'s own arguments)"
                    if key in ("train", "validation") else "")
            raise InputError(f"{where}: '{key}' is not a tandem.train keyword{hint}; expected "
                             f"one of {', '.join(sorted(_TRAIN_KEYWORDS))}")


def _successive_halving(client, configs, train_data, validation_data, common, budget, min_epochs,
                        eta, budget_seconds, slots):
    """The driver of search(budget=...): tandem search's loop, with Dask tasks for processes."""
    from distributed import as_completed

    halving = _SuccessiveHalving(len(configs), min_epochs, budget, eta)
    top = len(halving.rung_epochs) - 1
    if slots is None:
        slots = max(1, sum(client.nthreads().values()))
    records = [{"trial": i, "config": c, "epochs": 0, "seconds": 0.0}
               for i, c in enumerate(configs)]
    losses = [[] for _ in configs]  # validation loss per sample of every epoch trained
    states = [None] * len(configs)  # the last state of trials that may be promoted
    running = {}
    jobs = as_completed(loop=client.loop)
    started = time.monotonic()
    closed = False
    while True:
        if budget_seconds and not closed and time.monotonic() - started >= budget_seconds:
            # Start nothing more. The running jobs finish and count: a Dask task cannot be
            # interrupted inside the engine, so the search overruns by at most one job.
            closed = True
            for i in range(len(configs)):  # (not the losers of a settled rung: the halving's)
                if halving.status(i) == "running" or halving.in_contention(i):
                    records[i]["stopped_by_time_budget"] = True
            halving.close()
        while not closed and len(running) < slots:
            job = halving.next()
            if job is None:
                break
            trial, rung, epochs = job
            future = client.submit(_rung_job, trial, configs[trial], epochs, rung == top,
                                   states[trial], train_data, validation_data, common,
                                   pure=False)
            running[future] = job
            jobs.add(future)
        for i, state in enumerate(states):  # only a trial that may go on needs its state
            if state is not None and halving.status(i) in ("stopped", "failed"):
                states[i] = None
        if not running:
            halving.done()  # stops the trials still waiting (the losers; see done())
            break
        finished = jobs.next_batch(block=not budget_seconds or closed)
        if not finished:
            time.sleep(0.05)
            continue
        for future in finished:
            trial, rung, epochs = running.pop(future)
            record = records[trial]
            try:
                result = future.result()
            except Exception as e:  # noqa: BLE001 - the task itself died (a lost worker)
                result = {"error": f"{type(e).__name__}: {e}", "seconds": 0.0}
            record["seconds"] += result["seconds"]
            states[trial] = None
            if "error" in result:
                record["error"] = result["error"]
                halving.fail(trial)
                continue
            losses[trial] += [_finite_or_inf(loss) for _, loss in result["history"]]
            record.update(epochs=len(losses[trial]), validation_losses=list(losses[trial]),
                          validation=result["validation"],
                          model=result["model"], kept_epoch=result["kept_epoch"])
            # Ranked as tandem search ranks a rung: by the loss of its last epoch, the state a
            # promotion resumes from (keep_best applies to the last rung only), so a trial that
            # got worse since its best epoch is not promoted on a state it no longer holds. (The
            # results are ordered by the best loss, as the CLI's table.)
            halving.report(trial, losses[trial][-1] if losses[trial] else math.inf)
            if closed:
                halving.stop(trial)
            states[trial] = result["state"]
    for i, record in enumerate(records):
        record.update(status=halving.status(i), rung=halving.rung(i))
        if record["status"] != "stopped":
            record.pop("stopped_by_time_budget", None)
        if losses[i]:
            record["best_validation_loss"] = min(losses[i])
    ranked = _ranked(records)
    if states[ranked[0]["trial"]] is not None:  # the best may go on training
        ranked[0]["state"] = states[ranked[0]["trial"]]
    return ranked


def _ranked(records):
    """By validation loss (the seed's score): with successive halving the trial's best per
    sample over every epoch it trained (its rungs ranked it by their last epochs), as tandem
    search's table; failed trials and trials that never finished a job last."""
    def loss(r):
        return _finite_or_inf(r.get("best_validation_loss",
                                    (r.get("validation") or {}).get("loss_sum", 0.0)))

    return sorted(records, key=lambda r: ("error" in r, "validation" not in r, loss(r)))


def _finite_or_inf(loss):
    """A diverged trial's loss (NaN, or infinite) as infinity: NaN compares false with every
    number, which would leave a whole ranking undefined."""
    return loss if math.isfinite(loss) else math.inf


def _computed(value):
    """Dask collections computed (a trial trains on one contiguous array); others as they are.
    Together, in one compute: images and labels that share a graph (one loader feeding both)
    then come from one run of it, each shared task once, their rows still paired."""
    value = tuple(value)
    lazy = [i for i, v in enumerate(value) if hasattr(v, "__dask_graph__")]
    done = {}
    if lazy:
        import dask  # only here: the engine itself does not need Dask
        done = dict(zip(lazy, dask.compute(*(value[i] for i in lazy))))
    return tuple(np.asarray(done[i]) if i in done else np.asarray(v) for i, v in enumerate(value))


def search(client, configs, train, validation, *, budget=None, min_epochs=1, eta=3,
           budget_seconds=0, slots=None, **common):
    """Trains one model per configuration, in parallel on the Dask cluster's workers.

    configs: a list of dicts of tandem.train keywords (learning_rate, layers, batch, epochs, ...)
        or a grid {keyword: [values]} (every combination).
    train, validation: (images, labels), NumPy or dask arrays; sent once to every Dask worker
        (broadcast) and shared by all the trials there, not copied per trial.
    common: keywords for every trial (threads defaults to 1: trials run side by side).

    Without budget every trial trains its epochs. With budget (epochs), hopeless trials stop
    early by asynchronous successive halving, tandem search's rule and code (ASHA): rungs at
    min_epochs, min_epochs*eta, ... epochs up to budget; a trial that finishes a rung goes on
    when the validation loss of the rung's last epoch (the state it would go on from) ranks in
    the top 1/eta of the trials seen there, and
    once a rung can get no more trials the rest of it is stopped (at least one trial trains
    the whole budget). A promotion continues the trial from its training state (tandem.train's
    resume), so a promoted trial ends as an uninterrupted run of its epochs would. At most
    `slots` jobs run at once (default: the cluster's worker threads). budget_seconds: after
    that many seconds no job starts and the waiting trials stop; the jobs already running
    finish and count (a task cannot be interrupted inside the engine), so the search overruns
    by at most one job. The rungs set epochs (not to be given); earlier rungs keep their last
    epoch, which the next continues, and keep_best applies to the last rung (default: it keeps
    its best epoch, as tandem search does).

    Returns the trials sorted by validation loss (the seed's score), each {trial, config,
    status, validation, epochs, seconds, model}; trials that failed come last with their error.
    With budget each also has rung (the highest finished, -1: none), best_validation_loss (per
    sample, what the results are sorted by), validation_losses (per sample, every epoch trained) and
    kept_epoch; status is completed, stopped or failed; validation and model are of the trial's
    last job (its last epoch, or the last rung's kept epoch). Training states are dropped as
    trials stop or fail; the best trial, when it completed, has state (tandem.train's resume
    bytes) to go on training; every trial that finished a job has its model.
    """
    configs = expand_grid(configs) if isinstance(configs, dict) else list(configs)
    if not configs:
        raise InputError("search needs at least one configuration")
    _check_train_keywords(configs, common)
    # Two trials of one configuration train the same model: they tie, and take two of a rung's
    # places (tandem search refuses them too).
    seen = {}
    for i, config in enumerate(configs):
        key = repr(sorted(config.items()))
        if key in seen:
            raise InputError(f"configs {seen[key]} and {i} are the same configuration "
                             f"({config}), which would train the same model twice; give each "
                             "configuration once")
        seen[key] = i
    if budget is None:
        if (min_epochs, eta, budget_seconds, slots) != (1, 3, 0, None):
            raise InputError("min_epochs, eta, budget_seconds and slots are successive "
                             "halving's: give budget (the most epochs a trial trains) too")
        # A trial returns its model and summary; a third value (the state) failed every trial.
        if any(keywords.get("return_state") for keywords in [common] + list(configs)):
            raise InputError("return_state is not for search: each trial's result holds its "
                             "model (with budget, successive halving keeps the states itself)")
    else:
        if eta < 2:
            raise InputError(f"eta={eta}: expected >= 2 (rungs grow by eta, the top 1/eta go on)")
        if min_epochs < 1:
            raise InputError(f"min_epochs={min_epochs}: expected >= 1")
        if budget < min_epochs:
            raise InputError(f"budget={budget}: expected >= min_epochs ({min_epochs})")
        if budget_seconds < 0 or (slots is not None and slots < 1):
            raise InputError(f"budget_seconds={budget_seconds}, slots={slots}: expected "
                             "budget_seconds >= 0 and slots >= 1")
        given = set(common).union(*map(set, configs)).intersection(_ASHA_RESERVED)
        if given:
            raise InputError(f"with budget, successive halving sets {', '.join(sorted(given))}"
                             " itself; do not give them")
    common = dict({"threads": 1, "backend": "cpu"}, **common)
    # Every trial is ranked by its validation loss: none to rank by is refused before any trial
    # trains, not met as each trial's error.
    if validation is None:
        raise InputError("search needs validation (images, labels) to rank the trials by")
    validation = _computed(validation)
    if len(validation) != 2:
        raise InputError(f"validation must be (images, labels), got {len(validation)} items")
    if len(validation[1]) == 0:
        raise InputError("search needs validation rows to rank the trials by; got none")
    # hash=False: named by content, a second search of the same arrays would reuse the key the
    # scheduler is still releasing from the first, and its trials fail on "lost dependencies".
    train_data = client.scatter(_computed(train), broadcast=True, hash=False)
    validation_data = client.scatter(validation, broadcast=True, hash=False)
    if budget is not None:
        return _successive_halving(client, configs, train_data, validation_data, common, budget,
                                   min_epochs, eta, budget_seconds, slots)
    futures = [client.submit(_trial, i, config, train_data, validation_data, common, pure=False)
               for i, config in enumerate(configs)]
    return _ranked(client.gather(futures))


def _predict_block(block, model, threads=1, block_info=None):
    # Not reshape(rows, -1): a block of no rows (boolean filtering) has no -1 to infer.
    rows = block.reshape(block.shape[0], int(np.prod(block.shape[1:])))
    try:
        return model.predict(rows, threads=threads)
    except InputError as e:  # "images: row N ...", N counted within the block
        first = block_info[0]["array-location"][0][0] if block_info else 0
        # Said as the array's row: "row 100 ... (rows counted from the block's first, row 1400
        # of the array)" read as though row 1400 were the bad one.
        text, named = re.subn(r"^images: row (\d+)",
                              lambda m: f"images: row {first + int(m.group(1))} of the array",
                              str(e), count=1)
        if not named:
            text = f"{e} (in the block from row {first} of the array)"
        raise InputError(text) from None


_OVERWRITE_HINT = "pass overwrite=True to replace it"


def _whole_rows(images):
    """images with every block holding whole rows, in row chunks a Zarr array can have (all
    the same size but the last, which may be smaller)."""
    images = images.rechunk({axis: -1 for axis in range(1, images.ndim)})
    rows = images.chunks[0]
    if len(rows) > 1 and (len(set(rows[:-1])) > 1 or rows[-1] > rows[0]):
        images = images.rechunk({0: max(rows)})
    return images


def _fingerprint(model, images):
    """The model's parameters and the input's shape and dtype. A dask array has no files to
    fingerprint: each chunk's input rows are hashed instead (_block_digest), the digest recorded
    with the chunk and compared on every rerun."""
    digest = hashlib.sha256(repr(list(model.layers)).encode())
    for name, values in sorted(model.parameters().items()):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(values, dtype="<f4").tobytes())
    return (f"model-sha256:{digest.hexdigest()[:16]};input:dask array {tuple(images.shape)} "
            f"{np.dtype(images.dtype).name}, each chunk's rows sha256 in input_sha256")


def _block_digest(block):
    """sha256 of a block's dtype, shape and bytes (C order)."""
    block = np.ascontiguousarray(block)
    digest = hashlib.sha256(f"{block.dtype.str}{block.shape}".encode())
    digest.update(block.tobytes())
    return digest.digest()


def _other_input(out, chunks):
    listed = ", ".join(map(str, chunks[:10])) + (", ..." if len(chunks) > 10 else "")
    return InputError(f"{out}: written from another model or input: the rows of chunk(s) "
                      f"{listed} differ from those their predictions were made from (another "
                      f"sha256); {_OVERWRITE_HINT}")


def _chunk_matches(block, chunk, out, layout):
    """A Dask task: whether done chunk `chunk` was predicted from these rows (its recorded
    digest is this block's). The block is hashed where it is computed: only a flag travels."""
    return _Predictions(out, *layout, _OVERWRITE_HINT).input_digest(chunk) == _block_digest(block)


def _add_note(error, text):
    """BaseException.add_note where Python has it (3.11). Before (the package supports 3.9),
    which prints no notes: the text is added to a one-string message instead."""
    if hasattr(error, "add_note"):
        error.add_note(text)
    elif len(error.args) == 1 and isinstance(error.args[0], str):
        error.args = (f"{error.args[0]}\n{text}",)
    else:
        error.__notes__ = [*getattr(error, "__notes__", ()), text]


def _predict_chunk_or_error(block, chunk, model, out, layout, threads, output_id):
    """_predict_chunk_to, its error returned rather than raised: a compute that raised on the
    first error would return while the other tasks still write their chunks."""
    try:
        return _predict_chunk_to(block, chunk, model, out, layout, threads, output_id), None
    except Exception as e:  # noqa: BLE001 (raised by predict once every task has ended)
        _add_note(e, f"in the task of chunk {chunk}:\n{traceback.format_exc()}")
        return 0, e


def _predict_chunk_to(block, chunk, model, out, layout, threads, output_id):
    """A Dask task: predicts one block and writes it as chunk `chunk` of the group at `out`
    (the block's digest, then both files, each through a temporary file and a rename). 0 when
    another run did it meanwhile, from the same rows."""
    # This run's output id: a task starting after another run took the group over (this run
    # interrupted) writes nothing.
    output = _Predictions(out, *layout, _OVERWRITE_HINT, output_id)
    digest = _block_digest(block)
    if output.chunk_done(chunk):
        if output.input_digest(chunk) != digest:
            raise _other_input(out, [chunk])
        return 0
    return output.predict_chunk(chunk, model, block.reshape(block.shape[0], -1), digest, threads)


def _labels_of(labels, rows, classes):
    """Class ids of images' rows, checked as the engine checks labels: a label that names no
    class of the model would count as a wrong prediction without a word."""
    labels = labels.compute() if hasattr(labels, "__dask_graph__") else labels
    return _class_ids(labels, rows, classes)


def predict(model, images, out=None, *, labels=None, overwrite=False, zarr_format=3, threads=1):
    """Predicted class of every row of a dask array of images, computed block by block where the
    blocks live (the seed's ``df.map_partitions(predict)``).

    Without ``out``: a lazy uint8 dask array chunked like images' rows.

    With ``out`` (a directory path every Dask worker can reach): the predictions are written
    there as ``tandem predict`` writes them, a Zarr group (format ``zarr_format``) of
    ``classes`` (uint8 [rows]) and ``probabilities`` (float32 [rows, classes], the softmax of
    the logits, whose first maximum is the class), chunked like images' rows (irregular row
    chunks are first made regular). Each Dask task predicts one block and writes its chunk
    files through a temporary file and a rename; chunks already complete are skipped, so a run
    that was interrupted is finished by calling predict again with the same model and input.
    The group records each chunk's input rows as a SHA-256 (``input_sha256``, uint8 [chunks,
    32]), and a rerun computes and hashes the blocks of the chunks already done to compare
    them, before it writes anything: a rerun computes every block of its input again, whatever
    is left to predict. Tasks of an earlier run still writing (its client interrupted) stop at
    their next chunk once a run takes the group over, and the chunks they have in flight are
    waited for; were two runs' writes still to meet in one chunk (a file system whose locks
    do not reach every machine), at least one of them raises an Error naming it. A group
    written from another model or input (any chunk's rows changed), or of another shape or
    chunking, is refused naming ``out``, unless ``overwrite=True``, which starts afresh (it
    replaces only a predictions group). One prediction at a time writes ``out``: while another
    (this function's or ``tandem predict``'s) holds its lock (``OUT.lock`` beside it), predict
    is refused, naming the process. Computed at once, on the current Dask scheduler (a
    distributed Client when one is active).

    A row with no class (a NaN or infinite pixel, or pixels so large that its logits are not
    finite) is refused with an InputError naming it; nothing is written for its chunk. A task's
    error is raised once every task has ended (the other chunks written), with the worker's
    traceback as a note. Lazily (no ``out``) the row is counted within its block, which the
    error names.

    labels: class ids (or one-hot rows) of images' rows, to report the accuracy over all rows
    (with out, as are overwrite and zarr_format).
    threads: CPU threads per task.

    Returns {out, rows, chunks, chunks_written, chunks_skipped, rows_predicted, seconds,
    samples_per_s}, plus accuracy and correct with labels.
    """
    if not hasattr(images, "map_blocks"):
        raise InputError("predict takes a dask array (for a NumPy array: model.predict(images))")
    if images.ndim < 2:
        raise InputError(f"images must have one row per sample, not shape {images.shape}")
    if out is None:
        given = [name for name, differs in (("labels", labels is not None),
                                            ("overwrite", bool(overwrite)),
                                            ("zarr_format", zarr_format != 3)) if differs]
        if given:
            raise InputError(f"{', '.join(given)}: for predictions written to out (give out, "
                             "or leave them out)")
        images = images.rechunk({axis: -1 for axis in range(1, images.ndim)})  # whole rows
        return images.map_blocks(_predict_block, model, threads, dtype=np.uint8,
                                 drop_axis=list(range(1, images.ndim)),
                                 chunks=(images.chunks[0],))
    started = time.time()
    out = os.fspath(out)
    if zarr_format not in (2, 3):
        raise InputError(f"zarr_format must be 2 or 3, not {zarr_format!r}")
    if any(math.isnan(n) for n in images.chunks[0]):
        raise InputError("images has chunks of unknown length (boolean filtering, say): the "
                         "predictions group needs every chunk's rows before it is written; call "
                         "images.compute_chunk_sizes() first (or predict lazily, without out)")
    images = _whole_rows(images)
    rows, classes = int(images.shape[0]), int(model.layers[-1])
    features = int(np.prod(images.shape[1:]))
    if features != model.layers[0]:
        raise InputError(f"model {'-'.join(map(str, model.layers))} takes {model.layers[0]} "
                         f"features per row, but images have {features} (shape {images.shape})")
    truth = None if labels is None else _labels_of(labels, rows, classes)
    layout = (zarr_format, rows, int(images.chunks[0][0]), classes, _fingerprint(model, images))
    attributes = {"created_by": "tandem.dask.predict",
                  "model_config": "-".join(map(str, model.layers)),
                  "input": f"dask array {images.name}",
                  "note": "classes: arg-max of the model's logits (first maximum), what tandem "
                          "eval counts; probabilities: their softmax. Chunked like the input's "
                          "rows."}
    # One prediction at a time writes out (tandem predict's OUT.lock): a second would remove
    # the group under this one with overwrite, or write into it.
    with _OutputLock(out):
        return _write_predictions(model, images, out, layout, attributes, truth, overwrite,
                                  threads, started)


def _write_predictions(model, images, out, layout, attributes, truth, overwrite, threads,
                       started):
    """predict's work once it holds out's lock: the group prepared, every missing chunk
    written, the summary."""
    import dask

    rows = layout[1]
    if overwrite:
        _Predictions.remove(out)  # refuses anything but a predictions group
    output_id = _Predictions.prepare(out, *layout, attributes, False, _OVERWRITE_HINT)
    output = _Predictions(out, *layout, _OVERWRITE_HINT, output_id)
    done = [c for c in range(output.chunks) if output.chunk_done(c)]
    blocks = images.to_delayed().ravel()
    # The done chunks' rows first, all of them, so that a changed input is refused before a
    # chunk of it is written beside predictions of the old one.
    matches = dask.compute(*(dask.delayed(_chunk_matches, pure=False)(blocks[c], c, out, layout)
                             for c in done))
    changed = [c for c, same in zip(done, matches) if not same]
    if changed:
        raise _other_input(out, changed)
    missing = sorted(set(range(output.chunks)) - set(done))
    shared_model = dask.delayed(model)  # once in the graph, not once per task
    tasks = [dask.delayed(_predict_chunk_or_error, pure=False)(blocks[c], c, shared_model, out,
                                                               layout, threads, output_id)
             for c in missing]
    results = dask.compute(*tasks) if tasks else ()
    errors = [e for _, e in results if e is not None]
    if errors:
        if len(errors) > 1:
            _add_note(errors[0], f"{len(errors) - 1} other chunk(s) failed too")
        raise errors[0]
    written = [n for n, _ in results]
    seconds = time.time() - started
    rows_predicted = int(sum(written))
    summary = {"out": out, "rows": rows, "chunks": output.chunks,
               "chunks_written": sum(1 for n in written if n > 0),
               "chunks_skipped": output.chunks - sum(1 for n in written if n > 0),
               "rows_predicted": rows_predicted, "seconds": seconds,
               "samples_per_s": rows_predicted / seconds if seconds > 0 else 0.0}
    if truth is not None:
        correct = int((output.classes() == truth).sum())
        summary.update(correct=correct, accuracy=correct / rows)
    return summary


__all__ = ["expand_grid", "search", "predict", "Error"]
