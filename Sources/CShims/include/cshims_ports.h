// Unix-domain sockets for NamedPort and RemotePort: thin wrappers that read
// errno in C. Each returns 0 (or a count, or a descriptor) on success and
// -errno on failure. Every descriptor made here is close-on-exec and
// non-blocking; the sockets are SOCK_SEQPACKET (ordered, connected, with
// message boundaries).
#ifndef CSHIMS_PORTS_H
#define CSHIMS_PORTS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

// The most descriptors one message carries (the kernel's SCM_MAX_FD is 253).
enum { CSHIMS_PORT_MAX_FDS = 253 };

// socket(2), bind(2) to the abstract-namespace address whose name is the
// `length` bytes at `name` (a leading NUL is added here; `name` holds none)
// and listen(2). Returns the listening descriptor; -EADDRINUSE when another
// socket holds the name; -ENAMETOOLONG when it does not fit in sun_path.
int cshims_port_listen(const char *name, size_t length, int backlog);

// socket(2) and connect(2) to the abstract-namespace name, as above. A
// Unix-domain connect completes at once unless the listener's backlog is
// full; then it waits for room at most `timeout_ns` (0: not at all; -1: no
// limit), through SO_SNDTIMEO, which the kernel's wait honours. Returns the
// connected descriptor, made non-blocking (SO_SNDTIMEO cleared);
// -ECONNREFUSED when nobody holds the name; -EAGAIN when the backlog stayed
// full for the whole timeout.
int cshims_port_connect(const char *name, size_t length, int64_t timeout_ns);

// accept4(2). Returns the new connection, or -EAGAIN when none is waiting.
int cshims_port_accept(int fd);

// socketpair(2): two connected ends in `fds`.
int cshims_port_socketpair(int fds[2]);

// getsockopt(2) SO_PEERCRED: the process, user and group of the peer as of
// connect(2) (for a socket pair, of its creator).
int cshims_port_peer_credentials(int fd, int32_t *pid, uint32_t *uid, uint32_t *gid);

// sendmsg(2) of one message of `count` bytes with `fd_count` descriptors
// (SCM_RIGHTS; at most CSHIMS_PORT_MAX_FDS), with MSG_DONTWAIT and
// MSG_NOSIGNAL (a gone peer is -EPIPE, never SIGPIPE). Returns the bytes
// sent (all of them: a sequenced-packet message goes whole or not at all);
// -EAGAIN when the socket buffer is full; EINTR is retried here.
ssize_t cshims_port_send(int fd, const void *bytes, size_t count, const int *fds, int fd_count);

// recvmsg(2) of one message with MSG_DONTWAIT and MSG_CMSG_CLOEXEC. The
// message's bytes go to `buffer`; the descriptors it carried (at most
// `fd_capacity`) to `fds`, their number to `*fd_count`. `*truncated` gets 1
// if the message was longer than `capacity` (MSG_TRUNC), 2 if descriptors
// were dropped (MSG_CTRUNC), 3 for both; the descriptors received are
// returned even then, for the caller to close. Returns the byte count (0:
// the peer closed the connection), or -EAGAIN when no message waits.
ssize_t cshims_port_receive(int fd, void *buffer, size_t capacity, int *fds, int fd_capacity, int *fd_count,
                            int *truncated);

// ppoll(2) on one descriptor for reading (`events` 1), writing (2) or both
// (3), for at most `timeout_ns` nanoseconds (negative: no limit). Returns 1
// when it is ready (or hung up, or in error: the next call says which), 0
// on timeout or when a signal interrupted the wait (the caller recomputes
// its deadline and waits again).
int cshims_port_poll(int fd, int events, int64_t timeout_ns);

// memfd_create(2) with MFD_ALLOW_SEALING, the `count` bytes written to it,
// then sealed against writing, shrinking and growing (F_ADD_SEALS), so the
// receiver can trust its contents and size. Returns the descriptor.
int cshims_port_sealed_memfd(const void *bytes, size_t count);

