/* mmfs native core: Megatron's index builders and the sample reader.
 *
 * Every function validates its inputs and returns 0 (or a count) on success
 * and a negative MMFS_E* code on failure; none aborts, none reads or writes
 * outside the buffers it is given. Token counts are int64 throughout.
 */
#ifndef MMFS_NATIVE_H
#define MMFS_NATIVE_H
#include <stdint.h>

#define MMFS_OK 0
#define MMFS_E_ARG -1          /* a size or length argument is out of range */
#define MMFS_E_DOC_RANGE -2    /* a document id is outside the sequence array */
#define MMFS_E_NEG_LENGTH -3   /* a sequence length is negative */
#define MMFS_E_OUT_SIZE -5     /* the output buffer has the wrong size */
#define MMFS_E_BIN_RANGE -6    /* a sequence lies outside the token file */
#define MMFS_E_INDEX_RANGE -7  /* a sample/document index entry is out of range */
#define MMFS_E_OVERFLOW -8     /* a value does not fit the index dtype */
#define MMFS_E_IO -9           /* reading a file failed (short: it shrank) */
#define MMFS_E_NOMEM -10       /* an allocation failed */
#define MMFS_E_UNSUPPORTED -11 /* input outside what this reader knows (a caller falls back) */
/* -12, MMFS_E_CHANGED: see mmfs_files.h */

/* What the last failed read of this thread was doing, for a message that
 * names the file, the sequence and the byte offset (file 0 / seq -1: none). */
typedef struct {
    int32_t code;        /* the MMFS_E_* code */
    int64_t file;        /* the local file (its id in mmfs_files.h) a read failed on */
    int64_t byte;        /* its byte offset, or the bad pointer */
    int64_t seq;         /* the sequence concerned */
    int64_t value;       /* the bad length or entry */
} mmfs_error;

/* Copy this thread's last error into out. */
void mmfs_last_error(mmfs_error *out);

/* The readers' block caches (1 MiB each, see mmfs_readers.c): one per thread that
 * read index entries with pread, given back to a shared pool when the thread ends
 * (libfuse starts and ends worker threads as load comes and goes), so their number
 * follows the threads alive at once, never every thread that ever read. */
typedef struct {
    int64_t held;    /* held by threads alive now */
    int64_t pooled;  /* given back by threads that ended, for the next thread */
    int64_t made;    /* allocated so far (held + pooled + freed) */
    int64_t freed;   /* freed: the pool was full */
} mmfs_block_caches;

void mmfs_block_caches_get(mmfs_block_caches *out);

/* Number of samples Megatron's build_sample_idx produces (float32 ceil when
 * the last partial sample is kept, as its C++ does). Negative on bad input. */
int64_t mmfs_sample_count(int32_t num_epochs, int64_t tokens_per_epoch,
                          int32_t seq_length, int drop_last, int extra);

/* Fill out[(num_samples + 1) * 2] (int32 or int64, by wide) exactly as
 * Megatron's build_sample_idx does. */
int mmfs_build_sample_index(const int32_t *sizes, int64_t num_sizes,
                            const int32_t *doc_index, int64_t num_doc_index,
                            int32_t seq_length, int32_t num_epochs,
                            int64_t tokens_per_epoch, int drop_last, int extra,
                            void *out, int64_t out_rows, int wide);

/* Megatron's greedy blending index: weights[num_datasets], size entries. */
int mmfs_build_blending_index(const double *weights, int32_t num_datasets,
                              int64_t size, int16_t *dataset_index,
                              int64_t *dataset_sample_index);

/* Megatron's exhaustive blending index: every sample of every dataset once;
 * out arrays hold sum(sizes) entries. */
int mmfs_build_exhaustive_blending_index(const int64_t *sizes,
                                         int32_t num_datasets, int64_t total,
                                         int16_t *dataset_index,
                                         int64_t *dataset_sample_index);

/* A fetcher of bytes that are neither in memory nor in a local file (an object
 * in a bucket, or the in-memory test double): fill to[0..n) with bytes
 * [pos, pos + n) of the source behind ctx and return how many it filled (fewer
 * than n only at the source's end), or MMFS_E_IO when it cannot (the fetcher
 * logs why, naming the object and the byte range; the READ that asked gets EIO).
 * It may be called from any thread serving reads. */
typedef int64_t (*mmfs_fetch_fn)(void *ctx, int64_t pos, int64_t n, uint8_t *to);

