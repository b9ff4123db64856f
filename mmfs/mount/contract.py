"""The mount's contract: the paths, file names, extended attributes and
mmfs.json keys a reader of a mount relies on, in one place.

Standard library only: the loader (numpy, no C core) imports it, and
native/build_native.py runs it by path to write the facts the C core needs
into a header (`c_header`). The layout itself is described in README.md.
"""

from __future__ import annotations

import re

# -- paths ------------------------------------------------------------------------

MANIFEST = "mmfs.json"
# the FUSE subtype a mount is made with: the kernel lists its file system type as fuse.<subtype>
FS_SUBTYPE = "mmfs"
REPORT = "report.html"  # `mmfs report`'s page of the mounted config
SAMPLES = "samples"
RANKS = "ranks"
STREAMS = "streams"
PHASES = "phases"  # under phase_mode restart: each phase's own valid and test (docs/phases.md)
BEYOND = "beyond"  # a run in phases: samples only a restart phase's own dataset holds (docs/phases.md)
DATASETS = "datasets"
DOCUMENTS = "documents"
SEQUENCES = "sequences"


def sample_dir(split: str) -> str:
    """A split's samples, in training order: "/train/samples"."""
    return f"/{split}/{SAMPLES}"


def ranks_dir(split: str) -> str:
    """The folder of a split's data-parallel ranks: "/train/ranks"."""
    return f"/{split}/{RANKS}"


def beyond_dir(split: str) -> str:
    """The samples past a split's own that a phase's cyclic sampler reads: "/train/beyond"
    (file f is the split's sample id len(samples) + f)."""
    return f"/{split}/{BEYOND}"


def streams_dir(folder: str) -> str:
    """The folder of the stream layouts (docs/streams.md) of a split, "/train/streams",
    or of a restart phase's own split (`folder` "valid/phases/001"), "/valid/phases/001/streams"."""
    return f"/{folder}/{STREAMS}"


# A stream layout folder's name, the one spelling (docs/streams.md): decimal
# numbers without leading zeros, the optional parts in this order. from= may be
# longer than 64 bits: Megatron's cyclic sampler takes any consumed_samples whose
# epoch torch's manual_seed accepts (rankplan.plan_stream checks that).
_NUMBER = r"(0|[1-9][0-9]{0,18})"
_CONSUMED = r"(0|[1-9][0-9]{0,99})"
STREAM_NAME = re.compile(
    rf"dp=(?P<dp>{_NUMBER}),mbs=(?P<mbs>{_NUMBER}),from=(?P<consumed>{_CONSUMED})"
    r"(?:,sampler=(?P<sampler>single|cyclic|batch))?(?:,sharding=(?P<sharding>true|false))?"
)
STREAM_NAME_HELP = "dp=<D>,mbs=<M>,from=<C>[,sampler=single|cyclic|batch][,sharding=true|false]"


def stream_name(data_parallel_size: int, micro_batch_size: int, consumed_samples: int,
                sampler: str | None = None, sharding: bool | None = None) -> str:
    """The layout folder of a stream: "dp=3,mbs=2,from=592" (the sampler and sharding
    only when given: the mount's defaults otherwise)."""
    name = f"dp={int(data_parallel_size)},mbs={int(micro_batch_size)},from={int(consumed_samples)}"
    if sampler is not None:
        name += f",sampler={sampler}"
    if sharding is not None:
        name += f",sharding={'true' if sharding else 'false'}"
    return name


def phase_dir(split: str, phase: int, width: int) -> str:
    """A restart phase's own split (valid, test), as its relaunch builds it:
    "/valid/phases/001", which holds `samples/`, `ranks/` and `streams/` as a split does."""
    return f"/{split}/{PHASES}/{phase:0{width}d}"


def rank_dir(split: str, rank: int, width: int) -> str:
    """One rank's micro-batches: "/train/ranks/003"."""
    return f"{ranks_dir(split)}/{rank:0{width}d}"


def dataset_dir(name: str, kind: str) -> str:
    """A dataset's documents or sequences (`kind`): "/datasets/<name>/documents"."""
    return f"/{DATASETS}/{name}/{kind}"


# -- file names --------------------------------------------------------------------

MIN_NAME_WIDTH = 7
MIN_RANK_NAME_WIDTH = 3
FILE_SUFFIX = ".bin"
FILE_NAMES = f"zero-padded decimal id, width max({MIN_NAME_WIDTH}, digits of the largest id), then {FILE_SUFFIX}"


def name_width(count: int) -> int:
    """Digits in the file names of a folder of `count` files: max(7, digits of the largest id)."""
    return max(MIN_NAME_WIDTH, len(str(count - 1))) if count > 0 else MIN_NAME_WIDTH


MIN_PHASE_NAME_WIDTH = 3


def phase_name_width(phases: int) -> int:
    """Digits of a phase folder's name: max(3, digits of the last phase's index)."""
    return max(MIN_PHASE_NAME_WIDTH, len(str(max(phases - 1, 0))))


def rank_name_width(data_parallel_size: int) -> int:
    """Digits of a rank folder's name: max(3, digits of data_parallel_size - 1)."""
    return max(MIN_RANK_NAME_WIDTH, len(str(max(data_parallel_size - 1, 0))))


