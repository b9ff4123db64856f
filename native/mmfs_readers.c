/* The readers: arrays of every source kind (memory, pread on a local file,
 * fetched through a callback) behind one block cache, and on top of them the
 * token readers of samples, micro-batches, sequences and documents. See
 * mmfs_native.h for the contract of each function. One file, so that the
 * compiler inlines the array reads into the readers' loops (the hot path of
 * every FUSE READ).
 */
#include "mmfs_native.h"
#include "mmfs_files.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

static int itemsize_of(int32_t code) {
    switch (code) {
    case 1: case 2: return 1;
    case 3: case 8: return 2;
    case 4: case 7: case 9: return 4;
    case 5: case 6: return 8;
    default: return 0;
    }
}

/* ---- errors ----------------------------------------------------------- */

static __thread mmfs_error last_error;

void mmfs_last_error(mmfs_error *out) {
    if (out) *out = last_error;
}

/* Record what failed (for the message) and return its code. */
static int fail(int code, int64_t file, int64_t byte, int64_t seq, int64_t value) {
    last_error = (mmfs_error){code, file, byte, seq, value};
    return code;
}

/* ---- arrays: in memory or read with pread ---------------------------- */

#define LOAD(T, p, i) ({ T v_; memcpy(&v_, (p) + (size_t)(i) * sizeof(T), sizeof(T)); v_; })

static double load_as_double(const uint8_t *p, int32_t code, int64_t i) {
    switch (code) {
    case 6: return LOAD(double, p, i);
    case 7: return LOAD(float, p, i);
    default: return 0.0;
    }
}

static int64_t load_as_int(const uint8_t *p, int32_t code, int64_t i) {
    switch (code) {
    case 1: return LOAD(uint8_t, p, i);
    case 2: return LOAD(int8_t, p, i);
    case 3: return LOAD(int16_t, p, i);
    case 4: return LOAD(int32_t, p, i);
    case 5: return LOAD(int64_t, p, i);
    case 8: return LOAD(uint16_t, p, i);
    case 9: return LOAD(uint32_t, p, i);
    default: return (int64_t)load_as_double(p, code, i);
    }
}

/* pread exactly n bytes at pos of local file `file`, retrying short reads and
 * EINTR. A file that ends early (it shrank under the reader) is MMFS_E_IO,
 * never a crash; one that is not the file registered, at the open or after the
 * read (a rewrite in place while it is open), MMFS_E_CHANGED. */
static int pread_all(int64_t file, uint8_t *to, int64_t n, int64_t pos) {
    int fd = mmfs_file_acquire(file);
    if (fd < 0) return fail(fd, file, pos, -1, fd == MMFS_E_IO ? errno : 0);
    int rc = MMFS_OK;
    int64_t start = pos;
    while (n > 0) {
        ssize_t got = pread(fd, to, (size_t)n, (off_t)pos);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            rc = fail(MMFS_E_IO, file, pos, -1, got < 0 ? errno : 0);
            break;
        }
        to += got;
        n -= got;
        pos += got;
    }
    if (rc < 0) {
        mmfs_file_release(file);
        return rc;
    }
    if ((rc = mmfs_file_release_unchanged(file, fd)) < 0) /* bytes of a rewrite: refused */
        fail(rc, file, start, -1, rc == MMFS_E_IO ? errno : 0);
    return rc;
}

/* Index entries read with pread go through a small block cache per thread:
 * the entries a sample needs (its sequences' lengths and pointers, its rows of
 * the indices) are scattered, but the blocks around them are read again and
 * again, and a block in the cache costs no system call. BLOCKS x BLOCK_SIZE
 * bytes per thread (1 MiB), taken on first use; token reads bypass it.
 *
 * libfuse's multithreaded loop starts and ends worker threads as load comes
 * and goes (hundreds over a day): a cache is given back to a pool shared by
 * all threads when its thread ends (a pthread key's destructor), and the next
 * thread takes it from there, so the caches number the threads alive at once,
 * never every thread that ever read. The pool keeps POOLED at most (the rest
 * is freed). Its blocks stay valid: a key names one array's file for the
 * process's life (ids are never reused). */
#define BLOCK_SIZE 16384
#define BLOCKS 64
#define POOLED 64

