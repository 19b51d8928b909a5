/// An internal lock on the plain barging core (`PlainFutexMutex`), for state
/// held for a few instructions and never while blocking: the run loop's and
/// the event registry's tables. No fairness policy: whoever finds it free
/// takes it. Blocking, ordering and misuse as `PlainFutexMutex`'s. A handle:
/// copies share one lock word, in a 20-byte heap object that never moves.
struct GuardLock: Locking, @unchecked Sendable {
    // @unchecked: the word is only touched through atomics.

    final class Storage: ManagedBuffer<Void, UInt32> {}

    let storage: Storage
    let mutex: PlainFutexMutex

    /// A new, unlocked guard.
    init() {
        storage = unsafeDowncast(Storage.create(minimumCapacity: 1) { _ in }, to: Storage.self)
        let word = storage.withUnsafeMutablePointerToElements { $0 }
        word.initialize(to: 0)
        mutex = PlainFutexMutex(word: word)
    }

    @inline(__always) func lock() { mutex.lock() }
    @inline(__always) func tryLock() -> Bool { mutex.tryLock() }
    func lock(before deadline: MonotonicClock.Instant) -> Bool { mutex.lock(before: deadline) }
    @inline(__always) func unlock() { mutex.unlock() }

    /// In a child after `fork()`, where a parent thread may have held it:
    /// unlocked again. No other thread exists there to hold it.
    func reinitializeAfterFork() {
        AtomicMemory.store(0, to: mutex.word, ordering: .relaxed)
    }
}
