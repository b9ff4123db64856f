"""megatron-core's BlendedMegatronDatasetBuilder, for GPT: from a Config and the
opened datasets to each split's GPTDataset indices and, where Megatron blends,
the BlendedDataset indices. Indices come from the cache when it has them.

Where megatron-core hangs or asserts (a split with no sequences, weights without
a size, a blend that draws more samples than a dataset has), this raises a
ConfigError naming the YAML file and the key instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from functools import partial

import numpy as np

from mmfs.config.schema import SPLITS, Config, DatasetSpec
from mmfs.errors import CacheError, ConfigError
from mmfs.megatron.build.check import check_gpt_build
from mmfs.megatron.build.descriptions import _Descriptions
from mmfs.megatron.build.tasks import CLAIM_MAX, _DropInfo, _Progress, _Task, assign_locks, default_jobs
from mmfs.megatron.cache.headerfile import HEADERS_FROM, HeaderFile
from mmfs.megatron.cache.index_cache import IndexCache, default_cache_dir
from mmfs.megatron.cache.locks import wait_unlocked
from mmfs.megatron.cache.resolved import Resolved
from mmfs.megatron.cache.write import Batch
from mmfs.megatron.indices.blend import (
    MAX_DATASETS,
    build_blending_indices,
    build_exhaustive_blending_indices,
    check_blend_fits,
    sizes_per_dataset,
)
from mmfs.megatron.indices.built import BLEND_ARRAYS, GPT_ARRAYS, BlendIndices, GptIndices, SplitIndices
from mmfs.megatron.indices.gpt import GptParams, build_gpt_indices, plan_epochs, predict_gpt_size
from mmfs.megatron.indices.splits import normalize, split_matrix, split_range

__all__ = ["Builder", "GptIndices", "BlendIndices", "SplitIndices", "CLAIM_MAX", "_Descriptions",
           "default_cache_dir", "default_jobs"]

log = logging.getLogger(__name__)
gpt_log = logging.getLogger(build_gpt_indices.__module__)


class _Abandoned(logging.Filter):
    """Drops the lines of build threads left running after Ctrl-C: their work is thrown
    away, and the build said it was interrupted."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(threading.current_thread(), "mmfs_abandoned", False)


for _logger in (log, gpt_log, logging.getLogger(_Progress.__module__)):
    _logger.addFilter(_Abandoned())


class BuildStopped(Exception):
    """Raised in a build thread when the build was given up before this index."""


