/// How a timed wait ended: what was waited for happened (`.completed`), or
/// the deadline passed first (`.timedOut`). Every timed wait of Spindle
/// returns it: `Semaphore.wait(until:)`, `Condition.wait(until:)`,
/// `ConditionVariable.wait(releasing:until:)`, `WorkGroup.wait(until:)`,
/// `WorkItem.wait(until:)`, `Job.waitUntilFinished(until:)`,
/// `JobQueue.waitUntilAllJobsAreFinished(until:)`, their `timeout:` forms
/// and their async forms. It replaces Dispatch's `DispatchTimeoutResult`
/// (`.completed` is its `.success`) and the `Bool` of Foundation's
/// `NSCondition.wait(until:)`.
///
/// Why one enum rather than a `Bool`: a wait's `Bool` does not say which
/// way it reads (`true` is "signalled" for `NSCondition`, but "timed out"
/// for some other APIs), and code that tests it compiles either way; the
/// enum names the outcome at the call site (`if sem.wait(timeout: .seconds(1))
/// == .timedOut`), is what Dispatch users know, and is one type for every
/// wait. Lock *acquisitions* (`lock(before:)`, `tryLock()`,
/// `ConditionLock.lock(whenCondition:before:)`, `AsyncLock.lock(until:)`)
/// keep their `Bool`: it answers "do you hold the lock now", the question
/// the `if` around a critical section asks, as `NSLock.lock(before:)` does.
///
/// The `Bool` forms of the waits that returned one before remain, deprecated,
/// for source compatibility: a call in a `Bool` context (`if`, `guard`,
/// `#expect`) still compiles, with a warning that names the replacement;
/// elsewhere the enum form is chosen.
public enum WaitResult: Sendable, Hashable {
    /// What was waited for happened (a signal, a resource, the group
    /// emptied, the item or job finished), or there was nothing to wait for.
    /// For a condition, also a spurious wake-up: test the predicate again.
    case completed
    /// The deadline passed first.
    case timedOut
}

/// The former name of `WaitResult`, when only the queues returned it.
@available(*, deprecated, renamed: "WaitResult")
public typealias WorkWaitResult = WaitResult
