"""Load megatron-core 0.19.2's `data_samplers.py` as shipped in its wheel.

`megatron.training` does not import on Python 3.11 (its models package uses
typing.override, new in 3.12), and data_samplers.py imports it only for
get_args() and the signal handler, which the samplers never call. This loads the
wheel's file itself with those two names stubbed. Used by the recorders in this
folder and by benchmarks/megatron_loader.py; needs torch and megatron-core.
"""

from __future__ import annotations

import importlib.util
import sys
import types


def load_data_samplers() -> types.ModuleType:
    import megatron.core  # noqa: F401  (the real package; only megatron.training is stubbed)

    spec = importlib.util.find_spec("megatron.core")
    root = spec.submodule_search_locations[0].rsplit("/core", 1)[0]
    path = f"{root}/training/datasets/data_samplers.py"
    if "megatron.training" not in sys.modules:
        training = types.ModuleType("megatron.training")
        training.__path__ = []  # a package, so the submodule below can hang off it

        def get_args():
            raise RuntimeError("get_args is stubbed: only the sampler classes are used")

        training.get_args = get_args
        handler = types.ModuleType("megatron.training.dist_signal_handler")
        handler.DistributedSignalHandler = object
        sys.modules["megatron.training"] = training
        sys.modules["megatron.training.dist_signal_handler"] = handler
    module_spec = importlib.util.spec_from_file_location("megatron_data_samplers", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def cyclic_iter(iterable):
    """What Megatron's training loop does with a cyclic data loader
    (megatron/training/training.py cyclic_iter): iterate it again and again."""
    while True:
        count = 0
        for x in iter(iterable):
            count += 1
            yield x
        if count == 0:
            raise RuntimeError("cyclic_iter: iterable produced no data")
