/* Read one data-parallel rank's micro-batches from an mmfs mount, in C.
 *
 *   cc -O2 -o mmfs_rank_reader mmfs_rank_reader.c
 *   ./mmfs_rank_reader MOUNT SPLIT RANK [CONSUMED_SAMPLES]
 *
 * Everything comes from MOUNT/mmfs.json: the token dtype, tokens_per_sample, and
 * the `training` section (micro_batch_size, data_parallel_size, rank_name_width,
 * microbatches[split], microbatch_name_width[split], ranks_path[split],
 * bytes_per_microbatch). Micro-batch j of rank r is the file
 *   MOUNT/<ranks_path>/<r, rank_name_width digits>/<j, name width digits>.bin
 * holding micro_batch_size samples of tokens_per_sample little-endian tokens.
 * A job resumed at consumed_samples starts at j = consumed / (mbs * dp).
 *
 * For each micro-batch it prints "j sum first last": the sum of its tokens and its
 * first and last token (a real trainer would hand the buffer to its model).
 * The JSON reader below handles what mmfs.json holds; it is not a general one.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -- a minimal JSON reader: find a key's value inside an object ------------- */

static const char *skip_ws(const char *p) {
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') ++p;
    return p;
}

static const char *skip_string(const char *p) { /* p at the opening quote */
    for (++p; *p && *p != '"'; ++p)
        if (*p == '\\' && p[1]) ++p;
    return *p ? p + 1 : NULL;
}

static const char *skip_value(const char *p) {
    p = skip_ws(p);
    if (*p == '"') return skip_string(p);
    if (*p == '{' || *p == '[') {
        int depth = 0;
        while (*p) {
            if (*p == '"') { if (!(p = skip_string(p))) return NULL; continue; }
            if (*p == '{' || *p == '[') ++depth;
            if (*p == '}' || *p == ']') { if (--depth == 0) return p + 1; }
            ++p;
        }
        return NULL;
    }
    while (*p && *p != ',' && *p != '}' && *p != ']') ++p; /* number, true, false, null */
    return p;
}

/* The value of `key` in the object starting at `obj` ('{'), or NULL. */
static const char *find_key(const char *obj, const char *key) {
    const char *p = skip_ws(obj);
    if (!p || *p != '{') return NULL;
    p = skip_ws(p + 1);
    size_t n = strlen(key);
    while (*p == '"') {
        const char *k = p + 1, *end = skip_string(p);
        if (!end) return NULL;
        p = skip_ws(end);
        if (*p != ':') return NULL;
        p = skip_ws(p + 1);
        if ((size_t)(end - 1 - k) == n && strncmp(k, key, n) == 0) return p;
        if (!(p = skip_value(p))) return NULL;
        p = skip_ws(p);
        if (*p == ',') p = skip_ws(p + 1);
    }
    return NULL;
}

static int get_int(const char *obj, const char *key, long long *out) {
    const char *v = find_key(obj, key);
    if (!v) return -1;
    char *end;
    *out = strtoll(v, &end, 10);
    return end == v ? -1 : 0;
}

static int get_string(const char *obj, const char *key, char *out, size_t size) {
    const char *v = find_key(obj, key);
    if (!v || *v != '"') return -1;
    const char *end = skip_string(v);
    size_t n = (size_t)(end - v - 2);
    if (!end || n >= size) return -1;
    memcpy(out, v + 1, n);
    out[n] = 0;
    return 0;
}

/* -- the reader -------------------------------------------------------------- */

