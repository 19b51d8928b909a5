// The `Bool` results the condition and semaphore waits had before every
// timed wait returned `WaitResult` (see its documentation for why), kept
// for source compatibility and deprecated. Each is generic over its result
// (only `Bool` fits), so the compiler picks it only where a `Bool` is
// required (`if sem.wait(timeout: t)`, `#expect(cond.wait(until: d))`) and
// the `WaitResult` form everywhere else (`let r = sem.wait(timeout: t)`).

extension Semaphore {
    /// Deprecated: `wait(until:)` returns `WaitResult`; compare it with
    /// `.completed`. True if a resource was taken.
    @inlinable
    @available(*, deprecated, message: "returns WaitResult now: compare with `.completed`")
    @available(*, noasync, message: "blocks the thread; in async code use `await wait()`")
    public func wait<Flag: ExpressibleByBooleanLiteral>(until deadline: MonotonicClock.Instant) -> Flag
    where Flag.BooleanLiteralType == Bool {
        Flag(booleanLiteral: wait(until: deadline) as WaitResult == .completed)
    }

    /// Deprecated: `wait(until:)` returns `WaitResult`; compare it with
    /// `.completed`. True if a resource was taken.
    @inlinable
    @available(*, deprecated, message: "returns WaitResult now: compare with `.completed`")
    @available(*, noasync, message: "blocks the thread; in async code use `await wait()`")
    public func wait<Deadline: MonotonicClockConvertible, Flag: ExpressibleByBooleanLiteral>(until deadline: Deadline) -> Flag
    where Flag.BooleanLiteralType == Bool {
        Flag(booleanLiteral: wait(until: deadline.monotonicInstant) as WaitResult == .completed)
    }

    /// Deprecated: `wait(timeout:)` returns `WaitResult`; compare it with
    /// `.completed`. True if a resource was taken.
    @inlinable
    @available(*, deprecated, message: "returns WaitResult now: compare with `.completed`")
    @available(*, noasync, message: "blocks the thread; in async code use `await wait()`")
    public func wait<Flag: ExpressibleByBooleanLiteral>(timeout: Duration) -> Flag
    where Flag.BooleanLiteralType == Bool {
        Flag(booleanLiteral: wait(timeout: timeout) as WaitResult == .completed)
    }
}

extension Condition {
    /// Deprecated: `wait(until:)` returns `WaitResult`; compare it with
    /// `.completed`. False if the deadline passed without a signal.
    @inlinable
    @available(*, deprecated, message: "returns WaitResult now: compare with `.completed`")
    @available(*, noasync, message: "blocks the thread; in async code wait with an `AsyncLock`, or `await` a `WorkGroup`, `Semaphore` or continuation")
    public func wait<Flag: ExpressibleByBooleanLiteral>(until deadline: MonotonicClock.Instant) -> Flag
    where Flag.BooleanLiteralType == Bool {
        Flag(booleanLiteral: wait(until: deadline) as WaitResult == .completed)
    }

    /// Deprecated: `wait(until:)` returns `WaitResult`; compare it with
    /// `.completed`. False if the deadline passed without a signal.
    @inlinable
    @available(*, deprecated, message: "returns WaitResult now: compare with `.completed`")
    @available(*, noasync, message: "blocks the thread; in async code wait with an `AsyncLock`, or `await` a `WorkGroup`, `Semaphore` or continuation")
    public func wait<Deadline: MonotonicClockConvertible, Flag: ExpressibleByBooleanLiteral>(until deadline: Deadline) -> Flag
    where Flag.BooleanLiteralType == Bool {
        Flag(booleanLiteral: wait(until: deadline.monotonicInstant) as WaitResult == .completed)
    }

    /// Deprecated: `wait(timeout:)` returns `WaitResult`; compare it with
    /// `.completed`. False if the deadline passed without a signal.
    @inlinable
    @available(*, deprecated, message: "returns WaitResult now: compare with `.completed`")
    @available(*, noasync, message: "blocks the thread; in async code wait with an `AsyncLock`, or `await` a `WorkGroup`, `Semaphore` or continuation")
    public func wait<Flag: ExpressibleByBooleanLiteral>(timeout: Duration) -> Flag
    where Flag.BooleanLiteralType == Bool {
        Flag(booleanLiteral: wait(timeout: timeout) as WaitResult == .completed)
    }
}

extension ConditionVariable {
    /// Deprecated: `wait(releasing:until:)` returns `WaitResult`; compare it
    /// with `.completed`. False if the deadline passed without a signal.
    @inlinable
    @available(*, deprecated, message: "returns WaitResult now: compare with `.completed`")
    @available(*, noasync, message: "blocks the thread; in async code wait with an `AsyncLock`, or `await` a `WorkGroup`, `Semaphore` or continuation")
    public func wait<Flag: ExpressibleByBooleanLiteral>(releasing lock: Lock, until deadline: MonotonicClock.Instant) -> Flag
    where Flag.BooleanLiteralType == Bool {
        Flag(booleanLiteral: wait(releasing: lock, until: deadline) as WaitResult == .completed)
    }

    /// Deprecated: `wait(releasing:until:)` returns `WaitResult`; compare it
    /// with `.completed`. False if the deadline passed without a signal.
    @inlinable
    @available(*, deprecated, message: "returns WaitResult now: compare with `.completed`")
    @available(*, noasync, message: "blocks the thread; in async code wait with an `AsyncLock`, or `await` a `WorkGroup`, `Semaphore` or continuation")
    public func wait<Deadline: MonotonicClockConvertible, Flag: ExpressibleByBooleanLiteral>(
        releasing lock: Lock, until deadline: Deadline
    ) -> Flag where Flag.BooleanLiteralType == Bool {
        Flag(booleanLiteral: wait(releasing: lock, until: deadline.monotonicInstant) as WaitResult == .completed)
    }

    /// Deprecated: `wait(releasing:timeout:)` returns `WaitResult`; compare
    /// it with `.completed`. False if the deadline passed without a signal.
    @inlinable
    @available(*, deprecated, message: "returns WaitResult now: compare with `.completed`")
    @available(*, noasync, message: "blocks the thread; in async code wait with an `AsyncLock`, or `await` a `WorkGroup`, `Semaphore` or continuation")
    public func wait<Flag: ExpressibleByBooleanLiteral>(releasing lock: Lock, timeout: Duration) -> Flag
    where Flag.BooleanLiteralType == Bool {
        Flag(booleanLiteral: wait(releasing: lock, timeout: timeout) as WaitResult == .completed)
    }
}
