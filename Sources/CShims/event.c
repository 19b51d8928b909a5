// eventfd and epoll wrappers (see cshims_event.h).
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cshims_event.h"

_Static_assert(CSHIMS_EVENT_READABLE == EPOLLIN && CSHIMS_EVENT_WRITABLE == EPOLLOUT &&
                   CSHIMS_EVENT_ERROR == EPOLLERR && CSHIMS_EVENT_HANGUP == EPOLLHUP,
               "readiness bits must match epoll's");
_Static_assert(CSHIMS_FD_REGULAR == S_IFREG && CSHIMS_FD_DIRECTORY == S_IFDIR,
               "file type constants must match <sys/stat.h>");

int cshims_eventfd_create(void) {
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

int cshims_eventfd_signal(int fd) {
    uint64_t one = 1;
    for (;;) {
        if (write(fd, &one, sizeof one) == (ssize_t)sizeof one) return 0;
        if (errno != EINTR) return -errno;
    }
}

int cshims_eventfd_drain(int fd) {
    uint64_t count;
    for (;;) {
        if (read(fd, &count, sizeof count) == (ssize_t)sizeof count) return 0;
        if (errno == EAGAIN) return 0;
        if (errno != EINTR) return -errno;
    }
}

int cshims_epoll_create(void) {
    int fd = epoll_create1(EPOLL_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

int cshims_epoll_arm(int epfd, int fd, uint32_t events, uint64_t token, int modify) {
    struct epoll_event ev = {.events = events | EPOLLONESHOT, .data.u64 = token};
    if (epoll_ctl(epfd, modify ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev) != 0) return -errno;
    return 0;
}

int cshims_epoll_add_persistent(int epfd, int fd, uint32_t events, uint64_t token) {
    struct epoll_event ev = {.events = events, .data.u64 = token};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) return -errno;
    return 0;
}

int cshims_epoll_remove(int epfd, int fd) {
    if (epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL) != 0) return -errno;
    return 0;
}

static int cshims_epoll_pwait2_missing = 0;

int cshims_epoll_wait(int epfd, uint64_t *tokens, uint32_t *events, int max, int64_t timeout_ns) {
    struct epoll_event evs[64];
    if (max > 64) max = 64;
    int n;
    if (!__atomic_load_n(&cshims_epoll_pwait2_missing, __ATOMIC_RELAXED)) {
        struct timespec ts = {.tv_sec = timeout_ns / 1000000000LL, .tv_nsec = timeout_ns % 1000000000LL};
        n = epoll_pwait2(epfd, evs, max, timeout_ns < 0 ? NULL : &ts, NULL);
        if (n < 0 && errno == ENOSYS) {
            __atomic_store_n(&cshims_epoll_pwait2_missing, 1, __ATOMIC_RELAXED);
        }
    }
    if (__atomic_load_n(&cshims_epoll_pwait2_missing, __ATOMIC_RELAXED)) {
        int ms = timeout_ns < 0 ? -1 : (int)((timeout_ns + 999999) / 1000000);
        n = epoll_wait(epfd, evs, max, ms);
    }
    if (n < 0) return -errno;
    for (int i = 0; i < n; i++) {
        tokens[i] = evs[i].data.u64;
        events[i] = evs[i].events;
    }
    return n;
}

int cshims_fd_type(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0) return -errno;
    return (int)(st.st_mode & S_IFMT);
}

int cshims_close(int fd) { return close(fd) == 0 ? 0 : -errno; }
