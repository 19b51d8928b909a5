// Deadlines on any clock for the jobs layer's waits, as for the queues'
// (`Queues+Clocks.swift`): each converts the deadline once, on entry, and
// calls the `MonotonicClock` form, so it blocks and fails exactly as that
// form does.

extension Job {
    /// As `waitUntilFinished(until:)` with a `MonotonicClock` deadline, with
    /// `deadline` on any convertible clock, converted once on entry. Blocks.
    @available(*, noasync, message: "blocks the thread; in async code use `await waitUntilFinished()`")
    public func waitUntilFinished<Deadline: MonotonicClockConvertible>(until deadline: Deadline) -> WaitResult {
        waitUntilFinished(until: deadline.monotonicInstant)
    }
}

extension JobQueue {
    /// As `waitUntilAllJobsAreFinished(until:)` with a `MonotonicClock`
    /// deadline, with `deadline` on any convertible clock, converted once on
    /// entry. Blocks.
    @available(*, noasync, message: "blocks the thread; in async code use `await waitUntilAllJobsAreFinished(until:)`")
    public func waitUntilAllJobsAreFinished<Deadline: MonotonicClockConvertible>(
        until deadline: Deadline
    ) -> WaitResult {
        waitUntilAllJobsAreFinished(until: deadline.monotonicInstant)
    }
}