/* An array the reader indexes. Its source kind:
 *   in memory      data != NULL
 *   a local file   data NULL, fetch NULL: file is its id in the open-files table
 *                  (mmfs_files.h), read with pread(2), so that a long-running
 *                  reader's resident memory does not grow with what its reads touch
 *                  (the bytes stay in the page cache, not in its page tables)
 *   fetched        data NULL, fetch != NULL: bytes come from fetch(fetch_ctx)
 * Index entries of the last two kinds go through a small block cache per thread.
 * Readers never look at the kind: they call array_bytes/array_entries. */
typedef struct {
    const uint8_t *data;  /* the elements in memory, or NULL */
    int64_t file;         /* a local file's id; fetched: unique to the source in the process
                           * (either keys the block cache) */
    int64_t offset;       /* byte offset of element 0 in the file or fetched source */
    int64_t count;        /* number of elements */
    int32_t dtype;        /* MMIDIDX code of the elements (1..9; 9 = uint32) */
    mmfs_fetch_fn fetch;  /* the fetched kind's fetcher */
    void *fetch_ctx;
} mmfs_array;

/* One token file with its sequence table. */
typedef struct {
    mmfs_array bytes;     /* the token file as uint8 (dtype 1) */
    int32_t dtype;        /* MMIDIDX code of the tokens; 9 = uint32 (.pbin) */
    mmfs_array lengths;   /* tokens per sequence */
    mmfs_array pointers;  /* byte offset of each sequence in bytes */
} mmfs_source;

/* One GPTDataset: its token file and its three indices. */
typedef struct {
    const mmfs_source *source;
    mmfs_array doc_index;     /* sequence ids, epoch after epoch */
    mmfs_array sample_index;  /* (num_samples + 1) rows of (doc_index position, offset) */
    mmfs_array shuffle_index; /* shuffled position -> unshuffled sample */
    int32_t extra;            /* add_extra_token_to_sequence */
    int64_t serial;           /* unique in the process, > 0 (keys a walk's resume point) */
} mmfs_gpt;

/* Consecutive samples of one GPTDataset of a split, in its shuffled order:
 * ids num_samples + first .. + first + count - 1 of the split are its samples
 * sample .. sample + count - 1 (see mmfs_split's beyond). */
typedef struct {
    int64_t first;   /* offset of the run's first id past num_samples */
    int64_t count;
    int64_t sample;  /* the GPTDataset's sample (before its shuffle) of the first id */
    int32_t gpt;     /* which of the split's GPTDatasets */
} mmfs_sample_run;

/* The samples of one split in training order: a GPTDataset, or a blend of
 * several (dataset_index.count > 0). A run in phases may hold samples past
 * num_samples that only a relaunched phase's cyclic sampler reads (its dataset is
 * longer than its share of the run): ids num_samples .. num_samples +
 * beyond_samples - 1, in num_beyond runs sorted by `first` (docs/phases.md). */
typedef struct {
    const mmfs_gpt *gpts;
    int32_t num_gpts;
    mmfs_array dataset_index;        /* blend: which GPTDataset (int16) */
    mmfs_array dataset_sample_index; /* blend: which of its samples (int64) */
    int64_t num_samples;
    int64_t sample_tokens;           /* tokens in every sample file */
    int64_t pad;                     /* fills a short last sample */
    int32_t out_dtype;               /* MMIDIDX code of the sample files */
    const mmfs_sample_run *beyond;   /* NULL when num_beyond is 0 */
    int32_t num_beyond;
    int64_t beyond_samples;          /* the ids past num_samples: the runs' counts summed */
} mmfs_split;

/* Training-order sample i of s (i < num_samples + beyond_samples) ->
 * (GPTDataset number, unshuffled sample). */
int mmfs_locate(const mmfs_split *s, int64_t i, int32_t *gpt, int64_t *k);

/* Write training-order sample i of s (sample_tokens tokens) into out; returns
 * the number of real (unpadded) tokens, or a negative error. */
int64_t mmfs_read_split_sample(const mmfs_split *s, int64_t i, void *out);

/* The (sequence, offset, length) pieces of unshuffled sample k: writes at
 * most max_pieces triples into pieces and returns how many there are. */
int64_t mmfs_sample_pieces(const mmfs_gpt *g, int64_t k, int64_t *pieces,
                           int64_t max_pieces);

/* A dataset's documents: document d is sequences [bounds[d], bounds[d + 1]);
 * bounds.count == 0 means every sequence is a document of its own. */
typedef struct {
    const mmfs_source *source;
    mmfs_array bounds;
} mmfs_documents;

