#if canImport(Glibc)
import Glibc
#endif

/// A lock named by a path on a file system that several processes, and hosts,
/// share: Spindle's `NSDistributedLock`.
///
/// `tryLock()` answers at once, as the original does; `lock(before:)` retries
/// it with a growing, randomized pause until it succeeds or the deadline
/// passes. The lock is a file at `path` holding a record of its owner (host
/// name, process id, the process's start time, the wall-clock time it was
/// taken). It is created atomically with its record: the record is written
/// and synced to a uniquely named file in the same directory (a short name,
/// so any lock name up to `NAME_MAX` works), then hard-linked to `path` with
/// `link(2)`, which fails if `path` exists and is atomic on local file
/// systems and on NFS (where a lost reply is detected by checking the link
/// count, the classic NFS-safe recipe).
///
/// A lock outlives a process that dies holding it; `isHeldByDeadProcess`
/// tells whether the holder ran on this host and is gone (its pid is free, or
/// now belongs to a process that started later), and `breakLock()` removes
/// the lock.
///
/// Nothing at `path` is ever followed or waited on: the lock file is read
/// only if it is a regular file (`lstat`, then `open` with `O_NOFOLLOW |
/// O_NONBLOCK`, then `fstat`), so a FIFO, device, directory or symbolic link
/// planted there cannot hang or redirect an inspection. `tryLock()` and
/// `unlock()` report such a thing with `.symbolicLink` or `.notARegularFile`;
/// the non-throwing `owner`, `lockDate` and `isHeldByDeadProcess` say nil
/// (`currentOwner()` throws the reason).
///
/// Errors: a missing directory, a read-only file system, a permission
/// problem or a name too long throw specific `DistributedLock.Error`s; a
/// failed call of another kind throws `.system` with the errno the call
/// reported. Memory ordering between processes comes from the file system,
/// not from this object. One `DistributedLock` object is for one thread at a
/// time.
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
        /// The lock's file name is longer than the file system allows
        /// (`ENAMETOOLONG`; `NAME_MAX`, 255 bytes, on Linux file systems).
        case nameTooLong(path: String)
        /// A symbolic link is at the lock's path: someone other than a
        /// `DistributedLock` put it there. It is never followed; only
        /// `breakLock()` removes it (the link, not its target).
        case symbolicLink(path: String)
        /// Something other than a lock file (a directory, a FIFO, a device…)
        /// is at the lock's path. It is never opened or waited on; only
        /// `breakLock()` removes it, and never a directory.
        case notARegularFile(path: String, type: FileType)
        /// Another system call failed.
        case system(SystemCallError, path: String)

        /// The error in words, naming the path. Never blocks.
        public var description: String {
            switch self {
            case .directoryMissing(let p): "DistributedLock: the directory of \(p) does not exist"
            case .readOnlyFileSystem(let p): "DistributedLock: \(p) is on a read-only file system"
            case .permissionDenied(let p): "DistributedLock: permission denied for \(p)"
            case .notOwner(let p): "DistributedLock: \(p) is not held by this lock object"
            case .nameTooLong(let p): "DistributedLock: the name \(p) is too long for its file system"
            case .symbolicLink(let p): "DistributedLock: \(p) is a symbolic link, not a lock file; it is left alone"
            case .notARegularFile(let p, let type):
                "DistributedLock: \(p) is a \(type), not a lock file; it is left alone"
            case .system(let e, let p): "DistributedLock: \(e) (for \(p))"
            }
        }
    }

    /// What kind of file is at a path (`lstat(2)`'s file type).
    public enum FileType: Sendable, Hashable, CustomStringConvertible {
        /// A regular file: what a lock file is.
        case regularFile
        /// A directory.
        case directory
        /// A symbolic link (never followed).
        case symbolicLink
        /// A named pipe (`mkfifo`), never opened: opening one to read waits
        /// for a writer.
        case fifo
        /// A Unix-domain socket.
        case socket
        /// A character device.
        case characterDevice
        /// A block device.
        case blockDevice
        /// A type `lstat` reports that none of the above covers.
        case other

        /// The type in words, e.g. `"FIFO"`. Never blocks.
        public var description: String {
            switch self {
            case .regularFile: "regular file"
            case .directory: "directory"
            case .symbolicLink: "symbolic link"
            case .fifo: "FIFO"
            case .socket: "socket"
            case .characterDevice: "character device"
            case .blockDevice: "block device"
            case .other: "file of unknown type"
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
        /// When the lock was taken, on the holder's wall clock.
        public var lockedAt: WallClock.Instant
    }

    /// The lock's path.
    public let path: String
    /// The random token written into the lock file while this object holds
    /// it. (An inode number would not do: after a `breakLock` the next lock
    /// file often gets the freed inode back.)
    private var ownedToken: UInt64?

    /// The first pause of `lock(before:)` between attempts, and the longest.
    /// An attempt costs several file-system calls and an `fsync`, so pausing
    /// less than a millisecond would mostly spend the time in the file
    /// system; the pause doubles up to 100 ms, which bounds how late a waiter
    /// notices that the lock was released.
    static let firstPause: Duration = .milliseconds(1)
    static let longestPause: Duration = .milliseconds(100)

    /// A lock at `path`. Nothing touches the file system until `tryLock()`.
    public init(path: String) {
        self.path = path
    }

    /// Takes the lock if nobody holds it. Never waits for the lock (only for
    /// the file system's own I/O, including an `fsync`). Returns false when
    /// it is held: by another process, or already by this object. Throws for
    /// a missing directory, a read-only file system, a permission problem, a
    /// name too long, and for a symbolic link or anything but a regular file
    /// at `path` (never taken for a holder).
    public func tryLock() throws(Error) -> Bool {
        if ownedToken != nil { return false }
        let record = Self.currentRecord()
        let token = UInt64.random(in: 1...UInt64.max)
        // A short temporary name beside the lock (at most 44 bytes, whatever
        // the lock's name), unique by its random part; an exclusive create
        // makes sure of it.
        let directory = path.lastIndex(of: "/").map { String(path[...$0]) } ?? ""
        var temp: String
        var fd: Int32
        repeat {
            temp = directory + ".spindle-lock-\(String(UInt64.random(in: 0...UInt64.max), radix: 16))-"
                + "\(String(record.pid, radix: 16)).tmp"
            guard let created = try DistributedLockCalls.createExclusive(temp, reportingFor: path) else { continue }
            fd = created
            break
        } while true
        defer { _ = try? DistributedLockCalls.unlink(temp, reportingFor: path) }
        try DistributedLockCalls.writeSyncAndClose(fd, Self.encode(record) + "token=\(token)\n", reportingFor: path)

        let linked = try DistributedLockCalls.link(temp, path)
        // Whatever link() said, the link count of our file is the truth
        // (NFS can report failure for a link that happened).
        if let status = try DistributedLockCalls.status(temp, reportingFor: path), status.links == 2 {
            ownedToken = token
            return true
        }
        if linked { return false }  // cannot happen on a sane file system
        // Something is at `path`: a holder's lock file, or something planted.
        guard let status = try DistributedLockCalls.status(path, reportingFor: path) else {
            return false  // released meanwhile; the caller may try again
        }
        if status.type != .regularFile { throw DistributedLockCalls.notALockFile(status.type, path: path) }
        return false
    }

    /// Takes the lock, retrying `tryLock()` with pauses that start at 1 ms
    /// and double up to 100 ms (each a random half to all of that, so that
    /// waiters do not retry in step), until it succeeds (true) or `deadline`
    /// on the monotonic clock passes (false). Blocks: the pauses sleep on a
    /// futex. A deadline already past makes this `tryLock()`;
    /// `.distantFuture` waits forever. Throws what `tryLock()` throws.
    /// Misuse: calling it on an object that already holds the lock stops
    /// the process with a message (it would wait for itself).
    @available(*, noasync, message: "sleeps between tries; in async code try with `tryLock()` between `Task.sleep`s, or lock on a pool worker")
    public func lock(before deadline: MonotonicClock.Instant) throws(Error) -> Bool {
        require(ownedToken == nil, "DistributedLock.lock(before:): this object already holds \(path)")
        var pause = Self.firstPause
        var sleepWord: UInt32 = 0
        while true {
            if try tryLock() { return true }
            let now = MonotonicClock.now
            if now >= deadline { return false }
            let wake = min(now.advanced(by: pause * Double.random(in: 0.5...1.0)), deadline)
            withUnsafeMutablePointer(to: &sleepWord) { word in
                // Nobody wakes this word: the wait is a sleep until `wake`.
                _ = Futex(word).wait(expecting: 0, until: wake)
            }
            pause = min(pause * 2, Self.longestPause)
        }
    }

    /// As `lock(before:)`, with a deadline `timeout` from now.
    @available(*, noasync, message: "sleeps between tries; in async code try with `tryLock()` between `Task.sleep`s, or lock on a pool worker")
    public func lock(timeout: Duration) throws(Error) -> Bool {
        try lock(before: MonotonicClock.now.advanced(by: timeout))
    }

    /// Releases the lock. Throws `.notOwner` if this object does not hold it
    /// (including when someone broke the lock and another process took it),
    /// and `.symbolicLink` or `.notARegularFile` if that is what is at `path`
    /// now (left alone). Never waits on what is at `path`.
    public func unlock() throws(Error) {
        guard let token = ownedToken else { throw .notOwner(path: path) }
        ownedToken = nil
        // Check the token, then remove. Between the two another process could
        // break the lock and take it (the window every file-based lock has);
        // breakLock is for holders known to be dead, which closes it in
        // practice.
        guard let text = try readRecord(), Self.token(in: text) == token else { throw .notOwner(path: path) }
        try DistributedLockCalls.unlink(path, reportingFor: path)
    }

    /// Removes the lock whoever holds it, so that a `tryLock()` can succeed.
    /// Only for a lock whose holder is known to be gone (see
    /// `isHeldByDeadProcess`); breaking a live holder's lock lets two
    /// processes into the critical section. A lock that is not held is fine.
    /// Whatever is at `path` is removed (a symbolic link itself, not its
    /// target), except a directory, which throws `.notARegularFile`.
    public func breakLock() throws(Error) {
        ownedToken = nil
        if let status = try DistributedLockCalls.status(path, reportingFor: path), status.type == .directory {
            throw .notARegularFile(path: path, type: .directory)
        }
        try DistributedLockCalls.unlink(path, reportingFor: path)
    }

    /// The holder's record, or nil if the lock is not held or its record is
    /// unreadable. Throws `.symbolicLink` or `.notARegularFile` for what is
    /// at `path` if it is not a lock file, and the file system's errors.
    /// Never waits on what is at `path`.
    public func currentOwner() throws(Error) -> Owner? {
        try readRecord().flatMap(Self.decode)
    }

    /// The holder's record, or nil if the lock is not held, its record is
    /// unreadable, or something other than a lock file is at `path` (see
    /// `currentOwner()` for the reason). Never waits on what is at `path`.
    public var owner: Owner? {
        (try? currentOwner()) ?? nil
    }

    /// The lock file's text, read without following a symbolic link or
    /// opening anything but a regular file; nil if nothing is at `path`.
    private func readRecord() throws(Error) -> String? {
        switch try DistributedLockCalls.readRegular(path) {
        case .missing: return nil
        case .notRegular(let type): throw DistributedLockCalls.notALockFile(type, path: path)
        case .bytes(let bytes): return String(decoding: bytes, as: UTF8.self)
        }
    }

    /// When the lock was taken, on the holder's wall clock; nil if it is not
    /// held or `owner` is nil. Never waits on what is at `path`.
    public var lockDate: WallClock.Instant? { owner?.lockedAt }

    /// Whether this object holds the lock.
    public var isHeldByMe: Bool { ownedToken != nil }

    /// `true` if the lock is held by a process on this host that no longer
    /// exists (its pid is gone, or was reused by a process that started
    /// later); `false` if the holder is alive; `nil` if the lock is not held,
    /// its record is unreadable, something other than a lock file is at
    /// `path`, or the holder is on another host (its liveness cannot be
    /// checked from here). Never waits on what is at `path`.
    public var isHeldByDeadProcess: Bool? {
        guard let owner else { return nil }
        guard owner.host == Self.hostName else { return nil }
        if !DistributedLockCalls.processExists(owner.pid) { return true }
        guard let start = Self.processStart(owner.pid) else { return true }
        return start != owner.processStart
    }

    // MARK: Helpers

    static var hostName: String {
        var buffer = [CChar](repeating: 0, count: 256)
        guard gethostname(&buffer, buffer.count - 1) == 0 else { return "unknown-host" }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Field 22 of /proc/<pid>/stat (start time in clock ticks since boot).
    static func processStart(_ pid: Int32) -> UInt64? {
        guard case .bytes(let bytes)? = try? DistributedLockCalls.readRegular("/proc/\(pid)/stat") else {
            return nil
        }
        let text = String(decoding: bytes, as: UTF8.self)
        // The command name (field 2) is in parentheses and may hold spaces:
        // count fields after its closing parenthesis (field 3 onwards).
        guard let close = text.lastIndex(of: ")") else { return nil }
        let fields = text[text.index(after: close)...].split(separator: " ")
        guard fields.count > 19 else { return nil }
        return UInt64(fields[19])
    }

    static func currentRecord() -> Owner {
        Owner(
            host: hostName, pid: getpid(), processStart: processStart(getpid()) ?? 0,
            lockedAt: WallClock.now)
    }

    /// The record's text. `locked=` is seconds since 1970 with nine decimals,
    /// which older readers parse as a `Double`.
    static func encode(_ o: Owner) -> String {
        let fraction = String(o.lockedAt.nanoseconds)
        let locked = "\(o.lockedAt.secondsSinceEpoch).\(String(repeating: "0", count: 9 - fraction.count))\(fraction)"
        return "host=\(o.host)\npid=\(o.pid)\nstart=\(o.processStart)\nlocked=\(locked)\n"
    }

    static func token(in text: String) -> UInt64? {
        for line in text.split(separator: "\n") where line.hasPrefix("token=") {
            return UInt64(line.dropFirst(6))
        }
        return nil
    }

    /// `"<seconds>[.<digits>]"`, as written by `encode` or by older
    /// versions (a `Double`'s shortest decimal form).
    static func decodeInstant(_ text: Substring) -> WallClock.Instant? {
        let parts = text.split(separator: ".", maxSplits: 1, omittingEmptySubsequences: false)
        guard let seconds = Int64(parts[0]) else { return nil }
        var nanoseconds: Int32 = 0
        if parts.count == 2 {
            let digits = parts[1].prefix(9)
            guard !digits.isEmpty, digits.allSatisfy(\.isASCII), let value = Int32(digits), value >= 0 else {
                return nil
            }
            nanoseconds = value
            for _ in digits.count..<9 { nanoseconds *= 10 }
        }
        return WallClock.Instant(secondsSinceEpoch: seconds, nanoseconds: nanoseconds)
    }

    static func decode(_ text: String) -> Owner? {
        var fields: [Substring: Substring] = [:]
        for line in text.split(separator: "\n") {
            guard let eq = line.firstIndex(of: "=") else { continue }
            fields[line[..<eq]] = line[line.index(after: eq)...]
        }
        guard let host = fields["host"], let pid = fields["pid"].flatMap({ Int32($0) }),
            let start = fields["start"].flatMap({ UInt64($0) }),
            let locked = fields["locked"].flatMap(decodeInstant)
        else { return nil }
        return Owner(host: String(host), pid: pid, processStart: start, lockedAt: locked)
    }
}
