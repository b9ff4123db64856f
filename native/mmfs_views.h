/* The mount's views: directories of generated files.
 *
 * Each view is declared once (mmfs/views.py) and served from here, by the
 * FUSE handlers and by the in-process tree alike. A view's files are arrays
 * of tokens: file i of a view holds length(ctx, i) tokens of `item` bytes,
 * and tokens(ctx, i, first, count, out) writes a run of them. The byte range
 * of a READ becomes a token range here, so a reader only ever assembles the
 * pieces a READ overlaps.
 */
#ifndef MMFS_VIEWS_H
#define MMFS_VIEWS_H
#include <stdint.h>

typedef int64_t (*mmfs_length_fn)(const void *ctx, int64_t file);
typedef int (*mmfs_tokens_fn)(const void *ctx, int64_t file, int64_t first, int64_t count,
                              uint8_t *out);

typedef struct {
    const char *path;        /* the directory in the mount, e.g. "/train/samples" */
    int64_t count;           /* files 0 .. count - 1 */
    int32_t name_width;      /* digits of a file name, before ".bin" */
    int32_t item;            /* bytes per token */
    int64_t file_tokens;     /* tokens in every file, or -1: ask length() */
    mmfs_length_fn length;
    mmfs_tokens_fn tokens;
    const void *ctx;         /* what length() and tokens() read */
    int64_t mtime_ns;        /* the time of every file and of the directory */
} mmfs_view;

/* What a path is: outside every view, a view's directory, a file of it, or a
 * name in a view's directory that is not one of its files. */
#define MMFS_PATH_OTHER 0
#define MMFS_PATH_DIR 1
#define MMFS_PATH_FILE 2
#define MMFS_PATH_MISSING 3

/* 1 if views[0..n) are sorted by path (strcmp), as mmfs_view_find needs. */
int mmfs_view_sorted(const mmfs_view *views, int32_t n);

/* Classify path against views[0..n) (sorted by path: a lookup is a binary
 * search, however many views there are); sets *view for DIR, FILE and
 * MISSING and *file for FILE. A file name is exactly name_width digits, then
 * ".bin", naming a file below the count. */
int mmfs_view_find(const mmfs_view *views, int32_t n, const char *path, int32_t *view,
                   int64_t *file);

/* The name of file `file` ("0000042.bin") into out[size]; its length, or a
 * negative error. */
int mmfs_view_name(const mmfs_view *v, int64_t file, char *out, int32_t size);

/* Size in bytes of file `file`, or a negative error. */
int64_t mmfs_view_size(const mmfs_view *v, int64_t file);

/* Bytes [offset, offset + size) of file `file` into out (fewer at its end);
 * the number written, or a negative error. */
int64_t mmfs_view_read(const mmfs_view *v, int64_t file, int64_t offset, int64_t size,
                       uint8_t *out);

#endif
