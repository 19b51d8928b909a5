#if canImport(Glibc)
import Glibc
#endif

/// A lock named by a path on a file system that several processes, and hosts,
/// share: Spindle's `NSDistributedLock`.
///
/// Like the original it never blocks: `tryLock()` answers at once and the
/// caller decides whether and how often to retry. The lock is a file at
/// `path` holding a record of its owner (host name, process id, the process's
/// start time, the time it was taken). It is created atomically with its
/// record: the record is written to a uniquely named file beside `path`, then
/// hard-linked to `path` with `link(2)`, which fails if `path` exists and is
/// atomic on local file systems and on NFS (where a lost reply is detected by
/// checking the link count, the classic NFS-safe recipe).
///
/// A lock outlives a process that dies holding it; `isHeldByDeadProcess`
/// tells whether the holder ran on this host and is gone (its pid is free, or
/// now belongs to a process that started later), and `breakLock()` removes
/// the lock. Symbolic links are never followed: a symlink at `path` is
/// treated as someone else's lock and never read or removed through.
///
/// Errors: a missing directory, a read-only file system or a permission
/// problem throw specific `DistributedLock.Error`s. Memory ordering between
/// processes comes from the file system, not from this object. One
/// `DistributedLock` value is for one thread at a time.
public final class DistributedLock: @unchecked Sendable {
    // @unchecked: the mutable state (`ownedToken`) is documented as
    // single-thread; the lock itself is the file system's.

    /// Why a distributed-lock operation failed.
    public enum Error: Swift.Error, Sendable, Hashable, CustomStringConvertible {
        /// The directory that would hold the lock does not exist.
        case directoryMissing(path: String)
        /// The file system holding the lock is mounted read-only.
        case readOnlyFileSystem(path: String)
        /// The caller may not create or remove files there.
        case permissionDenied(path: String)
        /// `unlock()` by an object that does not hold the lock.
        case notOwner(path: String)
        /// Another system call failed.
        case system(SystemCallError, path: String)

        public var description: String {
            switch self {
            case .directoryMissing(let p): "DistributedLock: the directory of \(p) does not exist"
            case .readOnlyFileSystem(let p): "DistributedLock: \(p) is on a read-only file system"
            case .permissionDenied(let p): "DistributedLock: permission denied for \(p)"
            case .notOwner(let p): "DistributedLock: \(p) is not held by this lock object"
            case .system(let e, let p): "DistributedLock: \(e) (for \(p))"
            }
        }
    }

    /// Who holds a lock, as recorded in its file.
    public struct Owner: Sendable, Hashable {
        /// The holder's host name.
        public var host: String
        /// The holder's process id on that host.
        public var pid: Int32
        /// The holder process's start time in clock ticks since boot
        /// (`/proc/<pid>/stat`, field 22): with `pid`, identifies the process
        /// even after its pid is reused.
        public var processStart: UInt64
        /// When the lock was taken, in seconds since 1970.
        public var lockedAt: Double
    }

    /// The lock's path.
    public let path: String
    /// The random token written into the lock file while this object holds
    /// it. (An inode number would not do: after a `breakLock` the next lock
    /// file often gets the freed inode back.)
    private var ownedToken: UInt64?

    /// A lock at `path`. Nothing touches the file system until `tryLock()`.
    public init(path: String) {
        self.path = path
    }

    /// Takes the lock if nobody holds it. Never blocks (beyond the file
    /// system's own I/O). Returns false when it is held — by another process,
    /// or already by this object. Throws for a missing directory, a read-only
    /// file system or a permission problem.
    public func tryLock() throws(Error) -> Bool {
        if ownedToken != nil { return false }
        let record = Self.currentRecord()
        let token = UInt64.random(in: 1...UInt64.max)
        let temp = "\(path).\(record.host).\(record.pid).\(UInt32.random(in: 0...UInt32.max)).tmp"
        let fd = open(temp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o644)
        if fd < 0 { throw classify(errno, call: "open") }
        defer { unlink(temp) }
        let text = Self.encode(record) + "token=\(token)\n"
        let written = text.withCString { write(fd, $0, strlen($0)) }
        let writeErrno = errno
        let syncOK = fsync(fd) == 0
        close(fd)
        if written < 0 || !syncOK { throw classify(writeErrno, call: "write") }

        let linked = link(temp, path) == 0
        let linkErrno = errno
        // Whatever link() said, the link count of our file is the truth
        // (NFS can report failure for a link that happened).
        var st = stat()
        guard lstat(temp, &st) == 0 else { throw classify(errno, call: "lstat") }
        if st.st_nlink == 2 {
            ownedToken = token
            return true
        }
        if linked { return false }  // cannot happen on a sane file system
        switch linkErrno {
        case EEXIST: return false
        default: throw classify(linkErrno, call: "link")
        }
    }