/* A plan of micro-batch files of one split (mmfs/megatron/sampling/rankplan.py,
 * RankPlan): file j of data-parallel rank r holds the samples, for m in 0..mbs-1,
 *   single:    start + j*mbs*dp + r*mbs + m
 *   sharded:   r*bucket_size + permutation[start + j*mbs + m]
 *   unsharded: permutation[start + (j*mbs + m)*dp + r]
 *   phased:    the phase p with phases[p].first_file <= j (the last such), whose
 *              own plan (sharded or unsharded, over its own samples) gives ids
 *              x of file j - first_file, read as first_id + x below `listed`,
 *              beyond_id + x - listed from there (sampling/phaseplan.py)
 * (start is 0 for the rank views; a stream resumed at consumed_samples C
 * starts later in the split or in its epoch's permutation). */
#define MMFS_PLAN_SINGLE 0
#define MMFS_PLAN_SHARDED 1
#define MMFS_PLAN_UNSHARDED 2
#define MMFS_PLAN_PHASED 3

typedef struct mmfs_phase_plan mmfs_phase_plan;

typedef struct {
    int32_t kind;               /* MMFS_PLAN_* */
    int64_t micro_batch_size;
    int64_t data_parallel_size;
    int64_t files_per_rank;     /* the most files of a rank (rank 0's) */
    int64_t start;              /* see above */
    int64_t bucket_size;        /* entries in permutation (0 for single) */
    mmfs_array permutation;     /* randperm(bucket_size) of the epoch; count 0 for single */
    const mmfs_phase_plan *phases; /* phased: num_phases, sorted by first_file from 0 */
    int64_t num_phases;
} mmfs_rank_plan;

/* One phase of a phased plan: its own cyclic sampler's pass. */
struct mmfs_phase_plan {
    int64_t first_file;  /* the plan's file (of every rank) where the phase's files start */
    int64_t first_id;    /* the split id of the phase's sample 0 */
    int64_t listed;      /* the phase's samples in the split's own ids */
    int64_t beyond_id;   /* the split id of the phase's sample `listed` (past num_samples) */
    mmfs_rank_plan plan; /* sharded or unsharded, over the phase's samples */
};

/* out[0..micro_batch_size) = the sample ids of file j of rank r. */
int mmfs_microbatch_ids(const mmfs_rank_plan *plan, int64_t rank, int64_t j, int64_t *out);

/* One rank's micro-batch files of a split: file j holds its micro_batch_size
 * samples back to back. */
typedef struct {
    const mmfs_rank_plan *plan;
    const mmfs_split *split;
    int64_t rank;
} mmfs_microbatches;

/* Token readers of the mount's views (see mmfs_views.h): the number of tokens
 * in file `file` of ctx, and tokens [first, first + count) of it, written
 * into out in the view's dtype. A sample is padded with the split's pad;
 * sequences and documents are in their dataset's own dtype. The beyond reader's
 * file f is the split's sample num_samples + f. */
int64_t mmfs_split_length(const void *split, int64_t file);
int mmfs_split_tokens(const void *split, int64_t file, int64_t first, int64_t count,
                      uint8_t *out);
int64_t mmfs_sequence_length(const void *source, int64_t file);
int mmfs_sequence_tokens(const void *source, int64_t file, int64_t first, int64_t count,
                         uint8_t *out);
int64_t mmfs_microbatch_length(const void *microbatches, int64_t file);
int mmfs_microbatch_tokens(const void *microbatches, int64_t file, int64_t first, int64_t count,
                           uint8_t *out);
int64_t mmfs_beyond_length(const void *split, int64_t file);
int mmfs_beyond_tokens(const void *split, int64_t file, int64_t first, int64_t count,
                       uint8_t *out);
int64_t mmfs_document_length(const void *documents, int64_t file);
int mmfs_document_tokens(const void *documents, int64_t file, int64_t first, int64_t count,
                         uint8_t *out);


/* A .pbin index pickle (file bytes [start, end) of fd): a list of (offset,
 * length) pairs. With offsets NULL, counts the pairs into *count; else writes
 * offsets and lengths / token_size (at most capacity) after checking each pair
 * against data_len. MMFS_E_UNSUPPORTED for any other pickle; MMFS_E_INDEX_RANGE
 * for a bad pair: *count its index, *problem why (1 negative offset, 2 negative
 * length, 3 not a multiple of token_size, 4 too long, 5 past the data),
 * bad_value[0..1] the pair. */
int mmfs_parse_pickle_pairs(int fd, int64_t start, int64_t end, int64_t data_len,
                            int32_t token_size, int64_t *offsets, int32_t *lengths,
                            int64_t capacity, int64_t *count, int32_t *problem,
                            int64_t *bad_value);

#endif
