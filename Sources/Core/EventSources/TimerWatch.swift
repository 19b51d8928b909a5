/// The watch of a timer source: a `LoopTimer` in its loop's ordered timer
/// structure (one kernel timeout per loop for all its timers).
///
/// A monotonic schedule is one repeating `LoopTimer`, which keeps to
/// start + n × interval and fires once for periods it missed; the watch
/// counts those periods from the schedule it keeps itself. A wall-clock
/// schedule is a chain of one-shot `LoopTimer`s, each translated from the
/// next wall-clock due time to the monotonic clock when it is made, and
/// checked against the wall clock when it fires (if the system time went
/// back, it waits again: never early).
final class TimerWatch: SourceWatch, @unchecked Sendable {
    // @unchecked: `timer`, `stopped`, `generation` and `due` are guarded by
    // `lock`; the rest is immutable.

    let start: EventSource.TimerStart
    let interval: Duration?
    let leeway: Duration
    private let period: Int64?

    private let lock = GuardLock()
    private var timer: LoopTimer?
    private var stopped = false
    /// Bumped by `move`: a wall-clock chain of an older generation ends.
    private var generation = 0
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

    /// How many due times have passed at `now` (0 if none yet), moving the
    /// next due time past `now` (start + n × interval).
    private func consume(now: Int64) -> UInt64 {
        lock.withLock {
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
    }

    func start(for source: EventSource, on loop: ThreadLoop, modes: [LoopMode]) {
        let state: (generation: Int, due: Int64)? = lock.withLock { stopped ? nil : (generation, due) }
        guard let state, state.due != .max else { return }
        if isWall {
            armWall(for: source, generation: state.generation, on: loop, modes: modes)
        } else {
            let made = LoopTimer(
                fireAt: MonotonicClock.Instant(nanoseconds: state.due), interval: interval, tolerance: leeway
            ) { [weak self] _ in
                guard let self else { return }
                source.add(self.consume(now: MonotonicClock.now.nanoseconds))
            }
            install(made, generation: state.generation, on: loop, modes: modes)
        }
    }

    /// One link of a wall-clock chain: a one-shot timer at the monotonic
    /// translation of the next due time; when it fires, the firings due by
    /// the wall clock are counted (none if the clock went back) and the next
    /// link is made.
    private func armWall(for source: EventSource, generation: Int, on loop: ThreadLoop, modes: [LoopMode]) {
        let due: Int64? = lock.withLock {
            stopped || generation != self.generation || self.due == .max ? nil : self.due
        }
        guard let due else { return }
        let made = LoopTimer(fireAt: Self.wallInstant(due).monotonicInstant, tolerance: leeway) { [weak self] _ in
            guard let self else { return }
            source.add(self.consume(now: Self.nanoseconds(WallClock.now)))
            self.armWall(for: source, generation: generation, on: loop, modes: modes)
        }
        install(made, generation: generation, on: loop, modes: modes)
    }

    private func install(_ made: LoopTimer, generation: Int, on loop: ThreadLoop, modes: [LoopMode]) {
        let current: Bool = lock.withLock {
            guard !stopped, generation == self.generation else { return false }
            timer = made
            return true
        }
        guard current else { return }
        for mode in modes { loop.add(made, forMode: mode) }
    }

    func move(for source: EventSource, to loop: ThreadLoop, modes: [LoopMode]) {
        let old: LoopTimer? = lock.withLock {
            generation += 1
            defer { timer = nil }
            return timer
        }
        old?.invalidate()
        start(for: source, on: loop, modes: modes)
    }

    func stop() {
        let old: LoopTimer? = lock.withLock {
            stopped = true
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
