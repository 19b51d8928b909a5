/// The watch of a timer source. It keeps the schedule (start + n ×
/// interval, on the monotonic or the wall clock) and counts the due times
/// that have passed, so missed periods merge into one call whose data says
/// how many.
///
/// - For a source on a work queue, the timer is an entry in the
///   `TimerQueue` (the pool's timer heap, shared with `async(after:)`,
///   whose first deadline is that of the pool worker that waits in the
///   pool's poller), with the window [due time, due time + leeway].
/// - For a source on a run loop, it is a chain of one-shot `LoopTimer`s in
///   that loop's own timers, so that it fires only in the loop's modes.
///
/// **Disarmed while its call is pending.** A firing hands the due times
/// passed to the source and arms nothing: the timer stays disarmed until
/// the handler call that firing asked for has run (`handlerReturned`),
/// whatever holds that call back (a suspended source, a suspended or busy
/// queue, a slow handler). The call counts the due times that passed
/// meanwhile when it starts (`take`), so its data is every due time since
/// the previous call, as libdispatch counts a timer's missed firings; and a
/// timer whose call cannot start costs no wake-up at all. Each arming fires
/// at most once; a firing that finds nothing due (a wall-clock time
/// translated early, or due times a call already counted) arms again at
/// once instead.
///
/// A wall-clock due time is translated to the monotonic clock when it is
/// scheduled, and checked against the wall clock when it fires (never
/// early). While a wall-clock timer is active, `WallClockRegistry` has the
/// kernel report each setting of the system time; the timer is then
/// translated again at once, with a new arming (its queue entry or loop
/// timer of the old one fires no more): set forward past its due time, it
/// fires at once, counting the periods passed; set back, it waits for its
/// due time on the wall clock.
///
/// Schedules are counted in `Int64` nanoseconds on their clock (a wall-clock
/// start from 1677 to 2262); the arithmetic between two of them is done in
/// `Int128`, so a start long past (near `Int64.min`) counts its periods
/// without overflow.
final class TimerWatch: SourceWatch, TimerQueue.Owner, @unchecked Sendable {
    // @unchecked: everything mutable is guarded by `lock`.

    let start: EventSource.TimerStart
    let interval: Duration?
    /// The leeway used: the one asked for, but at most half the interval
    /// for a repeating timer (see `EventSource.timer`).
    let leeway: Duration
    private let period: Int64?

    private let lock = GuardLock()
    private weak var source: EventSource?
    /// Where the last start put the watch; a wall-clock timer is started
    /// there again when the system time is set, and every timer is armed
    /// there again after its call.
    private var place: WatchPlacement?
    private var timer: LoopTimer?
    private var stopped = false
    /// Bumped by each start (and so by `move`), by a clock setting and by
    /// `stop`: timers and queue entries of an older arming fire no more.
    private var arming = 0
    /// The timer fired and is disarmed until the call it asked for has run.
    private var awaitingCall = false
    /// The next due time, in nanoseconds on the schedule's clock; `.max`
    /// once a one-shot has fired.
    private var due: Int64
    /// How many times the heap or a loop timer fired this watch (a test's
    /// count of wake-ups spent on it).
    private var firings = 0
    var firingCount: Int { lock.withLock { firings } }

    /// `start` is checked by `EventSource.timer` (`nanoseconds(_:)`).
    init(start: EventSource.TimerStart, interval: Duration?, leeway: Duration) {
        self.start = start
        self.interval = interval
        self.leeway = interval.map { min(leeway, $0 / 2) } ?? leeway
        period = interval.map(\.nanosecondsSaturating)
        switch start {
        case .monotonic(let first): due = first.nanoseconds
        case .wall(let first): due = Self.nanoseconds(first) ?? .max  // after 2262: never
        }
    }

    private var isWall: Bool {
        if case .wall = start { return true }
        return false
    }

    /// The schedule clock's current time.
    private func now() -> Int64 {
        isWall ? (Self.nanoseconds(WallClock.now) ?? .max) : MonotonicClock.now.nanoseconds
    }

    /// `due` on the monotonic clock. Under `lock`.
    private func monotonicDue() -> Int64 {
        isWall ? Self.wallInstant(due).monotonicInstant.nanoseconds : due
    }

