/* Placing many arrays at once: see mmfs_placing.h. */
#include "mmfs_native.h"
#include "mmfs_files.h"
#include "mmfs_placing.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

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
