/* The open-files table (see mmfs_files.h): registered files, the descriptors
 * open now in a list of most recent use, and a cap on how many stay open. One
 * mutex guards it all; it is held for an open(2) and fstat(2), never for a
 * read. */
#include "mmfs_files.h"
#include "mmfs_io.h"
#include "mmfs_native.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

typedef struct {
    char *path;                    /* NULL: forgotten */
    uint64_t size, mtime_ns, inode; /* its identity, when known */
    int32_t known;                  /* 0: taken at the first open */
    int64_t ctime_ns;               /* its change time at the first open (0: not opened yet) */
    int32_t fd;                    /* -1: closed */
    int32_t users;                 /* reads holding fd now */
    int32_t forgotten;             /* close and drop once the last user is done */
    int64_t newer, older;          /* neighbours in the list of open files (ids; 0: none) */
} entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry *entries; /* entries[id - 1] */
static int64_t used, allocated;
static int64_t newest, oldest; /* ends of the list of open files */
static mmfs_files_counts counts = {.limit = 256};

static entry *find(int64_t id) {
    return id >= 1 && id <= used && entries[id - 1].path ? &entries[id - 1] : NULL;
}

static void unlink_open(entry *e) {
    if (e->newer) entries[e->newer - 1].older = e->older;
    else newest = e->older;
    if (e->older) entries[e->older - 1].newer = e->newer;
    else oldest = e->newer;
    e->newer = e->older = 0;
}

static void push_newest(int64_t id, entry *e) {
    e->newer = 0;
    e->older = newest;
    if (newest) entries[newest - 1].newer = id;
    newest = id;
    if (!oldest) oldest = id;
}

static void close_entry(int64_t id, entry *e) {
    unlink_open(e);
    close(e->fd);
    e->fd = -1;
    counts.open--;
}

/* Close idle descriptors, least recently used first, until fewer than `keep`
 * are open (or none idle is left). */
static void close_idle(int64_t keep) {
    int64_t id = oldest;
    while (id && counts.open > keep) {
        entry *e = &entries[id - 1];
        int64_t newer = e->newer;
        if (e->users == 0) {
            close_entry(id, e);
            counts.closed++;
        }
        id = newer;
    }
}

