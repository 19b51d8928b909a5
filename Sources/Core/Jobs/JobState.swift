extension Job {
    /// Where a job is in its life, the guide's operation states.
    ///
    /// `pending` → `ready` → `executing` → `finished`, with two detours:
    /// adding a dependency to a ready job takes it back to `pending`, and a
    /// cancelled job that is pending becomes `ready` at once (its dependencies
    /// no longer hold it back) and, when started, goes straight to
    /// `finished` without running. Cancellation itself is a flag
    /// (`Job.isCancelled`), not a state: a job may be cancelled and ready,
    /// executing or finished.
    public enum State: Int, Sendable, Hashable, CustomStringConvertible {
        /// Waiting for dependencies that have not finished.
        case pending
        /// Free to start: every dependency has finished (or the job is
        /// cancelled), and it has not started.
        case ready
        /// Started, not yet finished.
        case executing
        /// Done: it ran (or was skipped, cancelled) and will never run again.
        case finished

        public var description: String {
            switch self {
            case .pending: "pending"
            case .ready: "ready"
            case .executing: "executing"
            case .finished: "finished"
            }
        }
    }

    /// One change of a job, as its observers see it: the job entered a
    /// state, or was cancelled. Each event is delivered to each observer
    /// exactly once, in the order the changes were made; `finished` is
    /// always the last.
    public enum Event: Sendable, Hashable, CustomStringConvertible {
        /// A dependency was added to a ready job: it waits again.
        case pending
        /// The job's last unfinished dependency finished (or was removed),
        /// or the job was cancelled while pending.
        case ready
        /// `cancel()` took effect (the first call only, and only before the
        /// job finished).
        case cancelled
        /// The job started running its work.
        case executing
        /// The job finished: its work returned (or, asynchronous, it called
        /// `finish`), or it was cancelled before it started.
        case finished

        public var description: String {
            switch self {
            case .pending: "pending"
            case .ready: "ready"
            case .cancelled: "cancelled"
            case .executing: "executing"
            case .finished: "finished"
            }
        }
    }
}
