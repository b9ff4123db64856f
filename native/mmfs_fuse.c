/* mmfs FUSE handlers for the views' files. See mmfs_fuse.h. */
#include "mmfs_native.h"
#include "mmfs_views.h"
#include "mmfs_fuse.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>
#include <sys/stat.h>

/* libfuse 2's and 3's fuse_fill_dir_t: 3 adds flags (mmfs passes none). */
typedef int (*fill2_fn)(void *buf, const char *name, const struct stat *st, int64_t off);
typedef int (*fill3_fn)(void *buf, const char *name, const struct stat *st, int64_t off, int flags);

static int fill(void *filler, int v3, void *buf, const char *name, const struct stat *st, int64_t off) {
    return v3 ? ((fill3_fn)filler)(buf, name, st, off, 0) : ((fill2_fn)filler)(buf, name, st, off);
}

static const mmfs_view *g_views;
static int32_t g_num_views;
static uint32_t g_uid, g_gid;
static mmfs_fuse_fallback g_fallback;

/* Views made while mounted (the stream layouts looked up): a second sorted
 * table that Python swaps; every handler reads it under the read lock, so the
 * old table is no longer used once mmfs_fuse_set_dynamic returns. */
static pthread_rwlock_t g_dyn_lock = PTHREAD_RWLOCK_INITIALIZER;
static const mmfs_view *g_dyn;
static int32_t g_num_dyn;
static int64_t *g_dyn_used;
static int64_t g_tick;
static mmfs_read_hook g_read_hook;

/* Requests counted by kind (mmfs_fuse_requests), READs in the handler now and at most. */
enum { KIND_GETATTR, KIND_READ, KIND_READDIR, KIND_IOCTL, KINDS };
static const char *const g_kind_names[KINDS] = {"getattr", "read", "readdir", "ioctl"};
static int64_t g_requests[KINDS];
static int64_t g_reading, g_reading_peak;

static void count(int kind) { __atomic_add_fetch(&g_requests[kind], 1, __ATOMIC_RELAXED); }

const char *mmfs_fuse_request_name(int32_t kind) { return kind >= 0 && kind < KINDS ? g_kind_names[kind] : NULL; }

int64_t mmfs_fuse_requests(int32_t kind) {
    return kind >= 0 && kind < KINDS ? __atomic_load_n(&g_requests[kind], __ATOMIC_RELAXED) : -1;
}

int64_t mmfs_fuse_reads_at_once(void) { return __atomic_load_n(&g_reading_peak, __ATOMIC_RELAXED); }

static void reading_starts(void) {
    int64_t now = __atomic_add_fetch(&g_reading, 1, __ATOMIC_RELAXED);
    int64_t peak = __atomic_load_n(&g_reading_peak, __ATOMIC_RELAXED);
    while (now > peak && !__atomic_compare_exchange_n(&g_reading_peak, &peak, now, 1, __ATOMIC_RELAXED,
                                                      __ATOMIC_RELAXED)) {
    }
}

void mmfs_fuse_set_read_hook(mmfs_read_hook hook) {
    __atomic_store_n(&g_read_hook, hook, __ATOMIC_RELEASE);
}

int64_t mmfs_fuse_tick(void) { return __atomic_add_fetch(&g_tick, 1, __ATOMIC_RELAXED); }

int mmfs_fuse_set_dynamic(const mmfs_view *views, int32_t n, int64_t *used) {
    if (n < 0 || (n > 0 && (!views || !used)) || !mmfs_view_sorted(views, n)) return MMFS_E_ARG;
    pthread_rwlock_wrlock(&g_dyn_lock);
    g_dyn = views;
    g_num_dyn = n;
    g_dyn_used = used;
    pthread_rwlock_unlock(&g_dyn_lock);
    return MMFS_OK;
}

/* Find path in the mount's views (*d its index), then in the dynamic ones (*d
 * -1; the caller holds the read lock); a use of a dynamic view is stamped for
 * Python's least-recently-used choice. */
