/// A condition variable that waits with a `Lock` the caller holds: the POSIX
/// pairing of `pthread_cond_t` and `pthread_mutex_t`, on futexes.
///
/// The caller locks its `Lock`, tests the predicate, and calls
/// `wait(releasing: lock)` while the predicate is false; the signalling thread
/// changes the predicate holding the same lock and calls `signal()` or
/// `broadcast()`. One lock can serve several variables (a bounded buffer's
/// "not empty" and "not full"), which `Condition` cannot express.
///
/// - One variable, one lock: the first `wait` pairs the variable with its
///   lock for the variable's lifetime (the guide warns that changing the
///   pairing causes errors); waiting with any other lock stops the process
///   with a message. The variable keeps its lock alive.
/// - Spurious wake-ups may happen; lost wake-ups do not. Always wait in a loop
///   on a predicate.
/// - A waiter spins on the variable's sequence word before it sleeps
///   (`futex(FUTEX_WAIT_BITSET)`), up to 13 µs and only as long as spinning
///   has been paying off (`AdaptiveSpin`); `broadcast` wakes one sleeper and
///   moves the others onto the lock's word (`futex(FUTEX_CMP_REQUEUE)`), so
///   they come back one per `unlock` instead of as a herd.
/// - Deadlines are on `MonotonicClock`; `.distantFuture` waits forever and a
///   deadline already past returns at once.
///
/// `ConditionVariable` is a handle: copies share one variable.
///
/// Memory: `wait` releases the lock on the way in and acquires it on the way
/// out. `signal` and `broadcast` order nothing by themselves: change the
/// predicate under the lock, which publishes it.
///
/// Misuse that stops the process with a message: waiting with a second lock,
/// waiting with a lock that is not locked. Waiting with a lock that another
/// thread holds is not detected.
public struct ConditionVariable: @unchecked Sendable {
    // @unchecked: the storage is only touched through atomics on its words;
    // the paired lock is published once by compare-and-swap and never changes.

    /// The words, laid out by this struct (read through
    /// `MemoryLayout.offset(of:)`).
    @usableFromInline
    struct Words {
        /// The paired lock's storage: a retained object pointer, 0 until the
        /// first wait (atomic).
        @usableFromInline var paired: UInt
        /// The condition's own words (`FutexCondition`).
        @usableFromInline var condition: FutexCondition.Words
    }

    /// Owns the words (`Words`), in a heap block that never moves.
    @usableFromInline
    final class Storage {
        @usableFromInline let base: UnsafeMutableRawPointer
        init() {
            base = allocateStableWords(byteCount: MemoryLayout<Words>.size)
            FutexCondition.initialize(at: base + MemoryLayout<Words>.offset(of: \.condition)!)
        }
        deinit {
            let paired = AtomicMemory.load(
                from: (base + MemoryLayout<Words>.offset(of: \.paired)!).assumingMemoryBound(to: UInt.self),
                ordering: .acquiring)
            if let pointer = UnsafeRawPointer(bitPattern: paired) {
                Unmanaged<Lock.Storage>.fromOpaque(pointer).release()
            }
            deallocateStableWords(base)
        }
    }

    @usableFromInline let storage: Storage

    /// A new condition variable, not yet paired with a lock.
    public init() {
        storage = Storage()
    }

    @inlinable
    var pairedWord: UnsafeMutablePointer<UInt> {
        (storage.base + MemoryLayout<Words>.offset(of: \.paired)!).assumingMemoryBound(to: UInt.self)
    }

    @inlinable
    var queue: FutexCondition { FutexCondition(base: storage.base + MemoryLayout<Words>.offset(of: \.condition)!) }

    // MARK: Waiting

    /// Releases `lock`, sleeps until signalled (or spuriously woken), and takes
    /// `lock` again before returning. The caller must hold `lock`. Blocks.
    /// Release ordering on the way in, acquire on the way out. Stops the
    /// process with a message if `lock` is not locked or is not the lock this
    /// variable is paired with.
    @inlinable
    @available(*, noasync, message: "blocks the thread; in async code wait with an `AsyncLock`, or `await` a `WorkGroup`, `Semaphore` or continuation")
    public func wait(releasing lock: Lock) {
        _ = wait(releasing: lock, until: .distantFuture) as WaitResult
    }

