// Deadlines on any clock for the waits of this layer: each form converts a
// `MonotonicClockConvertible` deadline (an instant of `ContinuousClock`,
// `SuspendingClock`, `MonotonicClock`, or a `WallClock` instant) once, on
// entry, and calls the `MonotonicClock` form, so it blocks, orders memory
// and fails exactly as that form does.

extension Condition {
    /// As `wait(until:)`, with `deadline` on any `MonotonicClockConvertible`
    /// clock (`condition.wait(until: ContinuousClock.now + .seconds(1))`).
    @discardableResult
    public func wait<Deadline: MonotonicClockConvertible>(until deadline: Deadline) -> Bool {
        wait(until: deadline.monotonicInstant)
    }
}

extension ConditionVariable {
    /// As `wait(releasing:until:)`, with `deadline` on any
    /// `MonotonicClockConvertible` clock.
    @discardableResult
    public func wait<Deadline: MonotonicClockConvertible>(releasing lock: Lock, until deadline: Deadline) -> Bool {
        wait(releasing: lock, until: deadline.monotonicInstant)
    }
}

extension Semaphore {
    /// As `wait(until:)`, with `deadline` on any `MonotonicClockConvertible`
    /// clock.
    @discardableResult
    public func wait<Deadline: MonotonicClockConvertible>(until deadline: Deadline) -> Bool {
        wait(until: deadline.monotonicInstant)
    }
}

extension ConditionLock {
    /// As `lock(whenCondition:before:)`, with `deadline` on any
    /// `MonotonicClockConvertible` clock.
    public func lock<Deadline: MonotonicClockConvertible>(whenCondition condition: Int, before deadline: Deadline) -> Bool {
        lock(whenCondition: condition, before: deadline.monotonicInstant)
    }
}