def file_name_format(width: int) -> str:
    """The %-format of the file names of a folder (the C core formats the same)."""
    return f"%0{width}d{FILE_SUFFIX}"


def file_name(i: int, width: int) -> str:
    """The name of file i in a folder whose names are `width` digits: "0000042.bin"."""
    return file_name_format(width) % i


# -- extended attributes -----------------------------------------------------------

# `user.mmfs.pieces` is text: one "sequence:offset:length" triple per piece,
# separated by single spaces, in the order the tokens appear in the sample
# (sequence ids of that dataset's .idx, offsets and lengths in tokens).
XATTR_DATASET = "user.mmfs.dataset"
XATTR_PIECES = "user.mmfs.pieces"
XATTR_SAMPLES = "user.mmfs.samples"
XATTR_PHASE = "user.mmfs.phase"  # a run in phases (docs/phases.md): the train sample's phase
XATTR_COUNTERS = "user.mmfs.counters"  # on the mount's root: the daemon's own counters, JSON (docs/mount.md)
XATTR_DOCS = {
    XATTR_DATASET: "name of the dataset a sample was cut from",
    XATTR_PIECES: "space-separated sequence:offset:length triples, in sample order "
    "(sequence ids of that dataset; offsets and lengths in tokens)",
    XATTR_SAMPLES: "on a micro-batch file: its sample ids in the split, space-separated, in batch order",
    XATTR_PHASE: "on a train sample of a run in phases (and on a file of train/beyond): its phase (index in "
    "mmfs.json's phases.phases, from 0)",
    XATTR_COUNTERS: "on the mount's root: the daemon's counters as JSON (requests by kind, the most READs at once, "
    "requests to the store in flight, the libfuse the mount uses)",
}

# -- mmfs.json keys a loader reads --------------------------------------------------

KEY_DTYPE = "dtype"
KEY_SEQUENCE_LENGTH = "sequence_length"
KEY_ADD_EXTRA_TOKEN = "add_extra_token_to_sequence"
KEY_TOKENS_PER_SAMPLE = "tokens_per_sample"
KEY_BYTES_PER_SAMPLE = "bytes_per_sample"
KEY_EOD = "eod_id"
KEY_PAD = "pad_id"
KEY_SAMPLES = "samples"  # {split: samples}
KEY_SPLITS = "splits"  # {split: {KEY_PATH, KEY_NAME_WIDTH, ...}}
KEY_PATH = "path"
KEY_NAME_WIDTH = "name_width"
KEY_BEYOND = "beyond"  # in a split's entry: {KEY_PATH, KEY_NAME_WIDTH, KEY_BEYOND_SAMPLES} of its beyond view
KEY_BEYOND_SAMPLES = "samples"  # ids len(samples) .. len(samples) + this - 1
KEY_TRAINING = "training"
KEY_PHASES = "phases"  # a run in phases: {phase_mode, phases: [{phase, start_sample, end_sample, datasets}]}
# ... and in it, under restart: phase_name_width, and per phase `splits` {valid, test: as KEY_SPLITS's
# entries, with streams_path, and ranks_path, microbatches and evaluations}
KEY_PHASE_NAME_WIDTH = "phase_name_width"
KEY_STREAMS_PATH = "streams_path"  # a phase's own split's stream layouts: "valid/phases/001/streams"
# ... and per phase: the samples its cyclic sampler draws from (>= its `samples`), and the split id
# of its sample `samples` (ids past the split's own samples: its beyond view's)
KEY_SAMPLER_SAMPLES = "sampler_samples"
KEY_BEYOND_FIRST_ID = "beyond_first_id"
# ... and in the training section:
KEY_DATA_PARALLEL_SIZE = "data_parallel_size"
KEY_MICRO_BATCH_SIZE = "micro_batch_size"
KEY_MICROBATCHES = "microbatches"  # {split: files per rank}
KEY_RANK_NAME_WIDTH = "rank_name_width"
KEY_MICROBATCH_NAME_WIDTH = "microbatch_name_width"  # {split: width}
KEY_RANKS_PATH = "ranks_path"  # {split: "train/ranks"}
KEY_BYTES_PER_MICROBATCH = "bytes_per_microbatch"
# {split: {micro_batch_size, sampler, bytes_per_microbatch}}: the sampler that reads each split
# (evaluation on its own micro-batch size and sampler: Megatron-Bridge, docs/bridge.md)
KEY_SPLIT_LAYOUTS = "split_layouts"


# -- the C core's copy ----------------------------------------------------------------


def c_header() -> str:
    """native/mmfs_contract.h: the facts above the C core needs, as #defines
    (written by native/build_native.py before each build)."""
    return "\n".join([
        "/* Generated from mmfs/mount/contract.py by native/build_native.py: do not edit. */",
        "#ifndef MMFS_CONTRACT_H",
        "#define MMFS_CONTRACT_H",
        f'#define MMFS_FILE_SUFFIX "{FILE_SUFFIX}"',
        "#endif",
        "",
    ])
