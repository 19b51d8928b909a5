import CShims

/// A mutual-exclusion lock on a futex: Spindle's `NSLock` / `pthread_mutex_t`.
///
/// A class whose state a lock guards (for a single value, `LockedValue` is
/// simpler):
///
/// ```swift
/// final class Account: @unchecked Sendable {   // @unchecked: `balance` is guarded by `lock`
///     private let lock = Spindle.Lock()
///     private var balance = 0
///
///     func deposit(_ amount: Int) {
///         lock.withLock { balance += amount }
///     }
///
///     func withdraw(_ amount: Int) -> Bool? {
///         guard lock.lock(timeout: .milliseconds(10)) else { return nil }  // busy
///         defer { lock.unlock() }
///         guard balance >= amount else { return false }
///         balance -= amount
///         return true
///     }
/// }
/// ```
///
/// - Uncontended, `lock()` and `unlock()` are one atomic compare-and-swap each,
///   inlined into the caller; no system call.
/// - Contended, a thread spins briefly (only while nobody is asleep on the
///   lock, so an oversubscribed machine does not burn its cores), then sleeps
///   in the kernel (`futex(FUTEX_WAIT_BITSET)`) until an `unlock` wakes it.
/// - Bounded waiting, fast either way. The lock goes to whichever thread
///   grabs it first (the fastest policy), but a thread that has waited
///   about a millisecond is starving: starving threads are handed the lock
///   one at a time, in arrival order, at most one hand-off per
///   `fairnessInterval`, however often other threads re-take it (see
///   `FutexMutex`). With more runnable threads than CPUs, the scheduler
///   adds its own delays to the bound.
/// - Never changes the caller's scheduling: no lock path sets a thread's
///   affinity or priority or calls `sched_yield`; waiting is a bounded spin,
///   then a futex sleep.
/// - Deadlines on the monotonic clock (`lock(before:)`, `lock(timeout:)`).
///
/// `Lock` is a handle: copies share one lock. The lock word lives in a
/// 32-byte heap object (the lock, heir, slot and stamp words;
/// one 48-byte glibc malloc block; `NSLock` takes two allocations, 80 bytes
/// requested) that never moves.
///
/// Memory: acquiring orders like an acquire, `unlock` like a release (see
/// `Locking`). Misuse: `unlock()` of a lock that is not locked stops the
/// process with a message. Unlocking from a thread other than the holder is
/// not detected (tracking the owner would cost the fast path); use
/// `RecursiveLock` when you want ownership checked. Not recursive: `lock()`
/// again on the thread that holds it would wait forever; a debug build of
/// Spindle (and any build with the lock-order checker on, see `LockOrder`)
/// stops the process there with a message naming the lock instead. A
/// release build does not look (it would cost the uncontended path a store
/// of the holder), and the thread hangs.
public struct Lock: Locking, @unchecked Sendable {
    // @unchecked: the storage is only touched through atomics on its words.

    /// The least time between two hand-offs of the lock to a starving
    /// thread (one that has waited about a millisecond).
    public static var fairnessInterval: Duration { LockTuning.fairHandoffInterval }

    @usableFromInline
    final class Storage: ManagedBuffer<Void, UInt32> {
        deinit {
            withUnsafeMutablePointerToElements {
                LockHooks.destroyed($0)
                LockNames.forget($0)
            }
        }
    }
    // No header; tail elements: `FutexMutex.Words`, then the holder's thread
    // token (`cshims_thread_token()`, two elements, 8-byte aligned at offset
    // 32 of the object), kept in debug builds only.
    // 16 (object header) + 4 × 4 + 8 = 40 bytes on the heap (one 48-byte
    // glibc block, as without the token).

    @usableFromInline let storage: Storage
    @usableFromInline let mutex: FutexMutex

    /// A new, unlocked lock.
    public init() {
        let buffer = Storage.create(minimumCapacity: FutexMutex.wordCount + 2) { _ in }
        storage = unsafeDowncast(buffer, to: Storage.self)
        let words = storage.withUnsafeMutablePointerToElements { $0 }
        words.initialize(repeating: 0, count: FutexMutex.wordCount + 2)
        mutex = FutexMutex(words: words)
        LockHooks.tsanCreated(words)
    }

