// io_uring through liburing, behind an opaque handle (see cshims_uring.h).
#include <errno.h>
#include <liburing.h>
#include <stdlib.h>

#include "cshims_uring.h"

struct cshims_uring {
    struct io_uring ring;
    unsigned features;
};

cshims_uring *cshims_uring_create(unsigned entries, unsigned flags, int *error) {
    cshims_uring *r = calloc(1, sizeof *r);
    if (r == NULL) { *error = -ENOMEM; return NULL; }
    struct io_uring_params params = {.flags = flags};
    int rc = io_uring_queue_init_params(entries, &r->ring, &params); // returns -errno
    if (rc < 0) { free(r); *error = rc; return NULL; }
    r->features = params.features;
    *error = 0;
    return r;
}

void cshims_uring_destroy(cshims_uring *r) {
    if (r == NULL) return;
    io_uring_queue_exit(&r->ring);
    free(r);
}

int cshims_uring_fd(const cshims_uring *r) { return r->ring.ring_fd; }

int cshims_uring_opcode_supported(cshims_uring *r, int opcode) {
    struct io_uring_probe *probe = io_uring_get_probe_ring(&r->ring);
    if (probe == NULL) return -EINVAL;
    // io_uring_opcode_supported() only knows opcodes up to the header's
    // IORING_OP_LAST, so read the probe's table directly for newer ones.
    int supported = 0;
    if (opcode >= 0 && opcode <= probe->last_op)
        supported = (probe->ops[opcode].flags & IO_URING_OP_SUPPORTED) != 0;
    io_uring_free_probe(probe);
    return supported;
}

int cshims_uring_submit_timeout(cshims_uring *r, int64_t ns, uint64_t user_data) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    if (sqe == NULL) return -EBUSY;
    // The kernel reads the timespec at submission time (IORING_FEAT_SUBMIT_STABLE
    // only covers data, not this), so it must outlive io_uring_submit below.
    struct __kernel_timespec ts = {.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
    io_uring_prep_timeout(sqe, &ts, 0, 0);
    io_uring_sqe_set_data64(sqe, user_data);
    return io_uring_submit(&r->ring);
}

int cshims_uring_wait_completion(cshims_uring *r, uint64_t *user_data, int32_t *result) {
    struct io_uring_cqe *cqe = NULL;
    int rc = io_uring_wait_cqe(&r->ring, &cqe);
    if (rc < 0) return rc;
    *user_data = io_uring_cqe_get_data64(cqe);
    *result = cqe->res;
    io_uring_cqe_seen(&r->ring, cqe);
    return 0;
}

int cshims_uring_has_ext_arg(const cshims_uring *r) {
    return (r->features & IORING_FEAT_EXT_ARG) != 0;
}

int cshims_uring_queue_poll(cshims_uring *r, int fd, unsigned poll_mask, uint64_t user_data,
                            int multishot) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    if (sqe == NULL) {
        // Full: hand the queued entries to the kernel and try once more.
        io_uring_submit(&r->ring);
        sqe = io_uring_get_sqe(&r->ring);
        if (sqe == NULL) return -EBUSY;
    }
    if (multishot) io_uring_prep_poll_multishot(sqe, fd, poll_mask);
    else io_uring_prep_poll_add(sqe, fd, poll_mask);
    io_uring_sqe_set_data64(sqe, user_data);
    return 0;
}

int cshims_uring_queue_poll_remove(cshims_uring *r, uint64_t target, uint64_t user_data) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    if (sqe == NULL) {
        io_uring_submit(&r->ring);
        sqe = io_uring_get_sqe(&r->ring);
        if (sqe == NULL) return -EBUSY;
    }
    io_uring_prep_poll_remove(sqe, target);
    io_uring_sqe_set_data64(sqe, user_data);
    return 0;
}

int cshims_uring_submit_and_wait(cshims_uring *r, int64_t timeout_ns) {
    struct io_uring_cqe *cqe = NULL;
    if (timeout_ns == 0) {
        int rc = io_uring_submit(&r->ring);
        if (rc < 0) return rc;
        return io_uring_peek_cqe(&r->ring, &cqe) == 0 ? 0 : -ETIME;
    }
    // liburing returns -errno itself and leaves errno alone (2.3 does not
    // set it), so its result is passed up as it is.
    if (timeout_ns < 0) {
        int rc = io_uring_submit_and_wait(&r->ring, 1);
        return rc < 0 ? rc : 0;
    }
    struct __kernel_timespec ts = {.tv_sec = timeout_ns / 1000000000LL,
                                   .tv_nsec = timeout_ns % 1000000000LL};
    int rc = io_uring_submit_and_wait_timeout(&r->ring, &cqe, 1, &ts, NULL);
    return rc < 0 ? rc : 0;
}

int cshims_uring_has_unsubmitted(const cshims_uring *r) {
    return io_uring_sq_ready(&r->ring) != 0;
}

int cshims_uring_next_completion(cshims_uring *r, uint64_t *user_data, int32_t *result,
                                 int *more) {
    struct io_uring_cqe *cqe = NULL;
    if (io_uring_peek_cqe(&r->ring, &cqe) != 0 || cqe == NULL) return 0;
    *user_data = io_uring_cqe_get_data64(cqe);
    *result = cqe->res;
    *more = (cqe->flags & IORING_CQE_F_MORE) != 0;
    io_uring_cqe_seen(&r->ring, cqe);
    return 1;
}
