import CShims
import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The main thread's timer slack in nanoseconds (/proc/<pid>/timerslack_ns
/// is the thread group leader's), or -1.
private func mainThreadTimerSlack() -> Int {
    procFileText("/proc/self/timerslack_ns")?.split(whereSeparator: \.isWhitespace).first.flatMap { Int($0) } ?? -1
}

@Suite("ThreadLoop: adding and removing")
struct ThreadLoopMembershipTests {
    /// Another thread adds a source and a timer to a running loop, which
    /// wakes and fires both; it then removes them, and the loop, woken
    /// again, finds its mode empty and returns `.finished`.
    @Test(arguments: availableBackends)
    func addAndRemoveFromAnotherThreadWhileTheLoopRuns(kind: EventBackendKind) {
        let log = EventLog()
        let running = RunningLoop(kind) { $0.run(mode: .default, timeout: .seconds(30)) }
        let loop = running.loop!
        #expect(!loop.isCurrent)
        let performed = Latch()
        let source = LoopSource(
            schedule: { _, mode in log.append("schedule \(mode)") },
            cancel: { _, mode in log.append("cancel \(mode)") }
        ) { _ in
            log.append("perform on the loop thread: \(loop.isCurrent)")
            performed.countDown()
        }
        loop.add(source, forMode: .default)
        source.signal()
        #expect(performed.wait(seconds: 10))
        let fired = Latch()
        let timer = LoopTimer(after: .milliseconds(1)) { _ in
            log.append("timer on the loop thread: \(loop.isCurrent)")
            fired.countDown()
        }
        loop.add(timer, forMode: .default)
        #expect(fired.wait(seconds: 10))
        loop.remove(source, forMode: .default)
        #expect(!loop.contains(source, inMode: .default))
        loop.remove(running.keep, forMode: .default)
        let result = running.join()
        #expect(result == .finished)
        #expect(log.all == [
            "schedule default", "perform on the loop thread: true", "timer on the loop thread: true", "cancel default",
        ])
    }

    /// A source in two modes of one loop and in a second loop: removing it
    /// from one mode leaves it in the other, still reachable by `signal()`
    /// (which must wake the loop sleeping in that mode); the second loop
    /// performs it too; invalidation cancels it where it is left.
    @Test(arguments: availableBackends)
    func sourceInSeveralModesAndLoops(kind: EventBackendKind) {
        onLoopThread(kind) { a in
            let other: LoopMode = "other"
            let log = EventLog()
            @Sendable func name(_ loop: ThreadLoop) -> String { loop === a ? "A" : "B" }
            let source = LoopSource(
                schedule: { loop, mode in log.append("schedule \(name(loop)) \(mode)") },
                cancel: { loop, mode in log.append("cancel \(name(loop)) \(mode)") }
            ) { _ in log.append("perform \(name(ThreadLoop.current))") }
            a.add(source, forMode: .default)
            a.add(source, forMode: other)
            a.add(source, forMode: other)  // again: a no-op

            // B adds it to its own default mode and sleeps until signalled.
            let ready = Latch()
            let b = EventLog()
            let joinB = startThread {
                let loop = try! ThreadLoop.current(backend: kind)
                loop.add(source, forMode: .default)
                ready.countDown()
                b.append("\(loop.run(mode: .default, timeout: .seconds(10), returnAfterSourceHandled: true))")
                loop.remove(source, forMode: .default)
            }
            #expect(ready.wait())
            source.signal()
            joinB()
            #expect(b.all == ["handledSource"])

            a.remove(source, forMode: .default)
            #expect(!a.contains(source, inMode: .default))
            #expect(a.contains(source, inMode: other))
            let joinSignal = startThread {
                usleep(20_000)
                source.signal()
            }
            #expect(a.run(mode: other, timeout: .seconds(10), returnAfterSourceHandled: true) == .handledSource)
            joinSignal()
            source.invalidate()
            #expect(!a.contains(source, inMode: other))
            #expect(a.run(mode: other, timeout: .zero) == .finished)
            #expect(log.all == [
                "schedule A default", "schedule A other", "schedule B default", "perform B", "cancel B default",
                "cancel A default", "perform A", "cancel A other",
            ])
        }
    }

    /// A loop with more modes than it scans by name (it then looks them up
    /// by hash) keeps each mode's items apart.
    @Test(arguments: availableBackends)
    func manyModesKeepTheirItemsApart(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let modes = (0..<10).map { LoopMode("mode \($0)") }
            let cancelled = EventLog()
            let performed = LockedValue(0)
            let source = LoopSource(cancel: { _, mode in cancelled.append("\(mode)") }) { _ in performed.withLock { $0 += 1 } }
            for m in modes { loop.add(source, forMode: m) }
            loop.remove(source, forMode: modes[3])
            for (i, m) in modes.enumerated() { #expect(loop.contains(source, inMode: m) == (i != 3)) }
            #expect(!loop.contains(source, inMode: .default))
            source.signal()
            #expect(loop.run(mode: modes[3], timeout: .zero) == .finished)
            #expect(loop.run(mode: modes[9], timeout: .zero, returnAfterSourceHandled: true) == .handledSource)
            #expect(performed.withLock { $0 } == 1)
            source.invalidate()
            #expect(Set(cancelled.all) == Set(modes.map(\.name)))
            #expect(cancelled.all.count == 10)
        }
    }

    /// A descriptor source in two modes stays watched while either holds it.
    @Test(arguments: availableBackends)
    func descriptorSourceWatchedWhileAnyModeHoldsIt(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            withPipe { readEnd, writeEnd in
                let other: LoopMode = "other"
                let reads = LockedValue(0)
                let source = LoopSource(descriptor: readEnd) { _, _ in
                    var byte: UInt8 = 0
                    _ = read(readEnd, &byte, 1)
                    reads.withLock { $0 += 1 }
                }
                loop.add(source, forMode: .default)
                loop.add(source, forMode: other)
                loop.remove(source, forMode: .default)
                var byte: UInt8 = 1
                _ = write(writeEnd, &byte, 1)
                #expect(loop.run(mode: other, timeout: .seconds(10), returnAfterSourceHandled: true) == .handledSource)
                #expect(reads.withLock { $0 } == 1)
                // Back in both, out of both: no longer watched, nothing left.
                loop.add(source, forMode: .default)
                loop.remove(source, forMode: .common)
                loop.remove(source, forMode: other)
                _ = write(writeEnd, &byte, 1)
                #expect(loop.run(mode: other, timeout: .zero) == .finished)
                #expect(reads.withLock { $0 } == 1)
            }
        }
    }

    /// A repeating timer added to `.common` fires in every common mode,
    /// including one added to the set afterwards; once invalidated, no mode
    /// has anything left.
    @Test(arguments: availableBackends)
    func timerInCommonModesThenInvalidated(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let tracking: LoopMode = "tracking"
            let fired = LockedValue<[String]>([])
            let timer = LoopTimer(after: .zero, interval: .milliseconds(1)) { _ in
                fired.withLock { $0.append("fired") }
            }
            loop.add(timer, forMode: .common)
            loop.addCommonMode(tracking)
            loop.run(mode: tracking, timeout: .milliseconds(20))
            let inTracking = fired.withLock { $0.count }
            #expect(inTracking >= 1)
            loop.run(mode: .default, timeout: .milliseconds(20))
            #expect(fired.withLock { $0.count } > inTracking)
            timer.invalidate()
            #expect(!timer.isValid)
            #expect(loop.run(mode: .default, timeout: .milliseconds(20)) == .finished)
            #expect(loop.run(mode: tracking, timeout: .milliseconds(20)) == .finished)
            // An invalidated timer cannot come back.
            loop.add(timer, forMode: .common)
            #expect(loop.run(mode: .default, timeout: .zero) == .finished)
        }
    }

    /// A timer removed from one mode (not invalidated) stays in the other.
    @Test(arguments: availableBackends)
    func timerRemovedFromOneModeStaysInTheOther(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let other: LoopMode = "other"
            let fired = LockedValue(0)
            let timer = LoopTimer(after: .zero) { _ in fired.withLock { $0 += 1 } }
            loop.add(timer, forMode: .default)
            loop.add(timer, forMode: other)
            loop.remove(timer, forMode: .default)
            #expect(loop.run(mode: .default, timeout: .zero) == .finished)
            #expect(fired.withLock { $0 } == 0)
            loop.run(mode: other, timeout: .zero)
            #expect(fired.withLock { $0 } == 1)
        }
    }

    /// A mode that is not common leaves the loop when its last source, timer
    /// or observer does (removed, invalidated, or a one-shot timer fired), so
    /// that a loop that runs many short-lived modes does not accumulate them.
    /// Common modes stay.
    @Test(arguments: availableBackends)
    func emptiedModesLeaveTheLoop(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            let source = LoopSource { _ in }
            let timer = LoopTimer(after: .seconds(3600)) { _ in }
            let observer = LoopObserver(activities: .entry) { _, _ in }
            let transient = (0..<20).map { LoopMode("transient \($0)") }
            for mode in transient {
                loop.add(source, forMode: mode)
                loop.add(timer, forMode: mode)
                loop.add(observer, forMode: mode)
            }
            #expect(loop.allModes == Set(transient).union([.default]))
            for mode in transient {
                loop.remove(source, forMode: mode)
                loop.remove(observer, forMode: mode)
                #expect(loop.allModes.contains(mode))
                loop.remove(timer, forMode: mode)
                #expect(!loop.allModes.contains(mode))
            }
            #expect(loop.allModes == [.default])

            // Invalidation and firing empty a mode too.
            let doomed = LoopTimer(after: .seconds(3600)) { _ in }
            loop.add(doomed, forMode: "invalidated")
            doomed.invalidate()
            let fired = UnsafeBox(0)
            loop.add(LoopTimer(after: .zero) { _ in fired.value += 1 }, forMode: "one-shot")
            #expect(loop.run(mode: "one-shot", timeout: .seconds(10), returnAfterSourceHandled: false) == .finished)
            #expect(fired.value == 1)
            // An invalidated observer goes at the next pass that notifies.
            let watcher = LoopObserver(activities: .entry) { _, _ in }
            loop.add(watcher, forMode: "observed")
            loop.add(source, forMode: "observed")
            watcher.invalidate()
            _ = loop.run(mode: "observed", timeout: .zero)
            loop.remove(source, forMode: "observed")
            #expect(loop.allModes == [.default])

            // A common mode stays when emptied, and keeps getting `.common` items.
            loop.addCommonMode("tracking")
            loop.add(source, forMode: "tracking")
            loop.remove(source, forMode: "tracking")
            #expect(loop.allModes == [.default, "tracking"])
            loop.add(source, forMode: .common)
            #expect(loop.contains(source, inMode: "tracking"))
            loop.remove(source, forMode: .common)
        }
    }

    /// When a loop's thread exits, its timers are invalidated and its
    /// observers leave every mode, so that a dead loop that something still
    /// holds keeps neither (nor what their handlers capture) alive. Adding a
    /// timer to the dead loop invalidates it; adding an observer is a no-op.
    @Test func exitingThreadLetsGoOfItsLoopsTimersAndObservers() {
        final class Tracker: @unchecked Sendable {
            let released: UnsafeBox<Bool>
            init(_ released: UnsafeBox<Bool>) { self.released = released }
            deinit { released.value = true }
        }
        let observerReleased = UnsafeBox(false)
        let timerReleased = UnsafeBox(false)
        let kept = LoopTimer(after: .seconds(3600), interval: .seconds(1)) { _ in }
        let dead = UnsafeBox<ThreadLoop?>(nil)
        let exit = startThread {
            let loop = ThreadLoop.current
            let observerTracker = Tracker(observerReleased)
            let timerTracker = Tracker(timerReleased)
            loop.add(LoopObserver(activities: .entry) { _, _ in _ = observerTracker }, forMode: .common)
            loop.add(LoopTimer(after: .seconds(3600)) { _ in _ = timerTracker }, forMode: "other")
            loop.add(kept, forMode: .common)
            loop.add(kept, forMode: "other")
            #expect(kept.isValid)
            dead.value = loop
        }
        exit()
        let loop = dead.value!
        #expect(!kept.isValid)
        #expect(observerReleased.value && timerReleased.value)

        let late = LoopTimer(after: .seconds(1)) { _ in }
        loop.add(late, forMode: .default)
        #expect(!late.isValid)
        let lateObserverReleased = UnsafeBox(false)
        do {
            let tracker = Tracker(lateObserverReleased)
            loop.add(LoopObserver(activities: .entry) { _, _ in _ = tracker }, forMode: .default)
        }
        #expect(lateObserverReleased.value)
    }

    /// When a loop's thread exits, its sources leave every mode: `cancel`
    /// runs once per mode, on the exiting thread. They stay valid; the dead
    /// loop ignores them from then on, and another loop takes and fires
    /// them, a descriptor source included (the dead loop no longer counts
    /// as holding it).
    @Test(arguments: availableBackends)
    func exitingThreadCancelsItsLoopsSources(kind: EventBackendKind) {
        let log = EventLog()
        let other: LoopMode = "other"
        let source = LoopSource(
            schedule: { _, mode in log.append("schedule \(mode)") },
            cancel: { loop, mode in log.append("cancel \(mode) on its thread: \(cshims_gettid() == loop.ownerThreadID)") }
        ) { _ in log.append("perform") }
        withPipe { readEnd, writeEnd in
            let reads = EventLog()
            let watcher = LoopSource(descriptor: readEnd) { _, _ in
                var byte: UInt8 = 0
                _ = read(readEnd, &byte, 1)
                reads.append("read")
            }
            let dead = UnsafeBox<ThreadLoop?>(nil)
            let exit = startThread {
                let loop = try! ThreadLoop.current(backend: kind)
                loop.add(source, forMode: .default)
                loop.add(source, forMode: other)
                loop.add(watcher, forMode: .common)
                dead.value = loop
            }
            exit()
            let loop = dead.value!
            #expect(log.all == [
                "schedule default", "schedule other", "cancel default on its thread: true",
                "cancel other on its thread: true",
            ])
            #expect(source.isValid && watcher.isValid)
            #expect(!loop.contains(source, inMode: .default) && !loop.contains(watcher, inMode: .common))
            log.clear()
            loop.add(source, forMode: .default)
            #expect(log.all.isEmpty && !loop.contains(source, inMode: .default))

            onLoopThread(kind) { alive in
                alive.add(source, forMode: .default)
                alive.add(watcher, forMode: .default)
                source.signal()
                var byte: UInt8 = 1
                _ = write(writeEnd, &byte, 1)
                var passes = 0
                while (log.all.count < 2 || reads.all.isEmpty) && passes < 10 {
                    _ = alive.run(mode: .default, timeout: .seconds(10), returnAfterSourceHandled: true)
                    passes += 1
                }
                #expect(reads.all.count == 1)
                source.invalidate()
                watcher.invalidate()
            }
            #expect(log.all == ["schedule default", "perform", "cancel default on its thread: true"])
        }
    }

    /// `isCurrent` is true only on the loop's own thread: not on a thread
    /// without a loop, nor on one with a loop of its own.
    @Test(arguments: availableBackends)
    func isCurrentOnlyOnTheOwner(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            #expect(loop.isCurrent)
            let answers = EventLog()
            let bare = startThread { answers.append("bare \(loop.isCurrent)") }
            bare()
            let withLoop = startThread {
                let own = try! ThreadLoop.current(backend: kind)
                answers.append("own \(own.isCurrent) other \(loop.isCurrent)")
            }
            withLoop()
            #expect(answers.all == ["bare false", "own true other false"])
        }
    }

    /// Regression: the main loop made by another thread used to leave the
    /// main thread on the default 50 µs timer slack, because only a thread
    /// can set its own. The main thread now takes its loop up when it first
    /// uses it (at the latest when it runs it), slack included.
    @Test func mainLoopMadeElsewhereGetsItsTimerSlackOnTheMainThread() async {
        await #expect(processExitsWith: .success) {
            // The exit test's own main thread is held by the test harness.
            // A forked child's one thread is its main thread (its thread id
            // is the new process id), free to run the check.
            let child = fork()
            if child == 0 {
                armHangAlarm(seconds: 30)  // a hang fails the test instead of stalling it
                _exit(mainThreadTakesUpTheMainLoop())
            }
            guard child > 0 else { exit(10) }
            var status: Int32 = 0
            guard waitpid(child, &status, 0) == child else { exit(11) }
            let signal = status & 0x7f
            exit(signal == 0 ? (status >> 8) & 0xff : 128 + signal)
        }
    }
}

/// Run on a process's main thread, whose loop does not exist yet: another
/// thread makes the main loop, then this thread runs it. Returns 0 if the
/// main thread then has the loop as its own and 1 ns timer slack.
private func mainThreadTakesUpTheMainLoop() -> Int32 {
    guard cshims_gettid() == getpid() else { return 2 }
    // Timer slack is inherited through fork and exec: start from Linux's
    // default, whatever the thread that spawned this process had.
    _ = cshims_set_timer_slack(50_000)
    let join = startThread { _ = ThreadLoop.main }
    join()
    guard mainThreadTimerSlack() != 1 else { return 3 }  // untouched so far
    ThreadLoop.main.run(mode: .default, timeout: .zero)
    // Read before `ThreadLoop.current`, which would take the loop up itself.
    guard mainThreadTimerSlack() == 1 else { return 4 }
    return ThreadLoop.main.isCurrent && ThreadLoop.current === ThreadLoop.main ? 0 : 5
}
