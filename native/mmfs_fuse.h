/* mmfs FUSE handlers for sample files, in C (libfuse 2 high-level API).
 *
 * fusepy calls Python for every request. For the requests that dominate a
 * training loader (the attributes, the bytes and the listing of a sample
 * file) mmfs installs these C handlers in fusepy's operations table instead;
 * they answer from the sample reader without entering Python, and hand every
 * other path to the Python handlers given as the fallback.
 */
#include <stddef.h>
#include <stdint.h>

/* One directory of sample files, "/<split>/samples". */
typedef struct {
    const char *path;        /* e.g. "/train/samples" (no trailing slash) */
    const mmfs_split *split;
    int32_t name_width;      /* digits in a file name, before ".bin" */
    int64_t sample_bytes;    /* size of every sample file */
    const void *file_stat;   /* struct stat of every sample file */
    const void *dir_stat;    /* struct stat for "." and ".." in listings */
} mmfs_sample_dir;

/* The Python handlers: for paths outside the sample directories, and for
 * sample reads that fail (so that the daemon's log says why). */
typedef struct {
    int (*getattr)(const char *path, void *st);
    int (*fgetattr)(const char *path, void *st, void *fi);
    int (*read)(const char *path, char *buf, size_t size, int64_t offset, void *fi);
    int (*readdir)(const char *path, void *buf, void *filler, int64_t offset, void *fi);
} mmfs_fuse_fallback;

/* Install the sample directories (kept by the caller for the whole mount);
 * stat_size is the size of struct stat. Call before the FUSE loop starts. */
int mmfs_fuse_configure(const mmfs_sample_dir *dirs, int32_t num_dirs,
                        size_t stat_size, const mmfs_fuse_fallback *fallback);

int mmfs_fuse_getattr(const char *path, void *st);
int mmfs_fuse_fgetattr(const char *path, void *st, void *fi);
int mmfs_fuse_read(const char *path, char *buf, size_t size, int64_t offset, void *fi);
int mmfs_fuse_readdir(const char *path, void *buf, void *filler, int64_t offset, void *fi);

/* A PM QoS request held while requests flow (see mmfs/latency.py for why):
 * mmfs_latency_touch() on every request opens `device` and writes 0 to it if
 * not held already; a thread closes it after idle_ms without a touch.
 * start returns 0, or a negative errno when the thread cannot start. */
int mmfs_latency_start(const char *device, int64_t idle_ms);
void mmfs_latency_touch(void);
int mmfs_latency_held(void);
void mmfs_latency_stop(void);
