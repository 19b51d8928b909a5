// Out-of-line shims: calls that need _GNU_SOURCE or headers Swift should not
// import (liburing, libnuma). None of them is on a fast path.
#define _GNU_SOURCE
#include <errno.h>
#include <numa.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
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

int cshims_numa_set_preferred(int node) {
    int check = cshims_numa_check_node(node);
    if (check != 0) return check;
    if (numa_available() < 0) return 0;
    numa_set_preferred(node); // void: libnuma reports failures through numa_warn
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
