/// A timer source: its handler runs on a loop's thread at its fire date, and
/// for a repeating timer at every `interval` after it.
///
/// Repeating timers keep to their schedule, not to when they actually fired:
/// the next date is always the first date + n × interval. A timer that was
/// late by more than a period fires once for all the periods it missed, then
/// resumes on schedule. `tolerance` lets the loop fire it up to that much
/// late, so that nearby timers share one wake-up.
///
/// A timer belongs to at most one loop (adding it to a second is a
/// precondition failure) but may be in several of that loop's modes; it fires
/// only while the loop runs in one of them. Thread-safe: `invalidate()` and
/// the properties may be used from any thread; after `invalidate()` returns
/// the handler does not start again.
public final class LoopTimer: @unchecked Sendable {
    // @unchecked: mutable state is guarded by `lock`.

    /// The time between firings of a repeating timer; nil for a one-shot.
    public let interval: Duration?
    /// How late the loop may fire the timer to coalesce wake-ups.
    public let tolerance: Duration
    let handler: (LoopTimer) -> Void
    /// Identifies the object on whose behalf a delayed perform was queued.
    let target: ObjectIdentifier?

    let lock = Lock()
    private var _fireDate: MonotonicClock.Instant
    private var _valid = true
    /// The loop it was added to (weak: the timer does not keep it alive).
    weak var loop: ThreadLoop?
    /// The serial number of the first loop it was added to, kept after that
    /// loop is gone, so it can never join another.
    var loopSerial: UInt64?

    /// A timer first firing at `fireDate`, then every `interval` if given.
    /// `interval` must be positive and `tolerance` non-negative: otherwise a
    /// precondition failure with a message.
    public init(
        fireAt fireDate: MonotonicClock.Instant, interval: Duration? = nil, tolerance: Duration = .zero,
        _ handler: @escaping (LoopTimer) -> Void
    ) {
        if let interval {
            require(interval > .zero, "LoopTimer.init: `interval` is \(interval); a repeating timer needs a positive interval")
        }
        require(tolerance >= .zero, "LoopTimer.init: `tolerance` is \(tolerance); it cannot be negative")
        self.interval = interval
        self.tolerance = tolerance
        self.handler = handler
        self.target = nil
        _fireDate = fireDate
    }

    /// A timer firing `delay` from now (and every `interval` after, if given).
    public convenience init(
        after delay: Duration, interval: Duration? = nil, tolerance: Duration = .zero,
        _ handler: @escaping (LoopTimer) -> Void
    ) {
        require(delay >= .zero, "LoopTimer.init: `delay` is \(delay); it cannot be negative")
        self.init(fireAt: MonotonicClock.now.advanced(by: delay), interval: interval, tolerance: tolerance, handler)
    }

    init(fireAt fireDate: MonotonicClock.Instant, target: ObjectIdentifier?, _ handler: @escaping (LoopTimer) -> Void) {
        interval = nil
        tolerance = .zero
        self.handler = handler
        self.target = target
        _fireDate = fireDate
    }

    /// When the timer fires next.
    public var fireDate: MonotonicClock.Instant { lock.withLock { _fireDate } }

    /// Whether the timer can still fire.
    public var isValid: Bool { lock.withLock { _valid } }

    /// Stops the timer for good and takes it off its loop. Any thread; never
    /// blocks beyond a short lock.
    public func invalidate() {
        let owner: ThreadLoop? = lock.withLock {
            guard _valid else { return nil }
            _valid = false
            return loop
        }
        owner?.timerInvalidated(self)
    }

    /// Called by the loop as it fires the timer: computes the next date on
    /// the schedule after `now` (or invalidates a one-shot). Returns whether
    /// the handler should run.
    func beginFiring(now: MonotonicClock.Instant) -> Bool {
        lock.withLock {
            guard _valid else { return false }
            if let interval {
                // First scheduled date after now: missed periods collapse into this firing.
                let step = interval.nanosecondsSaturating
                let late = now.nanoseconds &- _fireDate.nanoseconds
                let periods = late >= 0 ? late / step + 1 : 1
                _fireDate = MonotonicClock.Instant(nanoseconds: _fireDate.nanoseconds &+ periods &* step)
            } else {
                _valid = false
            }
            return true
        }
    }

    /// The latest moment the loop may wake for this timer.
    var wakeDeadline: MonotonicClock.Instant { lock.withLock { _fireDate.advanced(by: tolerance) } }
}