typedef struct {
    int64_t key;      /* block_key() of the array; 0: empty */
    int64_t number;   /* block number in the file */
    int32_t length;   /* bytes valid (less at the end of the file) */
    uint8_t data[BLOCK_SIZE];
} block;

static __thread block *blocks;

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static pthread_key_t pool_key;
static int pool_key_made;
static block *pool[POOLED];
static mmfs_block_caches caches;

/* A thread ends: its cache goes back to the pool (or is freed when the pool is full). */
static void give_back_cache(void *cache) {
    blocks = NULL; /* a read later in this thread's exit takes one again (and gives it back) */
    pthread_mutex_lock(&pool_lock);
    caches.held--;
    if (caches.pooled < POOLED) {
        pool[caches.pooled++] = cache;
    } else {
        free(cache);
        caches.freed++;
    }
    pthread_mutex_unlock(&pool_lock);
}

static void make_pool_key(void) {
    pool_key_made = pthread_key_create(&pool_key, give_back_cache) == 0;
}

/* This thread's cache (from the pool, or new), or NULL (no memory, or no key to give it back by). */
static block *take_cache(void) {
    pthread_once(&pool_once, make_pool_key);
    if (!pool_key_made) return NULL; /* it could never be given back: read without a cache */
    pthread_mutex_lock(&pool_lock);
    block *cache = caches.pooled > 0 ? pool[--caches.pooled] : NULL;
    int made = !cache && (cache = calloc(BLOCKS, sizeof(block))) != NULL;
    caches.made += made;
    caches.held += cache != NULL;
    pthread_mutex_unlock(&pool_lock);
    if (!cache) return NULL;
    if (pthread_setspecific(pool_key, cache) != 0) {
        give_back_cache(cache);
        return NULL;
    }
    return cache;
}

void mmfs_block_caches_get(mmfs_block_caches *out) {
    pthread_mutex_lock(&pool_lock);
    *out = caches;
    pthread_mutex_unlock(&pool_lock);
}

/* Local files and fetched sources number their `file` apart: the key tells them apart. */
static int64_t block_key(const mmfs_array *a) {
    return 2 * a->file + (a->fetch != NULL);
}

/* n bytes at byte pos of a's file or fetched source (not of its elements). */
static int source_read(const mmfs_array *a, uint8_t *to, int64_t n, int64_t pos) {
    if (!a->fetch) return pread_all(a->file, to, n, pos);
    if (a->fetch(a->fetch_ctx, pos, n, to) != n) return fail(MMFS_E_IO, 0, pos, -1, 0);
    return MMFS_OK;
}

/* Up to BLOCK_SIZE bytes at pos of a's source into to: how many there are (fewer at
 * its end), or a negative error. */
static int64_t read_block(const mmfs_array *a, uint8_t *to, int64_t pos) {
    if (a->fetch) {
        int64_t got = a->fetch(a->fetch_ctx, pos, BLOCK_SIZE, to);
        return got < 0 ? fail(MMFS_E_IO, 0, pos, -1, 0) : got;
    }
    int fd = mmfs_file_acquire(a->file);
    if (fd < 0) return fail(fd, a->file, pos, -1, fd == MMFS_E_IO ? errno : 0);
    ssize_t got;
    do {
        got = pread(fd, to, BLOCK_SIZE, (off_t)pos);
    } while (got < 0 && errno == EINTR);
    if (got < 0) {
        int saved = errno;
        mmfs_file_release(a->file);
        return fail(MMFS_E_IO, a->file, pos, -1, saved);
    }
    int same = mmfs_file_release_unchanged(a->file, fd); /* bytes of a rewrite: refused */
    return same < 0 ? fail(same, a->file, pos, -1, same == MMFS_E_IO ? errno : 0) : got;
}

/* n bytes of a's source at pos (within one block) from the block cache. */
static int cached_read(const mmfs_array *a, uint8_t *to, int64_t n, int64_t pos) {
    if (a->file <= 0) return source_read(a, to, n, pos);
    if (!blocks && !(blocks = take_cache())) return source_read(a, to, n, pos);
    int64_t number = pos / BLOCK_SIZE, at = pos - number * BLOCK_SIZE, key = block_key(a);
    block *b = &blocks[(uint64_t)(number * 31 + key) % BLOCKS];
    if (b->key != key || b->number != number) {
        b->key = 0;
        int64_t got = read_block(a, b->data, number * BLOCK_SIZE);
        if (got < 0) return (int)got;
        b->key = key;
        b->number = number;
        b->length = (int32_t)got;
    }
    if (at + n > b->length) /* past the end */
        return fail(MMFS_E_IO, a->fetch ? 0 : a->file, pos, -1, 0);
    memcpy(to, b->data + at, (size_t)n);
    return MMFS_OK;
}

