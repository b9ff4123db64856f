/* mmfs FUSE handlers for the views' files. See mmfs_fuse.h. */
#include "mmfs_native.h"
#include "mmfs_views.h"
#include "mmfs_fuse.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <sys/stat.h>

typedef int (*fill_fn)(void *buf, const char *name, const struct stat *st, int64_t off);

static const mmfs_view *g_views;
static int32_t g_num_views;
static uint32_t g_uid, g_gid;
static mmfs_fuse_fallback g_fallback;

int mmfs_fuse_configure(const mmfs_view *views, int32_t n, uint32_t uid, uint32_t gid,
                        size_t stat_size, const mmfs_fuse_fallback *fallback) {
    /* The binding's struct stat may omit the reserved tail, not the times. */
    size_t needed = offsetof(struct stat, st_ctim) + sizeof(struct timespec);
    if (stat_size < needed || stat_size > sizeof(struct stat) || n < 0 || (n > 0 && !views) || !fallback ||
        !fallback->getattr || !fallback->fgetattr || !fallback->read || !fallback->readdir ||
        !fallback->read_failed)
        return MMFS_E_ARG;
    for (int32_t d = 0; d < n; ++d)
        if (!views[d].path || views[d].name_width < 1 || views[d].name_width > 18 ||
            views[d].item < 1 || views[d].count < 0 || !views[d].tokens ||
            (views[d].file_tokens < 0 && !views[d].length))
            return MMFS_E_ARG;
    if (!mmfs_view_sorted(views, n)) return MMFS_E_ARG;
    g_views = views;
    g_num_views = n;
    g_uid = uid;
    g_gid = gid;
    g_fallback = *fallback;
    return MMFS_OK;
}

/* The attributes of a view's directory (size < 0) or of one of its files. */
static void fill_stat(struct stat *st, const mmfs_view *v, int64_t size) {
    memset(st, 0, sizeof *st);
    st->st_mode = size < 0 ? (S_IFDIR | 0555) : (S_IFREG | 0444);
    st->st_nlink = size < 0 ? 2 : 1;
    st->st_size = size < 0 ? 0 : size;
    st->st_blocks = (st->st_size + 511) / 512;
    st->st_blksize = 4096;
    st->st_uid = g_uid;
    st->st_gid = g_gid;
    struct timespec t = {v->mtime_ns / 1000000000, v->mtime_ns % 1000000000};
    st->st_mtim = st->st_atim = st->st_ctim = t;
}

/* getattr and fgetattr: answer for the views, or hand over. 1 if answered. */
static int view_stat(const char *path, struct stat *st, int *rc) {
    int32_t d;
    int64_t file;
    switch (mmfs_view_find(g_views, g_num_views, path, &d, &file)) {
    case MMFS_PATH_DIR:
        fill_stat(st, &g_views[d], -1);
        *rc = 0;
        return 1;
    case MMFS_PATH_FILE: {
        int64_t size = mmfs_view_size(&g_views[d], file);
        if (size < 0) return 0; /* Python logs why, and answers EIO */
        fill_stat(st, &g_views[d], size);
        *rc = 0;
        return 1;
    }
    case MMFS_PATH_MISSING:
        *rc = -ENOENT;
        return 1;
    default:
        return 0;
    }
}

int mmfs_fuse_getattr(const char *path, void *st) {
    int rc;
    mmfs_latency_touch();
    return view_stat(path, st, &rc) ? rc : g_fallback.getattr(path, st);
}

int mmfs_fuse_fgetattr(const char *path, void *st, void *fi) {
    int rc;
    mmfs_latency_touch();
    return view_stat(path, st, &rc) ? rc : g_fallback.fgetattr(path, st, fi);
}

int mmfs_fuse_read(const char *path, char *buf, size_t size, int64_t offset, void *fi) {
    int32_t d;
    int64_t file;
    mmfs_latency_touch();
    switch (mmfs_view_find(g_views, g_num_views, path, &d, &file)) {
    case MMFS_PATH_FILE: {
        int64_t n = mmfs_view_read(&g_views[d], file, offset, (int64_t)size, (uint8_t *)buf);
        return n >= 0 ? (int)n : g_fallback.read_failed(d, file, n, size, offset);
    }
    case MMFS_PATH_DIR:
        return -EISDIR;
    case MMFS_PATH_MISSING:
        return -ENOENT;
    default:
        return g_fallback.read(path, buf, size, offset, fi);
    }
}

int mmfs_fuse_readdir(const char *path, void *buf, void *filler, int64_t offset, void *fi) {
    int32_t d;
    int64_t file;
    mmfs_latency_touch();
    int kind = mmfs_view_find(g_views, g_num_views, path, &d, &file);
    if (kind == MMFS_PATH_FILE) return -ENOTDIR;
    if (kind == MMFS_PATH_MISSING) return -ENOENT;
    if (kind != MMFS_PATH_DIR) return g_fallback.readdir(path, buf, filler, offset, fi);
    /* Entry k (0 = ".", 1 = "..", then the files) carries offset k + 1, the
     * place to resume: libfuse asks for the directory a buffer at a time. Only
     * the type of st matters to a listing. */
    const mmfs_view *v = &g_views[d];
    fill_fn fill = (fill_fn)filler;
    struct stat dir_st = {.st_mode = S_IFDIR | 0555}, file_st = {.st_mode = S_IFREG | 0444};
    int64_t k = offset < 0 ? 0 : offset;
    for (; k < 2; ++k)
        if (fill(buf, k == 0 ? "." : "..", &dir_st, k + 1)) return 0;
    char name[32];
    for (int64_t i = k - 2; i < v->count; ++i) {
        if (mmfs_view_name(v, i, name, sizeof name) < 0) return -EIO;
        if (fill(buf, name, &file_st, i + 3)) break;
    }
    return 0;
}
