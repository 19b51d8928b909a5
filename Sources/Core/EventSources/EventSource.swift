import Synchronization

/// An event source (the guide's dispatch source): it watches one kind of
/// event (a timer, a descriptor's readiness, a signal, a process's exit, a
/// file's changes, or data the program merges in) and runs its handler on a
/// `WorkQueue` or a `ThreadLoop` each time the event occurs.
///
/// Replaces Dispatch's `DispatchSource` kinds (`makeTimerSource`,
/// `makeReadSource`, `makeSignalSource`...): one static function per kind.
///
/// ```swift
/// let queue = WorkQueue(label: "ticks")
/// let ticker = EventSource.timer(interval: .milliseconds(10), leeway: .milliseconds(1), on: .queue(queue))
/// ticker.setEventHandler { source in
///     print("fired \(source.data) time(s)")        // > 1 when periods were missed
/// }
/// ticker.activate()
/// // ...
/// ticker.cancel()
/// ```
///
/// **Life cycle.** A new source is inactive: it runs nothing and watches
/// nothing yet (its kernel watch, or its timer, starts with `activate()`),
/// but data merged into a data source meanwhile is kept and delivered in
/// the first call after activation, as the guide's dispatch sources do.
/// Install the handlers, then `activate()` (or `resume()`), which starts
/// watching. An active source keeps itself alive until it is
/// cancelled, so a caller may drop its reference. `cancel()` is final and
/// asynchronous: it returns at once, a handler call already running
/// finishes, then the cancel handler runs exactly once on the target, and
/// the event handler never runs again. A cancelled source lets go of its
/// handlers (and what they capture) after its cancel handler has run. The
/// cancel handler runs even when the source is suspended or was never
/// activated (Dispatch defers it until the source is resumed, which leaks
/// the descriptor of a dropped, suspended source).
///
/// **Coalescing.** Events that arrive while a handler call is queued but not
/// started join that call; events during a call are held for one more call
/// after it returns. So a source's handler never runs concurrently with
/// itself, even on a concurrent queue, and `data` sums up (or ORs, or
/// replaces: see each kind) the events since the previous call.
/// `suspend()` and `resume()` are counted; events during a suspension are
/// delivered as one call after the last `resume()`.
///
/// **Handlers** receive the source, so reading `data` needs no capture of
/// it (and no cycle). They are `@Sendable`: they run on other threads, long
/// after the code that installed them has returned. Any handler can be
/// replaced at any time, from any thread; a call already started uses the
/// old one.
///
/// **Where handlers run.** `.queue(q)`: as work items on `q`. Every kind
/// is watched by an idle worker of Spindle's pool, which runs the call
/// itself when the event comes (one wake-up per event; see
/// <doc:EventSources> and <doc:EventDriver> for what that costs while
/// every worker is busy).
/// `.loop(l, modes:)`: on `l`'s thread during passes in one of `modes`;
/// the loop's own event backend watches descriptors, timers and process
/// exits, so no other thread is involved. Signals and file-system watches
/// are process-wide mechanisms that a loop cannot wait for itself: for a
/// loop target they go through Spindle's reactor thread ("spindle.events",
/// started on first use), which submits the calls to the loop.
/// `setTarget(_:)` moves a source, and its watch, at any time.
///
/// Thread-safe: every method may be called from any thread. Misuse (merging
/// into a source that is not a data source, resuming more than suspended)
/// stops the process with a message.
public final class EventSource: @unchecked Sendable, CustomStringConvertible {
    // @unchecked: `state`, `accumulated` and `current` are atomics; the
    // rest of the mutable state is guarded by `lock`; the watch is immutable
    // and thread-safe itself.

    /// What the source watches.
    public let kind: Kind
    /// The descriptor (read, write, file-system object), the signal number
    /// (signal) or the process id (process); 0 for timers and data sources.
    public let handle: Int32
    /// The events asked for: `FileEvents` or `ProcessEvents` raw values, the
    /// merge mask of an `.or` data source; 0 for the other kinds.
    public let mask: UInt64

    let watch: (any SourceWatch)?