/* Raw bytes of elements [first, first + n) of a into to. */
static int array_bytes(const mmfs_array *a, int64_t first, int64_t n, uint8_t *to) {
    int item = itemsize_of(a->dtype);
    if (!item || first < 0 || n < 0 || first > a->count || n > a->count - first)
        return fail(MMFS_E_INDEX_RANGE, 0, first, -1, a->count);
    if (a->data) {
        memcpy(to, a->data + first * item, (size_t)(n * item));
        return MMFS_OK;
    }
    return source_read(a, to, n * item, a->offset + first * item);
}

/* The same for index entries (a few at a time), through the block cache. */
static int array_entries(const mmfs_array *a, int64_t first, int64_t n, uint8_t *to) {
    int item = itemsize_of(a->dtype);
    if (a->data || !item || first < 0 || n < 0 || first > a->count || n > a->count - first)
        return array_bytes(a, first, n, to);
    int64_t pos = a->offset + first * item, left = n * item;
    while (left > 0) { /* block by block */
        int64_t in_block = BLOCK_SIZE - pos % BLOCK_SIZE;
        int64_t take = left < in_block ? left : in_block;
        int rc = cached_read(a, to, take, pos);
        if (rc < 0) return rc;
        to += take;
        pos += take;
        left -= take;
    }
    return MMFS_OK;
}

#define MAX_RUN 64 /* elements fetched at once by array_ints */

/* Elements [first, first + n) of an integer array as int64 (n <= MAX_RUN). */
static int array_ints(const mmfs_array *a, int64_t first, int64_t n, int64_t *out) {
    if (a->dtype == 6 || a->dtype == 7 || n > MAX_RUN) return MMFS_E_ARG;
    uint8_t raw[MAX_RUN * 8];
    int rc = array_entries(a, first, n, raw);
    if (rc < 0) return rc;
    for (int64_t i = 0; i < n; ++i) out[i] = load_as_int(raw, a->dtype, i);
    return MMFS_OK;
}

static int array_int(const mmfs_array *a, int64_t i, int64_t *out) {
    return array_ints(a, i, 1, out);
}

/* ---- dtype conversion --------------------------------------------------- */

#define STORE(T, p, i, v) do { T v_ = (T)(v); memcpy((p) + (size_t)(i) * sizeof(T), &v_, sizeof(T)); } while (0)

static void store_value(uint8_t *p, int32_t code, int64_t i, int64_t v, double d,
                        int is_float) {
    switch (code) {
    case 1: STORE(uint8_t, p, i, v); break;
    case 2: STORE(int8_t, p, i, v); break;
    case 3: STORE(int16_t, p, i, v); break;
    case 4: STORE(int32_t, p, i, v); break;
    case 5: STORE(int64_t, p, i, v); break;
    case 6: STORE(double, p, i, is_float ? d : (double)v); break;
    case 7: STORE(float, p, i, is_float ? d : (double)v); break;
    case 8: STORE(uint16_t, p, i, v); break;
    case 9: STORE(uint32_t, p, i, v); break;
    }
}

static void convert(const uint8_t *from, int32_t from_code, int64_t n,
                    uint8_t *to, int32_t to_code) {
    if (from_code == to_code) {
        memcpy(to, from, (size_t)n * itemsize_of(from_code));
        return;
    }
    int from_float = from_code == 6 || from_code == 7;
    if (to_code == 4 && from_code == 8) { /* the common widening: fast loop */
        for (int64_t i = 0; i < n; ++i) STORE(int32_t, to, i, LOAD(uint16_t, from, i));
        return;
    }
    for (int64_t i = 0; i < n; ++i) {
        if (from_float)
            store_value(to, to_code, i, 0, load_as_double(from, from_code, i), 1);
        else
            store_value(to, to_code, i, load_as_int(from, from_code, i), 0.0, 0);
    }
}

