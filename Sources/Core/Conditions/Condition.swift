import CShims

/// A lock and a condition in one object: Spindle's `NSCondition`.
///
/// Lock it like a `Lock`, test your predicate, and `wait()` while the
/// predicate is false; another thread changes the predicate while holding
/// the lock and calls `signal()` (wake one waiter) or `broadcast()` (wake
/// all). `wait` releases the lock while the thread waits and takes it again
/// before returning, so the predicate is always tested under the lock:
///
/// ```swift
/// final class Mailbox: @unchecked Sendable {   // @unchecked: `letters` is guarded by `condition`
///     private let condition = Condition()
///     private var letters: [String] = []
///
///     func post(_ letter: String) {
///         condition.lock()
///         letters.append(letter)
///         condition.signal()                   // wakes a reader once the lock is released
///         condition.unlock()
///     }
///
///     func take() -> String {
///         condition.lock()
///         defer { condition.unlock() }
///         while letters.isEmpty { condition.wait() }  // releases the lock while it sleeps
///         return letters.removeFirst()
///     }
/// }
/// ```
///
/// - Spurious wake-ups are part of the model: `wait` may return although
///   nobody signalled (among others, when a signal meant for another waiter
///   arrives at the same moment). Always wait in a loop on a predicate.
///   Lost wake-ups are not: a signal issued after a waiter released the lock
///   inside `wait` always reaches a waiter.
/// - Futex-based, no pthread: the lock is Spindle's `Lock` algorithm on one
///   word, the condition a sequence word beside it (both in one 64-byte
///   heap block that never moves). A waiter spins on the sequence before it
///   sleeps in the kernel (`futex(FUTEX_WAIT_BITSET)`), up to 13 µs and only
///   as long as spinning has been paying off on this condition
///   (`AdaptiveSpin`), so a signal to a thread that is about to sleep costs
///   no system call.
/// - A signal issued under the lock wakes a sleeping waiter when the lock is
///   released, not before: a waiter woken earlier would only find the lock
///   held and have to sleep again.
/// - `broadcast` wakes one waiter and moves the others, still asleep, onto
///   the lock's word (`futex(FUTEX_CMP_REQUEUE)`); each `unlock` then wakes
///   the next. No thundering herd on the lock.
/// - Deadlines are on `MonotonicClock`; `.distantFuture` waits forever and a
///   deadline already past returns at once.
///
/// `Condition` is a handle: copies share one condition.
///
/// Memory: the lock orders memory as `Lock` does (acquire on locking, release
/// on unlocking); `wait` releases on the way in and acquires on the way out.
/// `signal` and `broadcast` order nothing by themselves: change the predicate
/// under the lock, which publishes it.
///
/// Misuse: `unlock()` of an unlocked condition, or `wait` while the condition
/// is not locked at all, stops the process with a message. Waiting while
/// another thread holds the lock is not detected (tracking the owner would
/// cost the fast path). Not recursive: locking it again on the thread that
/// holds it deadlocks.
public struct Condition: Locking, @unchecked Sendable {
    // @unchecked: the storage is only touched through atomics on its words.

    /// Owns the words: the lock's (`FutexMutex.Words`, at 0) and the
    /// condition's (right after them).
    @usableFromInline
    final class Storage {
        @usableFromInline let base: UnsafeMutableRawPointer
        init() {
            base = allocateStableWords(byteCount: Condition.conditionOffset + FutexCondition.byteCount)
            FutexCondition.initialize(at: base + Condition.conditionOffset)
            LockHooks.tsanCreated(base)
        }
        deinit {
            LockHooks.destroyed(base)
            LockNames.forget(base)
            deallocateStableWords(base)
        }
    }

    @usableFromInline let storage: Storage

    /// A name for the condition, for people reading diagnostics (Foundation's
    /// `NSCondition.name`): shown in `description` and in the message with which
    /// misuse stops the process. `nil` (the default) for none. Settable on
    /// any copy of the handle, from any thread; every copy sees it.
    ///
    /// Kept in a side table, not in the condition (see `LockNames` in the
    /// sources): an unnamed condition is no bigger and `lock()`/`unlock()`/`signal()` never reads
    /// the name. Reading or setting it takes that table's lock (it blocks
    /// only for another name's read or write) and orders nothing else.
    public var name: String? {
        get { LockNames.name(at: storage.base) }
        nonmutating set { LockNames.setName(newValue, at: storage.base) }
    }

    /// A new, unlocked condition with no waiters.
    public init() {
        storage = Storage()
    }

    /// Where the condition's words begin: after the lock's, 8-byte aligned.
    @inlinable
    static var conditionOffset: Int { (MemoryLayout<FutexMutex.Words>.size + 7) & ~7 }

    @inlinable
    var mutex: FutexMutex { FutexMutex(at: storage.base) }

    @inlinable
    var queue: FutexCondition { FutexCondition(base: storage.base + Self.conditionOffset) }

