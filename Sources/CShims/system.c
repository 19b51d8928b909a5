// Out-of-line shims: calls that need _GNU_SOURCE or headers Swift should not
// import (liburing, libnuma). None of them is on a fast path.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <numa.h>
#include <numaif.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cshims_system.h"

int cshims_cpu_count_online(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

int cshims_cpu_count_configured(void) {
    long n = sysconf(_SC_NPROCESSORS_CONF);
    return n < 1 ? 1 : (int)n;
}

long cshims_page_size(void) { return sysconf(_SC_PAGESIZE); }

int cshims_current_cpu(void) {
    int cpu = sched_getcpu();
    return cpu < 0 ? -errno : cpu;
}

// cpu_set_t is a fixed 1024-bit mask; the kernel accepts any multiple of
// sizeof(long), so build a dynamically sized set for machines with more CPUs.
int cshims_affinity_get(int32_t tid, uint64_t *words, size_t nwords) {
    size_t bytes = nwords * sizeof(uint64_t);
    memset(words, 0, bytes);
    if (sched_getaffinity((pid_t)tid, bytes, (cpu_set_t *)(void *)words) != 0) return -errno;
    return 0;
}

int cshims_affinity_set(int32_t tid, const uint64_t *words, size_t nwords) {
    size_t bytes = nwords * sizeof(uint64_t);
    if (sched_setaffinity((pid_t)tid, bytes, (const cpu_set_t *)(const void *)words) != 0)
        return -errno;
    return 0;
}

int cshims_trap_scheduling_calls(void) {
#if defined(__x86_64__)
    const uint32_t arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
    const uint32_t arch = AUDIT_ARCH_AARCH64;
#else
    return -EINVAL;
#endif
    struct sock_filter program[] = {
        // Another architecture's calling convention: let it through.
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_sched_yield, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_sched_setaffinity, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof program / sizeof program[0]), program};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -errno;
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0) return -errno;
    return 0;
}

// --- NUMA --------------------------------------------------------------------
// libnuma's other calls are undefined when numa_available() < 0, so every
// wrapper checks it first and falls back to a one-node answer.

int cshims_numa_available(void) { return numa_available() >= 0 ? 1 : 0; }

int cshims_numa_node_count(void) {
    if (numa_available() < 0) return 1;
    int n = numa_num_configured_nodes();
    return n < 1 ? 1 : n;
}

int cshims_numa_node_of_cpu(int cpu) {
    if (cpu < 0 || cpu >= cshims_cpu_count_configured()) return -EINVAL;
    if (numa_available() < 0) return 0;
    int node = numa_node_of_cpu(cpu);
    return node < 0 ? -errno : node;
}

static int cshims_numa_check_node(int node) {
    if (node < 0) return -EINVAL;
    if (numa_available() < 0) return node == 0 ? 0 : -EINVAL;
    if (node > numa_max_node()) return -EINVAL;
    return 0;
}

void *cshims_numa_alloc_on_node(size_t size, int node, int *error) {
    int check = cshims_numa_check_node(node);
    if (check != 0) { *error = check; return NULL; }
    if (size == 0) { *error = -EINVAL; return NULL; }
    void *p;
    if (numa_available() < 0) {
        // numa_alloc_onnode is an mmap plus an mbind; without NUMA only the
        // mmap is meaningful, and numa_free is a munmap, so both paths pair
        // with cshims_numa_free.
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) { *error = -errno; return NULL; }
    } else {
        errno = 0;
        p = numa_alloc_onnode(size, node);
        if (p == NULL) { *error = errno ? -errno : -ENOMEM; return NULL; }
    }
    *error = 0;
    return p;
}

void cshims_numa_free(void *ptr, size_t size) {
    if (ptr == NULL) return;
    if (numa_available() < 0) munmap(ptr, size);
    else numa_free(ptr, size);
}

int cshims_numa_run_on_node(int node) {
    int check = cshims_numa_check_node(node);
    if (check != 0) return check;
    if (numa_available() < 0) return 0; // one node: it already holds every CPU
    if (numa_run_on_node(node) != 0) return errno ? -errno : -EINVAL;
    return 0;
}

int cshims_unshare_private_mounts(void) {
    if (unshare(CLONE_NEWNS) != 0) return -errno;
    if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) return -errno;
    return 0;
}

int cshims_set_timer_slack(unsigned long ns) {
    if (prctl(PR_SET_TIMERSLACK, ns, 0, 0, 0) != 0) return -errno;
    return 0;
}

