/* Small I/O helpers the C core's files share (not part of the cffi interface). */
#ifndef MMFS_IO_H
#define MMFS_IO_H

#include <errno.h>
#include <stdint.h>
#include <unistd.h>

/* Read n bytes at pos into to, through short reads and EINTR: the bytes read (fewer at
 * the end of the file), or -1. */
static inline int64_t read_fully(int fd, uint8_t *to, int64_t n, int64_t pos) {
    int64_t done = 0;
    while (done < n) {
        ssize_t k = pread(fd, to + done, (size_t)(n - done), pos + done);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) break;
        done += k;
    }
    return done;
}

#endif
