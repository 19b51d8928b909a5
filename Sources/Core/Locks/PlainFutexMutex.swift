/// A barging futex mutex on one 32-bit word, with no fairness policy: the
/// core for internal guards that are held for a few instructions and never
/// while anyone sleeps (`ConditionLock`'s guard). Whoever finds the word
/// free takes it; nobody queues, nobody is handed the lock, and nothing
/// outside the word is touched. The shape of Rust's
/// `library/std/src/sys/sync/mutex/futex.rs`.
///
/// The word's states:
///
///     0  free
///     1  held, no thread asleep on the word
///     2  held, and a thread may be asleep on the word: `unlock` wakes one
///
/// Blocking: `lock()` spins a bounded time (loads only), then sleeps on the
/// word (`futex(FUTEX_WAIT_BITSET)`). Never changes the caller's scheduling.
/// Memory: a successful lock acquires, `unlock` releases (pairs with the
/// next lock). Misuse: `unlock()` of a free word stops the process with a
/// message. Not recursive. The word must live at a stable address.
@usableFromInline
struct PlainFutexMutex {
    @usableFromInline static var locked: UInt32 { 1 }
    @usableFromInline static var contended: UInt32 { 2 }

    @usableFromInline let word: UnsafeMutablePointer<UInt32>

    @inlinable
    init(word: UnsafeMutablePointer<UInt32>) {
        self.word = word
    }

    /// Acquires, spinning briefly and then sleeping. Blocks. Acquire ordering.
    @inlinable
    func lock() {
        // Pairs with the releasing exchange in `unlock`.
        if !AtomicMemory.compareAndSwap(expected: 0, desired: Self.locked, at: word, ordering: .acquiring) {
            lockContended()
        }
    }

    /// Acquires if the word is free now. Never blocks. Acquire ordering on
    /// success.
    @inlinable
    func tryLock() -> Bool {
        AtomicMemory.compareAndSwap(expected: 0, desired: Self.locked, at: word, ordering: .acquiring)
    }

    /// Releases, waking one sleeper if the word says one may sleep. Never
    /// blocks. Release ordering. Stops the process if the word was free.
    @inlinable
    func unlock() {
        // Pairs with the acquiring compare-and-swap or exchange of the next holder.
        let previous = AtomicMemory.exchange(0, at: word, ordering: .releasing)
        if previous == Self.locked { return }
        unlockContended(previous: previous)
    }

    @usableFromInline
    @inline(never)
    func unlockContended(previous: UInt32) {
        require(previous != 0, "unlock(): the internal guard is not locked")
        Futex(word).wake(1)
    }

    @usableFromInline
    @inline(never)
    func lockContended() {
        // Spin while the holder runs and nobody sleeps: a guard is held for a
        // few instructions. Only loads while spinning, to leave the holder's
        // cache line alone; the same bound as `FutexMutex`'s spin (127 pauses).
        var state = AtomicMemory.load(from: word, ordering: .relaxed)
        var round = 0
        while state == Self.locked && round < FutexMutex.spinLimit {
            for _ in 0..<min(1 << round, FutexMutex.maxSpinBurst) { spinLoopHint() }
            round += 1
            state = AtomicMemory.load(from: word, ordering: .relaxed)
        }
        if state == 0
            && AtomicMemory.compareAndSwap(expected: 0, desired: Self.locked, at: word, ordering: .acquiring)
        {
            return
        }
        // Sleep. Whoever takes the word from here marks it `contended`, since
        // other sleepers may remain: the next unlock then wakes one of them.
        let futex = Futex(word)
        while AtomicMemory.exchange(Self.contended, at: word, ordering: .acquiring) != 0 {
            _ = futex.wait(expecting: Self.contended)
        }
    }
}
