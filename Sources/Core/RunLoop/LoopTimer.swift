import Synchronization

/// A timer source: its handler runs on a loop's thread at its fire date, and
/// for a repeating timer at every `interval` after it. Replaces Foundation's
/// `Timer` (`CFRunLoopTimer`).
///
/// ```swift
/// let remaining = LockedValue(10)
/// let timer = LoopTimer(after: .milliseconds(50), interval: .milliseconds(50), tolerance: .milliseconds(5)) { timer in
///     let left = remaining.withLock { $0 -= 1; return $0 }
///     if left == 0 { timer.invalidate() }         // fired ten times: done
/// }
/// loop.add(timer, forMode: .common)              // fires in every common mode
/// ```
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
/// the properties may be used from any thread (the properties never block;
/// `invalidate()` takes the loop's lock briefly). Once `invalidate()` has
/// returned the loop starts no new firing; if another thread invalidates the
/// timer just as the loop thread begins a firing, that firing's handler may
/// still run.
///
/// Memory: a timer is a single heap object; its state is atomic words
/// inside it, with no lock.
///
/// The handler is `@Sendable`, as Foundation's `Timer` block is: it runs on
/// the loop's thread at each firing, and on any thread that calls `fire()`,
/// so the compiler rejects a handler that captures state the caller goes on
/// using (a local `var` the caller mutates afterwards). State shared with
/// other threads goes through a `Sendable` value such as `LockedValue`.
public final class LoopTimer: @unchecked Sendable {
    // @unchecked: the mutable state is atomics; everything else is
    // immutable. The handler is `@Sendable` for every public initializer;
    // a delayed perform's (`ThreadLoop.perform(afterDelay:)`) came in
    // `sending` and is only ever called on its loop's thread (`fire()`
    // checks), one call after another.

    /// The time between firings of a repeating timer; nil for a one-shot.
    public let interval: Duration?
    /// How late the loop may fire the timer to coalesce wake-ups; never
    /// early. Settable from any thread (Foundation's `tolerance`); a negative
    /// value is a precondition failure. Never blocks.
    public var tolerance: Duration {
        get { .nanoseconds(toleranceNanoseconds.load(ordering: .relaxed)) }
        set {
            require(newValue >= .zero, "LoopTimer.tolerance: \(newValue); it cannot be negative")
            toleranceNanoseconds.store(newValue.nanosecondsSaturating, ordering: .relaxed)
        }
    }
    private let toleranceNanoseconds: Atomic<Int64>
    let handler: (LoopTimer) -> Void
    /// Whether `handler` is `@Sendable` (every public initializer); false
    /// for a delayed perform's, which only its loop's thread may call.
    let handlerIsSendable: Bool
    /// Identifies the object on whose behalf a delayed perform was queued.
    let target: ObjectIdentifier?

    /// Cleared once, by `invalidate()` or by a one-shot's firing.
    private let valid = Atomic<Bool>(true)
    /// The next fire date, in nanoseconds on the monotonic clock. Written
    /// only by the owning loop's thread as it fires the timer.
    private let nextFire: Atomic<Int64>
    /// The loop the timer belongs to, set by the first `add` and never
    /// changed; holds one retain of the identity, released in deinit. The
    /// identity outlives its loop, so a timer can never join another loop.
    private let owner = Atomic<Unmanaged<LoopIdentity>?>(nil)

    /// A timer first firing at `fireDate`, then every `interval` if given.
    /// `interval` must be positive and `tolerance` non-negative: otherwise a
    /// precondition failure with a message. `handler` is `@Sendable`: see
    /// the type's documentation.
    public init(
        fireAt fireDate: MonotonicClock.Instant, interval: Duration? = nil, tolerance: Duration = .zero,
        _ handler: @escaping @Sendable (LoopTimer) -> Void
    ) {
        if let interval {
            require(interval > .zero, "LoopTimer.init: `interval` is \(interval); a repeating timer needs a positive interval")
        }
        require(tolerance >= .zero, "LoopTimer.init: `tolerance` is \(tolerance); it cannot be negative")
        self.interval = interval
        self.toleranceNanoseconds = Atomic(tolerance.nanosecondsSaturating)
        self.handler = handler
        self.handlerIsSendable = true
        self.target = nil
        nextFire = Atomic(fireDate.nanoseconds)
    }

    /// A timer firing `delay` from now (and every `interval` after, if given).
    /// `handler` is `@Sendable`: see the type's documentation.
    public convenience init(
        after delay: Duration, interval: Duration? = nil, tolerance: Duration = .zero,
        _ handler: @escaping @Sendable (LoopTimer) -> Void
    ) {
        require(delay >= .zero, "LoopTimer.init: `delay` is \(delay); it cannot be negative")
        self.init(fireAt: MonotonicClock.now.advanced(by: delay), interval: interval, tolerance: tolerance, handler)
    }

    init(fireAt fireDate: MonotonicClock.Instant, target: ObjectIdentifier?, _ handler: sending @escaping (LoopTimer) -> Void) {
        interval = nil
        toleranceNanoseconds = Atomic(0)
        self.handler = handler
        self.handlerIsSendable = false
        self.target = target
        nextFire = Atomic(fireDate.nanoseconds)
    }