// Reads a sealed memfd made by cshims_port_sealed_memfd: checks that its
// write and shrink seals are set and its size is `count`, then pread(2)s it
// whole into `buffer`. Returns 0; -EBADMSG if the seals or size are wrong.
int cshims_port_read_sealed_memfd(int fd, void *buffer, size_t count);

// A sender's shared ring for large byte buffers: a memfd of `bytes` bytes
// (ftruncate), sealed against shrinking and growing and then against
// further sealing, so a receiver that maps it cannot be cut short (no
// SIGBUS), mapped shared read-write at `*map`. Returns the descriptor, or
// -errno (nothing left open or mapped).
int cshims_port_ring_create(size_t bytes, void **map);

// A receiver's side of such a ring: checks that `fd` carries the shrink and
// grow seals and is `bytes` bytes long, then maps it shared read-write at
// `*map`. Returns 0; -EBADMSG if the seals or size are wrong; -errno.
// Does not close `fd`.
int cshims_port_ring_map(int fd, size_t bytes, void **map);

// munmap(2) of a ring mapped by either call above.
void cshims_port_ring_unmap(void *map, size_t bytes);

// fcntl(2) F_DUPFD_CLOEXEC: a second descriptor for the same socket.
int cshims_port_duplicate(int fd);

// shutdown(2) SHUT_RDWR: wakes every thread polling the socket (it reads as
// hung up) and makes later sends fail, before the descriptor is closed.
int cshims_port_shutdown(int fd);

// TCP, for NetworkPort (IPv4, numeric addresses only: no name lookup).
// socket(2) AF_INET SOCK_STREAM, SO_REUSEADDR, bind(2) to `host`:`port`
// (`port` 0: any free port) and listen(2). `*bound_port` gets the port
// bound. Returns the listening descriptor; -EINVAL for an address that is
// not a dotted IPv4 address.
int cshims_port_tcp_listen(const char *host, uint16_t port, int backlog, uint16_t *bound_port);

// socket(2) and a non-blocking connect(2) to `host`:`port`, waiting at most
// `timeout_ns` (negative: no limit) for it to complete; TCP_NODELAY set.
// Returns the connected descriptor; -ETIMEDOUT; -ECONNREFUSED.
int cshims_port_tcp_connect(const char *host, uint16_t port, int64_t timeout_ns);

// setsockopt(2) TCP_NODELAY on an accepted connection.
int cshims_port_tcp_nodelay(int fd);

// send(2) with MSG_DONTWAIT | MSG_NOSIGNAL on a stream: returns the bytes
// sent, possibly fewer than `count`; -EAGAIN when the buffer is full.
ssize_t cshims_port_stream_send(int fd, const void *bytes, size_t count);

// The most buffers cshims_port_stream_sendv gathers in one call.
enum { CSHIMS_PORT_MAX_IOV = 64 };

// sendmsg(2) of `count` buffers (at most CSHIMS_PORT_MAX_IOV; more are left
// for the next call) on a stream, with MSG_DONTWAIT | MSG_NOSIGNAL, retried
// on EINTR: returns the bytes sent (possibly fewer than offered), or -errno
// (-EAGAIN when the socket buffer is full).
ssize_t cshims_port_stream_sendv(int fd, const void *const *bases, const size_t *lengths, int count);

// recv(2) with MSG_DONTWAIT on a stream: returns the bytes read, 0 at end
// of stream, -EAGAIN when none wait.
ssize_t cshims_port_stream_receive(int fd, void *buffer, size_t capacity);

// open(2) of a network namespace file (e.g. /var/run/netns/NAME, made by
// `ip netns add`) and setns(2) into it with CLONE_NEWNET: sockets the
// calling thread makes afterwards live in that namespace. For tests that
// put two hosts on one machine. Returns 0.
int cshims_port_enter_network_namespace(const char *path);

// close(2); EINTR counts as success (Linux frees the descriptor anyway).
int cshims_port_close(int fd);

// geteuid(2).
uint32_t cshims_port_effective_uid(void);

#endif // CSHIMS_PORTS_H
