"""The `mmfs` command: argparse only; each subcommand calls one function of the
module that does the work. User errors (MmfsError) print one line, exit 2."""

import argparse
import importlib
import logging
import os
import signal
import sys
from typing import NoReturn

# No mmfs command does linear algebra, but numpy's OpenBLAS starts a thread per CPU
# that spins for a while after start-up: 0.1 CPU-s of every command, and of each of
# many builders sharing a cache. Set before anything imports numpy; a user's
# setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from mmfs import __version__  # noqa: E402 - after the setting above
from mmfs.config.schema import SPLITS  # noqa: E402
from mmfs.errors import MmfsError, descriptors_exhausted, out_of_descriptors  # noqa: E402
from mmfs.mount.options import options_help  # noqa: E402

# Characters that end a line (str.splitlines): escaped in an error message, so that
# a file name holding one still gives a single line.
_LINE_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}

# subcommand -> "module:function"; the function takes the parsed args and
# returns an exit code.
COMMANDS = {
    "info": "mmfs.formats.report:info_command",
    "verify": "mmfs.formats.verify:verify_command",
    "build": "mmfs.tools.build:build_command",
    "sample": "mmfs.tools.build:sample_command",
    "mount": "mmfs.mount.lifecycle:mount_command",
    "umount": "mmfs.mount.lifecycle:umount_command",
    "bench": "mmfs.tools.bench:bench_command",
    "which": "mmfs.tools.which:which_command",
    "resume-check": "mmfs.tools.resume_check:resume_check_command",
    "phases": "mmfs.tools.phases:phases_command",
    "config": "mmfs.tools.megatron.bridge:config_command",  # --from-bridge; else phase_args' (one launch or per phase)
    "preprocess": "mmfs.tools.preprocess.command:preprocess_command",
    "report": "mmfs.tools.report.command:report_command",
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag or value is one line (`mmfs which: error: ...`) and
    exit 2, as every other user error; --help still prints the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message.translate(_LINE_BREAKS)}; "
                     f"see `{self.prog} --help`\n")


def add_command(sub, common: argparse.ArgumentParser, name: str, summary: str, more: str):
    """A subcommand whose `--help` starts with what it does: `summary` is its line in
    `mmfs --help`, and, as a sentence with `more` after it, the top of its own help."""
    sentence = summary[0].upper() + summary[1:] + ("" if summary.endswith("?") else ".")
    return sub.add_parser(name, parents=[common], help=summary, description=f"{sentence} {more}")


def add_verbosity(parser: argparse.ArgumentParser, default) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-v", "--verbose", action="store_true", default=default, help="log more")
    group.add_argument("-q", "--quiet", action="store_true", default=default, help="log only errors")


def add_which_position(p: argparse.ArgumentParser) -> None:
    """`mmfs which`: the global batch asked about, by iteration or by consumed_samples."""
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--iteration", type=int, help="Megatron's iteration number (from 1; follows the "
                                                     "training: block's batch-size schedule)")
    group.add_argument("--consumed", type=int, metavar="C",
                       help="the global batch that starts at consumed_samples C (as a checkpoint holds it)")


