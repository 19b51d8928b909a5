// The kernel side of event sources (Sources/Core/EventSources): signal
// observation that chains to the program's own disposition, process exit
// through pidfds, file-system object changes through inotify, the notice
// that the wall clock was set, and the readiness estimates a descriptor
// source reports. Every function returns a
// value >= 0 or -errno unless its comment says otherwise.
#ifndef CSHIMS_SOURCES_H
#define CSHIMS_SOURCES_H

#include <stdint.h>

// MARK: Signals

// How many eventfds the observer writes: one per place that waits for
// signal sources (slot 0: the pool's poller; slot 1: the reactor thread;
// 2 and up: loops that wait for their own signal sources).
#define CSHIMS_SIGNAL_WATCH_SLOTS 64
// Sets the eventfd of `slot` (-1: none) that every observer writes 1 to at
// each delivery, for all signals. The store is releasing; the observer's
// load acquiring. 0, or -EINVAL for a slot out of range.
int cshims_signal_watch_set_eventfd(int slot, int eventfd);
// Installs Spindle's observer for `signo`: a sigaction(2) handler that adds
// 1 to the signal's delivery count, writes 1 to each slot's eventfd, then does what
// the disposition it replaced meant: calls the previous handler, ignores
// (SIG_IGN, or SIG_DFL of a signal whose default is to ignore), has the
// kernel apply the default of SIGTSTP, SIGTTIN, SIGTTOU (the default put
// back and the signal raised again: it stops the process, or is discarded
// in an orphaned process group, then the observer is reinstalled) or terminates it (any other
// SIG_DFL: the default is restored and the signal raised again, so the
// process dies of it as it would have). The previous disposition's mask and
// SA_RESTART choice are kept.
int cshims_signal_watch_install(int signo);
// Puts back the disposition saved by the install, unless the program has
// replaced Spindle's handler since (then that one stays). Returns 1 if it
// restored, 0 if the program's newer disposition was left in place.
int cshims_signal_watch_restore(int signo);
// How many times the observer of `signo` has run since the process started
// (never reset; wraps at 2^64). Async-signal-safe, lock-free.
uint64_t cshims_signal_watch_count(int signo);
// Whether Spindle refuses to observe `signo`: out of range, reserved by the
// C library (32, 33), uncatchable (SIGKILL, SIGSTOP) or a synchronous fault
// (SIGILL, SIGBUS, SIGSEGV, SIGFPE) that would re-trigger forever. Returns
// 0 when it can be observed, else the reason: 1 out of range, 2 reserved,
// 3 uncatchable, 4 synchronous fault.
int cshims_signal_watch_refusal(int signo);

// MARK: Processes

// pidfd_open(2) of `pid`, close-on-exec; -ESRCH when there is no such
// process, -ENOSYS before Linux 5.3.
int cshims_pidfd_open(int32_t pid);
// The exit status of the exited child behind `pidfd`, without reaping it
// (waitid(2) P_PIDFD, WEXITED | WNOHANG | WNOWAIT). Returns 1 and fills
// `code` (si_status) and `how` (1 exited, 2 killed, 3 dumped core) when the
// child has ended, 0 when it has not, -ECHILD when it is not our child.
int cshims_pidfd_exit_status(int pidfd, int32_t *code, int32_t *how);
int32_t cshims_parent_pid(void);

// MARK: File-system objects

// A non-blocking, close-on-exec inotify instance.
int cshims_inotify_create(void);
// Watches the object open on `fd` (through /proc/self/fd/N, so the watch
// follows the inode, not a name) for `mask` (IN_* bits, added to any mask
// the object already has in this instance). Returns the watch descriptor.
int cshims_inotify_watch_descriptor(int ifd, int fd, uint32_t mask);
int cshims_inotify_unwatch(int ifd, int wd);
// Reads the queued events (one read(2)); fills up to `max` pairs (watch
// descriptor, IN_* mask) and returns how many; 0 when none are queued.
// `max` must be at least 256 (a 4 KiB read of name-less events). An event
// about an entry of a watched directory (one that carries a name) has
// CSHIMS_IN_ENTRY added to its mask, and its name is skipped; the 4 KiB
// buffer holds at least one event with the longest name (16 + NAME_MAX + 1
// bytes). `*more` is set to 1 when more events may be queued (the read
// left less room than the longest event takes, so the kernel may have
// held one back), else 0: the read took everything queued at that moment,
// and the caller need not read again to learn that the queue is empty.
int cshims_inotify_read(int ifd, int32_t *wds, uint32_t *masks, int max, int *more);