/* Tokens [first, first + n) of sequence seq of src (validated by the caller)
 * starting at byte `byte` of the token file, converted to out_dtype. */
static int copy_tokens(const mmfs_source *src, int64_t byte, int64_t n, uint8_t *to,
                       int32_t out_dtype) {
    int item = itemsize_of(src->dtype), out_item = itemsize_of(out_dtype);
    if (src->bytes.data) {
        convert(src->bytes.data + byte, src->dtype, n, to, out_dtype);
        return MMFS_OK;
    }
    if (src->dtype == out_dtype) return array_bytes(&src->bytes, byte, n * item, to);
    uint8_t chunk[1 << 14]; /* widen through a bounce buffer, a chunk at a time */
    int64_t per = (int64_t)sizeof chunk / item;
    for (int64_t done = 0; done < n;) {
        int64_t m = n - done < per ? n - done : per;
        int rc = array_bytes(&src->bytes, byte + done * item, m * item, chunk);
        if (rc < 0) return rc;
        convert(chunk, src->dtype, m, to + done * out_item, out_dtype);
        done += m;
    }
    return MMFS_OK;
}

/* The length of sequence seq of src. */
static int sequence_length(const mmfs_source *src, int64_t seq, int64_t *length) {
    int rc;
    if (!itemsize_of(src->dtype) || src->bytes.dtype != 1) return MMFS_E_ARG;
    if (seq < 0 || seq >= src->lengths.count || seq >= src->pointers.count)
        return fail(MMFS_E_DOC_RANGE, 0, -1, seq, seq);
    if ((rc = array_int(&src->lengths, seq, length)) < 0) return rc;
    if (*length < 0) return fail(MMFS_E_NEG_LENGTH, 0, -1, seq, *length);
    return MMFS_OK;
}

/* The first byte of sequence seq (of `length` tokens), checked against the
 * token file. */
static int sequence_byte(const mmfs_source *src, int64_t seq, int64_t length, int64_t *byte) {
    int item = itemsize_of(src->dtype);
    int rc = array_int(&src->pointers, seq, byte);
    if (rc < 0) return rc;
    if (*byte < 0 || *byte > src->bytes.count || (src->bytes.count - *byte) / item < length)
        return fail(MMFS_E_BIN_RANGE, 0, *byte, seq, length);
    return MMFS_OK;
}

/* ---- sample reader ---------------------------------------------------- */

/* Calls piece(ctx, seq, byte, offset, length, at) for each piece of
 * unshuffled sample k that overlaps tokens [t0, t1) of the sample: tokens
 * [offset, offset + length) of sequence seq, the first of them at `byte` of
 * the token file, land at token `at` of the sample. Only those pieces have
 * their pointers read and checked, so a READ of part of a long sample costs
 * about what its own pieces cost. */
typedef int (*piece_fn)(void *ctx, int64_t seq, int64_t byte, int64_t offset,
                        int64_t length, int64_t at);

/* Where the last walk of this thread stopped: the piece that reached the end
 * of its window. A reader that reads a sample in blocks asks for the next
 * block next, and the walk resumes there instead of from the first piece. */
static __thread struct {
    const mmfs_gpt *g;
    int64_t serial, k, pos, at;
    int64_t rows[4];
} resume;

