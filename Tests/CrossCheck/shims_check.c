// The C shims' atomics, test-and-set/clear, barriers, spin hint and futex
// calls, and the port shims (ports.c: Unix-domain and TCP sockets, descriptor
// passing, sealed memfds and rings), checked on whatever architecture this is
// compiled for. scripts/cross-aarch64 builds it (with ports.c) for AArch64
// and runs it under qemu-user; the same assertions hold on x86_64
// (scripts/cross-aarch64 --native).
// Exit 0 and "N passed, 0 failed" when every check holds.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "cshims_atomic.h"
#include "cshims_futex.h"
#include "cshims_ports.h"

// What the port shims assume of the kernel's and the C library's types, on
// every architecture: SO_PEERCRED's fields fit the shim's out-parameters
// exactly; an abstract name takes sun_path after its leading NUL (so 107
// bytes at most, the -ENAMETOOLONG boundary checked below); the descriptor
// limit is the kernel's SCM_MAX_FD; a count and its signed result are the
// same width.
_Static_assert(sizeof(((struct ucred *)0)->pid) == sizeof(int32_t), "ucred.pid is not 32 bits");
_Static_assert(sizeof(((struct ucred *)0)->uid) == sizeof(uint32_t), "ucred.uid is not 32 bits");
_Static_assert(sizeof(((struct ucred *)0)->gid) == sizeof(uint32_t), "ucred.gid is not 32 bits");
_Static_assert(sizeof(((struct sockaddr_un *)0)->sun_path) == 108, "sun_path is not 108 bytes");
_Static_assert(offsetof(struct sockaddr_un, sun_path) == sizeof(sa_family_t), "sun_path does not follow sun_family");
_Static_assert(CSHIMS_PORT_MAX_FDS == 253, "the descriptor limit is not the kernel's SCM_MAX_FD");
_Static_assert(sizeof(ssize_t) == sizeof(size_t), "ssize_t and size_t differ in width");

static int passed, failed;

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (cond) passed++;                                                    \
        else { failed++; fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); } \
    } while (0)

static void listing_4_1(void) {
    // The guide's Listing 4-1 with its exact values.
    int32_t value = 0;
    cshims_atomic_test_and_set_bit(&value, 0, CSHIMS_ORDER_SEQ_CST);
    CHECK(value == 128);
    value = 0;
    cshims_atomic_test_and_set_bit(&value, 7, CSHIMS_ORDER_SEQ_CST);
    CHECK(value == 1);
    value = 0;
    cshims_atomic_test_and_set_bit(&value, 15, CSHIMS_ORDER_SEQ_CST);
    CHECK(value == 256);
    uint32_t expected = 256;
    CHECK(cshims_atomic_cas_u32((uint32_t *)&value, &expected, 512, CSHIMS_ORDER_SEQ_CST));
    CHECK(value == 512);
    expected = 256;
    CHECK(!cshims_atomic_cas_u32((uint32_t *)&value, &expected, 1024, CSHIMS_ORDER_SEQ_CST));
    CHECK(value == 512);
    CHECK(expected == 512); // a failed CAS reports what it found
}

static void bit_order(void) {
    uint32_t w = 0;
    CHECK(!cshims_atomic_test_and_set_bit(&w, 7, CSHIMS_ORDER_RELAXED));
    CHECK(w == 1);
    CHECK(!cshims_atomic_test_and_set_bit(&w, 24, CSHIMS_ORDER_SEQ_CST));
    CHECK(w == 0x80000001u);
    CHECK(cshims_atomic_test_and_set_bit(&w, 24, CSHIMS_ORDER_SEQ_CST));
    CHECK(cshims_atomic_test_and_clear_bit(&w, 24, CSHIMS_ORDER_SEQ_CST));
    CHECK(!cshims_atomic_test_and_clear_bit(&w, 24, CSHIMS_ORDER_RELAXED));
    CHECK(cshims_atomic_test_bit(&w, 7, CSHIMS_ORDER_ACQUIRE));
    CHECK(!cshims_atomic_test_bit(&w, 6, CSHIMS_ORDER_ACQUIRE));

    unsigned char field[37];
    memset(field, 0, sizeof field);
    for (uint64_t bit = 0; bit < sizeof field * 8; bit++) {
        CHECK(!cshims_atomic_test_and_set_bit(field, bit, CSHIMS_ORDER_SEQ_CST));
        CHECK(field[bit >> 3] & (0x80u >> (bit & 7)));
    }
    int all = 1;
    for (size_t i = 0; i < sizeof field; i++) all &= field[i] == 0xFF;
    CHECK(all);
}

