/// The bounded spin that Spindle's condition types run before they sleep in
/// the kernel, adapted per object to whether spinning has been paying off.
///
/// A hand-off between two threads that are both running takes well under a
/// microsecond; sleeping costs a futex round trip and a context switch on
/// each side (4.4–9.2 µs for a round trip on the 2-core VM of DESIGN.md). So
/// a waiter polls its word first. But a spin only pays while the thread that
/// will wake it is running on another CPU; when both share a CPU (a loaded
/// machine), every spin is time taken from the very thread it waits for. So
/// the spin's length is learnt:
///
/// - the word holds the current limit, in polls of the waited-for word;
/// - a spin that succeeds after `n` polls raises the limit to at least `2n`
///   (room for the same wait next time);
/// - a spin that fails (the thread went to sleep) halves it;
/// - once the limit has decayed, about one wait in 256 still probes with the
///   full limit, so that a workload that becomes spinnable again (both
///   threads running) is found again. (One in 64 cost 0.4 µs per round trip
///   of a two-thread ping-pong confined to one CPU, where no spin can
///   succeed; one in 256 costs a quarter of that.)
///
/// The word is shared by all the object's waiters and updated with relaxed
/// loads and stores: a lost update only makes one spin a little longer or
/// shorter. Every spin is bounded and ends in a futex sleep.
@usableFromInline
struct AdaptiveSpin {
    @usableFromInline let limit: UnsafeMutablePointer<UInt32>

    /// The longest spin, in polls one `pause` apart: about 13 µs on this AMD
    /// EPYC (Zen 3) VM, where `pause` takes about 25 ns. It has to cover the
    /// other thread's wake-up from a futex sleep on another CPU (5–10 µs in a
    /// VM), or two threads handing a turn back and forth never both stay
    /// awake. Measured on an idle VM, two-thread ping-pong round trips
    /// (Condition / ConditionVariable / Semaphore / ConditionLock): 128 polls
    /// 0.62 / 0.78 / 0.26 / 0.61 µs, 256 polls 0.49 / 0.49 / 0.13 / 0.22 µs,
    /// 512 polls 0.34 / 0.41 / 0.12 / 0.20 µs (NSCondition: 12 µs).
    @usableFromInline static var maximumPolls: UInt32 { 512 }

    /// Below this limit, a wait probes with `maximumPolls` about once in 256.
    @usableFromInline static var probeBelow: UInt32 { 32 }

    /// The limit a new object starts with: spin, until it stops paying.
    static var initialPolls: UInt32 { maximumPolls }

    @inlinable
    init(_ limit: UnsafeMutablePointer<UInt32>) {
        self.limit = limit
    }

    /// Polls `ready` until it returns true or the limit runs out; returns its
    /// last answer. `ready` should only load (to leave the waker's cache line
    /// alone), and cheaply: it runs once per poll.
    @inlinable
    func poll(_ ready: () -> Bool) -> Bool {
        if ready() { return true }
        var polls = AtomicMemory.load(from: limit, ordering: .relaxed)
        if polls < Self.probeBelow && Self.shouldProbe() { polls = Self.maximumPolls }
        var n: UInt32 = 0
        while n < polls {
            spinLoopHint()
            n += 1
            if ready() {
                let wanted = min(Self.maximumPolls, 2 * n)
                if wanted > AtomicMemory.load(from: limit, ordering: .relaxed) {
                    AtomicMemory.store(wanted, to: limit, ordering: .relaxed)
                }
                return true
            }
        }
        let current = AtomicMemory.load(from: limit, ordering: .relaxed)
        if current != 0 { AtomicMemory.store(current / 2, to: limit, ordering: .relaxed) }
        return false
    }

    /// About one call in 256 says yes. The monotonic clock's bits from 10 up
    /// (microseconds, roughly) are random enough for this and cost one vDSO
    /// read; the caller is about to sleep anyway.
    @usableFromInline
    static func shouldProbe() -> Bool {
        (MonotonicClock.now.nanoseconds >> 10) & 255 == 0
    }
}
