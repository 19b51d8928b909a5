// Timer sources where their calls cannot start (a suspended queue or
// source: the timer is disarmed and counts what it missed), at the edges of
// time (starts before 1970 or near the monotonic clock's `Int64.min`), and
// with a leeway far larger than their interval. On a queue and on a loop;
// the loop's event backend is the one `SPINDLE_EVENT_BACKEND` picks.
#if canImport(Glibc)
import Glibc
#endif
import Spindle
import Testing
import TestSupport

@Suite("EventSource timers")
struct EventSourceTimerTests {
    /// What a suspension test saw: the first call's data and when it ran.
    private typealias FirstCall = (data: UInt64, at: MonotonicClock.Instant)

    /// Due times of the schedule `start + n × interval` at or before `now`.
    private static func dueTimes(from start: MonotonicClock.Instant, every interval: Duration, by now: MonotonicClock.Instant) -> Int64 {
        let (seconds, attoseconds) = interval.components
        let step = seconds * 1_000_000_000 + attoseconds / 1_000_000_000
        let elapsed = now.nanoseconds - start.nanoseconds
        return elapsed < 0 ? 0 : elapsed / step + 1
    }

    /// Waits about `milliseconds` in 1 ms sleeps (no assertion hangs on it).
    private static func pause(milliseconds: Int64) {
        let end = MonotonicClock.now.advanced(by: .milliseconds(milliseconds))
        while MonotonicClock.now < end { usleep(1000) }
    }

    /// A 100 µs timer behind a suspended serial queue for ~300 ms (about
    /// 3,000 periods): its call cannot start, so after its first firing
    /// the timer is disarmed and fires no more (counted with the package
    /// diagnostic `timerFirings`), where it used to be re-armed after every
    /// firing. When the queue resumes, the first call's data counts every
    /// due time up to its start: at least those before the resume, at most
    /// those before the handler read the clock. Then it fires again (re-armed
    /// when the call returned).
    @Test func aTimerBehindASuspendedQueueIsDisarmedAndCountsWhatItMissed() {
        let queue = WorkQueue(label: "timer.suspended-queue")
        queue.suspend()
        Self.checkDisarmedWhileHeld(on: .queue(queue), holding: "the queue", hold: { _ in }, release: { _ in queue.resume() })
    }

    /// The same behind a suspended source, on a queue and on a loop (the
    /// loop's timer is disarmed as the heap's entry is).
    @Test(arguments: HandlerPlaceKind.allCases)
    func aSuspendedTimerSourceIsDisarmedAndCountsWhatItMissed(_ kind: HandlerPlaceKind) throws {
        let place = try HandlerPlace(kind, label: "timer.suspended-source")
        defer { place.close() }
        Self.checkDisarmedWhileHeld(
            on: place.target, holding: "the source", hold: { $0.suspend() }, release: { $0.resume() })
    }

    /// A 100 µs timer on `target`, held back by `hold` (called before the
    /// timer is activated) for 300 ms, then let go by `release`: it fired
    /// at most twice meanwhile, its first call's data counts the periods
    /// that passed, and it is re-armed after that call.
    private static func checkDisarmedWhileHeld(
        on target: EventSource.Target, holding what: String,
        hold: (EventSource) -> Void, release: (EventSource) -> Void
    ) {
        let interval = Duration.microseconds(100)
        let start = MonotonicClock.now
        let timer = EventSource.timer(start: .monotonic(start), interval: interval, on: target)
        let calls = LockedValue<[FirstCall]>([])
        let called = Semaphore(value: 0)
        timer.setEventHandler { s in
            let now = MonotonicClock.now
            calls.withLock { $0.append((s.data, now)) }
            called.signal()
        }
        hold(timer)
        timer.activate()
        pause(milliseconds: 300)
        let firings = timer.timerFirings
        let resumedAt = MonotonicClock.now
        release(timer)
        #expect(called.wait(timeout: .seconds(10)) == .completed, "no call after \(what) resumed")
        #expect(called.wait(timeout: .seconds(10)) == .completed, "the timer was not re-armed after its call")
        timer.cancel()
        let first = calls.withLock { $0.first }
        #expect(firings != nil && firings! <= 2, "fired \(String(describing: firings)) times while \(what) was suspended")
        if let first {
            let atLeast = dueTimes(from: start, every: interval, by: resumedAt)
            let atMost = dueTimes(from: start, every: interval, by: first.at)
            #expect(first.data >= UInt64(atLeast) && first.data <= UInt64(atMost), "first call's data \(first.data), expected \(atLeast)...\(atMost)")
        }
    }

    /// A repeating timer whose handler is slower than its interval: each
    /// call's data counts the periods its predecessor took, and the timer
    /// fires at most about once per call (not once per period).
    @Test(arguments: HandlerPlaceKind.allCases)
    func aTimerWhoseHandlerIsSlowFiresOncePerCall(_ kind: HandlerPlaceKind) throws {
        let place = try HandlerPlace(kind, label: "timer.slow-handler")
        defer { place.close() }
        let timer = EventSource.timer(interval: .microseconds(50), on: place.target)
        let calls = LockedValue<[UInt64]>([])
        let done = Semaphore(value: 0)
        timer.setEventHandler { s in
            usleep(2000)
            if calls.withLock({ $0.append(s.data); return $0.count }) == 10 { done.signal() }
        }
        timer.activate()
        #expect(done.wait(timeout: .seconds(10)) == .completed)
        timer.cancel()
        let firings = timer.timerFirings ?? .max
        let seen = calls.withLock { $0 }
        #expect(firings <= 2 * seen.count + 2, "fired \(firings) times for \(seen.count) calls")
        #expect(seen.dropFirst().allSatisfy { $0 >= 2 }, "the periods of a slow call were not counted: \(seen)")
    }

