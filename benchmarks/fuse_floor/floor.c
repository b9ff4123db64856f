/* The fastest FUSE daemon we can write for mmfs's read path: the floor that
 * benchmarks/fuse_floor.py compares a mount with.
 *
 * It serves a tree whose every answer was computed before the mount: the names,
 * sizes and bytes of a mount's files, packed by the benchmark into one file that
 * is read whole into memory here. libfuse 3's low-level API, OPEN answered ENOSYS
 * (the kernel then sends no OPEN, RELEASE or FLUSH: a cold file costs a LOOKUP
 * and a READ), a day of entry and attribute caching, and the same max_background
 * and congestion threshold as an mmfs mount. Nothing is computed on a request but
 * a hash look-up or a pointer into the bytes.
 *
 *     cc -O2 floor.c $(pkg-config --cflags --libs fuse3) -o floor
 *     floor PACK MOUNTPOINT [-s] [-f] [-o OPTIONS]
 *
 * PACK: "MMFSFLR1", u64 entry count, then per entry (inode i + 2, the root being 1)
 * u64 parent inode, u32 mode (S_IFDIR or S_IFREG), u64 size, u64 data offset (from
 * the start of the data), u16 name length, the name; then the data. Entries of a
 * directory are contiguous, so a directory lists a range of them.
 */
#define FUSE_USE_VERSION 34
#include <fuse_lowlevel.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define DAY 86400.0

struct entry {
    uint64_t parent, size, offset;
    uint32_t mode;
    const char *name;
    uint64_t first_child, children; /* inode of the first child, their count */
};

static struct entry *entries; /* entries[ino]; 0 unused, 1 the root */
static uint64_t count;         /* highest inode + 1 */
static char *data;
static uint64_t *table; /* open addressing: inode per slot, 0 empty */
static uint64_t table_mask;

static uint64_t hash(uint64_t parent, const char *name) {
    uint64_t h = 1469598103934665603ULL ^ parent;
    for (; *name; name++) h = (h ^ (unsigned char)*name) * 1099511628211ULL;
    return h;
}

static uint64_t find(uint64_t parent, const char *name) {
    for (uint64_t slot = hash(parent, name) & table_mask;; slot = (slot + 1) & table_mask) {
        uint64_t ino = table[slot];
        if (!ino || (entries[ino].parent == parent && !strcmp(entries[ino].name, name))) return ino;
    }
}

static void fill(struct stat *st, uint64_t ino) {
    memset(st, 0, sizeof *st);
    st->st_ino = ino;
    st->st_mode = entries[ino].mode | (S_ISDIR(entries[ino].mode) ? 0555 : 0444);
    st->st_nlink = S_ISDIR(entries[ino].mode) ? 2 : 1;
    st->st_size = (off_t)entries[ino].size;
}

static void floor_init(void *userdata, struct fuse_conn_info *conn) {
    (void)userdata;
    /* Splicing costs a pipe's system calls per request; these answers are small copies. */
    conn->want &= ~(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE);
    conn->max_background = 128;
    conn->congestion_threshold = 96;
}

static void floor_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    uint64_t ino = parent < count ? find(parent, name) : 0;
    if (!ino) {
        struct fuse_entry_param miss = {.ino = 0, .entry_timeout = DAY};
        fuse_reply_entry(req, &miss);
        return;
    }
    struct fuse_entry_param e = {.ino = ino, .generation = 1, .attr_timeout = DAY, .entry_timeout = DAY};
    fill(&e.attr, ino);
    fuse_reply_entry(req, &e);
}

static void floor_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)fi;
    if (ino == 0 || ino >= count) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    struct stat st;
    fill(&st, ino);
    fuse_reply_attr(req, &st, DAY);
}

static void floor_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)fi;
    const struct entry *e = &entries[ino];
    if ((uint64_t)off >= e->size) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    size_t left = (size_t)(e->size - (uint64_t)off);
    fuse_reply_buf(req, data + e->offset + off, size < left ? size : left);
}

