import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

@Suite("ThreadLoop: timers")
struct ThreadLoopTimerTests {
    /// A repeating timer keeps to its schedule: each next date is the first
    /// date plus a whole number of intervals, whatever the firing delays.
    @Test(arguments: availableBackends)
    func repeatingTimerKeepsToItsSchedule(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let start = MonotonicClock.now.advanced(by: .milliseconds(5))
            let interval = Duration.milliseconds(4)
            let step = interval.components.attoseconds / 1_000_000_000 + interval.components.seconds * 1_000_000_000
            let firings = LockedValue<[MonotonicClock.Instant]>([])
            let timer = LoopTimer(fireAt: start, interval: interval) { t in
                let count = firings.withLock { $0.append(t.fireDate); return $0.count }
                if count == 5 { t.invalidate() }
            }
            loop.add(timer, forMode: .default)
            while timer.isValid { loop.run(mode: .default, timeout: .milliseconds(50)) }
            let fireDates = firings.withLock { $0 }
            #expect(fireDates.count == 5)
            for d in fireDates {
                #expect((d.nanoseconds - start.nanoseconds) % step == 0, "next date off the schedule")
            }
            #expect(zip(fireDates, fireDates.dropFirst()).allSatisfy { $0 < $1 })
        }
    }

    /// Late by several periods: one firing for all of them, then back on
    /// schedule.
    @Test(arguments: availableBackends)
    func missedPeriodsFireOnce(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let start = MonotonicClock.now
            let interval = Duration.milliseconds(10)
            let fired = LockedValue(0)
            let timer = LoopTimer(fireAt: start, interval: interval) { _ in fired.withLock { $0 += 1 } }
            loop.add(timer, forMode: .default)
            usleep(45_000)  // at least 4.5 periods pass with the loop not running
            let before = MonotonicClock.now
            loop.run(mode: .default, timeout: .zero)
            let after = MonotonicClock.now
            #expect(fired.withLock { $0 } == 1, "missed periods collapse into one firing")
            // Next date: the first scheduled date after the firing (start + 5
            // intervals if the sleep took 45 ms; a loaded machine oversleeps).
            let next = timer.fireDate.nanoseconds - start.nanoseconds
            #expect(next % 10_000_000 == 0, "next date off the schedule")
            #expect(next >= 50_000_000)
            #expect(start.nanoseconds + next > before.nanoseconds, "next date not after the firing")
            #expect(start.nanoseconds + next - 10_000_000 <= after.nanoseconds, "a whole period skipped")
            timer.invalidate()
        }
    }

    @Test(arguments: availableBackends)
    func timerFiresOnlyInItsModes(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let fired = LockedValue(0)
            let other: LoopMode = "other"
            let timer = LoopTimer(after: .zero) { _ in fired.withLock { $0 += 1 } }
            loop.add(timer, forMode: other)
            let keep = LoopSource { _ in }
            loop.add(keep)
            loop.run(mode: .default, timeout: .milliseconds(5))
            #expect(fired.withLock { $0 } == 0)
            loop.run(mode: other, timeout: .zero)
            #expect(fired.withLock { $0 } == 1)
            #expect(!timer.isValid, "a one-shot is done after firing")
            keep.invalidate()
        }
    }

    @Test(arguments: availableBackends)
    func invalidateFromAnotherThread(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let fired = LockedValue(0)
            let timer = LoopTimer(after: .milliseconds(50)) { _ in fired.withLock { $0 += 1 } }
            loop.add(timer, forMode: .default)
            let box = Unchecked(timer)
            let join = startThread { box.value.invalidate() }
            join()
            #expect(loop.run(mode: .default, timeout: .milliseconds(100)) == .finished, "nothing left once invalidated")
            #expect(fired.withLock { $0 } == 0)
        }
    }

    @Test(arguments: availableBackends)
    func toleranceStillFiresNoEarlier(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let due = MonotonicClock.now.advanced(by: .milliseconds(10))
            let firedAt = LockedValue<MonotonicClock.Instant?>(nil)
            let timer = LoopTimer(fireAt: due, tolerance: .milliseconds(5)) { _ in firedAt.withLock { $0 = .now } }
            loop.add(timer, forMode: .default)
            while timer.isValid { loop.run(mode: .default, timeout: .milliseconds(100)) }
            #expect(firedAt.withLock { $0 }! >= due)
        }
    }
}



