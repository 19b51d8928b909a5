// Deadlines on any clock, and timeouts, for every lock: the forms that take a
// `MonotonicClockConvertible` (a `ContinuousClock` or `SuspendingClock`
// instant) convert it and call the lock's own `MonotonicClock` form, so they
// block, order memory and fail exactly as that form does.

extension Locking {
    /// Acquires the lock, blocking at most until `deadline` (an instant of
    /// `ContinuousClock`, `SuspendingClock` or `MonotonicClock`). Returns
    /// whether it acquired. Acquire ordering on success. A deadline in the
    /// past makes this a `tryLock()`.
    ///
    ///     if lock.lock(before: ContinuousClock.now + .seconds(1)) { ... }
    @inlinable
    public func lock<Deadline: MonotonicClockConvertible>(before deadline: Deadline) -> Bool {
        lock(before: deadline.monotonicInstant)
    }

    /// Runs `body` holding the lock if it can be acquired by `deadline` (an
    /// instant of any of Spindle's and Swift's monotonic clocks); otherwise
    /// returns `nil` without running it. Blocks at most until `deadline`.
    /// The lock is released on every path out of `body`.
    @inlinable
    public func withLock<Deadline: MonotonicClockConvertible, Result, Failure: Error>(
        before deadline: Deadline, _ body: () throws(Failure) -> Result
    ) throws(Failure) -> Result? {
        try withLock(before: deadline.monotonicInstant, body)
    }

    /// Runs `body` holding the lock if it can be acquired within `timeout`;
    /// otherwise returns `nil` without running it. Blocks at most `timeout`
    /// (on `MonotonicClock`); a zero or negative timeout only tries. The lock
    /// is released on every path out of `body`, including a thrown error.
    @inlinable
    public func withLock<Result, Failure: Error>(
        timeout: Duration, _ body: () throws(Failure) -> Result
    ) throws(Failure) -> Result? {
        try withLock(before: MonotonicClock.now.advanced(by: timeout), body)
    }
}

extension ReadWriteLock {
    /// As `readLock(before:)`, with a deadline on any of Spindle's and
    /// Swift's monotonic clocks.
    @inlinable
    public func readLock<Deadline: MonotonicClockConvertible>(before deadline: Deadline) -> Bool {
        readLock(before: deadline.monotonicInstant)
    }

    /// As `writeLock(before:)`, with a deadline on any of Spindle's and
    /// Swift's monotonic clocks.
    @inlinable
    public func writeLock<Deadline: MonotonicClockConvertible>(before deadline: Deadline) -> Bool {
        writeLock(before: deadline.monotonicInstant)
    }
}

extension LockedValue {
    /// As `withLock(before:_:)`, with a deadline on any of Spindle's and
    /// Swift's monotonic clocks (`ContinuousClock.now + .seconds(1)`).
    @inlinable
    public func withLock<Deadline: MonotonicClockConvertible, Result, Failure: Error>(
        before deadline: Deadline,
        _ body: (inout sending Value) throws(Failure) -> sending Result
    ) throws(Failure) -> sending Result? {
        try withLock(before: deadline.monotonicInstant, body)
    }
}

extension DistributedLock {
    /// As `lock(before:)` with a `MonotonicClock` deadline, with `deadline`
    /// on any of Spindle's and Swift's monotonic clocks or the wall clock,
    /// converted once on entry. Blocks at most until `deadline`.
    @available(*, noasync, message: "sleeps between tries; in async code try with `tryLock()` between `Task.sleep`s, or lock on a pool worker")
    public func lock<Deadline: MonotonicClockConvertible>(before deadline: Deadline) throws(Error) -> Bool {
        try lock(before: deadline.monotonicInstant)
    }
}
