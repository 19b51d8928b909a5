import Synchronization

/// The kernel watches of event sources whose handlers run on work queues,
/// waited on by an idle worker of the standard pool rather than by a thread
/// of their own (the I/O driver of Tokio's scheduler, the netpoller of
/// Go's).
///
/// A worker about to park takes the poller if nobody holds it, and then
/// sleeps in the poller's wait (an epoll `EventRegistry` and the next timer
/// deadline) instead of on its futex. When a descriptor is ready or a timer
/// due, the same thread merges the event into its source, whose call goes to
/// the worker's own next-unit slot, gives the poller up, and runs the call:
/// one wake-up per event, where a reactor thread that hands each call to a
/// worker costs two (the reactor's, then the worker's). Submitting work to
/// the pool wakes a worker that holds the poller through the registry's wake
/// word instead of its futex (`PoolWorker.unpark`).
///
/// **Nobody left at the poller.** A holder that finds events gives the
/// poller up before it runs what it found, and on the way wakes a parked
/// worker (or starts one, within the pool's width) to hold it in its place:
/// the eager hand-off of Tokio 1.52 (tokio-rs/tokio#8010), so the driver is
/// never left unattended while a CPU is free. Busy workers poll it without
/// blocking at each fair look (every 61st unit they take, Tokio's
/// `event_interval`, or about every 200 µs of long units) and when
/// they run dry, and the first worker to park waits in it again. The one
/// case the hand-off cannot cover is every worker computing, with no permit
/// free to hand it to: then the pool's monitor (`PoolMonitor`, Go's
/// `sysmon`, armed whenever a worker runs) polls the poller at each of its
/// looks if nobody holds it (`pollIfUnheld`), hands what it finds to the
/// pool the ordinary way and wakes a worker to hold it, so an event waits
/// at most one monitor period (10 ms) to be taken from the kernel. Its
/// call then waits, like any queued unit, for a worker to finish what it
/// computes. No thread of the event driver's own runs for queue sources.
/// A worker that enters a blocking wait while the poller is unheld also
/// wakes another to hold it.
/// Every kind of queue source waits here: descriptors, timers (the
/// `TimerQueue` heap), process exits (their pidfds), and the process-wide
/// descriptors of the queue sources' signal and file-system registries
/// (an eventfd, an inotify instance: persistent registrations, re-armed by
/// the holder). Sources whose handlers run on a `ThreadLoop` wait on their
/// loop (or, process-wide, on the reactor thread), as does the clock-set
/// notice.
///
/// **Threads.** `register`, `rearm`, `deregister`, `wake` and
/// `timersChanged` from any thread. `waitAndDispatch` only by the holder
/// (`tryHold` / `release`: an acquiring compare-and-swap and a sequentially
/// consistent store of one word, so each holder sees what the one before it
/// did).
final class PoolPoller: @unchecked Sendable {
    // @unchecked: `state` and `timers` are set under `lock`; a
    // `State` guards its own handlers with `lock` too; `events` is the
    // holder's; the words are atomic.

    /// What the holder calls for the timers (the event sources' timer queue,
    /// a layer above): the latest moment it must wake, and firing what is due.
    protocol Timers: AnyObject, Sendable {
        /// The heap's first deadline, or nil.
        func nextDeadline() -> MonotonicClock.Instant?
        /// Fires every entry that is due; true if any fired.
        func fireDue() -> Bool
    }

    /// A descriptor registration's handler: runs on the holder with the
    /// report (readiness, or a failure of the kernel watch).
    typealias Handler = @Sendable (ReadyEvent) -> Void

    /// A registration's handler, and whether the holder re-arms it itself
    /// after each report (a process-wide descriptor that is always watched:
    /// the signals' eventfd, the inotify instance) rather than its owner.
    struct Registration {
        let handler: Handler
        let persistent: Bool
    }

    /// One epoll registry and its handlers. A child after `fork()` leaves
    /// the parent's (its epoll instance is the parent's too) and makes its
    /// own; a watch registered with the parent's keeps pointing at it and
    /// finds it retired.
    final class State: @unchecked Sendable {
        // @unchecked: `handlers` under the poller's lock; `retired` atomic.
        let registry: EventRegistry
        var handlers: [UInt64: Registration] = [:]
        /// Set in a child after `fork()`, read by every re-arm: an atomic,
        /// so the re-arm path takes no lock.
        let retired = Atomic<Bool>(false)

        init(registry: EventRegistry) {
            self.registry = registry
        }
    }

    /// What the poller asks of the pool whose workers hold it (the Queues
    /// layer, above this one, implements it: `WorkerPool`).
    protocol Workers: AnyObject, Sendable {
        /// Wakes a parked worker, or starts one within the pool's bound, so
        /// that somebody comes to hold the poller.
        func wakeForPoller()
    }

