import CShims

/// The wall clock: Linux `CLOCK_REALTIME`, the time of day that other hosts
/// and processes agree on, for records that outlive a process (the time a
/// `DistributedLock` was taken). It may jump when the system time is set, so
/// it is never used for a deadline: deadlines are on `MonotonicClock`.
public enum WallClock {
    /// A point on the wall clock: whole seconds since 1970-01-01 00:00:00 UTC
    /// (the Unix epoch) and nanoseconds within that second. Foundation's
    /// `Date(timeIntervalSince1970: Double(instant.secondsSinceEpoch) +
    /// Double(instant.nanoseconds) / 1e9)` is the same instant.
    public struct Instant: Hashable, Comparable, Sendable, CustomStringConvertible {
        /// Whole seconds since the Unix epoch (negative before it).
        public var secondsSinceEpoch: Int64
        /// Nanoseconds within the second, 0 ..< 1_000_000_000.
        public var nanoseconds: Int32

        /// The instant `secondsSinceEpoch` seconds plus `nanoseconds` after the
        /// Unix epoch. Stops the process with a message if `nanoseconds` is
        /// not in 0 ..< 1_000_000_000.
        public init(secondsSinceEpoch: Int64, nanoseconds: Int32 = 0) {
            require(
                nanoseconds >= 0 && nanoseconds < 1_000_000_000,
                "WallClock.Instant: `nanoseconds` is \(nanoseconds); it must be in 0 ..< 1_000_000_000")
            self.secondsSinceEpoch = secondsSinceEpoch
            self.nanoseconds = nanoseconds
        }

        /// The wall-clock time now. Never blocks (the vDSO serves it).
        public static var now: Instant { WallClock.now }

        /// The time from this instant to `other` (negative if `other` is earlier).
        public func duration(to other: Instant) -> Duration {
            .seconds(other.secondsSinceEpoch - secondsSinceEpoch)
                + .nanoseconds(Int64(other.nanoseconds) - Int64(nanoseconds))
        }

        public static func < (a: Instant, b: Instant) -> Bool {
            (a.secondsSinceEpoch, a.nanoseconds) < (b.secondsSinceEpoch, b.nanoseconds)
        }

        /// `"<seconds>.<nine digits> s since 1970"`.
        public var description: String {
            let fraction = String(nanoseconds)
            return "\(secondsSinceEpoch).\(String(repeating: "0", count: 9 - fraction.count))\(fraction) s since 1970"
        }
    }

    /// The wall-clock time now (`clock_gettime(CLOCK_REALTIME)`, served by
    /// the vDSO without a system call). Never blocks.
    public static var now: Instant {
        var seconds: Int64 = 0
        var nanoseconds: Int32 = 0
        cshims_realtime_now(&seconds, &nanoseconds)
        return Instant(secondsSinceEpoch: seconds, nanoseconds: nanoseconds)
    }
}
