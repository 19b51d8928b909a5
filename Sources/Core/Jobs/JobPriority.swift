extension Job {
    /// The guide's queue priority: the order in which one `JobQueue` starts
    /// the jobs that are ready at the same moment (higher first; first added
    /// first within one level). It never lets a job overtake an unfinished
    /// dependency, and it means nothing across queues. The raw values are
    /// Foundation's (-8 … 8).
    public enum QueuePriority: Int, Sendable, Hashable, Comparable, CaseIterable, CustomStringConvertible {
        case veryLow = -8
        case low = -4
        case normal = 0
        case high = 4
        case veryHigh = 8

        /// 0 for `veryLow` … 4 for `veryHigh`: the lane of a queue's ready list.
        var lane: Int {
            switch self {
            case .veryLow: 0
            case .low: 1
            case .normal: 2
            case .high: 3
            case .veryHigh: 4
            }
        }

        public static func < (lhs: Self, rhs: Self) -> Bool { lhs.rawValue < rhs.rawValue }

        public var description: String {
            switch self {
            case .veryLow: "veryLow"
            case .low: "low"
            case .normal: "normal"
            case .high: "high"
            case .veryHigh: "veryHigh"
            }
        }
    }

    /// The worker band a thread priority (the guide's 0.0 … 1.0) runs on:
    /// below 0.25 background (nice 19), below 0.5 low (nice 10), below 0.75
    /// default, from 0.75 high (the standard band's first lane). Workers are
    /// never reniced per job: an unprivileged thread cannot raise its
    /// priority back, so a job runs on a worker that already has its band's.
    static func workPriority(forThreadPriority value: Double) -> WorkQueue.Priority {
        switch value {
        case ..<0.25: .background
        case ..<0.5: .low
        case ..<0.75: .default
        default: .high
        }
    }
}
