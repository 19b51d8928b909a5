/// An input source of a run loop, of one of two kinds:
///
/// - **Custom** (the guide's custom input source): another thread hands it
///   work by its own means, then calls `signal()`; on the loop's next pass
///   in one of the source's modes the `perform` callback runs. `schedule`
///   runs when the source is added to a loop in a mode and `cancel` when it
///   is removed from one or invalidated, so clients can learn how to reach
///   it (the guide's command-buffer example).
/// - **Descriptor** (the kernel-signalled kind, like a port-based source): the
///   loop's event backend watches a file descriptor and the handler runs
///   with its readiness. Later layers (ports, event sources) build on it.
///
/// Sources of a mode fire in `order` (lower first). A source may be in
/// several modes of several loops. Thread-safe: `signal()`, `invalidate()`
/// and adding or removing it work from any thread, and wake the loops
/// concerned (a system call only when a loop is asleep).
public final class LoopSource: @unchecked Sendable {
    // @unchecked: mutable state is guarded by `lock` or is an atomic word.

    /// Which kind of source this is.
    public enum Kind: Sendable, Hashable {
        case custom
        case descriptor(Int32, interest: Readiness)
    }

    /// Custom (signalled by `signal()`) or descriptor (signalled by the kernel).
    public let kind: Kind
    /// Position among a mode's sources: lower fires first.
    public let order: Int
    let onSchedule: ((ThreadLoop, LoopMode) -> Void)?
    let onCancel: ((ThreadLoop, LoopMode) -> Void)?
    let onPerform: ((LoopSource) -> Void)?
    let onReady: ((LoopSource, Readiness) -> Void)?

    let lock = Lock()
    private var _valid = true
    /// Loops the source is added to (weakly: a source does not keep a loop alive).
    private var loops: [WeakLoop] = []
    private let signaled = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)

    /// A custom source. `perform` runs on the loop thread after `signal()`;
    /// `schedule` and `cancel` run on the thread that adds or removes it.
    public init(
        order: Int = 0,
        schedule: ((ThreadLoop, LoopMode) -> Void)? = nil,
        cancel: ((ThreadLoop, LoopMode) -> Void)? = nil,
        perform: @escaping (LoopSource) -> Void
    ) {
        kind = .custom
        self.order = order
        onSchedule = schedule
        onCancel = cancel
        onPerform = perform
        onReady = nil
        signaled.initialize(to: 0)
    }

    /// A descriptor source: `handler` runs on the loop thread each time `fd`
    /// is ready for `interest` (readable by default) during a pass in one of
    /// the source's modes. The descriptor stays the caller's: close it only
    /// after invalidating the source.
    public init(
        descriptor fd: Int32, interest: Readiness = .readable, order: Int = 0,
        _ handler: @escaping (LoopSource, Readiness) -> Void
    ) {
        require(fd >= 0, "LoopSource.init(descriptor:): `fd` is \(fd); it must be an open descriptor")
        require(
            !interest.isEmpty && interest.isSubset(of: [.readable, .writable]),
            "LoopSource.init(descriptor:): `interest` must be readable and/or writable")
        kind = .descriptor(fd, interest: interest)
        self.order = order
        onSchedule = nil
        onCancel = nil
        onPerform = nil
        onReady = handler
        signaled.initialize(to: 0)
    }

    deinit { signaled.deallocate() }

    /// Whether the source can still fire.
    public var isValid: Bool { lock.withLock { _valid } }

    /// Whether the source is signalled and waiting for its loop.
    public var isSignaled: Bool { AtomicMemory.load(from: signaled, ordering: .acquiring) != 0 }

    /// Marks a custom source ready to perform and wakes every loop it is on.
    /// Any thread; never blocks. Releasing: what the caller wrote before is
    /// visible to `perform`. Signalling twice before the loop runs performs
    /// once.
    public func signal() {
        require(kind == .custom, "LoopSource.signal(): only custom sources are signalled (descriptor sources are signalled by the kernel)")
        AtomicMemory.store(1, to: signaled, ordering: .releasing)
        for loop in lock.withLock({ loops.compactMap(\.loop) }) { loop.wakeUp() }
    }

    /// Clears the signal; true if it was set. Acquiring. Loop thread.
    func consumeSignal() -> Bool {
        AtomicMemory.load(from: signaled, ordering: .relaxed) != 0
            && AtomicMemory.exchange(0, at: signaled, ordering: .acquiring) != 0
    }

    /// Removes the source from every mode of every loop (calling `cancel`
    /// for each) and stops it for good. Any thread.
    public func invalidate() {
        let attached: [ThreadLoop] = lock.withLock {
            guard _valid else { return [] }
            _valid = false
            defer { loops.removeAll() }
            return loops.compactMap(\.loop)
        }
        for loop in attached { loop.removeEverywhere(self) }
    }

    func attach(_ loop: ThreadLoop) -> Bool {
        lock.withLock {
            guard _valid else { return false }
            loops.removeAll { $0.loop == nil }
            if !loops.contains(where: { $0.loop === loop }) { loops.append(WeakLoop(loop)) }
            return true
        }
    }

    func detach(_ loop: ThreadLoop) {
        lock.withLock { loops.removeAll { $0.loop == nil || $0.loop === loop } }
    }
}

struct WeakLoop {
    weak var loop: ThreadLoop?
    init(_ loop: ThreadLoop) { self.loop = loop }
}