    deinit { owner.load(ordering: .relaxed)?.release() }

    /// When the timer fires next. Reading never blocks and is a snapshot
    /// (the loop thread moves a repeating timer's date as it fires).
    ///
    /// Setting it reschedules the timer, as Foundation's `fireDate` does: it
    /// fires next at the new date (a repeating timer keeps its interval from
    /// there), and its loop is woken if it sleeps, to sleep until the right
    /// date. Any thread; a set that races a firing on the loop's thread may
    /// be overtaken by the date that firing computes.
    public var fireDate: MonotonicClock.Instant {
        get { MonotonicClock.Instant(nanoseconds: nextFire.load(ordering: .relaxed)) }
        set {
            // Releasing, then the wake: the loop sees the new date when it
            // recomputes its sleep.
            nextFire.store(newValue.nanoseconds, ordering: .releasing)
            owner.load(ordering: .acquiring)?.takeUnretainedValue().loop?.timerRescheduled()
        }
    }

    /// Runs the handler now, on the calling thread, outside the schedule
    /// (Foundation's `fire()`): a repeating timer keeps its next date; a
    /// one-shot is invalidated after its handler returns. Nothing for an
    /// invalid timer. Blocks for as long as the handler runs. Any thread,
    /// except for the timer of a delayed perform (`ThreadLoop.perform(
    /// afterDelay:)`, whose block is not `Sendable`): that one only on its
    /// loop's thread, a precondition failure elsewhere.
    public func fire() {
        guard isValid else { return }
        if !handlerIsSendable {
            let loop = owner.load(ordering: .acquiring)?.takeUnretainedValue().loop
            require(
                loop?.isCurrent ?? false,
                "LoopTimer.fire(): this timer runs a delayed perform, whose block may only run on its loop's thread")
        }
        handler(self)
        if interval == nil { invalidate() }
    }

    /// Whether the timer can still fire. Never blocks. Acquiring: pairs with
    /// `invalidate()`.
    public var isValid: Bool { valid.load(ordering: .acquiring) }

    /// Stops the timer for good and takes it off its loop, waking the loop
    /// if called from another thread. Any thread; never blocks beyond the
    /// loop's lock. Calling it again does nothing.
    public func invalidate() {
        // Sequentially consistent with `owner` and with `isValidForAdd`:
        // either this call sees the owner that an `add` set, and removes the
        // timer from that loop after the add, or the add sees the timer
        // invalid and does not insert it. Never both missed.
        guard valid.exchange(false, ordering: .sequentiallyConsistent) else { return }
        owner.load(ordering: .sequentiallyConsistent)?.takeUnretainedValue().loop?.timerInvalidated(self)
    }

    /// Makes the timer belong to `loop`, on its first `add`; later adds must
    /// come from the same loop (a precondition failure otherwise).
    func claim(for loop: LoopIdentity) {
        let mine = Unmanaged.passUnretained(loop)
        var current = owner.load(ordering: .sequentiallyConsistent)
        if current == nil {
            let retained = mine.retain()
            let (exchanged, found) = owner.compareExchange(
                expected: nil, desired: retained, ordering: .sequentiallyConsistent)
            if exchanged { return }
            retained.release()
            current = found
        }
        require(
            current?.toOpaque() == mine.toOpaque(),
            "ThreadLoop.add(_:forMode:): this LoopTimer already belongs to another loop")
    }

    /// `isValid` for `ThreadLoop.add`, read under the loop's lock after
    /// `claim`: sequentially consistent, pairing with `invalidate()`.
    var isValidForAdd: Bool { valid.load(ordering: .sequentiallyConsistent) }

    /// Called by the loop as it fires the timer: computes the next date on
    /// the schedule after `now` (or invalidates a one-shot). Returns whether
    /// the handler should run. Owning loop's thread only.
    func beginFiring(now: MonotonicClock.Instant) -> Bool {
        guard let interval else {
            // One-shot: firing and `invalidate()` race for the flag; one wins.
            return valid.exchange(false, ordering: .acquiringAndReleasing)
        }
        guard valid.load(ordering: .acquiring) else { return false }
        // First scheduled date after now: missed periods collapse into this firing.
        nextFire.store(Self.nextDate(after: now, from: nextFire.load(ordering: .relaxed), every: interval), ordering: .relaxed)
        return true
    }

    /// The first date on the schedule `date + n × interval` after `now`, in
    /// nanoseconds; the far future (`Int64.max`, never due) when that is past
    /// what the clock can count (an interval such as `Duration.max`).
    static func nextDate(after now: MonotonicClock.Instant, from date: Int64, every interval: Duration) -> Int64 {
        let step = interval.nanosecondsSaturating
        let late = now.nanoseconds &- date
        let periods = late >= 0 ? late / step + 1 : 1
        let (advance, overflow) = periods.multipliedReportingOverflow(by: step)
        guard !overflow else { return .max }
        let (next, overflow2) = date.addingReportingOverflow(advance)
        return overflow2 ? .max : next
    }

    /// The latest moment the loop may wake for this timer.
    var wakeDeadline: MonotonicClock.Instant { fireDate.advanced(by: tolerance) }
}