def add_config_parser(sub, common: argparse.ArgumentParser) -> None:
    """`mmfs config --from-megatron ARGS...`: the YAML config for Megatron-LM's arguments."""
    p = add_command(sub, common, "config", "print the YAML config of Megatron-LM launch arguments",
                    "Flags that change which samples a rank reads and that mmfs does not model are refused or "
                    "warned about, naming the flag (docs/config.md).")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-megatron", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="Megatron-LM's arguments (pretrain_gpt.py's), or @FILE holding them; the rest of the "
                             "line. A run in phases (--phase-transition-iterations): one launch per phase, separated "
                             "by --next-phase")
    source.add_argument("--from-bridge", nargs="+", metavar="RUN_CONFIG.yaml [KEY=VALUE",
                        help="a Megatron-Bridge checkpoint's run_config.yaml and run_recipe.py's KEY=VALUE overrides "
                             "(docs/bridge.md)")
    bridge = p.add_argument_group("with --from-bridge")
    size = bridge.add_mutually_exclusive_group()
    size.add_argument("--world-size", type=int, metavar="N", help="the job's world size (default: WORLD_SIZE)")
    size.add_argument("--data-parallel-size", type=int, metavar="D", help="the job's data-parallel size")
    bridge.add_argument("--train-state", metavar="FILE",
                        help="a checkpoint's train_state.pt (read with torch): where the resumed job reads from")
    bridge.add_argument("--consumed-train-samples", type=int, metavar="C", help="the same without torch")
    bridge.add_argument("--consumed-valid-samples", type=int, metavar="V", default=0, help="(with the above)")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="mmfs", description="Megatron-LM training samples as a read-only file system."
    )
    parser.add_argument("--version", action="version", version=f"mmfs {__version__}")
    add_verbosity(parser, default=False)
    # -v/-q also after the subcommand (`mmfs mount C M -v`); SUPPRESS keeps a flag
    # given before it.
    common = OneLineParser(add_help=False)
    add_verbosity(common, default=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=OneLineParser)

    p = add_command(sub, common, "info", "describe a dataset (.idx/.bin prefix or .pbin)",
                    "Its format (found by content), token dtype, sequence and document counts, and length "
                    "statistics.")
    p.add_argument("path", help="dataset prefix, .idx, .bin or .pbin file")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")

    p = add_command(sub, common, "verify", "check every pointer, length and index of a dataset",
                    "Reads the whole index in bounded memory; exit 0 when sound, 2 naming the first bad byte "
                    "offset.")
    p.add_argument("path", help="dataset prefix, .idx, .bin or .pbin file")

    p = add_command(sub, common, "build", "build (or load) the sample indices of a config",
                    "Builds megatron-core's document, sample, shuffle and blending indices into the index cache "
                    "(cache_dir, Megatron's --data-cache-path) and summarises each split; a later build, mount "
                    "or Megatron job with the same arguments loads them.")
    p.add_argument("config", help="YAML config")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.add_argument("-j", "--jobs", type=int, default=None,
                   help="indices built at once (default: one per CPU)")

    p = add_command(sub, common, "sample", "print one sample's tokens and provenance",
                    "As JSON: the tokens GPTDataset gives for the index, and the dataset, sequences and "
                    "offsets they were cut from.")
    p.add_argument("config", help="YAML config")
    p.add_argument("index", type=int, help="sample index in the split")
    p.add_argument("--split", default="train", choices=SPLITS, help="the split (default: train)")

    p = add_command(sub, common, "mount", "mount a config's samples as files",
                    "Builds or loads the indices, mounts them read-only at MOUNTPOINT and returns once the "
                    "mount serves (the daemon stays in the background; `mmfs umount` ends it). The tree, "
                    "names and mmfs.json are a contract: docs/mount.md.")
    p.add_argument("config", help="YAML config")
    p.add_argument("mountpoint", help="an empty directory")
    p.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground")
    p.add_argument("-o", dest="options", metavar="OPT[,OPT...]", default="",
                   help="comma-separated options: " + options_help() + "; any other goes to libfuse as given")
    p.add_argument("--log", help="daemon log file (default: printed at mount time)")

    p = add_command(sub, common, "umount", "unmount an mmfs mount (also a stale one)",
                    "Ends the daemon and removes the mount; a mount whose daemon died is cleared too.")
    p.add_argument("mountpoint", help="the folder the mount is on")
    p.add_argument("--lazy", action="store_true", help="detach a busy mount now")

    p = add_command(sub, common, "bench", "measure read speed of a mount or a config",
                    "Reads sample files (or micro-batch files) with several reader processes and prints "
                    "samples/s and MB/s beside the alternatives (docs/benchmarks.md).")
    p.add_argument("target", help="a mounted mmfs directory or a YAML config")
    p.add_argument("-n", "--samples", type=int, default=20000, help="samples per pass")
    p.add_argument("--readers", default="1,2,4", help="reader process counts")
    p.add_argument("-o", dest="options", default="",
                   help="mount options when benching a config (as for mmfs mount)")
    p.add_argument("--microbatches", metavar="SIZES",
                   help="instead: rank 0's micro-batch files of these sizes (e.g. 4,8) vs sample files")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")

    p = add_command(sub, common, "which",
                    "which samples (and documents, tokens) each rank read at a training iteration",
                    "Follows the training: block (samplers, batch-size schedule, phases) as Megatron's loader "
                    "does; for valid and test, the evaluation at that iteration.")
    p.add_argument("target", help="a YAML config with a training: block, or an mmfs mount")
    add_which_position(p)
    p.add_argument("--rank", type=int, help="one data-parallel rank (default: every rank)")
    p.add_argument("--split", default="train", choices=SPLITS, help="the split (default: train)")
    p.add_argument("--microbatch", type=int, help="one micro-batch of the iteration (default: all)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument("--text", action="store_true", help="decode each piece's tokens")
    p.add_argument("--tokenizer", help="a Hugging Face tokenizer.json (or folder) for --text "
                   "(default: the config's tokenizer.type)")

    p = add_command(sub, common, "resume-check",
                    "does a job resumed on another layout read every sample exactly once?",
                    "Exit 0 when it does, 1 with the counts of samples repeated and skipped when not "
                    "(docs/streams.md).")
    p.add_argument("config", help="the YAML config the job ran with (its training: block)")
    p.add_argument("--consumed", type=int, required=True, help="consumed_samples at the checkpoint")
    p.add_argument("--to", metavar="dp=D,mbs=M[,sampler=single|cyclic][,sharding=true|false]",
                   help="the layout the job resumes on")
    p.add_argument("--to-config", metavar="NEW_CONFIG",
                   help="the config the job resumes with (a phase added or changed at the resume point)")
    p.add_argument("--split", default="train", choices=SPLITS, help="the split (default: train)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p = add_command(sub, common, "phases", "what each phase of a run in phases draws from each dataset",
                    "Per phase: where it starts, each dataset's weight, draws, realised share, position and what "
                    "is left, and samples served again (docs/phases.md).")
    p.add_argument("config", help="a YAML config with a phases: list")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    add_config_parser(sub, common)

    p = add_command(sub, common, "report",
                    "the training mix as one self-contained HTML page (or --json figures)",
                    "Weights against realised shares, epochs, the mix over the run, document lengths, each "
                    "rank's shares, the samples of any iteration and warnings; the page opens from disk with "
                    "no network (docs/report.md).")
    p.add_argument("target", help="a YAML config, or an mmfs mount")
    p.add_argument("-o", dest="output", metavar="FILE.html", help="where to write the page (default: report.html)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead")
    p.add_argument("--iterations", metavar="I,J,...", type=_integers,
                   help="the iterations the page's sample browser holds (default: up to 24 across the run)")

    p = add_command(sub, common, "preprocess",
                    "tokenize JSONL or Parquet into IndexedDatasets (Megatron's tools/preprocess_data.py)",
                    "Byte for byte what Megatron-LM's tool writes, with its flags (docs/preprocess.md).")
    from mmfs.tools.preprocess import add_arguments
    add_arguments(p)
    return parser


def _integers(text: str) -> list[int]:
    """I,J,...: a comma-separated list of whole numbers."""
    try:
        return [int(word) for word in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:60]!r} is not a comma-separated list of whole numbers") from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.program = argv is None  # run as the program (its end is the process's), not called from Python
    level = logging.DEBUG if args.verbose else logging.ERROR if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="mmfs: %(message)s", stream=sys.stderr)
    module_name, func_name = COMMANDS[args.command].split(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        code = int(func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except MmfsError as exc:
        # An open that found no descriptor left, in whatever words the error put it: the limit instead.
        line = out_of_descriptors(exc) or str(exc)
        print(f"mmfs: error: {line.translate(_LINE_BREAKS)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # A build drops what it staged and its locks before this (Builder._run); a
        # second Ctrl-C now would only cut this line short with a traceback.
        if args.program:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        print(f"mmfs: {args.command} interrupted; nothing half-built was kept in the index cache", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`mmfs sample ... | head`): stop quietly, as a tool
        # killed by SIGPIPE would; stdout goes to /dev/null so the final flush is silent.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + 13
    except OSError as exc:  # out of file descriptors: one line naming the limit, never a traceback
        line = descriptors_exhausted(exc)
        if line is None:
            raise
        print(f"mmfs: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