@Suite("ThreadLoop: performs")
struct ThreadLoopPerformTests {
    /// Foundation's `RunLoop.perform` does not wake a sleeping loop; ours must.
    @Test(arguments: availableBackends)
    func performWakesASleepingLoop(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let keep = LoopSource { _ in }
            loop.add(keep)
            let log = EventLog()
            let target = Unchecked(loop)
            let join = startThread {
                usleep(20_000)
                target.value.perform { log.append("performed"); target.value.stop() }
            }
            let start = MonotonicClock.now
            #expect(loop.run(mode: .default, timeout: .seconds(30)) == .stopped)
            #expect(start.duration(to: .now) < .seconds(20), "the perform woke the loop")
            join()
            #expect(log.all == ["performed"])
            keep.invalidate()
        }
    }

    /// A perform is a source: a run asked to return after a source returns
    /// after running one (regression: it used to sleep until its timeout).
    @Test(arguments: availableBackends)
    func performCountsAsAHandledSource(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let keep = LoopSource { _ in }
            loop.add(keep)
            let target = Unchecked(loop)
            let join = startThread {
                usleep(10_000)
                target.value.perform {}
            }
            let start = MonotonicClock.now
            #expect(loop.run(mode: .default, timeout: .seconds(30), returnAfterSourceHandled: true) == .handledSource)
            #expect(start.duration(to: .now) < .seconds(20))
            join()
            keep.invalidate()
        }
    }

    @Test(arguments: availableBackends)
    func performWaitUntilDoneAndModes(kind: EventBackendKind) {
        let log = EventLog()
        let loopReady = EventLog()
        let box = UnsafeMutablePointer<Unchecked<ThreadLoop>?>.allocate(capacity: 1)
        box.initialize(to: nil)
        defer { box.deallocate() }
        let boxed = SharedPointer(box)
        let stopFlag = Lock()
        let worker = startThread {
            let loop = try! ThreadLoop.current(backend: kind)
            stopFlag.withLock { boxed.pointer.pointee = Unchecked(loop) }
            loopReady.append("ready")
            let keep = LoopSource { _ in }
            loop.add(keep)
            loop.add(keep, forMode: "special")
            while loop.run(mode: .default, timeout: .seconds(30)) != .stopped {}
            // The "special"-mode perform is still waiting for its mode.
            loop.run(mode: "special", timeout: .zero)
            keep.invalidate()
        }
        while loopReady.all.isEmpty { usleep(1_000) }
        let loop = stopFlag.withLock { boxed.pointer.pointee! }.value
        #expect(loop.perform(inModes: ["special"]) { log.append("special") })
        #expect(loop.perform(waitUntilDone: true) { log.append("waited") })
        #expect(log.all == ["waited"], "done before perform returned; the special one is held")
        loop.perform { log.append("then stop"); loop.stop() }
        worker()
        #expect(log.all == ["waited", "then stop", "special"])
    }

    @Test(arguments: availableBackends)
    func performOnOwnThreadWithWaitRunsAtOnce(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let ran = LockedValue(false)
            #expect(loop.perform(waitUntilDone: true) { ran.withLock { $0 = true } })
            #expect(ran.withLock { $0 })
        }
    }

    @Test(arguments: availableBackends)
    func delayedPerformAndCancel(kind: EventBackendKind) {
        final class Target {}
        onLoopThread(kind) { loop in
            let target = Target()
            let log = EventLog()
            loop.perform(afterDelay: .milliseconds(5), target: target) { log.append("cancelled one") }
            loop.perform(afterDelay: .milliseconds(5)) { log.append("kept") }
            loop.cancelPreviousPerformRequests(target: target)
            while loop.run(mode: .default, timeout: .milliseconds(100)) != .finished {}
            #expect(log.all == ["kept"])
        }
    }

    /// Listing 2-3's pattern: a long job that polls its loop with a zero
    /// timeout to learn whether it should exit.
    @Test(arguments: availableBackends)
    func longJobPollsItsLoop(kind: EventBackendKind) {
        let started = EventLog()
        let box = UnsafeMutablePointer<Unchecked<ThreadLoop>?>.allocate(capacity: 1)
        box.initialize(to: nil)
        defer { box.deallocate() }
        let boxed = SharedPointer(box)
        let guardLock = Lock()
        let steps = EventLog()
        let flag = AtomicFlag()
        let worker = startThread {
            let loop = try! ThreadLoop.current(backend: kind)
            var exitNow = false
            let exitSource = LoopSource { _ in }  // keeps the mode non-empty
            loop.add(exitSource)
            guardLock.withLock { boxed.pointer.pointee = Unchecked(loop) }
            started.append("go")
            var work = 0
            while !exitNow && work < 1_000_000 {
                work += 1  // a chunk of the long job
                if work % 100 == 0 { steps.append("chunk") }
                loop.run(mode: .default, timeout: .zero)
                exitNow = exitNow || flag.isSet
            }
            exitSource.invalidate()
        }
        while started.all.isEmpty { usleep(1_000) }
        let loop = guardLock.withLock { boxed.pointer.pointee! }.value
        usleep(5_000)
        loop.perform { flag.set() }
        worker()
        #expect(flag.isSet)
        #expect(steps.all.count < 10_000, "the job stopped when asked, not at the end of its work")
    }
}