    /// How many due times have passed at `now` (0 if none yet), moving the
    /// next due time past `now` (start + n × interval; `.max` past what
    /// `Int64` counts). Under `lock`.
    private func consume(now: Int64) -> UInt64 {
        guard now >= due else { return 0 }
        guard let period else {
            due = .max
            return 1
        }
        // In Int128: `now - due` exceeds Int64 for a start near Int64.min.
        let periods = (Int128(now) - Int128(due)) / Int128(period) + 1
        let next = Int128(due) + periods * Int128(period)
        due = next >= Int128(Int64.max) ? .max : Int64(next)
        return UInt64(clamping: periods)
    }

    func start(for source: EventSource, at placement: WatchPlacement) {
        let arming: Int? = lock.withLock { () -> Int? in
            guard !stopped else { return nil }
            self.source = source
            place = placement
            self.arming += 1
            // A call still pending from before a move may never run where it
            // was submitted (a loop whose thread exited): arm here anyway.
            awaitingCall = false
            return due == .max ? nil : self.arming
        }
        guard let arming else { return }
        if isWall {
            // Before the due time is translated, so that a clock set after
            // the translation is reported (and translates it again).
            do throws(EventSourceError) {
                try WallClockRegistry.shared.add(self)
            } catch {
                source.fail(error)
                return
            }
        }
        arm(arming: arming, at: placement)
    }

    /// Arms the timer where it lives: an entry of the pool's timer heap, or
    /// a one-shot timer on the loop (the target's or the reactor's).
    private func arm(arming: Int, at placement: WatchPlacement) {
        do throws(EventSourceError) {
            if let (loop, modes) = try placement.loopAndModes() {
                armOnLoop(arming: arming, on: loop, modes: modes)
            } else {
                try scheduleInQueue(arming: arming)
            }
        } catch {
            lock.withLock { source }?.fail(error)
        }
    }

    // MARK: Fork

    /// The generic types and conformances of this file's code, made in the
    /// parent before `fork()` (see `EventReactor.prepareForFork`).
    static func prepareForFork() {
        ForkHandlers.makeMetadata(
            EventSource?.self, LoopTimer?.self, [ObjectIdentifier: TimerWatch].Values.self,
            [ObjectIdentifier: TimerWatch].self, (ObjectIdentifier, TimerWatch).self, [TimerWatch].self,
            [LoopMode].self, (arming: Int, at: WatchPlacement, old: LoopTimer?)?.self,
            (arming: Int, at: WatchPlacement)?.self, Int?.self, IndexingIterator<[TimerWatch]>.self,
            IndexingIterator<[LoopMode]>.self, (due: Int64, latest: Int64)?.self, Int64?.self,
            (UInt64, EventSource?, Bool).self, (UInt64, Bool).self, Duration?.self)
        ForkHandlers.makeConformance(hashable: Firing.self)
        ForkHandlers.makeConformance(equatable: Firing.self)
        ForkHandlers.makeConformance(error: EventSourceError.self)
        ForkHandlers.makeConformance(binaryInteger: Int.self)
        ForkHandlers.makeConformance(sequence: [ObjectIdentifier: TimerWatch].Values.self)
        ForkHandlers.makeConformance(collection: [TimerWatch].self)
        ForkHandlers.makeConformance(collection: [LoopMode].self)
        ForkHandlers.makeConformance(binaryInteger: Int32.self)
        ForkHandlers.makeConformance(binaryInteger: Int64.self)
        ForkHandlers.makeConformance(binaryInteger: Int128.self)
        ForkHandlers.makeConformance(fixedWidthInteger: UInt64.self)
    }

    // MARK: Firing

    /// What a firing found.
    private enum Firing {
        /// Of an older arming, or after `stop`: nothing.
        case stale
        /// Nothing was due: arm again.
        case early
        /// Due times passed: handed to the source; disarmed until its call.
        case fired
    }

    /// Counts the due times passed and hands them to the source, leaving
    /// the timer disarmed until the source's call has run (`handlerReturned`).
    private func fire(arming: Int) -> Firing {
        let (count, source, ended): (UInt64, EventSource?, Bool) = lock.withLock {
            guard !stopped, arming == self.arming else { return (0, nil, false) }
            firings += 1
            timer = nil
            let count = consume(now: now())
            if count > 0 { awaitingCall = true }
            return (count, self.source, due == .max)
        }
        guard let source else { return .stale }
        guard count > 0 else { return .early }
        // No due time is left: a clock change can no longer matter.
        if ended && isWall { WallClockRegistry.shared.remove(self) }
        source.add(count)
        return .fired
    }

