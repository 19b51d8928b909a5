// Threads, CPUs and NUMA placement. Returns 0 (or a count) on success and
// -errno on failure, unless a comment says otherwise.
#ifndef CSHIMS_SYSTEM_H
#define CSHIMS_SYSTEM_H

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include "cshims_atomic.h"

// The calling thread's kernel thread id (gettid(2)).
CSHIMS_INLINE int32_t cshims_gettid(void) { return (int32_t)syscall(SYS_gettid); }

// fork(2): the child's pid in the parent, 0 in the child, or -errno. For
// tests of Spindle's behaviour across fork (Swift marks fork unavailable).
CSHIMS_INLINE int32_t cshims_fork(void) {
    pid_t pid = fork();
    return pid < 0 ? -errno : (int32_t)pid;
}

// Sends `sig` to one thread of this process (pthread_kill(3)); 0 or -errno.
CSHIMS_INLINE int cshims_thread_kill(pthread_t thread, int sig) { return -pthread_kill(thread, sig); }

// Online CPUs (sysconf(_SC_NPROCESSORS_ONLN)), configured CPUs, and the page size.
int cshims_cpu_count_online(void);
int cshims_cpu_count_configured(void);
long cshims_page_size(void);

// The CPU the caller is running on right now (sched_getcpu(3)), or -errno.
int cshims_current_cpu(void);

// Affinity of thread `tid` (0 = the caller) as a bit mask: bit c of
// words[c / 64] is CPU c. `nwords` 64-bit words are read or written.
// sched_getaffinity(2) / sched_setaffinity(2).
int cshims_affinity_get(int32_t tid, uint64_t *words, size_t nwords);
int cshims_affinity_set(int32_t tid, const uint64_t *words, size_t nwords);

// For tests: makes sched_yield(2) and sched_setaffinity(2) raise SIGSYS in
// the calling thread and in the threads it creates afterwards (a seccomp
// filter with SECCOMP_RET_TRAP; PR_SET_NO_NEW_PRIVS is set first). Other
// threads are not affected. Irreversible for the thread: use it only in a
// child process. prctl(2) PR_SET_SECCOMP. Returns 0 or -errno (EINVAL when
// the kernel lacks seccomp filters).
int cshims_trap_scheduling_calls(void);

// libnuma. cshims_numa_available() is 1 when the kernel reports NUMA support
// (numa_available(3) >= 0), else 0; every other numa call below then answers
// as if the machine had exactly one node (node 0) holding every CPU.
int cshims_numa_available(void);
int cshims_numa_node_count(void);                 // configured nodes, >= 1
int cshims_numa_node_of_cpu(int cpu);             // node, or -errno (-EINVAL for a bad cpu)
// Allocates `size` bytes (rounded up to pages) on `node`: returns NULL and
// sets *error to -errno on failure. Free with cshims_numa_free(ptr, size).
void *cshims_numa_alloc_on_node(size_t size, int node, int *error);
void cshims_numa_free(void *ptr, size_t size);
// Restricts the calling thread to the CPUs of `node` (numa_run_on_node(3)).
int cshims_numa_run_on_node(int node);

// Sets the calling thread's timer slack (prctl(PR_SET_TIMERSLACK)): how
// much later than asked the kernel may end its timed sleeps, to batch
// wake-ups. Linux's default is 50 µs.
int cshims_set_timer_slack(unsigned long ns);

// Moves the calling process into a private mount namespace
// (unshare(CLONE_NEWNS)) whose mounts do not propagate back: tests use it to
// mount a read-only file system without touching the host's.
int cshims_unshare_private_mounts(void);

// --- Threads -----------------------------------------------------------------
// Calls on behalf of Spindle's NativeThread. pthread functions report errors
// as their return value; these wrappers turn that into -errno like the rest.

// The calling thread's Spindle record (an opaque pointer Spindle owns), in a
// C thread-local: one load from the thread pointer, and nothing for glibc to
// clean up at thread exit (unlike a pthread key, whose use makes every
// exiting thread walk its key table).
extern __thread void *cshims_current_thread_record;
CSHIMS_INLINE void *cshims_current_thread(void) { return cshims_current_thread_record; }
CSHIMS_INLINE void cshims_set_current_thread(void *record) { cshims_current_thread_record = record; }

