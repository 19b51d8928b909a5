import Spindle
import Testing

@Suite("WallClock")
struct WallClockTests {
    @Test func instantsOrderBySecondsThenNanoseconds() {
        let a = WallClock.Instant(secondsSinceEpoch: 10, nanoseconds: 999_999_999)
        let b = WallClock.Instant(secondsSinceEpoch: 11, nanoseconds: 0)
        #expect(a < b)
        #expect(a.duration(to: b) == .nanoseconds(1))
        #expect(b.duration(to: a) == .nanoseconds(-1))
        #expect(WallClock.Instant(secondsSinceEpoch: 3, nanoseconds: 5).description == "3.000000005 s since 1970")
    }

    @Test func nowIsAfterThisCodeWasWritten() {
        // 2026-01-01T00:00:00Z; the wall clock may jump, never that far back.
        #expect(WallClock.now > WallClock.Instant(secondsSinceEpoch: 1_767_225_600))
    }

    @Test func nanosecondsOutOfRangeStop() async {
        await #expect(processExitsWith: .failure) {
            _ = WallClock.Instant(secondsSinceEpoch: 0, nanoseconds: 1_000_000_000)
        }
    }
}