    /// The data of the call about to run: the due times the firing counted
    /// plus those that passed while the call waited. On the target.
    func take(for source: EventSource) -> UInt64? {
        let (missed, ended): (UInt64, Bool) = lock.withLock {
            guard !stopped, due != .max else { return (0, false) }
            let missed = consume(now: now())
            return (missed, due == .max)
        }
        if ended && isWall { WallClockRegistry.shared.remove(self) }
        return source.nonZero(source.takeAccumulated() &+ missed)
    }

    /// The call a firing asked for has run: arm for the next due time,
    /// which is in the past if the call took longer than a period (the
    /// timer then fires at once, counting those). On the target.
    func handlerReturned(for source: EventSource) {
        let rearm: (arming: Int, at: WatchPlacement)? = lock.withLock {
            guard awaitingCall, !stopped, let place else { return nil }
            awaitingCall = false
            return due == .max ? nil : (arming, place)
        }
        guard let rearm else { return }
        arm(arming: rearm.arming, at: rearm.at)
    }

    // MARK: In the timer queue

    private func scheduleInQueue(arming: Int) throws(EventSourceError) {
        let window: (due: Int64, latest: Int64)? = lock.withLock {
            guard !stopped, arming == self.arming, due != .max else { return nil }
            let due = monotonicDue()
            let (sum, overflow) = due.addingReportingOverflow(leeway.nanosecondsSaturating)
            return (due, overflow ? .max : sum)
        }
        guard let window else { return }
        do throws(SystemCallError) {
            try TimerQueue.shared.schedule(self, due: window.due, latest: window.latest, arming: arming)
        } catch {
            throw .systemCall(error)
        }
    }

    /// The `TimerQueue` reached this watch's entry (on the pool worker that
    /// holds the poller).
    func fireFromQueue(arming: Int) {
        guard fire(arming: arming) == .early else { return }
        do throws(EventSourceError) {
            try scheduleInQueue(arming: arming)
        } catch {
            lock.withLock { source }?.fail(error)
        }
    }

    // MARK: On a run loop

    /// One link of the chain on a loop: a one-shot timer at the monotonic
    /// time of the next due time (translated, for a wall-clock schedule).
    private func armOnLoop(arming: Int, on loop: ThreadLoop, modes: [LoopMode]) {
        let fireAt: Int64? = lock.withLock {
            stopped || arming != self.arming || due == .max ? nil : monotonicDue()
        }
        guard let fireAt else { return }
        let made = LoopTimer(fireAt: MonotonicClock.Instant(nanoseconds: fireAt), tolerance: leeway) { [weak self] _ in
            guard let self, self.fire(arming: arming) == .early else { return }
            self.armOnLoop(arming: arming, on: loop, modes: modes)
        }
        install(made, arming: arming, on: loop, modes: modes)
    }

    private func install(_ made: LoopTimer, arming: Int, on loop: ThreadLoop, modes: [LoopMode]) {
        let current: Bool = lock.withLock {
            guard !stopped, arming == self.arming else { return false }
            timer = made
            return true
        }
        guard current else { return }
        for mode in modes { loop.add(made, forMode: mode) }
    }

    // MARK: Moving and stopping

    func move(for source: EventSource, to placement: WatchPlacement) {
        let old: LoopTimer? = lock.withLock {
            defer { timer = nil }
            return timer
        }
        old?.invalidate()
        start(for: source, at: placement)
    }

    func stop() {
        let old: LoopTimer? = lock.withLock {
            stopped = true
            arming += 1
            defer { timer = nil }
            return timer
        }
        old?.invalidate()
        if isWall { WallClockRegistry.shared.remove(self) }
    }

    /// Whether a due time is left (not stopped, not a one-shot that fired).
    fileprivate var hasDueTime: Bool { lock.withLock { !stopped && due != .max } }

    /// The system time was set: translates the next due time again, at
    /// once, under a new arming (on the reactor, from `WallClockRegistry`).
    /// A timer disarmed until its call is left so: the call counts with the
    /// clock as it is then, and arms the translation after it.
    fileprivate func clockWasSet() {
        let restart: (arming: Int, at: WatchPlacement, old: LoopTimer?)? = lock.withLock {
            guard !stopped, !awaitingCall, due != .max, let place else { return nil }
            arming += 1
            defer { timer = nil }
            return (arming, place, timer)
        }
        guard let restart else { return }
        restart.old?.invalidate()
        arm(arming: restart.arming, at: restart.at)
    }

