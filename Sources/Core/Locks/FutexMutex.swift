/// The futex mutex algorithm behind `Lock` and `RecursiveLock`, on a lock
/// word and a hand-off timestamp that the owning object keeps at stable
/// addresses. See `Lock` for the contract; this type adds nothing to it.
@usableFromInline
struct FutexMutex {
    /// The lock word's bits.
    ///
    ///     bit 0  locked    held by some thread
    ///     bit 1  parked    a thread may be asleep on the word: unlock must wake one
    ///     bit 2  handoff   an unlock gave the lock (still locked) to a sleeper;
    ///                      only a thread that has slept may claim it
    ///
    /// 0 is the idle state; `locked` alone is "held, nobody waiting".
    @usableFromInline static var locked: UInt32 { 1 }
    @usableFromInline static var parked: UInt32 { 2 }
    @usableFromInline static var handoff: UInt32 { 4 }

    /// On average one forced hand-off per this interval per lock (each
    /// interval is drawn between half and one and a half of it, so that
    /// threads do not fall into lock-step with it). Long enough that the cost
    /// of handing over (a wake-up and a context switch, ~5–10 µs here) stays
    /// near 1% of throughput; short enough that no waiter waits much more than
    /// one interval per thread ahead of it. Measured on 2 cores with 2–16
    /// threads: 0.1–0.2 ms lowered throughput and did not improve fairness,
    /// 2 ms cost throughput at 2 threads.
    static let fairnessInterval: Duration = .milliseconds(1)

    @usableFromInline let word: UnsafeMutablePointer<UInt32>
    /// Monotonic nanoseconds before which no unlock hands off. Read and
    /// written only by the thread holding the lock.
    @usableFromInline let nextHandoff: UnsafeMutablePointer<Int64>