static void words(void) {
    int orders[] = {CSHIMS_ORDER_RELAXED, CSHIMS_ORDER_ACQUIRE, CSHIMS_ORDER_RELEASE,
                    CSHIMS_ORDER_ACQ_REL, CSHIMS_ORDER_SEQ_CST};
    for (size_t i = 0; i < sizeof orders / sizeof orders[0]; i++) {
        int o = orders[i];
        uint32_t a = 0;
        CHECK(cshims_atomic_fetch_add_u32(&a, 5, o) == 0 && a == 5);
        CHECK(cshims_atomic_fetch_add_u32(&a, (uint32_t)-7, o) == 5 && (int32_t)a == -2);
        CHECK(cshims_atomic_fetch_or_u32(&a, 0xF0, o) == (uint32_t)-2);
        a = 0xC;
        CHECK(cshims_atomic_fetch_and_u32(&a, 0x6, o) == 0xC && a == 0x4);
        CHECK(cshims_atomic_fetch_xor_u32(&a, 0x5, o) == 0x4 && a == 0x1);
        CHECK(cshims_atomic_exchange_u32(&a, 9, o) == 1 && a == 9);

        uint64_t b = 0;
        CHECK(cshims_atomic_fetch_add_u64(&b, 1ull << 40, o) == 0 && b == 1ull << 40);
        CHECK(cshims_atomic_fetch_or_u64(&b, 1ull << 63, o) == 1ull << 40);
        CHECK(cshims_atomic_fetch_and_u64(&b, 1ull << 63, o) == ((1ull << 63) | (1ull << 40)));
        CHECK(cshims_atomic_fetch_xor_u64(&b, 1ull << 63, o) == 1ull << 63 && b == 0);
        uint64_t e = 0;
        CHECK(cshims_atomic_cas_u64(&b, &e, ~0ull, o) && b == ~0ull);
        e = 0;
        CHECK(!cshims_atomic_cas_u64(&b, &e, 1, o) && e == ~0ull);
        cshims_atomic_store_u64(&b, 77, o == CSHIMS_ORDER_ACQUIRE || o == CSHIMS_ORDER_ACQ_REL ? CSHIMS_ORDER_RELEASE : o);
        CHECK(cshims_atomic_load_u64(&b, o == CSHIMS_ORDER_RELEASE || o == CSHIMS_ORDER_ACQ_REL ? CSHIMS_ORDER_ACQUIRE : o) == 77);

        uintptr_t p = 0;
        uintptr_t pe = 0;
        CHECK(cshims_atomic_cas_uptr(&p, &pe, (uintptr_t)&p, o) && p == (uintptr_t)&p);
        CHECK(cshims_atomic_fetch_add_uptr(&p, 8, o) == (uintptr_t)&p);
        // A weak CAS may fail spuriously; it must succeed within a few tries.
        uint32_t w = 3, we;
        int ok = 0;
        for (int t = 0; t < 100 && !ok; t++) { we = 3; ok = cshims_atomic_cas_weak_u32(&w, &we, 4, o); }
        CHECK(ok && w == 4);
    }
}

