// Wall-clock timer sources when the system time is set: they follow the
// change at once. These tests step the machine's real-time clock, which
// every other program on the machine sees jump, so they run only when
// asked: SPINDLE_TEST_STEP_CLOCK=1 in the environment (`scripts/test`
// passes it on; off by default, and off in CI). Setting the clock needs
// CAP_SYS_TIME; where it is refused (EPERM) the tests are cancelled with
// that reason. The clock is moved by
// 3 s at most and moved back by the same step before each test ends, so the
// machine's time is off by microseconds (what passes between reading and
// setting it) afterwards. Serialized: two tests must not move it at once.
// The clock is the machine's: other tests that compare wall-clock readings
// (in this process or another) can see the step while one of these runs.
#if canImport(Glibc)
import Glibc
#endif
import Spindle
import Testing
import TestSupport

/// Steps `CLOCK_REALTIME` by `delta` from its current reading. Returns 0, or
/// the errno of `clock_settime`.
private func stepWallClock(by delta: Duration) -> Int32 {
    let target = WallClock.now + delta
    var time = timespec(tv_sec: Int(target.secondsSinceEpoch), tv_nsec: Int(target.nanoseconds))
    return clock_settime(CLOCK_REALTIME, &time) == 0 ? 0 : errno
}

private let clockRefusal = "setting CLOCK_REALTIME was refused (EPERM): the test needs CAP_SYS_TIME"

/// A timer source that records each call: when (wall clock) and its data.
private final class RecordedTimer: Sendable {
    let source: EventSource
    let calls = LockedValue<[(at: WallClock.Instant, data: UInt64)]>([])
    let called = Semaphore(value: 0)

    init(start: WallClock.Instant, interval: Duration? = nil, on target: EventSource.Target) {
        source = EventSource.timer(start: .wall(start), interval: interval, on: target)
        source.setEventHandler { [calls, called] s in
            calls.withLock { $0.append((WallClock.now, s.data)) }
            called.signal()
        }
        source.activate()
    }

    var recorded: [(at: WallClock.Instant, data: UInt64)] { calls.withLock { $0 } }
}

/// Whether the environment asks for the tests that step the machine's clock.
private let clockStepsRequested: Bool = getenv("SPINDLE_TEST_STEP_CLOCK").map { String(cString: $0) == "1" } ?? false

@Suite(
    "EventSource: setting the wall clock", .serialized,
    .enabled(if: clockStepsRequested, "steps the machine's real-time clock: set SPINDLE_TEST_STEP_CLOCK=1 to run"))
