/// The futex condition-variable algorithm behind `Condition` and
/// `ConditionVariable`, on words that the owning object keeps at stable
/// addresses. The mutex a waiter releases is a `FutexMutex`; see `Condition`
/// for the contract.
///
/// The words (`Words`, from an 8-byte aligned base):
///
///     sequence    UInt32  the futex word. Every signal and broadcast that finds
///                         a waiter adds one. A waiter reads it while it still
///                         holds the lock and sleeps only while it is unchanged,
///                         so a signal issued after the waiter released the
///                         lock either changes it before the waiter sleeps (the
///                         kernel then refuses the sleep) or finds the waiter
///                         asleep and wakes it: no lost wake-up.
///     waiters     UInt32  threads inside `wait`, spinning or asleep. With none,
///                         `signal` and `broadcast` are one load.
///     sleepers    UInt32  threads inside `wait` that may be asleep in the
///                         kernel. With none, a signal makes no system call.
///     spin        UInt32  the waiters' adaptive spin limit (`AdaptiveSpin`).
///     broadcasts  UInt64  requeueing broadcasts: the high half counts those
///                         begun, the low half those still in flight. A waiter
///                         reads it before and after its sleep to learn whether
///                         a broadcast may have moved it onto the mutex's word.
///
/// Broadcast and the thundering herd: waking every waiter would send them all
/// to fight over the mutex, and all but one would go straight back to sleep
/// on it. Instead `broadcast` wakes one and moves the rest, still asleep, onto
/// the mutex's word (`FUTEX_CMP_REQUEUE`), marking the mutex `parked` first;
/// each `unlock` then wakes the next one. A moved thread is woken as a sleeper
/// of the mutex, so it must take the mutex the way its sleepers do: with
/// `parked` set, since others may still sleep there (`lockAfterRequeue`). A
/// waiter cannot tell from the kernel which word woke it, hence `broadcasts`.
/// The waiter's test is conservative: any broadcast that overlaps its sleep
/// counts, and the only cost of a false positive is one needless wake call on
/// the next unlock.
///
/// Deferred wake-ups (`Condition` only, whose mutex word is its own): a
/// signal usually comes from the thread holding the lock, and a sleeper woken
/// at once would only run into that lock (on a busy machine, preempting the
/// signaller to do so). So `signalDeferring(to:)` leaves the wake-up in the
/// mutex word's bits 8–31 while the mutex is locked (`FutexMutex.deferWake`),
/// and the unlock that releases it (`unlockFlushingWakes`) makes the wake
/// call after releasing. The mutex owns the word and its layout (`LockWord`);
/// this type only calls it.
@usableFromInline
struct FutexCondition {
    @usableFromInline let sequence: UnsafeMutablePointer<UInt32>
    @usableFromInline let waiters: UnsafeMutablePointer<UInt32>
    @usableFromInline let sleepers: UnsafeMutablePointer<UInt32>
    @usableFromInline let spin: AdaptiveSpin
    @usableFromInline let broadcasts: UnsafeMutablePointer<UInt64>

    /// The layout of a condition's words, from an 8-byte aligned base.
    @usableFromInline
    struct Words {
        @usableFromInline var sequence: UInt32
        @usableFromInline var waiters: UInt32
        @usableFromInline var sleepers: UInt32
        @usableFromInline var spin: UInt32
        @usableFromInline var broadcasts: UInt64
    }

    /// The bytes of words a condition needs.
    static var byteCount: Int { MemoryLayout<Words>.size }

    /// Sets up the words of a new condition at `base` (zeroed memory).
    static func initialize(at base: UnsafeMutableRawPointer) {
        (base + MemoryLayout<Words>.offset(of: \.spin)!).storeBytes(of: AdaptiveSpin.initialPolls, as: UInt32.self)
    }

    /// One broadcast begun and in flight, in `broadcasts`.
    @usableFromInline static var broadcastBegun: UInt64 { 1 << 32 | 1 }
    /// The in-flight half of `broadcasts`.
    @usableFromInline static var inFlightMask: UInt64 { 0xFFFF_FFFF }

    @inlinable
    init(base: UnsafeMutableRawPointer) {
        func word<T>(_ field: KeyPath<Words, T>) -> UnsafeMutablePointer<T> {
            (base + MemoryLayout<Words>.offset(of: field)!).assumingMemoryBound(to: T.self)
        }
        sequence = word(\.sequence)
        waiters = word(\.waiters)
        sleepers = word(\.sleepers)
        spin = AdaptiveSpin(word(\.spin))
        broadcasts = word(\.broadcasts)
    }

