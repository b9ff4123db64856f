"""`mmfs config --from-megatron LAUNCH0 --next-phase LAUNCH1 ...`: a Megatron-LM run
in phases (`--phase-transition-iterations`, one launch per phase) as a `phases:`
config with `phase_mode: restart` (docs/phases.md).

Megatron-LM trains such a run as one launch per phase: every launch holds the same
--phase-transition-iterations T1,T2,..., the job saves a checkpoint and exits at
each Ti, and the user relaunches with the next phase's data arguments. Phase k's
train split is the BlendedDataset of its own --data-path, sized
(T[k+1] - T[k]) x global_batch_size (the last phase ends at --train-samples) and
read from its first sample. Each LAUNCH is a launch line's arguments or @FILE,
as for one launch; they may differ only in their data arguments.
"""

from __future__ import annotations

import sys
from typing import Any

from mmfs.config.blend import MAX_ARGS_FILE
from mmfs.storage import StorageError
from mmfs.storage.file import read_text_file
from mmfs.tools.megatron.args import MegatronArgsError, expand_args, print_warnings, render, to_config
from mmfs.tools.megatron.run_check import run_warnings

NEXT_PHASE = "--next-phase"
TRANSITIONS = "--phase-transition-iterations"
DATA_KEYS = ("data_path", "data_args_path", "blend_per_split", "per_split_data_args_path")

CONTINUE_NOTE = [
    "phase_mode: restart is what these launches train on: each phase's blend is built from its own",
    "arguments alone and read from its first sample, so a dataset kept from one phase to the next",
    "serves again the samples the earlier phases trained on (`mmfs phases` counts them).",
    "phase_mode: continue (mmfs's default) would go on in each dataset from where the earlier",
    "phases left it, in its own Megatron order: nothing served twice until a dataset is used up.",
    "Megatron-LM has no flag for that; train on the mount with --dataloader-type external",
    "(mmfs.adapters.megatron, docs/megatron.md).",
    "Megatron rebuilds valid and test in each launch from that phase's --data-path: the mount",
    "serves each phase's own under valid/phases/ and test/phases/ (valid/ and test/ are the first's).",
]


def wants_phases(argv: list[str]) -> bool:
    """Whether the arguments describe a run in phases (a separator or the flag)."""
    return NEXT_PHASE in argv or any(a == TRANSITIONS or a.startswith(TRANSITIONS + "=") for a in argv)


def _launches(argv: list[str]) -> list[list[str]]:
    out: list[list[str]] = [[]]
    for arg in argv:
        if arg == NEXT_PHASE:
            out.append([])
        else:
            out[-1].append(arg)
    if any(not launch for launch in out):
        raise MegatronArgsError(f"{NEXT_PHASE}: an empty launch; give each phase's arguments (or @FILE) "
                                f"between the {NEXT_PHASE} separators")
    return out


def _transitions(words: list[str], k: int) -> tuple[list[int] | None, list[str]]:
    """(the launch's sorted transitions or None, its words without the flag)."""
    rest, value = [], None
    i = 0
    while i < len(words):
        flag, eq, inline = words[i].partition("=")
        if flag != TRANSITIONS:
            rest.append(words[i])
            i += 1
            continue
        if eq:
            value, i = inline, i + 1
        elif i + 1 < len(words) and not words[i + 1].startswith("--"):
            value, i = words[i + 1], i + 2
        else:
            raise MegatronArgsError(f"{TRANSITIONS} (launch {k}): expected a value like 1000,3000")
    if value is None:
        return None, rest
    try:  # Megatron-LM's validate_args: sorted(int(x.strip()) for x in value.split(","))
        its = sorted(int(x.strip()) for x in value.split(","))
    except ValueError:
        raise MegatronArgsError(f"{TRANSITIONS} {value!r} (launch {k}): not comma-separated iterations "
                                "(Megatron's int() fails)") from None
    return its, rest


def _phase_data(config: dict[str, Any], k: int) -> dict[str, Any]:
    """A launch's train blend as a phase's `data_path` words (with their weights)."""
    if "data_path" in config:
        words = list(config["data_path"])
    elif "data_args_path" in config:
        path = config["data_args_path"]
        try:  # whole (it was cut at 16 MiB), and a FIFO or /dev/zero refused (it hung)
            words = read_text_file(path, MAX_ARGS_FILE, "arguments file").split()
        except StorageError as exc:
            raise MegatronArgsError(f"{exc} (launch {k}'s --data-args-path)") from None
    else:
        raise MegatronArgsError(f"launch {k}: give --data-path or --data-args-path: phases change the train "
                                "blend of one data path (per-split paths cannot be phased)")
    if len(words) > 1 and not _weighted(words):
        raise MegatronArgsError(f"launch {k}'s data path: give each dataset a weight (\"0.7 web 0.3 code\"): "
                                "a phase blends its datasets by weight")
    return {"data_path": words}