static int walk_sample(const mmfs_gpt *g, int64_t k, int64_t t0, int64_t t1,
                       piece_fn piece, void *ctx) {
    if (!g || !g->source) return MMFS_E_ARG;
    const mmfs_source *src = g->source;
    int64_t num_samples = g->sample_index.count / 2 - 1;
    if (k < 0 || k >= num_samples) return MMFS_E_ARG;
    int64_t rows[4]; /* (position, offset) of sample k and of sample k + 1 */
    int64_t first, at; /* the first position to visit, and its token in the sample */
    int rc;
    if (resume.g == g && resume.serial == g->serial && g->serial > 0 && resume.k == k &&
        resume.at <= t0) {
        memcpy(rows, resume.rows, sizeof rows);
        first = resume.pos;
        at = resume.at;
    } else {
        if ((rc = array_ints(&g->sample_index, 2 * k, 4, rows)) < 0) return rc;
        first = rows[0];
        at = 0;
    }
    int64_t beg = rows[0], beg_off = rows[1], end = rows[2], end_off = rows[3];
    if (beg < 0 || end < beg || end >= g->doc_index.count || beg_off < 0 || end_off < 0)
        return fail(MMFS_E_INDEX_RANGE, 0, -1, -1, k);
    int64_t seqs[MAX_RUN];
    for (int64_t pos = first; pos <= end && at < t1; ++pos) {
        int64_t run = (pos - first) % MAX_RUN;
        if (run == 0) { /* the next run of sequence ids */
            int64_t n = end - pos + 1 < MAX_RUN ? end - pos + 1 : MAX_RUN;
            if ((rc = array_ints(&g->doc_index, pos, n, seqs)) < 0) return rc;
        }
        int64_t seq = seqs[run], seq_len, byte;
        if ((rc = sequence_length(src, seq, &seq_len)) < 0) return rc;
        int64_t offset = pos == beg ? beg_off : 0;
        int64_t length = pos == end ? end_off + g->extra - offset : seq_len - offset;
        if (length < 0 || offset + length > seq_len)
            return fail(MMFS_E_INDEX_RANGE, 0, -1, seq, offset + length);
        if (at + length > t0 || (length == 0 && at >= t0)) { /* empty pieces count too */
            if ((rc = sequence_byte(src, seq, offset + length, &byte)) < 0) return rc;
            byte += offset * itemsize_of(src->dtype);
            if ((rc = piece(ctx, seq, byte, offset, length, at)) < 0) return rc;
        }
        if (at + length >= t1) { /* the window ends in this piece: resume here */
            resume.g = g;
            resume.serial = g->serial;
            resume.k = k;
            resume.pos = pos;
            resume.at = at;
            memcpy(resume.rows, rows, sizeof rows);
        }
        at += length;
    }
    return MMFS_OK;
}

typedef struct {
    const mmfs_source *src;
    uint8_t *out;        /* receives tokens [t0, t1) of the sample */
    int32_t out_dtype;
    int64_t t0, t1;
    int64_t real;        /* tokens of the sample that are data (not padding) so far */
} read_ctx;

static int copy_piece(void *vctx, int64_t seq, int64_t byte, int64_t offset,
                      int64_t length, int64_t at) {
    (void)seq; (void)offset;
    read_ctx *ctx = vctx;
    int item = itemsize_of(ctx->src->dtype), out_item = itemsize_of(ctx->out_dtype);
    int64_t lo = at > ctx->t0 ? at : ctx->t0;
    int64_t hi = at + length < ctx->t1 ? at + length : ctx->t1;
    ctx->real = at + length;
    if (hi <= lo) return MMFS_OK;
    return copy_tokens(ctx->src, byte + (lo - at) * item, hi - lo,
                       ctx->out + (lo - ctx->t0) * out_item, ctx->out_dtype);
}

/* Tokens [t0, t1) of unshuffled sample k of g (sample_tokens long, padded
 * with pad) as out_dtype; returns the real tokens of the whole sample seen. */
static int64_t sample_window(const mmfs_gpt *g, int64_t k, int64_t sample_tokens,
                             int64_t pad, int32_t out_dtype, int64_t t0, int64_t t1,
                             uint8_t *out) {
    if (!g || !g->source || !out || t0 < 0 || t1 < t0 || t1 > sample_tokens ||
        !itemsize_of(out_dtype))
        return MMFS_E_ARG;
    read_ctx ctx = {g->source, out, out_dtype, t0, t1, 0};
    int rc = walk_sample(g, k, t0, t1, copy_piece, &ctx);
    if (rc < 0) return rc;
    if (ctx.real > sample_tokens) return fail(MMFS_E_INDEX_RANGE, 0, -1, -1, ctx.real);
    for (int64_t i = ctx.real > t0 ? ctx.real : t0; i < t1; ++i)
        store_value(out, out_dtype, i - t0, pad, (double)pad, 0);
    return ctx.real;
}

