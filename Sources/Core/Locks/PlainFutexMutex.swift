/// The barging futex mutex on one 32-bit word: Spindle's one mutex core.
/// Internal guards held for a few instructions (`ConditionLock`'s guard, the
/// run loop's and the event registry's locks, `synchronized` entries) use it
/// as it is; `FutexMutex` layers eventual fairness on it for `Lock` and the
/// locks built like it. The shape of Rust's
/// `library/std/src/sys/sync/mutex/futex.rs`, with bits instead of the three
/// values, so that the layers above can keep their own bits in the word
/// (see `LockWord`).
///
/// - Whoever finds the word unlocked takes it (barging): nobody queues and
///   nobody is handed the lock here.
/// - A waiter spins a bounded number of hints (`LockTuning.spinRounds`),
///   only loading the word, and tries a compare-and-swap only when it looks
///   free; it spins only while nobody sleeps. Then it sets `parked` and
///   sleeps on the word (`futex(FUTEX_WAIT_BITSET)`).
/// - `unlock` wakes one sleeper, and only when `parked` says one may sleep,
///   clearing the bit; the woken thread sets it again when it takes the lock
///   or sleeps again, since others may still sleep. So a sleeper is never
///   left without a wake-up on its way or `parked` in the word.
///
/// Never changes the caller's scheduling. Memory: a successful lock acquires,
/// `unlock` releases (pairs with the next lock's acquiring compare-and-swap).
/// Misuse: `unlock()` of an unlocked word stops the process with a message.
/// Not recursive. The word must live at a stable address.
@usableFromInline
struct PlainFutexMutex {
    @usableFromInline let word: UnsafeMutablePointer<UInt32>

    @inlinable
    init(word: UnsafeMutablePointer<UInt32>) {
        self.word = word
    }

    /// Acquires, spinning briefly and then sleeping. Blocks. Acquire ordering.
    @inlinable
    @inline(__always)
    func lock() {
        Perturbation.point(.lockAcquire)
        // Pairs with the releasing compare-and-swap in `unlock` / `release`.
        if !AtomicMemory.compareAndSwap(expected: 0, desired: LockWord.locked, at: word, ordering: .acquiring) {
            _ = acquire(until: .distantFuture, hasSlept: false)
        }
        LockHooks.tsanAcquired(word)
    }

    /// Acquires if the word is unlocked now. Never blocks. Acquire ordering on
    /// success.
    @inlinable
    func tryLock() -> Bool {
        Perturbation.point(.lockAcquire)
        guard tryAcquire() else { return false }
        LockHooks.tsanAcquired(word, LockHooks.tsanTry)
        return true
    }

    /// `tryLock` without telling ThreadSanitizer, for the paths whose caller
    /// tells it (see `LockHooks`).
    @inlinable
    func tryAcquire() -> Bool {
        var state = AtomicMemory.load(from: word, ordering: .relaxed)
        while state & LockWord.locked == 0 {
            let r = AtomicMemory.compareExchange(
                expected: state, desired: state | LockWord.locked, at: word, ordering: .acquiring)
            if r.exchanged { return true }
            state = r.original
        }
        return false
    }

    /// Acquires, waiting at most until `deadline`; a deadline already past is
    /// `tryLock`. Blocks. Acquire ordering on success.
    @inlinable
    func lock(before deadline: MonotonicClock.Instant) -> Bool {
        Perturbation.point(.lockAcquire)
        if AtomicMemory.compareAndSwap(expected: 0, desired: LockWord.locked, at: word, ordering: .acquiring)
            || lockContended(until: deadline)
        {
            LockHooks.tsanAcquired(word)
            return true
        }
        return false
    }

    /// Releases, waking one sleeper if `parked` is set. Never blocks. Release
    /// ordering. Stops the process if the word was not locked.
    @inlinable
    @inline(__always)
    func unlock() {
        LockHooks.tsanReleasing(word)
        // Pairs with the acquiring compare-and-swap of the next holder.
        if !AtomicMemory.compareAndSwap(expected: LockWord.locked, desired: 0, at: word, ordering: .releasing) {
            unlockContended()
        }
        Perturbation.point(.lockRelease)
    }

