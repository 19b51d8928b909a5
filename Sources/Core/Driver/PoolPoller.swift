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
/// poller up before it runs what it found, and on the way pokes a parked
/// worker (or starts one, within the pool's width) to hold it in its place:
/// the eager hand-off of Tokio 1.52 (tokio-rs/tokio#8010), so the driver is
/// not left unattended while a CPU is free. The poked worker moves from its
/// futex to the poller and stays parked, without a permit
/// (`PoolWorker.pokeForPoller`). Hand-offs that prove wasted (the leaver
/// was back before the new holder ran anything: its calls are short) back
/// off, and are eager again as soon as one proves useful or events are
/// found waiting unattended (see `release`): a queue timer with a short
/// call costs one wake-up per firing, not two. Busy workers poll the
/// poller without blocking at each fair look (every 61st unit they take,
/// Tokio's `event_interval`, or about every 200 µs of long units) and when
/// they run dry, and the first worker to park waits in it again. The case
/// the hand-off does not cover (every worker computing, with no permit free
/// to hand it to, or hand-offs backed off while a call runs long) falls to
/// the pool's monitor (`PoolMonitor`, Go's `sysmon`, armed whenever a
/// worker runs): it polls the poller at each of its looks if nobody holds
/// it (`pollIfUnheld`), hands what it finds to the pool the ordinary way
/// and wakes a worker to hold it, so an event waits at most one monitor
/// period (10 ms) to be taken from the kernel. Its call then waits, like
/// any queued unit, for a worker to finish what it computes. No thread of
/// the event driver's own runs for queue sources. A worker that enters a
/// blocking wait while the poller is unheld also wakes another to hold it.
///
/// **Timers.** The holder sleeps until the first deadline without spinning
/// (`EventRegistry.spinsForPrecision` false): a queue timer fires one
/// wake-up late (tens of microseconds on a VM, a few on bare metal), as
/// Dispatch's do, for one wake-up of CPU. A loop's timers spin the learned
/// lead and fire within microseconds.
///
/// Every kind of queue source waits here: descriptors, timers (the
/// `TimerQueue` heap), process exits (their pidfds), and the process-wide
/// descriptors of the queue sources' signal and file-system registries
/// (an eventfd, an inotify instance: persistent registrations, re-armed by
/// the holder). Sources whose handlers run on a `ThreadLoop` wait on their
/// loop (file-system sources, whose inotify instance is shared, on the
/// reactor thread, as does the clock-set notice).
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
        /// that somebody comes to hold the poller. Returns whether it woke
        /// or started one (false: every permit taken, a holder already
        /// there or on its way).
        @discardableResult
        func wakeForPoller() -> Bool
        /// Whether the calling thread is one of the pool's workers.
        var isWorkerThread: Bool { get }
        /// The calling worker made hand-off `ticket` outside `release`
        /// (its unit scheduled a timer or registered a descriptor while
        /// nobody held the poller, see `needsHolder`): the worker keeps the
        /// ticket, and its return to the poller judges it (`leaverReturned`)
        /// as it judges a `release`'s.
        func noteHandOff(_ ticket: Int)
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
    /// The hand-off's back-off (see `release`): hand-offs skipped between
    /// two made (0: every one is made), the count skipped since the last
    /// one, the ticket of the hand-off whose use is not known yet (0:
    /// none), the count of tickets handed out, and of those withdrawn
    /// (nobody could be woken). Hints, relaxed,
    /// on a line of their own: written by workers as they leave the poller
    /// or come back, and by holders that ran something.
    private let handOffBackoff: UnsafeMutablePointer<Int>
    private let handOffsSkipped: UnsafeMutablePointer<Int>
    private let pendingHandOff: UnsafeMutablePointer<Int>
    private let handOffCount: UnsafeMutablePointer<Int>
    private let handOffsWithdrawn: UnsafeMutablePointer<Int>
    /// The holder's reports of its current wait.
    private var events: [ReadyEvent] = []

    init(pool: any Workers) {
        self.pool = pool
        let words = allocateStableWords(byteCount: 192)
        holdWord = words.assumingMemoryBound(to: Int.self)
        watchCount = (words + 64).assumingMemoryBound(to: Int.self)
        handOffBackoff = (words + 128).assumingMemoryBound(to: Int.self)
        handOffsSkipped = (words + 136).assumingMemoryBound(to: Int.self)
        pendingHandOff = (words + 144).assumingMemoryBound(to: Int.self)
        handOffCount = (words + 152).assumingMemoryBound(to: Int.self)
        handOffsWithdrawn = (words + 160).assumingMemoryBound(to: Int.self)
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
        // A queue timer sleeps until its deadline: one wake-up per firing,
        // no spin (loops spin for precision; see `spinsForPrecision`).
        registry.spinsForPrecision = false
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
    /// poller, a parked worker (or a new one) so that somebody does. On a
    /// worker of the pool (a repeating timer scheduled again by its own
    /// call, a source made by an item), that wake-up is a hand-off like
    /// the one `release` makes, and backs off with it: the worker is back
    /// at the poller when its unit ends, as after any hand-off, so a
    /// worker woken for a timer whose call is short was woken for nothing
    /// (its leaver came back first), and the same bound holds if the unit
    /// runs long. A repeating timer's holder finds nothing watched when it
    /// leaves (the timer is out of the heap until its call has run), so
    /// this is the hand-off its firings make.
    private func needsHolder() {
        if AtomicMemory.load(from: holdWord, ordering: .sequentiallyConsistent) != 0 {
            wake()
        } else if pool.isWorkerThread {
            let ticket = handOff(counted: true)
            if ticket != 0 { pool.noteHandOff(ticket) }
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
        // What it found waited with nobody at the poller: hand-offs are
        // eager again from now on.
        if ran { resetHandOffBackoff() }
        release(handingOff: false)
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

    /// Gives the poller up, and hands it on: if something is watched, pokes
    /// a parked worker, or starts one within the pool's width, to hold it.
    /// The sequentially consistent store pairs with the parking worker's,
    /// which adds itself to the idle list under the pool's lock and then
    /// tries to hold: either the waker finds it idle, or it finds the
    /// poller free. With every permit taken the waker does nothing, and the
    /// pool's monitor polls instead.
    ///
    /// `handingOff`: a worker leaves the poller to run what it found (or
    /// goes on searching after a look without waiting). Its hand-off is
    /// eager (Tokio 1.52, tokio-rs/tokio#8010) while hand-offs prove
    /// useful, and backs off while they do not:
    /// - A hand-off is *useful* when the worker that took the poller over
    ///   ran something it found before the leaver came back
    ///   (`holderDispatched`), *wasted* when the leaver came back first
    ///   (`leaverReturned`, with the ticket this returns): its calls were
    ///   short, and the wake-up bought nothing.
    /// - Wasted hand-offs back off as the pool's slot announcements do
    ///   (`NextUnitSlot.announcesFill`): one made in 2, then in 4, 8, 16,
    ///   up to one in `maximumHandOffBackoff + 1`. A useful one, or a look
    ///   that finds events that waited with nobody at the poller (a
    ///   worker's look without waiting, the monitor's), makes them eager
    ///   again.
    /// So short calls (a timer's tick) cost one wake-up per event, not two,
    /// and calls that let others' events come meanwhile keep a holder at
    /// the poller. While backed off, an event that comes during a long call
    /// waits for the call's end or the monitor's next look (10 ms), once.
    ///
    /// `ranNothing`: the release ends a look without waiting that found
    /// nothing, and the worker goes on searching (and parks at the poller
    /// if it finds no work). Its hand-off is made only while hand-offs are
    /// eager, and it does not count toward the back-off: each event passes
    /// the back-off once, when its holder leaves to run it, not again at
    /// that worker's look once the call returned (which made the bound one
    /// hand-off in about 33 events instead of 65).
    ///
    /// Returns the hand-off's ticket (0: none made).
    @discardableResult
    func release(handingOff: Bool = true, ranNothing: Bool = false) -> Int {
        AtomicMemory.store(0, to: holdWord, ordering: .sequentiallyConsistent)
        guard wantsHolder else { return 0 }
        guard handingOff else {
            pool.wakeForPoller()
            return 0
        }
        return handOff(counted: !ranNothing)
    }

    /// Makes a hand-off if one is due (`handOffDue`): a ticket, pending
    /// until judged, and a worker woken to hold the poller. Returns the
    /// ticket, or 0 when none was due or nobody could be woken.
    private func handOff(counted: Bool) -> Int {
        guard handOffDue(counted: counted) else { return 0 }
        // Pending before the wake-up, so that the woken holder finds it;
        // withdrawn if nobody was woken (no permit free, a holder already
        // on its way): no wake-up, nothing to judge. (`add` returns the
        // new count: never 0.)
        let ticket = AtomicMemory.add(1, to: handOffCount, ordering: .relaxed)
        AtomicMemory.store(ticket, to: pendingHandOff, ordering: .relaxed)
        if pool.wakeForPoller() { return ticket }
        _ = AtomicMemory.compareAndSwap(expected: ticket, desired: 0, at: pendingHandOff, ordering: .relaxed)
        AtomicMemory.add(1, to: handOffsWithdrawn, ordering: .relaxed)
        return 0
    }

    /// The most hand-offs skipped between two made: a pool whose hand-offs
    /// keep being wasted still makes one in 65, to find out whether its
    /// calls have grown long.
    static let maximumHandOffBackoff = 64

    /// Whether this hand-off is made (see `release`). Not `counted` (a
    /// look that ran nothing): only while hand-offs are eager, and it
    /// leaves the count of those skipped alone.
    private func handOffDue(counted: Bool) -> Bool {
        let backoff = AtomicMemory.load(from: handOffBackoff, ordering: .relaxed)
        if backoff == 0 { return true }
        guard counted else { return false }
        let skipped = AtomicMemory.add(1, to: handOffsSkipped, ordering: .relaxed)
        if skipped <= backoff { return false }
        AtomicMemory.store(0, to: handOffsSkipped, ordering: .relaxed)
        return true
    }

    /// A holder's wait ran something: if a hand-off is pending, it was
    /// useful, and hand-offs are eager again.
    func holderDispatched() {
        guard AtomicMemory.load(from: pendingHandOff, ordering: .relaxed) != 0,
              AtomicMemory.exchange(0, at: pendingHandOff, ordering: .relaxed) != 0
        else { return }
        resetHandOffBackoff()
    }

    /// The worker that made hand-off `ticket` is back at the poller (or
    /// looks at it) before the holder it woke ran anything: the hand-off
    /// was wasted, and the next ones back off further.
    func leaverReturned(_ ticket: Int) {
        guard AtomicMemory.load(from: pendingHandOff, ordering: .relaxed) == ticket,
              AtomicMemory.compareAndSwap(expected: ticket, desired: 0, at: pendingHandOff, ordering: .relaxed)
        else { return }
        let backoff = AtomicMemory.load(from: handOffBackoff, ordering: .relaxed)
        AtomicMemory.store(min(backoff * 2 + 1, Self.maximumHandOffBackoff), to: handOffBackoff, ordering: .relaxed)
    }

    /// Hand-offs are eager again (see `release`).
    func resetHandOffBackoff() {
        if AtomicMemory.load(from: handOffBackoff, ordering: .relaxed) != 0 {
            AtomicMemory.store(0, to: handOffBackoff, ordering: .relaxed)
        }
    }

    /// The hand-offs' current back-off (tests).
    var handOffBackoffForTesting: Int { AtomicMemory.load(from: handOffBackoff, ordering: .relaxed) }

    /// Whether a worker holds the poller and sleeps in its wait now (not
    /// a look without waiting), stale at once (tests).
    var holderSleepsForTesting: Bool {
        isHeld && (lock.withLock { state }?.registry.wakeState.isSleepingForTesting ?? false)
    }

    /// The hand-offs made so far (a worker woken; not those withdrawn
    /// because nobody could be), and whether one waits to be judged
    /// (tests).
    var handOffsForTesting: (made: Int, pending: Bool) {
        (AtomicMemory.load(from: handOffCount, ordering: .relaxed)
            - AtomicMemory.load(from: handOffsWithdrawn, ordering: .relaxed),
         AtomicMemory.load(from: pendingHandOff, ordering: .relaxed) != 0)
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
        EventRegistry.prepareForFork()
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
        AtomicMemory.store(0, to: handOffBackoff, ordering: .relaxed)
        AtomicMemory.store(0, to: handOffsSkipped, ordering: .relaxed)
        AtomicMemory.store(0, to: pendingHandOff, ordering: .relaxed)
    }
}