@contextlib.contextmanager
def _interrupted_once():
    """While the block runs, Ctrl-C raises KeyboardInterrupt once; a second one is
    ignored, so that it cannot cut short the removal of what the build staged (where
    this is the main thread; elsewhere signals are the main thread's)."""
    seen = []

    def once(signum, frame) -> None:
        if not seen:
            seen.append(signum)
            raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGINT, once)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class Builder:
    """Builds (or loads) every split of a config. `datasets` maps DatasetSpec.file
    to the opened dataset (anything with sequence_lengths and num_sequences).

    jobs: indices built at once in threads (the C core and numpy's shuffles
    release the GIL), as megatron-core's num_dataset_builder_threads. Several
    processes may build into one cache folder: each index is built by the one
    holding its lock (cache/locks.py); the others load it when it is there."""

    def __init__(self, config: Config, datasets: dict, jobs: int | None = None,
                 trust_header_files: bool = True) -> None:
        self.config = config
        self.trust_header_files = trust_header_files  # False: read every index's own files
        self.datasets = datasets
        self.jobs = jobs or default_jobs()
        self.batch = Batch()
        self._folders_made: set[str] = set()
        # Set when the build is given up (Ctrl-C, an error): no index starts after it.
        self.stopping = threading.Event()
        self._progress = _Progress(0)
        self._descriptions = _Descriptions()

    # -- errors --------------------------------------------------------------

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.config.path}: {key}: {message}")

    # -- one GPTDataset ----------------------------------------------------------

    def gpt_task(self, spec: DatasetSpec, split: str, bookend: tuple, num_samples: int | None,
                 key: str, by_length: bool = False) -> tuple[_Task, GptParams]:
        """by_length: the task is one of a blend weighted by its datasets' lengths."""
        c = self.config
        dataset = self.datasets[spec.file]
        params = self.gpt_params(spec, split, *split_range(bookend, dataset.num_sequences), num_samples)
        beg, end = params.beg, params.end
        cache = IndexCache(c.cache_dir or default_cache_dir(spec, c), self._descriptions.gpt(params),
                           "GPTDataset", split)
        label = f"{split}/{spec.name}"

        def check() -> None:
            tokens = check_gpt_build(dataset, params, cache.folder, c.path, c.samples_key(split))
            if tokens == 0 and num_samples is not None:
                which = (f"gets 0 of the {dataset.num_sequences} sequences of {spec.path}"
                         if end <= beg else f"of {spec.path} (sequences {beg}..{end}) holds no tokens")
                raise self.fail(
                    key,
                    f"the {split} split {which}; Megatron's GPTDataset hangs on it (it adds "
                    f"epochs of no tokens until they hold {num_samples:,} samples). Give {split} "
                    "a larger share of `split`, set its share to 0, or leave the dataset out",
                )
            if by_length and (tokens == 0 or predict_gpt_size(params, plan_epochs(params, tokens)).samples == 0):
                raise self._unweighable(spec, params, key)

        def make() -> dict:
            read = getattr(dataset, "read_sequence_lengths", None)
            lengths = read() if read else dataset.sequence_lengths
            self._progress.building(label)
            return build_gpt_indices(lengths, params, label)

        return _Task(cache, GPT_ARRAYS, label, lambda a: self._gpt_arrays_fit(a, params),
                     make, check), params

    def gpt_params(self, spec: DatasetSpec, split: str, beg: int, end: int, num_samples: int | None) -> GptParams:
        """One GPTDataset of the config: sequences [beg, end) of spec's dataset."""
        c = self.config
        return GptParams(
            dataset_path=spec.path,
            split=split,
            beg=beg,
            end=end,
            num_samples=num_samples,
            sequence_length=c.sequence_length,
            seed=c.seed,
            add_extra_token=c.add_extra_token,
            drop_last_partial=c.drop_last_partial_validation_sequence if split == "valid" else True,
            config_split=c.split,
            config_split_matrix=None if c.split is None else split_matrix(c.split),
            tokenizer_identifiers=c.tokenizer_identifiers,
        )

    @staticmethod
    def _gpt_arrays_fit(arrays: dict, p: GptParams) -> bool:
        """O(1) checks that cached arrays belong together (a mismatch means rebuild);
        reads three numbers, maps nothing."""
        doc, sample, shuffle = (arrays["document_index"], arrays["sample_index"],
                                arrays["shuffle_index"])
        n = p.end - p.beg
        ok = (sample.shape[1:] == (2,) and sample.shape[0] >= 1
              and shuffle.shape[0] == sample.shape[0] - 1
              and (doc.shape[0] % n == 0 and doc.shape[0] >= n if n else doc.shape[0] == 0))
        try:
            if ok:
                last = 2 * (sample.shape[0] - 1)
                ok = sample.read_item(0) == 0 and sample.read_item(1) == 0 and \
                    0 <= sample.read_item(last) < max(doc.shape[0], 1)
        except (OSError, ValueError):
            ok = False
        if not ok:
            log.warning("%s: cached indices do not fit together; rebuilding", p.dataset_path)
        return ok

    # -- one blend --------------------------------------------------------------

    def blend_task(self, split: str, specs: list, descriptions: list[str], weights: list,
                   size: int | None) -> tuple[_Task, list]:
        c = self.config
        if size is not None:
            weights = normalize(weights)  # BlendedDataset normalises again, as Megatron does
        description = self._descriptions.blend(descriptions, split, weights, size)
        folder = c.cache_dir or default_cache_dir(specs[0], c, "BlendedDataset")
        cache = IndexCache(folder, description, "BlendedDataset", split)
        expected = size if size is not None else sum(weights)

        def fits(arrays: dict) -> bool:
            return arrays["dataset_index"].shape == (expected,) and \
                arrays["dataset_sample_index"].shape == (expected,)

        def make() -> dict:
            t0 = time.perf_counter()
            if size is not None:
                arrays = build_blending_indices(weights, size)
            else:
                arrays = build_exhaustive_blending_indices(weights)
            log.info("%s/blend: blending index of %d samples over %d datasets (%.2f s)", split,
                     expected, len(specs), time.perf_counter() - t0)
            drawn[:] = np.bincount(arrays["dataset_index"], minlength=len(specs)).tolist()
            return arrays

        def check() -> None:
            check_blend_fits(expected, f"{c.path}: {c.samples_key(split)}: ", c.samples_key(split))

        drawn: list = []
        task = _Task(cache, BLEND_ARRAYS, f"{split}/blend", fits, make, check)
        task.weights = weights
        return task, drawn

    def _check_blend_fits(self, split: str, gpts: list[GptIndices], blend: BlendIndices,
                          drawn: list, key: str) -> None:
        for k, g in enumerate(gpts):
            if drawn and drawn[k] > len(g):
                for name in [*BLEND_ARRAYS, "description"]:  # never reuse a blend that cannot be read
                    suffix = "description.txt" if name == "description" else f"{name}.npy"
                    try:
                        os.unlink(blend.cache.path(suffix))
                    except (OSError, CacheError):
                        pass
                raise self.fail(
                    key,
                    f"the {split} blend draws {drawn[k]} samples from {g.spec.name} but it has "
                    f"only {len(g)}; raise mid_level_dataset_surplus",
                )

    # -- obtaining indices ------------------------------------------------------------

    def _obtain_all(self, units: list[list[_Task]]) -> list[bool]:
        """_obtain each claim, in threads (`jobs` at most; one at least, so that the
        main thread only waits, and Ctrl-C reaches it at once). After an error the
        claims not started never start and each running one stops before its next
        index; the error is raised once they have. On Ctrl-C the main thread does not
        wait for them: the index each is building may take many seconds, and its
        thread (a daemon) ends with the process; the caller abandons the batch, so
        what such a thread was writing is removed and it writes nothing more."""
        results: list[bool] = [False] * len(units)
        errors: list[BaseException] = []
        left = iter(range(len(units)))
        take = threading.Lock()

        def work() -> None:
            while not self.stopping.is_set():
                with take:
                    k = next(left, None)
                if k is None:
                    return
                try:
                    results[k] = self._obtain(units[k])
                except BaseException as exc:  # noqa: BLE001 - raised in the main thread
                    errors.append(exc)
                    self.stopping.set()
                    return

        threads = [threading.Thread(target=work, name=f"mmfs-build-{k}", daemon=True)
                   for k in range(max(1, min(self.jobs, len(units))))]
        for t in threads:
            t.start()
        try:
            for t in threads:
                t.join()
        except BaseException:  # Ctrl-C: left to end with the process (see above), unheard
            self.stopping.set()
            for t in threads:
                t.mmfs_abandoned = True
            raise
        if errors:
            raise next((e for e in errors if not isinstance(e, BuildStopped)), errors[0])
        return results

    def _obtain(self, claim: list[_Task]) -> bool:
        """Build the indices of one claim (tasks under one lock) that the cache does
        not have; False when another builder holds the claim's lock."""
        lock = None
        folder = claim[0].cache.folder
        if folder is not None:
            try:
                if folder not in self._folders_made:
                    os.makedirs(folder, exist_ok=True)
                    self._folders_made.add(folder)
                lock = self.batch.lock(claim[0].lock_path)  # released at the commit, or the abandon
            except OSError:
                lock = False  # unwritable: build in memory (stage() says why, once)
            if lock is None:
                return False
            if lock:
                # finished by another builder meanwhile: load those
                claim = [t for t in claim if not self._from_cache(t)]
        for task in claim:
            if self.stopping.is_set():
                raise BuildStopped()
            task.result = (task.cache.stage(task.make(), self.batch), False)
            self._progress.step(built=True)
        return True

    def _from_cache(self, task: _Task, known: dict | None = None) -> bool:
        """Load the task's index from the cache (or from `known`, what a header file
        holds: base -> (description FileId, arrays)); False when it is not there or
        not sound."""
        unsaved = task.cache.unsaved()
        if unsaved is not None:
            task.result = (unsaved, False)
        elif known and task.cache.base in known:
            task.cache.description_file, arrays = known[task.cache.base]
            task.result = (arrays, True)
        else:
            arrays = task.cache.load(task.specs)
            if arrays is None or not task.fits(arrays):
                return False
            task.result = (arrays, True)
        self._progress.step(built=False)
        return True

    def _run(self, tasks: list[_Task]) -> None:
        """Obtain every task: build or load what can be, commit, then wait for the
        indices other builders hold and take those over whose builder died."""
        self._progress = _Progress(len(tasks))
        pending = tasks
        quiet = None if self._progress.detailed else _DropInfo()
        if quiet:  # the steps of each of thousands of indices would drown the progress
            gpt_log.addFilter(quiet)
        assign_locks(tasks)
        header_files = self._header_files(tasks)
        known: dict = {}
        for header_file, group in header_files if self.trust_header_files else ():
            known.update(header_file.read({t.cache.base: t.specs for t in group}))
        try:
            with _interrupted_once():  # (a second Ctrl-C cannot cut the abandon short)
                try:
                    self._obtain_pending(pending, header_files, known)
                except BaseException:
                    self.stopping.set()
                    self.batch.abandon()
                    raise
        finally:
            if quiet:
                gpt_log.removeFilter(quiet)
        for header_file, group in header_files:
            if any(t.cache.base not in known for t in group):
                header_file.write([(t.cache, t.result[0]) for t in group])

    def _obtain_pending(self, pending: list[_Task], header_files: list, known: dict) -> None:
        """_run's work: every task obtained, what was built committed."""
        # Cache hits first, in this thread: a thread per hit costs more than the hit.
        pending = [t for t in pending if not self._from_cache(t, known)]
        while pending:
            for t in pending:  # every refusal before anything is built
                if not t.checked:
                    t.check()
                    t.checked = True
            claims: dict[str, list[_Task]] = {}
            for t in pending:
                claims.setdefault(t.lock_path, []).append(t)
            units = list(claims.values())
            done = self._obtain_all(units)
            self.batch.commit()  # before waiting: never wait while holding locks
            held = [u for u, ok in zip(units, done) if not ok]
            for u in held:
                log.info("%s: waiting for the builder holding %s", u[0].label, u[0].lock_path)
                wait_unlocked(u[0].lock_path)
            for header_file, group in header_files if held and self.trust_header_files else ():
                # written by a builder that is done: what it holds need not be read
                known.update(header_file.read({t.cache.base: t.specs for t in group
                                               if t.result is None}))
            pending = [t for u in held for t in u if not self._from_cache(t, known)]

    @staticmethod
    def _header_files(tasks: list[_Task]) -> list[tuple[HeaderFile, list[_Task]]]:
        """A header file for each cache folder holding many of these indices."""
        by_folder: dict[str, list[_Task]] = {}
        for t in tasks:
            if t.cache.folder is not None:
                by_folder.setdefault(t.cache.folder, []).append(t)
        return [(HeaderFile(folder, [t.cache for t in group]), group)
                for folder, group in by_folder.items() if len(group) >= HEADERS_FROM]

    # -- a record of a build -----------------------------------------------------------

    def from_record(self, record: Resolved) -> dict[str, SplitIndices]:
        """Each split's indices as a build of this very config and these datasets made
        them (cache/resolved.py): nothing planned, described or read; each array is
        checked against its file when it is first used."""
        c = self.config
        specs = {spec.file: spec for spec in c.all_datasets}
        out = {}
        for name, (gpts, blend) in record.splits.items():
            split = SplitIndices(name, [])
            for file, beg, end, num_samples, *index in gpts:
                spec = specs[file]
                params = self.gpt_params(spec, name, beg, end, num_samples)
                cache = IndexCache(c.cache_dir or default_cache_dir(spec, c), partial(self._descriptions.gpt, params),
                                   "GPTDataset", name, known_hash=index[0])
                split.gpts.append(GptIndices(spec, params, cache, record.arrays(cache, GPT_ARRAYS, *index), True))
            if blend is not None:
                weights, size, *index = blend
                folder = c.cache_dir or default_cache_dir(split.gpts[0].spec, c, "BlendedDataset")
                describe = partial(_Descriptions.blend_of, [g.cache for g in split.gpts], name, weights, size)
                cache = IndexCache(folder, describe, "BlendedDataset", name, known_hash=index[0])
                split.blend = BlendIndices(weights, size, cache, record.arrays(cache, BLEND_ARRAYS, *index), True)
            out[name] = split
        return out

    # -- all splits ------------------------------------------------------------------

    def build(self, splits: tuple[str, ...] = SPLITS) -> dict[str, SplitIndices]:
        plans = self.plan_splits(splits)
        self._run(self.first_tasks(plans))
        return self.finish(plans)

    def plan_splits(self, splits: tuple[str, ...] = SPLITS) -> list[dict]:
        """The indices each split of `splits` needs (a run in phases plans its train split itself)."""
        c = self.config
        if c.blend is not None:
            matrix = split_matrix(c.split)
            key = "datasets" if c.raw.get("datasets") is not None else "data_path"
            bookends = {s: matrix[i] for i, s in enumerate(SPLITS) if s in splits}
            return self._plan_blend(c.blend.datasets, c.blend.weights, bookends, key, per_split=False)
        plans = []
        for s in SPLITS:
            blend = c.blend_per_split[s]
            if blend is not None:
                plans += self._plan_blend(blend.datasets, blend.weights, {s: (0.0, 1.0)},
                                          f"blend_per_split.{s}", per_split=True)
        return plans

    @staticmethod
    def first_tasks(plans: list[dict]) -> list[_Task]:
        """Blends first: the longest tasks start at once, beside the GPTDatasets."""
        return [p["blend_task"] for p in plans if p.get("blend_task")] + \
            [t for p in plans for t in p["gpt_tasks"]]

    def finish(self, plans: list[dict]) -> dict[str, SplitIndices]:
        """Each split's indices once first_tasks(plans) are obtained."""
        for p in plans:
            p["gpts"] = [GptIndices(spec, params, t.cache, *t.result)
                         for spec, params, t in zip(p["specs"], p["params"], p["gpt_tasks"])]
        # Blends weighted by the GPTDatasets' lengths wait for those.
        later = []
        for p in plans:
            if p.get("by_length"):
                p["blend_task"], p["drawn"] = self._length_blend(p)
                later.append(p["blend_task"])
        self._run(later)
        out = {}
        for p in plans:
            split = SplitIndices(p["split"], p["gpts"])
            task = p.get("blend_task")
            if task is not None:
                split.blend = BlendIndices(task.weights, p["size"], task.cache, *task.result)
                self._check_blend_fits(p["split"], p["gpts"], split.blend, p["drawn"], p["key"])
            out[p["split"]] = split
        return out

    def _length_blend(self, p: dict) -> tuple[_Task, list]:
        lengths = [len(g) for g in p["gpts"]]
        for g, n in zip(p["gpts"], lengths):
            if n == 0:
                raise self._unweighable(g.spec, g.params, p["key"])
        size = self.config.samples[p["split"]]
        p["weights"], p["size"] = lengths, None if size is None else min(size, sum(lengths))
        return self.blend_task(p["split"], p["specs"], p["descriptions"], p["weights"], p["size"])

    def _unweighable(self, spec: DatasetSpec, params: GptParams, key: str) -> ConfigError:
        split = params.split
        return self.fail(key, f"{spec.path} has no {split} samples (its {split} tokens, "
                              f"sequences {params.beg}..{params.end}, do not fill one sequence); "
                              "the datasets have no weights, so Megatron weights them by their "
                              "lengths and its BlendedDataset asserts that every weight is above 0. "
                              f"Give {split} a larger share, set its share to 0, or leave the dataset out")

    def _plan_blend(self, specs, weights, bookends: dict, key: str, per_split: bool,
                    split_sizes: dict | None = None) -> list[dict]:
        """What each split needs: its GPTDataset tasks and, where it blends, the blend."""
        c = self.config
        if len(specs) > MAX_DATASETS:
            raise self.fail(key, f"{len(specs)} datasets; Megatron blends at most {MAX_DATASETS}")
        if weights is not None:
            weights = normalize(weights)
        plans = []
        for split, bookend in bookends.items():
            if bookend is None:
                continue
            size = c.samples[split] if split_sizes is None else split_sizes[split]
            p: dict = {"split": split, "key": key, "specs": list(specs), "drawn": []}
            # Megatron: one prefix without weights is the GPTDataset itself; with
            # blend_per_split, one prefix is never blended.
            if len(specs) == 1 and (weights is None or per_split):
                sizes = [size]
            elif weights is not None:
                if size is None:
                    raise self.fail(
                        f"samples.{split}",
                        f"missing: the datasets have weights, so the {split} split needs a "
                        "sample count (Megatron asserts here); give one or drop the weights",
                    )
                sizes = sizes_per_dataset(weights, size, c.mid_level_dataset_surplus)
            else:
                sizes = [None] * len(specs)
                p["by_length"] = True
            made = [self.gpt_task(s, split, bookend, n, key, bool(p.get("by_length")))
                    for s, n in zip(specs, sizes)]
            p["gpt_tasks"] = [t for t, _ in made]
            p["params"] = [params for _, params in made]
            p["descriptions"] = [t.cache.description for t, _ in made]
            if weights is not None and not (len(specs) == 1 and per_split):
                target = sizes_per_dataset(weights, size)
                p["weights"], p["size"] = weights, sum(target)
                p["blend_task"], p["drawn"] = self.blend_task(split, specs, p["descriptions"],
                                                              weights, sum(target))
            plans.append(p)
        return plans