static int find(const char *path, const mmfs_view **v, int32_t *d, int64_t *file) {
    int kind = mmfs_view_find(g_views, g_num_views, path, d, file);
    if (kind != MMFS_PATH_OTHER) {
        *v = &g_views[*d];
        return kind;
    }
    int32_t e;
    kind = g_num_dyn ? mmfs_view_find(g_dyn, g_num_dyn, path, &e, file) : MMFS_PATH_OTHER;
    if (kind != MMFS_PATH_OTHER) {
        *v = &g_dyn[e];
        *d = -1;
        __atomic_store_n(&g_dyn_used[e], mmfs_fuse_tick(), __ATOMIC_RELAXED);
    }
    return kind;
}

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
static int view_stat_locked(const char *path, struct stat *st, int *rc) {
    const mmfs_view *v;
    int32_t d;
    int64_t file;
    switch (find(path, &v, &d, &file)) {
    case MMFS_PATH_DIR:
        fill_stat(st, v, -1);
        *rc = 0;
        return 1;
    case MMFS_PATH_FILE: {
        int64_t size = mmfs_view_size(v, file);
        if (size < 0) return 0; /* Python logs why, and answers EIO */
        fill_stat(st, v, size);
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

static int view_stat(const char *path, struct stat *st, int *rc) {
    pthread_rwlock_rdlock(&g_dyn_lock);
    int answered = view_stat_locked(path, st, rc);
    pthread_rwlock_unlock(&g_dyn_lock);
    return answered;
}

int mmfs_fuse_getattr(const char *path, void *st) {
    int rc;
    mmfs_latency_touch();
    count(KIND_GETATTR);
    return view_stat(path, st, &rc) ? rc : g_fallback.getattr(path, st);
}

int mmfs_fuse_fgetattr(const char *path, void *st, void *fi) {
    int rc;
    mmfs_latency_touch();
    count(KIND_GETATTR);
    return view_stat(path, st, &rc) ? rc : g_fallback.fgetattr(path, st, fi);
}

int mmfs_fuse3_getattr(const char *path, void *st, void *fi) { return mmfs_fuse_fgetattr(path, st, fi); }

/* 1 if answered (into *rc); 0 to hand over to Python: *d >= 0 for a failed
 * read of that view's file (*file, error *failed), else the whole request. */
static int read_locked(const char *path, char *buf, size_t size, int64_t offset, int *rc, int32_t *d,
                       int64_t *file, int64_t *failed) {
    const mmfs_view *v;
    *d = -1;
    switch (find(path, &v, d, file)) {
    case MMFS_PATH_FILE:
        *failed = mmfs_view_read(v, *file, offset, (int64_t)size, (uint8_t *)buf);
        *rc = (int)*failed;
        return *failed >= 0;
    case MMFS_PATH_DIR:
        *rc = -EISDIR;
        return 1;
    case MMFS_PATH_MISSING:
        *rc = -ENOENT;
        return 1;
    default:
        *d = -1;
        return 0;
    }
}

/* Tell the hook that a view's file is about to be read from its start. The view's
 * path is copied under the lock and the hook runs after it (a dynamic table may
 * be swapped once the lock is released; the hook may wait for fetches). */
static void tell(mmfs_read_hook hook, const char *path) {
    char view_path[4096];
    const mmfs_view *v;
    int32_t d;
    int64_t file;
    int found = 0;
    pthread_rwlock_rdlock(&g_dyn_lock);
    if (find(path, &v, &d, &file) == MMFS_PATH_FILE && strlen(v->path) < sizeof view_path) {
        strcpy(view_path, v->path);
        found = 1;
    }
    pthread_rwlock_unlock(&g_dyn_lock);
    if (found) hook(view_path, file);
}

static int read_counted(const char *path, char *buf, size_t size, int64_t offset, void *fi) {
    int rc;
    int32_t d;
    int64_t file = 0, failed = 0; /* set by read_locked where it does not answer */
    mmfs_read_hook hook = __atomic_load_n(&g_read_hook, __ATOMIC_ACQUIRE);
    if (hook && offset == 0) tell(hook, path);
    pthread_rwlock_rdlock(&g_dyn_lock);
    int answered = read_locked(path, buf, size, offset, &rc, &d, &file, &failed);
    pthread_rwlock_unlock(&g_dyn_lock);
    if (answered) return rc;
    /* A dynamic view's failed read goes to Python as a request: it reads again and logs why. */
    return d >= 0 ? g_fallback.read_failed(d, file, failed, size, offset)
                  : g_fallback.read(path, buf, size, offset, fi);
}

int mmfs_fuse_read(const char *path, char *buf, size_t size, int64_t offset, void *fi) {
    mmfs_latency_touch();
    count(KIND_READ);
    reading_starts();
    int rc = read_counted(path, buf, size, offset, fi);
    __atomic_sub_fetch(&g_reading, 1, __ATOMIC_RELAXED);
    return rc;
}

int mmfs_fuse_ioctl(const char *path, int cmd, void *arg, void *fi, unsigned int flags, void *data) {
    (void)path, (void)cmd, (void)arg, (void)fi, (void)flags, (void)data;
    mmfs_latency_touch();
    count(KIND_IOCTL);
    return -ENOTTY;
}

/* 1 if answered (into *rc), 0 to hand over to Python. */
static int readdir_locked(const char *path, void *buf, void *filler, int v3, int64_t offset, int *rc) {
    const mmfs_view *v;
    int32_t d;
    int64_t file;
    int kind = find(path, &v, &d, &file);
    *rc = kind == MMFS_PATH_FILE ? -ENOTDIR : kind == MMFS_PATH_MISSING ? -ENOENT : 0;
    if (kind != MMFS_PATH_DIR) return kind != MMFS_PATH_OTHER;
    /* Entry k (0 = ".", 1 = "..", then the files) carries offset k + 1, the
     * place to resume: libfuse asks for the directory a buffer at a time. Only
     * the type of st matters to a listing. */
    struct stat dir_st = {.st_mode = S_IFDIR | 0555}, file_st = {.st_mode = S_IFREG | 0444};
    int64_t k = offset < 0 ? 0 : offset;
    for (; k < 2; ++k)
        if (fill(filler, v3, buf, k == 0 ? "." : "..", &dir_st, k + 1)) return 1;
    char name[32];
    for (int64_t i = k - 2; i < v->count; ++i) {
        if (mmfs_view_name(v, i, name, sizeof name) < 0) {
            *rc = -EIO;
            return 1;
        }
        if (fill(filler, v3, buf, name, &file_st, i + 3)) break;
    }
    return 1;
}

static int readdir_either(const char *path, void *buf, void *filler, int v3, int64_t offset, void *fi) {
    int rc;
    mmfs_latency_touch();
    count(KIND_READDIR);
    pthread_rwlock_rdlock(&g_dyn_lock);
    int answered = readdir_locked(path, buf, filler, v3, offset, &rc);
    pthread_rwlock_unlock(&g_dyn_lock);
    return answered ? rc : g_fallback.readdir(path, buf, filler, offset, fi);
}

int mmfs_fuse_readdir(const char *path, void *buf, void *filler, int64_t offset, void *fi) {
    return readdir_either(path, buf, filler, 0, offset, fi);
}

int mmfs_fuse3_readdir(const char *path, void *buf, void *filler, int64_t offset, void *fi, int flags) {
    (void)flags; /* FUSE_READDIR_PLUS: libfuse looks entries up itself when asked; mmfs fills names */
    return readdir_either(path, buf, filler, 1, offset, fi);
}

static const int g_watched[3] = {SIGINT, SIGTERM, SIGHUP};
static struct sigaction g_libfuse_handler[3];
static volatile sig_atomic_t g_signal;

static void note_signal(int sig) {
    g_signal = sig;
    for (int i = 0; i < 3; ++i)
        if (g_watched[i] == sig && !(g_libfuse_handler[i].sa_flags & SA_SIGINFO) &&
            g_libfuse_handler[i].sa_handler != SIG_DFL && g_libfuse_handler[i].sa_handler != SIG_IGN)
            g_libfuse_handler[i].sa_handler(sig);
}

void mmfs_fuse_watch_signals(void) {
    for (int i = 0; i < 3; ++i) {
        struct sigaction mine;
        if (sigaction(g_watched[i], NULL, &g_libfuse_handler[i]) != 0) continue;
        /* Only in front of a handler libfuse put there (a plain one, as it installs). */
        if ((g_libfuse_handler[i].sa_flags & SA_SIGINFO) || g_libfuse_handler[i].sa_handler == SIG_DFL ||
            g_libfuse_handler[i].sa_handler == SIG_IGN || g_libfuse_handler[i].sa_handler == note_signal)
            continue;
        memset(&mine, 0, sizeof mine);
        mine.sa_handler = note_signal;
        sigemptyset(&mine.sa_mask);
        sigaction(g_watched[i], &mine, NULL);
    }
}

int mmfs_fuse_signal(void) { return g_signal; }
