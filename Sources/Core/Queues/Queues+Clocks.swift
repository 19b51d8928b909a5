// Deadlines on any clock for the queues layer: `WorkQueue.async(after:)`,
// `WorkGroup.wait(until:)` and `WorkItem.wait(until:)` take an instant of
// `ContinuousClock`, `SuspendingClock` or the wall clock (`WallClock.Instant`)
// as well as `MonotonicClock`, as the locks do (`Locking+Clocks.swift`). Each
// converts the deadline once, on entry, and calls the `MonotonicClock` form,
// so it blocks, orders memory and fails exactly as that form does. `.now` and
// `.distantFuture` written without a type still mean `MonotonicClock.Instant`.

extension WorkQueue {
    /// Submits `body` when `deadline` has passed: never earlier. `deadline`
    /// is an instant of any `MonotonicClockConvertible` clock
    /// (`ContinuousClock.now + .seconds(1)`), converted to `MonotonicClock`
    /// once, now; see `async(after:_:)` with a `MonotonicClock` deadline.
    /// Never blocks. Dispatch's `asyncAfter(deadline:execute:)`.
    @inlinable
    public func async<Deadline: MonotonicClockConvertible>(
        after deadline: Deadline, _ body: @escaping @Sendable () -> Void
    ) {
        async(after: deadline.monotonicInstant, body)
    }
}

extension WorkGroup {
    /// As `wait(until:)` with a `MonotonicClock` deadline, with `deadline`
    /// on any convertible clock, converted once on entry. Blocks.
    @inlinable
    @available(*, noasync, message: "blocks the thread; in async code use `await wait(until:)`")
    public func wait<Deadline: MonotonicClockConvertible>(until deadline: Deadline) -> WaitResult {
        wait(until: deadline.monotonicInstant)
    }
}

extension WorkItem {
    /// As `wait(until:)` with a `MonotonicClock` deadline, with `deadline`
    /// on any convertible clock, converted once on entry. Blocks.
    @inlinable
    @available(*, noasync, message: "blocks the thread; in async code use `await wait(until:)`")
    public func wait<Deadline: MonotonicClockConvertible>(until deadline: Deadline) -> WaitResult {
        wait(until: deadline.monotonicInstant)
    }
}