int cshims_numa_prefer_node(int node) {
    int check = cshims_numa_check_node(node);
    if (check != 0) return check;
    if (numa_available() < 0) return 0;
    // One bit per node; the kernel reads `maxnode - 1` bits (its historical
    // off-by-one, which libnuma also follows).
    enum { BITS = 8 * sizeof(unsigned long) };
    size_t words = (size_t)node / BITS + 1;
    unsigned long mask[words];
    memset(mask, 0, sizeof mask);
    mask[node / BITS] = 1UL << (node % BITS);
    if (set_mempolicy(MPOL_PREFERRED, mask, words * BITS + 1) != 0) return -errno;
    return 0;
}

// --- Threads -----------------------------------------------------------------

__thread void *cshims_current_thread_record = NULL;
__thread char cshims_thread_token_byte;
__thread void *cshims_queue_frame_record = NULL;
__thread void *cshims_blocking_observer_record = NULL;
unsigned cshims_fork_epoch_value = 0;
unsigned cshims_perturb_mode_value = 1;
uint64_t cshims_perturb_seed_value = 0;
unsigned cshims_perturb_threads_value = 0;
__thread uint64_t cshims_perturb_thread_words[2];
_Alignas(64) unsigned char cshims_sync_buckets[CSHIMS_SYNC_BUCKETS * 64];

// The kernel's per-thread CPU clock id: bits 0-1 the clock (2 = scheduler
// time), bit 2 set for a thread rather than a process, bits 3 and up the id
// inverted (include/linux/posix-timers_types.h).
#define CSHIMS_CPUCLOCK_PERTHREAD 4

int32_t cshims_thread_tid(pthread_t thread) {
    clockid_t clock;
    int rc = pthread_getcpuclockid(thread, &clock);
    if (rc != 0) return -rc;
    if ((clock & CSHIMS_CPUCLOCK_PERTHREAD) == 0) return -ESRCH;
    int32_t tid = (int32_t)~(clock >> 3);
    return tid > 0 ? tid : -ESRCH;
}

int cshims_thread_join_until(pthread_t thread, int64_t deadline_ns) {
    if (deadline_ns < 0) return -pthread_tryjoin_np(thread, NULL);
    // pthread_clockjoin_np would take the CLOCK_MONOTONIC deadline as it is,
    // but ThreadSanitizer does not intercept it (it would miss the join, and
    // later trip over the reused pthread_t). pthread_timedjoin_np, which it
    // does intercept, takes a CLOCK_REALTIME deadline; wait in slices of at
    // most 50 ms, each converted afresh, so that a jump of the wall clock
    // delays the return by at most one slice.
    enum { SLICE_NS = 50 * 1000 * 1000 };
    for (;;) {
        struct timespec mono;
        clock_gettime(CLOCK_MONOTONIC, &mono);
        int64_t now = (int64_t)mono.tv_sec * 1000000000LL + mono.tv_nsec;
        if (now >= deadline_ns) {
            int rc = pthread_tryjoin_np(thread, NULL);
            return rc == EBUSY ? -ETIMEDOUT : -rc;
        }
        int64_t slice = deadline_ns - now;
        if (slice > SLICE_NS) slice = SLICE_NS;
        struct timespec wall;
        clock_gettime(CLOCK_REALTIME, &wall);
        int64_t until = (int64_t)wall.tv_sec * 1000000000LL + wall.tv_nsec + slice;
        struct timespec ts = { .tv_sec = (time_t)(until / 1000000000LL), .tv_nsec = (long)(until % 1000000000LL) };
        int rc = pthread_timedjoin_np(thread, NULL, &ts);
        if (rc == 0) return 0;
        if (rc != ETIMEDOUT && rc != EINTR) return -rc;
    }
}

int cshims_thread_stack_self(void **base, size_t *size) {
    pthread_attr_t attr;
    int rc = pthread_getattr_np(pthread_self(), &attr);
    if (rc != 0) return -rc;
    rc = pthread_attr_getstack(&attr, base, size);
    pthread_attr_destroy(&attr);
    return -rc;
}

int cshims_thread_attr_set_affinity(pthread_attr_t *attr, const uint64_t *words, size_t nwords) {
    return -pthread_attr_setaffinity_np(attr, nwords * sizeof(uint64_t),
                                        (const cpu_set_t *)(const void *)words);
}