static void barriers_and_hint(void) {
    // They must assemble for this architecture and return.
    cshims_barrier_full();
    cshims_barrier_load();
    cshims_barrier_store();
    cshims_barrier_compiler();
    cshims_fence(CSHIMS_ORDER_ACQUIRE);
    cshims_fence(CSHIMS_ORDER_RELEASE);
    for (int i = 0; i < 10; i++) cshims_spin_hint();
    passed++;
}

static void futex(void) {
    uint32_t word = 0;
    int64_t now = cshims_monotonic_now_ns();
    CHECK(cshims_futex_wait(&word, 1, -1, false) == -EAGAIN);       // value differs
    CHECK(cshims_futex_wait(&word, 0, now - 1, false) == -ETIMEDOUT); // deadline in the past
    CHECK(cshims_futex_wait(&word, 0, now + 2000000, true) == -ETIMEDOUT);
    CHECK(cshims_monotonic_now_ns() - now >= 2000000);
    CHECK(cshims_futex_wake(&word, 1, false) == 0);
    CHECK(cshims_futex_wake(&word, 1, true) == 0);
}


// How many descriptors below 4096 are open: the same before and after the
// port checks when nothing they opened (or received, and had to close) was
// left open.
static int open_fd_count(void) {
    int count = 0;
    for (int fd = 0; fd < 4096; fd++) count += fcntl(fd, F_GETFD) >= 0;
    return count;
}

static int is_nonblocking_cloexec(int fd) {
    return (fcntl(fd, F_GETFL) & O_NONBLOCK) && (fcntl(fd, F_GETFD) & FD_CLOEXEC);
}

