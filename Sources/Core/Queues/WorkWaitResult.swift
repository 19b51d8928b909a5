/// How a timed wait on a `WorkGroup` or `WorkItem` ended. Replaces
/// Dispatch's `DispatchTimeoutResult`: `.completed` is its `.success`.
public enum WorkWaitResult: Sendable, Hashable {
    /// What was waited for finished (or there was nothing to wait for).
    case completed
    /// The deadline passed first.
    case timedOut
}
