/* Local files the readers read with pread, opened on first use and closed when
 * idle: a mount of ten thousand datasets (eight files each) holds a few hundred
 * descriptors at most, whatever the blend.
 *
 * Each file is known by an id (> 0, never reused in the process). Its identity
 * (size, mtime, inode), as the indices were made from it, and its change time
 * (ctime) at the first open, are checked at every open and after every read
 * (mmfs_file_release_unchanged, one fstat): a file replaced or rewritten since, even in
 * place while open, gives MMFS_E_CHANGED (the read gets EIO and a log line),
 * never its new bytes. Thread-safe: a descriptor in use by one reader is never
 * closed under it.
 */
#ifndef MMFS_FILES_H
#define MMFS_FILES_H
#include <stdint.h>

#define MMFS_E_CHANGED -12     /* a file is not the one the indices were made from */
/* A file's identity is MMFS_IDENTITY_WORDS unsigned 64-bit words: known (0: take
 * the first open's), size, mtime_ns (a signed time, as two's complement) and inode.
 * Unsigned, as stat gives them: inode numbers of FUSE and network file systems
 * (rclone's, ...) reach 2^63 and beyond, so no value is free to mean "unknown". */
#define MMFS_IDENTITY_WORDS 4

/* Register a file (nothing is opened) with its identity (MMFS_IDENTITY_WORDS words);
 * its id (> 0), or MMFS_E_NOMEM. */
int64_t mmfs_file_add(const char *path, const uint64_t *identity);

/* Close a file and drop it (its id is never used again). */
void mmfs_file_forget(int64_t id);

/* An open descriptor of file id for one read (>= 0; opened here if it is not),
 * or a negative MMFS_E_*: MMFS_E_CHANGED, MMFS_E_IO with errno set (the open
 * failed), MMFS_E_ARG (no such id). Each descriptor got is given back with
 * mmfs_file_release. */
int32_t mmfs_file_acquire(int64_t id);
void mmfs_file_release(int64_t id);

/* mmfs_file_release after a read of descriptor fd of file id, checking first that
 * the file is still the one registered (its size, mtime, inode and ctime, by one
 * fstat): MMFS_OK, else MMFS_E_CHANGED (counted in `changed`) or MMFS_E_IO (fstat
 * failed, errno set). A writer changes the mtime before its bytes, so bytes read
 * before a check that found the file unchanged are the registered file's: a rewrite
 * in place is refused from the first read after it, never served. */
int mmfs_file_release_unchanged(int64_t id, int32_t fd);

/* The path of file id into out (NUL-terminated, cut to capacity); its length,
 * or -1 for an id not known. */
int64_t mmfs_file_path(int64_t id, char *out, int64_t capacity);

/* Keep at most max_open descriptors open (idle ones are closed, least recently
 * used first); descriptors in use are never closed, so more may be open for a
 * moment while many threads read. */
void mmfs_files_set_limit(int32_t max_open);

/* Copies of the arrays of many small files in one call, without the table: each
 * file is opened, checked to be the file given and closed, one at a time (tens of
 * thousands shared among up to four threads, each holding one descriptor). File i
 * is the i-th NUL-terminated path in `paths` (one after another); its identity the
 * MMFS_IDENTITY_WORDS words at identity + 4i (not known: not checked). Its first head_size bytes go to
 * heads + i * head_size (for a header check), lengths[i] bytes from offsets[i] to
 * out + at[i] (0 bytes: the heads alone, for a check). got[i]: bytes of head
 * read, or MMFS_E_IO (it could not be opened or read) or MMFS_E_CHANGED (not the
 * file given, or shorter than its array). */
void mmfs_files_copy(const char *paths, int64_t n, const uint64_t *identity, int32_t head_size,
                     uint8_t *heads, int32_t *got, const int64_t *offsets, const int64_t *lengths,
                     uint8_t *out, const int64_t *at);

/* What the table did so far, for tests and benchmarks. */
typedef struct {
    int64_t known;    /* files registered and not forgotten */
    int64_t open;     /* descriptors open now */
    int64_t limit;    /* the cap on open descriptors */
    int64_t opened;   /* open(2) calls made */
    int64_t closed;   /* descriptors closed to stay under the cap */
    int64_t changed;  /* opens and reads refused: the file was not the one registered */
} mmfs_files_counts;

void mmfs_files_counts_get(mmfs_files_counts *out);

/* A read-only, shared map of bytes [0, length) of the file open as fd, which the
 * caller may close at once (a map holds no descriptor; Python's mmap keeps one
 * open per map). NULL with errno set when it cannot be mapped. */
void *mmfs_map_file(int32_t fd, int64_t length);
int mmfs_unmap(void *address, int64_t length);

#endif
