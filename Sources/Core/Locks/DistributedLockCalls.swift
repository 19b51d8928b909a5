import CShims

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// `DistributedLock`'s system calls, and the one place where their errno
/// values are sorted into what Spindle does about them. The C shims read
/// errno and return it negated, so no errno is read in Swift (a stale one
/// cannot be reported):
/// - retry: EINTR (the shims retry it themselves);
/// - expected answers, returned as values: EEXIST from the exclusive create
///   and from `link`, ENOENT where "nothing there" is an answer;
/// - throw: the environment said no (a missing directory, a read-only file
///   system, a permission, a name too long, a symbolic link where a lock file
///   should be, I/O, space and descriptor limits);
/// - stop with a message naming the call: EFAULT, EBADF, EINVAL (a bug in
///   Spindle: its arguments are built here).
enum DistributedLockCalls {
    /// Sorts a failed call's errno (positive) into an error or a stop.
    static func failure(_ code: Int32, call: String, path: String) -> DistributedLock.Error {
        switch code {
        case ENOENT, ENOTDIR: return .directoryMissing(path: path)
        case EROFS: return .readOnlyFileSystem(path: path)
        case EACCES, EPERM: return .permissionDenied(path: path)
        case ENAMETOOLONG: return .nameTooLong(path: path)
        case ELOOP: return .symbolicLink(path: path)
        case EFAULT, EBADF, EINVAL:
            misuse("\(call) failed unexpectedly for \(path): \(errnoDescription(code))")
        default:
            return .system(SystemCallError(call: call, code: code), path: path)
        }
    }

    /// What is at a path, by its `lstat` type bits.
    static func fileType(_ type: UInt32) -> DistributedLock.FileType {
        switch type {
        case UInt32(CSHIMS_FILE_REGULAR): .regularFile
        case UInt32(CSHIMS_FILE_DIRECTORY): .directory
        case UInt32(CSHIMS_FILE_SYMLINK): .symbolicLink
        case UInt32(CSHIMS_FILE_FIFO): .fifo
        case UInt32(CSHIMS_FILE_SOCKET): .socket
        case UInt32(CSHIMS_FILE_CHARACTER_DEVICE): .characterDevice
        case UInt32(CSHIMS_FILE_BLOCK_DEVICE): .blockDevice
        default: .other
        }
    }

    /// The error for something other than a lock file at `path`.
    static func notALockFile(_ type: DistributedLock.FileType, path: String) -> DistributedLock.Error {
        type == .symbolicLink ? .symbolicLink(path: path) : .notARegularFile(path: path, type: type)
    }

    /// A new file at `path` for writing, or nil if something is there already.
    static func createExclusive(_ path: String, reportingFor lockPath: String) throws(DistributedLock.Error) -> Int32? {
        let fd = cshims_file_create_exclusive(path, 0o644)
        if fd == -EEXIST { return nil }
        if fd < 0 { throw failure(-fd, call: "open", path: lockPath) }
        return fd
    }

    /// Writes all of `text`, makes it durable, and closes `fd` (also when a
    /// step fails).
    static func writeSyncAndClose(_ fd: Int32, _ text: String, reportingFor lockPath: String) throws(DistributedLock.Error) {
        let bytes = Array(text.utf8)
        var rc = bytes.withUnsafeBytes { cshims_file_write_all(fd, $0.baseAddress, $0.count) }
        var call = "write"
        if rc == 0 {
            rc = cshims_file_sync(fd)
            call = "fsync"
        }
        let closed = cshims_file_close(fd)
        if rc < 0 { throw failure(-rc, call: call, path: lockPath) }
        if closed < 0 { throw failure(-closed, call: "close", path: lockPath) }
    }

    /// `link(existing, newPath)`: true if linked, false if `newPath` exists.
    static func link(_ existing: String, _ newPath: String) throws(DistributedLock.Error) -> Bool {
        let rc = cshims_file_link(existing, newPath)
        if rc == 0 { return true }
        if rc == -EEXIST { return false }
        throw failure(-rc, call: "link", path: newPath)
    }

    /// Removes `path`: true if removed, false if nothing was there.
    @discardableResult
    static func unlink(_ path: String, reportingFor lockPath: String) throws(DistributedLock.Error) -> Bool {
        let rc = cshims_file_unlink(path)
        if rc == 0 { return true }
        if rc == -ENOENT { return false }
        throw failure(-rc, call: "unlink", path: lockPath)
    }

    /// What is at `path` and its link count, not following a symbolic link;
    /// nil if nothing is there.
    static func status(_ path: String, reportingFor lockPath: String) throws(DistributedLock.Error)
        -> (type: DistributedLock.FileType, links: UInt64)?
    {
        var type: UInt32 = 0
        var links: UInt64 = 0
        let rc = cshims_file_lstat(path, &type, &links)
        if rc == -ENOENT { return nil }
        if rc < 0 { throw failure(-rc, call: "lstat", path: lockPath) }
        return (fileType(type), links)
    }

    /// What reading a path found.
    enum Contents {
        case missing
        case notRegular(DistributedLock.FileType)
        case bytes([UInt8])
    }

    /// Up to `capacity` bytes of the regular file at `path`, never following
    /// a symbolic link and never blocking on a FIFO or device.
    static func readRegular(_ path: String, capacity: Int = 1024) throws(DistributedLock.Error) -> Contents {
        var buffer = [UInt8](repeating: 0, count: capacity)
        var type: UInt32 = 0
        let n = buffer.withUnsafeMutableBytes { cshims_file_read_regular(path, $0.baseAddress, $0.count, &type) }
        if n == -Int(ENOENT) { return .missing }
        if n < 0 { throw failure(Int32(-n), call: "read", path: path) }
        let kind = fileType(type)
        if kind != .regularFile { return .notRegular(kind) }
        return .bytes(Array(buffer[0..<n]))
    }

    /// Whether process `pid` exists on this host (`kill(pid, 0)`): EPERM
    /// means it exists and belongs to another user.
    static func processExists(_ pid: Int32) -> Bool {
        cshims_process_probe(pid) != -ESRCH
    }
}