    /// The source's life in one word, so that an event, a handler's return,
    /// a resume and a cancel each decide in one compare-and-swap whether to
    /// submit a call:
    ///
    ///     bit 0  pending     an event arrived since the last call began
    ///     bit 1  scheduled   a call (registration, event or cancel) is
    ///                        submitted or running: at most one at a time
    ///     bit 2  cancelled
    ///     bit 3  finishing   the cancel call has been claimed
    ///     bit 4  inactive    not yet activated
    ///     bits 8-63          suspension count
    private let state = Atomic<UInt64>(State.inactive)
    /// Event data merged since the last call began (add, or, or replace,
    /// by kind).
    private let accumulated = Atomic<UInt64>(0)
    /// The data of the call in progress (or of the last one).
    private let current = Atomic<UInt64>(0)

    private let lock = GuardLock()
    /// Guarded by `lock`.
    private var guarded: Guarded

    private struct Guarded {
        var target: Target
        var eventHandler: (@Sendable (EventSource) -> Void)?
        var cancelHandler: (@Sendable (EventSource) -> Void)?
        var registrationHandler: (@Sendable (EventSource) -> Void)?
        var activated = false
        /// The cancel call has run: nothing may hold the source alive again.
        var finished = false
        /// The active source's hold on itself, from activation until its
        /// cancel call has run.
        var keepAlive: EventSource?
        var failure: EventSourceError?
        var exitStatus: ExitStatus?
    }

    enum State {
        static let pending: UInt64 = 1 << 0
        static let scheduled: UInt64 = 1 << 1
        static let cancelled: UInt64 = 1 << 2
        static let finishing: UInt64 = 1 << 3
        static let inactive: UInt64 = 1 << 4
        static let suspension: UInt64 = 1 << 8
        static func suspensions(_ s: UInt64) -> UInt64 { s >> 8 }
    }

    /// The calls a source submits to its target.
    private enum Call { case registration, event, cancel }

    init(kind: Kind, handle: Int32, mask: UInt64, target: Target, watch: (any SourceWatch)?) {
        // Before the first watch can exist in a child.
        _ = EventReactor.forkHandlersRegistered
        self.kind = kind
        self.handle = handle
        self.mask = mask
        self.watch = watch
        guarded = Guarded(target: target)
        if case .loop(_, let modes) = target {
            require(!modes.isEmpty, "EventSource: the target loop's `modes` is empty; the handler could never run")
        }
    }

    // MARK: Handlers

    /// Sets the handler that runs for each (coalesced) event; `nil` removes
    /// it (events are then consumed without a call). Any thread.
    public func setEventHandler(_ handler: (@Sendable (EventSource) -> Void)?) {
        lock.withLock { guarded.eventHandler = handler }
    }

    /// Sets the handler that runs once after `cancel()`, when the event
    /// handler can no longer run: the place to close a descriptor the source
    /// watched. Any thread; ignored once the cancel handler has started.
    public func setCancelHandler(_ handler: (@Sendable (EventSource) -> Void)?) {
        lock.withLock { guarded.cancelHandler = handler }
    }

    /// Sets the handler that runs once on the target when the source is
    /// activated, before any event handler. Set it before `activate()`.
    public func setRegistrationHandler(_ handler: (@Sendable (EventSource) -> Void)?) {
        lock.withLock { guarded.registrationHandler = handler }
    }

    // MARK: Data

    /// The event data of the handler call in progress (read it in the
    /// handler; elsewhere it is the last call's): per kind, bytes readable,
    /// space to write, deliveries of a signal, timer firings, the OR of
    /// `FileEvents` or `ProcessEvents` that occurred, or the merged data.
    /// Never blocks.
    public var data: UInt64 { current.load(ordering: .relaxed) }

    /// `data` as file-system events (for a `.fileSystemObject` source).
    public var fileEvents: FileEvents { FileEvents(rawValue: data) }

    /// `data` as process events (for a `.process` source).
    public var processEvents: ProcessEvents { ProcessEvents(rawValue: data) }

    /// How a watched child process ended, once its exit has been delivered;
    /// nil for other kinds, before the exit, and for a process that is not
    /// this process's child (Linux gives an exit status only to the
    /// parent). The child is not reaped: `waitpid` still works.
    public var exitStatus: ExitStatus? { lock.withLock { guarded.exitStatus } }

    /// Why the source stopped by itself (its descriptor was closed while
    /// watched, or the kernel refused the watch); nil otherwise. A source
    /// that fails is cancelled: its cancel handler runs.
    public var failure: EventSourceError? { lock.withLock { guarded.failure } }

