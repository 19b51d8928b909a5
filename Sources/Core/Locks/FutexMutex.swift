/// The futex mutex algorithm behind `Lock` and `RecursiveLock`, on a lock
/// word and a hand-off clock word that the owning object keeps at stable
/// addresses. See `Lock` for the contract; this type adds nothing to it.
///
/// The lock word:
///
///     bit 0      locked    held by some thread
///     bit 1      handoff   an unlock gave the lock (still locked) to a sleeper;
///                          only a thread that has slept may claim it
///     bit 2      waking    a wake-up is in flight: a woken thread has not yet
///                          run; further unlocks need not wake another
///     bits 8–31  sleepers  threads registered to sleep on the word
///
/// 0 is idle; `locked` alone is "held, nobody waiting", the only state the
/// inlined fast paths handle. While sleepers exist every unlock takes the
/// slow path, which wakes one sleeper unless a wake-up is already in flight,
/// and now and then (`fairnessInterval`) hands the lock straight to a woken
/// sleeper instead of releasing it, so that a thread that keeps re-taking
/// the lock cannot keep it for its whole time slice.
///
/// The hand-off clock word: the low 4 bits count contended unlocks down to
/// the next clock reading (a reading costs ~20 ns, as much as the rest of
/// an unlock); the high 28 bits are the time of the next hand-off in units of
/// 2^12 ns (4.1 µs), compared with wrap-around arithmetic (the field wraps
/// every ~18 minutes; only differences below half of that matter).
@usableFromInline
struct FutexMutex {
    @usableFromInline static var locked: UInt32 { 1 }
    @usableFromInline static var handoff: UInt32 { 2 }
    @usableFromInline static var waking: UInt32 { 4 }
    @usableFromInline static var sleeper: UInt32 { 1 << 8 }

    /// On average one forced hand-off per this interval per busy lock (each
    /// interval is drawn between half and one and a half of it, so threads
    /// do not fall into lock-step with it). A hand-off costs a context switch
    /// (~5–10 µs here), about 2% of throughput at this interval; measured on
    /// 2 cores with 2–16 threads, shorter intervals cost more throughput than
    /// they gained in fairness over 40 ms windows, longer ones lost fairness.
    static let fairnessInterval: Duration = .microseconds(500)

    @usableFromInline let word: UnsafeMutablePointer<UInt32>
    /// Read and written only by the thread holding the lock.
    @usableFromInline let handoffClock: UnsafeMutablePointer<UInt32>

    @inlinable
    init(word: UnsafeMutablePointer<UInt32>, handoffClock: UnsafeMutablePointer<UInt32>) {
        self.word = word
        self.handoffClock = handoffClock
    }

