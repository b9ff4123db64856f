/* The daemon's PM QoS request, held only while requests flow. See mmfs_fuse.h.
 * Touches come from the FUSE loop (C and Python handlers); the release comes
 * from a thread of its own, so that an idle daemon never keeps CPUs polling. */
#include "mmfs_native.h"
#include "mmfs_fuse.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_wake = PTHREAD_COND_INITIALIZER;
static pthread_t g_thread;
static char *g_device;
static int64_t g_idle_ms;
static int g_enabled, g_running, g_stop, g_held, g_fd = -1;
static int64_t g_last_ms;
static int64_t g_set_ms = -1; /* a clock set by hand (tests: mmfs_latency_set_clock), -1: the real one */
static int64_t g_checks;      /* the releaser's looks at the idle time, under g_lock */

static int64_t now_ms(void) {
    int64_t set = __atomic_load_n(&g_set_ms, __ATOMIC_ACQUIRE);
    if (set >= 0) return set;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void release_locked(void) {
    if (g_fd >= 0) close(g_fd);
    g_fd = -1;
    __atomic_store_n(&g_held, 0, __ATOMIC_RELEASE);
}

static void *releaser(void *unused) {
    (void)unused;
    pthread_mutex_lock(&g_lock);
    while (!g_stop) {
        if (!g_held) {
            pthread_cond_wait(&g_wake, &g_lock);
            continue;
        }
        int64_t idle = now_ms() - __atomic_load_n(&g_last_ms, __ATOMIC_RELAXED);
        g_checks++;
        if (idle >= g_idle_ms) {
            release_locked();
            continue;
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        int64_t wait_ms = g_idle_ms - idle;
        until.tv_sec += wait_ms / 1000;
        until.tv_nsec += (wait_ms % 1000) * 1000000;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec += 1;
            until.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&g_wake, &g_lock, &until);
    }
    release_locked();
    pthread_mutex_unlock(&g_lock);
    return NULL;
}

int mmfs_latency_start(const char *device, int64_t idle_ms) {
    if (!device || idle_ms < 1) return -EINVAL;
    pthread_mutex_lock(&g_lock);
    if (g_running) {
        pthread_mutex_unlock(&g_lock);
        return -EBUSY;
    }
    free(g_device);
    g_device = strdup(device);
    g_idle_ms = idle_ms;
    g_stop = 0;
    int rc = g_device ? pthread_create(&g_thread, NULL, releaser, NULL) : ENOMEM;
    g_running = rc == 0;
    __atomic_store_n(&g_enabled, g_running, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_lock);
    return -rc;
}

void mmfs_latency_touch(void) {
    if (!__atomic_load_n(&g_enabled, __ATOMIC_ACQUIRE)) return;
    __atomic_store_n(&g_last_ms, now_ms(), __ATOMIC_RELAXED);
    if (__atomic_load_n(&g_held, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&g_lock);
    if (!g_held && g_enabled && !g_stop) {
        int32_t zero = 0;
        int fd = open(g_device, O_WRONLY | O_CLOEXEC);
        if (fd >= 0 && write(fd, &zero, sizeof zero) == (ssize_t)sizeof zero) {
            g_fd = fd;
            __atomic_store_n(&g_held, 1, __ATOMIC_RELEASE);
            pthread_cond_signal(&g_wake);
        } else { /* no permission, or no such device: stay off for good */
            fprintf(stderr, "mmfs: -o low_latency: cannot take the PM QoS request on %s (%s); "
                    "going on without it\n", g_device, strerror(errno));
            if (fd >= 0) close(fd);
            __atomic_store_n(&g_enabled, 0, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&g_lock);
}

int64_t mmfs_latency_set_clock(int64_t ms) {
    pthread_mutex_lock(&g_lock);
    __atomic_store_n(&g_set_ms, ms < 0 ? -1 : ms, __ATOMIC_RELEASE);
    int64_t checks = g_checks;
    pthread_cond_signal(&g_wake); /* the releaser looks again, at the new time */
    pthread_mutex_unlock(&g_lock);
    return checks;
}

int64_t mmfs_latency_checks(void) {
    pthread_mutex_lock(&g_lock);
    int64_t checks = g_checks;
    pthread_mutex_unlock(&g_lock);
    return checks;
}

int mmfs_latency_held(void) {
    return __atomic_load_n(&g_held, __ATOMIC_ACQUIRE);
}

void mmfs_latency_stop(void) {
    pthread_mutex_lock(&g_lock);
    int running = g_running;
    g_stop = 1;
    __atomic_store_n(&g_enabled, 0, __ATOMIC_RELEASE);
    pthread_cond_signal(&g_wake);
    pthread_mutex_unlock(&g_lock);
    if (running) pthread_join(g_thread, NULL);
    pthread_mutex_lock(&g_lock);
    release_locked();
    g_running = 0;
    __atomic_store_n(&g_set_ms, -1, __ATOMIC_RELEASE); /* the next start runs on the real clock */
    pthread_mutex_unlock(&g_lock);
}
