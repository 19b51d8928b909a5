import Spindle

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
public final class EventLog: @unchecked Sendable {
    // @unchecked: `entries` is guarded by `lock`.
    private let lock = Lock()
    private var entries: [String] = []
    public init() {}
    public func append(_ s: String) { lock.withLock { entries.append(s) } }
    public var all: [String] { lock.withLock { entries } }
    public func clear() { lock.withLock { entries.removeAll() } }
}
