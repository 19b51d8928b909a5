import CShims
import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// A fresh directory for one test, removed afterwards.
func withTemporaryDirectory<R>(_ body: (String) throws -> R) rethrows -> R {
    var template = Array("/tmp/spindle-test-XXXXXX".utf8CString)
    let dir = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    defer {
        if let d = opendir(dir) {
            while let e = readdir(d) {
                let name = withUnsafeBytes(of: e.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
                if name != "." && name != ".." { unlink("\(dir)/\(name)") }
            }
            closedir(d)
        }
        rmdir(dir)
    }
    return try body(dir)
}

@Suite("DistributedLock")
struct DistributedLockTests {
    @Test func tryLockUnlockAndOwnerRecord() throws {
        try withTemporaryDirectory { (dir: String) throws in
            let a = DistributedLock(path: "\(dir)/resource.lock")
            let b = DistributedLock(path: "\(dir)/resource.lock")
            #expect(try a.tryLock())
            #expect(a.isHeldByMe)
            #expect(try !b.tryLock(), "held by a")
            #expect(try !a.tryLock(), "not recursive")
            let owner = try #require(b.owner)
            #expect(owner.pid == getpid())
            #expect(owner.processStart > 0)
            #expect(b.lockDate != nil)
            #expect(b.isHeldByDeadProcess == false, "we are alive")
            #expect(throws: DistributedLock.Error.notOwner(path: "\(dir)/resource.lock")) { try b.unlock() }
            try a.unlock()
            #expect(a.owner == nil && a.lockDate == nil && a.isHeldByDeadProcess == nil)
            #expect(try b.tryLock())
            try b.unlock()
            // No temporary files are left behind.
            #expect(access("\(dir)/resource.lock", F_OK) != 0)
        }
    }

    @Test func breakLockFreesALockHeldByAnother() throws {
        try withTemporaryDirectory { (dir: String) throws in
            let a = DistributedLock(path: "\(dir)/l")
            let b = DistributedLock(path: "\(dir)/l")
            #expect(try a.tryLock())
            try b.breakLock()
            #expect(try b.tryLock())
            // a no longer holds it: its unlock says so and leaves b's lock alone.
            #expect(throws: DistributedLock.Error.notOwner(path: "\(dir)/l")) { try a.unlock() }
            #expect(b.owner != nil)
            try b.unlock()
            try b.breakLock()  // breaking a free lock is fine
        }
    }

    @Test func missingDirectoryThrowsSpecifically() {
        let lock = DistributedLock(path: "/tmp/spindle-no-such-dir-\(getpid())/x.lock")
        #expect(throws: DistributedLock.Error.directoryMissing(path: lock.path)) { try lock.tryLock() }
    }

    /// A read-only file system, made for real: the child process mounts a
    /// read-only tmpfs in a private mount namespace. Where the sandbox refuses
    /// (no CAP_SYS_ADMIN), the child says so and the check is skipped.
    @Test func readOnlyFileSystemThrowsSpecifically() async throws {
        let dir = "/tmp/spindle-rofs-\(getpid())"
        mkdir(dir, 0o755)
        defer { rmdir(dir) }
        let r = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            let dir = "/tmp/spindle-rofs-\(getppid())"
            guard cshims_unshare_private_mounts() == 0,
                mount("spindle-ro", dir, "tmpfs", UInt(MS_RDONLY), nil) == 0
            else {
                print("SKIP: cannot mount a read-only tmpfs here (errno \(errno))")
                exit(0)
            }
            let lock = DistributedLock(path: "\(dir)/l")
            do throws(DistributedLock.Error) {
                _ = try lock.tryLock()
                exit(1)
            } catch {
                guard case .readOnlyFileSystem = error else { print("unexpected: \(error)"); exit(2) }
                exit(0)
            }
        }
        let out = String(decoding: r?.standardOutputContent ?? [], as: UTF8.self)
        if out.hasPrefix("SKIP") { print("readOnlyFileSystemThrowsSpecifically: \(out)") }
    }

    /// Permission denied, for real: the child drops root and tries a
    /// directory only root may write.
    @Test func permissionDeniedThrowsSpecifically() async throws {
        let dir = "/tmp/spindle-perm-\(getpid())"
        mkdir(dir, 0o755)
        defer { rmdir(dir) }
        await #expect(processExitsWith: .success) {
            let dir = "/tmp/spindle-perm-\(getppid())"
            if geteuid() == 0 { guard setgid(65534) == 0, setuid(65534) == 0 else { exit(3) } }
            let lock = DistributedLock(path: "\(dir)/l")
            do throws(DistributedLock.Error) {
                _ = try lock.tryLock()
                exit(1)
            } catch {
                guard case .permissionDenied = error else { exit(2) }
                exit(0)
            }
        }
    }

    /// A symlink at the path used to be reported exactly like a live holder
    /// (`tryLock` false); it is an error of its own, and never followed.
    @Test func symlinkAtThePathIsReportedAsSuchAndNotFollowed() throws {
        try withTemporaryDirectory { (dir: String) throws in
            let target = "\(dir)/target"
            symlink(target, "\(dir)/l")
            let lock = DistributedLock(path: "\(dir)/l")
            #expect(throws: DistributedLock.Error.symbolicLink(path: lock.path)) { try lock.tryLock() }
            #expect(throws: DistributedLock.Error.symbolicLink(path: lock.path)) { try lock.currentOwner() }
            #expect(lock.owner == nil, "and is not read through")
            #expect(access(target, F_OK) != 0, "nothing was created through it")
            try lock.breakLock()  // removes the link itself
            #expect(try lock.tryLock())
            try lock.unlock()
        }
    }

    /// Runs `body` on a thread of its own and reports whether it finished
    /// within 10 s, so that a regression fails instead of hanging the run.
    private func finishes(_ body: @escaping @Sendable () -> Void) -> Bool {
        let done = Latch()
        let join = startThread {
            body()
            done.countDown()
        }
        guard done.wait(seconds: 10) else { return false }
        join()
        return true
    }

    /// A FIFO at the path used to hang `owner`, `lockDate`,
    /// `isHeldByDeadProcess` and `unlock` forever (a blocking open).
    @Test func fifoAtThePathHangsNothingAndIsReported() throws {
        try withTemporaryDirectory { (dir: String) throws in
            let path = "\(dir)/l"
            let lock = DistributedLock(path: path)
            #expect(try lock.tryLock())
            // Replaced by a FIFO while held.
            unlink(path)
            #expect(mkfifo(path, 0o644) == 0)
            let inspected = finishes {
                #expect(lock.owner == nil)
                #expect(lock.lockDate == nil)
                #expect(lock.isHeldByDeadProcess == nil)
                #expect(throws: DistributedLock.Error.notARegularFile(path: path, type: .fifo)) {
                    try lock.currentOwner()
                }
                #expect(throws: DistributedLock.Error.notARegularFile(path: path, type: .fifo)) { try lock.unlock() }
                #expect(throws: DistributedLock.Error.notARegularFile(path: path, type: .fifo)) {
                    try lock.tryLock()
                }
            }
            #expect(inspected, "an inspection blocked on the FIFO")
            try lock.breakLock()
            #expect(access(path, F_OK) != 0)
        }
    }

    /// A directory at the path used to make `tryLock` return false forever.
    @Test func directoryAtThePathThrowsSpecifically() throws {
        try withTemporaryDirectory { (dir: String) throws in
            let path = "\(dir)/l"
            #expect(mkdir(path, 0o755) == 0)
            defer { rmdir(path) }
            let lock = DistributedLock(path: path)
            #expect(throws: DistributedLock.Error.notARegularFile(path: path, type: .directory)) { try lock.tryLock() }
            #expect(throws: DistributedLock.Error.notARegularFile(path: path, type: .directory)) {
                try lock.breakLock()
            }
            #expect(lock.owner == nil)
        }
    }

    /// Names of 240–255 bytes used to fail: the temporary name was the lock's
    /// name plus a suffix, past `NAME_MAX`.
    @Test(arguments: [240, 250, 255])
    func namesUpToNameMaxWork(length: Int) throws {
        try withTemporaryDirectory { (dir: String) throws in
            let lock = DistributedLock(path: "\(dir)/" + String(repeating: "n", count: length))
            #expect(try lock.tryLock())
            #expect(lock.owner?.pid == getpid())
            try lock.unlock()
            #expect(access(lock.path, F_OK) != 0)
        }
    }

    @Test func aNameLongerThanNameMaxThrowsNameTooLong() throws {
        try withTemporaryDirectory { (dir: String) throws in
            let lock = DistributedLock(path: "\(dir)/" + String(repeating: "n", count: 256))
            #expect(throws: DistributedLock.Error.nameTooLong(path: lock.path)) { try lock.tryLock() }
        }
    }

    /// `lock(before:)` waits while another object holds the lock and takes
    /// it once released; with a deadline already past it is `tryLock`.
    @Test func lockBeforeWaitsForTheHolderAndGivesUpAtItsDeadline() throws {
        try withTemporaryDirectory { (dir: String) throws in
            let path = "\(dir)/l"
            let holder = DistributedLock(path: path)
            let waiter = DistributedLock(path: path)
            #expect(try holder.tryLock())
            #expect(try !waiter.lock(before: MonotonicClock.now))
            #expect(try !waiter.lock(timeout: .milliseconds(5)))
            let join = startThread {
                usleep(20_000)
                #expect(throws: Never.self) { try holder.unlock() }
            }
            #expect(try waiter.lock(before: MonotonicClock.now.advanced(by: .seconds(30))))
            join()
            #expect(waiter.isHeldByMe)
            try waiter.unlock()
        }
    }

    @Test func lockDateIsTheWallClockTimeItWasTaken() throws {
        try withTemporaryDirectory { (dir: String) throws in
            let lock = DistributedLock(path: "\(dir)/l")
            let before = WallClock.now
            #expect(try lock.tryLock())
            let after = WallClock.now
            let date = try #require(lock.lockDate)
            #expect(before <= date && date <= after)
            try lock.unlock()
        }
    }

    /// A record written by an older version (`locked=` as a `Double`) still
    /// reads, as a wall-clock instant.
    @Test func aRecordWithADoubleLockDateStillReads() throws {
        try withTemporaryDirectory { (dir: String) throws in
            let path = "\(dir)/l"
            let fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0o644)
            #expect(fd >= 0)
            let text = "host=elsewhere\npid=1\nstart=5\nlocked=1700000000.123\ntoken=9\n"
            _ = text.withCString { write(fd, $0, strlen($0)) }
            close(fd)
            let lock = DistributedLock(path: path)
            let owner = try #require(lock.owner)
            #expect(owner.host == "elsewhere" && owner.pid == 1 && owner.processStart == 5)
            #expect(owner.lockedAt == WallClock.Instant(secondsSinceEpoch: 1_700_000_000, nanoseconds: 123_000_000))
            #expect(lock.isHeldByDeadProcess == nil, "another host")
            try lock.breakLock()
        }
    }

    @Test func lockBeforeOnAnObjectThatHoldsTheLockStops() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let lock = DistributedLock(path: "/tmp/spindle-self-wait-\(getpid()).lock")
            guard (try? lock.tryLock()) == true else { exit(0) }
            _ = blocking { try? lock.lock(timeout: .seconds(1)) }
        }
        let stderr = String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("DistributedLock.lock(before:): this object already holds"))
    }

    /// A holder killed with SIGKILL leaves the lock held; the record shows it
    /// dead; breakLock frees it.
    @Test func killedHolderLeavesTheLockUntilBroken() async throws {
        let path = "/tmp/spindle-killed-holder-\(getpid()).lock"
        unlink(path)
        defer { unlink(path) }
        await #expect(processExitsWith: .signal(SIGKILL)) {
            let lock = DistributedLock(path: "/tmp/spindle-killed-holder-\(getppid()).lock")
            guard (try? lock.tryLock()) == true else { exit(3) }
            kill(getpid(), SIGKILL)
        }
        let lock = DistributedLock(path: path)
        #expect(try !lock.tryLock(), "still held by the dead process")
        #expect(lock.isHeldByDeadProcess == true)
        try lock.breakLock()
        #expect(try lock.tryLock())
        try lock.unlock()
    }
}