    /// The pool whose workers hold it. Unowned: the pool owns the poller,
    /// and pools live for the rest of the process.
    private unowned(unsafe) let pool: any Workers
    private let lock = GuardLock()
    private var state: State?
    private var timers: Timers?
    /// 1 while a worker holds the poller.
    private let holdWord: UnsafeMutablePointer<Int>
    /// Registrations plus pending timer entries: whether a worker should
    /// wait here at all. Atomic; stale at once.
    private let watchCount: UnsafeMutablePointer<Int>
    /// The holder's reports of its current wait.
    private var events: [ReadyEvent] = []

    init(pool: any Workers) {
        self.pool = pool
        let words = allocateStableWords(byteCount: 128)
        holdWord = words.assumingMemoryBound(to: Int.self)
        watchCount = (words + 64).assumingMemoryBound(to: Int.self)
    }

    // MARK: Registrations (any thread)

    /// The current registry, made on first use, and the timer queue, in one
    /// hold of the lock. Throws when the kernel refuses an epoll instance
    /// (out of descriptors or memory): the registration that asked fails
    /// with it, and the next one tries again.
    private func current() throws(SystemCallError) -> (state: State, timers: Timers?) {
        lock.lock()
        defer { lock.unlock() }
        if let state { return (state, timers) }
        let registry = try EventRegistry(kind: .epoll)
        // Handlers re-arm their watches while the holder waits: it stays
        // in epoll_wait, where each re-arm reaches it without a wake-up.
        registry.waitsInKernelWhileRegistered = true
        let made = State(registry: registry)
        state = made
        return (made, timers)
    }

    /// Makes the registry now if there is none, so that the holder can wait
    /// for a timer: the timer queue calls it before its first entry. Throws
    /// what the kernel says when it refuses the epoll instance.
    func prepare() throws(SystemCallError) {
        _ = try current()
    }

    /// Watches `fd` for `interest` (one-shot: re-armed with `rearm`; or,
    /// `persistent`, re-armed by the holder after each report's handler
    /// returned); `handler` runs on the worker that sees the report. Returns the state
    /// and token that name the registration. Throws what the registry
    /// throws for a descriptor that cannot be waited on.
    func register(
        _ fd: Int32, for interest: Readiness, persistent: Bool = false, _ handler: @escaping Handler
    ) throws(DescriptorWatchError) -> (State, UInt64) {
        let state: State
        do throws(SystemCallError) {
            state = try current().state
        } catch {
            throw DescriptorWatchError(descriptor: fd, reason: .kernelRefused, code: error.code)
        }
        let token = try state.registry.register(fd, for: interest)
        lock.withLock { state.handlers[token] = Registration(handler: handler, persistent: persistent) }
        AtomicMemory.add(1, to: watchCount, ordering: .sequentiallyConsistent)
        // The holder applies the registration at its next wait: wake it, or
        // find a worker to hold the poller.
        needsHolder()
        return (state, token)
    }

    /// Arms `token` again after its report. On epoll the kernel learns of
    /// it at once; a holder asleep in epoll_wait sees it without a wake-up.
    func rearm(_ token: UInt64, in state: State) {
        guard !state.retired.load(ordering: .relaxed) else { return }
        if state.registry.rearmNow(token) { state.registry.wake() }
    }

    /// Ends the registration: once this returns, `handler` is not called
    /// again for it (a report already taken runs only if looked up before).
    func deregister(_ token: UInt64, in state: State) {
        let removed = lock.withLock { state.handlers.removeValue(forKey: token) }
        guard removed != nil else { return }
        AtomicMemory.add(-1, to: watchCount, ordering: .sequentiallyConsistent)
        state.registry.deregister(token)
        // The kernel watch goes at the holder's next wait; wake it so that a
        // descriptor closed right after this is not still watched then.
        state.registry.wake()
    }

    // MARK: Timers (any thread)

    /// Installs the timer queue (once, by the event sources' layer).
    func install(_ timers: Timers) {
        lock.withLock { self.timers = timers }
    }

    /// The timer queue gained `added` entries (negative: lost them) and
    /// perhaps a new first deadline: the holder recomputes its wait.
    func timersChanged(added: Int, newFirst: Bool) {
        if added != 0 { AtomicMemory.add(added, to: watchCount, ordering: .sequentiallyConsistent) }
        if newFirst { needsHolder() }
    }

    /// Wakes the holder so that it looks again, or, when nobody holds the
    /// poller, a parked worker (or a new one) so that somebody does.
    private func needsHolder() {
        if AtomicMemory.load(from: holdWord, ordering: .sequentiallyConsistent) != 0 {
            wake()
        } else {
            pool.wakeForPoller()
        }
    }