    /// Whether `cancel()` has been called. Never blocks.
    public var isCancelled: Bool { state.load(ordering: .acquiring) & State.cancelled != 0 }

    /// Merges `value` into a data source (`.add`: summed, `.or`: ORed under
    /// the source's mask, `.replace`: the latest wins) and, unless a call is
    /// already pending, submits one. Any thread; never blocks; lock-free.
    /// Many merges before the handler runs make one call. Merging 0 does
    /// nothing (as in Dispatch); merges after `cancel()` are ignored.
    /// Releasing: what the caller wrote before is visible to the handler
    /// that receives the value. A precondition failure on other kinds.
    public func merge(data value: UInt64) {
        switch kind {
        case .data(.add): add(value)
        case .data(.or): or(value & mask)
        case .data(.replace): replace(value)
        default: misuse("EventSource.merge(data:): \(self) is not a data source; only `.data(...)` sources take merges")
        }
    }

    // MARK: Events (from watches)

    /// Adds `value` to the pending data (counts: timer firings, signal
    /// deliveries, merges).
    func add(_ value: UInt64) {
        guard value != 0 else { return }
        // Sequentially consistent with the state word, so that a call which
        // clears `pending` and then takes the data sees this value, or this
        // event sees `pending` clear (see `noteEvent`).
        accumulated.wrappingAdd(value, ordering: .sequentiallyConsistent)
        noteEvent()
    }

    /// ORs `value` into the pending data (event flags).
    func or(_ value: UInt64) {
        guard value != 0 else { return }
        accumulated.bitwiseOr(value, ordering: .sequentiallyConsistent)
        noteEvent()
    }

    func replace(_ value: UInt64) {
        guard value != 0 else { return }
        accumulated.store(value, ordering: .sequentiallyConsistent)
        noteEvent()
    }

    /// Records that an event arrived (its data already merged) and submits a
    /// call unless one is pending, running, or held back by a suspension.
    func noteEvent() {
        // Fast path for a burst: `pending` is already set, so whoever
        // cleared or holds back the call will see this event's data (a call
        // clears `pending` before it takes the data; all four operations are
        // sequentially consistent).
        if state.load(ordering: .sequentiallyConsistent) & State.pending != 0 { return }
        let old = state.bitwiseOr(State.pending, ordering: .sequentiallyConsistent).oldValue
        if old & State.pending != 0 { return }
        trySchedule()
    }

    /// Reports a failure of the source's watch: records it and cancels.
    func fail(_ error: EventSourceError) {
        lock.withLock { if guarded.failure == nil { guarded.failure = error } }
        cancel()
    }

    func setExitStatus(_ status: ExitStatus) {
        lock.withLock { guarded.exitStatus = status }
    }

    /// Takes the data merged since the last call; 0 when there was none.
    func takeAccumulated() -> UInt64 {
        accumulated.exchange(0, ordering: .sequentiallyConsistent)
    }

    // MARK: Life cycle

    /// Starts the source: the kernel watch is made, the registration
    /// handler (if any) is submitted, then events are delivered. Calling it
    /// again does nothing; so does calling it on a cancelled source (the
    /// cancel handler runs anyway). Any thread; never blocks.
    public func activate() {
        let (first, target, registration): (Bool, Target, Bool) = lock.withLock {
            guard !guarded.activated else { return (false, guarded.target, false) }
            guarded.activated = true
            // A source cancelled before activation never holds itself: its
            // cancel call may have run already.
            if !guarded.finished && !isCancelled { guarded.keepAlive = self }
            return (true, guarded.target, guarded.registrationHandler != nil)
        }
        guard first else { return }
        if !isCancelled, let watch {
            watch.start(for: self, at: Self.placement(for: target))
        }
        var s = state.load(ordering: .relaxed)
        while true {
            var next = s & ~State.inactive
            let claim = registration && s & (State.scheduled | State.cancelled) == 0
            if claim { next |= State.scheduled }
            let (done, seen) = state.compareExchange(
                expected: s, desired: next, ordering: .sequentiallyConsistent)
            if done {
                if claim { submit(.registration) } else { trySchedule() }
                return
            }
            s = seen
        }
    }