    /// Whether any thread is inside `wait` (a snapshot). Acquiring: pairs with
    /// the waiter's count, so what the waiter did before counting itself
    /// (pairing a `ConditionVariable` with its lock) is visible after a true.
    @inlinable
    var hasWaiters: Bool { AtomicMemory.load(from: waiters, ordering: .acquiring) != 0 }

    // MARK: Signal

    /// The part of a signal that never sleeps or calls the kernel: announces
    /// it to the waiters (spinning ones see it at once) and returns whether a
    /// sleeper must be woken.
    @inlinable
    func prepareSignal() -> Bool {
        // Sequentially consistent, like the waiter's read-then-count: either
        // we see the waiter counted, or it read the sequence after our
        // increment (and so is not waiting for this signal). A signaller that
        // holds the lock is ordered after the waiter by the lock itself.
        guard AtomicMemory.load(from: waiters, ordering: .sequentiallyConsistent) != 0 else { return false }
        AtomicMemory.increment(sequence, ordering: .sequentiallyConsistent)
        // Pairs with the sleeper's increment of `sleepers` and re-read of the
        // sequence (a Dekker pair): either we see it counted and wake it, or it
        // sees the new sequence and does not sleep.
        return AtomicMemory.load(from: sleepers, ordering: .sequentiallyConsistent) != 0
    }

    /// Wakes one waiter, if there is one, at once.
    @inlinable
    func signalNow() {
        if prepareSignal() { wakeOne() }
    }

    /// Wakes one waiter, if there is one; a sleeper is woken by the unlock of
    /// `mutex` if it is locked now (see the type's comment).
    @inlinable
    func signalDeferring(to mutex: FutexMutex) {
        if prepareSignal() { deferWake(mutex) }
    }

    @usableFromInline
    func wakeOne() {
        Futex(sequence).wake(1)
    }

    /// Wakes one waiter, if there is one; while `mutex` is locked, a sleeper
    /// is not woken but moved onto the mutex's word, and its unlock wakes it
    /// (`ConditionVariable`, whose mutex is a `Lock` it cannot hook).
    @inlinable
    func signalMoving(onto mutex: FutexMutex) {
        if prepareSignal() { moveOne(onto: mutex) }
    }

    @usableFromInline
    @inline(never)
    func moveOne(onto mutex: FutexMutex) {
        // Not locked: there is no unlock to wait for.
        if !LockWord(AtomicMemory.load(from: mutex.word, ordering: .relaxed)).isLocked {
            wakeOne()
            return
        }
        // A moved thread must know it may have been moved (see `sleep`).
        AtomicMemory.add(Self.broadcastBegun, to: broadcasts, ordering: .sequentiallyConsistent)
        let condition = Futex(sequence)
        var expected = AtomicMemory.load(from: sequence, ordering: .relaxed)
        while condition.wakeAndRequeue(wakeCount: 0, requeueCount: 1, onto: Futex(mutex.word), ifValue: expected) == nil {
            expected = AtomicMemory.load(from: sequence, ordering: .relaxed)
        }
        AtomicMemory.add(UInt64.max, to: broadcasts, ordering: .sequentiallyConsistent)  // one fewer in flight
        // Now make sure somebody wakes the moved thread: the mutex's unlock if
        // it is locked (`parked` set, even if an unlock cleared it since),
        // else we, now. Either way the woken thread takes the mutex as a
        // sleeper does, setting `parked` again for any other thread left on
        // the word.
        if !mutex.core.markParkedIfLocked() { mutex.core.wakeOne() }
    }

    /// Leaves one wake-up in the word of `mutex` if it is locked; wakes now if
    /// it is not (or if the word's count is full).
    @usableFromInline
    @inline(never)
    func deferWake(_ mutex: FutexMutex) {
        if !mutex.deferWake() { wakeOne() }
    }

    /// Releases `mutex`, then makes the wake calls that signals left in its
    /// word. The fast path is `FutexMutex.unlock`'s: one compare-and-swap.
    @inlinable
    func unlockFlushingWakes(_ mutex: FutexMutex) {
        let wakes = mutex.unlockTakingDeferredWakes()
        if wakes != 0 { wake(Int(wakes)) }
    }

    @usableFromInline
    @inline(never)
    func wake(_ count: Int) {
        Futex(sequence).wake(count)
    }

    // MARK: Broadcast

    /// Wakes every waiter: spinning ones through the sequence, sleeping ones
    /// by waking one and moving the rest onto `mutex`'s word.
    @inlinable
    func broadcast(requeueingOnto mutex: FutexMutex) {
        guard AtomicMemory.load(from: waiters, ordering: .sequentiallyConsistent) != 0 else { return }
        broadcastWaiting(requeueingOnto: mutex)
    }

