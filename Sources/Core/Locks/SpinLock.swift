import CShims


/// A test-and-test-and-set spin lock, for tiny critical sections only: a few
/// loads and stores that never block, never allocate and never call out.
/// Replaces pthread's `pthread_spinlock_t` and Darwin's `OSSpinLock`.
///
/// The lock word's states:
///
///     0  free
///     1  held, no waiter asleep
///     2  held, and a waiter may be asleep on the word: `unlock` wakes one
///
/// Uncontended, `lock()` is one compare-and-swap and `unlock()` one atomic
/// exchange, both inlined. A waiter spins on the word with the CPU's pause
/// hint and doubling bursts (`spinLimit` rounds), then sleeps on the word
/// (`futex(FUTEX_WAIT_BITSET)`) until an `unlock` wakes it or its deadline
/// passes, so the timed forms return on time and a waiter never burns a
/// core for long when the holder is descheduled. It never yields the CPU
/// or changes the caller's scheduling. Prefer `Lock` for anything that may
/// be held longer than a few hundred nanoseconds: it spins only while
/// nobody sleeps.
///
/// Memory: acquiring orders like an acquire, `unlock` like a release. Not
/// fair, not recursive. A deadline already past makes `lock(before:)` a
/// `tryLock()`. Misuse: unlocking a lock that is not locked stops the
/// process with a message; locking it again on the thread that holds it
/// deadlocks. `SpinLock` is a handle: copies share one lock.
public struct SpinLock: Locking, @unchecked Sendable {
    // @unchecked: the word is only accessed atomically.

    @usableFromInline
    final class Storage: ManagedBuffer<Void, UInt32> {
        deinit { withUnsafeMutablePointerToElements { LockHooks.destroyed($0) } }
    }

    @usableFromInline let storage: Storage
    @usableFromInline let word: UnsafeMutablePointer<UInt32>

    @usableFromInline static var locked: UInt32 { 1 }
    @usableFromInline static var contended: UInt32 { 2 }

    /// Doubling pause bursts before sleeping: 1, 2, … 64 pauses, about
    /// 1.5 µs in all on x86_64 (a pause is ~40 cycles on recent cores): the
    /// length of a tiny critical section plus a cache-line transfer.
    @usableFromInline static var spinLimit: Int { 7 }

    /// A new, unlocked spin lock.
    public init() {
        let buffer = Storage.create(minimumCapacity: 1) { _ in }
        storage = unsafeDowncast(buffer, to: Storage.self)
        word = storage.withUnsafeMutablePointerToElements { $0 }
        word.initialize(to: 0)
        LockHooks.tsanCreated(word)
    }

    /// The raw lock word, for tests and diagnostics: 0 when idle.
    package var wordValue: UInt32 { AtomicMemory.load(from: word, ordering: .relaxed) }

    /// Acquires the lock, spinning briefly and then sleeping on a futex while
    /// it is held. Blocks. Acquire ordering.
    @inlinable
    public func lock() {
        Perturbation.point(.lockAcquire)
        LockHooks.willLock(word, .spinLock)
        // Pairs with the releasing exchange in `unlock`.
        if !AtomicMemory.compareAndSwap(expected: 0, desired: Self.locked, at: word, ordering: .acquiring) {
            _ = lockContended(deadline: .distantFuture)
        }
        LockHooks.tsanAcquired(word)
    }

    /// Acquires the lock if it is free now. Never blocks, never spins.
    /// Acquire ordering on success.
    @inlinable
    public func tryLock() -> Bool {
        Perturbation.point(.lockAcquire)
        guard tryAcquire() else { return false }
        LockHooks.tsanAcquired(word, LockHooks.tsanTry)
        LockHooks.didTryLock(word, .spinLock)
        return true
    }

    /// `tryLock` without the hooks (see `LockHooks`).
    @inlinable
    func tryAcquire() -> Bool {
        AtomicMemory.load(from: word, ordering: .relaxed) == 0
            && AtomicMemory.compareAndSwap(expected: 0, desired: Self.locked, at: word, ordering: .acquiring)
    }

    /// Acquires the lock, spinning briefly and then sleeping at most until
    /// `deadline`. Returns whether it acquired. Blocks. Acquire ordering on
    /// success. A deadline already past makes this `tryLock()`.
    @inlinable
    public func lock(before deadline: MonotonicClock.Instant) -> Bool {
        Perturbation.point(.lockAcquire)
        LockHooks.willLock(word, .spinLock)
        guard
            AtomicMemory.compareAndSwap(expected: 0, desired: Self.locked, at: word, ordering: .acquiring)
                || lockContended(deadline: deadline)
        else {
            LockHooks.lockFailed(word, .spinLock)
            return false
        }
        LockHooks.tsanAcquired(word)
        return true
    }

    /// Releases the lock with one releasing exchange, and wakes one sleeping
    /// waiter if the word says one may sleep (a system call only then).
    /// Never blocks. Release ordering. Stops the process with a message if
    /// the lock is not locked.
    @inlinable
    public func unlock() {
        defer { Perturbation.point(.lockRelease) }
        LockHooks.willUnlock(word, .spinLock)
        LockHooks.tsanReleasing(word)
        // Pairs with the acquiring compare-and-swap or exchange of the next holder.
        let previous = AtomicMemory.exchange(0, at: word, ordering: .releasing)
        if previous == Self.locked { return }
        require(previous != 0, "SpinLock.unlock(): the lock is not locked")
        Futex(word).wake(1)
    }

    @usableFromInline
    @inline(never)
    func lockContended(deadline: MonotonicClock.Instant) -> Bool {
        // A deadline already past: exactly `tryLock`, no spin, no mark.
        if !deadline.isDistantFuture && MonotonicClock.now >= deadline { return tryAcquire() }
        // Test, then test-and-set: spin on a load, which keeps the line
        // shared instead of bouncing it between cores.
        for round in 0..<Self.spinLimit {
            let state = AtomicMemory.load(from: word, ordering: .relaxed)
            if state == 0 {
                if AtomicMemory.compareAndSwap(expected: 0, desired: Self.locked, at: word, ordering: .acquiring) {
                    return true
                }
            } else if state == Self.contended {
                break  // someone sleeps already: spinning would jump the queue for little gain
            }
            for _ in 0..<(1 << round) { spinLoopHint() }
        }
        // Sleep. Whoever takes the lock from here marks it `contended`, since
        // other sleepers may remain: the next unlock then wakes one of them.
        let futex = Futex(word)
        while true {
            if AtomicMemory.exchange(Self.contended, at: word, ordering: .acquiring) == 0 { return true }
            if !deadline.isDistantFuture && MonotonicClock.now >= deadline { return false }
            _ = futex.wait(expecting: Self.contended, until: deadline)
        }
    }
}
