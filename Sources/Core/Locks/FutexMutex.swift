import CShims

/// `Lock`'s mutex: the barging core (`PlainFutexMutex`) on the lock word,
/// plus eventual fairness on three more words, as parking_lot's: a waiter
/// that has waited `LockTuning.starvationBound` on the lock word is
/// starving, and starving waiters are handed the lock one at a time, at most
/// one hand-off per `LockTuning.fairHandoffInterval`. Everything else is the
/// core: barging, bounded spin, one wake-up per unlock when a thread sleeps.
/// Used by `Lock`, `RecursiveLock`, `LockedValue`, `Condition` and
/// `ConditionVariable`'s lock; see `Lock` for the contract.
///
/// Bounded waiting. A starving thread leaves the lock word and claims the
/// heir's place (`slot`): one thread at a time; the others sleep on the slot
/// word, which the kernel wakes in arrival order, and each release of the
/// place wakes the next. The heir sets `request` in the lock word, which
/// sends every unlock to the slow path: the first one at least one interval
/// after the last hand-off hands the lock over, still locked (`handoff`),
/// and wakes the heir if it sleeps; the ones before release it as the core
/// does (the heir, if asleep, wakes by itself when the hand-off is due and
/// takes the lock if it is free). So a thread waits at most the starvation
/// bound, plus one interval and one critical section per starving thread
/// ahead of it, plus whatever the scheduler adds before it runs, however
/// often other threads re-take the lock. Until a waiter starves, nobody is handed anything: a spinning
/// thread takes a lock as soon as it is free, and a fair hand-off to a
/// sleeping heir happens at most once per interval.
///
/// The words (`Words`, at offsets read with `MemoryLayout.offset(of:)`):
///
///     lock    the core's word, plus `handoff`, `request` and `heirSleeps`
///             (`LockWord`)
///     heir    a sequence the heir sleeps on; the unlock that hands the
///             lock over and clears `heirSleeps` in the lock word bumps it
///             and wakes the heir: the only system call made for the heir
///     slot    `SlotWord`: the heir's place (bits 0–1) and the number of
///             starving threads waiting for it (bits 2–31)
///     stamp   the last fair hand-off, in microseconds of the monotonic
///             clock, truncated to 32 bits (only differences are used)
///
/// Never changes the caller's scheduling: waiting is a bounded spin, then a
/// futex sleep.
@usableFromInline
struct FutexMutex {
    /// The layout of the four words every owner keeps, 4-byte aligned.
    @usableFromInline
    struct Words {
        @usableFromInline var lock: UInt32
        @usableFromInline var heir: UInt32
        @usableFromInline var slot: UInt32
        @usableFromInline var stamp: UInt32
    }

    @usableFromInline let core: PlainFutexMutex
    @usableFromInline let heirWord: UnsafeMutablePointer<UInt32>
    @usableFromInline let slotWord: UnsafeMutablePointer<UInt32>
    @usableFromInline let stampWord: UnsafeMutablePointer<UInt32>

    /// The mutex on the `Words` at `base` (zeroed for a new mutex).
    @inlinable
    init(at base: UnsafeMutableRawPointer) {
        func word(_ field: KeyPath<Words, UInt32>) -> UnsafeMutablePointer<UInt32> {
            (base + MemoryLayout<Words>.offset(of: field)!).assumingMemoryBound(to: UInt32.self)
        }
        core = PlainFutexMutex(word: word(\.lock))
        heirWord = word(\.heir)
        slotWord = word(\.slot)
        stampWord = word(\.stamp)
    }

    /// The mutex on the words at `words`, a tail-allocated array of
    /// `wordCount` elements (`Lock`, `LockedValue`).
    @inlinable
    init(words: UnsafeMutablePointer<UInt32>) {
        self.init(at: UnsafeMutableRawPointer(words))
    }

    /// How many 32-bit words `Words` takes.
    @inlinable static var wordCount: Int { MemoryLayout<Words>.size / MemoryLayout<UInt32>.stride }

    /// The lock word.
    @inlinable var word: UnsafeMutablePointer<UInt32> { core.word }

    @inlinable
    @inline(__always)
    func lock() {
        Perturbation.point(.lockAcquire)
        // Pairs with the releasing compare-and-swap of `unlock` / `unlockContended`.
        if !AtomicMemory.compareAndSwap(expected: 0, desired: LockWord.locked, at: word, ordering: .acquiring) {
            _ = lockContended(until: .distantFuture)
        }
        LockHooks.tsanAcquired(word)
    }

    @inlinable
    func tryLock() -> Bool { core.tryLock() }

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

