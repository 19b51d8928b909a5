import Spindle
import Testing

@Suite("MonotonicClock")
struct MonotonicClockTests {
    @Test func instantsHaveSwiftsArithmetic() {
        let start = MonotonicClock.Instant(nanoseconds: 5_000_000_000)
        let later = start + .seconds(1)
        #expect(later.nanoseconds == 6_000_000_000)
        #expect(later - .milliseconds(1500) == MonotonicClock.Instant(nanoseconds: 4_500_000_000))
        #expect(later - start == .seconds(1))
        #expect(start - later == .seconds(-1))
        #expect(start < later && later > start && start <= start)
        var moving = start
        moving += .microseconds(3)
        #expect(moving.nanoseconds == 5_000_003_000)
        moving -= .microseconds(3)
        #expect(moving == start)
        #expect(start.advanced(by: .nanoseconds(7)).nanoseconds == 5_000_000_007)
        #expect(start.duration(to: later) == .seconds(1))
        // What the issue asked to compile.
        let deadline = MonotonicClock.now + .seconds(1)
        #expect(deadline > MonotonicClock.now - .seconds(1))
    }

    @Test func arithmeticSaturatesInsteadOfOverflowing() {
        #expect(MonotonicClock.Instant.distantFuture + .seconds(1) == .distantFuture)
        #expect(MonotonicClock.Instant.distantFuture - .seconds(1) == .distantFuture, "no deadline stays no deadline")
        #expect(MonotonicClock.Instant(nanoseconds: 10) - .seconds(1) == MonotonicClock.Instant(nanoseconds: 0))
        #expect(MonotonicClock.Instant(nanoseconds: .max - 10) + .seconds(1) == .distantFuture)
    }

    @Test func suspendingClockIsTheSameClock() {
        // SuspendingClock reads CLOCK_MONOTONIC on Linux: its instant lies
        // between two reads of MonotonicClock around it.
        let before = MonotonicClock.now
        let suspending = SuspendingClock.now
        let after = MonotonicClock.now
        let converted = MonotonicClock.Instant(suspending)
        #expect(before <= converted && converted <= after)
        #expect(MonotonicClock.Instant(suspending + .seconds(5)) - converted == .seconds(5))
        #expect(suspending.monotonicInstant == converted)
    }

    @Test func continuousClockConvertsToTheSamePointInTime() {
        // A conversion of instant x reads ContinuousClock, then
        // MonotonicClock: it gives x's own point on MonotonicClock plus the
        // few nanoseconds between those two reads. So it lies at or after a
        // MonotonicClock read made before x was read, and at or before one
        // made after the conversion; each conversion measures the clocks'
        // offset afresh.
        let before = MonotonicClock.now
        let continuous = ContinuousClock.now
        let converted = MonotonicClock.Instant(continuous)
        let ahead = (continuous + .seconds(10)).monotonicInstant
        let after = MonotonicClock.now
        #expect(before <= converted && converted <= after)
        #expect(before + .seconds(10) <= ahead && ahead <= after + .seconds(10))
    }
}
