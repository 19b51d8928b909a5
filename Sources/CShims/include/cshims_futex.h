// futex(2): wait on and wake a 32-bit word. Returns 0 or -errno (errno is read
// here, in C, so Swift never has to).
#ifndef CSHIMS_FUTEX_H
#define CSHIMS_FUTEX_H

#include <errno.h>
#include <linux/futex.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cshims_atomic.h"

#define CSHIMS_NSEC_PER_SEC 1000000000LL

// Nanoseconds on CLOCK_MONOTONIC, the clock futex deadlines are measured on.
CSHIMS_INLINE int64_t cshims_monotonic_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * CSHIMS_NSEC_PER_SEC + ts.tv_nsec;
}

// Sleeps while *word == expected, until woken or until the absolute
// CLOCK_MONOTONIC deadline `deadline_ns` (pass a negative value for none).
// Uses FUTEX_WAIT_BITSET because plain FUTEX_WAIT takes a relative timeout,
// which an EINTR retry would have to recompute.
//   0          woken (or a spurious wake-up: callers re-check their word)
//   -EAGAIN    *word was not `expected` when the kernel looked
//   -ETIMEDOUT the deadline passed (at once if it was already in the past)
//   -EINTR     a signal interrupted the sleep
//   -EFAULT, -EINVAL, -ENOSYS: a bad address, a bad argument, no futex
// `shared`: the word may be mapped in several processes (no FUTEX_PRIVATE_FLAG).
CSHIMS_INLINE int cshims_futex_wait(uint32_t *word, uint32_t expected, int64_t deadline_ns,
                                    bool shared) {
    int op = FUTEX_WAIT_BITSET | (shared ? 0 : FUTEX_PRIVATE_FLAG);
    struct timespec ts;
    struct timespec *tsp = NULL;
    if (deadline_ns >= 0) {
        ts.tv_sec = (time_t)(deadline_ns / CSHIMS_NSEC_PER_SEC);
        ts.tv_nsec = (long)(deadline_ns % CSHIMS_NSEC_PER_SEC);
        tsp = &ts;
    }
    long r = syscall(SYS_futex, word, op, expected, tsp, NULL, FUTEX_BITSET_MATCH_ANY);
    return r == -1 ? -errno : 0;
}

// Wakes at most `count` threads sleeping on `word`. Returns how many were
// woken (>= 0) or -errno.
CSHIMS_INLINE int cshims_futex_wake(uint32_t *word, int32_t count, bool shared) {
    int op = FUTEX_WAKE | (shared ? 0 : FUTEX_PRIVATE_FLAG);
    long r = syscall(SYS_futex, word, op, count, NULL, NULL, 0);
    return r == -1 ? -errno : (int)r;
}

// Wakes at most `wake_count` sleepers on `word` and moves up to
// `requeue_count` of the rest onto `target` without waking them, provided
// *word still equals `expected` (-EAGAIN otherwise). Condition variables use
// this to hand waiters to their mutex instead of waking a herd.
CSHIMS_INLINE int cshims_futex_cmp_requeue(uint32_t *word, int32_t wake_count,
                                           int32_t requeue_count, uint32_t *target,
                                           uint32_t expected, bool shared) {
    int op = FUTEX_CMP_REQUEUE | (shared ? 0 : FUTEX_PRIVATE_FLAG);
    long r = syscall(SYS_futex, word, op, wake_count, (unsigned long)requeue_count, target,
                     expected);
    return r == -1 ? -errno : (int)r;
}

#endif // CSHIMS_FUTEX_H
