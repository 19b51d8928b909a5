/// What a Foundation user reaches for on `RunLoop`, with Spindle's names.
extension ThreadLoop {
    /// The mode of the innermost `run` in progress on the loop's thread, or
    /// nil when the loop is not running (Foundation's `currentMode`). Any
    /// thread; takes the loop's lock briefly; from another thread a snapshot.
    public var currentMode: LoopMode? {
        lock.withLock { runningModesSnapshot.last }
    }

    /// Makes one pass in `mode` without sleeping (what `run(mode:timeout:
    /// .zero)` does: performs, signalled sources, due timers and ready
    /// descriptors are handled), then returns when the next timer of `mode`
    /// is due, or nil when `mode` has no valid timer (Foundation's
    /// `limitDate(forMode:)`). On the loop's own thread only (a precondition
    /// failure elsewhere); an empty mode makes no pass and returns nil.
    public func limitDate(forMode mode: LoopMode) -> MonotonicClock.Instant? {
        _ = run(mode: mode, timeout: .zero)
        return earliestFireDate(mode).flatMap { $0.isDistantFuture ? nil : $0 }
    }
}

/// Deadlines on any of Spindle's and Swift's monotonic clocks.
extension ThreadLoop {
    /// As `run(mode:until:returnAfterSourceHandled:)`, with `deadline` on
    /// `ContinuousClock`, `SuspendingClock` or any `MonotonicClockConvertible`
    /// clock (converted once, on entry).
    @discardableResult
    @available(*, noasync, message: "runs the loop, blocking the thread that owns it; a loop runs on its own thread (`LoopThread`), not in async code")
    public func run<Deadline: MonotonicClockConvertible>(
        mode: LoopMode = .default, until deadline: Deadline, returnAfterSourceHandled: Bool = false
    ) -> LoopRunResult {
        run(mode: mode, until: deadline.monotonicInstant, returnAfterSourceHandled: returnAfterSourceHandled)
    }

    /// As `run(until:)`, with `deadline` on any `MonotonicClockConvertible`
    /// clock (`ContinuousClock.now + .seconds(1)`).
    @available(*, noasync, message: "runs the loop, blocking the thread that owns it; a loop runs on its own thread (`LoopThread`), not in async code")
    public func run<Deadline: MonotonicClockConvertible>(until deadline: Deadline) {
        run(until: deadline.monotonicInstant)
    }
}

/// Loops compare by identity: each thread has one loop for its life, so two
/// references are equal when they name the same loop (Foundation's
/// `RunLoop` compares the same way).
extension ThreadLoop: Hashable {
    public static func == (a: ThreadLoop, b: ThreadLoop) -> Bool { a === b }
    public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }
}