    /// The core's wait, for at most the starvation bound; then the starving
    /// path.
    @usableFromInline
    @inline(never)
    func lockContended(until deadline: MonotonicClock.Instant) -> Bool {
        let now = MonotonicClock.now
        // A deadline already past: exactly `tryLock` (no `parked` bit, which
        // would cost the holder's unlock a system call).
        if !deadline.isDistantFuture && now >= deadline { return core.tryAcquire() }
        let starving = now.advanced(by: LockTuning.starvationBound)
        if core.acquire(until: starving < deadline ? starving : deadline, hasSlept: false) { return true }
        if starving >= deadline { return false }
        return lockStarving(until: deadline)
    }

    /// Acquires for a thread a condition's broadcast may have moved onto the
    /// lock word (see `PlainFutexMutex.lockAfterRequeue`), with the same
    /// starvation bound as `lock()`. Blocks. Acquire ordering.
    @usableFromInline
    func lockAfterRequeue() {
        let starving = MonotonicClock.now.advanced(by: LockTuning.starvationBound)
        if !core.acquire(until: starving, hasSlept: true) { _ = lockStarving(until: .distantFuture) }
        LockHooks.tsanAcquired(word)
    }

    @usableFromInline
    @inline(never)
    func unlockContended() {
        var state = AtomicMemory.load(from: word, ordering: .relaxed)
        while true {
            let view = LockWord(state)
            require(
                view.isLocked && !view.isHandedOff,
                "unlock(): \(LockNames.label("the lock", UnsafeRawPointer(word))) is not locked (unbalanced unlock, or unlock before lock)")
            // Not asked, or asked too soon after the last hand-off (the clock
            // is read only while an heir asks): release as the core does. A
            // sleeping heir is left asleep: it wakes by itself when the
            // hand-off is due, in case the lock stays free until then.
            guard view.isRequested && isHandOffDue() else {
                guard let current = core.release(state) else { return }
                state = current
                continue
            }
            // The heir's turn: hand the lock over, still locked. Pairs with
            // the heir's acquiring claim of `handoff`.
            let desired = (state & ~(LockWord.request | LockWord.heirSleeps)) | LockWord.handoff
            let r = AtomicMemory.compareExchange(expected: state, desired: desired, at: word, ordering: .releasing)
            if !r.exchanged {
                state = r.original
                continue
            }
            // Still ours to write: the heir claims the lock only after it
            // sees `handoff`, which it reads after being woken or spinning.
            AtomicMemory.store(Self.microstamp(MonotonicClock.now), to: stampWord, ordering: .relaxed)
            if view.heirSleeps { wakeHeir() }
            return
        }
    }

    /// Whether one `fairHandoffInterval` has passed since the last hand-off.
    /// Called by the holder only.
    @usableFromInline
    func isHandOffDue() -> Bool {
        let interval = UInt32(LockTuning.fairHandoffInterval.nanosecondsSaturating / 1_000)
        let last = AtomicMemory.load(from: stampWord, ordering: .relaxed)
        return Self.microstamp(MonotonicClock.now) &- last >= interval
    }

    /// When the next hand-off is due: one interval after the last.
    @usableFromInline
    func dueInstant() -> MonotonicClock.Instant {
        let interval = LockTuning.fairHandoffInterval.nanosecondsSaturating / 1_000
        let now = MonotonicClock.now
        let since = Int64(Self.microstamp(now) &- AtomicMemory.load(from: stampWord, ordering: .relaxed))
        return now.advanced(by: .microseconds(max(0, interval - since)))
    }

    /// Wakes the heir, which sleeps on the heir word: an unlock cleared
    /// `heirSleeps` in the lock word. Bumps the word first, so that a heir
    /// between reading it and sleeping is refused the sleep.
    @usableFromInline
    func wakeHeir() {
        // Releasing, after the lock word: pairs with the heir's acquiring
        // load, so a heir that sees the new sequence sees the lock word too.
        AtomicMemory.increment(heirWord, ordering: .releasing)
        Futex(heirWord).wake(1)
    }

    // MARK: Starving waiters

    /// Claims the heir's place, serves as the heir, and gives the place to
    /// the next starving thread. Returns whether it acquired by `deadline`.
    @usableFromInline
    func lockStarving(until deadline: MonotonicClock.Instant) -> Bool {
        guard claimSlot(until: deadline) else { return false }
        let acquired = serveAsHeir(until: deadline)
        releaseSlot()
        return acquired
    }

