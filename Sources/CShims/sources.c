// Event-source system calls (see cshims_sources.h).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/sockios.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cshims_event.h"
#include "cshims_sources.h"

_Static_assert(CSHIMS_IN_MODIFY == IN_MODIFY && CSHIMS_IN_ATTRIB == IN_ATTRIB &&
                   CSHIMS_IN_MOVE_SELF == IN_MOVE_SELF && CSHIMS_IN_DELETE_SELF == IN_DELETE_SELF &&
                   CSHIMS_IN_UNMOUNT == IN_UNMOUNT && CSHIMS_IN_IGNORED == IN_IGNORED &&
                   CSHIMS_IN_CREATE == IN_CREATE && CSHIMS_IN_DELETE == IN_DELETE &&
                   CSHIMS_IN_MOVED_FROM == IN_MOVED_FROM && CSHIMS_IN_MOVED_TO == IN_MOVED_TO,
               "inotify bits must match <sys/inotify.h>");
_Static_assert(CSHIMS_IN_ENTRY == IN_ONESHOT && (CSHIMS_IN_ENTRY & IN_ALL_EVENTS) == 0 &&
                   (CSHIMS_IN_ENTRY & (IN_UNMOUNT | IN_Q_OVERFLOW | IN_IGNORED | IN_ISDIR)) == 0,
               "CSHIMS_IN_ENTRY must be a bit no inotify event carries");
_Static_assert(CSHIMS_FD_SOCKET == S_IFSOCK && CSHIMS_FD_FIFO == S_IFIFO,
               "file type constants must match <sys/stat.h>");

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

// MARK: Signals

#define WATCH_SIGNALS 65 // signal numbers 1 ... 64

// The disposition each observer replaced. Written by install before the
// observer is installed (so the handler, which reads it, sees it complete:
// sigaction(2) is a full barrier for the signal it installs), and not again
// until a later install after a restore.
static struct sigaction saved[WATCH_SIGNALS];
// The observer's own disposition for each signal, as installed: put back
// after a stop signal's default action has been applied (see observe).
static struct sigaction installed[WATCH_SIGNALS];
static _Atomic uint64_t delivered[WATCH_SIGNALS];
// The eventfds the observer writes, one per place that waits for signals
// (the pool's poller, the reactor, loops); -1 where none is set.
static _Atomic int watch_eventfds[CSHIMS_SIGNAL_WATCH_SLOTS] = {[0 ... CSHIMS_SIGNAL_WATCH_SLOTS - 1] = -1};

static int default_ignores(int signo) {
    return signo == SIGCHLD || signo == SIGCONT || signo == SIGURG || signo == SIGWINCH;
}

static int default_stops(int signo) {
    return signo == SIGTSTP || signo == SIGTTIN || signo == SIGTTOU;
}

static void observe(int signo, siginfo_t *info, void *context) {
    int saved_errno = errno;
    atomic_fetch_add_explicit(&delivered[signo], 1, memory_order_release);
    for (int slot = 0; slot < CSHIMS_SIGNAL_WATCH_SLOTS; slot++) {
        int fd = atomic_load_explicit(&watch_eventfds[slot], memory_order_acquire);
        if (fd >= 0) {
            uint64_t one = 1;
            ssize_t ignored = write(fd, &one, sizeof one); // EAGAIN only at 2^64 - 1
            (void)ignored;
        }
    }
    const struct sigaction *previous = &saved[signo];
    if (previous->sa_flags & SA_SIGINFO) {
        if (previous->sa_sigaction) previous->sa_sigaction(signo, info, context);
    } else if (previous->sa_handler == SIG_IGN) {
        // The program ignored it: so do we.
    } else if (previous->sa_handler == SIG_DFL) {
        if (default_stops(signo)) {
            // Let the kernel apply the default itself, so that it applies
            // its own rule: stop the process, unless its process group is
            // orphaned, where SIGTSTP, SIGTTIN and SIGTTOU are discarded
            // (raising SIGSTOP instead would stop it even there). Once
            // continued (or at once, if discarded), the observer goes back.
            // A delivery of the same signal in between meets the default
            // and is not counted.
            struct sigaction fallback;
            memset(&fallback, 0, sizeof fallback);
            fallback.sa_handler = SIG_DFL;
            sigaction(signo, &fallback, NULL);
            sigset_t only, before;
            sigemptyset(&only);
            sigaddset(&only, signo);
            raise(signo);
            pthread_sigmask(SIG_UNBLOCK, &only, &before);
            pthread_sigmask(SIG_SETMASK, &before, NULL);
            sigaction(signo, &installed[signo], NULL);
        } else if (!default_ignores(signo)) {
            // Terminate as the default would: put the default back and let
            // the signal arrive again once this handler unblocks it.
            struct sigaction fallback;
            memset(&fallback, 0, sizeof fallback);
            fallback.sa_handler = SIG_DFL;
            sigaction(signo, &fallback, NULL);
            sigset_t only;
            sigemptyset(&only);
            sigaddset(&only, signo);
            raise(signo);
            sigprocmask(SIG_UNBLOCK, &only, NULL);
        }
    } else {
        previous->sa_handler(signo);
    }
    errno = saved_errno;
}

