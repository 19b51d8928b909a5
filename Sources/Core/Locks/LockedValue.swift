import CShims

/// A value that only the holder of its lock can reach: Spindle's
/// `Synchronization.Mutex<Value>` and NIO's `NIOLockedValueBox`, on `Lock`'s
/// futex core.
///
///     let hits = LockedValue([String: Int]())
///     hits.withLock { $0[path, default: 0] += 1 }
///     let top = hits.withLock { $0.max { $0.value < $1.value } }
///
/// - The value lives in the same heap object as the four lock words (one
///   allocation, made by `init`), and the only way to it is a closure that
///   runs holding the lock. Uncontended, `withLock` is one compare-and-swap
///   to acquire and one to release, inlined into the caller; no system call.
///   Contended, it waits exactly as `Lock.lock()` does (spins briefly, then
///   sleeps on the futex, with the same fairness; see `Lock`).
/// - Every form that takes a deadline (`withLock(before:)`,
///   `withLock(timeout:)`) or none (`withLockIfAvailable`) returns `nil`
///   without running the closure when it could not acquire the lock.
///
/// Memory: acquiring the lock is an acquire and releasing it a release (see
/// `Locking`), so everything a closure did to the value is visible to the
/// next closure that runs on any thread.
///
/// `Sendable` whatever `Value` is, as `Mutex` is, and checked the same way:
/// the initial value is `sending` (the caller gives it up), and each closure
/// gets the value as `inout sending` and returns a `sending` result, so the
/// compiler rejects, for instance, storing into the value an object that the
/// caller goes on using. (Like `Mutex`'s, this checking is not complete on
/// Swift 6.3: a closure that returns a non-`Sendable` reference to the value
/// itself, `withLock { $0 }`, compiles; do not hand such a reference out.)
///
/// `LockedValue` is a handle, like `Lock`: copies share one value and one
/// lock.
///
/// Misuse: not recursive. Calling `withLock` on the same `LockedValue` from
/// inside one of its closures deadlocks (use `withLockIfAvailable` if the
/// caller may already hold it; it returns `nil` then). A closure that does
/// not return (it waits forever, or the thread exits inside it) keeps the
/// lock held.
public struct LockedValue<Value>: @unchecked Sendable {
    // @unchecked: the value is reached only by closures that run holding the
    // lock, and it enters (`init`) and leaves (`withLock`'s result) only as a
    // `sending` value, as `Synchronization.Mutex` does; the lock words are
    // only touched through atomics.

    /// The value (the header) and the lock's words (tail elements:
    /// `FutexMutex.Words`), in one heap object that never moves.
    @usableFromInline
    final class Storage: ManagedBuffer<Value, UInt32> {
        deinit { withUnsafeMutablePointerToElements { LockHooks.destroyed($0) } }
    }

    @usableFromInline let storage: Storage

    /// A value guarded by a new, unlocked lock. Never blocks.
    public init(_ initialValue: consuming sending Value) {
        let buffer = Storage.create(minimumCapacity: FutexMutex.wordCount) { [initialValue] _ in initialValue }
        storage = unsafeDowncast(buffer, to: Storage.self)
        storage.withUnsafeMutablePointerToElements { $0.initialize(repeating: 0, count: FutexMutex.wordCount) }
        LockHooks.tsanCreated(storage.withUnsafeMutablePointerToElements { $0 })
    }

    /// For tests: the raw lock word, 0 when idle. Never blocks; a relaxed
    /// snapshot that orders nothing.
    package var lockWordValue: UInt32 { AtomicMemory.load(from: mutex.word, ordering: .relaxed) }

    /// The lock's algorithm, on the storage's words.
    @inlinable
    var mutex: FutexMutex {
        FutexMutex(words: storage.withUnsafeMutablePointerToElements { $0 })
    }

    /// Where the value lives (the storage's header), valid while `storage`
    /// is alive.
    @inlinable
    var valuePointer: UnsafeMutablePointer<Value> {
        storage.withUnsafeMutablePointerToHeader { $0 }
    }

