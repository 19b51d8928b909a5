import Synchronization

/// An input source of a run loop (Core Foundation's `CFRunLoopSource`), of
/// one of two kinds:
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
/// A custom source that takes messages from other threads:
///
/// ```swift
/// let inbox = LockedValue<[String]>([])
/// let source = LoopSource { _ in                 // on the loop's thread
///     let messages = inbox.withLock { queued in
///         defer { queued.removeAll() }
///         return queued
///     }
///     for message in messages { print(message) }
/// }
/// loop.add(source)
///
/// inbox.withLock { $0.append("hello") }          // any thread: first the work,
/// source.signal()                                // then the signal
/// ```
///
/// Sources of a mode fire in `order` (lower first). A source may be in
/// several modes of several loops. Thread-safe: `signal()`, `invalidate()`
/// and adding or removing it work from any thread, and wake the loops
/// concerned (a system call only when a loop is asleep).
///
/// Memory: a source is one object plus its lock (two heap blocks); the
/// signal flag lives in the object itself.
///
/// Callbacks are checked by the compiler for data races. `schedule`,
/// `cancel`, `perform` and a descriptor source's handler are `@Sendable`:
/// they run many times, and on several threads, possibly at once (a source
/// may be in loops of several threads, each of which performs it, and is
/// added and removed from any thread), so what they capture must be safe to
/// share: `Sendable` values, such as a `LockedValue` for state that changes.
/// A capture of a local `var`, or of a non-`Sendable` object, is rejected.
/// `failed` runs at most once, so it is `sending`: the caller hands it over
/// with what it captures.
public final class LoopSource: @unchecked Sendable {
    // @unchecked: `state` is guarded by `lock`, `signaled` is atomic, and
    // everything else is immutable. `onFailure` is not `Sendable`: it came
    // in `sending` and `fail` calls it at most once (the first failure, as
    // recorded under `lock`).

    /// Which kind of source this is.
    public enum Kind: Sendable, Hashable {
        case custom
        case descriptor(Int32, interest: Readiness)
    }

    /// Custom (signalled by `signal()`) or descriptor (signalled by the kernel).
    public let kind: Kind
    /// Position among a mode's sources: lower fires first.
    public let order: Int
    let onSchedule: (@Sendable (ThreadLoop, LoopMode) -> Void)?
    let onCancel: (@Sendable (ThreadLoop, LoopMode) -> Void)?
    let onPerform: (@Sendable (LoopSource) -> Void)?
    let onReady: (@Sendable (LoopSource, Readiness) -> Void)?
    let onFailure: ((LoopSource, DescriptorWatchError) -> Void)?
    /// A descriptor source the loop does not re-arm after its handler:
    /// whoever handles the readiness elsewhere calls `ThreadLoop.rearm(_:)`
    /// when done (event sources, whose handlers run on other threads, later).
    let rearmsManually: Bool

    /// Held briefly, never while calling out; a loop takes it while holding
    /// its own lock (loop first, then source), never the other way round.
    private let lock = Lock()
    /// Guarded by `lock`.
    private var state = State()
    /// Set by `signal()`, cleared by the loop as it performs.
    private let signaled = Atomic<Bool>(false)

    /// Whether the source is valid, and the loops whose modes hold it, each
    /// with how many of its modes do. A loop changes its own record only
    /// under its lock (`join`, `leave`), so the record is there exactly
    /// while one of the loop's modes holds the source; invalidation leaves
    /// the records to the loops. The first record is inline: most sources
    /// live in one loop.
    private struct State {
        struct Record {
            let identity: LoopIdentity
            var modes: Int
        }
        var valid = true
        var failure: DescriptorWatchError?
        var first: Record?
        var more: [Record] = []

        mutating func join(_ loop: LoopIdentity, modes count: Int) -> Bool {
            guard valid else { return false }
            guard count > 0 else { return true }
            if first?.identity === loop {
                first!.modes += count
            } else if let i = more.firstIndex(where: { $0.identity === loop }) {
                more[i].modes += count
            } else if first == nil || first!.identity.loop == nil {
                // A record whose loop is gone can go: no loop would remove it.
                first = Record(identity: loop, modes: count)
            } else {
                more.removeAll { $0.identity.loop == nil }
                more.append(Record(identity: loop, modes: count))
            }
            return true
        }

        mutating func leave(_ loop: LoopIdentity, modes count: Int) -> Bool {
            if first?.identity === loop {
                first!.modes -= count
                guard first!.modes <= 0 else { return false }
                first = more.isEmpty ? nil : more.removeFirst()
                return true
            }
            guard let i = more.firstIndex(where: { $0.identity === loop }) else { return true }
            more[i].modes -= count
            guard more[i].modes <= 0 else { return false }
            more.remove(at: i)
            return true
        }
    }

    /// A custom source. `perform` runs on the loop thread after `signal()`;
    /// `schedule` and `cancel` run on the thread that adds or removes it.
    /// All three are `@Sendable`: each may run on several threads, even at
    /// once (see the type's documentation).
    public init(
        order: Int = 0,
        schedule: (@Sendable (ThreadLoop, LoopMode) -> Void)? = nil,
        cancel: (@Sendable (ThreadLoop, LoopMode) -> Void)? = nil,
        perform: @escaping @Sendable (LoopSource) -> Void
    ) {
        kind = .custom
        self.order = order
        onSchedule = schedule
        onCancel = cancel
        onPerform = perform
        onReady = nil
        onFailure = nil
        rearmsManually = false
    }

