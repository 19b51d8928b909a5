/// The futex mutex algorithm behind `Lock`, `RecursiveLock`, `Condition`,
/// `ConditionLock` and `synchronized`, on three words that the owning object
/// keeps at stable addresses: the lock word, the heir word and a hand-off
/// timestamp. See `Lock` for the contract; this type adds nothing to it.
///
/// The lock word's bits:
///
///     bit 0  locked    held by some thread
///     bit 1  parked    a thread may be asleep on the lock word: an unlock
///                      must wake one (or leave the bit for the next)
///     bit 2  handoff   an unlock gave the lock (still locked) to the heir;
///                      only the heir claims it
///     bit 3  heir      a thread is the next in line (the heir): it sleeps on
///                      the heir word, or is on its way back from there.
///                      Only the heir itself clears it.
///     bit 4  heirWaking  an unlock woke the heir and it has not yet run:
///                      further unlocks need not wake it again
///     bit 5  parkedWaking  the same for a sleeper of the lock word: one
///                      woken thread at a time, so that woken threads do not
///                      race each other for the heir's place and lose theirs
///
/// 0 is the idle state; `locked` alone is "held, nobody waiting", the only
/// state the inlined fast paths handle. Bits 8–31 belong to the owner
/// (`Condition` keeps deferred wake-ups there); every transition keeps them.
///
/// Why an heir. A thread woken from the lock word often finds the lock taken
/// again by the thread that woke it (barging is what makes the lock fast).
/// Sent back to the lock word it would queue behind every other sleeper, and
/// the futex queue would keep rotating, so that whoever happens to be at its
/// head when the lock is handed over gets it: over a few dozen hand-offs,
/// some threads would get none. Instead the first such thread becomes the
/// heir and sleeps on a word of its own; while there is an heir, unlocks wake
/// only the heir (when no wake-up is already on its way) and leave the other
/// sleepers in order, and about every `fairnessInterval` an unlock hands the
/// lock to the heir outright. The old holder then queues at the back, and
/// the next sleeper woken becomes the next heir: the lock goes round the
/// waiting threads in order, one interval each, and between hand-offs it is
/// as fast as an unfair lock. The order holds only while the waiting threads
/// sleep; with more runnable threads than cores, threads also wait on the
/// scheduler's run queues, a holder can be preempted, and whoever the
/// scheduler runs when the lock is free takes it (see `Lock` for the
/// measured effect).
///
/// The heir word is a sequence number that every unlock waking the heir
/// bumps after setting `heirWaking`. The heir reads it before it looks at
/// the lock word and sleeps only while it is unchanged, so a wake-up sent
/// after it looked is never lost.
@usableFromInline
struct FutexMutex {
    @usableFromInline static var locked: UInt32 { 1 }
    @usableFromInline static var parked: UInt32 { 2 }
    @usableFromInline static var handoff: UInt32 { 4 }
    @usableFromInline static var heir: UInt32 { 8 }
    @usableFromInline static var heirWaking: UInt32 { 16 }
    @usableFromInline static var parkedWaking: UInt32 { 32 }

    /// The hand-over interval: a busy lock with an heir hands itself to the
    /// heir once per interval (±10%, so that threads do not fall into
    /// lock-step with it). Each thread waiting for a busy lock gets it for
    /// about one interval per round of all waiters. A hand-over costs a
    /// wake-up and a context switch (~5–10 µs here), about 2% of throughput
    /// at this interval.
    static let fairnessInterval: Duration = .microseconds(400)

    @usableFromInline let word: UnsafeMutablePointer<UInt32>
    @usableFromInline let heirWord: UnsafeMutablePointer<UInt32>
    /// Monotonic nanoseconds before which no unlock hands off. Read and
    /// written only by the thread holding the lock.
    @usableFromInline let nextHandoff: UnsafeMutablePointer<Int64>

    @inlinable
    init(word: UnsafeMutablePointer<UInt32>, heirWord: UnsafeMutablePointer<UInt32>,
         nextHandoff: UnsafeMutablePointer<Int64>) {
        self.word = word
        self.heirWord = heirWord
        self.nextHandoff = nextHandoff
    }

    @inlinable
    func lock() {
        // Pairs with the releasing CAS in unlock / unlockContended.
        if !AtomicMemory.compareAndSwap(expected: 0, desired: Self.locked, at: word, ordering: .acquiring) {
            _ = lockContended(deadline: .distantFuture)
        }
    }

    @inlinable
    func tryLock() -> Bool {
        var state = AtomicMemory.load(from: word, ordering: .relaxed)
        while state & Self.locked == 0 {
            let r = AtomicMemory.compareExchange(
                expected: state, desired: state | Self.locked, at: word, ordering: .acquiring)
            if r.exchanged { return true }
            state = r.original
        }
        return false
    }

    @inlinable
    func lock(before deadline: MonotonicClock.Instant) -> Bool {
        if AtomicMemory.compareAndSwap(expected: 0, desired: Self.locked, at: word, ordering: .acquiring) {
            return true
        }
        return lockContended(deadline: deadline)
    }