int cshims_signal_watch_refusal(int signo) {
    if (signo < 1 || signo >= WATCH_SIGNALS || signo > SIGRTMAX) return 1;
    if (signo > 31 && signo < SIGRTMIN) return 2;
    if (signo == SIGKILL || signo == SIGSTOP) return 3;
    if (signo == SIGILL || signo == SIGBUS || signo == SIGSEGV || signo == SIGFPE) return 4;
    return 0;
}

int cshims_signal_watch_set_eventfd(int slot, int eventfd) {
    if (slot < 0 || slot >= CSHIMS_SIGNAL_WATCH_SLOTS) return -EINVAL;
    atomic_store_explicit(&watch_eventfds[slot], eventfd, memory_order_release);
    return 0;
}

int cshims_signal_watch_install(int signo) {
    if (cshims_signal_watch_refusal(signo)) return -EINVAL;
    struct sigaction previous;
    if (sigaction(signo, NULL, &previous) != 0) return -errno;
    if ((previous.sa_flags & SA_SIGINFO) && previous.sa_sigaction == observe) return 0; // already ours
    saved[signo] = previous;
    struct sigaction mine;
    memset(&mine, 0, sizeof mine);
    mine.sa_sigaction = observe;
    mine.sa_mask = previous.sa_mask;
    // A handler that did not restart interrupted calls keeps doing so;
    // SIG_IGN and SIG_DFL never interrupted them.
    int handled = (previous.sa_flags & SA_SIGINFO) ||
                  (previous.sa_handler != SIG_IGN && previous.sa_handler != SIG_DFL);
    mine.sa_flags = SA_SIGINFO | SA_ONSTACK | (handled ? (previous.sa_flags & SA_RESTART) : SA_RESTART);
    installed[signo] = mine;
    if (sigaction(signo, &mine, NULL) != 0) return -errno;
    return 0;
}

int cshims_signal_watch_restore(int signo) {
    if (cshims_signal_watch_refusal(signo)) return -EINVAL;
    struct sigaction current;
    if (sigaction(signo, NULL, &current) != 0) return -errno;
    if (!(current.sa_flags & SA_SIGINFO) || current.sa_sigaction != observe) return 0;
    if (sigaction(signo, &saved[signo], NULL) != 0) return -errno;
    return 1;
}

uint64_t cshims_signal_watch_count(int signo) {
    if (signo < 1 || signo >= WATCH_SIGNALS) return 0;
    return atomic_load_explicit(&delivered[signo], memory_order_acquire);
}

// MARK: Processes

int cshims_pidfd_open(int32_t pid) {
    long fd = syscall(SYS_pidfd_open, (pid_t)pid, 0u);
    if (fd < 0) return -errno;
    return (int)fd;
}

int cshims_pidfd_exit_status(int pidfd, int32_t *code, int32_t *how) {
    siginfo_t info;
    memset(&info, 0, sizeof info);
    for (;;) {
        if (waitid((idtype_t)P_PIDFD, (id_t)pidfd, &info, WEXITED | WNOHANG | WNOWAIT) == 0) break;
        if (errno != EINTR) return -errno;
    }
    if (info.si_pid == 0) return 0;
    *code = info.si_status;
    *how = info.si_code == CLD_EXITED ? 1 : info.si_code == CLD_DUMPED ? 3 : 2;
    return 1;
}

int32_t cshims_parent_pid(void) { return (int32_t)getppid(); }

// MARK: File-system objects

int cshims_inotify_create(void) {
    int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

int cshims_inotify_watch_descriptor(int ifd, int fd, uint32_t mask) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int wd = inotify_add_watch(ifd, path, mask | IN_MASK_ADD);
    return wd < 0 ? -errno : wd;
}

int cshims_inotify_unwatch(int ifd, int wd) {
    return inotify_rm_watch(ifd, wd) == 0 ? 0 : -errno;
}

