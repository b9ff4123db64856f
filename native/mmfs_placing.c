/* Placing many arrays at once: see mmfs_placing.h. */
#include "mmfs_native.h"
#include "mmfs_files.h"
#include "mmfs_io.h"
#include "mmfs_placing.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void mmfs_files_add_many(const char *paths, int64_t n, const uint64_t *identity, int64_t *ids) {
    const char *path = paths;
    for (int64_t i = 0; i < n; ++i) {
        ids[i] = mmfs_file_add(path, identity + MMFS_IDENTITY_WORDS * i);
        path += strlen(path) + 1;
    }
}

#define NPY_MIN_HEADER 10 /* magic, version and header length */

/* numpy's format 1.0 header for (descr, shape) with data at `offset`, into out
 * (offset bytes); 0 when no such header ends there. Python's npy_header
 * (mmfs/megatron/cache/npyfile.py) is the same bytes. */
static int npy_header(const char *descr, int32_t ndim, const int64_t *shape, int64_t offset, uint8_t *out) {
    if (offset <= NPY_MIN_HEADER || offset - NPY_MIN_HEADER > 0xFFFF) return 0;
    for (const char *p = descr; *p; ++p)
        if (*p == '\'' || *p == '\\' || *p < 0x20 || *p > 0x7e) return 0; /* repr would not quote it so */
    char text[256];
    int k;
    if (ndim == 1)
        k = snprintf(text, sizeof text, "{'descr': '%s', 'fortran_order': False, 'shape': (%" PRId64 ",), }",
                     descr, shape[0]);
    else if (ndim == 2)
        k = snprintf(text, sizeof text, "{'descr': '%s', 'fortran_order': False, 'shape': (%" PRId64 ", %" PRId64
                     "), }", descr, shape[0], shape[1]);
    else
        return 0;
    if (k < 0 || k >= (int)sizeof text) return 0;
    int64_t pad = offset - NPY_MIN_HEADER - k - 1;
    if (pad < 0) return 0;
    int64_t length = offset - NPY_MIN_HEADER;
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (uint8_t)(length & 0xFF);
    out[9] = (uint8_t)(length >> 8);
    memcpy(out + NPY_MIN_HEADER, text, (size_t)k);
    memset(out + NPY_MIN_HEADER + k, ' ', (size_t)pad);
    out[offset - 1] = '\n';
    return 1;
}

void mmfs_npy_headers_match(const uint8_t *heads, const int32_t *got, int32_t head_size, int64_t n,
                            const char *descrs, const int32_t *ndim, const int64_t *shapes,
                            const int64_t *offsets, uint8_t *ok) {
    uint8_t expected[4096];
    const char *descr = descrs;
    for (int64_t i = 0; i < n; ++i) {
        int64_t offset = offsets[i];
        ok[i] = got[i] >= 0 && offset <= got[i] && offset <= head_size && offset <= (int64_t)sizeof expected &&
                npy_header(descr, ndim[i], shapes + 2 * i, offset, expected) &&
                memcmp(heads + i * (int64_t)head_size, expected, (size_t)offset) == 0;
        descr += strlen(descr) + 1;
    }
}

void mmfs_arrays_fill(mmfs_array *const *structs, int64_t n, const int64_t *address, const int64_t *file,
                      const int64_t *offset, const int64_t *count, const int32_t *dtype) {
    for (int64_t i = 0; i < n; ++i) {
        mmfs_array *c = structs[i];
        c->data = address[i] ? (const uint8_t *)(uintptr_t)address[i] : NULL;
        c->file = address[i] ? 0 : file[i];
        c->offset = address[i] ? 0 : offset[i];
        c->count = count[i];
        c->dtype = dtype[i];
        c->fetch = NULL;
        c->fetch_ctx = NULL;
    }
}

#define SPAN_GAP (256 << 10) /* regions nearer than this are read in one span */
#define SPAN_MAX (8 << 20)   /* ... of at most this many bytes (a region longer is read on its own) */

int32_t mmfs_regions_copy(const char *path, const uint64_t *identity, int64_t n, const int64_t *offsets,
                          const int64_t *lengths, uint8_t *out, const int64_t *at) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return MMFS_E_IO;
    struct stat st;
    int32_t rc = MMFS_E_IO;
    uint8_t *span = NULL;
    if (fstat(fd, &st) != 0) goto done;
    uint64_t mtime = (uint64_t)((int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec);
    if (!S_ISREG(st.st_mode) || (identity[0] && ((uint64_t)st.st_size != identity[1] || mtime != identity[2] ||
                                                 (uint64_t)st.st_ino != identity[3]))) {
        rc = MMFS_E_CHANGED;
        goto done;
    }
    span = malloc(SPAN_MAX);
    if (!span) {
        rc = MMFS_E_NOMEM;
        goto done;
    }
    for (int64_t i = 0; i < n;) {
        if (lengths[i] >= SPAN_MAX) { /* a long region: straight to its place */
            int64_t got = read_fully(fd, out + at[i], lengths[i], offsets[i]);
            if (got < 0) goto done;
            if (got < lengths[i]) {
                rc = MMFS_E_CHANGED;
                goto done;
            }
            ++i;
            continue;
        }
        int64_t begin = offsets[i], end = offsets[i] + lengths[i], j = i + 1;
        while (j < n && lengths[j] < SPAN_MAX && offsets[j] >= begin && offsets[j] - end <= SPAN_GAP &&
               (offsets[j] + lengths[j] > end ? offsets[j] + lengths[j] : end) - begin <= SPAN_MAX) {
            if (offsets[j] + lengths[j] > end) end = offsets[j] + lengths[j];
            ++j;
        }
        int64_t got = read_fully(fd, span, end - begin, begin);
        if (got < 0) goto done;
        if (got < end - begin) {
            rc = MMFS_E_CHANGED;
            goto done;
        }
        for (; i < j; ++i) memcpy(out + at[i], span + (offsets[i] - begin), (size_t)lengths[i]);
    }
    rc = 0;
done:
    free(span);
    close(fd);
    return rc;
}
