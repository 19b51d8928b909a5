/// The bounded spin that Spindle's waits run before they sleep in the kernel.
///
/// A hand-off between two running threads takes well under a microsecond;
/// sleeping and being woken costs a futex round trip (4.4–9.2 µs on the 2-core
/// VM of DESIGN.md) plus a context switch on each side. So a waiter first polls
/// its word for about as long as a sleep would cost, and only then sleeps. The
/// spin is bounded, never a busy-wait: it ends in a futex sleep.
@usableFromInline
enum WaitSpin {
    /// Polls of the waited-for word, one `pause` apart. A `pause` takes about
    /// 25 ns on this AMD EPYC (Zen 3) VM, so the spin lasts about 3 µs, a
    /// little under the futex round trip it tries to save. Measured with
    /// the Conditions ping-pong benchmarks (see the Conditions commit message).
    @usableFromInline static var polls: Int { 128 }

    /// Calls `ready` until it returns true or the polls run out; returns its
    /// last answer. Reads only (the caller's `ready` should load, not write),
    /// to leave the waker's cache line alone.
    @inlinable
    static func poll(_ ready: () -> Bool) -> Bool {
        for _ in 0..<polls {
            if ready() { return true }
            spinLoopHint()
        }
        return ready()
    }
}