    @inlinable
    func unlock() {
        // Pairs with the acquiring CAS of the next holder.
        if !AtomicMemory.compareAndSwap(expected: Self.locked, desired: 0, at: word, ordering: .releasing) {
            unlockContended()
        }
    }
}

// MARK: - Slow paths

extension FutexMutex {
    /// Spin rounds before sleeping, each a burst of pause hints that doubles
    /// up to `maxSpinBurst`: 127 pauses in all, ~3 µs on this Zen 3 (a pause
    /// is ~25 ns), the length of a short critical section plus a cache-line
    /// transfer; waiting longer, sleeping is cheaper. Only while nobody
    /// sleeps: then spinning would steal the sleepers' turn and the holder's
    /// CPU.
    @usableFromInline static var spinLimit: Int { 7 }
    @usableFromInline static var maxSpinBurst: Int { 64 }

    /// Acquires the lock for a thread that slept on a condition variable whose
    /// `broadcast` may have moved it (`FUTEX_CMP_REQUEUE`) onto this lock's
    /// word. Such a thread was woken by an `unlock` as one of this lock's
    /// sleepers, so it acquires as a sleeper does: it sets `parked` when it
    /// takes the lock, because the other moved threads may still sleep on the
    /// word and the next `unlock` must wake one of them; and it may become
    /// the heir. Blocks. Acquire ordering. Never times out.
    @usableFromInline
    @inline(never)
    func lockAfterRequeue() {
        _ = lockContended(deadline: .distantFuture, hasSlept: true)
    }

    @usableFromInline
    @inline(never)
    func lockContended(deadline: MonotonicClock.Instant, hasSlept alreadySlept: Bool = false) -> Bool {
        let futex = Futex(word)
        var spins = 0
        var hasSlept = alreadySlept
        var state = AtomicMemory.load(from: word, ordering: .relaxed)
        while true {
            // A thread that has slept may be the one woken: whatever it does
            // next, it clears `parkedWaking` in the same step.
            let keep: UInt32 = hasSlept ? ~Self.parkedWaking : ~0
            // Free: take it. A thread that has slept marks the lock parked
            // when it takes it, since other sleepers may remain; the next
            // unlock then wakes one of them.
            if state & Self.locked == 0 {
                let desired = (state | Self.locked | (hasSlept ? Self.parked : 0)) & keep
                let r = AtomicMemory.compareExchange(expected: state, desired: desired, at: word, ordering: .acquiring)
                if r.exchanged { return true }
                state = r.original
                continue
            }
            // Spin while nobody sleeps: the holder is probably running and
            // about to release.
            if state & (Self.parked | Self.heir) == 0 && !hasSlept && spins < Self.spinLimit {
                for _ in 0..<min(1 << spins, Self.maxSpinBurst) { spinLoopHint() }
                spins += 1
                // Only loads while spinning, to leave the holder's cache line alone.
                state = AtomicMemory.load(from: word, ordering: .relaxed)
                continue
            }
            // Woken, and the lock was taken again before we ran: keep our
            // place as the heir, unless there is one already.
            if hasSlept && state & Self.heir == 0 {
                let r = AtomicMemory.compareExchange(
                    expected: state, desired: (state | Self.heir) & keep, at: word, ordering: .relaxed)
                if !r.exchanged { state = r.original; continue }
                return serveAsHeir(until: deadline)
            }
            // Announce a sleeper, then sleep while the word is unchanged.
            if state & Self.parked == 0 || state & ~keep != 0 {
                let desired = (state | Self.parked) & keep
                let r = AtomicMemory.compareExchange(expected: state, desired: desired, at: word, ordering: .relaxed)
                if !r.exchanged { state = r.original; continue }
                state = desired
            }
            // Giving up only now: `parked` is set and `parkedWaking` clear on a
            // locked word, so if this thread was woken as well, the holder's
            // unlock wakes one of the remaining sleepers.
            if MonotonicClock.now >= deadline { return false }
            let result = futex.wait(expecting: state, until: deadline)
            hasSlept = true
            if result == .timedOut { return false }
            state = AtomicMemory.load(from: word, ordering: .relaxed)
        }
    }

    /// The heir's life: sleeps on the heir word until an unlock hands it the
    /// lock or wakes it with the lock free, and gives up at `deadline`.
    /// Returns whether it acquired. Whatever it does, it leaves `parked` set
    /// (it was woken from the lock word, whose other sleepers must stay
    /// reachable), as every thread that has slept does.
    @usableFromInline
    func serveAsHeir(until deadline: MonotonicClock.Instant) -> Bool {
        let futex = Futex(heirWord)
        let resigning = ~(Self.heir | Self.heirWaking)
        while true {
            // The sequence first, then the word: an unlock writes them in the
            // other order (releasing the sequence).
            let sequence = AtomicMemory.load(from: heirWord, ordering: .acquiring)
            let state = AtomicMemory.load(from: word, ordering: .relaxed)
            if state & Self.handoff != 0 {
                // Handed to us: the lock stays locked, so claiming is acquiring.
                let desired = (state & ~Self.handoff & resigning) | Self.parked
                if AtomicMemory.compareAndSwap(expected: state, desired: desired, at: word, ordering: .acquiring) {
                    return true
                }
                continue
            }
            if state & Self.locked == 0 {
                let desired = (state & resigning) | Self.locked | Self.parked
                if AtomicMemory.compareAndSwap(expected: state, desired: desired, at: word, ordering: .acquiring) {
                    return true
                }
                continue
            }
            if MonotonicClock.now >= deadline {
                // Resign. The lock is held, so its unlock sees `parked`.
                let desired = (state & resigning) | Self.parked
                if AtomicMemory.compareAndSwap(expected: state, desired: desired, at: word, ordering: .relaxed) {
                    return false
                }
                continue
            }
            // Back to sleep: we are no longer on our way.
            if state & Self.heirWaking != 0 {
                let desired = state & ~Self.heirWaking
                if !AtomicMemory.compareAndSwap(expected: state, desired: desired, at: word, ordering: .relaxed) {
                    continue
                }
            }
            _ = futex.wait(expecting: sequence, until: deadline)
        }
    }