static void ports_messages(void) {
    int fds[2] = {-1, -1};
    CHECK(cshims_port_socketpair(fds) == 0);
    CHECK(fds[0] >= 0 && fds[1] >= 0 && fds[0] != fds[1]);
    CHECK(is_nonblocking_cloexec(fds[0]) && is_nonblocking_cloexec(fds[1]));

    char buffer[64];
    int got_fds[4];
    int fd_count = -1, truncated = -1;
    // Nothing waiting: -EAGAIN, and the out-parameters are still set.
    CHECK(cshims_port_receive(fds[1], buffer, sizeof buffer, got_fds, 4, &fd_count, &truncated) == -EAGAIN);
    CHECK(fd_count == 0 && truncated == 0);
    CHECK(cshims_port_poll(fds[1], 1, 0) == 0);  // not readable
    CHECK(cshims_port_poll(fds[0], 2, 0) == 1);  // writable

    // Round trips keep message boundaries.
    CHECK(cshims_port_send(fds[0], "hello", 5, NULL, 0) == 5);
    CHECK(cshims_port_send(fds[0], "port", 4, NULL, 0) == 4);
    CHECK(cshims_port_poll(fds[1], 1, 1000000000) == 1);
    CHECK(cshims_port_receive(fds[1], buffer, sizeof buffer, got_fds, 4, &fd_count, &truncated) == 5);
    CHECK(memcmp(buffer, "hello", 5) == 0 && fd_count == 0 && truncated == 0);
    CHECK(cshims_port_receive(fds[1], buffer, sizeof buffer, got_fds, 4, &fd_count, &truncated) == 4);
    CHECK(memcmp(buffer, "port", 4) == 0 && fd_count == 0 && truncated == 0);
    // Both directions.
    CHECK(cshims_port_send(fds[1], "back", 4, NULL, 0) == 4);
    CHECK(cshims_port_receive(fds[0], buffer, sizeof buffer, got_fds, 4, &fd_count, &truncated) == 4);
    CHECK(memcmp(buffer, "back", 4) == 0);

    // A message longer than the buffer: the part that fits, flagged (1).
    CHECK(cshims_port_send(fds[0], "0123456789", 10, NULL, 0) == 10);
    CHECK(cshims_port_receive(fds[1], buffer, 4, got_fds, 4, &fd_count, &truncated) == 4);
    CHECK(memcmp(buffer, "0123", 4) == 0 && truncated == 1);
    // The rest of it is gone: the next receive finds nothing.
    CHECK(cshims_port_receive(fds[1], buffer, sizeof buffer, got_fds, 4, &fd_count, &truncated) == -EAGAIN);

    // Descriptor counts outside 0...CSHIMS_PORT_MAX_FDS are refused.
    CHECK(cshims_port_send(fds[0], "x", 1, got_fds, -1) == -EINVAL);
    CHECK(cshims_port_send(fds[0], "x", 1, got_fds, CSHIMS_PORT_MAX_FDS + 1) == -EINVAL);

    // Descriptor passing: a pipe's read end goes over; the copy that arrives
    // is another number, close-on-exec (MSG_CMSG_CLOEXEC), and reads what
    // was written to the pipe.
    int pipe_fds[2];
    CHECK(pipe(pipe_fds) == 0);
    CHECK(write(pipe_fds[1], "z", 1) == 1);
    CHECK(cshims_port_send(fds[0], "fd", 2, &pipe_fds[0], 1) == 2);
    CHECK(cshims_port_receive(fds[1], buffer, sizeof buffer, got_fds, 4, &fd_count, &truncated) == 2);
    CHECK(memcmp(buffer, "fd", 2) == 0 && fd_count == 1 && truncated == 0);
    if (fd_count == 1) {
        CHECK(got_fds[0] != pipe_fds[0]);
        CHECK(fcntl(got_fds[0], F_GETFD) & FD_CLOEXEC);
        char c = 0;
        CHECK(read(got_fds[0], &c, 1) == 1 && c == 'z');
        CHECK(cshims_port_close(got_fds[0]) == 0);
    }
    // Three descriptors into room for one: one kept, two closed, flagged (2).
    int three[3] = {pipe_fds[0], pipe_fds[1], pipe_fds[0]};
    CHECK(cshims_port_send(fds[0], "3", 1, three, 3) == 1);
    CHECK(cshims_port_receive(fds[1], buffer, sizeof buffer, got_fds, 1, &fd_count, &truncated) == 1);
    CHECK(fd_count == 1 && truncated == 2);
    if (fd_count == 1) CHECK(cshims_port_close(got_fds[0]) == 0);
    // No room at all: the descriptors are closed, flagged; the bytes arrive.
    CHECK(cshims_port_send(fds[0], "0", 1, three, 2) == 1);
    CHECK(cshims_port_receive(fds[1], buffer, sizeof buffer, got_fds, 0, &fd_count, &truncated) == 1);
    CHECK(fd_count == 0 && truncated == 2);
    CHECK(cshims_port_close(pipe_fds[0]) == 0 && cshims_port_close(pipe_fds[1]) == 0);

    // The peer of a socket pair is this process.
    int32_t pid = 0;
    uint32_t uid = 1, gid = 1;
    CHECK(cshims_port_peer_credentials(fds[0], &pid, &uid, &gid) == 0);
    CHECK(pid == (int32_t)getpid() && uid == (uint32_t)geteuid() && gid == (uint32_t)getegid());
    CHECK(cshims_port_effective_uid() == (uint32_t)geteuid());

    // A duplicate is close-on-exec and the same socket.
    int copy = cshims_port_duplicate(fds[0]);
    CHECK(copy >= 0 && copy != fds[0] && (fcntl(copy, F_GETFD) & FD_CLOEXEC));
    CHECK(cshims_port_send(copy, "dup", 3, NULL, 0) == 3);
    CHECK(cshims_port_receive(fds[1], buffer, sizeof buffer, got_fds, 4, &fd_count, &truncated) == 3);
    CHECK(memcmp(buffer, "dup", 3) == 0);
    CHECK(cshims_port_close(copy) == 0);

    // Shutdown: the peer reads end of connection (0) and polls readable;
    // sending after it is -EPIPE, without SIGPIPE (MSG_NOSIGNAL), or this
    // process would have died.
    CHECK(cshims_port_shutdown(fds[0]) == 0);
    CHECK(cshims_port_poll(fds[1], 1, 1000000000) == 1);
    CHECK(cshims_port_receive(fds[1], buffer, sizeof buffer, got_fds, 4, &fd_count, &truncated) == 0);
    CHECK(cshims_port_send(fds[0], "x", 1, NULL, 0) == -EPIPE);
    CHECK(cshims_port_close(fds[0]) == 0);
    CHECK(cshims_port_send(fds[1], "x", 1, NULL, 0) == -EPIPE);
    CHECK(cshims_port_close(fds[1]) == 0);

    // A descriptor that is not open: -EBADF from every call.
    CHECK(cshims_port_send(fds[1], "x", 1, NULL, 0) == -EBADF);
    CHECK(cshims_port_receive(fds[1], buffer, sizeof buffer, got_fds, 4, &fd_count, &truncated) == -EBADF);
    CHECK(fd_count == 0 && truncated == 0);
    CHECK(cshims_port_peer_credentials(fds[1], &pid, &uid, &gid) == -EBADF);
    CHECK(cshims_port_duplicate(fds[1]) == -EBADF);
    CHECK(cshims_port_shutdown(fds[1]) == -EBADF);
    CHECK(cshims_port_accept(fds[1]) == -EBADF);
    CHECK(cshims_port_close(fds[1]) == -EBADF);
    CHECK(cshims_port_poll(fds[1], 1, 0) == 1);  // POLLNVAL: ready, the next call says why
}

