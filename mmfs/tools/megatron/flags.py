"""Megatron-LM's launch flags that touch the data, and what `mmfs config
--from-megatron` does with each (docs/config.md lists them; its test checks the list
against these tables).

Every flag of Megatron-LM core_v0.19.0's arguments.py and of main's (with the
dataclasses they are made from) that changes which samples a rank reads, or how
they are packed, is here (--phase-transition-iterations: phase_args.py):
read (HONOURED), refused in one line where the config could
not be right (REFUSED: Megatron reads other samples than any view shows), or written
with a comment and a warning where it can still be right but some views then do not
show what a rank trains on (WARNED). Flags that change only a batch's fields or how
Megatron loads are named in a comment (NOTED). Every other flag (model, optimiser,
logging, checkpointing, --iterations-to-skip, whose batches Megatron still reads) is
ignored silently. --use-varlen-dataset and --sequence-packing-scheduler are Megatron-LM
main's (its VarlenDataset and data_schedule.py name them; the arguments.py of main at
d98e8a64dd, 2026-08-22, does not add them yet): refused and warned by name.
"""

from __future__ import annotations

# flag -> number of values (None: Megatron's nargs='*', up to the next flag)
HONOURED = {
    "--data-path": None, "--train-data-path": None, "--valid-data-path": None, "--test-data-path": None,
    "--data-args-path": 1, "--per-split-data-args-path": 1, "--split": 1, "--seq-length": 1,
    "--encoder-seq-length": 1,
    "--seed": 1, "--micro-batch-size": 1, "--global-batch-size": 1, "--rampup-batch-size": 3,
    "--step-batch-size-schedule": 1, "--train-iters": 1, "--train-samples": 1, "--eval-interval": 1,
    "--eval-iters": 1, "--dataloader-type": 1, "--no-data-sharding": 0, "--data-cache-path": 1,
    "--mid-level-dataset-surplus": 1, "--tokenizer-type": 1, "--tokenizer-model": 1, "--vocab-size": 1,
    "--vocab-file": 1, "--merge-file": 1, "--tiktoken-pattern": 1, "--null-tokenizer-eod-id": 1,
    "--null-tokenizer-pad-id": 1,
    "--world-size": 1, "--max-position-embeddings": 1,
    "--tensor-model-parallel-size": 1, "--pipeline-model-parallel-size": 1,
    "--context-parallel-size": 1, "--object-storage-cache-path": 1, "--nproc_per_node": 1,
    "--nproc-per-node": 1, "--nnodes": 1,
}

# Data arguments that do not change which samples Megatron reads, with why.
NOTED = {
    "--reset-position-ids": "a batch field: pass reset_position_ids to mmfs.loader's megatron_batches",
    "--reset-attention-mask": "a batch field: pass reset_attention_mask to mmfs.loader's megatron_batches",
    "--eod-mask-loss": "a batch field: pass eod_mask_loss to mmfs.loader's megatron_batches",
    "--no-create-attention-mask-in-dataloader": "a batch field: pass create_attention_mask=False to "
                                                 "mmfs.loader's megatron_batches",
    "--dataloader-inter-document-masking": "a batch field (cu_seqlens): pass inter_document_masking to "
                                           "mmfs.loader's megatron_batches",
    "--num-workers": "how Megatron's DataLoader runs, not what it reads",
    "--num-dataset-builder-threads": "how Megatron builds its indices, not what they hold",
    "--no-mmap-bin-files": "how Megatron reads the .bin files, not what it reads",
    "--dataloader-fast-cache-load": "how Megatron loads its index cache, not what it holds",
    "--dataloader-defer-npy-index-mmap": "how Megatron loads its index cache, not what it holds",
    "--make-vocab-size-divisible-by": "pads the model's embedding, not the data",
}

