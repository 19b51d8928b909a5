// Threads, CPUs and NUMA placement. Returns 0 (or a count) on success and
// -errno on failure, unless a comment says otherwise.
#ifndef CSHIMS_SYSTEM_H
#define CSHIMS_SYSTEM_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include "cshims_atomic.h"

// The calling thread's kernel thread id (gettid(2)).
CSHIMS_INLINE int32_t cshims_gettid(void) { return (int32_t)syscall(SYS_gettid); }

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
// Makes the calling thread's allocations prefer `node` (numa_set_preferred(3)).
int cshims_numa_set_preferred(int node);

// Sets the calling thread's timer slack (prctl(PR_SET_TIMERSLACK)): how
// much later than asked the kernel may end its timed sleeps, to batch
// wake-ups. Linux's default is 50 µs.
int cshims_set_timer_slack(unsigned long ns);

// Moves the calling process into a private mount namespace
// (unshare(CLONE_NEWNS)) whose mounts do not propagate back: tests use it to
// mount a read-only file system without touching the host's.
int cshims_unshare_private_mounts(void);

#endif // CSHIMS_SYSTEM_H
