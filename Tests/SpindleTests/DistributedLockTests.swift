import CShims
import Spindle
import Testing

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

    @Test func symlinkAtThePathIsNotFollowed() throws {
        try withTemporaryDirectory { (dir: String) throws in
            let target = "\(dir)/target"
            symlink(target, "\(dir)/l")
            let lock = DistributedLock(path: "\(dir)/l")
            #expect(try !lock.tryLock(), "a symlink counts as a held lock")
            #expect(lock.owner == nil, "and is not read through")
            #expect(access(target, F_OK) != 0, "nothing was created through it")
        }
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