static void ports_named(void) {
    // A name of this process's own, so that parallel runs do not collide.
    char name[64];
    int length = snprintf(name, sizeof name, "spindle.shims_check.%d", (int)getpid());
    int listener = cshims_port_listen(name, (size_t)length, 4);
    CHECK(listener >= 0 && is_nonblocking_cloexec(listener));
    CHECK(cshims_port_listen(name, (size_t)length, 4) == -EADDRINUSE);
    CHECK(cshims_port_accept(listener) == -EAGAIN);

    int client = cshims_port_connect(name, (size_t)length, -1);
    CHECK(client >= 0 && is_nonblocking_cloexec(client));
    CHECK(cshims_port_poll(listener, 1, 1000000000) == 1);
    int server = cshims_port_accept(listener);
    CHECK(server >= 0 && is_nonblocking_cloexec(server));

    char buffer[16];
    int got_fds[1], fd_count, truncated;
    CHECK(cshims_port_send(client, "ping", 4, NULL, 0) == 4);
    CHECK(cshims_port_receive(server, buffer, sizeof buffer, got_fds, 1, &fd_count, &truncated) == 4);
    CHECK(memcmp(buffer, "ping", 4) == 0);
    int32_t pid = 0;
    uint32_t uid = 1, gid = 1;
    CHECK(cshims_port_peer_credentials(server, &pid, &uid, &gid) == 0);
    CHECK(pid == (int32_t)getpid() && uid == (uint32_t)geteuid());
    CHECK(cshims_port_close(client) == 0 && cshims_port_close(server) == 0);
    CHECK(cshims_port_close(listener) == 0);
    // Freed with its socket: nobody holds the name now.
    CHECK(cshims_port_connect(name, (size_t)length, -1) == -ECONNREFUSED);

    // The longest abstract name is 107 bytes (sun_path less its leading NUL).
    char longest[109];
    memset(longest, 'n', sizeof longest);
    snprintf(longest, 32, "spindle.long.%d.", (int)getpid());
    longest[strlen(longest)] = 'n';
    CHECK(cshims_port_listen(longest, 108, 1) == -ENAMETOOLONG);
    CHECK(cshims_port_connect(longest, 108, -1) == -ENAMETOOLONG);
    int fits = cshims_port_listen(longest, 107, 1);
    CHECK(fits >= 0);
    if (fits >= 0) CHECK(cshims_port_close(fits) == 0);
}

