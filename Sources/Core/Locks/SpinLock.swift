#if canImport(Glibc)
import Glibc
#endif

/// A test-and-test-and-set spin lock, for tiny critical sections only: a few
/// loads and stores that never block, never allocate and never call out.
///
/// `unlock()` is a single releasing store, cheaper than any futex lock's
/// read-modify-write, which is the reason to choose this type. The price is
/// paid under contention: a waiter spins on the word with the CPU's pause
/// hint and exponential backoff; after `spinLimit` rounds it yields the CPU
/// (`sched_yield`) between attempts, and after `yieldLimit` yields it sleeps
/// in 1 ms futex naps, so a waiter never burns a core for long even when the
/// holder has been descheduled (no busy-wait without a bound). Because unlock
/// never wakes anyone, a napping waiter notices a free lock up to 1 ms late:
/// use `Lock` for anything that may be held longer than a few hundred
/// nanoseconds, or on a machine with more runnable threads than cores.
///
/// Memory: acquiring orders like an acquire, `unlock` like a release. Not
/// fair, not recursive. Misuse: unlocking a lock that is not locked stops the
/// process with a message. `SpinLock` is a handle: copies share one lock.
public struct SpinLock: Locking, @unchecked Sendable {
    // @unchecked: the word is only accessed atomically.

    @usableFromInline
    final class Storage: ManagedBuffer<Void, UInt32> {}

    @usableFromInline let storage: Storage
    @usableFromInline let word: UnsafeMutablePointer<UInt32>

    /// Doubling pause bursts before the first yield: 1, 2, … 64 pauses, about
    /// 1.5 µs in all on x86_64 (a pause is ~40 cycles on recent cores).
    @usableFromInline static var spinLimit: Int { 7 }
    /// Yields before napping: each is a system call of ~0.5 µs when nothing
    /// else wants the CPU, a time slice when something does.
    @usableFromInline static var yieldLimit: Int { 16 }

    /// A new, unlocked spin lock.
    public init() {
        let buffer = Storage.create(minimumCapacity: 1) { _ in }
        storage = unsafeDowncast(buffer, to: Storage.self)
        word = storage.withUnsafeMutablePointerToElements { $0 }
        word.initialize(to: 0)
    }

    /// The raw lock word, for tests and diagnostics: 0 when idle.
    package var wordValue: UInt32 { AtomicMemory.load(from: word, ordering: .relaxed) }

    /// Acquires the lock, spinning (then yielding, then napping) while it is
    /// held. Blocks.
    @inlinable
    public func lock() {
        if !AtomicMemory.compareAndSwap(expected: 0, desired: 1, at: word, ordering: .acquiring) {
            _ = lockContended(deadline: .distantFuture)
        }
    }

    /// Acquires the lock if it is free now. Never blocks.
    @inlinable
    public func tryLock() -> Bool {
        AtomicMemory.load(from: word, ordering: .relaxed) == 0
            && AtomicMemory.compareAndSwap(expected: 0, desired: 1, at: word, ordering: .acquiring)
    }

    /// Acquires the lock, giving up at `deadline`. Blocks.
    @inlinable
    public func lock(before deadline: MonotonicClock.Instant) -> Bool {
        AtomicMemory.compareAndSwap(expected: 0, desired: 1, at: word, ordering: .acquiring)
            || lockContended(deadline: deadline)
    }

    /// Releases the lock with one releasing store. Never blocks, never wakes
    /// anyone (waiters poll). Stops the process if the lock is not locked.
    @inlinable
    public func unlock() {
        // The load hits the line this thread just wrote in lock().
        require(AtomicMemory.load(from: word, ordering: .relaxed) != 0, "SpinLock.unlock(): the lock is not locked")
        AtomicMemory.store(0, to: word, ordering: .releasing)
    }

    @usableFromInline
    @inline(never)
    func lockContended(deadline: MonotonicClock.Instant) -> Bool {
        var round = 0
        while true {
            // Test, then test-and-set: spin on a load, which keeps the line
            // shared instead of bouncing it between cores.
            if AtomicMemory.load(from: word, ordering: .relaxed) == 0,
                AtomicMemory.compareAndSwap(expected: 0, desired: 1, at: word, ordering: .acquiring)
            {
                return true
            }
            if round < Self.spinLimit {
                for _ in 0..<(1 << round) { spinLoopHint() }
            } else {
                if MonotonicClock.now >= deadline { return false }
                if round < Self.spinLimit + Self.yieldLimit {
                    sched_yield()
                } else {
                    let nap = min(deadline, MonotonicClock.now.advanced(by: .milliseconds(1)))
                    _ = Futex(word).wait(expecting: 1, until: nap)
                }
            }
            round += 1
        }
    }
}
