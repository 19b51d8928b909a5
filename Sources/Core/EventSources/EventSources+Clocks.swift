// Deadlines on any clock for a timer source's start.

extension EventSource.TimerStart {
    /// The monotonic start at `deadline`, an instant of any
    /// `MonotonicClockConvertible` clock (`ContinuousClock.now +
    /// .seconds(1)`), converted to `MonotonicClock` once, now. For a start
    /// that follows the system time, use `.wall(_:)`.
    public static func at<Deadline: MonotonicClockConvertible>(_ deadline: Deadline) -> Self {
        .monotonic(deadline.monotonicInstant)
    }

    /// The monotonic start `delay` from now (Dispatch's
    /// `.now() + delay`).
    public static func after(_ delay: Duration) -> Self {
        .monotonic(MonotonicClock.now.advanced(by: delay))
    }
}