/* Sample num_samples + at of s, past its own: (GPTDataset, its sample) from the runs. */
static int locate_beyond(const mmfs_split *s, int64_t at, int64_t *d, int64_t *j) {
    if (!s->beyond || s->num_beyond < 1 || at < 0 || at >= s->beyond_samples) return MMFS_E_ARG;
    int32_t lo = 0, hi = s->num_beyond - 1;
    while (lo < hi) { /* the last run whose first id is at or before `at` */
        int32_t mid = lo + (hi - lo + 1) / 2;
        if (s->beyond[mid].first <= at) lo = mid; else hi = mid - 1;
    }
    const mmfs_sample_run *r = &s->beyond[lo];
    if (at < r->first || at - r->first >= r->count || r->sample < 0)
        return fail(MMFS_E_INDEX_RANGE, 0, -1, -1, s->num_samples + at);
    *d = r->gpt;
    *j = r->sample + (at - r->first);
    return MMFS_OK;
}

int mmfs_locate(const mmfs_split *s, int64_t i, int32_t *gpt, int64_t *k) {
    if (!s || !gpt || !k || !s->gpts || s->num_gpts < 1) return MMFS_E_ARG;
    if (i < 0 || i - s->num_samples >= s->beyond_samples) return MMFS_E_ARG;
    int64_t d = 0, j = i, shuffled;
    int rc;
    if (i >= s->num_samples) {
        if ((rc = locate_beyond(s, i - s->num_samples, &d, &j)) < 0) return rc;
        if (d < 0 || d >= s->num_gpts) return fail(MMFS_E_INDEX_RANGE, 0, -1, -1, d);
    } else if (s->dataset_index.count > 0) {
        if ((rc = array_int(&s->dataset_index, i, &d)) < 0) return rc;
        if ((rc = array_int(&s->dataset_sample_index, i, &j)) < 0) return rc;
        if (d < 0 || d >= s->num_gpts) return fail(MMFS_E_INDEX_RANGE, 0, -1, -1, d);
    }
    const mmfs_gpt *g = &s->gpts[d];
    if ((rc = array_int(&g->shuffle_index, j, &shuffled)) < 0) return rc;
    if (shuffled < 0 || shuffled >= g->sample_index.count / 2 - 1)
        return fail(MMFS_E_INDEX_RANGE, 0, -1, -1, shuffled);
    *gpt = (int32_t)d;
    *k = shuffled;
    return MMFS_OK;
}

static int64_t split_window(const mmfs_split *s, int64_t i, int64_t t0, int64_t t1,
                            uint8_t *out) {
    int32_t d;
    int64_t k;
    int rc = mmfs_locate(s, i, &d, &k);
    if (rc < 0) return rc;
    return sample_window(&s->gpts[d], k, s->sample_tokens, s->pad, s->out_dtype, t0, t1, out);
}

int64_t mmfs_read_split_sample(const mmfs_split *s, int64_t i, void *out) {
    if (!s) return MMFS_E_ARG;
    return split_window(s, i, 0, s->sample_tokens, out);
}

int64_t mmfs_split_length(const void *split, int64_t file) {
    const mmfs_split *s = split;
    if (!s || file < 0 || file >= s->num_samples) return MMFS_E_ARG;
    return s->sample_tokens;
}

int mmfs_split_tokens(const void *split, int64_t file, int64_t first, int64_t count,
                      uint8_t *out) {
    const mmfs_split *s = split;
    if (!s || file < 0 || file >= s->num_samples) return MMFS_E_ARG;
    int64_t rc = split_window(s, file, first, first + count, out);
    return rc < 0 ? (int)rc : MMFS_OK;
}

int64_t mmfs_beyond_length(const void *split, int64_t file) {
    const mmfs_split *s = split;
    if (!s || file < 0 || file >= s->beyond_samples) return MMFS_E_ARG;
    return s->sample_tokens;
}

int mmfs_beyond_tokens(const void *split, int64_t file, int64_t first, int64_t count,
                       uint8_t *out) {
    const mmfs_split *s = split;
    if (!s || file < 0 || file >= s->beyond_samples) return MMFS_E_ARG;
    int64_t rc = split_window(s, s->num_samples + file, first, first + count, out);
    return rc < 0 ? (int)rc : MMFS_OK;
}

/* ---- micro-batches ----------------------------------------------------- */

