// Deadlines on any clock for the async waits (`AsyncWaits.swift`) and for
// `AsyncLock.lock(until:)`: an instant of `ContinuousClock`,
// `SuspendingClock` or the wall clock as well as `MonotonicClock`, converted
// once, on entry, then as the `MonotonicClock` form.

extension WorkGroup {
    /// As the async `wait(until:)` with a `MonotonicClock` deadline, with
    /// `deadline` on any convertible clock, converted once on entry.
    /// Suspends; throws `CancellationError` if the task is cancelled first.
    public func wait<Deadline: MonotonicClockConvertible>(
        until deadline: Deadline
    ) async throws(CancellationError) -> WaitResult {
        try await wait(until: deadline.monotonicInstant)
    }
}

extension WorkItem {
    /// As the async `wait(until:)` with a `MonotonicClock` deadline, with
    /// `deadline` on any convertible clock, converted once on entry.
    /// Suspends; throws `CancellationError` if the task is cancelled first.
    public func wait<Deadline: MonotonicClockConvertible>(
        until deadline: Deadline
    ) async throws(CancellationError) -> WaitResult {
        try await wait(until: deadline.monotonicInstant)
    }
}

extension JobQueue {
    /// Suspends the calling task until every job in the queue has finished
    /// and run its completion handler, including jobs added meanwhile; the
    /// async form of `waitUntilAllJobsAreFinished()`. No thread waits: a
    /// notification on the default global queue resumes the task.
    /// Memory: sees everything the jobs wrote. Throws `CancellationError`
    /// if the task is cancelled first (the jobs are not cancelled with it).
    public func waitUntilAllJobsAreFinished() async throws(CancellationError) {
        try await unfinished.wait()
    }

    /// As the async `waitUntilAllJobsAreFinished()`, giving up at
    /// `deadline` (an instant of any `MonotonicClockConvertible` clock):
    /// `.completed` if the queue emptied, `.timedOut` otherwise.
    public func waitUntilAllJobsAreFinished<Deadline: MonotonicClockConvertible>(
        until deadline: Deadline
    ) async throws(CancellationError) -> WaitResult {
        try await unfinished.wait(until: deadline.monotonicInstant)
    }

    /// As the async `waitUntilAllJobsAreFinished()`, giving up after
    /// `timeout`.
    public func waitUntilAllJobsAreFinished(timeout: Duration) async throws(CancellationError) -> WaitResult {
        try await unfinished.wait(timeout: timeout)
    }
}

extension AsyncLock {
    /// As `lock(until:)` with a `MonotonicClock` deadline, with `deadline`
    /// on any convertible clock (`ContinuousClock.now + .seconds(1)`),
    /// converted once on entry. Suspends, never blocks.
    @inlinable
    public func lock<Deadline: MonotonicClockConvertible>(
        until deadline: Deadline, isolation: isolated (any Actor)? = #isolation
    ) async throws(CancellationError) -> Bool {
        try await lock(until: deadline.monotonicInstant, isolation: isolation)
    }
}
