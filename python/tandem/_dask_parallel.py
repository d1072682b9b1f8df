"""The seed's "simple parallelism" on a Dask cluster: many models trained on the same data, the
best kept (``client.map(train_and_evaluate, hyper_param_list)``), and a trained model applied to
a large array block by block (``df.map_partitions(predict)``). Re-exported by tandem.dask."""

from __future__ import annotations

import itertools
import time

import numpy as np

from ._tandem import Error, InputError, train as _train


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


def predict(model, images):
    """Predicted class of every row of a dask array of images, computed block by block where the
    blocks live: a lazy uint8 dask array chunked like images' rows."""
    if not hasattr(images, "map_blocks"):
        raise InputError("predict takes a dask array (for a NumPy array: model.predict(images))")
    if images.ndim < 2:
        raise InputError(f"images must have one row per sample, not shape {images.shape}")
    images = images.rechunk({axis: -1 for axis in range(1, images.ndim)})  # whole rows per block
    return images.map_blocks(_predict_block, model, dtype=np.uint8,
                             drop_axis=list(range(1, images.ndim)), chunks=(images.chunks[0],))


__all__ = ["expand_grid", "search", "predict", "Error"]
