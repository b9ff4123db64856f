/* The mount's views. See mmfs_views.h. */
#include "mmfs_contract.h"
#include "mmfs_native.h"
#include "mmfs_views.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The view whose path is exactly path[0..n), by binary search (the views are
 * sorted by path), or -1. */
static int32_t view_at(const mmfs_view *views, int32_t count, const char *path, size_t n) {
    int32_t lo = 0, hi = count - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        const char *p = views[mid].path;
        int c = strncmp(p, path, n);
        if (c == 0 && p[n] != '\0') c = 1; /* longer, so after path[0..n) */
        if (c == 0) return mid;
        if (c < 0) lo = mid + 1; else hi = mid - 1;
    }
    return -1;
}

int mmfs_view_sorted(const mmfs_view *views, int32_t n) {
    for (int32_t d = 1; d < n; ++d)
        if (strcmp(views[d - 1].path, views[d].path) >= 0) return 0;
    return 1;
}

int mmfs_view_find(const mmfs_view *views, int32_t n, const char *path, int32_t *view,
                   int64_t *file) {
    if (!views || !path || n < 1) return MMFS_PATH_OTHER;
    int32_t d = view_at(views, n, path, strlen(path));
    if (d >= 0) {
        *view = d;
        return MMFS_PATH_DIR;
    }
    const char *slash = strrchr(path, '/');
    if (!slash || (d = view_at(views, n, path, (size_t)(slash - path))) < 0)
        return MMFS_PATH_OTHER;
    const mmfs_view *v = &views[d];
    *view = d;
    const char *name = slash + 1;
    int64_t value = 0;
    for (int32_t i = 0; i < v->name_width; ++i) {
        if (name[i] < '0' || name[i] > '9') return MMFS_PATH_MISSING;
        value = value * 10 + (name[i] - '0');
    }
    if (strcmp(name + v->name_width, MMFS_FILE_SUFFIX) != 0 || value >= v->count) return MMFS_PATH_MISSING;
    *file = value;
    return MMFS_PATH_FILE;
}

int mmfs_view_name(const mmfs_view *v, int64_t file, char *out, int32_t size) {
    if (!v || !out || file < 0 || file >= v->count || v->name_width < 1 || v->name_width > 18)
        return MMFS_E_ARG;
    int n = snprintf(out, (size_t)size, "%0*lld" MMFS_FILE_SUFFIX, (int)v->name_width, (long long)file);
    return n < size ? n : MMFS_E_OUT_SIZE;
}

static int64_t file_tokens(const mmfs_view *v, int64_t file) {
    if (file < 0 || file >= v->count) return MMFS_E_ARG;
    return v->file_tokens >= 0 ? v->file_tokens : v->length(v->ctx, file);
}

int64_t mmfs_view_size(const mmfs_view *v, int64_t file) {
    if (!v || v->item < 1) return MMFS_E_ARG;
    int64_t tokens = file_tokens(v, file);
    if (tokens < 0) return tokens;
    if (tokens > INT64_MAX / v->item) return MMFS_E_OVERFLOW;
    return tokens * v->item;
}

int64_t mmfs_view_read(const mmfs_view *v, int64_t file, int64_t offset, int64_t size,
                       uint8_t *out) {
    int64_t total = mmfs_view_size(v, file);
    if (total < 0) return total;
    if (offset < 0 || size < 0 || !out) return MMFS_E_ARG;
    if (offset >= total || size == 0) return 0;
    int64_t n = total - offset < size ? total - offset : size;
    int64_t item = v->item, first = offset / item, last = (offset + n + item - 1) / item;
    if (offset % item == 0 && n % item == 0) { /* whole tokens: straight into out */
        int rc = v->tokens(v->ctx, file, first, last - first, out);
        return rc < 0 ? rc : n;
    }
    /* A range that cuts a token: assemble the tokens around it, then copy. */
    uint8_t *tmp = malloc((size_t)((last - first) * item));
    if (!tmp) return MMFS_E_NOMEM;
    int rc = v->tokens(v->ctx, file, first, last - first, tmp);
    if (rc >= 0) memcpy(out, tmp + (offset - first * item), (size_t)n);
    free(tmp);
    return rc < 0 ? rc : n;
}