/// A flag for the Listing 2-3 test (set by a perform on the worker's thread).
final class AtomicFlag: @unchecked Sendable {
    // @unchecked: the word is only accessed atomically.
    private let word = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)
    init() { word.initialize(to: 0) }
    var isSet: Bool { AtomicMemory.load(from: word, ordering: .acquiring) != 0 }
    func set() { AtomicMemory.store(1, to: word, ordering: .releasing) }
}

@Suite("ThreadLoop misuse")
struct ThreadLoopMisuseTests {
    private func stderr(_ r: ExitTest.Result?) -> String {
        String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
    }

    @Test func runningAnotherThreadsLoop() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let box = UnsafeMutablePointer<ThreadLoop?>.allocate(capacity: 1)
            box.initialize(to: nil)
            let b = SharedPointer(box)
            let join = startThread { b.pointer.pointee = ThreadLoop.current }
            join()
            blocking { box.pointee!.run(mode: .default, timeout: .zero) }
        }
        #expect(stderr(r).contains("ThreadLoop.run: called on thread"))
        #expect(stderr(r).contains("only its own thread runs a loop"))
    }

    /// A delayed perform's block is not `Sendable`: firing its timer from
    /// another thread stops with a message.
    @Test func firingADelayedPerformElsewhere() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let loop = ThreadLoop.current
            let timer = loop.perform(afterDelay: .seconds(60)) {}
            let box = Unchecked(timer)
            let join = startThread { box.value.fire() }
            join()
        }
        #expect(stderr(r).contains("LoopTimer.fire(): this timer runs a delayed perform"))
    }

    @Test func negativeTimerInterval() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = LoopTimer(after: .zero, interval: .milliseconds(-1)) { _ in }
        }
        #expect(stderr(r).contains("LoopTimer.init: `interval` is"))
    }

    @Test func timerAddedToASecondLoop() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let timer = LoopTimer(after: .seconds(1)) { _ in }
            let t = Unchecked(timer)
            let join = startThread { ThreadLoop.current.add(t.value, forMode: .default) }
            join()
            let join2 = startThread { ThreadLoop.current.add(t.value, forMode: .default) }
            join2()
        }
        #expect(stderr(r).contains("this LoopTimer already belongs to another loop"))
    }

    @Test func negativeRunTimeout() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let join = startThread { ThreadLoop.current.run(mode: .default, timeout: .seconds(-1)) }
            join()
        }
        #expect(stderr(r).contains("`timeout` is"))
    }
}

