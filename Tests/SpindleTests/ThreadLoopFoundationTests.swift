import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The members a Foundation `RunLoop` user reaches for.
@Suite("ThreadLoop: what Foundation's RunLoop offers")
struct ThreadLoopFoundationTests {
    /// `currentMode`: nil outside a run, the innermost run's mode inside
    /// one, back to the outer mode when a nested run returns.
    @Test(arguments: availableBackends)
    func currentModeFollowsNestedRuns(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let log = EventLog()
            #expect(loop.currentMode == nil)
            let inner = LoopTimer(after: .zero) { _ in log.append("inner \(loop.currentMode?.name ?? "nil")") }
            loop.add(inner, forMode: "inner")
            let outer = LoopTimer(after: .zero) { _ in
                log.append("outer \(loop.currentMode?.name ?? "nil")")
                _ = loop.run(mode: "inner", timeout: .seconds(5), returnAfterSourceHandled: true)
                log.append("back \(loop.currentMode?.name ?? "nil")")
            }
            loop.add(outer)
            _ = loop.run(mode: .default, timeout: .milliseconds(50))
            #expect(log.all == ["outer default", "inner inner", "back default"])
            #expect(loop.currentMode == nil)
        }
    }

    /// `limitDate(forMode:)` makes one pass (a queued perform runs) and
    /// returns the mode's next fire date, or nil with no timer there.
    @Test(arguments: availableBackends)
    func limitDateMakesOnePassAndReturnsTheNextFireDate(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let log = EventLog()
            let keep = LoopSource { _ in }
            loop.add(keep)
            loop.perform { log.append("perform") }
            #expect(loop.limitDate(forMode: .default) == nil)
            #expect(log.all == ["perform"])
            let date = MonotonicClock.now.advanced(by: .seconds(60))
            let later = LoopTimer(fireAt: date) { _ in }
            let sooner = LoopTimer(fireAt: date.advanced(by: .zero - .seconds(30))) { _ in }
            loop.add(later)
            loop.add(sooner)
            #expect(loop.limitDate(forMode: .default) == date.advanced(by: .zero - .seconds(30)))
            #expect(loop.limitDate(forMode: "elsewhere") == nil)
            later.invalidate()
            sooner.invalidate()
            keep.invalidate()
        }
    }

    /// Runs take deadlines on Swift's clocks too.
    @Test(arguments: availableBackends)
    func runTakesSwiftClockDeadlines(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let log = EventLog()
            let keep = LoopSource { _ in }
            loop.add(keep)
            let start = MonotonicClock.now
            #expect(loop.run(mode: .default, until: ContinuousClock.now + .milliseconds(20)) == .timedOut)
            #expect(start.duration(to: .now) >= .milliseconds(20))
            loop.perform { log.append("perform") }
            loop.run(until: SuspendingClock.now)
            #expect(log.all == ["perform"])
            keep.invalidate()
        }
    }

    /// Loops are `Hashable` by identity.
    @Test func loopsCompareByIdentity() {
        let here = ThreadLoop.current
        let there = Unchecked(LoopBox())
        let join = startThread { there.value.loop = ThreadLoop.current }
        join()
        let other = there.value.loop!
        #expect(here == ThreadLoop.current)
        #expect(here != other)
        #expect(Set([here, other, here]).count == 2)
    }
}

private final class LoopBox: @unchecked Sendable {
    // @unchecked: written by one thread before it is joined, read after.
    var loop: ThreadLoop?
}
