// Deadlines on any clock for the waits that are not lock acquisitions
// (those are in `Locking+Clocks.swift`): `Condition.wait(until:)`,
// `Semaphore.wait(until:)`, `ConditionLock.lock(whenCondition:before:)` and
// `ConditionVariable.wait(releasing:until:)` (the threads layer's waits are in
// `Threads+Clocks.swift`), for an instant of `ContinuousClock`,
// `SuspendingClock` or the wall clock (`WallClock.Instant`, Foundation's
// `Date`). Each converts the deadline once, on entry, and calls the
// `MonotonicClock` form, so it blocks, orders memory and fails exactly as
// that form does. `.now` and `.distantFuture` written without a type still
// mean `MonotonicClock.Instant`.

extension Condition {
    /// As `wait(until:)` with a `MonotonicClock` deadline: Foundation's
    /// `NSCondition.wait(until:)`, with `deadline` on any convertible clock
    /// (`WallClock.now + .seconds(2)`), converted once on entry.
    @inlinable
    @available(*, noasync, message: "blocks the thread; in async code wait with an `AsyncLock`, or `await` a `WorkGroup`, `Semaphore` or continuation")
    public func wait<Deadline: MonotonicClockConvertible>(until deadline: Deadline) -> WaitResult {
        wait(until: deadline.monotonicInstant)
    }
}

extension ConditionVariable {
    /// As `wait(releasing:until:)` with a `MonotonicClock` deadline, with
    /// `deadline` on any convertible clock, converted once on entry.
    @inlinable
    @discardableResult
    @available(*, noasync, message: "blocks the thread; in async code wait with an `AsyncLock`, or `await` a `WorkGroup`, `Semaphore` or continuation")
    public func wait<Deadline: MonotonicClockConvertible>(releasing lock: Lock, until deadline: Deadline) -> WaitResult {
        wait(releasing: lock, until: deadline.monotonicInstant)
    }
}

extension Semaphore {
    /// As `wait(until:)` with a `MonotonicClock` deadline, with `deadline`
    /// on any convertible clock, converted once on entry.
    @inlinable
    @available(*, noasync, message: "blocks the thread; in async code use `await wait()`")
    public func wait<Deadline: MonotonicClockConvertible>(until deadline: Deadline) -> WaitResult {
        wait(until: deadline.monotonicInstant)
    }
}

extension ConditionLock {
    /// As `lock(whenCondition:before:)` with a `MonotonicClock` deadline:
    /// Foundation's `NSConditionLock.lock(whenCondition:before:)`, with
    /// `deadline` on any convertible clock, converted once on entry.
    @inlinable
    @available(*, noasync, message: "waits for another thread to set the condition; in async code use an `AsyncLock` or `await` a continuation")
    public func lock<Deadline: MonotonicClockConvertible>(whenCondition condition: Int, before deadline: Deadline) -> Bool {
        lock(whenCondition: condition, before: deadline.monotonicInstant)
    }
}
