// Deadlines on any clock for the run-loop layer's timers (`ThreadLoop.run`
// takes them in `ThreadLoop+Foundation.swift`): converted once, when the
// timer is made.

extension LoopTimer {
    /// A timer first firing at `fireDate`, an instant of any
    /// `MonotonicClockConvertible` clock (`ContinuousClock.now +
    /// .seconds(1)`, a `WallClock` instant), converted to `MonotonicClock`
    /// once, now; then as `init(fireAt:interval:tolerance:_:)`. A later step
    /// of the wall clock does not move the timer.
    public convenience init<Deadline: MonotonicClockConvertible>(
        fireAt fireDate: Deadline, interval: Duration? = nil, tolerance: Duration = .zero,
        _ handler: @escaping @Sendable (LoopTimer) -> Void
    ) {
        self.init(fireAt: fireDate.monotonicInstant, interval: interval, tolerance: tolerance, handler)
    }
}