/* File j of a phased plan: its phase's own plan, its ids read as the split's. */
static int phased_microbatch_ids(const mmfs_rank_plan *p, int64_t rank, int64_t j, int64_t *out) {
    if (!p->phases || p->num_phases < 1 || p->phases[0].first_file != 0) return MMFS_E_ARG;
    int64_t lo = 0, hi = p->num_phases - 1;
    while (lo < hi) { /* the last phase whose files start at or before j */
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (p->phases[mid].first_file <= j) lo = mid; else hi = mid - 1;
    }
    const mmfs_phase_plan *ph = &p->phases[lo];
    const mmfs_rank_plan *own = &ph->plan;
    if (own->kind != MMFS_PLAN_SHARDED && own->kind != MMFS_PLAN_UNSHARDED) return MMFS_E_ARG;
    if (own->micro_batch_size != p->micro_batch_size || own->data_parallel_size != p->data_parallel_size)
        return MMFS_E_ARG;
    int rc = mmfs_microbatch_ids(own, rank, j - ph->first_file, out);
    if (rc < 0) return rc;
    for (int64_t m = 0; m < p->micro_batch_size; ++m)
        out[m] = out[m] < ph->listed ? ph->first_id + out[m] : ph->beyond_id + (out[m] - ph->listed);
    return MMFS_OK;
}

int mmfs_microbatch_ids(const mmfs_rank_plan *p, int64_t rank, int64_t j, int64_t *out) {
    if (!p || !out || p->micro_batch_size < 1 || p->data_parallel_size < 1) return MMFS_E_ARG;
    int64_t mbs = p->micro_batch_size, dp = p->data_parallel_size;
    if (rank < 0 || rank >= dp || j < 0 || j >= p->files_per_rank) return MMFS_E_ARG;
    if (p->kind == MMFS_PLAN_PHASED) return phased_microbatch_ids(p, rank, j, out);
    if (p->kind == MMFS_PLAN_SINGLE) {
        for (int64_t m = 0; m < mbs; ++m) out[m] = p->start + (j * dp + rank) * mbs + m;
        return MMFS_OK;
    }
    if (p->kind != MMFS_PLAN_SHARDED && p->kind != MMFS_PLAN_UNSHARDED) return MMFS_E_ARG;
    for (int64_t m = 0; m < mbs; ++m) {
        int64_t at = p->start + (p->kind == MMFS_PLAN_SHARDED ? j * mbs + m : (j * mbs + m) * dp + rank), v;
        int rc = array_int(&p->permutation, at, &v);
        if (rc < 0) return rc;
        out[m] = p->kind == MMFS_PLAN_SHARDED ? rank * p->bucket_size + v : v;
    }
    return MMFS_OK;
}

int64_t mmfs_microbatch_length(const void *microbatches, int64_t file) {
    const mmfs_microbatches *m = microbatches;
    if (!m || !m->plan || !m->split || file < 0 || file >= m->plan->files_per_rank)
        return MMFS_E_ARG;
    return m->plan->micro_batch_size * m->split->sample_tokens;
}

int mmfs_microbatch_tokens(const void *microbatches, int64_t file, int64_t first, int64_t count,
                           uint8_t *out) {
    const mmfs_microbatches *m = microbatches;
    int64_t length = mmfs_microbatch_length(m, file);
    if (length < 0) return (int)length;
    if (first < 0 || count < 0 || first > length || count > length - first) return MMFS_E_ARG;
    int64_t mbs = m->plan->micro_batch_size, small[MAX_RUN];
    int64_t *ids = mbs <= MAX_RUN ? small : malloc((size_t)mbs * sizeof(int64_t));
    if (!ids) return MMFS_E_NOMEM;
    int rc = mmfs_microbatch_ids(m->plan, m->rank, file, ids);
    int64_t per = m->split->sample_tokens, item = itemsize_of(m->split->out_dtype);
    for (int64_t t = first; rc >= 0 && t < first + count;) {
        int64_t b = t / per, lo = t - b * per;
        int64_t hi = first + count - b * per < per ? first + count - b * per : per;
        if (ids[b] < 0 || ids[b] - m->split->num_samples >= m->split->beyond_samples) {
            rc = fail(MMFS_E_INDEX_RANGE, 0, -1, -1, ids[b]);
            break;
        }
        int64_t got = split_window(m->split, ids[b], lo, hi, out + (t - first) * item);
        if (got < 0) rc = (int)got;
        t += hi - lo;
    }
    if (ids != small) free(ids);
    return rc < 0 ? rc : MMFS_OK;
}

typedef struct {
    int64_t *pieces;
    int64_t max_pieces;
    int64_t count;
} pieces_ctx;