    @inlinable
    init(word: UnsafeMutablePointer<UInt32>, nextHandoff: UnsafeMutablePointer<Int64>) {
        self.word = word
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
    /// Spin iterations before sleeping, each a pause-hint burst that doubles
    /// up to `maxSpinBurst`. About 2–4 µs in all: the length of a short
    /// critical section plus a cache-line transfer, beyond which sleeping
    /// costs less than spinning on.
    @usableFromInline static var spinLimit: Int { 10 }
    @usableFromInline static var maxSpinBurst: Int { 64 }

    /// Acquires the lock for a thread that slept on a condition variable whose
    /// `broadcast` may have moved it (`FUTEX_CMP_REQUEUE`) onto this lock's
    /// word. Such a thread was woken by an `unlock` as one of this lock's
    /// sleepers, so it acquires as a sleeper does: it sets `parked` when it
    /// takes the lock, because the other moved threads may still sleep on the
    /// word and the next `unlock` must wake one of them; and it may claim a
    /// hand-off. Blocks. Acquire ordering. Never times out.
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
            // Free: take it. A thread that has slept marks the lock parked
            // when it takes it, since other sleepers may remain; the next
            // unlock then wakes one of them.
            if state & Self.locked == 0 {
                let desired = state | Self.locked | (hasSlept ? Self.parked : 0)
                let r = AtomicMemory.compareExchange(expected: state, desired: desired, at: word, ordering: .acquiring)
                if r.exchanged { return true }
                state = r.original
                continue
            }
            // Handed off to a sleeper: a thread that has slept claims it. The
            // lock stays locked throughout, so the claim is the acquisition.
            if state & Self.handoff != 0 && hasSlept {
                let r = AtomicMemory.compareExchange(
                    expected: state, desired: (state & ~Self.handoff) | Self.parked, at: word, ordering: .acquiring)
                if r.exchanged { return true }
                state = r.original
                continue
            }
            // Spin while nobody sleeps: the holder is probably running and
            // about to release. Once sleepers exist, spinning only steals
            // their turn and the holder's CPU.
            if state & Self.parked == 0 && spins < Self.spinLimit {
                for _ in 0..<min(1 << spins, Self.maxSpinBurst) { spinLoopHint() }
                spins += 1
                // Only loads while spinning, to leave the holder's cache line alone.
                state = AtomicMemory.load(from: word, ordering: .relaxed)
                continue
            }
            // Announce a sleeper, then sleep while the word is unchanged.
            if state & Self.parked == 0 {
                let r = AtomicMemory.compareExchange(
                    expected: state, desired: state | Self.parked, at: word, ordering: .relaxed)
                if !r.exchanged { state = r.original; continue }
                state |= Self.parked
            }
            if MonotonicClock.now >= deadline { return false }
            let result = futex.wait(expecting: state, until: deadline)
            hasSlept = true
            state = AtomicMemory.load(from: word, ordering: .relaxed)
            if result == .timedOut {
                // A hand-off may have been aimed at us as we timed out; it is
                // ours to take (the unlocker retracts only when nobody woke).
                if state & Self.handoff != 0 {
                    let r = AtomicMemory.compareExchange(
                        expected: state, desired: (state & ~Self.handoff) | Self.parked, at: word, ordering: .acquiring)
                    if r.exchanged { return true }
                    state = r.original
                    continue
                }
                return false
            }
        }
    }

    @usableFromInline
    @inline(never)
    func unlockContended() {
        var state = AtomicMemory.load(from: word, ordering: .relaxed)
        while true {
            require(
                state & Self.locked != 0 && state & Self.handoff == 0,
                "unlock(): the lock is not locked (unbalanced unlock, or unlock before lock)")
            if state & Self.parked != 0 && handoffDue() {
                // Give the lock to the longest sleeper: stay locked, mark the
                // hand-off, wake one. Releasing: the claimer acquires.
                let r = AtomicMemory.compareExchange(
                    expected: state, desired: state | Self.handoff, at: word, ordering: .releasing)
                if !r.exchanged { state = r.original; continue }
                if Futex(word).wake(1) == 0 { retractHandoff() }
                return
            }
            // Release, clearing `parked`; the thread we wake sets it again
            // when it takes the lock or goes back to sleep.
            let r = AtomicMemory.compareExchange(
                expected: state, desired: state & ~(Self.locked | Self.parked), at: word, ordering: .releasing)
            if !r.exchanged { state = r.original; continue }
            if state & Self.parked != 0 { Futex(word).wake(1) }
            return
        }
    }

    /// Whether this contended unlock should hand off; if so, schedules the
    /// next one. Runs while holding the lock, so `nextHandoff` needs no atomics: the
    /// lock word's acquire/release orders every access to it.
    @usableFromInline
    func handoffDue() -> Bool {
        let now = MonotonicClock.now.nanoseconds
        guard now >= nextHandoff.pointee else { return false }
        // Jitter from the clock's low bits: cheap, and plenty for breaking
        // lock-step (no security rests on it).
        let interval = Self.fairnessInterval.nanosecondsSaturating
        let mixed = UInt64(bitPattern: now) &* 0x9E37_79B9_7F4A_7C15
        nextHandoff.pointee = now &+ interval / 2 &+ Int64(mixed >> 1) % max(interval, 1)
        return true
    }

    /// Nobody was asleep to receive a hand-off (the sleepers timed out or are
    /// between marking the lock and sleeping): release it normally instead,
    /// unless a thread claimed it meanwhile.
    @usableFromInline
    func retractHandoff() {
        var state = AtomicMemory.load(from: word, ordering: .relaxed)
        while state & Self.handoff != 0 {
            let r = AtomicMemory.compareExchange(
                expected: state, desired: state & ~(Self.locked | Self.handoff | Self.parked), at: word,
                ordering: .releasing)
            if r.exchanged {
                if state & Self.parked != 0 { Futex(word).wake(1) }
                return
            }
            state = r.original
        }
    }
}