    /// Runs `body` with the value, holding the lock, and returns its result.
    /// The lock is released on every path out of `body`, including a thrown
    /// error; what `body` changed before it threw stays changed.
    ///
    /// Blocks while another thread holds the lock. Acquire ordering before
    /// `body`, release after. Deadlocks if called from inside a closure of the
    /// same `LockedValue`.
    ///
    /// - Parameter body: A closure that may read and change the value.
    /// - Returns: What `body` returned.
    /// - Throws: What `body` threw, with its type.
    @inlinable
    public func withLock<Result, Failure: Error>(
        _ body: (inout sending Value) throws(Failure) -> sending Result
    ) throws(Failure) -> sending Result {
        let mutex = self.mutex
        LockHooks.willLock(mutex.word, .lockedValue)
        mutex.lock()
        defer {
            LockHooks.willUnlock(mutex.word, .lockedValue)
            mutex.unlock()
        }
        return try body(&valuePointer.pointee)
    }

    /// Runs `body` with the value if the lock is free now; otherwise returns
    /// `nil` without running it (also when the calling thread is the holder).
    /// Never blocks. Acquire ordering before `body` when it runs, release
    /// after.
    @inlinable
    public func withLockIfAvailable<Result, Failure: Error>(
        _ body: (inout sending Value) throws(Failure) -> sending Result
    ) throws(Failure) -> sending Result? {
        let mutex = self.mutex
        guard mutex.tryLock() else { return nil }
        LockHooks.didTryLock(mutex.word, .lockedValue)
        defer {
            LockHooks.willUnlock(mutex.word, .lockedValue)
            mutex.unlock()
        }
        return try body(&valuePointer.pointee)
    }

    /// Runs `body` with the value, holding the lock, if the lock can be
    /// acquired by `deadline` (on `MonotonicClock`); otherwise returns `nil`
    /// without running it. A deadline in the past makes this
    /// `withLockIfAvailable`; `.distantFuture` makes it `withLock`.
    ///
    /// Blocks at most until `deadline`. Acquire ordering before `body` when it
    /// runs, release after. Deadlocks (until the deadline) if called from
    /// inside a closure of the same `LockedValue`.
    @inlinable
    public func withLock<Result, Failure: Error>(
        before deadline: MonotonicClock.Instant,
        _ body: (inout sending Value) throws(Failure) -> sending Result
    ) throws(Failure) -> sending Result? {
        let mutex = self.mutex
        LockHooks.willLock(mutex.word, .lockedValue)
        guard mutex.lock(before: deadline) else {
            LockHooks.lockFailed(mutex.word, .lockedValue)
            return nil
        }
        defer {
            LockHooks.willUnlock(mutex.word, .lockedValue)
            mutex.unlock()
        }
        return try body(&valuePointer.pointee)
    }

    /// As `withLock(before:_:)` with the deadline `timeout` from now on
    /// `MonotonicClock`. A zero or negative timeout makes this
    /// `withLockIfAvailable`.
    @inlinable
    public func withLock<Result, Failure: Error>(
        timeout: Duration,
        _ body: (inout sending Value) throws(Failure) -> sending Result
    ) throws(Failure) -> sending Result? {
        try withLock(before: MonotonicClock.now.advanced(by: timeout), body)
    }
}

extension LockedValue: CustomStringConvertible {
    /// The type and whether the lock is held right now, e.g.
    /// `LockedValue<Int>(unlocked)`. The value is not shown: reading it would
    /// take the lock. Never blocks; a relaxed snapshot that orders nothing.
    public var description: String {
        let held = AtomicMemory.load(from: mutex.word, ordering: .relaxed) & LockWord.locked != 0
        return "LockedValue<\(Value.self)>(\(held ? "locked" : "unlocked"))"
    }
}

extension LockedValue: Equatable {
    /// Two handles are equal when they share one value and lock.
    public static func == (a: LockedValue, b: LockedValue) -> Bool { a.storage === b.storage }
}
