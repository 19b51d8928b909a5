import CShims

/// The wall clock: Linux `CLOCK_REALTIME`, the time of day that other hosts
/// and processes agree on, for records that outlive a process (the time a
/// `DistributedLock` was taken). It may jump when the system time is set, so
/// it is never a deadline's own clock: deadlines are on `MonotonicClock`.
/// It plays the part of Dispatch's `DispatchWallTime`.
/// A `WallClock.Instant` can still be passed wherever a clock-generic
/// deadline is taken (it is `MonotonicClockConvertible`); see
/// `WallClock.Instant.monotonicInstant` for what that means when the wall
/// clock is set.
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

        /// The instant `duration` later (earlier for a negative duration).
        /// Stops the process if the result's seconds do not fit in `Int64`.
        public func advanced(by duration: Duration) -> Instant {
            let (seconds, attoseconds) = duration.components
            var nanos = Int64(nanoseconds) + attoseconds / 1_000_000_000
            var whole = secondsSinceEpoch + seconds
            if nanos >= 1_000_000_000 { nanos -= 1_000_000_000; whole += 1 }
            if nanos < 0 { nanos += 1_000_000_000; whole -= 1 }
            return Instant(secondsSinceEpoch: whole, nanoseconds: Int32(nanos))
        }

        /// The instant `duration` after `instant`.
        public static func + (instant: Instant, duration: Duration) -> Instant { instant.advanced(by: duration) }

        /// The instant `duration` before `instant`.
        public static func - (instant: Instant, duration: Duration) -> Instant { instant.advanced(by: .zero - duration) }

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

extension WallClock.Instant: MonotonicClockConvertible {
    /// This wall-clock instant as a `MonotonicClock` deadline, converted now:
    /// `MonotonicClock.now` plus the time from `WallClock.now` to this
    /// instant. So `lock.lock(before: WallClock.now + .seconds(2))`, a
    /// `ThreadLoop.run(until:)` with a wall-clock instant, and every other
    /// clock-generic deadline accept it, as Foundation's calls accept a `Date`.
    ///
    /// The conversion happens once, when the call starts: if the system
    /// time is set (stepped) while the call waits, the deadline does not
    /// move, and the wait ends after the same elapsed time it would have.
    /// Foundation on Linux differs by call: `NSLock.lock(before:)` and
    /// `NSCondition.wait(until:)` hand the `Date` to glibc as an absolute
    /// `CLOCK_REALTIME` time (`pthread_mutex_timedlock`,
    /// `pthread_cond_timedwait`), so a clock step moves their deadline, while
    /// `RunLoop.run(until:)` turns its `Date` into an interval from now once,
    /// as Spindle does everywhere. An instant already past converts to a
    /// past deadline (the call only tries, or makes one pass).
    ///
    /// Never blocks: two clock reads through the vDSO. Saturates at
    /// `MonotonicClock.Instant.distantFuture` and at the clock's start.
    public var monotonicInstant: MonotonicClock.Instant {
        let wallNow = WallClock.now
        return MonotonicClock.now.advanced(by: wallNow.duration(to: self))
    }
}