static uint64_t mtime_of(const struct stat *st) {
    return (uint64_t)((int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec);
}

/* Whether st is the file of identity {size, mtime_ns, inode}, compared unsigned. */
static int same_file(const struct stat *st, uint64_t size, uint64_t mtime_ns, uint64_t inode) {
    return S_ISREG(st->st_mode) && (uint64_t)st->st_size == size && mtime_of(st) == mtime_ns &&
           (uint64_t)st->st_ino == inode;
}

static int64_t ctime_of(const struct stat *st) {
    return (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
}

/* Whether st is the file e was registered as (and first opened as: its change
 * time then, which a rewrite that puts the old mtime back still moves). */
static int same_entry(const entry *e, const struct stat *st) {
    return same_file(st, e->size, e->mtime_ns, e->inode) && (e->ctime_ns == 0 || ctime_of(st) == e->ctime_ns);
}

/* Open e's file and check that it is still the file registered. */
static int open_entry(entry *e) {
    /* O_NONBLOCK: a FIFO put in the file's place must not block the open */
    int fd = open(e->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
        close_idle(0); /* out of descriptors: give back every idle one, then try again */
        fd = open(e->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    }
    if (fd < 0) return MMFS_E_IO;
    counts.opened++;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return MMFS_E_IO;
    }
    if (!e->known) {
        e->size = (uint64_t)st.st_size;
        e->mtime_ns = mtime_of(&st);
        e->inode = (uint64_t)st.st_ino;
        e->known = 1;
    }
    if (!same_entry(e, &st)) {
        close(fd);
        counts.changed++;
        return MMFS_E_CHANGED;
    }
    if (e->ctime_ns == 0) e->ctime_ns = ctime_of(&st);
    e->fd = fd;
    return MMFS_OK;
}

int64_t mmfs_file_add(const char *path, const uint64_t *identity) {
    char *copy = strdup(path);
    if (!copy) return MMFS_E_NOMEM;
    pthread_mutex_lock(&lock);
    if (used == allocated) {
        int64_t more = allocated ? 2 * allocated : 1024;
        entry *grown = realloc(entries, (size_t)more * sizeof(entry));
        if (!grown) {
            pthread_mutex_unlock(&lock);
            free(copy);
            return MMFS_E_NOMEM;
        }
        entries = grown;
        allocated = more;
    }
    int32_t known = identity[0] != 0;
    entries[used] = (entry){copy, known ? identity[1] : 0, known ? identity[2] : 0, known ? identity[3] : 0,
                            known, 0, -1, 0, 0, 0, 0};
    int64_t id = ++used;
    counts.known++;
    pthread_mutex_unlock(&lock);
    return id;
}

static void drop(int64_t id, entry *e) {
    if (e->fd >= 0) close_entry(id, e);
    free(e->path);
    e->path = NULL;
    counts.known--;
}

void mmfs_file_forget(int64_t id) {
    pthread_mutex_lock(&lock);
    entry *e = find(id);
    if (e && !e->forgotten) {
        if (e->users) e->forgotten = 1; /* the last reader drops it */
        else drop(id, e);
    }
    pthread_mutex_unlock(&lock);
}

int32_t mmfs_file_acquire(int64_t id) {
    pthread_mutex_lock(&lock);
    entry *e = find(id);
    if (!e || e->forgotten) {
        pthread_mutex_unlock(&lock);
        return MMFS_E_ARG;
    }
    if (e->fd < 0) {
        close_idle(counts.limit - 1);
        int rc = open_entry(e);
        if (rc < 0) {
            int saved = errno;
            pthread_mutex_unlock(&lock);
            errno = saved;
            return rc;
        }
        counts.open++;
        push_newest(id, e);
    } else if (newest != id) {
        unlink_open(e);
        push_newest(id, e);
    }
    e->users++;
    int32_t fd = e->fd;
    pthread_mutex_unlock(&lock);
    return fd;
}

/* Give back a descriptor (under the lock); `st`, when given, is the file as it is
 * now: whether it is still the file registered (MMFS_OK or MMFS_E_CHANGED). */
static int give_back(int64_t id, const struct stat *st) {
    int rc = MMFS_OK;
    pthread_mutex_lock(&lock);
    entry *e = id >= 1 && id <= used ? &entries[id - 1] : NULL;
    if (st && !(e && e->path && same_entry(e, st))) {
        counts.changed++;
        rc = MMFS_E_CHANGED;
    }
    if (e && e->path && e->users > 0 && --e->users == 0) {
        if (e->forgotten) drop(id, e);
        else if (counts.open > counts.limit) close_idle(counts.limit);
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

void mmfs_file_release(int64_t id) {
    give_back(id, NULL);
}

int mmfs_file_release_unchanged(int64_t id, int32_t fd) {
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int saved = errno;
        give_back(id, NULL);
        errno = saved;
        return MMFS_E_IO;
    }
    return give_back(id, &st);
}

static int32_t copy_one(const char *path, const uint64_t *identity, int32_t head_size, uint8_t *head,
                        int64_t offset, int64_t length, uint8_t *to) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return MMFS_E_IO;
    struct stat st;
    int32_t rc = MMFS_E_IO;
    if (fstat(fd, &st) != 0) goto done;
    if (!S_ISREG(st.st_mode) || (identity[0] && !same_file(&st, identity[1], identity[2], identity[3]))) {
        rc = MMFS_E_CHANGED;
        goto done;
    }
    if (offset > 0 && offset <= head_size) {
        /* Header and data in one read (most files): the head is the file's first bytes as before. */
        struct iovec parts[2] = {{head, (size_t)offset}, {to, (size_t)length}};
        ssize_t k;
        do {
            k = preadv(fd, parts, 2, 0);
        } while (k < 0 && errno == EINTR);
        if (k == offset + length) {
            int64_t more = head_size - offset < length ? head_size - offset : length;
            memcpy(head + offset, to, (size_t)more);
            rc = (int32_t)(offset + more);
            goto done;
        }
    }
    int64_t got_head = read_fully(fd, head, head_size, 0);
    int64_t got_data = read_fully(fd, to, length, offset);
    if (got_head < 0 || got_data < 0) goto done;
    rc = got_data < length ? MMFS_E_CHANGED : (int32_t)got_head;
done:
    close(fd);
    return rc;
}

typedef struct {
    const char *const *paths;
    const uint64_t *identity;
    const int64_t *offsets, *lengths, *at;
    int32_t head_size;
    uint8_t *heads, *out;
    int32_t *got;
    int64_t begin, end;
} copy_job;

static void *copy_range(void *arg) {
    const copy_job *j = arg;
    for (int64_t i = j->begin; i < j->end; ++i)
        j->got[i] = copy_one(j->paths[i], j->identity + MMFS_IDENTITY_WORDS * i, j->head_size, j->heads + i * (int64_t)j->head_size,
                             j->offsets[i], j->lengths[i], j->out + j->at[i]);
    return NULL;
}

/* Files copied per thread at least: fewer are not worth a thread. */
#define COPY_PER_THREAD 2048
#define COPY_THREADS 4

void mmfs_files_copy(const char *paths, int64_t n, const uint64_t *identity, int32_t head_size,
                     uint8_t *heads, int32_t *got, const int64_t *offsets, const int64_t *lengths,
                     uint8_t *out, const int64_t *at) {
    if (n <= 0) return;
    const char **starts = malloc((size_t)n * sizeof *starts);
    if (!starts) {
        for (int64_t i = 0; i < n; ++i) got[i] = MMFS_E_NOMEM;
        return;
    }
    const char *path = paths;
    for (int64_t i = 0; i < n; ++i) {
        starts[i] = path;
        path += strlen(path) + 1;
    }
    /* Each file is opened, checked and read on its own (the kernel's time, mostly):
     * tens of thousands of them are shared among a few threads, each a range. */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t threads = n / COPY_PER_THREAD;
    if (threads > COPY_THREADS) threads = COPY_THREADS;
    if (threads > cpus) threads = cpus;
    if (threads < 1) threads = 1;
    copy_job jobs[COPY_THREADS];
    pthread_t ids[COPY_THREADS];
    int started[COPY_THREADS] = {0};
    for (int64_t t = 0; t < threads; ++t) {
        jobs[t] = (copy_job){starts, identity, offsets, lengths, at, head_size, heads, out, got,
                             n * t / threads, n * (t + 1) / threads};
        started[t] = t > 0 && pthread_create(&ids[t], NULL, copy_range, &jobs[t]) == 0;
    }
    copy_range(&jobs[0]);
    for (int64_t t = 1; t < threads; ++t) {
        if (started[t]) pthread_join(ids[t], NULL);
        else copy_range(&jobs[t]); /* no thread: done here */
    }
    free(starts);
}

int64_t mmfs_file_path(int64_t id, char *out, int64_t capacity) {
    pthread_mutex_lock(&lock);
    entry *e = find(id);
    int64_t n = -1;
    if (e) {
        n = (int64_t)strlen(e->path);
        if (capacity > 0) {
            int64_t m = n < capacity - 1 ? n : capacity - 1;
            memcpy(out, e->path, (size_t)m);
            out[m] = 0;
        }
    }
    pthread_mutex_unlock(&lock);
    return n;
}

void mmfs_files_set_limit(int32_t max_open) {
    pthread_mutex_lock(&lock);
    counts.limit = max_open > 0 ? max_open : 1;
    close_idle(counts.limit);
    pthread_mutex_unlock(&lock);
}

void mmfs_files_counts_get(mmfs_files_counts *out) {
    pthread_mutex_lock(&lock);
    *out = counts;
    pthread_mutex_unlock(&lock);
}

void *mmfs_map_file(int32_t fd, int64_t length) {
    if (length <= 0) {
        errno = EINVAL;
        return NULL;
    }
    void *p = mmap(NULL, (size_t)length, PROT_READ, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

int mmfs_unmap(void *address, int64_t length) {
    return munmap(address, (size_t)length);
}