    @inlinable
    func lock() {
        // Pairs with the releasing CAS of unlock / unlockContended.
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
    /// up to `maxSpinBurst`: about 2–4 µs in all, the length of a short
    /// critical section plus a cache-line transfer; longer, sleeping is
    /// cheaper. Spinning only while nobody sleeps: once sleepers exist it
    /// would steal their turn and the holder's CPU.
    @usableFromInline static var spinLimit: Int { 10 }
    @usableFromInline static var maxSpinBurst: Int { 64 }

    @usableFromInline
    @inline(never)
    func lockContended(deadline: MonotonicClock.Instant) -> Bool {
        let futex = Futex(word)
        var spins = 0
        // Set once this thread has slept: it may then claim a hand-off, and
        // it clears `waking` (it may be the woken thread) whenever it takes
        // the lock or goes back to sleep.
        var hasSlept = false
        var state = AtomicMemory.load(from: word, ordering: .relaxed)
        while true {
            if state & Self.locked == 0 {
                let desired = (state | Self.locked) & (hasSlept ? ~Self.waking : ~0)
                let r = AtomicMemory.compareExchange(expected: state, desired: desired, at: word, ordering: .acquiring)
                if r.exchanged { return true }
                state = r.original
                continue
            }
            if state & Self.handoff != 0 && hasSlept {
                // The lock stays locked throughout: claiming is acquiring.
                let desired = state & ~(Self.handoff | Self.waking)
                let r = AtomicMemory.compareExchange(expected: state, desired: desired, at: word, ordering: .acquiring)
                if r.exchanged { return true }
                state = r.original
                continue
            }
            if state < Self.sleeper && !hasSlept && spins < Self.spinLimit {
                for _ in 0..<min(1 << spins, Self.maxSpinBurst) { spinLoopHint() }
                spins += 1
                // Only loads while spinning, to leave the holder's cache line alone.
                state = AtomicMemory.load(from: word, ordering: .relaxed)
                continue
            }
            if MonotonicClock.now >= deadline { return false }
            // Register as a sleeper (and hand back `waking` if it was ours),
            // then sleep while the word is unchanged.
            let registered = (state &+ Self.sleeper) & (hasSlept ? ~Self.waking : ~0)
            let r = AtomicMemory.compareExchange(expected: state, desired: registered, at: word, ordering: .relaxed)
            if !r.exchanged { state = r.original; continue }
            let result = futex.wait(expecting: registered, until: deadline)
            hasSlept = true
            state = AtomicMemory.add(0 &- Self.sleeper, to: word, ordering: .relaxed)
            if result == .timedOut {
                return timedOut(state)
            }
        }
    }

    /// A sleeper's deadline passed. If a hand-off is pending it may have been
    /// aimed at this thread, so take it (the lock is acquired, a little
    /// late); otherwise clear `waking`, which may have been ours, so later
    /// unlocks keep waking the others.
    @usableFromInline
    func timedOut(_ observed: UInt32) -> Bool {
        var state = observed
        while true {
            if state & Self.handoff != 0 {
                let r = AtomicMemory.compareExchange(
                    expected: state, desired: state & ~(Self.handoff | Self.waking), at: word, ordering: .acquiring)
                if r.exchanged { return true }
                state = r.original
                continue
            }
            if state & Self.waking == 0 { return false }
            let r = AtomicMemory.compareExchange(expected: state, desired: state & ~Self.waking, at: word, ordering: .relaxed)
            if r.exchanged { return false }
            state = r.original
        }
    }

    @usableFromInline
    @inline(never)
    func unlockContended() {
        var state = AtomicMemory.load(from: word, ordering: .relaxed)
        let futex = Futex(word)
        while true {
            require(
                state & Self.locked != 0 && state & Self.handoff == 0,
                "unlock(): the lock is not locked (unbalanced unlock, or unlock before lock)")
            let sleepersWait = state >= Self.sleeper
            let wakeNeeded = sleepersWait && state & Self.waking == 0
            if sleepersWait && handoffDue() {
                // Give the lock to a sleeper: stay locked, mark the hand-off,
                // wake one unless a woken thread is already on its way (it
                // will claim it). Releasing: the claimer acquires.
                let r = AtomicMemory.compareExchange(
                    expected: state, desired: state | Self.handoff | Self.waking, at: word, ordering: .releasing)
                if !r.exchanged { state = r.original; continue }
                if wakeNeeded && futex.wake(1) == 0 { retractHandoff() }
                return
            }
            let desired = (state & ~Self.locked) | (wakeNeeded ? Self.waking : 0)
            let r = AtomicMemory.compareExchange(expected: state, desired: desired, at: word, ordering: .releasing)
            if !r.exchanged { state = r.original; continue }
            if wakeNeeded && futex.wake(1) == 0 { clearWaking() }
            return
        }
    }

    /// Nobody slept in the kernel to take the wake-up (registered sleepers
    /// were between registering and sleeping, and will see the word change):
    /// nobody will clear `waking`, so clear it here.
    @usableFromInline
    func clearWaking() {
        var state = AtomicMemory.load(from: word, ordering: .relaxed)
        while state & Self.waking != 0 {
            let r = AtomicMemory.compareExchange(expected: state, desired: state & ~Self.waking, at: word, ordering: .relaxed)
            if r.exchanged { return }
            state = r.original
        }
    }

    /// A hand-off found no sleeper in the kernel: release the lock normally
    /// instead, unless a thread claimed it meanwhile.
    @usableFromInline
    func retractHandoff() {
        var state = AtomicMemory.load(from: word, ordering: .relaxed)
        while state & Self.handoff != 0 {
            let r = AtomicMemory.compareExchange(
                expected: state, desired: state & ~(Self.locked | Self.handoff | Self.waking), at: word,
                ordering: .releasing)
            if r.exchanged { return }
            state = r.original
        }
    }

    /// Whether this contended unlock should hand off; if so, schedules the
    /// next one. Runs while holding the lock, so the clock word needs no
    /// atomics: the lock word's acquire/release orders every access to it.
    @usableFromInline
    func handoffDue() -> Bool {
        let clock = handoffClock.pointee
        if clock & 0xF != 0 {
            handoffClock.pointee = clock &- 1
            return false
        }
        let nowUnits = UInt32(truncatingIfNeeded: MonotonicClock.now.nanoseconds >> 12) << 4
        let next = clock & ~0xF
        let interval = UInt32(truncatingIfNeeded: Self.fairnessInterval.nanosecondsSaturating >> 12)
        // Not due while `next` is ahead of now by at most the longest interval
        // ever scheduled. Anything else (a new lock's 0, a lock idle long
        // enough for the field to wrap) counts as due.
        let ahead = Int32(bitPattern: next &- nowUnits)
        if ahead > 0 && ahead <= Int32(truncatingIfNeeded: (interval &* 2) << 4) {
            handoffClock.pointee = next | 15
            return false
        }
        // Jitter from the clock's low bits: cheap, and enough to break lock-step.
        let jitter = (nowUnits >> 4) &* 2_654_435_761 % max(interval, 1)
        handoffClock.pointee = (nowUnits &+ ((interval / 2 &+ jitter) << 4)) | 15
        return true
    }
}