    @usableFromInline
    @inline(never)
    func lockContended(until deadline: MonotonicClock.Instant) -> Bool {
        // A deadline already past: exactly `tryLock`, with no spin and no
        // `parked` bit (which would cost the holder's unlock a system call).
        if !deadline.isDistantFuture && MonotonicClock.now >= deadline { return tryAcquire() }
        return acquire(until: deadline, hasSlept: false)
    }

    @usableFromInline
    @inline(never)
    func unlockContended() {
        var state = AtomicMemory.load(from: word, ordering: .relaxed)
        while let current = release(state) { state = current }
    }

    /// Spins while the word is locked and nobody sleeps, at most
    /// `LockTuning.spinRounds` bursts; returns the last word read. Only loads,
    /// to leave the holder's cache line alone.
    @usableFromInline
    func spin() -> UInt32 {
        var state = AtomicMemory.load(from: word, ordering: .relaxed)
        var round = 0
        while state & (LockWord.locked | LockWord.parked) == LockWord.locked && round < LockTuning.spinRounds {
            spinBurst(round: round)
            round += 1
            state = AtomicMemory.load(from: word, ordering: .relaxed)
        }
        return state
    }

    /// The waiting loop: spin, then take the word when it is unlocked, or set
    /// `parked` and sleep. Returns true having acquired, false when
    /// `deadline` passed (leaving `parked` set, so no wake-up is lost: a
    /// thread that times out was not the one woken). `hasSlept`: the caller
    /// was woken as a sleeper of the word (`lockAfterRequeue`), so it takes
    /// the lock with `parked` set. Keeps the bits it does not own.
    @usableFromInline
    func acquire(until deadline: MonotonicClock.Instant, hasSlept: Bool) -> Bool {
        let futex = Futex(word)
        var slept = hasSlept
        var state = slept ? AtomicMemory.load(from: word, ordering: .relaxed) : spin()
        while true {
            if state & LockWord.locked == 0 {
                // After sleeping, others may still sleep: the next unlock
                // must wake one, so keep (or set) `parked`.
                let desired = state | LockWord.locked | (slept ? LockWord.parked : 0)
                let r = AtomicMemory.compareExchange(expected: state, desired: desired, at: word, ordering: .acquiring)
                if r.exchanged { return true }
                state = r.original
                continue
            }
            if state & LockWord.parked == 0 {
                let r = AtomicMemory.compareExchange(
                    expected: state, desired: state | LockWord.parked, at: word, ordering: .relaxed)
                if !r.exchanged {
                    state = r.original
                    continue
                }
                state |= LockWord.parked
            }
            if futex.wait(expecting: state, until: deadline.isDistantFuture ? nil : deadline) == .timedOut {
                return false
            }
            slept = true
            state = AtomicMemory.load(from: word, ordering: .relaxed)
        }
    }

    /// One attempt to release from `state` (the word as last read): clears
    /// `locked` and, if set, `parked`, waking one sleeper then. Returns nil
    /// once released, or the word found instead. Release ordering; keeps the
    /// bits it does not own. Stops the process if `state` is not locked.
    @usableFromInline
    func release(_ state: UInt32) -> UInt32? {
        require(state & LockWord.locked != 0, "unlock(): the lock is not locked (unbalanced unlock, or unlock before lock)")
        let wake = state & LockWord.parked != 0
        let desired = state & ~(LockWord.locked | LockWord.parked)
        let r = AtomicMemory.compareExchange(expected: state, desired: desired, at: word, ordering: .releasing)
        if !r.exchanged { return r.original }
        if wake { Futex(word).wake(1) }
        return nil
    }

    // MARK: For condition variables

