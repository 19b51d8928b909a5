// Unix-domain socket calls for NamedPort and RemotePort; see cshims_ports.h.
#define _GNU_SOURCE
#include <errno.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cshims_ports.h"

// Fills `address` with the abstract name; returns its length, or -ENAMETOOLONG.
static int abstract_address(struct sockaddr_un *address, const char *name, size_t length) {
    memset(address, 0, sizeof *address);
    address->sun_family = AF_UNIX;
    if (length + 1 > sizeof address->sun_path) return -ENAMETOOLONG;
    memcpy(address->sun_path + 1, name, length);  // sun_path[0] stays NUL: abstract
    return (int)(offsetof(struct sockaddr_un, sun_path) + 1 + length);
}

int cshims_port_listen(const char *name, size_t length, int backlog) {
    struct sockaddr_un address;
    int size = abstract_address(&address, name, length);
    if (size < 0) return size;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    if (bind(fd, (struct sockaddr *)&address, (socklen_t)size) < 0 || listen(fd, backlog) < 0) {
        int error = errno;
        close(fd);
        return -error;
    }
    return fd;
}

static int64_t monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

int cshims_port_connect(const char *name, size_t length, int64_t timeout_ns) {
    struct sockaddr_un address;
    int size = abstract_address(&address, name, length);
    if (size < 0) return size;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | (timeout_ns == 0 ? SOCK_NONBLOCK : 0), 0);
    if (fd < 0) return -errno;
    // A listener whose backlog is full makes connect(2) wait for room; the
    // kernel bounds that wait by SO_SNDTIMEO (unix_stream_connect), set here
    // to what is left of the timeout before each try (EINTR tries again).
    int64_t deadline = timeout_ns > 0 ? monotonic_ns() + timeout_ns : 0;
    int rc;
    for (;;) {
        if (timeout_ns > 0) {
            int64_t left = deadline - monotonic_ns();
            if (left <= 0) {
                rc = -1;
                errno = EAGAIN;
                break;
            }
            // Rounded up, and never zero: a zero SO_SNDTIMEO means no limit.
            int64_t micros = (left + 999) / 1000;
            struct timeval limit = {.tv_sec = (time_t)(micros / 1000000), .tv_usec = (suseconds_t)(micros % 1000000)};
            if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit) < 0) {
                rc = -1;
                break;
            }
        }
        rc = connect(fd, (struct sockaddr *)&address, (socklen_t)size);
        if (rc == 0 || errno != EINTR) break;
    }
    if (rc == 0 && timeout_ns > 0) {
        struct timeval none = {0, 0};
        if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none) < 0) rc = -1;
    }
    if (rc < 0 || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) {
        int error = errno;
        close(fd);
        return -error;
    }
    return fd;
}

int cshims_port_accept(int fd) {
    int conn;
    do {
        conn = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    } while (conn < 0 && errno == EINTR);
    return conn < 0 ? -errno : conn;
}

int cshims_port_socketpair(int fds[2]) {
    return socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) < 0 ? -errno : 0;
}

int cshims_port_peer_credentials(int fd, int32_t *pid, uint32_t *uid, uint32_t *gid) {
    struct ucred credentials;
    socklen_t size = sizeof credentials;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &size) < 0) return -errno;
    *pid = credentials.pid;
    *uid = credentials.uid;
    *gid = credentials.gid;
    return 0;
}

