/// A mutual-exclusion lock on a futex: Spindle's `NSLock` / `pthread_mutex_t`.
///
/// - Uncontended, `lock()` and `unlock()` are one atomic compare-and-swap each,
///   inlined into the caller; no system call.
/// - Contended, a thread spins briefly (only while nobody is asleep on the
///   lock, so an oversubscribed machine does not burn its cores), then sleeps
///   in the kernel (`futex(FUTEX_WAIT_BITSET)`) until an `unlock` wakes it.
/// - Eventually fair, within limits: the lock normally goes to whichever
///   thread grabs it first (the fastest policy). A sleeper that is woken and
///   finds the lock taken again becomes the lock's heir, and about every
///   `fairnessInterval` an `unlock` hands the lock straight to the heir; the
///   other sleepers keep their order meanwhile (see `FutexMutex`). Every
///   waiter gets in (a stress test holds the lock with barging threads and
///   checks), but the shares are not equal. Measured over 40 ms windows on
///   2 cores, least / most operations of one thread: 0.50–0.99 at 2 threads
///   (pthread's adaptive mutex 0.43–0.98 in the same runs), 0.4–0.6 at 4,
///   0.3–0.5 at 8, 0.04–0.2 at 16. With more runnable threads than cores
///   the scheduler, not the lock, decides who runs when the lock is free;
///   every peer measured does as badly or worse.
/// - Deadlines on the monotonic clock (`lock(before:)`, `lock(timeout:)`).
///
/// `Lock` is a handle: copies share one lock. The lock word lives in a
/// 32-byte heap object (the lock word, the heir word and the hand-off time;
/// one 48-byte glibc malloc block; `NSLock` takes two allocations, 80 bytes
/// requested) that never moves.
///
/// Memory: acquiring orders like an acquire, `unlock` like a release (see
/// `Locking`). Misuse: `unlock()` of a lock that is not locked stops the
/// process with a message. Unlocking from a thread other than the holder is
/// not detected (tracking the owner would cost the fast path); use
/// `RecursiveLock` when you want ownership checked. Not recursive: locking it
/// again on the thread that holds it deadlocks.
public struct Lock: Locking, @unchecked Sendable {
    // @unchecked: the storage is only touched through atomics on the lock
    // word and, for the hand-off time, by the thread holding the lock.

    /// How often, on average, a busy lock hands itself to its longest sleeper.
    public static var fairnessInterval: Duration { FutexMutex.fairnessInterval }

    @usableFromInline
    final class Storage: ManagedBuffer<Int64, UInt32> {}
    // Header: the next hand-off time; two tail elements: the lock word and
    // the heir word. 16 (object header) + 8 + 4 + 4 = 32 bytes on the heap.

    @usableFromInline let storage: Storage
    @usableFromInline let mutex: FutexMutex

    /// A new, unlocked lock.
    public init() {
        let buffer = Storage.create(minimumCapacity: 2) { _ in 0 }
        storage = unsafeDowncast(buffer, to: Storage.self)
        let words = storage.withUnsafeMutablePointerToElements { $0 }
        words.initialize(repeating: 0, count: 2)
        mutex = FutexMutex(word: words, heirWord: words + 1, nextHandoff: storage.withUnsafeMutablePointerToHeader { $0 })
    }

    /// The raw lock word, for tests and diagnostics: 0 when idle.
    public var wordValue: UInt32 { AtomicMemory.load(from: mutex.word, ordering: .relaxed) }

    /// Acquires the lock, sleeping while another thread holds it.
    /// Blocks. Acquire ordering. Deadlocks if the caller already holds it.
    @inlinable
    public func lock() { mutex.lock() }

    /// Acquires the lock if it is free now. Never blocks. Acquire ordering on
    /// success. Returns false while another thread holds it (also while a
    /// hand-off to a sleeper is pending).
    @inlinable
    public func tryLock() -> Bool { mutex.tryLock() }

    /// Acquires the lock, sleeping at most until `deadline`. Returns whether
    /// it acquired. Blocks. Acquire ordering on success.
    @inlinable
    public func lock(before deadline: MonotonicClock.Instant) -> Bool { mutex.lock(before: deadline) }

    /// Releases the lock, waking a sleeper if there is one. Never blocks; a
    /// system call only when a thread sleeps on the lock. Release ordering.
    /// Stops the process with a message if the lock is not locked.
    @inlinable
    public func unlock() { mutex.unlock() }
}

extension Lock: Equatable {
    /// Two handles are equal when they are the same lock.
    public static func == (a: Lock, b: Lock) -> Bool { a.storage === b.storage }
}
