// File calls for DistributedLock; see cshims_file.h.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cshims_file.h"

_Static_assert(CSHIMS_FILE_TYPE_MASK == S_IFMT, "S_IFMT");
_Static_assert(CSHIMS_FILE_REGULAR == S_IFREG, "S_IFREG");
_Static_assert(CSHIMS_FILE_DIRECTORY == S_IFDIR, "S_IFDIR");
_Static_assert(CSHIMS_FILE_SYMLINK == S_IFLNK, "S_IFLNK");
_Static_assert(CSHIMS_FILE_FIFO == S_IFIFO, "S_IFIFO");
_Static_assert(CSHIMS_FILE_SOCKET == S_IFSOCK, "S_IFSOCK");
_Static_assert(CSHIMS_FILE_CHARACTER_DEVICE == S_IFCHR, "S_IFCHR");
_Static_assert(CSHIMS_FILE_BLOCK_DEVICE == S_IFBLK, "S_IFBLK");

int cshims_file_create_exclusive(const char *path, uint32_t permissions) {
    int fd;
    do {
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, (mode_t)permissions);
    } while (fd < 0 && errno == EINTR);
    return fd < 0 ? -errno : fd;
}

int cshims_file_write_all(int fd, const void *bytes, size_t count) {
    const char *p = bytes;
    while (count > 0) {
        ssize_t n = write(fd, p, count);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        p += n;
        count -= (size_t)n;
    }
    return 0;
}

int cshims_file_sync(int fd) {
    int rc;
    do { rc = fsync(fd); } while (rc != 0 && errno == EINTR);
    return rc != 0 ? -errno : 0;
}

int cshims_file_close(int fd) {
    if (close(fd) != 0 && errno != EINTR) return -errno;
    return 0;
}

int cshims_file_link(const char *existing, const char *new_path) {
    return link(existing, new_path) != 0 ? -errno : 0;
}

int cshims_file_unlink(const char *path) {
    return unlink(path) != 0 ? -errno : 0;
}

int cshims_file_lstat(const char *path, uint32_t *type, uint64_t *links) {
    struct stat st;
    if (lstat(path, &st) != 0) return -errno;
    *type = (uint32_t)(st.st_mode & S_IFMT);
    *links = (uint64_t)st.st_nlink;
    return 0;
}

ssize_t cshims_file_read_regular(const char *path, void *buffer, size_t capacity, uint32_t *type) {
    struct stat st;
    if (lstat(path, &st) != 0) return -errno;
    *type = (uint32_t)(st.st_mode & S_IFMT);
    if (!S_ISREG(st.st_mode)) return 0;
    int fd;
    do {
        fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return -errno;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    *type = (uint32_t)(st.st_mode & S_IFMT);
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return 0;
    }
    size_t total = 0;
    char *p = buffer;
    while (total < capacity) {
        ssize_t n = read(fd, p + total, capacity - total);
        if (n < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            return -e;
        }
        if (n == 0) break;
        total += (size_t)n;
    }
    close(fd);
    return (ssize_t)total;
}

int cshims_process_probe(int32_t pid) {
    return kill((pid_t)pid, 0) != 0 ? -errno : 0;
}

void cshims_realtime_now(int64_t *seconds, int32_t *nanoseconds) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    *seconds = (int64_t)now.tv_sec;
    *nanoseconds = (int32_t)now.tv_nsec;
}