ssize_t cshims_port_send(int fd, const void *bytes, size_t count, const int *fds, int fd_count) {
    if (fd_count < 0 || fd_count > CSHIMS_PORT_MAX_FDS) return -EINVAL;
    struct iovec vector = {.iov_base = (void *)bytes, .iov_len = count};
    struct msghdr message = {.msg_iov = &vector, .msg_iovlen = 1};
    union {
        char buffer[CMSG_SPACE(sizeof(int) * CSHIMS_PORT_MAX_FDS)];
        struct cmsghdr align;
    } control;
    if (fd_count > 0) {
        memset(&control, 0, sizeof control);
        message.msg_control = control.buffer;
        message.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)fd_count);
        struct cmsghdr *header = CMSG_FIRSTHDR(&message);
        header->cmsg_level = SOL_SOCKET;
        header->cmsg_type = SCM_RIGHTS;
        header->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)fd_count);
        memcpy(CMSG_DATA(header), fds, sizeof(int) * (size_t)fd_count);
    }
    ssize_t sent;
    do {
        sent = sendmsg(fd, &message, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    return sent < 0 ? -errno : sent;
}

ssize_t cshims_port_receive(int fd, void *buffer, size_t capacity, int *fds, int fd_capacity, int *fd_count,
                            int *truncated) {
    struct iovec vector = {.iov_base = buffer, .iov_len = capacity};
    union {
        char buffer[CMSG_SPACE(sizeof(int) * CSHIMS_PORT_MAX_FDS)];
        struct cmsghdr align;
    } control;
    struct msghdr message = {
        .msg_iov = &vector, .msg_iovlen = 1, .msg_control = control.buffer, .msg_controllen = sizeof control.buffer};
    ssize_t got;
    do {
        got = recvmsg(fd, &message, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    } while (got < 0 && errno == EINTR);
    *fd_count = 0;
    *truncated = 0;
    if (got < 0) return -errno;
    for (struct cmsghdr *header = CMSG_FIRSTHDR(&message); header != NULL; header = CMSG_NXTHDR(&message, header)) {
        if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
        size_t n = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const unsigned char *data = CMSG_DATA(header);
        for (size_t i = 0; i < n; i++) {
            int received;
            memcpy(&received, data + i * sizeof(int), sizeof(int));
            if (*fd_count < fd_capacity) {
                fds[(*fd_count)++] = received;
            } else {
                close(received);
                *truncated |= 2;
            }
        }
    }
    if (message.msg_flags & MSG_TRUNC) *truncated |= 1;
    if (message.msg_flags & MSG_CTRUNC) *truncated |= 2;
    return got;
}

int cshims_port_poll(int fd, int events, int64_t timeout_ns) {
    struct pollfd entry = {.fd = fd, .events = (short)(((events & 1) ? POLLIN : 0) | ((events & 2) ? POLLOUT : 0))};
    struct timespec timeout;
    if (timeout_ns >= 0) {
        timeout.tv_sec = (time_t)(timeout_ns / 1000000000);
        timeout.tv_nsec = (long)(timeout_ns % 1000000000);
    }
    int rc = ppoll(&entry, 1, timeout_ns >= 0 ? &timeout : NULL, NULL);
    if (rc < 0) return errno == EINTR ? 0 : -errno;
    return rc > 0 ? 1 : 0;
}

int cshims_port_sealed_memfd(const void *bytes, size_t count) {
    int fd = memfd_create("spindle.port", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return -errno;
    const char *p = bytes;
    size_t left = count;
    while (left > 0) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int error = errno;
            close(fd);
            return -error;
        }
        p += n;
        left -= (size_t)n;
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        int error = errno;
        close(fd);
        return -error;
    }
    return fd;
}

int cshims_port_read_sealed_memfd(int fd, void *buffer, size_t count) {
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0) return -errno;
    if ((seals & (F_SEAL_WRITE | F_SEAL_SHRINK)) != (F_SEAL_WRITE | F_SEAL_SHRINK)) return -EBADMSG;
    struct stat status;
    if (fstat(fd, &status) < 0) return -errno;
    if (status.st_size < 0 || (size_t)status.st_size != count) return -EBADMSG;
    char *p = buffer;
    size_t done = 0;
    while (done < count) {
        ssize_t n = pread(fd, p + done, count - done, (off_t)done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -errno;
        if (n == 0) return -EBADMSG;
        done += (size_t)n;
    }
    return 0;
}

int cshims_port_ring_create(size_t bytes, void **map) {
    int fd = memfd_create("spindle.port.ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return -errno;
    int error = 0;
    if (ftruncate(fd, (off_t)bytes) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        error = errno;
    } else {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            error = errno;
        } else {
            *map = p;
            return fd;
        }
    }
    close(fd);
    return -error;
}

int cshims_port_ring_map(int fd, size_t bytes, void **map) {
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0) return errno == EINVAL ? -EBADMSG : -errno;
    if ((seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) return -EBADMSG;
    struct stat status;
    if (fstat(fd, &status) < 0) return -errno;
    if (status.st_size < 0 || (size_t)status.st_size != bytes) return -EBADMSG;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return -errno;
    *map = p;
    return 0;
}

void cshims_port_ring_unmap(void *map, size_t bytes) {
    munmap(map, bytes);
}

int cshims_port_duplicate(int fd) {
    int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    return copy < 0 ? -errno : copy;
}

int cshims_port_shutdown(int fd) {
    return shutdown(fd, SHUT_RDWR) < 0 ? -errno : 0;
}

static int ipv4_address(struct sockaddr_in *address, const char *host, uint16_t port) {
    memset(address, 0, sizeof *address);
    address->sin_family = AF_INET;
    address->sin_port = htons(port);
    return inet_pton(AF_INET, host, &address->sin_addr) == 1 ? 0 : -EINVAL;
}

int cshims_port_tcp_listen(const char *host, uint16_t port, int backlog, uint16_t *bound_port) {
    struct sockaddr_in address;
    if (ipv4_address(&address, host, port) < 0) return -EINVAL;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    int one = 1;
    socklen_t size = sizeof address;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0
        || bind(fd, (struct sockaddr *)&address, sizeof address) < 0 || listen(fd, backlog) < 0
        || getsockname(fd, (struct sockaddr *)&address, &size) < 0) {
        int error = errno;
        close(fd);
        return -error;
    }
    *bound_port = ntohs(address.sin_port);
    return fd;
}

