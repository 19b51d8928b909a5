/// The tuned constants of the futex mutexes, in one table. Each says what it
/// bounds and where its value comes from; none depends on what a wake-up
/// costs on one machine.
@usableFromInline
enum LockTuning {
    /// Spin rounds before a waiter sleeps, each a burst of spin-loop hints
    /// that doubles up to `maxSpinBurst`: 1 + 2 + … + 64 = 127 hints. Measured
    /// as ~3 µs on a Zen 3 (a `pause` is ~25 ns there; ~40 ns on Intel since
    /// Skylake, so ~5 µs), the length of a short critical section plus a
    /// cache-line transfer (~100 ns between cores of one socket). A holder
    /// that has not released by then is in a long critical section or
    /// preempted, and sleeping is cheaper than spinning on. A count of hints,
    /// not a duration: it is the same on a machine whose wake-ups are slow.
    @usableFromInline static var spinRounds: Int { 7 }
    @usableFromInline static var maxSpinBurst: Int { 64 }

    /// How long a thread waits for a `Lock` on the lock word before it counts
    /// as starving and queues for a fair hand-off (parking_lot's eventual
    /// fairness uses 0.5–1 ms). Long against a critical section (a
    /// microsecond), so an unsaturated lock never pays for fairness; short
    /// against what a user notices.
    @usableFromInline static var starvationBound: Duration { .milliseconds(1) }

    /// The least time between two fair hand-offs of one lock. A hand-off to a
    /// thread that is asleep costs the lock one wake-up with nobody holding
    /// it (5–55 µs on a VM, ~2–5 µs on bare metal), so hand-offs at most once
    /// per interval cost at most a few percent of throughput (≤ 55 µs in
    /// 1 ms), while a starving thread waits at most `starvationBound` plus
    /// one interval per starving thread ahead of it.
    @usableFromInline static var fairHandoffInterval: Duration { .milliseconds(1) }

    /// Spin rounds of the heir after it asked for a hand-off (same units as
    /// `spinRounds`): on many cores the holder releases within them and the
    /// heir takes the lock without sleeping, so the hand-off costs no wake-up.
    @usableFromInline static var heirSpinRounds: Int { 7 }
}

/// One bounded spin burst of round `round` (see `LockTuning.spinRounds`).
@inlinable
func spinBurst(round: Int) {
    for _ in 0..<min(1 << round, LockTuning.maxSpinBurst) { spinLoopHint() }
}