int cshims_thread_set_name_self(const char *name) {
    if (prctl(PR_SET_NAME, (unsigned long)name, 0, 0, 0) != 0) return -errno;
    return 0;
}

int cshims_thread_get_name_self(char *buffer, size_t size) {
    if (size < 16) return -ERANGE;
    memset(buffer, 0, size);
    if (prctl(PR_GET_NAME, (unsigned long)buffer, 0, 0, 0) != 0) return -errno;
    return 0;
}

int cshims_thread_get_name(int32_t tid, char *buffer, size_t size) {
    if (size < 16) return -ERANGE;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/comm", (int)tid);
    int fd;
    do { fd = open(path, O_RDONLY | O_CLOEXEC); } while (fd < 0 && errno == EINTR);
    if (fd < 0) return -errno;
    ssize_t n;
    do { n = read(fd, buffer, size - 1); } while (n < 0 && errno == EINTR);
    int error = n < 0 ? -errno : 0;
    close(fd);
    if (error != 0) return error;
    // The file holds the name and a newline.
    if (n > 0 && buffer[n - 1] == '\n') n--;
    buffer[n] = 0;
    return 0;
}

int cshims_thread_state(int32_t tid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
    int fd;
    do { fd = open(path, O_RDONLY | O_CLOEXEC); } while (fd < 0 && errno == EINTR);
    if (fd < 0) return -errno;
    // "pid (comm) S ...": comm is at most 15 bytes (64 with a kernel
    // thread's), so the state is within the first 128.
    char buffer[128];
    ssize_t n;
    do { n = read(fd, buffer, sizeof buffer - 1); } while (n < 0 && errno == EINTR);
    int error = n < 0 ? -errno : 0;
    close(fd);
    if (error != 0) return error;
    buffer[n] = 0;
    char *close_paren = strrchr(buffer, ')');
    if (close_paren == NULL || close_paren[1] != ' ' || close_paren[2] == 0) return -EPROTO;
    return (unsigned char)close_paren[2];
}

int cshims_thread_set_nice(int32_t tid, int nice) {
    if (setpriority(PRIO_PROCESS, (id_t)tid, nice) != 0) return -errno;
    return 0;
}

int cshims_thread_get_nice(int32_t tid, int *nice) {
    // -1 is a valid nice value: only errno tells a failure apart.
    errno = 0;
    int value = getpriority(PRIO_PROCESS, (id_t)tid);
    if (value == -1 && errno != 0) return -errno;
    *nice = value;
    return 0;
}

int cshims_thread_sched_set(int32_t tid, int policy, int priority) {
    struct sched_param param = { .sched_priority = priority };
    if (sched_setscheduler((pid_t)tid, policy, &param) != 0) return -errno;
    return 0;
}

int cshims_thread_sched_get(int32_t tid, int *policy, int *priority) {
    int p = sched_getscheduler((pid_t)tid);
    if (p < 0) return -errno;
    struct sched_param param;
    if (sched_getparam((pid_t)tid, &param) != 0) return -errno;
    // SCHED_RESET_ON_FORK is a flag, not a policy.
    *policy = p & ~SCHED_RESET_ON_FORK;
    *priority = param.sched_priority;
    return 0;
}

int cshims_sched_priority_min(int policy) {
    int v = sched_get_priority_min(policy);
    return v < 0 ? -errno : v;
}

int cshims_sched_priority_max(int policy) {
    int v = sched_get_priority_max(policy);
    return v < 0 ? -errno : v;
}

long cshims_thread_stack_min(void) {
    long v = sysconf(_SC_THREAD_STACK_MIN);
    return v > 0 ? v : (long)PTHREAD_STACK_MIN;
}

long cshims_thread_default_stack_size(void) {
    pthread_attr_t attr;
    int rc = pthread_getattr_default_np(&attr);
    if (rc != 0) return -rc;
    size_t size = 0;
    rc = pthread_attr_getstacksize(&attr, &size);
    pthread_attr_destroy(&attr);
    return rc != 0 ? -rc : (long)size;
}

long cshims_cache_line_size(void) {
    long v = sysconf(_SC_LEVEL1_DCACHE_LINESIZE);
    if (v > 0) return v;
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index0/coherency_line_size", "re");
    if (f == NULL) return 0;
    long line = 0;
    if (fscanf(f, "%ld", &line) != 1) line = 0;
    fclose(f);
    return line > 0 ? line : 0;
}