// A number that names the calling thread among the threads alive now: the
// address of a thread-local byte (one instruction; no call, unlike
// pthread_self). Never 0. A thread that has exited may pass it on.
extern __thread char cshims_thread_token_byte;
CSHIMS_INLINE uintptr_t cshims_thread_token(void) { return (uintptr_t)&cshims_thread_token_byte; }

// The innermost work-queue frame of the calling thread: a linked list of
// stack records, one per queue whose item this thread is running (Spindle's
// Queues layer reads it for `WorkQueue.current` and the own-queue deadlock
// check). NULL outside any item.
extern __thread void *cshims_queue_frame_record;
CSHIMS_INLINE void *cshims_queue_frame(void) { return cshims_queue_frame_record; }
CSHIMS_INLINE void cshims_set_queue_frame(void *frame) { cshims_queue_frame_record = frame; }

// How many fork() children deep this process is: 0 in a process that was
// not made by a fork() of a Spindle process, advanced by one in each child
// by Spindle's fork handler (while the child has one thread), never written
// otherwise. A queue stamps its state and its scheduled drains with it, so a
// child can tell state left by the parent's threads (which do not exist
// there) from its own. Relaxed atomics: the one write happens before any
// other code of the child runs.
extern unsigned cshims_fork_epoch_value;
CSHIMS_INLINE unsigned cshims_fork_epoch(void) { return __atomic_load_n(&cshims_fork_epoch_value, __ATOMIC_RELAXED); }
CSHIMS_INLINE unsigned cshims_advance_fork_epoch(void) {
    unsigned next = cshims_fork_epoch() + 1;
    __atomic_store_n(&cshims_fork_epoch_value, next, __ATOMIC_RELAXED);
    return next;
}

