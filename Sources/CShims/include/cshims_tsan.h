// ThreadSanitizer's mutex annotations, and the lock-order checker's switch.
//
// Each cshims_tsan_* wrapper forwards to the sanitizer's annotation of the
// same name (<sanitizer/tsan_interface.h>) when this translation unit is
// compiled with ThreadSanitizer (clang's __has_feature(thread_sanitizer),
// GCC's __SANITIZE_THREAD__), and compiles to nothing otherwise: a call
// from Swift's fast paths costs nothing in a normal build. Swift code that
// the `--sanitize=thread` build compiles imports this header with the same
// feature on, so the wrappers are live exactly when the TSan runtime is
// linked.
//
// Spindle calls them next to the real operation, not around it (see
// `LockHooks` in Sources/Core/Locks): `post_lock` right after a lock was
// taken, `pre_unlock` right before it is given back. The lock word's own
// atomics stay visible to TSan, so no happens-before edge is lost; the
// annotations add what atomics cannot say: which mutexes a thread holds in a
// race report, double locks, unlocks of a mutex the thread does not hold,
// and the destruction of a held mutex.
#ifndef CSHIMS_TSAN_H
#define CSHIMS_TSAN_H

#include <stdint.h>

#include "cshims_atomic.h"

#if defined(__SANITIZE_THREAD__)
#define CSHIMS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CSHIMS_TSAN 1
#endif
#endif
#ifndef CSHIMS_TSAN
#define CSHIMS_TSAN 0
#endif

// The sanitizer's flag bits (the values of <sanitizer/tsan_interface.h>,
// named here so that Swift can use them in a build without TSan too).
#define CSHIMS_TSAN_MUTEX_WRITE_REENTRANT (1u << 1)
#define CSHIMS_TSAN_MUTEX_READ_REENTRANT (1u << 2)
#define CSHIMS_TSAN_MUTEX_READ_LOCK (1u << 3)
#define CSHIMS_TSAN_MUTEX_TRY_LOCK (1u << 4)
#define CSHIMS_TSAN_MUTEX_TRY_LOCK_FAILED (1u << 5)
#define CSHIMS_TSAN_MUTEX_NOT_STATIC (1u << 8)

#if CSHIMS_TSAN
// Declared here rather than by including the sanitizer's header, which not
// every toolchain puts on the include path.
void __tsan_mutex_create(void *addr, unsigned flags);
void __tsan_mutex_destroy(void *addr, unsigned flags);
void __tsan_mutex_pre_lock(void *addr, unsigned flags);
void __tsan_mutex_post_lock(void *addr, unsigned flags, int recursion);
int __tsan_mutex_pre_unlock(void *addr, unsigned flags);
void __tsan_mutex_post_unlock(void *addr, unsigned flags);
void __tsan_mutex_pre_signal(void *addr, unsigned flags);
void __tsan_mutex_post_signal(void *addr, unsigned flags);
void __tsan_mutex_pre_divert(void *addr, unsigned flags);
void __tsan_mutex_post_divert(void *addr, unsigned flags);
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);
#define CSHIMS_TSAN_CALL(call) call
#else
#define CSHIMS_TSAN_CALL(call) ((void)0)
#endif

// Whether this build has ThreadSanitizer (1) or not (0).
CSHIMS_INLINE int cshims_tsan_enabled(void) { return CSHIMS_TSAN; }

// A mutex exists at `addr` (its constructor): a report about it then shows
// this call's stack, which names the Spindle type that made it.
CSHIMS_INLINE void cshims_tsan_mutex_create(void *addr, unsigned flags) {
    CSHIMS_TSAN_CALL(__tsan_mutex_create(addr, flags));
    (void)addr; (void)flags;
}

// The mutex at `addr` ends (its deinit); TSan reports it if it is held.
CSHIMS_INLINE void cshims_tsan_mutex_destroy(void *addr, unsigned flags) {
    CSHIMS_TSAN_CALL(__tsan_mutex_destroy(addr, flags));
    (void)addr; (void)flags;
}