# Flags after which Megatron reads other samples than any view of the config shows: refused.
REFUSED = {
    "--mock-data": "Megatron trains on generated mock samples, not on files; no view shows them",
    "--fim-data": "Megatron's FIM dataset rewrites every sample (fill-in-the-middle), so samples/ and every "
                  "view would show the tokens before it",
    "--sft": "Megatron reads conversations through its SFTDataset (packed, its own loss masks), not GPT samples",
    "--use-varlen-dataset": "Megatron-LM main's VarlenDataset reads conversations from JSONL, Parquet or the "
                            "Hugging Face hub, tokenized on the fly and unpadded, not GPT samples",
    "--perform-rl-step": "RL training reads the rollouts it generates; no data loader reads --data-path",
    "--per-dataset-sequences-path": "mmfs reads the sequence counts from the .idx files",
    "--multiple-validation-sets": "each --valid-data-path dataset is then its own validation set; valid/ and "
                                  "which --split valid show one validation split",
    "--full-validation": "Megatron then evaluates the whole valid split, one sample per rank per micro-batch "
                         "(MegatronFullValidationSampler); valid/ holds the sampled valid split",
    "--decrease-batch-size-if-needed": "the global batch would depend on the layout",
    "--eval-global-batch-size": "mmfs sizes evaluation with the global batch size",
    "--eval-micro-batch-size": "mmfs sizes evaluation with the micro-batch size",
    "--skip-train": "mmfs derives the validation count from the training run",
    "--start-eval-at-iter": "mmfs derives the validation count from every eval interval",
    "--allow-ambiguous-pad-tokens": "mmfs keeps megatron-core's default pad handling",
    "--tokenizer-metadata": "give the tokenizer by --tokenizer-type and its files",
}

# Flags after which the samples are the config's, but some views do not show what a rank
# trains on: the config is written with this line as a comment and a warning on stderr.
WARNED = {
    "--hybrid-context-parallel": "Megatron reroutes sub-samples between the data x context parallel ranks at "
                                 "every step (HybridCPDataLoaderWrapper, train only), so the config says "
                                 "training.hybrid_context_parallel and the mount does not serve train/ranks/ nor "
                                 "train/streams/; mmfs which says its rank answers are the samplers' (the samples "
                                 "of each global batch are the same)",
    "--sequence-packing-scheduler": "Megatron-LM main's packing scheduler (dp_balanced) re-deals each global "
                                    "batch's samples between the data x context parallel ranks and changes the "
                                    "micro-batches per step, so ranks/, streams/ and which show what each rank's "
                                    "sampler reads, not the packed micro-batches it trains on (the samples of "
                                    "each global batch are the same)",
}
def warned_line(flag: str) -> str:
    return f"{flag}: {WARNED[flag]}"


def refused_line(flag: str) -> str:
    return f"{flag}: mmfs cannot serve it ({REFUSED[flag]})"


# The other flags of Megatron-LM's data group, its SFT group and its training and validation
# configs (tests/reference/megatron_data_flags.json), with why they change nothing a view shows:
# ignored silently, as every flag outside those groups.
_SILENT_GROUPS = {
    "read by other models' datasets (BERT, T5), not by pretrain_gpt.py's GPTDataset": (
        "--decoder-seq-length", "--sample-rate", "--mask-prob", "--short-seq-prob"),
    "read only with --fim-data (refused)": (
        "--fim-rate", "--fim-spm-rate", "--fim-split-sample", "--fim-fragment-rate", "--fim-no-prefix",
        "--fim-prefix-token", "--fim-middle-token", "--fim-suffix-token", "--fim-pad-token", "--fim-eod-token"),
    "read only with --sft (refused)": ("--sft-tokenizer-prompt-format",),
    "read only with --multiple-validation-sets (refused)": ("--validation-set-names",),
    "how the training loop runs, not what a rank reads": (
        "--empty-unused-memory-level", "--check-weight-hash-across-dp-replicas-interval", "--gpu-sniff-test-interval",
        "--train-sync-interval", "--manual-gc", "--manual-gc-interval", "--no-manual-gc-eval", "--test-mode"),
    "when a job stops; the relaunch resumes at its consumed samples": (
        "--exit-interval", "--exit-duration-in-mins", "--exit-signal-handler", "--exit-signal",
        "--exit-signal-handler-for-dataloader", "--exit-signal-handler-for-training"),
    "Megatron still reads a skipped iteration's micro-batches (dummy_train_step)": ("--iterations-to-skip",),
}
SILENT = {flag: why for why, flags in _SILENT_GROUPS.items() for flag in flags}
