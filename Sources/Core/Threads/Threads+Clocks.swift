// Deadlines on any clock, and durations, for the waits of this layer: each
// form converts once, on entry, and calls the `MonotonicClock` form, so it
// blocks and fails exactly as that form does.

extension NativeThread {
    /// As `sleep(until:)` with a `MonotonicClock` deadline: Foundation's
    /// `Thread.sleep(until:)`, with `deadline` on any convertible clock,
    /// converted once on entry (a wall-clock step during the sleep does not
    /// move its end).
    @discardableResult
    @available(*, noasync, message: "blocks the thread; in async code use `try await Task.sleep(for:)`")
    public static func sleep<Deadline: MonotonicClockConvertible>(until deadline: Deadline) -> Bool {
        sleep(until: deadline.monotonicInstant)
    }
}

extension SpawnedThread {
    /// As `join(until:)`, with `deadline` on any `MonotonicClockConvertible`
    /// clock.
    @available(*, noasync, message: "blocks the thread; in async code use `try await join()`")
    public func join<Deadline: MonotonicClockConvertible>(until deadline: Deadline) throws -> Value? {
        try join(until: deadline.monotonicInstant)
    }

    /// Joins the thread if it ends within `timeout`; returns nil, leaving it
    /// joinable, if it is still running then (`join(until:)` with a deadline
    /// `timeout` from now; a zero or negative timeout only checks). Blocks the
    /// calling thread at most `timeout`.
    @available(*, noasync, message: "blocks the thread; in async code use `try await join()`")
    public func join(timeout: Duration) throws -> Value? {
        try join(until: MonotonicClock.now.advanced(by: timeout))
    }
}