// Around taking the mutex: `flags` READ_LOCK for a shared hold, TRY_LOCK for
// an attempt that may fail; post_lock gets TRY_LOCK_FAILED if it did.
CSHIMS_INLINE void cshims_tsan_mutex_pre_lock(void *addr, unsigned flags) {
    CSHIMS_TSAN_CALL(__tsan_mutex_pre_lock(addr, flags));
    (void)addr; (void)flags;
}
CSHIMS_INLINE void cshims_tsan_mutex_post_lock(void *addr, unsigned flags) {
    CSHIMS_TSAN_CALL(__tsan_mutex_post_lock(addr, flags, 0));
    (void)addr; (void)flags;
}

// Around giving the mutex back (READ_LOCK for a shared hold).
CSHIMS_INLINE void cshims_tsan_mutex_pre_unlock(void *addr, unsigned flags) {
    CSHIMS_TSAN_CALL((void)__tsan_mutex_pre_unlock(addr, flags));
    (void)addr; (void)flags;
}
CSHIMS_INLINE void cshims_tsan_mutex_post_unlock(void *addr, unsigned flags) {
    CSHIMS_TSAN_CALL(__tsan_mutex_post_unlock(addr, flags));
    (void)addr; (void)flags;
}

// Around a signal or broadcast of the condition at `addr`: TSan ignores the
// memory accesses in between (the wake-up's own bookkeeping).
CSHIMS_INLINE void cshims_tsan_mutex_pre_signal(void *addr, unsigned flags) {
    CSHIMS_TSAN_CALL(__tsan_mutex_pre_signal(addr, flags));
    (void)addr; (void)flags;
}
CSHIMS_INLINE void cshims_tsan_mutex_post_signal(void *addr, unsigned flags) {
    CSHIMS_TSAN_CALL(__tsan_mutex_post_signal(addr, flags));
    (void)addr; (void)flags;
}

// Inside a pre/post pair above: the operation leaves for unrelated code
// (which may take other annotated mutexes) and comes back.
CSHIMS_INLINE void cshims_tsan_mutex_pre_divert(void *addr, unsigned flags) {
    CSHIMS_TSAN_CALL(__tsan_mutex_pre_divert(addr, flags));
    (void)addr; (void)flags;
}
CSHIMS_INLINE void cshims_tsan_mutex_post_divert(void *addr, unsigned flags) {
    CSHIMS_TSAN_CALL(__tsan_mutex_post_divert(addr, flags));
    (void)addr; (void)flags;
}

// Between these two, TSan records none of the calling thread's memory
// accesses; its synchronization (locks, atomics, the runtime's own
// release and acquire annotations) still counts. For a call whose accesses
// are another component's business and whose ordering TSan cannot see
// (see `resumeOutsideTSan` in Sources/Core/Concurrency/AsyncWaits.swift).
CSHIMS_INLINE void cshims_tsan_ignore_accesses_begin(void) {
    CSHIMS_TSAN_CALL(__tsan_ignore_thread_begin());
}
CSHIMS_INLINE void cshims_tsan_ignore_accesses_end(void) {
    CSHIMS_TSAN_CALL(__tsan_ignore_thread_end());
}

// MARK: The lock-order checker's switch

// Nonzero while Spindle's lock-order checker is on. Set once before main
// from SPINDLE_LOCK_ORDER=1 in the environment (tsan.c), or by
// cshims_lock_order_enable() (`LockOrder.enable()` in Swift). Written
// before any lock is checked; read with one relaxed load on every
// acquisition and release of a Spindle lock.
extern int cshims_lock_order_flag;

CSHIMS_INLINE int cshims_lock_order_on(void) {
    return __builtin_expect(__atomic_load_n(&cshims_lock_order_flag, __ATOMIC_RELAXED), 0);
}

CSHIMS_INLINE void cshims_lock_order_enable(void) {
    __atomic_store_n(&cshims_lock_order_flag, 1, __ATOMIC_RELAXED);
}

// The calling thread's record for the checker (a retained Swift object, or
// NULL before its first checked acquisition).
extern __thread void *cshims_lock_order_record;
CSHIMS_INLINE void *cshims_lock_order_thread_record(void) { return cshims_lock_order_record; }
CSHIMS_INLINE void cshims_lock_order_set_thread_record(void *record) { cshims_lock_order_record = record; }

#endif // CSHIMS_TSAN_H