static int record_piece(void *vctx, int64_t seq, int64_t byte, int64_t offset,
                        int64_t length, int64_t at) {
    (void)byte; (void)at;
    pieces_ctx *ctx = vctx;
    if (ctx->count < ctx->max_pieces) {
        ctx->pieces[3 * ctx->count] = seq;
        ctx->pieces[3 * ctx->count + 1] = offset;
        ctx->pieces[3 * ctx->count + 2] = length;
    }
    ctx->count += 1;
    return MMFS_OK;
}

int64_t mmfs_sample_pieces(const mmfs_gpt *g, int64_t k, int64_t *pieces,
                           int64_t max_pieces) {
    if (max_pieces < 0 || (max_pieces > 0 && !pieces)) return MMFS_E_ARG;
    pieces_ctx ctx = {pieces, max_pieces, 0};
    int rc = walk_sample(g, k, 0, INT64_MAX, record_piece, &ctx);
    if (rc < 0) return rc;
    return ctx.count;
}

/* ---- sequences and documents ----------------------------------------- */

int64_t mmfs_sequence_length(const void *source, int64_t file) {
    int64_t length;
    int rc = source ? sequence_length(source, file, &length) : MMFS_E_ARG;
    return rc < 0 ? rc : length;
}

int mmfs_sequence_tokens(const void *source, int64_t file, int64_t first, int64_t count,
                         uint8_t *out) {
    const mmfs_source *src = source;
    int64_t length, byte;
    int rc = src ? sequence_length(src, file, &length) : MMFS_E_ARG;
    if (rc < 0 || (rc = sequence_byte(src, file, length, &byte)) < 0) return rc;
    if (first < 0 || count < 0 || first > length || count > length - first)
        return MMFS_E_ARG;
    return copy_tokens(src, byte + first * itemsize_of(src->dtype), count, out, src->dtype);
}

/* Sequences [*beg, *end) of document d. */
static int document_bounds(const mmfs_documents *docs, int64_t d, int64_t *beg, int64_t *end) {
    if (!docs || !docs->source || d < 0) return MMFS_E_ARG;
    if (docs->bounds.count == 0) {
        if (d >= docs->source->lengths.count) return MMFS_E_ARG;
        *beg = d;
        *end = d + 1;
        return MMFS_OK;
    }
    if (d >= docs->bounds.count - 1) return MMFS_E_ARG;
    int64_t two[2];
    int rc = array_ints(&docs->bounds, d, 2, two);
    if (rc < 0) return rc;
    if (two[0] < 0 || two[1] < two[0] || two[1] > docs->source->lengths.count)
        return fail(MMFS_E_DOC_RANGE, 0, -1, two[0], two[1]);
    *beg = two[0];
    *end = two[1];
    return MMFS_OK;
}

int64_t mmfs_document_length(const void *documents, int64_t file) {
    int64_t beg, end, total = 0, length;
    int rc = document_bounds(documents, file, &beg, &end);
    if (rc < 0) return rc;
    const mmfs_source *src = ((const mmfs_documents *)documents)->source;
    for (int64_t seq = beg; seq < end; ++seq) {
        if ((rc = sequence_length(src, seq, &length)) < 0) return rc;
        total += length;
    }
    return total;
}

int mmfs_document_tokens(const void *documents, int64_t file, int64_t first, int64_t count,
                         uint8_t *out) {
    int64_t beg, end, length, byte, at = 0;
    int rc = document_bounds(documents, file, &beg, &end);
    if (rc < 0) return rc;
    if (first < 0 || count < 0) return MMFS_E_ARG;
    const mmfs_source *src = ((const mmfs_documents *)documents)->source;
    int item = itemsize_of(src->dtype);
    for (int64_t seq = beg; seq < end && at < first + count; ++seq) {
        if ((rc = sequence_length(src, seq, &length)) < 0) return rc;
        int64_t lo = at > first ? at : first;
        int64_t hi = at + length < first + count ? at + length : first + count;
        if (hi > lo) {
            if ((rc = sequence_byte(src, seq, length, &byte)) < 0) return rc;
            rc = copy_tokens(src, byte + (lo - at) * item, hi - lo, out + (lo - first) * item,
                             src->dtype);
            if (rc < 0) return rc;
        }
        at += length;
    }
    return at >= first + count ? MMFS_OK : MMFS_E_ARG;
}