    /// As `wait(releasing:)`, but gives up at `deadline` on the monotonic
    /// clock. Returns `.timedOut` if the deadline passed without a signal or
    /// broadcast, `.completed` otherwise (including a spurious wake-up: test
    /// the predicate again). Either way `lock` is held again on return.
    /// `.distantFuture` waits forever; a deadline already past returns
    /// `.timedOut` at once, without releasing `lock` (it still pairs the
    /// variable with `lock`).
    @inlinable
    @discardableResult
    @available(*, noasync, message: "blocks the thread; in async code wait with an `AsyncLock`, or `await` a `WorkGroup`, `Semaphore` or continuation")
    public func wait(releasing lock: Lock, until deadline: MonotonicClock.Instant) -> WaitResult {
        let identity = UInt(bitPattern: Unmanaged.passUnretained(lock.storage).toOpaque())
        if AtomicMemory.load(from: pairedWord, ordering: .relaxed) != identity {
            pair(with: lock)
        }
        require(
            AtomicMemory.load(from: lock.mutex.word, ordering: .relaxed) & LockWord.locked != 0,
            "ConditionVariable.wait(releasing:): `lock` is not locked; lock it, test the predicate, then wait")
        if !deadline.isDistantFuture && MonotonicClock.now >= deadline { return .timedOut }
        return queue.wait(releasing: lock.mutex, flushingWakes: false, until: deadline) ? .completed : .timedOut
    }

    /// As `wait(releasing:until:)`, with a deadline `timeout` from now.
    @inlinable
    @discardableResult
    @available(*, noasync, message: "blocks the thread; in async code wait with an `AsyncLock`, or `await` a `WorkGroup`, `Semaphore` or continuation")
    public func wait(releasing lock: Lock, timeout: Duration) -> WaitResult {
        wait(releasing: lock, until: MonotonicClock.now.advanced(by: timeout))
    }

    /// Pairs the variable with `lock` if it has no lock yet; stops the process
    /// if it has another.
    @usableFromInline
    @inline(never)
    func pair(with lock: Lock) {
        let candidate = Unmanaged.passRetained(lock.storage)
        let identity = UInt(bitPattern: candidate.toOpaque())
        // Releasing: publishes nothing but the pointer itself, which the
        // broadcaster reads with an acquire (through the waiter count).
        let (paired, found) = AtomicMemory.compareExchange(
            expected: 0, desired: identity, at: pairedWord, ordering: .acquiringAndReleasing)
        if paired { return }
        candidate.release()
        require(
            found == identity,
            "ConditionVariable.wait(releasing:): this variable is already paired with another Lock; "
                + "every wait on one condition variable must use the same lock")
    }

    // MARK: Signalling

    /// Wakes one thread waiting on the variable, if any. Call it holding the
    /// paired lock, after changing the predicate. Never blocks; one load when
    /// nobody waits, a system call only when a waiter sleeps in the kernel.
    /// While the lock is held, a sleeping waiter is not woken but moved onto
    /// the lock's word (`futex(FUTEX_CMP_REQUEUE)`), and the lock's `unlock`
    /// wakes it: woken at once, it would only find the lock held. Orders no
    /// memory by itself (the lock does).
    @inlinable
    public func signal() {
        Perturbation.point(.conditionSignal)
        guard queue.hasWaiters else { return }
        signalWaiting()
    }

    @usableFromInline
    @inline(never)
    func signalWaiting() {
        LockHooks.tsanSignal(storage.base) { queue.signalMoving(onto: pairedMutex()) }
    }

    /// Wakes every thread waiting on the variable, moving sleepers onto the
    /// paired lock's word so that they return one per `unlock`. Never blocks.
    /// Orders no memory by itself (the lock does). Call it holding the paired
    /// lock, after changing the predicate.
    @inlinable
    public func broadcast() {
        Perturbation.point(.conditionSignal)
        guard queue.hasWaiters else { return }
        broadcastWaiting()
    }

    @usableFromInline
    @inline(never)
    func broadcastWaiting() {
        LockHooks.tsanSignal(storage.base) { queue.broadcast(requeueingOnto: pairedMutex()) }
    }

    /// The paired lock's mutex. Called after seeing a waiter: a waiter pairs
    /// the variable before it counts itself among the waiters, and
    /// `hasWaiters` acquires, so the pairing is visible.
    func pairedMutex() -> FutexMutex {
        let paired = AtomicMemory.load(from: pairedWord, ordering: .acquiring)
        let pointer = UnsafeRawPointer(bitPattern: paired)!
        let lockStorage = Unmanaged<Lock.Storage>.fromOpaque(pointer).takeUnretainedValue()
        let words = lockStorage.withUnsafeMutablePointerToElements { $0 }
        return FutexMutex(words: words)
    }
}

extension ConditionVariable: Equatable {
    /// Two handles are equal when they are the same condition variable.
    public static func == (a: ConditionVariable, b: ConditionVariable) -> Bool { a.storage === b.storage }
}
