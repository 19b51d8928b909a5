/// The role of Foundation's `NSLocking`, with deadlines: a lock one thread at
/// a time holds.
///
/// Every conforming Spindle lock orders memory the same way: a successful
/// `lock`, `tryLock` or `lock(before:)` *acquires* (nothing the holder does in
/// the critical section moves before it) and `unlock` *releases* (everything
/// done in the critical section is visible to the next holder once it has
/// acquired). That is the guide's "locks incorporate a memory barrier",
/// without the cost of a full one.
public protocol Locking: Sendable {
    /// Acquires the lock, blocking the calling thread while another holds it.
    func lock()

    /// Releases the lock. Calling it without holding the lock is a
    /// programming error; each type says what it detects.
    func unlock()

    /// Acquires the lock if it is free right now. Never blocks.
    func tryLock() -> Bool

    /// Acquires the lock, blocking at most until `deadline` on the monotonic
    /// clock. Returns whether it acquired. A deadline in the past makes this
    /// a `tryLock()`; `.distantFuture` waits forever.
    func lock(before deadline: MonotonicClock.Instant) -> Bool
}

extension Locking {
    /// Acquires the lock, blocking at most `timeout`; returns whether it did.
    @inlinable
    public func lock(timeout: Duration) -> Bool {
        lock(before: MonotonicClock.now.advanced(by: timeout))
    }

    /// Runs `body` holding the lock and returns its result. The lock is
    /// released on every path out of `body`, including a thrown error.
    /// Blocks while another thread holds the lock. Calling it again from
    /// inside `body` deadlocks for a non-recursive lock.
    @inlinable
    public func withLock<Result, Failure: Error>(
        _ body: () throws(Failure) -> Result
    ) throws(Failure) -> Result {
        lock()
        defer { unlock() }
        return try body()
    }

    /// As `withLock`, but gives up at `deadline`: returns `nil` without
    /// running `body` if the lock could not be acquired in time.
    @inlinable
    public func withLock<Result, Failure: Error>(
        before deadline: MonotonicClock.Instant, _ body: () throws(Failure) -> Result
    ) throws(Failure) -> Result? {
        guard lock(before: deadline) else { return nil }
        defer { unlock() }
        return try body()
    }
}