#define CSHIMS_IN_MODIFY 0x00000002u
#define CSHIMS_IN_ATTRIB 0x00000004u
#define CSHIMS_IN_MOVE_SELF 0x00000800u
#define CSHIMS_IN_DELETE_SELF 0x00000400u
#define CSHIMS_IN_UNMOUNT 0x00002000u
#define CSHIMS_IN_IGNORED 0x00008000u
// A watched directory's entries: made, removed, renamed out of it, into it.
#define CSHIMS_IN_CREATE 0x00000100u
#define CSHIMS_IN_DELETE 0x00000200u
#define CSHIMS_IN_MOVED_FROM 0x00000040u
#define CSHIMS_IN_MOVED_TO 0x00000080u
// Added by cshims_inotify_read to an event about a directory's entry (not
// the watched object itself). The bit is IN_ONESHOT's, a flag of
// inotify_add_watch that the kernel never sets in an event.
#define CSHIMS_IN_ENTRY 0x80000000u

// fstat(2) of `fd`: its file type (st_mode & S_IFMT), size and link count.
int cshims_fd_stat(int fd, uint32_t *type, int64_t *size, uint64_t *links);
#define CSHIMS_FD_SOCKET 0140000
#define CSHIMS_FD_FIFO 0010000

// MARK: Wall-clock changes

// A non-blocking, close-on-exec timerfd on CLOCK_REALTIME, to be told when
// the system time is set (timerfd_create(2)).
int cshims_clock_change_create(void);
// Arms `fd` at the farthest time the kernel keeps (it never expires) with
// TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET, so that setting the clock
// (clock_settime, settimeofday, adjtimex ADJ_SETOFFSET) makes it readable.
// -ECANCELED if the clock was set since it was last armed and read: the
// notice is consumed; arm again.
int cshims_clock_change_arm(int fd);
// Disarms `fd`: setting the clock no longer makes it readable.
int cshims_clock_change_disarm(int fd);
// Reads `fd` once: -ECANCELED when the clock was set (the read consumes the
// notice; arm it again), else 0 (nothing pending, or an expiry, which only
// a clock at the far-future time could cause).
int cshims_clock_change_read(int fd);

// MARK: One-shot monotonic timers

// A non-blocking, close-on-exec timerfd on CLOCK_MONOTONIC (disarmed), or
// -errno. Read it with cshims_eventfd_drain.
int cshims_monotonic_timer_create(void);
// Arms `fd` to expire once, `nanoseconds` from now (at least 1 ns),
// replacing any earlier arming. 0 or -errno.
int cshims_monotonic_timer_arm(int fd, int64_t nanoseconds);

// MARK: Readiness estimates

// Bytes queued for reading (FIONREAD: pipes, FIFOs, sockets, terminals).
int64_t cshims_fd_readable_bytes(int fd);
// Bytes a write could take now: a socket's send buffer less what is queued
// in it (SO_SNDBUF - SIOCOUTQ), a pipe's capacity less what it holds
// (F_GETPIPE_SZ - FIONREAD); -ENOTSUP for other kinds.
int64_t cshims_fd_write_space(int fd, uint32_t type);
// Whether `fd` is readable right now (poll(2) with a zero timeout): 1 if
// readable or hung up, 0 if not.
int cshims_fd_readable_now(int fd);
// The file offset (lseek(2) SEEK_CUR).
int64_t cshims_fd_offset(int fd);

#endif // CSHIMS_SOURCES_H
