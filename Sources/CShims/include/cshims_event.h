// eventfd and epoll: the Ring layer's epoll backend and the cross-thread
// waker of both backends. Every function returns a value >= 0 or -errno.
#ifndef CSHIMS_EVENT_H
#define CSHIMS_EVENT_H

#include <stdint.h>

// Readiness bits, the same values for epoll (EPOLLIN...) and poll (POLLIN...).
#define CSHIMS_EVENT_READABLE 0x001u
#define CSHIMS_EVENT_WRITABLE 0x004u
#define CSHIMS_EVENT_ERROR 0x008u
#define CSHIMS_EVENT_HANGUP 0x010u

// A non-blocking, close-on-exec eventfd with count 0.
int cshims_eventfd_create(void);
// Adds 1 to the eventfd's count (a write(2) of 8 bytes).
int cshims_eventfd_signal(int fd);
// Reads and clears the count; returns 0 when it was already 0 (EAGAIN).
int cshims_eventfd_drain(int fd);

int cshims_epoll_create(void);
// Watches `fd` for `events` (CSHIMS_EVENT_*) once (EPOLLONESHOT), tagged
// `token`; `modify` re-arms an fd already added.
int cshims_epoll_arm(int epfd, int fd, uint32_t events, uint64_t token, int modify);
// Watches `fd` for `events` persistently (level-triggered), tagged `token`.
int cshims_epoll_add_persistent(int epfd, int fd, uint32_t events, uint64_t token);
int cshims_epoll_remove(int epfd, int fd);
// Waits at most `timeout_ns` (negative: no limit) with nanosecond precision
// (epoll_pwait2, kernel 5.11+; falls back to epoll_wait rounded up to
// milliseconds where the kernel lacks it). Fills up to `max` (token, events)
// pairs and returns how many.
int cshims_epoll_wait(int epfd, uint64_t *tokens, uint32_t *events, int max, int64_t timeout_ns);

// The descriptor's file type (st_mode & S_IFMT: CSHIMS_FD_REGULAR...), or
// -EBADF when it is not open (fstat(2)).
int cshims_fd_type(int fd);
#define CSHIMS_FD_REGULAR 0100000
#define CSHIMS_FD_DIRECTORY 0040000

int cshims_close(int fd);

#endif // CSHIMS_EVENT_H
