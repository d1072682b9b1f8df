"""The seed's "simple parallelism" on a Dask cluster: many models trained on the same data, the
best kept (``client.map(train_and_evaluate, hyper_param_list)``), and a trained model applied to
a large array block by block (``df.map_partitions(predict)``). Re-exported by tandem.dask."""

from __future__ import annotations

import hashlib
import itertools
import os
import time

import numpy as np

from ._tandem import Error, InputError, _Predictions, train as _train


def expand_grid(grid):
    """{key: [values]} -> the list of every combination, in order (the last key varies fastest)."""
    keys = list(grid)
    for key in keys:
        if not isinstance(grid[key], (list, tuple)) or not grid[key]:
            raise InputError(f"grid entry '{key}' must be a non-empty list of values")
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def _trial(index, config, train, validation, common):
    """A Dask task: one training run; an error is a result, not a failure of the search."""
    started = time.time()
    settings = dict(common, **config)
    try:
        model, summary = _train(tuple(train), validation=tuple(validation), **settings)
    except Exception as e:  # noqa: BLE001 - a crashing trial is reported and the search goes on
        return {"trial": index, "config": config, "error": f"{type(e).__name__}: {e}",
                "seconds": time.time() - started}
    return {"trial": index, "config": config, "validation": summary["validation"],
            "epochs": summary["epochs"], "seconds": time.time() - started, "model": model}


def _computed(value):
    """Dask collections computed (a trial trains on one contiguous array); others as they are."""
    return tuple(v.compute() if hasattr(v, "__dask_graph__") else np.asarray(v) for v in value)


def search(client, configs, train, validation, **common):
    """Trains one model per configuration, in parallel on the Dask cluster's workers.

    configs: a list of dicts of tandem.train keywords (learning_rate, layers, batch, epochs, ...)
        or a grid {keyword: [values]} (every combination).
    train, validation: (images, labels), NumPy or dask arrays; sent once to every Dask worker
        (broadcast) and shared by all the trials there, not copied per trial.
    common: keywords for every trial (threads defaults to 1: trials run side by side).

    Returns the trials sorted by validation loss (the seed's score), each {trial, config,
    validation, epochs, seconds, model}; trials that failed come last with their error.
    """
    if isinstance(configs, dict):
        configs = expand_grid(configs)
    if not configs:
        raise InputError("search needs at least one configuration")
    common = dict({"threads": 1, "backend": "cpu"}, **common)
    train_data = client.scatter(_computed(train), broadcast=True)
    validation_data = client.scatter(_computed(validation), broadcast=True)
    futures = [client.submit(_trial, i, config, train_data, validation_data, common, pure=False)
               for i, config in enumerate(configs)]
    results = client.gather(futures)
    return sorted(results, key=lambda r: (r.get("error") is not None,
                                          r.get("validation", {}).get("loss_sum", 0.0)))


def _predict_block(block, model):
    return model.predict(block.reshape(block.shape[0], -1), threads=1)


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
    """The model's parameters and the input's shape and dtype (a dask array has no place on
    disk: arrays of the same shape, chunking and dtype are taken for the same input)."""
    digest = hashlib.sha256(repr(list(model.layers)).encode())
    for name, values in sorted(model.parameters().items()):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(values, dtype="<f4").tobytes())
    return (f"model-sha256:{digest.hexdigest()[:16]};input:dask array {tuple(images.shape)} "
            f"{np.dtype(images.dtype).name}")


def _predict_chunk_to(block, chunk, model, out, layout, threads):
    """A Dask task: predicts one block and writes it as chunk `chunk` of the group at `out`
    (both files through a temporary file and a rename). 0 when another run did it meanwhile."""
    output = _Predictions(out, *layout, _OVERWRITE_HINT)
    if output.chunk_done(chunk):
        return 0
    return output.predict_chunk(chunk, model, block.reshape(block.shape[0], -1), threads)


def _labels_of(labels, rows):
    labels = np.asarray(labels.compute() if hasattr(labels, "__dask_graph__") else labels)
    if labels.ndim == 2:  # one-hot rows, the seed's format
        labels = labels.argmax(axis=1)
    if labels.shape != (rows,):
        raise InputError(f"labels must have one class per row of images ({rows}), not shape "
                         f"{labels.shape}")
    return labels


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
    that was interrupted is finished by calling predict again with the same model and input
    (arrays of the same shape, chunking and dtype count as the same input). A group written from
    another model or input, or of another shape or chunking, is refused naming ``out``, unless
    ``overwrite=True``, which starts afresh (it replaces only a predictions group). Computed at
    once, on the current Dask scheduler (a distributed Client when one is active).

    labels: class ids (or one-hot rows) of images' rows, to report the accuracy over all rows.
    threads: CPU threads per task.

    Returns {out, rows, chunks, chunks_written, chunks_skipped, rows_predicted, seconds,
    samples_per_s}, plus accuracy and correct with labels.
    """
    if not hasattr(images, "map_blocks"):
        raise InputError("predict takes a dask array (for a NumPy array: model.predict(images))")
    if images.ndim < 2:
        raise InputError(f"images must have one row per sample, not shape {images.shape}")
    if out is None:
        images = images.rechunk({axis: -1 for axis in range(1, images.ndim)})  # whole rows
        return images.map_blocks(_predict_block, model, dtype=np.uint8,
                                 drop_axis=list(range(1, images.ndim)),
                                 chunks=(images.chunks[0],))
    import dask

    started = time.time()
    out = os.fspath(out)
    if zarr_format not in (2, 3):
        raise InputError(f"zarr_format must be 2 or 3, not {zarr_format!r}")
    images = _whole_rows(images)
    rows, classes = int(images.shape[0]), int(model.layers[-1])
    features = int(np.prod(images.shape[1:]))
    if features != model.layers[0]:
        raise InputError(f"model {'-'.join(map(str, model.layers))} takes {model.layers[0]} "
                         f"features per row, but images have {features} (shape {images.shape})")
    truth = None if labels is None else _labels_of(labels, rows)
    layout = (zarr_format, rows, int(images.chunks[0][0]), classes, _fingerprint(model, images))
    attributes = {"created_by": "tandem.dask.predict",
                  "model_config": "-".join(map(str, model.layers)),
                  "input": f"dask array {images.name}",
                  "note": "classes: arg-max of the model's logits (first maximum), what tandem "
                          "eval counts; probabilities: their softmax. Chunked like the input's "
                          "rows."}
    if overwrite:
        _Predictions.remove(out)  # refuses anything but a predictions group
    _Predictions.prepare(out, *layout, attributes, False, _OVERWRITE_HINT)
    output = _Predictions(out, *layout, _OVERWRITE_HINT)
    missing = [c for c in range(output.chunks) if not output.chunk_done(c)]
    blocks = images.to_delayed().ravel()
    shared_model = dask.delayed(model)  # once in the graph, not once per task
    tasks = [dask.delayed(_predict_chunk_to, pure=False)(blocks[c], c, shared_model, out, layout,
                                                         threads) for c in missing]
    written = dask.compute(*tasks) if tasks else ()
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
