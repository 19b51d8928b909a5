import CShims

/// The clock every Spindle deadline is measured on: Linux `CLOCK_MONOTONIC`,
/// which never jumps (unlike the wall clock) and does not advance while the
/// machine is suspended. It is the clock futex and io_uring deadlines use, so
/// a deadline passes to the kernel without conversion. (Swift's
/// `ContinuousClock` reads `CLOCK_BOOTTIME` on Linux, which the futex call
/// does not accept.)
public struct MonotonicClock: Clock, Sendable {
    /// A point on `CLOCK_MONOTONIC`, in nanoseconds since an unspecified start
    /// (on Linux, boot).
    public struct Instant: InstantProtocol, Hashable, Sendable, CustomStringConvertible {
        /// Nanoseconds since the clock's start.
        public var nanoseconds: Int64

        /// The instant `nanoseconds` after the clock's start (boot).
        @inlinable
        public init(nanoseconds: Int64) {
            self.nanoseconds = nanoseconds
        }

        /// The current time on the clock.
        @inlinable
        public static var now: Instant { MonotonicClock.now }

        /// A deadline that never passes: waits given it sleep until woken.
        public static var distantFuture: Instant { Instant(nanoseconds: .max) }

        /// Whether this is `distantFuture`, i.e. no deadline at all.
        @inlinable
        public var isDistantFuture: Bool { nanoseconds == .max }

        /// Saturates at `distantFuture` and at the clock's start instead of
        /// overflowing.
        @inlinable
        public func advanced(by duration: Duration) -> Instant {
            if isDistantFuture { return self }
            let (sum, overflow) = nanoseconds.addingReportingOverflow(duration.nanosecondsSaturating)
            if overflow { return duration > .zero ? .distantFuture : Instant(nanoseconds: 0) }
            return Instant(nanoseconds: max(sum, 0))
        }

        @inlinable
        public func duration(to other: Instant) -> Duration {
            .nanoseconds(other.nanoseconds &- nanoseconds)
        }

        @inlinable
        public static func < (lhs: Instant, rhs: Instant) -> Bool {
            lhs.nanoseconds < rhs.nanoseconds
        }

        public var description: String {
            isDistantFuture ? "MonotonicClock.Instant(distantFuture)" : "MonotonicClock.Instant(\(nanoseconds) ns)"
        }
    }

    @inlinable
    public init() {}

    /// The current time (`clock_gettime(CLOCK_MONOTONIC)`, served by the vDSO
    /// without a system call).
    @inlinable
    public static var now: Instant { Instant(nanoseconds: cshims_monotonic_now_ns()) }

    @inlinable
    public var now: Instant { Self.now }

    /// One nanosecond: the resolution `clock_getres` reports on Linux with
    /// high-resolution timers.
    public var minimumResolution: Duration { .nanoseconds(1) }

    /// Suspends the calling task (not the thread) until `deadline`. Throws
    /// `CancellationError` if the task is cancelled first.
    public func sleep(until deadline: Instant, tolerance: Duration? = nil) async throws {
        // SuspendingClock is CLOCK_MONOTONIC too on Linux; sleep the interval on it.
        let interval = Self.now.duration(to: deadline)
        if interval > .zero {
            try await SuspendingClock().sleep(for: interval, tolerance: tolerance)
        } else {
            try Task.checkCancellation()
        }
    }
}

extension Duration {
    /// This duration in whole nanoseconds, clamped to `Int64`'s range.
    @inlinable
    internal var nanosecondsSaturating: Int64 {
        let (seconds, attoseconds) = components
        let (scaled, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return seconds < 0 ? .min : .max }
        let (sum, overflow2) = scaled.addingReportingOverflow(attoseconds / 1_000_000_000)
        if overflow2 { return seconds < 0 ? .min : .max }
        return sum
    }
}
