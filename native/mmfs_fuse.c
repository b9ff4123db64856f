/* mmfs FUSE handlers for sample files. See mmfs_fuse.h. */
#include "mmfs_native.h"
#include "mmfs_fuse.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*fill_fn)(void *buf, const char *name, const void *st, int64_t off);

static const mmfs_sample_dir *g_dirs;
static int32_t g_num_dirs;
static size_t g_stat_size;
static mmfs_fuse_fallback g_fallback;

int mmfs_fuse_configure(const mmfs_sample_dir *dirs, int32_t num_dirs,
                        size_t stat_size, const mmfs_fuse_fallback *fallback) {
    if (num_dirs < 0 || (num_dirs > 0 && !dirs) || !fallback || !fallback->getattr ||
        !fallback->fgetattr || !fallback->read || !fallback->readdir || !stat_size)
        return MMFS_E_ARG;
    for (int32_t d = 0; d < num_dirs; ++d)
        if (!dirs[d].path || !dirs[d].split || !dirs[d].file_stat || !dirs[d].dir_stat ||
            dirs[d].name_width < 1 || dirs[d].name_width > 18 || dirs[d].sample_bytes < 0)
            return MMFS_E_ARG;
    g_dirs = dirs;
    g_num_dirs = num_dirs;
    g_stat_size = stat_size;
    g_fallback = *fallback;
    return MMFS_OK;
}

/* What a path is to the C handlers. */
enum { OTHER, SAMPLE_DIR, SAMPLE, MISSING };

/* Classify path; for SAMPLE_DIR and SAMPLE set *dir, for SAMPLE also *id.
 * A valid name is exactly name_width digits, then ".bin", below the count. */
static int classify(const char *path, const mmfs_sample_dir **dir, int64_t *id) {
    for (int32_t d = 0; d < g_num_dirs; ++d) {
        const mmfs_sample_dir *s = &g_dirs[d];
        size_t n = strlen(s->path);
        if (strncmp(path, s->path, n) != 0) continue;
        *dir = s;
        if (path[n] == '\0') return SAMPLE_DIR;
        if (path[n] != '/') continue;
        const char *name = path + n + 1;
        int64_t value = 0;
        for (int32_t i = 0; i < s->name_width; ++i) {
            if (name[i] < '0' || name[i] > '9') return MISSING;
            value = value * 10 + (name[i] - '0');
        }
        if (strcmp(name + s->name_width, ".bin") != 0 || value >= s->split->num_samples)
            return MISSING;
        *id = value;
        return SAMPLE;
    }
    return OTHER;
}

int mmfs_fuse_getattr(const char *path, void *st) {
    const mmfs_sample_dir *dir;
    int64_t id;
    switch (classify(path, &dir, &id)) {
    case SAMPLE:
        mmfs_latency_touch();
        memcpy(st, dir->file_stat, g_stat_size);
        return 0;
    case MISSING:
        mmfs_latency_touch();
        return -ENOENT;
    default:
        return g_fallback.getattr(path, st);
    }
}

int mmfs_fuse_fgetattr(const char *path, void *st, void *fi) {
    const mmfs_sample_dir *dir;
    int64_t id;
    if (classify(path, &dir, &id) == SAMPLE) {
        mmfs_latency_touch();
        memcpy(st, dir->file_stat, g_stat_size);
        return 0;
    }
    return g_fallback.fgetattr(path, st, fi);
}

int mmfs_fuse_read(const char *path, char *buf, size_t size, int64_t offset, void *fi) {
    const mmfs_sample_dir *dir;
    int64_t id;
    int kind = classify(path, &dir, &id);
    if (kind == MISSING) return -ENOENT;
    if (kind != SAMPLE) return g_fallback.read(path, buf, size, offset, fi);
    mmfs_latency_touch();
    int64_t total = dir->sample_bytes;
    if (offset < 0) return -EINVAL;
    if (offset >= total || size == 0) return 0;
    int64_t n = total - offset < (int64_t)size ? total - offset : (int64_t)size;
    if (offset == 0 && n == total) { /* the whole sample: straight into libfuse's buffer */
        if (mmfs_read_split_sample(dir->split, id, buf) < 0)
            return g_fallback.read(path, buf, size, offset, fi);
        return (int)n;
    }
    char *whole = malloc((size_t)total);
    if (!whole) return -ENOMEM;
    int64_t rc = mmfs_read_split_sample(dir->split, id, whole);
    if (rc >= 0) memcpy(buf, whole + offset, (size_t)n);
    free(whole);
    return rc < 0 ? g_fallback.read(path, buf, size, offset, fi) : (int)n;
}

int mmfs_fuse_readdir(const char *path, void *buf, void *filler, int64_t offset, void *fi) {
    const mmfs_sample_dir *dir;
    int64_t id;
    if (classify(path, &dir, &id) != SAMPLE_DIR)
        return g_fallback.readdir(path, buf, filler, offset, fi);
    mmfs_latency_touch();
    /* Entry k (0 = ".", 1 = "..", then the samples) carries offset k + 1, the
     * place to resume: libfuse asks for the directory a buffer at a time. */
    fill_fn fill = (fill_fn)filler;
    int64_t k = offset < 0 ? 0 : offset;
    for (; k < 2; ++k)
        if (fill(buf, k == 0 ? "." : "..", dir->dir_stat, k + 1)) return 0;
    char name[32];
    for (int64_t i = k - 2; i < dir->split->num_samples; ++i) {
        snprintf(name, sizeof name, "%0*lld.bin", (int)dir->name_width, (long long)i);
        if (fill(buf, name, dir->file_stat, i + 3)) break;
    }
    return 0;
}