def _weighted(words: list[str]) -> bool:
    if len(words) % 2:
        return False
    try:
        [float(w) for w in words[0::2]]
    except ValueError:
        return False
    return True


def to_phased_config(argv: list[str], environ: dict | None = None) -> tuple[dict[str, Any], list[str]]:
    """(the YAML config with `phases:`, comment lines) for one launch per phase."""
    launches = _launches(argv)
    parsed = []
    for k, launch in enumerate(launches):
        its, rest = _transitions(expand_args(launch), k)
        if its is None:
            raise MegatronArgsError(f"launch {k}: {TRANSITIONS} missing: every launch of a run in phases "
                                    "holds the same list")
        parsed.append((its, to_config(rest, environ)))
    transitions = parsed[0][0]
    for k, (its, _) in enumerate(parsed):
        if its != transitions:
            raise MegatronArgsError(f"launch {k}: {TRANSITIONS} {','.join(map(str, its))} is not launch 0's "
                                    f"{','.join(map(str, transitions))}: every launch holds the same list")
    if len(launches) != len(transitions) + 1:
        raise MegatronArgsError(f"{TRANSITIONS} {','.join(map(str, transitions))}: {len(transitions) + 1} phases, "
                                f"but {len(launches)} launch(es); give one per phase, separated by {NEXT_PHASE}")
    if transitions[0] <= 0 or len(set(transitions)) != len(transitions):
        raise MegatronArgsError(f"{TRANSITIONS} {','.join(map(str, transitions))}: phases start after iteration 0, "
                                "each at its own iteration")
    phases = []
    for k, (_, (config, _)) in enumerate(parsed):
        phase = _phase_data(config, k)
        phases.append(phase if k == 0 else {"start_iteration": transitions[k - 1], **phase})
    first, comments = parsed[0][1]
    for _, (_, more) in parsed[1:]:  # a flag named in a later launch only is said too
        comments += [c for c in more if c not in comments]
    shared = {key: v for key, v in first.items() if key not in DATA_KEYS}
    for k, (_, (config, _)) in enumerate(parsed[1:], start=1):
        other = {key: v for key, v in config.items() if key not in DATA_KEYS}
        for key in sorted(set(shared) | set(other)):
            if shared.get(key) != other.get(key):
                raise MegatronArgsError(f"launch {k}: its {key} is not launch 0's: a phase changes only the "
                                        "data path (every other argument is the run's)")
    training = shared.get("training", {})
    if "global_batch_size" not in training:
        raise MegatronArgsError(f"{TRANSITIONS}: needs a fixed global batch size (Megatron-LM's help says so); "
                                "drop --step-batch-size-schedule")
    if "train_samples" not in training:
        raise MegatronArgsError(f"{TRANSITIONS}: give --train-samples, not --train-iters: Megatron-LM ends the "
                                "last phase at args.train_samples (None with --train-iters, and its phase "
                                "code fails)")
    last = transitions[-1] * training["global_batch_size"]
    if last >= training["train_samples"]:
        raise MegatronArgsError(f"{TRANSITIONS} {','.join(map(str, transitions))}: iteration {transitions[-1]:,} "
                                f"starts at sample {last:,}, at or past --train-samples {training['train_samples']:,}"
                                "; that phase would train on nothing: drop it or train longer")
    out = {**first, "phases": phases, "phase_mode": "restart"}
    for key in DATA_KEYS:
        out.pop(key, None)
    return out, [*comments, *CONTINUE_NOTE]


def config_command(args) -> int:
    """`mmfs config --from-megatron ...`: one launch, or one per phase."""
    argv = args.from_megatron
    config, comments = (to_phased_config if wants_phases(expand_args(argv)) else to_config)(argv)
    print_warnings(comments)
    text = render(config, comments)
    epochs = run_warnings(text)
    sys.stdout.write(text + "".join(f"# warning: {line}\n" for line in epochs))
    return 0