int cshims_inotify_read(int ifd, int32_t *wds, uint32_t *masks, int max, int *more) {
    *more = 0;
    if (max < 256) return -EINVAL;
    _Alignas(struct inotify_event) char buffer[4096];
    ssize_t got;
    for (;;) {
        got = read(ifd, buffer, sizeof buffer);
        if (got >= 0) break;
        if (errno == EAGAIN) return 0;
        if (errno != EINTR) return -errno;
    }
    // inotify returns whole events only, as many as fit: with room left
    // for the longest one, none was held back.
    *more = (size_t)got > sizeof buffer - (sizeof(struct inotify_event) + NAME_MAX + 1);
    int count = 0;
    for (char *at = buffer; at < buffer + got && count < max;) {
        const struct inotify_event *event = (const struct inotify_event *)(void *)at;
        wds[count] = event->wd;
        masks[count] = event->len > 0 ? event->mask | CSHIMS_IN_ENTRY : event->mask;
        count += 1;
        at += sizeof(struct inotify_event) + event->len;
    }
    return count;
}

int cshims_fd_stat(int fd, uint32_t *type, int64_t *size, uint64_t *links) {
    struct stat st;
    if (fstat(fd, &st) != 0) return -errno;
    *type = st.st_mode & S_IFMT;
    *size = (int64_t)st.st_size;
    *links = (uint64_t)st.st_nlink;
    return 0;
}

// MARK: Wall-clock changes

int cshims_clock_change_create(void) {
    int fd = timerfd_create(CLOCK_REALTIME, TFD_NONBLOCK | TFD_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

int cshims_clock_change_arm(int fd) {
    // The kernel saturates any time past KTIME_MAX (year 2262) to it, and a
    // timer there never fires: only the cancel on a clock change is wanted.
    _Static_assert(sizeof(time_t) == 8, "time_t must hold INT64_MAX");
    struct itimerspec never = {.it_value = {.tv_sec = INT64_MAX, .tv_nsec = 0}};
    return timerfd_settime(fd, TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET, &never, NULL) == 0 ? 0 : -errno;
}

int cshims_clock_change_disarm(int fd) {
    struct itimerspec off = {0};
    return timerfd_settime(fd, 0, &off, NULL) == 0 ? 0 : -errno;
}

int cshims_clock_change_read(int fd) {
    // A timerfd is read as an eventfd is: one 8-byte count, EAGAIN when none.
    return cshims_eventfd_drain(fd);
}

// MARK: One-shot monotonic timers

int cshims_monotonic_timer_create(void) {
    int fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

int cshims_monotonic_timer_arm(int fd, int64_t nanoseconds) {
    if (nanoseconds < 1) nanoseconds = 1;  // 0 would disarm it
    struct itimerspec once = {.it_value = {.tv_sec = nanoseconds / 1000000000, .tv_nsec = nanoseconds % 1000000000}};
    return timerfd_settime(fd, 0, &once, NULL) == 0 ? 0 : -errno;
}

// MARK: Readiness estimates

int64_t cshims_fd_readable_bytes(int fd) {
    int bytes = 0;
    if (ioctl(fd, FIONREAD, &bytes) != 0) return -errno;
    return bytes;
}

int64_t cshims_fd_write_space(int fd, uint32_t type) {
    if (type == S_IFSOCK) {
        int buffer = 0, queued = 0;
        socklen_t length = sizeof buffer;
        if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, &length) != 0) return -errno;
        if (ioctl(fd, SIOCOUTQ, &queued) != 0) return -errno;
        return buffer > queued ? buffer - queued : 0;
    }
    if (type == S_IFIFO) {
        int capacity = fcntl(fd, F_GETPIPE_SZ);
        if (capacity < 0) return -errno;
        int queued = 0;
        if (ioctl(fd, FIONREAD, &queued) != 0) return -errno;
        return capacity > queued ? capacity - queued : 0;
    }
    return -ENOTSUP;
}

int cshims_fd_readable_now(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    for (;;) {
        int rc = poll(&p, 1, 0);
        if (rc >= 0) return rc > 0 && (p.revents & (POLLIN | POLLHUP | POLLRDHUP | POLLERR)) ? 1 : 0;
        if (errno != EINTR) return -errno;
    }
}

int64_t cshims_fd_offset(int fd) {
    off_t at = lseek(fd, 0, SEEK_CUR);
    return at < 0 ? -errno : (int64_t)at;
}