    @usableFromInline
    @inline(never)
    func broadcastWaiting(requeueingOnto mutex: FutexMutex) {
        var expected = AtomicMemory.add(1, to: sequence, ordering: .sequentiallyConsistent)
        // The same Dekker pair as in `prepareSignal`.
        guard AtomicMemory.load(from: sleepers, ordering: .sequentiallyConsistent) != 0 else { return }
        // Announce the requeue before the system call and retract it after:
        // a waiter that overlaps it sees one or the other (see `sleep`).
        AtomicMemory.add(Self.broadcastBegun, to: broadcasts, ordering: .sequentiallyConsistent)
        // The moved threads will sleep on the mutex word: make its next unlock
        // wake one (on an unlocked word, the next locker keeps the bit).
        mutex.core.markParked()
        let condition = Futex(sequence)
        let target = Futex(mutex.word)
        // Wake one, so that somebody will take the mutex even if nobody holds
        // it now; move all the others. Retry if a signal changed the sequence
        // between our increment and the call (nothing was done then).
        while condition.wakeAndRequeue(
            wakeCount: 1, requeueCount: Int(Int32.max), onto: target, ifValue: expected) == nil
        {
            expected = AtomicMemory.load(from: sequence, ordering: .relaxed)
        }
        AtomicMemory.add(UInt64.max, to: broadcasts, ordering: .sequentiallyConsistent)  // one fewer in flight
    }

    // MARK: Wait

    /// Releases `mutex` (held by the caller), waits for a signal, a broadcast,
    /// the deadline or a spurious wake-up, and takes `mutex` again. Returns
    /// false only if the deadline passed with no signal or broadcast.
    /// `flushingWakes`: release with `unlockFlushingWakes` (`Condition`).
    @usableFromInline
    @inline(never)
    func wait(releasing mutex: FutexMutex, flushingWakes: Bool, until deadline: MonotonicClock.Instant) -> Bool {
        Perturbation.point(.conditionWait)
        // Both while holding the lock, read first and counted second (see
        // `prepareSignal`). Relaxed read: a signaller that holds the lock after
        // us is ordered after it by the lock; one that does not is not waited for.
        let observed = AtomicMemory.load(from: sequence, ordering: .relaxed)
        AtomicMemory.increment(waiters, ordering: .sequentiallyConsistent)
        if flushingWakes {
            unlockFlushingWakes(mutex)
        } else {
            mutex.unlock()
        }

        var signalled = true
        var mayHaveMoved = false
        let changed = spin.poll { AtomicMemory.load(from: sequence, ordering: .relaxed) != observed }
        if !changed {
            (signalled, mayHaveMoved) = sleep(whileSequenceIs: observed, until: deadline)
        }
        AtomicMemory.decrement(waiters, ordering: .relaxed)
        if mayHaveMoved {
            mutex.lockAfterRequeue()
        } else {
            mutex.lock()
        }
        return signalled
    }

    /// Sleeps on the sequence while it holds `observed`. Returns whether it
    /// changed (false: the deadline passed), and whether a broadcast may have
    /// moved this thread onto the mutex word while it slept.
    @usableFromInline
    func sleep(
        whileSequenceIs observed: UInt32, until deadline: MonotonicClock.Instant
    ) -> (signalled: Bool, mayHaveMoved: Bool) {
        AtomicMemory.increment(sleepers, ordering: .sequentiallyConsistent)
        defer { AtomicMemory.decrement(sleepers, ordering: .relaxed) }
        // Read before the sleep; compared after it. A broadcast whose requeue
        // call overlaps the sleep either had begun and not finished when this
        // was read (in-flight half nonzero) or begins later (begun half changes).
        let before = AtomicMemory.load(from: broadcasts, ordering: .sequentiallyConsistent)
        let futex = Futex(sequence)
        while true {
            // The other half of the Dekker pair in `prepareSignal`.
            if AtomicMemory.load(from: sequence, ordering: .sequentiallyConsistent) != observed {
                return (true, false)
            }
            let result = announcingBlocking { futex.wait(expecting: observed, until: deadline) }
            if result == .valueChanged { return (true, false) }  // never slept, so never moved
            let after = AtomicMemory.load(from: broadcasts, ordering: .sequentiallyConsistent)
            let mayHaveMoved = before & Self.inFlightMask != 0 || after != before
            let changed = AtomicMemory.load(from: sequence, ordering: .relaxed) != observed
            if result == .timedOut { return (changed, mayHaveMoved) }
            // Woken. A thread that may have been moved must go and take the
            // mutex (it carries the wake-up chain of the moved threads); one
            // that cannot have been moved and sees no change was woken
            // spuriously and sleeps again.
            if changed || mayHaveMoved { return (true, mayHaveMoved) }
        }
    }
}