    /// Releases the lock. Throws `.notOwner` if this object does not hold it
    /// (including when someone broke the lock and another process took it).
    public func unlock() throws(Error) {
        guard let token = ownedToken else { throw .notOwner(path: path) }
        ownedToken = nil
        // Check the token, then remove. Between the two another process could
        // break the lock and take it (the window every file-based lock has);
        // breakLock is for holders known to be dead, which closes it in
        // practice.
        guard let text = readRecord(), Self.token(in: text) == token else { throw .notOwner(path: path) }
        if unlink(path) != 0 && errno != ENOENT { throw classify(errno, call: "unlink") }
    }

    /// Removes the lock whoever holds it, so that a `tryLock()` can succeed.
    /// Only for a lock whose holder is known to be gone (see
    /// `isHeldByDeadProcess`); breaking a live holder's lock lets two
    /// processes into the critical section. A lock that is not held is fine.
    public func breakLock() throws(Error) {
        ownedToken = nil
        if unlink(path) != 0 && errno != ENOENT { throw classify(errno, call: "unlink") }
    }

    /// The holder's record, or nil if the lock is not held (or its file is
    /// not a regular file with a readable record).
    public var owner: Owner? {
        readRecord().flatMap(Self.decode)
    }

    /// The lock file's text, read without following a symlink.
    private func readRecord() -> String? {
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        if fd < 0 { return nil }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 1024)
        let n = read(fd, &buffer, buffer.count - 1)
        guard n > 0 else { return nil }
        return String(decoding: buffer[0..<n], as: UTF8.self)
    }

    /// When the lock was taken, or nil if it is not held.
    public var lockDate: Double? { owner?.lockedAt }

    /// Whether this object holds the lock.
    public var isHeldByMe: Bool { ownedToken != nil }

    /// `true` if the lock is held by a process on this host that no longer
    /// exists (its pid is gone, or was reused by a process that started
    /// later); `false` if the holder is alive; `nil` if the lock is not held,
    /// its record is unreadable, or the holder is on another host (its
    /// liveness cannot be checked from here).
    public var isHeldByDeadProcess: Bool? {
        guard let owner else { return nil }
        guard owner.host == Self.hostName else { return nil }
        if kill(owner.pid, 0) != 0 && errno == ESRCH { return true }
        guard let start = Self.processStart(owner.pid) else { return true }
        return start != owner.processStart
    }

    // MARK: Helpers

    private func classify(_ code: Int32, call: String) -> Error {
        switch code {
        case ENOENT, ENOTDIR: .directoryMissing(path: path)
        case EROFS: .readOnlyFileSystem(path: path)
        case EACCES, EPERM: .permissionDenied(path: path)
        default: .system(SystemCallError(call: call, code: code), path: path)
        }
    }

    static var hostName: String {
        var buffer = [CChar](repeating: 0, count: 256)
        guard gethostname(&buffer, buffer.count - 1) == 0 else { return "unknown-host" }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Field 22 of /proc/<pid>/stat (start time in clock ticks since boot).
    static func processStart(_ pid: Int32) -> UInt64? {
        let fd = open("/proc/\(pid)/stat", O_RDONLY | O_CLOEXEC)
        if fd < 0 { return nil }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 1024)
        let n = read(fd, &buffer, buffer.count)
        guard n > 0 else { return nil }
        let text = String(decoding: buffer[0..<n], as: UTF8.self)
        // The command name (field 2) is in parentheses and may hold spaces:
        // count fields after its closing parenthesis (field 3 onwards).
        guard let close = text.lastIndex(of: ")") else { return nil }
        let fields = text[text.index(after: close)...].split(separator: " ")
        guard fields.count > 19 else { return nil }
        return UInt64(fields[19])
    }

    static func currentRecord() -> Owner {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return Owner(
            host: hostName, pid: getpid(), processStart: processStart(getpid()) ?? 0,
            lockedAt: Double(now.tv_sec) + Double(now.tv_nsec) / 1e9)
    }

    static func encode(_ o: Owner) -> String {
        "host=\(o.host)\npid=\(o.pid)\nstart=\(o.processStart)\nlocked=\(o.lockedAt)\n"
    }

    static func token(in text: String) -> UInt64? {
        for line in text.split(separator: "\n") where line.hasPrefix("token=") {
            return UInt64(line.dropFirst(6))
        }
        return nil
    }

    static func decode(_ text: String) -> Owner? {
        var fields: [Substring: Substring] = [:]
        for line in text.split(separator: "\n") {
            guard let eq = line.firstIndex(of: "=") else { continue }
            fields[line[..<eq]] = line[line.index(after: eq)...]
        }
        guard let host = fields["host"], let pid = fields["pid"].flatMap({ Int32($0) }),
            let start = fields["start"].flatMap({ UInt64($0) }),
            let locked = fields["locked"].flatMap({ Double($0) })
        else { return nil }
        return Owner(host: String(host), pid: pid, processStart: start, lockedAt: locked)
    }
}
