/// Counters an event registry keeps, for tests and benchmarks.
public struct EventBackendStatistics: Sendable, Hashable {
    /// `wake()` calls.
    public var wakeRequests: UInt64
    /// `wake()` calls that made a system call because the loop was asleep.
    public var wakeSyscalls: UInt64
    /// Times the loop entered the kernel to wait (or poll) for events.
    public var waitSyscalls: UInt64
}
