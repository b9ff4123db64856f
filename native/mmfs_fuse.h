/* mmfs FUSE handlers for the views' files, in C (libfuse 2's and 3's high-level API).
 *
 * fusepy calls Python for every request. For the requests that dominate a
 * loader (the attributes, the bytes and the listing of the files of every
 * view: samples, documents, sequences, micro-batches) mmfs puts these C
 * handlers into the operations table instead; they answer from the views
 * (mmfs_views.h) without entering Python, and hand every other path
 * (mmfs.json, symlinks, the directories above the views) to the Python
 * handlers given as the fallback.
 */
#ifndef MMFS_FUSE_H
#define MMFS_FUSE_H
#include <stddef.h>
#include <stdint.h>

#include "mmfs_views.h"

/* The Python handlers: for paths outside the views, and for a read of a
 * view's file that failed. read_failed gets the whole case once: which file
 * of which view, the C core's code (mmfs_last_error still holds the file,
 * byte and reason), the request; it logs one line and returns -EIO. */
typedef struct {
    int (*getattr)(const char *path, void *st);
    int (*fgetattr)(const char *path, void *st, void *fi);
    int (*read)(const char *path, char *buf, size_t size, int64_t offset, void *fi);
    int (*readdir)(const char *path, void *buf, void *filler, int64_t offset, void *fi);
    int (*read_failed)(int32_t view, int64_t file, int64_t rc, size_t size, int64_t offset);
} mmfs_fuse_fallback;

/* Serve views[0..n) (kept by the caller for the whole mount) with files owned
 * by uid:gid; stat_size is the size of struct stat as the caller's binding
 * declares it (a check that it covers the fields up to the times, as libfuse's
 * does). Call before the FUSE loop. */
int mmfs_fuse_configure(const mmfs_view *views, int32_t n, uint32_t uid, uint32_t gid,
                        size_t stat_size, const mmfs_fuse_fallback *fallback);

/* Serve also views[0..n) (sorted by path; none with n = 0), the views made
 * while mounted; replaces the previous table, which is unused once this
 * returns. used[d] is stamped with mmfs_fuse_tick() on each use of views[d]. */
int mmfs_fuse_set_dynamic(const mmfs_view *views, int32_t n, int64_t *used);
/* The clock of those stamps: its next value. */
int64_t mmfs_fuse_tick(void);

/* Told of the first read (at offset 0) of each file of a view (the mount's own
 * or a dynamic one) before it is served: the view's path (a copy, valid during
 * the call) and the file; the prefetcher of a mount whose data is remote. NULL
 * (the default): nothing is told. */
typedef void (*mmfs_read_hook)(const char *view_path, int64_t file);
void mmfs_fuse_set_read_hook(mmfs_read_hook hook);

/* The handlers, for libfuse 2's struct fuse_operations (getattr, fgetattr, read,
 * readdir, ioctl) and libfuse 3's (mmfs_fuse3_getattr, read, mmfs_fuse3_readdir,
 * ioctl): libfuse 3 passes getattr the file info and readdir flags, and its filler
 * takes flags; it has no fgetattr. The Python fallbacks keep libfuse 2's shapes
 * (a libfuse 3 getattr goes to fgetattr; readdir's filler is passed on as given). */
int mmfs_fuse_getattr(const char *path, void *st);
int mmfs_fuse_fgetattr(const char *path, void *st, void *fi);
int mmfs_fuse3_getattr(const char *path, void *st, void *fi);
int mmfs_fuse_read(const char *path, char *buf, size_t size, int64_t offset, void *fi);
int mmfs_fuse_readdir(const char *path, void *buf, void *filler, int64_t offset, void *fi);
int mmfs_fuse3_readdir(const char *path, void *buf, void *filler, int64_t offset, void *fi, int flags);
/* Every ioctl(2) on a file of the mount (Python's open() asks isatty: TCGETS):
 * -ENOTTY. The kernel forwards each one; no answer makes it stop asking. */
int mmfs_fuse_ioctl(const char *path, int cmd, void *arg, void *fi, unsigned int flags, void *data);

/* libfuse 3's main returns 8 (its loop's error) when SIGINT, SIGTERM or SIGHUP ended
 * the loop, as for a failure (libfuse 2's returns 0). mmfs_fuse_watch_signals(), called
 * once the loop runs (from init: libfuse has put in its handlers), puts a handler in
 * front of libfuse's for each of the three that notes the signal and calls libfuse's;
 * mmfs_fuse_signal() gives the signal that ended the loop (0: none). */
void mmfs_fuse_watch_signals(void);
int mmfs_fuse_signal(void);

/* The requests the handlers above were sent, counted by kind since the mount
 * (LOOKUP and GETATTR both reach getattr in libfuse 2's high-level API; a request
 * handed over to Python counts too): kind k's name, NULL past the last kind, and
 * its count. reads_at_once: the most READs in the handler at one time. */
const char *mmfs_fuse_request_name(int32_t kind);
int64_t mmfs_fuse_requests(int32_t kind);
int64_t mmfs_fuse_reads_at_once(void);

/* A PM QoS request held while requests flow, only with `-o low_latency` (see
 * mmfs/latency.py): mmfs_latency_touch() on every request opens `device` and
 * writes 0 to it if not held already; a thread closes it after idle_ms
 * without a touch. Without mmfs_latency_start, touch does nothing.
 * start returns 0, or a negative errno when the thread cannot start. */
int mmfs_latency_start(const char *device, int64_t idle_ms);
void mmfs_latency_touch(void);
int mmfs_latency_held(void);
void mmfs_latency_stop(void);
/* For tests, a clock set by hand instead of the real one (ms >= 0; -1: the real one
 * again, as after stop): touches and the releaser read it. Returns how many times the
 * releaser had looked at the idle time before it was set; mmfs_latency_checks() counts
 * on, so a count past that one is a look at the new time. */
int64_t mmfs_latency_set_clock(int64_t ms);
int64_t mmfs_latency_checks(void);

#endif