    /// The holder's thread token, in debug builds (0: not held, or held by
    /// a thread that took it back inside a condition's wait).
    @inlinable
    var holderWord: UnsafeMutablePointer<UInt> {
        (UnsafeMutableRawPointer(mutex.word) + MemoryLayout<FutexMutex.Words>.size).assumingMemoryBound(to: UInt.self)
    }

    /// Debug builds: notes the caller as the holder, after it acquired.
    @inlinable
    @inline(__always)
    func tookHold() {
        #if DEBUG
        // Relaxed: only the holder writes it, and a thread compares it only
        // with its own token.
        AtomicMemory.store(UInt(cshims_thread_token()), to: holderWord, ordering: .relaxed)
        #endif
    }

    /// Debug builds: stops if the caller already holds the lock (it would
    /// wait for itself).
    @inlinable
    @inline(__always)
    func checkNotHeldByCaller() {
        #if DEBUG
        if AtomicMemory.load(from: holderWord, ordering: .relaxed) == UInt(cshims_thread_token()) { relocked() }
        #endif
    }

    @usableFromInline
    @inline(never)
    func relocked() -> Never {
        misuse(
            "lock(): \(LockNames.label("Lock", mutex.word)) is already held by the calling thread: a Lock is not recursive, and this thread would wait for itself forever (use RecursiveLock to take a lock again on the thread that holds it)")
    }

    /// A name for the lock, for people reading diagnostics (Foundation's
    /// `NSLock.name`): shown in `description` and in the message with which
    /// misuse stops the process. `nil` (the default) for none. Settable on
    /// any copy of the handle, from any thread; every copy sees it.
    ///
    /// Kept in a side table, not in the lock (see `LockNames` in the
    /// sources): an unnamed lock is no bigger and `lock()`/`unlock()` never reads
    /// the name. Reading or setting it takes that table's lock (it blocks
    /// only for another name's read or write) and orders nothing else.
    public var name: String? {
        get { LockNames.name(at: mutex.word) }
        nonmutating set { LockNames.setName(newValue, at: mutex.word) }
    }

    /// The raw lock word, for tests and diagnostics: 0 when idle.
    package var wordValue: UInt32 { AtomicMemory.load(from: mutex.word, ordering: .relaxed) }

    /// For tests and diagnostics: the starving threads waiting for a
    /// hand-off off the lock word (the heir included); 0 when nobody waits.
    /// Never blocks; a relaxed snapshot that orders nothing.
    package var threadsWaitingForTurn: Int { mutex.threadsWaitingForTurn }

    /// Acquires the lock, sleeping while another thread holds it.
    /// Blocks. Acquire ordering. Deadlocks if the caller already holds it.
    @inlinable
    @inline(__always)
    public func lock() {
        LockHooks.willLock(mutex.word, .lock)
        checkNotHeldByCaller()
        mutex.lock()
        tookHold()
    }

    /// Acquires the lock if it is free now. Never blocks. Acquire ordering on
    /// success. Returns false while another thread holds it (also while a
    /// hand-off to a sleeper is pending).
    @inlinable
    public func tryLock() -> Bool {
        guard mutex.tryLock() else { return false }
        LockHooks.didTryLock(mutex.word, .lock)
        tookHold()
        return true
    }

    /// Acquires the lock, sleeping at most until `deadline`. Returns whether
    /// it acquired. Blocks. Acquire ordering on success.
    @inlinable
    public func lock(before deadline: MonotonicClock.Instant) -> Bool {
        LockHooks.willLock(mutex.word, .lock)
        guard mutex.lock(before: deadline) else {
            LockHooks.lockFailed(mutex.word, .lock)
            return false
        }
        tookHold()
        return true
    }

    /// Releases the lock, waking a sleeper if there is one. Never blocks; a
    /// system call only when a thread sleeps on the lock. Release ordering.
    /// Stops the process with a message if the lock is not locked.
    @inlinable
    @inline(__always)
    public func unlock() {
        LockHooks.willUnlock(mutex.word, .lock)
        #if DEBUG
        AtomicMemory.store(0, to: holderWord, ordering: .relaxed)
        #endif
        mutex.unlock()
    }
}

extension Lock: Equatable {
    /// Two handles are equal when they are the same lock.
    public static func == (a: Lock, b: Lock) -> Bool { a.storage === b.storage }
}