    // MARK: Huge leeway

    /// A repeating timer whose leeway is far beyond its interval (an hour,
    /// `Int64.max` seconds) fires every period on a queue as on a loop: the
    /// leeway of a repeating timer counts up to half its interval.
    @Test(arguments: HandlerPlaceKind.allCases, [Duration.seconds(3600), .seconds(Int64.max)])
    func aRepeatingTimerWithAHugeLeewayFires(_ kind: HandlerPlaceKind, leeway: Duration) throws {
        let place = try HandlerPlace(kind, label: "timer.huge-leeway")
        defer { place.close() }
        let timer = EventSource.timer(interval: .milliseconds(1), leeway: leeway, on: place.target)
        let calls = LockedValue(0)
        let done = Semaphore(value: 0)
        timer.setEventHandler { _ in if calls.withLock({ $0 += 1; return $0 }) == 5 { done.signal() } }
        timer.activate()
        #expect(done.wait(timeout: .seconds(10)) == .completed, "\(calls.withLock { $0 }) calls of a 1 ms timer with leeway \(leeway)")
        timer.cancel()
    }

    // MARK: The edges of time

    /// A wall-clock timer that started before 1970 with a sub-second part
    /// fires at once, its data counting the periods since its start; a
    /// one-shot one fires once.
    @Test(arguments: HandlerPlaceKind.allCases)
    func aWallClockTimerThatStartedBefore1970Fires(_ kind: HandlerPlaceKind) throws {
        let place = try HandlerPlace(kind, label: "timer.before-1970")
        defer { place.close() }
        let start = WallClock.Instant(secondsSinceEpoch: -1, nanoseconds: 5)
        let interval = Duration.seconds(3600)
        let seen = LockedValue<[UInt64]>([])
        let called = Semaphore(value: 0)
        let before = WallClock.now
        let repeating = EventSource.timer(start: .wall(start), interval: interval, on: place.target)
        repeating.setEventHandler { s in seen.withLock { $0.append(s.data) }; called.signal() }
        repeating.activate()
        #expect(called.wait(timeout: .seconds(10)) == .completed)
        let after = WallClock.now
        repeating.cancel()
        let hours = { (at: WallClock.Instant) in UInt64(start.duration(to: at).components.seconds / 3600 + 1) }
        if let data = seen.withLock({ $0.first }) {
            #expect(data >= hours(before) && data <= hours(after), "data \(data), expected \(hours(before))...\(hours(after))")
        }
        let once = EventSource.timer(start: .wall(start), interval: nil, on: place.target)
        once.setEventHandler { s in seen.withLock { $0.append(s.data) }; called.signal() }
        once.activate()
        #expect(called.wait(timeout: .seconds(10)) == .completed)
        once.cancel()
        #expect(seen.withLock { $0.count == 2 && $0[1] == 1 })
    }

    /// A monotonic timer that starts near `Int64.min` nanoseconds (long
    /// before the clock's start) fires at once, its data counting the
    /// periods since then; a one-shot fires once.
    @Test(arguments: HandlerPlaceKind.allCases)
    func aMonotonicTimerThatStartsNearInt64MinFires(_ kind: HandlerPlaceKind) throws {
        let place = try HandlerPlace(kind, label: "timer.int64-min")
        defer { place.close() }
        let start = MonotonicClock.Instant(nanoseconds: .min + 5)
        let seen = LockedValue<[UInt64]>([])
        let called = Semaphore(value: 0)
        let before = MonotonicClock.now
        let repeating = EventSource.timer(start: .monotonic(start), interval: .seconds(1), on: place.target)
        repeating.setEventHandler { s in seen.withLock { $0.append(s.data) }; called.signal() }
        repeating.activate()
        #expect(called.wait(timeout: .seconds(10)) == .completed)
        let after = MonotonicClock.now
        repeating.cancel()
        // Seconds from `start` to `at`, past `Int64.max` nanoseconds: in Int128.
        let periods = { (at: MonotonicClock.Instant) in
            UInt64((Int128(at.nanoseconds) - Int128(start.nanoseconds)) / 1_000_000_000 + 1)
        }
        if let data = seen.withLock({ $0.first }) {
            #expect(data >= periods(before) && data <= periods(after), "data \(data), expected \(periods(before))...\(periods(after))")
        }
        let once = EventSource.timer(start: .monotonic(start), interval: nil, on: place.target)
        once.setEventHandler { s in seen.withLock { $0.append(s.data) }; called.signal() }
        once.activate()
        #expect(called.wait(timeout: .seconds(10)) == .completed)
        once.cancel()
        #expect(seen.withLock { $0.count == 2 && $0[1] == 1 })
    }

    /// A wall-clock start further from 1970 than `Int64` nanoseconds reach
    /// (before 1677) is refused at creation, naming the caller's `start`.
    @Test func aWallClockStartBefore1677IsRefusedNamingTheStart() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let start = WallClock.Instant(secondsSinceEpoch: -10_000_000_000, nanoseconds: 5)
            _ = EventSource.timer(start: .wall(start), interval: .seconds(1), on: .queue(WorkQueue(label: "timer.refused")))
        }
        let text = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(text.contains("EventSource.timer: `start` is -10000000000.000000005 s since 1970"), "\(text)")
    }
}