    /// The raw lock word, for tests and diagnostics: 0 when idle.
    public var lockWordValue: UInt32 { AtomicMemory.load(from: mutex.word, ordering: .relaxed) }

    // MARK: Locking

    /// Acquires the lock, sleeping while another thread holds it. Blocks.
    /// Acquire ordering. Deadlocks if the caller already holds it.
    @inlinable
    public func lock() {
        LockHooks.willLock(storage.base, .condition)
        mutex.lock()
    }

    /// Acquires the lock if it is free now. Never blocks. Acquire ordering on
    /// success.
    @inlinable
    public func tryLock() -> Bool {
        guard mutex.tryLock() else { return false }
        LockHooks.didTryLock(storage.base, .condition)
        return true
    }

    /// Acquires the lock, sleeping at most until `deadline`; returns whether it
    /// did. Blocks. Acquire ordering on success.
    @inlinable
    public func lock(before deadline: MonotonicClock.Instant) -> Bool {
        LockHooks.willLock(storage.base, .condition)
        guard mutex.lock(before: deadline) else {
            LockHooks.lockFailed(storage.base, .condition)
            return false
        }
        return true
    }

    /// Releases the lock, waking a thread asleep on it if there is one, and
    /// then the waiters that signals issued under the lock are to wake. Never
    /// blocks; one compare-and-swap when nobody sleeps. Release ordering.
    /// Stops the process with a message if the condition is not locked.
    @inlinable
    public func unlock() {
        LockHooks.willUnlock(storage.base, .condition)
        queue.unlockFlushingWakes(mutex)
    }

    // MARK: Waiting

    /// Releases the lock, sleeps until signalled (or spuriously woken), and
    /// takes the lock again before returning. The caller must hold the lock.
    /// Blocks. Release ordering on the way in, acquire on the way out.
    /// Stops the process with a message if the condition is not locked.
    @inlinable
    @available(*, noasync, message: "blocks the thread; in async code wait with an `AsyncLock`, or `await` a `WorkGroup`, `Semaphore` or continuation")
    public func wait() {
        _ = wait(until: .distantFuture) as WaitResult
    }

    /// As `wait()`, but gives up at `deadline` on the monotonic clock.
    /// Returns `.timedOut` if the deadline passed without a signal or
    /// broadcast, `.completed` otherwise (including a spurious wake-up: test
    /// the predicate again). Either way the lock is held again on return.
    /// `.distantFuture` waits forever; a deadline already past returns
    /// `.timedOut` at once, without releasing the lock.
    @inlinable
    @available(*, noasync, message: "blocks the thread; in async code wait with an `AsyncLock`, or `await` a `WorkGroup`, `Semaphore` or continuation")
    public func wait(until deadline: MonotonicClock.Instant) -> WaitResult {
        let mutex = self.mutex
        require(
            AtomicMemory.load(from: mutex.word, ordering: .relaxed) & LockWord.locked != 0,
            "\(LockNames.label("Condition", storage.base)).wait: the condition is not locked; lock it, test the predicate, then wait")
        if !deadline.isDistantFuture && MonotonicClock.now >= deadline { return .timedOut }
        return queue.wait(releasing: mutex, flushingWakes: true, until: deadline) ? .completed : .timedOut
    }

    /// As `wait(until:)`, with a deadline `timeout` from now.
    @inlinable
    @available(*, noasync, message: "blocks the thread; in async code wait with an `AsyncLock`, or `await` a `WorkGroup`, `Semaphore` or continuation")
    public func wait(timeout: Duration) -> WaitResult {
        wait(until: MonotonicClock.now.advanced(by: timeout))
    }

    // MARK: Signalling

    /// Wakes one thread waiting on the condition, if any. Call it holding the
    /// lock, after changing the predicate (the guide's rule: otherwise a
    /// thread that is about to wait may miss it). Never blocks; one load when
    /// nobody waits. A waiter asleep in the kernel is woken by the `unlock`
    /// (or `wait`) that releases the lock, since it could not return before
    /// that anyway; if the lock is not held, at once. Orders no memory by
    /// itself (the lock does).
    @inlinable
    public func signal() {
        Perturbation.point(.conditionSignal)
        LockHooks.tsanSignal(storage.base) { queue.signalDeferring(to: mutex) }
    }

    /// Wakes every thread waiting on the condition. Never blocks. Sleeping
    /// waiters are moved onto the lock's word, so they come back one at a
    /// time as the lock is released instead of all at once. Orders no memory
    /// by itself (the lock does). Call it holding the lock, after changing
    /// the predicate.
    @inlinable
    public func broadcast() {
        Perturbation.point(.conditionSignal)
        LockHooks.tsanSignal(storage.base) { queue.broadcast(requeueingOnto: mutex) }
    }
}

extension Condition: Equatable {
    /// Two handles are equal when they are the same condition.
    public static func == (a: Condition, b: Condition) -> Bool { a.storage === b.storage }
}
