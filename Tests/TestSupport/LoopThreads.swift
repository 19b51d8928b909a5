import Spindle

#if canImport(Glibc)
import Glibc
#endif

/// The backends this process can use, for tests parameterized over both.
public let availableBackends: [EventBackendKind] =
    EventBackends.ioUringRefusal == nil ? [.ioUring, .epoll] : [.epoll]

/// Runs `body` on a new thread whose loop uses `kind`, and joins it.
public func onLoopThread(_ kind: EventBackendKind, _ body: @escaping @Sendable (ThreadLoop) -> Void) {
    let join = startThread {
        let loop = try! ThreadLoop.current(backend: kind)
        body(loop)
    }
    join()
}

/// A thread-safe log of strings, for checking the order of events.
public final class EventLog: Sendable {
    private let entries = LockedValue<[String]>([])
    public init() {}
    public func append(_ s: String) { entries.withLock { $0.append(s) } }
    public var all: [String] { entries.withLock { $0 } }
    public func clear() { entries.withLock { $0.removeAll() } }
}

/// A loop running on a thread of its own, for tests that act on it from
/// other threads. The thread makes its loop (with backend `kind`), adds
/// `keep`, a source that keeps the default mode from being empty, hands
/// both over, then calls `run` with the loop. `join()` waits for the thread
/// and returns what `run` returned.
public final class RunningLoop: @unchecked Sendable {
    // @unchecked: `loop` and `keep` are written by the loop thread before
    // `ready` opens and only read after; `outcome` is written by the loop
    // thread before it exits and read after `join` has joined it.
    public private(set) var loop: ThreadLoop!
    public private(set) var keep: LoopSource!
    private var outcome: LoopRunResult?
    private let ready = Latch()
    private var joinThread: (() -> Void)?

    public init(_ kind: EventBackendKind, run: @escaping @Sendable (ThreadLoop) -> LoopRunResult) {
        joinThread = startThread { [self] in
            let loop = try! ThreadLoop.current(backend: kind)
            let keep = LoopSource { _ in }
            loop.add(keep)
            self.loop = loop
            self.keep = keep
            ready.countDown()
            outcome = run(loop)
        }
        ready.wait()
    }

    /// Waits for the loop thread to finish; returns what `run` returned.
    public func join() -> LoopRunResult? {
        joinThread?()
        joinThread = nil
        return outcome
    }
}

/// Runs `body` with the read and write ends of a new pipe, closed after.
public func withPipe<R>(_ body: (_ readEnd: Int32, _ writeEnd: Int32) throws -> R) rethrows -> R {
    var fds: [Int32] = [0, 0]
    precondition(pipe(&fds) == 0, "pipe failed: \(errno)")
    defer {
        close(fds[0])
        close(fds[1])
    }
    return try body(fds[0], fds[1])
}

/// Writes one byte to `fd`.
public func poke(_ fd: Int32) {
    var b: UInt8 = 1
    _ = write(fd, &b, 1)
}

/// Reads one byte from `fd`.
public func drain(_ fd: Int32) {
    var b: UInt8 = 0
    _ = read(fd, &b, 1)
}

/// Makes a pipe whose read end has the number `number`, so a test can reuse
/// a descriptor number on purpose. Use numbers from 900 up, each in one
/// test (or one serialized suite) only: the test process allocates the
/// lowest free numbers by itself, far below, so no other test's descriptor
/// is taken.
public func makePipe(readEndAt number: Int32) -> (readEnd: Int32, writeEnd: Int32) {
    var fds: [Int32] = [0, 0]
    precondition(pipe(&fds) == 0, "pipe failed: \(errno)")
    if fds[0] != number {
        precondition(dup2(fds[0], number) == number, "dup2 failed: \(errno)")
        close(fds[0])
    }
    return (number, fds[1])
}

/// `fd` moved to a descriptor number far above the ones the kernel hands
/// out next (it gives the lowest free one; 600-899, as 951 is another
/// test's), so that the number, once a test closes it, is not reused at
/// once by another test running in parallel: a test that closes a
/// descriptor and expects the closed number to fail (EBADF) would otherwise
/// see the reused number succeed (seen once in CI with io_uring). Closes
/// `fd`. Returns `fd` itself if it cannot be moved.
public func movedOutOfTheWay(_ fd: Int32) -> Int32 {
    let high = fcntl(fd, F_DUPFD_CLOEXEC, Int32.random(in: 600..<900))
    guard high >= 0 else { return fd }
    close(fd)
    return high
}

/// A descriptor number that was open (a pipe's read end) and is closed now,
/// far from the numbers the kernel hands out next (see `movedOutOfTheWay`).
public func closedDescriptorNumber() -> Int32 {
    var fds: [Int32] = [0, 0]
    precondition(pipe(&fds) == 0, "pipe failed: \(errno)")
    close(fds[1])
    let high = movedOutOfTheWay(fds[0])
    close(high)
    return high
}