static void floor_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)fi;
    const struct entry *dir = &entries[ino];
    char *buf = malloc(size);
    size_t used = 0;
    for (uint64_t k = (uint64_t)off; k < dir->children; k++) {
        uint64_t child = dir->first_child + k;
        struct stat st;
        fill(&st, child);
        size_t need = fuse_add_direntry(req, buf + used, size - used, entries[child].name, &st, (off_t)(k + 1));
        if (need > size - used) break;
        used += need;
    }
    fuse_reply_buf(req, buf, used);
    free(buf);
}

/* ENOSYS once, and the kernel sends no OPEN, RELEASE or FLUSH again and keeps each
 * file's pages across opens ("no_open", Linux >= 4.19); likewise for directories. */
static void floor_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino, (void)fi;
    fuse_reply_err(req, ENOSYS);
}

static const struct fuse_lowlevel_ops ops = {
    .init = floor_init,
    .open = floor_open,
    .opendir = floor_open,
    .lookup = floor_lookup,
    .getattr = floor_getattr,
    .read = floor_read,
    .readdir = floor_readdir,
};

static int load(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return perror(path), -1;
    char magic[8];
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "MMFSFLR1", 8) || fread(&count, 8, 1, f) != 1) {
        fprintf(stderr, "%s: not a floor pack\n", path);
        return -1;
    }
    count += 2;
    entries = calloc(count, sizeof *entries);
    entries[1] = (struct entry){.mode = S_IFDIR};
    for (uint64_t ino = 2; ino < count; ino++) {
        struct entry *e = &entries[ino];
        uint16_t len;
        if (fread(&e->parent, 8, 1, f) != 1 || fread(&e->mode, 4, 1, f) != 1 || fread(&e->size, 8, 1, f) != 1 ||
            fread(&e->offset, 8, 1, f) != 1 || fread(&len, 2, 1, f) != 1 || e->parent >= ino)
            return fprintf(stderr, "%s: entry %llu cut short\n", path, (unsigned long long)ino), -1;
        char *name = malloc(len + 1u);
        if (fread(name, 1, len, f) != len) return fprintf(stderr, "%s: name cut short\n", path), -1;
        name[len] = 0;
        e->name = name;
        struct entry *p = &entries[e->parent];
        if (!p->children) p->first_child = ino;
        p->children++;
    }
    long start = ftell(f);
    fseek(f, 0, SEEK_END);
    size_t bytes = (size_t)(ftell(f) - start);
    fseek(f, start, SEEK_SET);
    data = malloc(bytes ? bytes : 1);
    if (fread(data, 1, bytes, f) != bytes) return fprintf(stderr, "%s: data cut short\n", path), -1;
    fclose(f);
    for (table_mask = 1; table_mask < 2 * count; table_mask <<= 1) {
    }
    table = calloc(table_mask, sizeof *table);
    table_mask -= 1;
    for (uint64_t ino = 2; ino < count; ino++) {
        uint64_t slot = hash(entries[ino].parent, entries[ino].name) & table_mask;
        while (table[slot]) slot = (slot + 1) & table_mask;
        table[slot] = ino;
    }
    return 0;
}

int main(int argc, char *argv[]) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s PACK MOUNTPOINT [-s] [-f] [-o OPTIONS]\n", argv[0]);
        return 2;
    }
    if (load(argv[1])) return 2;
    struct fuse_args args = FUSE_ARGS_INIT(argc - 1, argv + 1);
    args.argv[0] = argv[0];
    struct fuse_cmdline_opts opts;
    if (fuse_parse_cmdline(&args, &opts) != 0 || !opts.mountpoint) return 2;
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof ops, NULL);
    if (!se || fuse_set_signal_handlers(se) || fuse_session_mount(se, opts.mountpoint)) return 1;
    fuse_daemonize(opts.foreground);
    int rc;
    if (opts.singlethread) {
        rc = fuse_session_loop(se);
    } else {
        struct fuse_loop_config config = {.clone_fd = 0, .max_idle_threads = 10};
        rc = fuse_session_loop_mt(se, &config);
    }
    fuse_session_unmount(se);
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    free(opts.mountpoint);
    fuse_opt_free_args(&args);
    return rc ? 1 : 0;
}
