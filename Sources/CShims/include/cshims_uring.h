// io_uring through liburing. The ring is opaque here; the Ring layer builds on
// these calls. Every function returns 0 or -errno unless stated: liburing's
// own negative results are passed up unchanged (liburing 2.3 returns -errno
// without setting errno, so errno must never be read after its calls).
#ifndef CSHIMS_URING_H
#define CSHIMS_URING_H

#include <stdint.h>

typedef struct cshims_uring cshims_uring;

// liburing's headers predate these opcodes (Debian bookworm ships 2.3); their
// values are fixed by the kernel ABI (include/uapi/linux/io_uring.h, 6.7+).
#define CSHIMS_IORING_OP_FUTEX_WAIT 51
#define CSHIMS_IORING_OP_FUTEX_WAKE 52

// Sets up a ring with `entries` submission slots. On failure returns NULL and
// stores -errno in *error: -EPERM when a seccomp profile or
// kernel.io_uring_disabled refuses, -ENOSYS on a kernel without io_uring,
// -ENOMEM when the locked-memory limit is too small.
cshims_uring *cshims_uring_create(unsigned entries, unsigned flags, int *error);
void cshims_uring_destroy(cshims_uring *ring);

// The ring's file descriptor.
int cshims_uring_fd(const cshims_uring *ring);

// 1 if the kernel supports `opcode` on this ring, 0 if not, -errno if the
// probe itself failed (kernels before 5.6 cannot be probed: -EINVAL).
int cshims_uring_opcode_supported(cshims_uring *ring, int opcode);

// Queues and submits a relative timeout of `ns` nanoseconds tagged
// `user_data`. Returns the number submitted (1) or -errno (-EBUSY if the
// submission queue is full).
int cshims_uring_submit_timeout(cshims_uring *ring, int64_t ns, uint64_t user_data);

// Waits for one completion, then consumes it: stores its user_data and result
// (a -errno of the operation, e.g. -ETIME for an expired timeout). Returns 0
// or -errno of the wait (-EINTR is passed up; the caller retries).
int cshims_uring_wait_completion(cshims_uring *ring, uint64_t *user_data, int32_t *result);

// --- Event-loop operations (the Ring layer) ---------------------------------

// Whether the ring's kernel reports IORING_FEAT_EXT_ARG (timed waits in one
// io_uring_enter, kernel 5.11+). 1 or 0.
int cshims_uring_has_ext_arg(const cshims_uring *ring);

// Queues (does not submit) a poll on `fd` for `poll_mask` (POLLIN,
// POLLOUT...) tagged `user_data`; `multishot` keeps it armed after each
// completion (IORING_POLL_ADD_MULTI). Returns 0 or -EBUSY (queue full).
int cshims_uring_queue_poll(cshims_uring *ring, int fd, unsigned poll_mask, uint64_t user_data,
                            int multishot);

// Queues a removal of the poll tagged `target`; its completion carries
// `user_data`. Returns 0 or -EBUSY.
int cshims_uring_queue_poll_remove(cshims_uring *ring, uint64_t target, uint64_t user_data);

// Submits what is queued and waits for at least one completion, at most
// `timeout_ns` (negative: no limit; 0: do not wait). One io_uring_enter when
// the kernel has EXT_ARG. Returns 0 when a completion is ready, -ETIME on
// timeout, -EINTR, or another -errno.
int cshims_uring_submit_and_wait(cshims_uring *ring, int64_t timeout_ns);

// 1 when entries are queued that the kernel has not been handed yet, else 0.
int cshims_uring_has_unsubmitted(const cshims_uring *ring);

// Takes the next ready completion without waiting: returns 1 and fills the
// outputs, or 0 when none is ready. `more` is 1 when a multishot request
// stays armed (IORING_CQE_F_MORE).
int cshims_uring_next_completion(cshims_uring *ring, uint64_t *user_data, int32_t *result,
                                 int *more);

#endif // CSHIMS_URING_H