struct EventSourceClockChangeTests {
    /// The clock set 3 s forward, past the due times: a one-shot due 2.5 s
    /// from now fires at once (well within 1.5 s, not 2.5 s later), with
    /// data 1; a repeating timer (first due 0.9 s from now, every second)
    /// fires at once with data 3 for the three due times passed.
    @Test(arguments: HandlerPlaceKind.allCases)
    func clockSetPastTheDueTimeFiresAtOnce(_ kind: HandlerPlaceKind) throws {
        let place = try HandlerPlace(kind, label: "clock.forward")
        defer { place.close() }
        let start = WallClock.now
        let oneShot = RecordedTimer(start: start + .milliseconds(2500), on: place.target)
        let repeating = RecordedTimer(start: start + .milliseconds(900), interval: .seconds(1), on: place.target)
        defer {
            oneShot.source.cancel()
            repeating.source.cancel()
        }
        let rc = stepWallClock(by: .seconds(3))
        if rc == EPERM { try Test.cancel(Comment(rawValue: clockRefusal)) }
        try #require(rc == 0, "\(SystemCallError(call: "clock_settime", code: rc))")
        defer { #expect(stepWallClock(by: .seconds(-3)) == 0, "the clock was not set back") }
        // A VM that stalls this thread past the first due time before the
        // step leaves the repeating timer's calls split; then only their
        // total is checked.
        let steppedInTime = WallClock.now < start + .milliseconds(3800)

        #expect(oneShot.called.wait(timeout: .milliseconds(1500)) == .completed, "the one-shot did not fire at once")
        #expect(repeating.called.wait(timeout: .milliseconds(1500)) == .completed, "the repeating timer did not fire at once")
        let shot = oneShot.recorded
        #expect(shot.count == 1 && shot[0].data == 1, "\(shot)")
        #expect(shot.allSatisfy { $0.at >= start + .milliseconds(2500) }, "early: \(shot)")
        let ticks = repeating.recorded
        if steppedInTime {
            #expect(ticks.first?.data == 3, "the periods passed were not counted: \(ticks)")
        } else {
            #expect(ticks.reduce(0) { $0 + $1.data } >= 3, "the periods passed were not counted: \(ticks)")
        }
        #expect(ticks.allSatisfy { $0.at >= start + .milliseconds(900) }, "early: \(ticks)")
    }

    /// The clock set 3 s back: a one-shot due 1 s from now is now 4 s away
    /// on the wall clock, and does not fire within 1.5 s (never early). Set
    /// forward again, its due time has passed, and it fires at once.
    @Test(arguments: HandlerPlaceKind.allCases)
    func clockSetBackDelaysTheTimer(_ kind: HandlerPlaceKind) throws {
        let place = try HandlerPlace(kind, label: "clock.back")
        defer { place.close() }
        let due = WallClock.now + .seconds(1)
        let timer = RecordedTimer(start: due, on: place.target)
        defer { timer.source.cancel() }
        let rc = stepWallClock(by: .seconds(-3))
        if rc == EPERM { try Test.cancel(Comment(rawValue: clockRefusal)) }
        try #require(rc == 0, "\(SystemCallError(call: "clock_settime", code: rc))")
        var restored = false
        defer { if !restored { #expect(stepWallClock(by: .seconds(3)) == 0, "the clock was not set forward again") } }

        #expect(timer.called.wait(timeout: .milliseconds(1500)) == .timedOut, "fired before its wall-clock due time: \(timer.recorded)")
        restored = stepWallClock(by: .seconds(3)) == 0
        try #require(restored, "the clock was not set forward again")
        #expect(timer.called.wait(timeout: .seconds(1)) == .completed, "did not fire at once once the clock passed its due time")
        let calls = timer.recorded
        #expect(calls.count == 1 && calls[0].data == 1 && calls[0].at >= due, "\(calls)")
    }

    /// After `fork()` the child's first wall-clock timer makes a timerfd of
    /// its own (the parent's is shared with it), and a setting of the clock
    /// reaches both processes: the child sets it 3 s forward (and back), and
    /// a timer due 2.5 s from now, one in each, fires well before its
    /// monotonic translation would have come. In an exit test, so the test
    /// runner is not forked.
    @Test func clockChangeReachesTheParentAndTheForkedChild() async throws {
        let result = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            exit(clockChangeAcrossFork())
        }
        let text = String(decoding: result?.standardOutputContent ?? [], as: UTF8.self)
        if text.contains("SKIP") { try Test.cancel(Comment(rawValue: clockRefusal)) }
    }

}

/// `clockChangeReachesTheParentAndTheForkedChild` in its own process: 0,
/// or the failed check (8: the child was stuck and killed; 9: no pipe;
/// 10 + the child's).
private func clockChangeAcrossFork() -> Int32 {
    armHangAlarm(seconds: 30)
    let madeAt = MonotonicClock.now
    let parent = RecordedTimer(start: WallClock.now + .milliseconds(2500), on: .queue(WorkQueue(label: "clock.parent")))
    // Let the threads that timer started (the reactor, a pool worker) get
    // past their first steps before forking: a thread that holds one of the
    // Swift runtime's locks (a first metadata or conformance lookup) at the
    // fork leaves it held forever in the child, whose next lookup of that
    // kind then waits for good. Forking a multithreaded Swift process is
    // only as safe as that; this test is about the clock, not that hazard.
    _ = NativeThread.sleep(for: .milliseconds(200))
    // The child keeps the clock set forward until the parent's timer has
    // fired (a byte on this pipe) or 2 s pass: set back at once, the clock
    // could be back before the parent's reactor looked at it.
    var gate: [Int32] = [0, 0]
    guard pipe(&gate) == 0 else { return 9 }
    let child = fork()
    if child == 0 {
        armHangAlarm(seconds: 30)
        close(gate[1])
        let mineAt = MonotonicClock.now
        let mine = RecordedTimer(start: WallClock.now + .milliseconds(2500), on: .queue(WorkQueue(label: "clock.child")))
        let rc = stepWallClock(by: .seconds(3))
        if rc == EPERM { _exit(77) }
        guard rc == 0 else { _exit(2) }
        let fired = mine.called.wait(timeout: .milliseconds(1500)) == .completed
        let inTime = fired && MonotonicClock.now < mineAt.advanced(by: .milliseconds(2500))
        var parentDone = pollfd(fd: gate[0], events: Int16(POLLIN), revents: 0)
        _ = poll(&parentDone, 1, 2000)
        guard stepWallClock(by: .seconds(-3)) == 0 else { _exit(3) }
        guard inTime else { _exit(4) }
        _exit(0)
    }
    close(gate[0])
    guard child > 0 else { return 5 }
    let parentInTime = parent.called.wait(timeout: .seconds(2)) == .completed
        && MonotonicClock.now < madeAt.advanced(by: .milliseconds(2500))
    var byte: UInt8 = 1
    _ = write(gate[1], &byte, 1)
    close(gate[1])
    // Bounded: a child stuck for good (see above) is killed, so that it does
    // not keep the test runner's output pipe open.
    var status: Int32 = 0
    let giveUp = MonotonicClock.now.advanced(by: .seconds(10))
    while waitpid(child, &status, WNOHANG) == 0 {
        if MonotonicClock.now >= giveUp {
            kill(child, SIGKILL)
            _ = waitpid(child, &status, 0)
            return 8
        }
        _ = NativeThread.sleep(for: .milliseconds(10))
    }
    let code = status & 0x7f == 0 ? (status >> 8) & 0xff : 128 + status & 0x7f
    if code == 77 {
        print("SKIP")
        return 0
    }
    guard code == 0 else { return 10 + code }
    guard parentInTime else { return 7 }
    parent.source.cancel()
    return 0
}