    /// Takes the heir's place: at once if it is free, otherwise after
    /// sleeping on the slot word, in arrival order (the kernel wakes a
    /// futex's sleepers first come, first served). Returns false if
    /// `deadline` passed first.
    @usableFromInline
    func claimSlot(until deadline: MonotonicClock.Instant) -> Bool {
        let futex = Futex(slotWord)
        var counted = false
        var slot = AtomicMemory.load(from: slotWord, ordering: .relaxed)
        while true {
            let view = SlotWord(slot)
            // A free place goes to anyone; a passed one only to a thread that
            // was already counted (a woken one, or one that never slept).
            if view.isFree || (counted && view.isPassed) {
                let desired = (slot & ~SlotWord.placeMask | SlotWord.taken) &- (counted ? SlotWord.waiter : 0)
                let r = AtomicMemory.compareExchange(expected: slot, desired: desired, at: slotWord, ordering: .acquiring)
                if r.exchanged { return true }
                slot = r.original
                continue
            }
            if !counted {
                let r = AtomicMemory.compareExchange(
                    expected: slot, desired: slot &+ SlotWord.waiter, at: slotWord, ordering: .relaxed)
                slot = r.exchanged ? slot &+ SlotWord.waiter : r.original
                counted = r.exchanged
                continue
            }
            // Taken: sleep until the holder passes the place on. Every
            // change of the word (a count, a pass) makes the kernel refuse
            // a sleep on the old value.
            if futex.wait(expecting: slot, until: deadline.isDistantFuture ? nil : deadline) == .timedOut {
                leaveSlotQueue()
                return false
            }
            slot = AtomicMemory.load(from: slotWord, ordering: .relaxed)
        }
    }

    /// A counted thread gives up waiting for the place. It timed out, so it
    /// was not the one a pass woke; but if the place is in passage and it
    /// was the last one counted, nobody would take it: then it frees it; if
    /// others wait, it wakes one in case the pass found nobody asleep.
    @usableFromInline
    func leaveSlotQueue() {
        var slot = AtomicMemory.load(from: slotWord, ordering: .relaxed)
        while true {
            var desired = slot &- SlotWord.waiter
            if SlotWord(slot).isPassed && SlotWord(desired).waiting == 0 { desired &= ~SlotWord.placeMask }
            let r = AtomicMemory.compareExchange(expected: slot, desired: desired, at: slotWord, ordering: .relaxed)
            if r.exchanged {
                if SlotWord(desired).isPassed { Futex(slotWord).wake(1) }
                return
            }
            slot = r.original
        }
    }

    /// Gives the heir's place up: passes it to the next starving thread
    /// (waking it) if one is counted, else frees it.
    @usableFromInline
    func releaseSlot() {
        var slot = AtomicMemory.load(from: slotWord, ordering: .relaxed)
        while true {
            let passing = SlotWord(slot).waiting > 0
            let desired = (slot & ~SlotWord.placeMask) | (passing ? SlotWord.passed : 0)
            // Releasing: pairs with the next heir's acquiring claim.
            let r = AtomicMemory.compareExchange(expected: slot, desired: desired, at: slotWord, ordering: .releasing)
            if r.exchanged {
                if passing { Futex(slotWord).wake(1) }
                return
            }
            slot = r.original
        }
    }

    /// The heir's life: asks for the lock (`request`), takes it if it finds
    /// it free, spins a little, and sleeps on the heir word until the
    /// hand-off is due (one interval after the last; then it looks again, in
    /// case the lock was left free) and after that until an unlock hands the
    /// lock over. Returns whether it acquired by `deadline`.
    @usableFromInline
    func serveAsHeir(until deadline: MonotonicClock.Instant) -> Bool {
        let futex = Futex(heirWord)
        var round = 0
        while true {
            // The heir word first, then the lock word: an unlock that wakes
            // the heir writes them in the other order.
            let sequence = AtomicMemory.load(from: heirWord, ordering: .acquiring)
            let state = AtomicMemory.load(from: word, ordering: .relaxed)
            let view = LockWord(state)
            if view.isHandedOff || !view.isLocked {
                // Handed over (the lock stays locked) or free: take it.
                let desired = (state | LockWord.locked) & ~(LockWord.handoff | LockWord.request | LockWord.heirSleeps)
                if AtomicMemory.compareAndSwap(expected: state, desired: desired, at: word, ordering: .acquiring) {
                    return true
                }
                continue
            }
            if !deadline.isDistantFuture && MonotonicClock.now >= deadline {
                // Withdraw the request; fails (and we look again) if the lock
                // was handed over meanwhile.
                if AtomicMemory.compareAndSwap(
                    expected: state, desired: state & ~(LockWord.request | LockWord.heirSleeps), at: word,
                    ordering: .relaxed)
                {
                    return false
                }
                continue
            }
            if !view.isRequested {
                _ = AtomicMemory.compareAndSwap(
                    expected: state, desired: state | LockWord.request, at: word, ordering: .relaxed)
                continue
            }
            if round < LockTuning.heirSpinRounds {
                // Asked: on many cores the holder is running and unlocks
                // soon. Loads only.
                spinBurst(round: round)
                round += 1
                continue
            }
            // Announce the sleep in the lock word, in one step with what we
            // saw there: if an unlock changed the word since, we look again;
            // if one changes it later, it clears `heirSleeps` and wakes us
            // (bumping the heir word, so the sleep below is refused if it has
            // not begun).
            if !view.heirSleeps {
                _ = AtomicMemory.compareAndSwap(
                    expected: state, desired: state | LockWord.heirSleeps, at: word, ordering: .relaxed)
                continue
            }
            // Until the hand-off is due (then the lock may have been left
            // free, with nobody to hand it over), or after that until an
            // unlock hands it over.
            let due = dueInstant()
            let wakeAt = MonotonicClock.now < due && due < deadline ? due : deadline
            _ = futex.wait(expecting: sequence, until: wakeAt.isDistantFuture ? nil : wakeAt)
            round = 0
        }
    }

