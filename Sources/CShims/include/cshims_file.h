// Files, for DistributedLock: thin wrappers that read errno in C. Each
// returns 0 (or a count, or a descriptor) on success and -errno on failure;
// EINTR is retried here, so it never reaches Swift.
#ifndef CSHIMS_FILE_H
#define CSHIMS_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

// open(2) with O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC: a new
// file that did not exist. Returns the descriptor.
int cshims_file_create_exclusive(const char *path, uint32_t permissions);

// write(2) until all `count` bytes are written (partial writes continue).
int cshims_file_write_all(int fd, const void *bytes, size_t count);

// fsync(2).
int cshims_file_sync(int fd);

// close(2). Linux frees the descriptor even when close reports EINTR, so
// that is not retried (a retry could close a descriptor another thread just
// opened) and counts as success.
int cshims_file_close(int fd);

// link(2) and unlink(2).
int cshims_file_link(const char *existing, const char *new_path);
int cshims_file_unlink(const char *path);

// lstat(2): the file's type (the S_IFMT bits of st_mode) and link count.
int cshims_file_lstat(const char *path, uint32_t *type, uint64_t *links);

// Reads up to `capacity` bytes of the regular file at `path`, never following
// a symbolic link and never blocking on a FIFO or device: lstat(2) first,
// then, for a regular file only, open(2) with O_RDONLY | O_NOFOLLOW |
// O_NONBLOCK | O_NOCTTY | O_CLOEXEC, fstat(2) (the file may have been
// swapped meanwhile) and read(2) to end of file or `capacity`. `*type` is
// set to the S_IFMT bits of what is at `path`; for anything but a regular
// file nothing is opened and 0 is returned. Returns the byte count read, or
// -errno (-ENOENT: nothing at `path`).
ssize_t cshims_file_read_regular(const char *path, void *buffer, size_t capacity, uint32_t *type);

// The wall clock (clock_gettime(2) CLOCK_REALTIME, served by the vDSO):
// seconds and nanoseconds since 1970-01-01 00:00:00 UTC. Cannot fail.
void cshims_realtime_now(int64_t *seconds, int32_t *nanoseconds);

// kill(2) with signal 0: 0 if process `pid` exists, -ESRCH if it does not,
// -EPERM if it exists but belongs to someone we may not signal.
int cshims_process_probe(int32_t pid);

// The S_IFMT values, for Swift (which does not import the macros).
enum {
    CSHIMS_FILE_TYPE_MASK = 0170000,
    CSHIMS_FILE_REGULAR = 0100000,
    CSHIMS_FILE_DIRECTORY = 0040000,
    CSHIMS_FILE_SYMLINK = 0120000,
    CSHIMS_FILE_FIFO = 0010000,
    CSHIMS_FILE_SOCKET = 0140000,
    CSHIMS_FILE_CHARACTER_DEVICE = 0020000,
    CSHIMS_FILE_BLOCK_DEVICE = 0060000,
};

#endif // CSHIMS_FILE_H