    /// The pool's monitor, at a look while a worker runs: if something is
    /// watched and nobody holds the poller (every worker computes, or the
    /// hand-off found no permit free), polls it without waiting (the calls
    /// go to the pool from a thread outside it), gives it up and wakes a
    /// worker to hold it if a permit is free. Returns whether it ran
    /// anything. The monitor's look is the only thread outside the pool
    /// that ever holds the poller, and for one non-blocking wait only.
    @discardableResult
    func pollIfUnheld() -> Bool {
        guard wantsHolder, tryHold() else { return false }
        let ran = waitAndDispatch(block: false)
        release()
        return ran
    }

    /// Whether anything is watched (stale at once).
    var isWatching: Bool { AtomicMemory.load(from: watchCount, ordering: .sequentiallyConsistent) > 0 }

    /// Whether a worker holds the poller (stale at once).
    var isHeld: Bool { AtomicMemory.load(from: holdWord, ordering: .sequentiallyConsistent) != 0 }

    /// Something is watched and nobody holds the poller: a worker should be
    /// woken to hold it (stale at once).
    var wantsHolder: Bool { isWatching && !isHeld }

    /// Makes the holder's wait return (or its next one, at once).
    func wake() {
        lock.withLock { state }?.registry.wake()
    }

    // MARK: The holder

    /// Takes the poller; false if another worker holds it.
    func tryHold() -> Bool {
        AtomicMemory.load(from: holdWord, ordering: .relaxed) == 0
            && AtomicMemory.compareAndSwap(expected: 0, desired: 1, at: holdWord, ordering: .acquiring)
    }

    /// Gives the poller up, and hands it on (the eager hand-off): if
    /// something is watched, wakes a parked worker, or starts one within the
    /// pool's width, to hold it. The sequentially consistent store pairs
    /// with the parking worker's, which adds itself to the idle list under
    /// the pool's lock and then tries to hold: either the waker finds it
    /// idle, or it finds the poller free. With every permit taken the
    /// waker does nothing, and the pool's monitor polls instead.
    func release() {
        AtomicMemory.store(0, to: holdWord, ordering: .sequentiallyConsistent)
        if wantsHolder { pool.wakeForPoller() }
    }

    /// Holder only: waits for a report, a due timer, a wake or `notAfter`
    /// (`block` false: only looks), then runs the handlers of what it found
    /// and fires the due timers. Returns whether anything ran.
    func waitAndDispatch(block: Bool, notAfter: MonotonicClock.Instant? = nil) -> Bool {
        // Something is watched only after a registry was made (`register`,
        // `prepare`), so this finds one; if not (a child just forked), there
        // is nothing to wait for.
        guard let (state, timers) = try? current() else { return false }
        var deadline = timers?.nextDeadline()
        if let notAfter, deadline.map({ notAfter < $0 }) ?? true { deadline = notAfter }
        if !block { deadline = MonotonicClock.Instant(nanoseconds: 0) }
        events.removeAll(keepingCapacity: true)
        _ = state.registry.wait(until: deadline, events: &events)
        var ran = false
        for event in events {
            guard let registration = lock.withLock({ state.handlers[event.token] }) else { continue }
            registration.handler(event)
            // On the holder, the registry's owner: applied at its next wait.
            if registration.persistent && event.failure == nil { state.registry.rearm(event.token) }
            ran = true
        }
        if let timers, timers.fireDue() { ran = true }
        return ran
    }

    // MARK: Fork

    /// In the parent, before `fork()`: the generic types of the poller's
    /// code (`ForkHandlers.makeMetadata`).
    static func prepareForFork() {
        ForkHandlers.makeMetadata(
            Registration?.self, State?.self, MonotonicClock.Instant?.self,
            [UInt64: Registration].self, (UInt64, Registration).self,
            [ReadyEvent].self, IndexingIterator<[ReadyEvent]>.self)
        ForkHandlers.makeMetadata(ofNoncopyable: Atomic<Bool>.self)
        ForkHandlers.makeConformance(collection: [ReadyEvent].self)
    }

    /// In a child after `fork()`: the parent's epoll instance is shared with
    /// the parent, so the child leaves it (its registrations retired, not
    /// released: their teardown would act on the parent's watches) and makes
    /// its own at its next registration. Nobody holds the poller.
    func childAfterFork() {
        lock.reinitializeAfterFork()
        if let state {
            state.retired.store(true, ordering: .relaxed)
            _ = Unmanaged.passRetained(state)
        }
        state = nil
        AtomicMemory.store(0, to: holdWord, ordering: .relaxed)
        AtomicMemory.store(0, to: watchCount, ordering: .relaxed)
    }
}
