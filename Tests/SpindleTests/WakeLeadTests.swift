@testable import Spindle
import Testing

/// The loop's learned wake lead (`WakeLead`): how early a timed sleep on the
/// wake word ends, so that a timer fires on time whatever this machine's
/// wake-up latency. Fed synthetic overshoots; no clock involved.
@Suite struct WakeLeadTests {
    private func fed(_ overshoots: [Int64], times: Int = 1) -> WakeLead {
        var lead = WakeLead()
        for _ in 0..<times {
            for o in overshoots { lead.learn(overshoot: .nanoseconds(o)) }
        }
        return lead
    }

    @Test func startsAtTheDefault() {
        #expect(WakeLead().nanoseconds == WakeLead.initial)
    }

    /// A virtual CPU that wakes 55 µs late: the lead grows past that, so the
    /// spin, not the wake-up, decides when the timer fires.
    @Test func growsToASlowWakeUp() {
        let lead = fed([55_000], times: 100)
        #expect(lead.nanoseconds >= 55_000)
        #expect(lead.nanoseconds <= 55_000 + WakeLead.margin)
    }

    /// A core that wakes within 5 µs: the lead shrinks toward it, and so
    /// does the CPU every timed wake-up spins.
    @Test func shrinksToAFastWakeUp() {
        let lead = fed([5_000], times: 1_000)
        #expect(lead.nanoseconds < 8_000)
        #expect(lead.nanoseconds >= 5_000)
    }

    /// Bimodal wake-ups, 5 µs nine times in ten and 50 µs once: the lead
    /// covers the slow mode (a high quantile, not the mean).
    @Test func coversTheSlowModeOfABimodalWakeUp() {
        let lead = fed([5_000, 5_000, 5_000, 5_000, 5_000, 5_000, 5_000, 5_000, 5_000, 50_000], times: 200)
        #expect(lead.nanoseconds > 20_000)
        #expect(lead.nanoseconds <= 50_000 + WakeLead.margin)
    }

    /// One sleep preempted for milliseconds moves the lead by at most an
    /// eighth of the maximum, and never past the maximum: a loop never
    /// spins more than `maximum` per timed wake-up.
    @Test func anOutlierMovesItLittleAndTheMaximumHolds() {
        var lead = fed([10_000], times: 500)
        let before = lead.nanoseconds
        lead.learn(overshoot: .milliseconds(5))
        #expect(lead.nanoseconds - before <= WakeLead.maximum / 8 + 1)
        let worst = fed([Int64(10_000_000)], times: 200)
        #expect(worst.nanoseconds == WakeLead.maximum)
    }

    /// A negative overshoot (a clock read racing the wake-up) counts as none.
    @Test func neverBelowTheMinimum() {
        let lead = fed([-1_000, 0], times: 2_000)
        #expect(lead.nanoseconds == WakeLead.minimum)
    }
}
