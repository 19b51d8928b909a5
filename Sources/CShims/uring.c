// io_uring through liburing, behind an opaque handle (see cshims_uring.h).
#include <errno.h>
#include <liburing.h>
#include <stdlib.h>

#include "cshims_uring.h"

struct cshims_uring {
    struct io_uring ring;
};

cshims_uring *cshims_uring_create(unsigned entries, unsigned flags, int *error) {
    cshims_uring *r = calloc(1, sizeof *r);
    if (r == NULL) { *error = -ENOMEM; return NULL; }
    int rc = io_uring_queue_init(entries, &r->ring, flags); // returns -errno
    if (rc < 0) { free(r); *error = rc; return NULL; }
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