int cshims_port_tcp_connect(const char *host, uint16_t port, int64_t timeout_ns) {
    struct sockaddr_in address;
    if (ipv4_address(&address, host, port) < 0) return -EINVAL;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&address, sizeof address) < 0) {
        if (errno != EINPROGRESS && errno != EINTR) {
            int error = errno;
            close(fd);
            return -error;
        }
        if (cshims_port_poll(fd, 2, timeout_ns) != 1) {
            close(fd);
            return -ETIMEDOUT;
        }
        int error = 0;
        socklen_t size = sizeof error;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) < 0) error = errno;
        if (error != 0) {
            close(fd);
            return -error;
        }
    }
    return fd;
}

int cshims_port_tcp_nodelay(int fd) {
    int one = 1;
    return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0 ? -errno : 0;
}

ssize_t cshims_port_stream_send(int fd, const void *bytes, size_t count) {
    ssize_t sent;
    do {
        sent = send(fd, bytes, count, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    return sent < 0 ? -errno : sent;
}

ssize_t cshims_port_stream_sendv(int fd, const void *const *bases, const size_t *lengths, int count) {
    struct iovec iov[CSHIMS_PORT_MAX_IOV];
    if (count > CSHIMS_PORT_MAX_IOV) count = CSHIMS_PORT_MAX_IOV;
    for (int i = 0; i < count; i++) {
        iov[i].iov_base = (void *)bases[i];
        iov[i].iov_len = lengths[i];
    }
    struct msghdr message = {0};
    message.msg_iov = iov;
    message.msg_iovlen = (size_t)count;
    ssize_t sent;
    do {
        sent = sendmsg(fd, &message, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    return sent < 0 ? -errno : sent;
}

ssize_t cshims_port_stream_receive(int fd, void *buffer, size_t capacity) {
    ssize_t got;
    do {
        got = recv(fd, buffer, capacity, MSG_DONTWAIT);
    } while (got < 0 && errno == EINTR);
    return got < 0 ? -errno : got;
}

int cshims_port_enter_network_namespace(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int rc = setns(fd, CLONE_NEWNET);
    int error = errno;
    close(fd);
    return rc < 0 ? -error : 0;
}

int cshims_port_close(int fd) {
    return close(fd) < 0 && errno != EINTR ? -errno : 0;
}

uint32_t cshims_port_effective_uid(void) {
    return (uint32_t)geteuid();
}