    /// Holds back event delivery until a matching `resume()`; counted. A
    /// handler call already running is not interrupted; events meanwhile are
    /// merged and delivered as one call after the last resume. Any thread;
    /// never blocks.
    public func suspend() {
        let old = state.wrappingAdd(State.suspension, ordering: .sequentiallyConsistent).oldValue
        require(State.suspensions(old) < (1 << 40), "EventSource.suspend(): suspended too many times (\(State.suspensions(old)))")
    }

    /// Undoes one `suspend()`; on an inactive source with no suspension,
    /// the same as `activate()`. Resuming more often than suspended (an
    /// active source) stops the process with a message. Any thread; never
    /// blocks.
    public func resume() {
        var s = state.load(ordering: .relaxed)
        while true {
            if State.suspensions(s) == 0 {
                if s & State.inactive != 0 {
                    activate()
                    return
                }
                misuse("EventSource.resume(): \(self) was resumed more often than it was suspended")
            }
            let (done, seen) = state.compareExchange(
                expected: s, desired: s - State.suspension, ordering: .sequentiallyConsistent)
            if done {
                if State.suspensions(s) == 1 { trySchedule() }
                return
            }
            s = seen
        }
    }

    /// Stops the source for good. Returns at once: a handler call already
    /// running finishes; a call not yet started is dropped; then the cancel
    /// handler runs once on the target and the source lets go of its
    /// handlers and of itself. The kernel watch is removed (its descriptor
    /// stays open: close it in the cancel handler). Idempotent; any thread;
    /// never blocks.
    public func cancel() {
        let old = state.bitwiseOr(State.cancelled, ordering: .sequentiallyConsistent).oldValue
        guard old & State.cancelled == 0 else { return }
        watch?.stop()
        trySchedule()
    }

    /// Changes where handlers run. Asynchronous: a call already submitted
    /// runs where it was submitted; events around the change may run on
    /// either target. Moving between loops, or between a loop and a queue,
    /// moves the kernel watch too. Any thread; never blocks.
    public func setTarget(_ target: Target) {
        if case .loop(_, let modes) = target {
            require(!modes.isEmpty, "EventSource.setTarget: the loop's `modes` is empty; the handler could never run")
        }
        let (old, activated): (Target, Bool) = lock.withLock {
            defer { guarded.target = target }
            return (guarded.target, guarded.activated)
        }
        guard activated, !isCancelled, let watch else { return }
        let before = Self.placement(for: old)
        let after = Self.placement(for: target)
        if !before.isSame(as: after) { watch.move(for: self, to: after) }
    }

    /// Where a kind's kernel watch lives for `target` (see `WatchPlacement`):
    /// on a loop target, in the loop's own backend (the signal and
    /// file-system registries may still have the reactor wait for a loop
    /// when the loop cannot have a descriptor of its own); on a queue
    /// target, in the standard pool's poller (the reactor only if the pool
    /// has none). Starts nothing.
    static func placement(for target: Target) -> WatchPlacement {
        switch target {
        case .loop(let loop, let modes):
            return .loop(loop, modes: modes)
        case .queue:
            if let poller = WorkerPool.standard.poller { return .pool(poller) }
            return .reactor
        }
    }

    // MARK: Calls

    /// Submits the call that the state allows, if any: the cancel call once
    /// cancelled (whatever the suspension), else an event call when an
    /// event is pending and the source is active and not suspended.
    private func trySchedule() {
        var s = state.load(ordering: .sequentiallyConsistent)
        while true {
            if s & State.scheduled != 0 { return }
            let call: Call
            var next = s | State.scheduled
            if s & State.cancelled != 0 {
                guard s & State.finishing == 0 else { return }
                call = .cancel
                next |= State.finishing
            } else {
                guard s & State.pending != 0, s & State.inactive == 0, State.suspensions(s) == 0 else { return }
                call = .event
            }
            let (done, seen) = state.compareExchange(
                expected: s, desired: next, ordering: .sequentiallyConsistent)
            if done {
                submit(call)
                return
            }
            s = seen
        }
    }

    private func submit(_ call: Call) {
        let target = lock.withLock { guarded.target }
        switch target {
        case .queue(let queue):
            queue.async { self.run(call) }
        case .loop(let loop, let modes):
            if !loop.perform(inModes: modes, { self.run(call) }) {
                // The loop's thread has exited: nothing will run there again.
                // The cancel call runs here, so that its handler still
                // closes what it must; other calls are dropped with their
                // events (`pending` cleared first, or the next call would be
                // submitted, and dropped, again without end).
                if call == .cancel {
                    run(call)
                } else {
                    state.bitwiseAnd(~State.pending, ordering: .sequentiallyConsistent)
                    _ = takeAccumulated()
                    finishCall()
                }
            }
        }
    }

