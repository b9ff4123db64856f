/* A streaming reader of the one pickle a Modalities .pbin index holds: a list
 * of (offset, length) pairs of integers. It knows exactly the opcodes such a
 * list is written with (protocols 1-5) and refuses anything else, so it never
 * builds Python objects and never runs code; mmfs falls back to a restricted
 * Unpickler (and its error messages) for whatever it refuses. */
#include "mmfs_native.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK (1 << 20)

typedef struct {
    int fd;
    int64_t pos, end;   /* file bytes not yet in buf: [pos, end) */
    uint8_t *buf;
    int64_t have, at;   /* buf[at..have) unread */
} reader;

static int fill(reader *r) {
    if (r->pos >= r->end) return 0;
    int64_t want = r->end - r->pos < CHUNK ? r->end - r->pos : CHUNK;
    ssize_t got = pread(r->fd, r->buf, (size_t)want, (off_t)r->pos);
    if (got <= 0) return -1;
    r->pos += got;
    r->have = got;
    r->at = 0;
    return 1;
}

/* n (<= 8) bytes into out; -1 on a short read or error. */
static inline int take(reader *r, uint8_t *out, int n) {
    if (r->have - r->at >= n) {  /* the common case: all in the buffer */
        memcpy(out, r->buf + r->at, (size_t)n);
        r->at += n;
        return 1;
    }
    for (int i = 0; i < n; ++i) {
        if (r->at >= r->have && fill(r) <= 0) return -1;
        out[i] = r->buf[r->at++];
    }
    return 1;
}

static int64_t le(const uint8_t *b, int n, int is_signed) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | b[i];
    if (is_signed && n < 8 && n > 0 && (b[n - 1] & 0x80)) v |= ~(uint64_t)0 << (8 * n);
    return (int64_t)v;
}

int mmfs_parse_pickle_pairs(int fd, int64_t start, int64_t end, int64_t data_len,
                            int32_t token_size, int64_t *offsets, int32_t *lengths,
                            int64_t capacity, int64_t *count, int32_t *problem,
                            int64_t *bad_value) {
    if (fd < 0 || start < 0 || end < start || token_size < 1 || !count || !problem)
        return MMFS_E_ARG;
    reader r = {fd, start, end, malloc(CHUNK), 0, 0};
    if (!r.buf) return MMFS_E_ARG;
    int rc = MMFS_E_UNSUPPORTED;
    int have_list = 0, marks = 0, ints = 0, loose = 0;
    int64_t in_mark = 0;  /* pairs made since the (outer) mark */
    int64_t v[2] = {0, 0}, n = 0;
    uint8_t op, b[8];
    *problem = 0;
    for (;;) {
        if (take(&r, &op, 1) < 0) goto done;  /* truncated: no STOP */
        switch (op) {
        case 0x80: if (take(&r, b, 1) < 0) goto done; break;          /* PROTO */
        case 0x95: if (take(&r, b, 8) < 0) goto done; break;          /* FRAME */
        case 0x94: break;                                             /* MEMOIZE */
        case 'q': if (take(&r, b, 1) < 0) goto done; break;           /* BINPUT */
        case 'r': if (take(&r, b, 4) < 0) goto done; break;           /* LONG_BINPUT */
        case ']': if (have_list) goto done; have_list = 1; break;     /* EMPTY_LIST */
        case '(':                                                     /* MARK */
            if (!have_list || marks == 2 || ints) goto done;
            ++marks;
            break;
        case 'J': case 'K': case 'M': case 0x8a: {                    /* integers */
            int size = op == 'J' ? 4 : op == 'K' ? 1 : op == 'M' ? 2 : 0;
            if (op == 0x8a) {
                if (take(&r, b, 1) < 0 || b[0] > 8) goto done;
                size = b[0];
            }
            if (ints == 2 || !have_list || take(&r, b, size) < 0) goto done;
            v[ints++] = size == 0 ? 0 : le(b, size, op == 'J' || op == 0x8a);
            break;
        }
        case 0x86: case 't':                                          /* TUPLE2, TUPLE */
            /* TUPLE pops to the innermost mark, which must hold the two ints only */
            if (ints != 2 || (op == 't' ? marks == 0 || (marks == 1 && in_mark)
                                        : marks == 2))
                goto done;
            if (op == 't') --marks;
            if (offsets) {
                if (n >= capacity) { rc = MMFS_E_OUT_SIZE; goto done; }
                int64_t off = v[0], len = v[1];
                int32_t why = off < 0 ? 1 : len < 0 ? 2 : len % token_size ? 3
                            : len / token_size > INT32_MAX ? 4 : off > data_len - len ? 5 : 0;
                if (why) {
                    *problem = why;
                    bad_value[0] = off;
                    bad_value[1] = len;
                    *count = n;
                    rc = MMFS_E_INDEX_RANGE;
                    goto done;
                }
                offsets[n] = off;
                lengths[n] = (int32_t)(len / token_size);
            }
            ++n;
            ints = 0;
            if (marks) ++in_mark; else ++loose;
            break;
        case 'a':                                                     /* APPEND */
            if (marks || ints || loose != 1) goto done;
            loose = 0;
            break;
        case 'e':                                                     /* APPENDS */
            if (marks != 1 || ints) goto done;
            marks = 0;
            in_mark = 0;
            break;
        case '.':                                                     /* STOP */
            if (!have_list || marks || ints || loose) goto done;
            *count = n;
            rc = MMFS_OK;
            goto done;
        default:
            goto done;
        }
    }
done:
    free(r.buf);
    return rc;
}