// Schedule perturbation (Spindle's `SchedulePerturbation`, SPINDLE_PERTURB).
// The mode every synchronization point loads, relaxed, and branches on:
// 0 off, 1 not yet read from the environment (the first point reads it),
// 2 on. The seed is written before the mode turns 2 (releasing store,
// acquiring load in the slow path). Threads that draw decisions are
// numbered in the order of their first draw; each keeps its generator in
// two thread-local words (state, index + 1; 0 = not yet numbered).
extern unsigned cshims_perturb_mode_value;
extern uint64_t cshims_perturb_seed_value;
extern unsigned cshims_perturb_threads_value;
extern __thread uint64_t cshims_perturb_thread_words[2];
CSHIMS_INLINE unsigned cshims_perturb_mode(void) { return __atomic_load_n(&cshims_perturb_mode_value, __ATOMIC_RELAXED); }
CSHIMS_INLINE unsigned cshims_perturb_mode_acquiring(void) { return __atomic_load_n(&cshims_perturb_mode_value, __ATOMIC_ACQUIRE); }
CSHIMS_INLINE int cshims_perturb_change_mode(unsigned expected, unsigned desired) {
    return __atomic_compare_exchange_n(&cshims_perturb_mode_value, &expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
CSHIMS_INLINE uint64_t cshims_perturb_seed(void) { return __atomic_load_n(&cshims_perturb_seed_value, __ATOMIC_RELAXED); }
CSHIMS_INLINE void cshims_perturb_set_seed(uint64_t seed) { __atomic_store_n(&cshims_perturb_seed_value, seed, __ATOMIC_RELAXED); }
CSHIMS_INLINE unsigned cshims_perturb_claim_thread_index(void) {
    return __atomic_fetch_add(&cshims_perturb_threads_value, 1, __ATOMIC_RELAXED);
}
CSHIMS_INLINE uint64_t *cshims_perturb_thread_state(void) { return cshims_perturb_thread_words; }

// The calling thread's blocking observer: set on worker-pool threads, told
// when a blocking wait (condition, semaphore, join, ...) begins and ends, so
// the pool can start a replacement worker. NULL elsewhere.
extern __thread void *cshims_blocking_observer_record;
CSHIMS_INLINE void *cshims_blocking_observer(void) { return cshims_blocking_observer_record; }
CSHIMS_INLINE void cshims_set_blocking_observer(void *observer) { cshims_blocking_observer_record = observer; }

// The side table of `synchronized`: 256 cache lines, zero from the start
// (an unlocked guard and an empty list each), so it needs no initializer.
#define CSHIMS_SYNC_BUCKETS 256
extern _Alignas(64) unsigned char cshims_sync_buckets[CSHIMS_SYNC_BUCKETS * 64];
CSHIMS_INLINE void *cshims_sync_bucket(uint32_t index) {
    return cshims_sync_buckets + (size_t)(index % CSHIMS_SYNC_BUCKETS) * 64;
}

// The kernel thread id of `thread` without a system call, or -ESRCH once the
// thread has exited. glibc keeps the id in the thread's descriptor and hands
// it out only encoded in the thread's CPU-time clock id; the encoding
// (the id bitwise inverted, shifted left by 3) is the kernel's ABI for
// per-thread CPU clocks. The descriptor must still be valid: call it on a
// joinable thread that has not been joined.
int32_t cshims_thread_tid(pthread_t thread);

// Joins `thread` if it ends by the absolute CLOCK_MONOTONIC deadline
// `deadline_ns` (pthread_timedjoin_np(3) in slices; see system.c); a negative
// deadline does not wait (pthread_tryjoin_np(3)). Returns 0 when joined, -ETIMEDOUT or -EBUSY while it
// still runs, or another -errno (-EDEADLK, -EINVAL, -ESRCH: caller bugs).
// The thread's return value is discarded.
int cshims_thread_join_until(pthread_t thread, int64_t deadline_ns);

// The calling thread's stack: its lowest address and its size in bytes
// (pthread_getattr_np(3); for the main thread, the size is RLIMIT_STACK's).
int cshims_thread_stack_self(void **base, size_t *size);

// Restricts threads created with `attr` to the CPUs in the mask (bit c of
// words[c / 64] is CPU c; pthread_attr_setaffinity_np(3)).
int cshims_thread_attr_set_affinity(pthread_attr_t *attr, const uint64_t *words, size_t nwords);

// The calling thread's name: at most 15 bytes plus the NUL
// (prctl(PR_SET_NAME) / prctl(PR_GET_NAME)); `size` must be at least 16.
int cshims_thread_set_name_self(const char *name);
int cshims_thread_get_name_self(char *buffer, size_t size);
// The name of thread `tid` of this process, read from /proc/self/task/<tid>/comm.
int cshims_thread_get_name(int32_t tid, char *buffer, size_t size);

// The scheduler state letter of thread `tid` of this process (the third
// field of /proc/self/task/<tid>/stat: 'R' running or runnable, 'S' asleep,
// 'D' in uninterruptible sleep, ...), or -errno. The name field before it
// may hold spaces and parentheses; the state follows its last ')'.
int cshims_thread_state(int32_t tid);

// Nice value of thread `tid` (0 = the caller); Linux keeps one per thread.
// setpriority(2) refuses a raise above RLIMIT_NICE without CAP_SYS_NICE
// (-EACCES) and a thread of another user (-EPERM).
int cshims_thread_set_nice(int32_t tid, int nice);
int cshims_thread_get_nice(int32_t tid, int *nice);

// Scheduling policy (SCHED_OTHER, SCHED_FIFO, SCHED_RR, ...) and static
// priority of thread `tid` (0 = the caller): sched_setscheduler(2) and
// sched_getscheduler(2)/sched_getparam(2). A real-time policy needs
// CAP_SYS_NICE or RLIMIT_RTPRIO (-EPERM otherwise).
int cshims_thread_sched_set(int32_t tid, int policy, int priority);
int cshims_thread_sched_get(int32_t tid, int *policy, int *priority);
// The static priority range of a policy (sched_get_priority_min/max(2)).
int cshims_sched_priority_min(int policy);
int cshims_sched_priority_max(int policy);

// The smallest stack a thread may have (sysconf(_SC_THREAD_STACK_MIN), which
// glibc computes at run time; PTHREAD_STACK_MIN where sysconf has no answer).
long cshims_thread_stack_min(void);
// The stack size threads get when none is asked for (glibc derives it from
// RLIMIT_STACK; pthread_getattr_default_np(3)), or -errno.
long cshims_thread_default_stack_size(void);
// The L1 data cache line in bytes (sysconf, then sysfs), or 0 if unknown.
long cshims_cache_line_size(void);

// Makes the calling thread's future allocations prefer `node`, reporting the
// kernel's answer (set_mempolicy(MPOL_PREFERRED)); numa_set_preferred(3)
// only prints a warning on failure. 0 without NUMA support and node 0.
int cshims_numa_prefer_node(int node);

#endif // CSHIMS_SYSTEM_H