    /// `instant` in nanoseconds since 1970; nil where `Int64` cannot count
    /// them (before 1677-09-21 or after 2262-04-11).
    static func nanoseconds(_ instant: WallClock.Instant) -> Int64? {
        Int64(exactly: Int128(instant.secondsSinceEpoch) * 1_000_000_000 + Int128(instant.nanoseconds))
    }

    /// Nanoseconds since 1970 as a wall-clock instant: whole seconds rounded
    /// down (toward the past), so the nanoseconds within the second are
    /// never negative, before 1970 as after it.
    private static func wallInstant(_ ns: Int64) -> WallClock.Instant {
        let (seconds, nanoseconds) = ns.quotientAndRemainder(dividingBy: 1_000_000_000)
        return nanoseconds < 0
            ? WallClock.Instant(secondsSinceEpoch: seconds - 1, nanoseconds: Int32(nanoseconds + 1_000_000_000))
            : WallClock.Instant(secondsSinceEpoch: seconds, nanoseconds: Int32(nanoseconds))
    }
}

extension TimerQueue {
    /// The timer heap of the standard pool's poller: the timer sources on
    /// work queues and the delayed submissions (`async(after:)`), made with
    /// the first of them.
    static let shared: TimerQueue = {
        guard let poller = WorkerPool.standard.poller else {
            fatalError("TimerQueue: the standard pool has no poller")
        }
        return TimerQueue(poller: poller)
    }()
}

extension TimerWatch {
    /// The active wall-clock timers of the process, and the kernel's notice
    /// that the system time was set: a timerfd on `CLOCK_REALTIME` armed
    /// with `TFD_TIMER_CANCEL_ON_SET` (at a time it never reaches), watched
    /// on the reactor. Setting the clock makes it readable, its read fails
    /// with `ECANCELED`, and every registered timer is translated again.
    ///
    /// The timerfd is made with the first wall-clock timer and kept; it is
    /// armed only while at least one is registered (disarmed, the kernel
    /// takes it off its list of timers to cancel, so a clock change costs
    /// the process nothing).
    final class WallClockRegistry: @unchecked Sendable {
        // @unchecked: everything is guarded by `lock`.

        static let shared = WallClockRegistry()

        private let lock = GuardLock()
        private var timerfd = ProcessWideDescriptor()
        private var watches: [ObjectIdentifier: TimerWatch] = [:]

        /// Registers `watch` (again: nothing). Any thread.
        func add(_ watch: TimerWatch) throws(EventSourceError) {
            // The reactor first: starting it takes the reactor's lock, which
            // is never taken inside this one.
            let reactor = try EventReactor.loop()
            lock.lock()
            defer { lock.unlock() }
            // Checked under this lock (the watch's is taken inside it, and
            // never the other way round): a `stop` or a last firing that
            // raced this start unregisters after it, or is seen here.
            guard watch.hasDueTime else { return }
            let fd = try timerfd.watch(at: .loop(reactor), EventSourceCalls.clockChangeTimer) { [unowned self] in self.deliver() }
            if watches.isEmpty {
                // A notice left from an earlier arming is consumed here; the
                // timers registered then are gone, this one not yet scheduled.
                EventSourceCalls.armClockChange(fd)
            }
            watches[ObjectIdentifier(watch)] = watch
        }

        /// Unregisters `watch` (not registered: nothing). Any thread.
        func remove(_ watch: TimerWatch) {
            lock.lock()
            defer { lock.unlock() }
            guard watches.removeValue(forKey: ObjectIdentifier(watch)) != nil, watches.isEmpty else { return }
            EventSourceCalls.disarmClockChange(timerfd.fd)
        }

        /// On the reactor, when the timerfd is readable: arms it again and
        /// has every registered timer translate its due time again. A clock
        /// set between the read and the arming is consumed by the arming;
        /// the translations, which come after it, account for it.
        private func deliver() {
            let registered: [TimerWatch] = lock.withLock {
                guard EventSourceCalls.clockChangeFired(timerfd.fd) else { return [] }
                if !watches.isEmpty { EventSourceCalls.armClockChange(timerfd.fd) }
                return Array(watches.values)
            }
            for watch in registered { watch.clockWasSet() }
        }

        /// In a child after `fork()`: the timerfd is shared with the parent
        /// (arming it would change the parent's), and the parent's timers are
        /// not the child's; the child's first wall-clock timer makes a new one.
        func childAfterFork() {
            lock.reinitializeAfterFork()
            timerfd.childAfterFork()
            watches = [:]
        }
    }
}
