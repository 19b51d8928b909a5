// A count-down latch and process statistics for tests that coordinate
// threads. Built on pthread mutexes and conditions, not on Spindle, so that a
// test of Spindle's threads does not rely on the code under test to wait.
#if canImport(Glibc)
import Glibc
#endif

/// Opens once `countDown()` has been called `count` times; `wait` blocks
/// until then (or a timeout, so that a broken test fails instead of hanging).
public final class Latch: @unchecked Sendable {
    // @unchecked: `remaining` is only accessed with `mutex` held.
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let condition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    private var remaining: Int

    public init(_ count: Int = 1) {
        remaining = count
        pthread_mutex_init(mutex, nil)
        pthread_cond_init(condition, nil)
    }

    deinit {
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
        condition.deallocate()
    }

    public func countDown() {
        pthread_mutex_lock(mutex)
        if remaining > 0 { remaining -= 1 }
        if remaining == 0 { pthread_cond_broadcast(condition) }
        pthread_mutex_unlock(mutex)
    }

    public var isOpen: Bool {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return remaining == 0
    }

    /// Waits until the latch opens; false if `seconds` passed first.
    @discardableResult
    public func wait(seconds: Int = 30) -> Bool {
        var deadline = timespec()
        clock_gettime(CLOCK_REALTIME, &deadline)
        deadline.tv_sec += seconds
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        while remaining > 0 {
            if pthread_cond_timedwait(condition, mutex, &deadline) == ETIMEDOUT { return remaining == 0 }
        }
        return true
    }
}

/// The names in a directory (a /proc one, usually), without "." and "..";
/// empty if it cannot be opened.
public func directoryEntries(_ path: String) -> [String] {
    guard let dir = opendir(path) else { return [] }
    defer { closedir(dir) }
    var names: [String] = []
    while let entry = readdir(dir) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix(while: { $0 != 0 }), as: UTF8.self) }
        if name != "." && name != ".." { names.append(name) }
    }
    return names
}

/// The number of threads in this process (entries of /proc/self/task).
public func processThreadCount() -> Int {
    directoryEntries("/proc/self/task").count
}

/// This process's resident set size in bytes (/proc/self/statm).
public func residentBytes() -> Int {
    guard let fields = procFileText("/proc/self/statm")?.split(separator: " "),
        fields.count > 1, let pages = Int(fields[1])
    else { return -1 }
    return pages * sysconf(Int32(_SC_PAGESIZE))
}

/// The text of a small /proc file (at most 255 bytes), or nil.
public func procFileText(_ path: String) -> String? {
    let fd = open(path, O_RDONLY)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var buffer = [UInt8](repeating: 0, count: 256)
    let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
    guard n > 0 else { return nil }
    return String(decoding: buffer[0..<n], as: UTF8.self)
}

/// A mutable box shared between threads; the test orders the accesses.
public final class UnsafeBox<T>: @unchecked Sendable {
    public var value: T
    public init(_ value: T) { self.value = value }
}