static void ports_memfds(void) {
    // A sealed buffer round-trips; it cannot be written, shrunk or grown.
    const char bytes[] = "sealed bytes for the receiver";
    int fd = cshims_port_sealed_memfd(bytes, sizeof bytes);
    CHECK(fd >= 0 && (fcntl(fd, F_GETFD) & FD_CLOEXEC));
    int seals = fcntl(fd, F_GET_SEALS);
    CHECK(seals == (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
    char back[sizeof bytes];
    memset(back, 0, sizeof back);
    CHECK(cshims_port_read_sealed_memfd(fd, back, sizeof back) == 0);
    CHECK(memcmp(back, bytes, sizeof bytes) == 0);
    CHECK(cshims_port_read_sealed_memfd(fd, back, sizeof back - 1) == -EBADMSG);  // wrong size
    CHECK(pwrite(fd, "x", 1, 0) < 0 && errno == EPERM);
    CHECK(ftruncate(fd, 1) < 0 && errno == EPERM);
    CHECK(cshims_port_close(fd) == 0);
    // Empty.
    fd = cshims_port_sealed_memfd(NULL, 0);
    CHECK(fd >= 0);
    CHECK(cshims_port_read_sealed_memfd(fd, back, 0) == 0);
    CHECK(cshims_port_close(fd) == 0);
    // Not sealed against writing: refused.
    int unsealed = memfd_create("shims_check", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    CHECK(unsealed >= 0 && write(unsealed, bytes, sizeof bytes) == (ssize_t)sizeof bytes);
    CHECK(cshims_port_read_sealed_memfd(unsealed, back, sizeof bytes) == -EBADMSG);
    // A descriptor that cannot carry seals at all: the kernel's -EINVAL.
    int pipe_fds[2];
    CHECK(pipe(pipe_fds) == 0);
    CHECK(cshims_port_read_sealed_memfd(pipe_fds[0], back, 1) == -EINVAL);

    // A ring: shared between the maker's mapping and a receiver's, sealed
    // against shrinking and growing (and further sealing), not writing.
    size_t size = 4 * 4096;
    void *mine = NULL, *theirs = NULL;
    int ring = cshims_port_ring_create(size, &mine);
    CHECK(ring >= 0 && mine != NULL && (fcntl(ring, F_GETFD) & FD_CLOEXEC));
    CHECK(fcntl(ring, F_GET_SEALS) == (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
    CHECK(ftruncate(ring, (off_t)size / 2) < 0 && errno == EPERM);
    // Passed over a socket pair as the ports do, then mapped by the receiver.
    int pair[2];
    CHECK(cshims_port_socketpair(pair) == 0);
    char buffer[8];
    int received = -1, fd_count = 0, truncated = 0;
    CHECK(cshims_port_send(pair[0], "ring", 4, &ring, 1) == 4);
    CHECK(cshims_port_receive(pair[1], buffer, sizeof buffer, &received, 1, &fd_count, &truncated) == 4);
    CHECK(fd_count == 1 && received >= 0);
    if (fd_count == 1 && mine != NULL) {
        CHECK(cshims_port_ring_map(received, size, &theirs) == 0 && theirs != NULL);
        if (theirs != NULL) {
            memcpy((char *)mine + size - 6, "shared", 6);
            CHECK(memcmp((char *)theirs + size - 6, "shared", 6) == 0);
            ((char *)theirs)[0] = 'r';  // read-write both ways
            CHECK(((char *)mine)[0] == 'r');
            cshims_port_ring_unmap(theirs, size);
        }
        void *wrong = NULL;
        CHECK(cshims_port_ring_map(received, size + 4096, &wrong) == -EBADMSG && wrong == NULL);
        CHECK(cshims_port_close(received) == 0);
    }
    if (mine != NULL) cshims_port_ring_unmap(mine, size);
    // Without the shrink and grow seals, or with none possible: -EBADMSG.
    void *never = NULL;
    CHECK(ftruncate(unsealed, (off_t)size) == 0);
    CHECK(cshims_port_ring_map(unsealed, size, &never) == -EBADMSG && never == NULL);
    CHECK(cshims_port_ring_map(pipe_fds[0], size, &never) == -EBADMSG && never == NULL);
    CHECK(cshims_port_ring_map(-1, size, &never) == -EBADF);
    CHECK(cshims_port_close(ring) == 0);
    CHECK(cshims_port_close(unsealed) == 0);
    CHECK(cshims_port_close(pipe_fds[0]) == 0 && cshims_port_close(pipe_fds[1]) == 0);
    CHECK(cshims_port_close(pair[0]) == 0 && cshims_port_close(pair[1]) == 0);
}

static void ports_tcp(void) {
    uint16_t port = 0;
    CHECK(cshims_port_tcp_listen("localhost", 0, 4, &port) == -EINVAL);  // numeric only
    CHECK(cshims_port_tcp_connect("256.0.0.1", 1, 0) == -EINVAL);
    int listener = cshims_port_tcp_listen("127.0.0.1", 0, 4, &port);
    CHECK(listener >= 0 && port != 0 && is_nonblocking_cloexec(listener));
    int client = cshims_port_tcp_connect("127.0.0.1", port, 5000000000);
    CHECK(client >= 0 && is_nonblocking_cloexec(client));
    CHECK(cshims_port_poll(listener, 1, 5000000000) == 1);
    int server = cshims_port_accept(listener);
    CHECK(server >= 0);
    CHECK(cshims_port_tcp_nodelay(server) == 0);

    char buffer[16];
    CHECK(cshims_port_stream_receive(server, buffer, sizeof buffer) == -EAGAIN);
    CHECK(cshims_port_stream_send(client, "stream", 6) == 6);
    CHECK(cshims_port_poll(server, 1, 5000000000) == 1);
    CHECK(cshims_port_stream_receive(server, buffer, sizeof buffer) == 6);
    CHECK(memcmp(buffer, "stream", 6) == 0);
    // End of stream is 0; sending to a closed peer is -EPIPE or -ECONNRESET,
    // never SIGPIPE.
    CHECK(cshims_port_close(client) == 0);
    CHECK(cshims_port_poll(server, 1, 5000000000) == 1);
    CHECK(cshims_port_stream_receive(server, buffer, sizeof buffer) == 0);
    ssize_t sent = 0;
    for (int i = 0; i < 100 && sent >= 0; i++) sent = cshims_port_stream_send(server, "x", 1);
    CHECK(sent == -EPIPE || sent == -ECONNRESET);
    CHECK(cshims_port_close(server) == 0);
    CHECK(cshims_port_close(listener) == 0);
    // Nobody listens on the port now.
    CHECK(cshims_port_tcp_connect("127.0.0.1", port, 5000000000) == -ECONNREFUSED);
    CHECK(cshims_port_tcp_nodelay(-1) == -EBADF);
    CHECK(cshims_port_stream_send(-1, "x", 1) == -EBADF);
    CHECK(cshims_port_stream_receive(-1, buffer, 1) == -EBADF);
}

static void ports(void) {
    int before = open_fd_count();
    ports_messages();
    ports_named();
    ports_memfds();
    ports_tcp();
    CHECK(cshims_port_enter_network_namespace("/nonexistent/netns") == -ENOENT);
    CHECK(open_fd_count() == before);  // nothing left open
}

int main(void) {
    listing_4_1();
    bit_order();
    words();
    barriers_and_hint();
    futex();
    ports();
#if defined(__aarch64__)
    const char *arch = "aarch64";
#else
    const char *arch = "x86_64";
#endif
    printf("shims_check (%s): %d passed, %d failed\n", arch, passed, failed);
    return failed == 0 ? 0 : 1;
}