    /// Acquires for a thread that a condition's broadcast may have moved
    /// (`FUTEX_CMP_REQUEUE`) onto this word: it was woken as a sleeper, so it
    /// takes the lock with `parked` set for the others moved with it. Blocks.
    /// Acquire ordering.
    @usableFromInline
    func lockAfterRequeue() {
        _ = acquire(until: .distantFuture, hasSlept: true)
        LockHooks.tsanAcquired(word)
    }

    /// Before threads are moved onto the word while it may be locked: sets
    /// `parked` if the word is locked, so its unlock wakes one of them, and
    /// returns true; returns false if it is unlocked (the caller wakes one
    /// itself). parking_lot's `mark_parked_if_locked`. Sequentially
    /// consistent, like the requeue it brackets.
    @usableFromInline
    func markParkedIfLocked() -> Bool {
        var state = AtomicMemory.load(from: word, ordering: .sequentiallyConsistent)
        while true {
            if state & LockWord.locked == 0 { return false }
            if state & LockWord.parked != 0 { return true }
            let r = AtomicMemory.compareExchange(
                expected: state, desired: state | LockWord.parked, at: word, ordering: .sequentiallyConsistent)
            if r.exchanged { return true }
            state = r.original
        }
    }

    /// Sets `parked` whether or not the word is locked: the next unlock wakes
    /// a sleeper (on an unlocked word, the next locker keeps the bit, so its
    /// unlock does). For a broadcast that wakes one and moves the rest.
    @usableFromInline
    func markParked() {
        _ = AtomicMemory.or(LockWord.parked, into: word, ordering: .sequentiallyConsistent)
    }

    /// Wakes one sleeper of the word now (a condition that moved a thread
    /// onto an unlocked word).
    @usableFromInline
    func wakeOne() {
        Futex(word).wake(1)
    }
}

/// A typed view of a mutex word. `PlainFutexMutex` owns bits 0–1;
/// `FutexMutex` adds bits 2–4; bits 8–31 count the wake-ups that `Condition`
/// defers to its unlock (see `FutexCondition`). 0 is the idle state, and
/// `locked` alone is "held, nobody waiting": the only state the inlined fast
/// paths handle.
///
///     bit 0     locked    held by some thread
///     bit 1     parked    a thread may sleep on the word: the unlock wakes one
///     bit 2     handoff   the holder's unlock gave the lock, still locked, to
///                         the heir (`FutexMutex`); only the heir claims it
///     bit 3     request   the heir asks for the lock: an unlock hands it over
///                         (once the interval is due) instead of releasing it
///     bit 4     heirSleeps  the heir sleeps on `FutexMutex`'s heir word: the
///                         unlock that hands over clears this bit and wakes it
///     bits 8–31 deferred  wake-ups a `Condition` signal left for the unlock
@usableFromInline
struct LockWord: Equatable {
    @usableFromInline var rawValue: UInt32
    @inlinable init(_ rawValue: UInt32) { self.rawValue = rawValue }

    @usableFromInline static var locked: UInt32 { 1 }
    @usableFromInline static var parked: UInt32 { 2 }
    @usableFromInline static var handoff: UInt32 { 4 }
    @usableFromInline static var request: UInt32 { 8 }
    @usableFromInline static var heirSleeps: UInt32 { 16 }
    @usableFromInline static var deferredWake: UInt32 { 1 << 8 }
    @usableFromInline static var deferredMask: UInt32 { ~0xFF }

    @inlinable var isLocked: Bool { rawValue & Self.locked != 0 }
    @inlinable var isParked: Bool { rawValue & Self.parked != 0 }
    @inlinable var isHandedOff: Bool { rawValue & Self.handoff != 0 }
    @inlinable var isRequested: Bool { rawValue & Self.request != 0 }
    @inlinable var heirSleeps: Bool { rawValue & Self.heirSleeps != 0 }
    /// Deferred wake-ups (`Condition`).
    @inlinable var deferredWakes: UInt32 { rawValue >> 8 }
    @inlinable var deferredIsFull: Bool { rawValue & Self.deferredMask == Self.deferredMask }
}
