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

    /// `LoopTimer.fire()` runs the handler at once: a repeating timer keeps
    /// its schedule, a one-shot is invalidated.
    @Test func fireRunsTheHandlerOutsideTheSchedule() {
        let log = EventLog()
        let date = MonotonicClock.now.advanced(by: .seconds(60))
        let repeating = LoopTimer(fireAt: date, interval: .seconds(1)) { _ in log.append("repeating") }
        let once = LoopTimer(fireAt: date) { _ in log.append("once") }
        repeating.fire()
        once.fire()
        once.fire()  // invalid now: nothing
        #expect(log.all == ["repeating", "once"])
        #expect(repeating.isValid && repeating.fireDate == date)
        #expect(!once.isValid)
        repeating.invalidate()
    }

    /// Setting `fireDate` from another thread reschedules a timer whose loop
    /// sleeps until its old date; `tolerance` is settable.
    @Test(arguments: availableBackends)
    func settingFireDateReschedulesASleepingLoop(kind: EventBackendKind) {
        let log = EventLog()
        let timer = LoopTimer(after: .seconds(3_600)) { _ in log.append("fired") }
        timer.tolerance = .milliseconds(1)
        #expect(timer.tolerance == .milliseconds(1))
        let running = RunningLoop(kind) { loop in
            loop.add(timer)
            return loop.run(mode: .default, timeout: .seconds(30), returnAfterSourceHandled: true)
        }
        usleep(30_000)  // the loop sleeps until the timer's hour
        let start = MonotonicClock.now
        timer.fireDate = MonotonicClock.now.advanced(by: .milliseconds(10))
        while log.all.isEmpty && start.duration(to: .now) < .seconds(20) { usleep(1_000) }
        #expect(log.all == ["fired"])
        running.loop.stop()
        _ = running.join()
    }

    /// Loops are `Hashable` by identity.
    @Test(arguments: availableBackends)
    func loopsCompareByIdentity(kind: EventBackendKind) {
        // On threads of the test's own, never on a test-runner thread: a
        // loop made there would stay with the runner's thread.
        onLoopThread(kind) { here in
            let there = Unchecked(LoopBox())
            let join = startThread { there.value.loop = ThreadLoop.current }
            join()
            let other = there.value.loop!
            #expect(here == ThreadLoop.current)
            #expect(here != other)
            #expect(Set([here, other, here]).count == 2)
        }
    }
}

private final class LoopBox: @unchecked Sendable {
    // @unchecked: written by one thread before it is joined, read after.
    var loop: ThreadLoop?
}

/// The run-loop handles describe themselves briefly, without internals.
@Suite("ThreadLoop: descriptions")
struct LoopDescriptionTests {
    @Test(arguments: availableBackends)
    func handlesDescribeTheirState(kind: EventBackendKind) {
        onLoopThread(kind) { loop in
            #expect(loop.description == "ThreadLoop(thread \(loop.ownerThreadID), \(kind.rawValue), idle)")
            let custom = LoopSource { _ in }
            #expect(custom.description == "LoopSource(custom)")
            withPipe { readEnd, _ in
                let watcher = LoopSource(descriptor: readEnd) { _, _ in }
                #expect(watcher.description == "LoopSource(descriptor \(readEnd), readable)")
                watcher.invalidate()
                #expect(watcher.description == "LoopSource(descriptor \(readEnd), readable, invalid)")
            }
            let timer = LoopTimer(after: .seconds(60), interval: .seconds(1)) { _ in }
            #expect(timer.description.hasPrefix("LoopTimer(every 1.0 seconds, due in"))
            timer.invalidate()
            #expect(timer.description == "LoopTimer(every 1.0 seconds, invalid)")
            let observer = LoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in }
            #expect(observer.description.hasPrefix("LoopObserver("))
            #expect(observer.description.hasSuffix(", once)"))
        }
    }
}

/// The guide's Listing 2-3 as it writes it: a long job runs its loop once
/// with a deadline of now between chunks (`runUntilDate:[NSDate date]`); a
/// custom input source, signalled from another thread, sets the exit flag in
/// the thread dictionary; the job ends.
@Suite("ThreadLoop: the guide's Listing 2-3")
struct Listing23Tests {
    @Test(arguments: availableBackends)
    func longJobEndsWhenItsInputSourceIsSignalled(kind: EventBackendKind) {
        let installed = Latch()
        let sourceBox = LockedValue<LoopSource?>(nil)
        let chunks = LockedValue(0)
        let join = startThread {
            let runLoop = try! ThreadLoop.current(backend: kind)
            let threadDict = NativeThread.current.threadDictionary
            threadDict["ThreadShouldExitNow"] = false
            // Install an input source (its handler runs on this thread).
            let source = LoopSource { _ in
                NativeThread.current.threadDictionary["ThreadShouldExitNow"] = true
            }
            runLoop.add(source)
            sourceBox.withLock { $0 = source }
            installed.countDown()
            var moreWorkToDo = true
            var exitNow = false
            var done = 0
            while moreWorkToDo && !exitNow {
                done += 1  // one chunk of a larger body of work
                if done == 50_000_000 { moreWorkToDo = false }  // a bound, never reached when it works
                runLoop.run(until: .now)
                exitNow = threadDict.value(forKey: "ThreadShouldExitNow", as: Bool.self) ?? false
            }
            chunks.withLock { $0 = done }
            source.invalidate()
        }
        #expect(installed.wait())
        usleep(10_000)
        sourceBox.withLock { $0 }?.signal()
        join()
        #expect(chunks.withLock { $0 } < 50_000_000, "the job ended because its input source fired, not by running out of work")
    }
}