    @usableFromInline
    @inline(never)
    func unlockContended() {
        var state = AtomicMemory.load(from: word, ordering: .relaxed)
        var due: Bool?
        while true {
            require(
                state & Self.locked != 0 && state & Self.handoff == 0,
                "unlock(): the lock is not locked (unbalanced unlock, or unlock before lock)")
            if state & Self.heir != 0 {
                // Only the heir is woken while there is one; the other
                // sleepers keep their order. Release, or hand the lock over
                // if it is time; either way wake the heir unless it is
                // already on its way.
                let handOver = due ?? handoffDue()
                due = handOver
                let wake = state & Self.heirWaking == 0
                let desired = handOver
                    ? state | Self.handoff | Self.heirWaking
                    : (state & ~Self.locked) | Self.heirWaking
                let r = AtomicMemory.compareExchange(expected: state, desired: desired, at: word, ordering: .releasing)
                if !r.exchanged { state = r.original; continue }
                if wake {
                    // After the word (see `serveAsHeir`).
                    AtomicMemory.increment(heirWord, ordering: .releasing)
                    Futex(heirWord).wake(1)
                }
                return
            }
            // Release. With sleepers and no wake-up on its way, wake one,
            // clearing `parked`: the woken thread sets it again when it takes
            // the lock, goes back to sleep, or (as the heir) acquires.
            let wake = state & Self.parked != 0 && state & Self.parkedWaking == 0
            let desired = wake
                ? (state & ~(Self.locked | Self.parked)) | Self.parkedWaking
                : state & ~Self.locked
            let r = AtomicMemory.compareExchange(expected: state, desired: desired, at: word, ordering: .releasing)
            if !r.exchanged { state = r.original; continue }
            if wake && Futex(word).wake(1) == 0 { wakeFoundNobody() }
            return
        }
    }

    /// An unlock's wake call found nobody asleep (the sleepers were between
    /// announcing themselves and sleeping; the word has changed under them,
    /// so they will look again): clear `parkedWaking`, which nobody else
    /// will. Other unlocks may have skipped their wake-up meanwhile, so if
    /// the lock is free and `parked` set, wake one now.
    @usableFromInline
    func wakeFoundNobody() {
        var state = AtomicMemory.load(from: word, ordering: .relaxed)
        while state & Self.parkedWaking != 0 {
            let r = AtomicMemory.compareExchange(
                expected: state, desired: state & ~Self.parkedWaking, at: word, ordering: .relaxed)
            if r.exchanged {
                state &= ~Self.parkedWaking
                break
            }
            state = r.original
        }
        if state & Self.locked == 0 { wakeParked() }
    }

    /// Wakes one sleeper of the lock word if `parked` says there may be one
    /// and no wake-up is on its way, clearing `parked` (the woken thread sets
    /// it again).
    @usableFromInline
    func wakeParked() {
        var state = AtomicMemory.load(from: word, ordering: .relaxed)
        while state & Self.parked != 0 && state & Self.parkedWaking == 0 {
            let desired = (state & ~Self.parked) | Self.parkedWaking
            let r = AtomicMemory.compareExchange(expected: state, desired: desired, at: word, ordering: .relaxed)
            if r.exchanged {
                if Futex(word).wake(1) == 0 { wakeFoundNobody() }
                return
            }
            state = r.original
        }
    }

    /// Whether this contended unlock should hand off; if so, schedules the
    /// next one. Runs while holding the lock, so `nextHandoff` needs no atomics: the
    /// lock word's acquire/release orders every access to it.
    @usableFromInline
    func handoffDue() -> Bool {
        let now = MonotonicClock.now.nanoseconds
        guard now >= nextHandoff.pointee else { return false }
        // ±10% jitter from the clock's low bits: cheap, and plenty for
        // breaking lock-step (no security rests on it).
        let interval = Self.fairnessInterval.nanosecondsSaturating
        let mixed = UInt64(bitPattern: now) &* 0x9E37_79B9_7F4A_7C15
        nextHandoff.pointee = now &+ interval * 9 / 10 &+ Int64(mixed >> 1) % max(interval / 5, 1)
        return true
    }
}
