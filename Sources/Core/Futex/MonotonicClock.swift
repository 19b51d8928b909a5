import CShims

/// The clock every Spindle deadline is measured on: Linux `CLOCK_MONOTONIC`,
/// which never jumps (unlike the wall clock) and does not advance while the
/// machine is suspended. It is the clock futex and io_uring deadlines use, so
/// a deadline passes to the kernel without conversion. Where Dispatch takes
/// a `DispatchTime`, Spindle takes an instant of this clock. (Swift's
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

        /// The instant `duration` after `instant` (before it, for a negative
        /// duration); as `advanced(by:)`, saturating.
        @inlinable
        public static func + (instant: Instant, duration: Duration) -> Instant {
            instant.advanced(by: duration)
        }

        /// The instant `duration` before `instant`; as `advanced(by:)`,
        /// saturating.
        @inlinable
        public static func - (instant: Instant, duration: Duration) -> Instant {
            instant.advanced(by: .zero - duration)
        }

        /// How long after `rhs` `lhs` is (negative when it is before).
        @inlinable
        public static func - (lhs: Instant, rhs: Instant) -> Duration {
            rhs.duration(to: lhs)
        }

        /// Moves `instant` `duration` later; as `advanced(by:)`, saturating.
        @inlinable
        public static func += (instant: inout Instant, duration: Duration) {
            instant = instant.advanced(by: duration)
        }

        /// Moves `instant` `duration` earlier; as `advanced(by:)`, saturating.
        @inlinable
        public static func -= (instant: inout Instant, duration: Duration) {
            instant = instant.advanced(by: .zero - duration)
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

// MARK: - Deadlines on Swift's clocks

/// An instant that Spindle can wait until: a point on some clock that
/// converts to one on `MonotonicClock`, the clock of every kernel wait.
/// `MonotonicClock.Instant`, `SuspendingClock.Instant` and
/// `ContinuousClock.Instant` conform, so every call that takes a deadline
/// (`lock(before:)`, `withLock(before:_:)`...) takes any of them:
///
///     let lock = Spindle.Lock()
///     if lock.lock(before: ContinuousClock.now + .seconds(1)) { ... }
public protocol MonotonicClockConvertible: Sendable {
    /// This instant on `MonotonicClock`. Never blocks (at most it reads the
    /// clocks, through the vDSO).
    var monotonicInstant: MonotonicClock.Instant { get }
}

extension MonotonicClock.Instant: MonotonicClockConvertible {
    /// The instant itself.
    @inlinable
    public var monotonicInstant: MonotonicClock.Instant { self }
}

extension MonotonicClock.Instant {
    /// The same point in time as `instant` of Swift's `SuspendingClock`.
    /// On Linux the two are one clock (`CLOCK_MONOTONIC`; the Swift runtime
    /// reads it for `SuspendingClock`), so the conversion is exact where the
    /// standard library has `systemEpoch` (Swift 6.2 and later) and otherwise
    /// off by the few nanoseconds between two reads of the clock, never early.
    @inlinable
    public init(_ instant: SuspendingClock.Instant) {
        #if compiler(>=6.2)
        self.init(nanoseconds: SuspendingClock().systemEpoch.duration(to: instant).nanosecondsSaturating)
        #else
        let now = SuspendingClock.now
        self = MonotonicClock.now.advanced(by: now.duration(to: instant))
        #endif
    }

    /// The same point in time as `instant` of Swift's `ContinuousClock`, as
    /// far as it can be known now. `ContinuousClock` reads `CLOCK_BOOTTIME`
    /// on Linux, which runs ahead of `CLOCK_MONOTONIC` by the time the
    /// machine has spent suspended; the conversion measures that offset now
    /// (the distance from `ContinuousClock.now` to `instant` is laid off from
    /// `MonotonicClock.now`, read second, so the result is never early). A
    /// wait until the result that spans a suspension of the machine ends
    /// that much after `instant`: the suspended time does not count.
    @inlinable
    public init(_ instant: ContinuousClock.Instant) {
        let now = ContinuousClock.now
        self = MonotonicClock.now.advanced(by: now.duration(to: instant))
    }
}

extension SuspendingClock.Instant: MonotonicClockConvertible {
    /// This instant on `MonotonicClock` (see `MonotonicClock.Instant.init(_:)`).
    @inlinable
    public var monotonicInstant: MonotonicClock.Instant { MonotonicClock.Instant(self) }
}

extension ContinuousClock.Instant: MonotonicClockConvertible {
    /// This instant on `MonotonicClock`, as far as it can be known now (see
    /// `MonotonicClock.Instant.init(_:)`).
    @inlinable
    public var monotonicInstant: MonotonicClock.Instant { MonotonicClock.Instant(self) }
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
