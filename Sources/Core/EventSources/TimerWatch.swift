/// The watch of a timer source. It keeps the schedule (start + n ×
/// interval, on the monotonic or the wall clock) and counts the due times
/// that have passed at each firing, so missed periods merge into one call
/// whose data says how many.
///
/// - For a source on a work queue, the timer is an entry in the reactor's
///   `TimerQueue` (one heap behind one kernel timeout for all of them).
/// - For a source on a run loop, it lives in that loop's own timers, so
///   that it fires only in the loop's modes: a monotonic schedule is one
///   repeating `LoopTimer` (which keeps start + n × interval itself); a
///   wall-clock one is a chain of one-shot `LoopTimer`s.
///
/// A wall-clock due time is translated to the monotonic clock when it is
/// scheduled, and checked against the wall clock when it fires: if the
/// system time went back, it is scheduled again (never early). A change of
/// the system time is noticed at the next firing, not at once.
final class TimerWatch: SourceWatch, @unchecked Sendable {
    // @unchecked: everything mutable is guarded by `lock`.

    let start: EventSource.TimerStart
    let interval: Duration?
    let leeway: Duration
    private let period: Int64?

    private let lock = GuardLock()
    private weak var source: EventSource?
    private var timer: LoopTimer?
    private var stopped = false
    /// Bumped by each start (and so by `move`) and by `stop`: timers and
    /// queue entries of an older arming fire no more.
    private var arming = 0
    /// The next due time, in nanoseconds on the schedule's clock; `.max`
    /// once a one-shot has fired.
    private var due: Int64

    init(start: EventSource.TimerStart, interval: Duration?, leeway: Duration) {
        self.start = start
        self.interval = interval
        self.leeway = leeway
        period = interval.map(\.nanosecondsSaturating)
        switch start {
        case .monotonic(let first): due = first.nanoseconds
        case .wall(let first): due = Self.nanoseconds(first)
        }
    }

    private var isWall: Bool {
        if case .wall = start { return true }
        return false
    }

    /// The schedule clock's current time.
    private func now() -> Int64 {
        isWall ? Self.nanoseconds(WallClock.now) : MonotonicClock.now.nanoseconds
    }

    /// `due` on the monotonic clock. Under `lock`.
    private func monotonicDue() -> Int64 {
        isWall ? Self.wallInstant(due).monotonicInstant.nanoseconds : due
    }

    /// How many due times have passed at `now` (0 if none yet), moving the
    /// next due time past `now` (start + n × interval). Under `lock`.
    private func consume(now: Int64) -> UInt64 {
        guard now >= due else { return 0 }
        guard let period else {
            due = .max
            return 1
        }
        let periods = (now - due) / period + 1
        let (step, o1) = periods.multipliedReportingOverflow(by: period)
        let (next, o2) = due.addingReportingOverflow(step)
        due = o1 || o2 ? .max : next
        return UInt64(periods)
    }

    func start(for source: EventSource, on loop: ThreadLoop, modes: [LoopMode]) {
        let arming: Int? = lock.withLock { () -> Int? in
            guard !stopped else { return nil }
            self.source = source
            self.arming += 1
            return due == .max ? nil : self.arming
        }
        guard let arming else { return }
        if loop === EventReactor.loop {
            scheduleInQueue(arming: arming)
        } else if isWall {
            armWall(arming: arming, on: loop, modes: modes)
        } else {
            let first = lock.withLock { due }
            let made = LoopTimer(
                fireAt: MonotonicClock.Instant(nanoseconds: first), interval: interval, tolerance: leeway
            ) { [weak self] _ in self?.fire(arming: arming) }
            install(made, arming: arming, on: loop, modes: modes)
        }
    }

    // MARK: On the reactor's queue

    private func scheduleInQueue(arming: Int) {
        let latest: Int64? = lock.withLock {
            guard !stopped, arming == self.arming, due != .max else { return nil }
            let (sum, overflow) = monotonicDue().addingReportingOverflow(leeway.nanosecondsSaturating)
            return overflow ? .max : sum
        }
        guard let latest else { return }
        TimerQueue.shared.schedule(self, latest: latest, arming: arming)
    }

    /// The reactor's `TimerQueue` reached this watch's entry.
    func fireFromQueue(arming: Int) {
        guard fire(arming: arming) else { return }
        scheduleInQueue(arming: arming)
    }

    /// Counts the due times passed and hands them to the source. Returns
    /// whether the arming is still current (so the next firing should be
    /// scheduled).
    @discardableResult
    private func fire(arming: Int) -> Bool {
        let (count, source): (UInt64, EventSource?) = lock.withLock {
            guard !stopped, arming == self.arming else { return (0, nil) }
            return (consume(now: now()), self.source)
        }
        guard let source else { return false }
        source.add(count)
        return true
    }

    // MARK: On a run loop

    /// One link of a wall-clock chain on a loop: a one-shot timer at the
    /// monotonic translation of the next due time.
    private func armWall(arming: Int, on loop: ThreadLoop, modes: [LoopMode]) {
        let fireAt: Int64? = lock.withLock {
            stopped || arming != self.arming || due == .max ? nil : monotonicDue()
        }
        guard let fireAt else { return }
        let made = LoopTimer(fireAt: MonotonicClock.Instant(nanoseconds: fireAt), tolerance: leeway) { [weak self] _ in
            guard let self, self.fire(arming: arming) else { return }
            self.armWall(arming: arming, on: loop, modes: modes)
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

    func move(for source: EventSource, to loop: ThreadLoop, modes: [LoopMode]) {
        let old: LoopTimer? = lock.withLock {
            defer { timer = nil }
            return timer
        }
        old?.invalidate()
        start(for: source, on: loop, modes: modes)
    }

    func stop() {
        let old: LoopTimer? = lock.withLock {
            stopped = true
            arming += 1
            defer { timer = nil }
            return timer
        }
        old?.invalidate()
    }

    private static func nanoseconds(_ instant: WallClock.Instant) -> Int64 {
        let (s, o1) = instant.secondsSinceEpoch.multipliedReportingOverflow(by: 1_000_000_000)
        let (ns, o2) = s.addingReportingOverflow(Int64(instant.nanoseconds))
        return o1 || o2 ? (instant.secondsSinceEpoch < 0 ? .min : .max) : ns
    }

    private static func wallInstant(_ ns: Int64) -> WallClock.Instant {
        WallClock.Instant(secondsSinceEpoch: ns / 1_000_000_000, nanoseconds: Int32(ns % 1_000_000_000))
    }
}
