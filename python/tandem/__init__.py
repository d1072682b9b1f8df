"""Tandem: train models with parameter servers, on CPUs and GPUs.

The native engine (``tandem._tandem``) with its roles running on native threads, and
``tandem.dask`` to deploy them inside a Dask cluster and feed them from dask arrays::

    import tandem
    model, summary = tandem.train((images, labels), validation=(val_images, val_labels))
    for score in tandem.scores(coordinator_address):
        print(score["loss"])
"""

from ._tandem import (  # noqa: F401
    Coordinator,
    Error,
    InputError,
    Model,
    ParameterServerRole,
    Role,
    ScorerRole,
    WorkerRole,
    __version__,
    keygen,
    load,
    scores,
    train,
)

__all__ = [
    "Coordinator", "Error", "InputError", "Model", "ParameterServerRole", "Role", "ScorerRole",
    "WorkerRole", "keygen", "load", "scores", "train",
]