    /// `instant` in microseconds, truncated to 32 bits (wraps every 71
    /// minutes; only differences of milliseconds are taken, and a wrong one
    /// only makes one hand-off early or at most one interval late).
    @usableFromInline
    static func microstamp(_ instant: MonotonicClock.Instant) -> UInt32 {
        UInt32(truncatingIfNeeded: instant.nanoseconds / 1_000)
    }

    /// For tests and diagnostics: the starving threads, the heir included;
    /// 0 when nobody starves. A relaxed snapshot.
    var threadsWaitingForTurn: Int {
        let slot = SlotWord(AtomicMemory.load(from: slotWord, ordering: .relaxed))
        return Int(slot.waiting) + (slot.isTaken ? 1 : 0)
    }

    // MARK: For `Condition`'s deferred wake-ups

    /// Adds one deferred wake-up to the lock word if the lock is held and the
    /// count is not full; returns whether it did (if not, the caller wakes
    /// now). Relaxed: the wake-up carries no data (the lock publishes the
    /// predicate), and the unlocker takes the count with a read-modify-write
    /// of this same word.
    @usableFromInline
    func deferWake() -> Bool {
        var state = AtomicMemory.load(from: word, ordering: .relaxed)
        while LockWord(state).isLocked && !LockWord(state).deferredIsFull {
            let r = AtomicMemory.compareExchange(
                expected: state, desired: state &+ LockWord.deferredWake, at: word, ordering: .relaxed)
            if r.exchanged { return true }
            state = r.original
        }
        return false
    }

    /// Unlocks and returns the wake-ups deferred to this unlock, for the
    /// caller to make. The fast path is `unlock`'s: one compare-and-swap.
    @inlinable
    func unlockTakingDeferredWakes() -> UInt32 {
        defer { Perturbation.point(.lockRelease) }
        LockHooks.tsanReleasing(word)
        if AtomicMemory.compareAndSwap(expected: LockWord.locked, desired: 0, at: word, ordering: .releasing) {
            return 0
        }
        return unlockTakingDeferredWakesContended()
    }

    @usableFromInline
    @inline(never)
    func unlockTakingDeferredWakesContended() -> UInt32 {
        // Take the count out while still holding the lock, release, then take
        // what signals deferred between the two: once the lock is free nobody
        // else will (the next holder would, but there may be none).
        let before = takeDeferredWakes(whileLocked: true)
        unlockContended()
        return before + takeDeferredWakes(whileLocked: false)
    }

    @usableFromInline
    func takeDeferredWakes(whileLocked locked: Bool) -> UInt32 {
        var state = AtomicMemory.load(from: word, ordering: .relaxed)
        while LockWord(state).deferredWakes != 0 && LockWord(state).isLocked == locked {
            let r = AtomicMemory.compareExchange(
                expected: state, desired: state & ~LockWord.deferredMask, at: word, ordering: .relaxed)
            if r.exchanged { return LockWord(state).deferredWakes }
            state = r.original
        }
        return 0
    }
}

/// A typed view of `FutexMutex`'s slot word.
@usableFromInline
struct SlotWord {
    @usableFromInline var rawValue: UInt32
    @inlinable init(_ rawValue: UInt32) { self.rawValue = rawValue }
    /// Bits 0–1, the heir's place: 0 free, `taken` (some thread is the
    /// heir), `passed` (the last heir passed it to a counted thread, which
    /// has not claimed it yet).
    @usableFromInline static var taken: UInt32 { 1 }
    @usableFromInline static var passed: UInt32 { 2 }
    @usableFromInline static var placeMask: UInt32 { 3 }
    /// Bits 2–31: starving threads counted as waiting for the place.
    @usableFromInline static var waiter: UInt32 { 4 }
    @inlinable var isFree: Bool { rawValue & Self.placeMask == 0 }
    @inlinable var isTaken: Bool { rawValue & Self.placeMask == Self.taken }
    @inlinable var isPassed: Bool { rawValue & Self.placeMask == Self.passed }
    @inlinable var waiting: UInt32 { rawValue >> 2 }
}