static int fail(const char *what) {
    fprintf(stderr, "mmfs_rank_reader: %s\n", what);
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5) return fail("usage: mmfs_rank_reader MOUNT SPLIT RANK [CONSUMED_SAMPLES]");
    const char *mount = argv[1], *split = argv[2];
    long long rank = atoll(argv[3]), consumed = argc == 5 ? atoll(argv[4]) : 0;

    char path[4096];
    snprintf(path, sizeof path, "%s/mmfs.json", mount);
    FILE *f = fopen(path, "rb");
    if (!f) return fail("cannot open MOUNT/mmfs.json");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *json = malloc((size_t)size + 1);
    if (!json || fread(json, 1, (size_t)size, f) != (size_t)size) return fail("cannot read mmfs.json");
    json[size] = 0;
    fclose(f);

    char dtype[32], ranks_path[1024];
    long long tokens, mbs, dp, rank_width, files, name_width, bytes;
    const char *t = find_key(json, "training");
    if (get_string(json, "dtype", dtype, sizeof dtype) || get_int(json, "tokens_per_sample", &tokens))
        return fail("mmfs.json has no dtype / tokens_per_sample");
    if (!t) return fail("mmfs.json has no training section (add a training: block to the config)");
    const char *counts = find_key(t, "microbatches"), *widths = find_key(t, "microbatch_name_width");
    const char *paths = find_key(t, "ranks_path");
    if (get_int(t, "micro_batch_size", &mbs) || get_int(t, "data_parallel_size", &dp) ||
        get_int(t, "rank_name_width", &rank_width) || get_int(t, "bytes_per_microbatch", &bytes) ||
        !counts || get_int(counts, split, &files))
        return fail("the training section lacks a field, or the split is unknown");
    if (files == 0) { printf("split %s: no micro-batches\n", split); return 0; }
    if (!widths || get_int(widths, split, &name_width) || !paths ||
        get_string(paths, split, ranks_path, sizeof ranks_path))
        return fail("the training section lacks the split's name width or path");
    if (rank < 0 || rank >= dp) return fail("RANK is not below data_parallel_size");
    if (consumed < 0 || consumed % (mbs * dp)) return fail("CONSUMED_SAMPLES is not a multiple of mbs x dp");

    int itemsize = !strcmp(dtype, "uint8") ? 1 : !strcmp(dtype, "int8") ? 1 :
                   !strcmp(dtype, "uint16") || !strcmp(dtype, "int16") ? 2 :
                   !strcmp(dtype, "int32") || !strcmp(dtype, "uint32") || !strcmp(dtype, "float32") ? 4 : 8;
    if (bytes != mbs * tokens * itemsize) return fail("bytes_per_microbatch does not match the dtype");
    unsigned char *buf = malloc((size_t)bytes);
    if (!buf) return fail("out of memory");

    for (long long j = consumed / (mbs * dp); j < files; ++j) {
        snprintf(path, sizeof path, "%s/%s/%0*lld/%0*lld.bin", mount, ranks_path, (int)rank_width, rank,
                 (int)name_width, j);
        FILE *mb = fopen(path, "rb");
        if (!mb || fread(buf, 1, (size_t)bytes, mb) != (size_t)bytes) {
            fprintf(stderr, "mmfs_rank_reader: %s: %s\n", path, strerror(errno ? errno : EIO));
            return 2;
        }
        fclose(mb);
        long long n = mbs * tokens, sum = 0, first = 0, last = 0;
        for (long long i = 0; i < n; ++i) {
            const unsigned char *p = buf + i * itemsize;
            long long v;
            if (itemsize == 1) v = p[0];
            else if (itemsize == 2) v = !strcmp(dtype, "int16") ? (int16_t)(p[0] | p[1] << 8) : (p[0] | p[1] << 8);
            else if (itemsize == 4) {
                uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
                v = !strcmp(dtype, "int32") ? (int32_t)u : (long long)u;
            } else {
                uint64_t u = 0;
                for (int b = 7; b >= 0; --b) u = u << 8 | p[b];
                v = (long long)u;
            }
            sum += v;
            if (i == 0) first = v;
            last = v;
        }
        printf("%lld %lld %lld %lld\n", j, sum, first, last);
    }
    free(buf);
    free(json);
    return 0;
}