    /// A descriptor source: `handler` runs on the loop thread each time `fd`
    /// is ready for `interest` (readable by default) during a pass in one of
    /// the source's modes. The descriptor stays the caller's: close it after
    /// invalidating the source. Several sources may watch one descriptor
    /// (a socket's reader and writer), in one loop or several.
    ///
    /// If the descriptor cannot be watched (it is not open, or is a regular
    /// file or directory, which is always ready; or it was closed while
    /// watched; or the kernel refused), the source fails: `failure` is set,
    /// the source is invalidated, and `failed` runs once, on the thread that
    /// found out (the one adding it, or the loop's).
    ///
    /// `handler` is `@Sendable`: the source may be in loops of several
    /// threads, which run it at once. `failed` is `sending`: it runs at most
    /// once, so it may own what it captures.
    public convenience init(
        descriptor fd: Int32, interest: Readiness = .readable, order: Int = 0,
        failed: sending ((LoopSource, DescriptorWatchError) -> Void)? = nil,
        _ handler: @escaping @Sendable (LoopSource, Readiness) -> Void
    ) {
        self.init(descriptor: fd, interest: interest, order: order, rearmsManually: false, failed: failed, handler)
    }

    /// A descriptor source; with `rearmsManually`, the loop watches the
    /// descriptor again only after `ThreadLoop.rearm(_:)`, not after each
    /// handler call.
    init(
        descriptor fd: Int32, interest: Readiness = .readable, order: Int = 0, rearmsManually: Bool,
        failed: sending ((LoopSource, DescriptorWatchError) -> Void)? = nil,
        _ handler: @escaping @Sendable (LoopSource, Readiness) -> Void
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
        onFailure = failed
        self.rearmsManually = rearmsManually
    }

    /// Whether the source can still fire. Takes the source's lock briefly.
    public var isValid: Bool { lock.withLock { state.valid } }

    /// Why a descriptor source stopped: its descriptor could not be watched.
    /// nil while it works, for a custom source, and for a source invalidated
    /// by `invalidate()`. Takes the source's lock briefly.
    public var failure: DescriptorWatchError? { lock.withLock { state.failure } }

    /// Records `error`, invalidates the source and calls `failed`; nothing
    /// if the source was invalidated already.
    func fail(_ error: DescriptorWatchError) {
        let first: Bool = lock.withLock {
            guard state.valid, state.failure == nil else { return false }
            state.failure = error
            return true
        }
        guard first else { return }
        invalidate()
        onFailure?(self, error)
    }

    /// Whether the source is signalled and waiting for its loop. Never
    /// blocks. Acquiring: pairs with `signal()`.
    public var isSignaled: Bool { signaled.load(ordering: .acquiring) }

    /// Whether this is a descriptor source.
    var isDescriptor: Bool {
        if case .descriptor = kind { return true }
        return false
    }

    /// Marks a custom source ready to perform and wakes every loop it is on.
    /// Any thread; never blocks (beyond the source's lock, held for two
    /// loads). Releasing: what the caller wrote before is visible to
    /// `perform`. Signalling twice before the loop runs performs once. A
    /// precondition failure on a descriptor source.
    public func signal() {
        require(kind == .custom, "LoopSource.signal(): only custom sources are signalled (descriptor sources are signalled by the kernel)")
        // Pairs with the acquiring exchange in `consumeSignal()`.
        signaled.store(true, ordering: .releasing)
        let (first, more) = lock.withLock { (state.first?.identity, state.more) }
        first?.loop?.wakeUp()
        for m in more { m.identity.loop?.wakeUp() }
    }

    /// Clears the signal; true if it was set. Acquiring: pairs with
    /// `signal()`. Loop thread.
    func consumeSignal() -> Bool {
        // The relaxed load keeps an unsignalled source off the cache line's
        // exclusive state on every pass.
        signaled.load(ordering: .relaxed) && signaled.exchange(false, ordering: .acquiring)
    }

    /// Removes the source from every mode of every loop (calling `cancel`
    /// for each) and stops it for good: it cannot be added again. Any
    /// thread; takes each loop's lock in turn, never two at once. Calling it
    /// again does nothing.
    public func invalidate() {
        let (first, more): (LoopIdentity?, [State.Record]) = lock.withLock {
            guard state.valid else { return (nil, []) }
            state.valid = false
            return (state.first?.identity, state.more)
        }
        first?.loop?.removeEverywhere(self)
        for m in more { m.identity.loop?.removeEverywhere(self) }
    }

    /// Records that `count` more of `loop`'s modes hold the source. Called
    /// with `loop`'s lock held, before the loop adds it to those modes.
    /// Returns false, recording nothing, if the source was invalidated: the
    /// loop must not add it then.
    func join(_ loop: LoopIdentity, modes count: Int = 1) -> Bool {
        lock.withLock { state.join(loop, modes: count) }
    }

    /// Records that `count` fewer of `loop`'s modes hold the source. Called
    /// with `loop`'s lock held. Returns whether none of them does any more.
    func leave(_ loop: LoopIdentity, modes count: Int = 1) -> Bool {
        lock.withLock { state.leave(loop, modes: count) }
    }
}