    private func run(_ call: Call) {
        switch call {
        case .registration:
            let handler = lock.withLock { guarded.registrationHandler }
            handler?(self)
            finishCall()
        case .event:
            if state.load(ordering: .acquiring) & State.cancelled == 0 {
                // Clear `pending` before taking the data: an event merged
                // after this point sets it again and gets a call of its own.
                state.bitwiseAnd(~State.pending, ordering: .sequentiallyConsistent)
                if let value = watch.map({ $0.take(for: self) }) ?? nonZero(takeAccumulated()) {
                    current.store(value, ordering: .relaxed)
                    let handler = lock.withLock { guarded.eventHandler }
                    handler?(self)
                }
                if state.load(ordering: .acquiring) & State.cancelled == 0 {
                    watch?.handlerReturned(for: self)
                }
            }
            finishCall()
        case .cancel:
            let handler = lock.withLock {
                let handler = guarded.cancelHandler
                guarded.eventHandler = nil
                guarded.cancelHandler = nil
                guarded.registrationHandler = nil
                return handler
            }
            handler?(self)
            watch?.finish()
            // The last reference may go here; nothing of `self` is used after.
            let keptAlive = lock.withLock {
                defer {
                    guarded.keepAlive = nil
                    guarded.finished = true
                }
                return guarded.keepAlive
            }
            _ = keptAlive
        }
    }

    func nonZero(_ value: UInt64) -> UInt64? { value == 0 ? nil : value }

    /// For a timer source, how many times its timer has fired (the pool's
    /// timer heap or its loop timer woke for it) since it was activated;
    /// nil for other kinds. A test's count: a timer whose call is pending
    /// is disarmed and fires no more until the call has run. Never blocks.
    package var timerFirings: Int? { (watch as? TimerWatch)?.firingCount }

    /// Where the source's kernel watch is now: "loop" (its target loop's
    /// backend), "pool" (the pool's poller), "reactor" (the reactor
    /// thread); nil for a data source, an always-ready descriptor, a timer,
    /// and a watch that is not (or no longer) anywhere. A test's view.
    package var watchPlacementName: String? { watch?.placementName }

    /// Whether an event has been merged into the source and its call has
    /// not yet taken it (stale at once). A test's view: the event was taken
    /// from the kernel, whether or not a thread is free to run the call.
    package var hasPendingEvent: Bool { state.load(ordering: .acquiring) & State.pending != 0 }

    /// Runs `probe` in every move of a file-system source's watch
    /// (`setTarget`), between joining the new place and leaving the old
    /// one; nil removes it. A test's hook: a change made there must be
    /// delivered after the move.
    package static func setFileSystemMoveProbe(_ probe: (@Sendable () -> Void)?) {
        FileSystemWatch.moveProbe.withLock { $0 = probe }
    }

    /// Has the loops that next make a signal waiter or an inotify registry
    /// of their own (not the reactor) watch `descriptor` in place of its
    /// eventfd or instance (nil: their own again). A test's hook: given a
    /// descriptor a loop refuses (a regular file: always ready), the
    /// loop's refusal must fail the sources waiting there.
    package static func setLoopWatchSubstitute(_ descriptor: Int32?) {
        loopWatchSubstitute.withLock { $0 = descriptor }
    }

    /// See `setLoopWatchSubstitute`; read only when a loop's signal waiter
    /// or inotify registry makes its descriptor source.
    static let loopWatchSubstitute = LockedValue<Int32?>(nil)

    /// Ends a registration or event call and submits the next one, if any.
    private func finishCall() {
        state.bitwiseAnd(~State.scheduled, ordering: .sequentiallyConsistent)
        trySchedule()
    }

    public var description: String {
        switch kind {
        case .timer: "EventSource(timer)"
        case .read: "EventSource(read, descriptor \(handle))"
        case .write: "EventSource(write, descriptor \(handle))"
        case .signal: "EventSource(signal \(handle))"
        case .process: "EventSource(process \(handle))"
        case .fileSystemObject: "EventSource(file-system object, descriptor \(handle))"
        case .data(let merge): "EventSource(data, \(merge))"
        }
    }
}
