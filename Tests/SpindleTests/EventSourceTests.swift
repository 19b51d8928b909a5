// Event sources: each kind's event data, the life cycle (inactive, active,
// suspended, cancelled), coalescing, and both kinds of target.
#if canImport(Glibc)
import Glibc
#endif
import Spindle
import Testing
import TestSupport

@Suite("EventSource")
struct EventSourceTests {
    @Test func dataAddSourceSumsMergesIntoFewerCalls() {
        let queue = WorkQueue(label: "es.add")
        let source = EventSource.data(.add, on: .queue(queue))
        let totals = LockedValue((calls: 0, sum: UInt64(0)))
        let done = Semaphore(value: 0)
        source.setEventHandler { s in
            let sum = totals.withLock { $0.calls += 1; $0.sum += s.data; return $0.sum }
            if sum == 10_000 { done.signal() }
        }
        source.activate()
        for _ in 0..<10_000 { source.merge(data: 1) }
        #expect(done.wait(timeout: .seconds(10)) == .completed)
        let (calls, sum) = totals.withLock { $0 }
        #expect(sum == 10_000)
        #expect(calls >= 1 && calls <= 10_000)
        source.cancel()
    }

    @Test func mergesBeforeActivationArriveOnceAfterIt() {
        let queue = WorkQueue(label: "es.inactive")
        let source = EventSource.data(.or, on: .queue(queue))
        let seen = LockedValue<[UInt64]>([])
        let done = Semaphore(value: 0)
        source.setEventHandler { s in seen.withLock { $0.append(s.data) }; done.signal() }
        source.merge(data: 1)
        source.merge(data: 4)
        source.merge(data: 4)
        sleepBriefly()
        #expect(seen.withLock { $0 }.isEmpty)
        source.activate()
        #expect(done.wait(timeout: .seconds(10)) == .completed)
        #expect(seen.withLock { $0 } == [5])
        source.cancel()
    }

    @Test func cancelHandlerRunsOnceAfterTheRunningHandler() {
        let queue = WorkQueue(label: "es.cancel", kind: .concurrent)
        let source = EventSource.data(.add, on: .queue(queue))
        let log = LockedValue<[String]>([])
        let entered = Semaphore(value: 0)
        let release = Semaphore(value: 0)
        let cancelled = Semaphore(value: 0)
        source.setEventHandler { _ in
            log.withLock { $0.append("event") }
            entered.signal()
            release.wait()
            log.withLock { $0.append("event-end") }
        }
        source.setCancelHandler { _ in log.withLock { $0.append("cancel") }; cancelled.signal() }
        source.activate()
        source.merge(data: 1)
        #expect(entered.wait(timeout: .seconds(10)) == .completed)
        source.merge(data: 1)   // held for a second call, which cancel drops
        source.cancel()
        source.cancel()
        #expect(source.isCancelled)
        release.signal()
        #expect(cancelled.wait(timeout: .seconds(10)) == .completed)
        source.merge(data: 1)   // ignored
        sleepBriefly()
        #expect(log.withLock { $0 } == ["event", "event-end", "cancel"])
    }

    @Test func suspendedTimerDeliversTheMissedFiringsAsOneCall() {
        let queue = WorkQueue(label: "es.timer")
        let timer = EventSource.timer(interval: .milliseconds(5), on: .queue(queue))
        let calls = LockedValue<[UInt64]>([])
        timer.setEventHandler { s in calls.withLock { $0.append(s.data) } }
        timer.activate()
        timer.suspend()
        let start = MonotonicClock.now
        while MonotonicClock.now < start.advanced(by: .milliseconds(60)) { sleepBriefly() }
        let before = calls.withLock { $0.count }
        timer.resume()
        // The 12 periods of the suspension arrive merged: the first call
        // after the resume carries every firing the reactor had counted by
        // then (all 12 on a quiet machine; fewer if the reactor thread was
        // itself held up, the rest following in the next calls).
        let deadline = MonotonicClock.now.advanced(by: .seconds(10))
        while calls.withLock({ $0.dropFirst(before).reduce(0, +) }) < 12 && MonotonicClock.now < deadline {
            sleepBriefly()
        }
        timer.cancel()
        let after = Array(calls.withLock { $0 }.dropFirst(before))
        #expect(after.reduce(0, +) >= 12, "the firings missed while suspended: \(after)")
        #expect(after.first ?? 0 >= 2, "the firings of the suspension were not merged: \(after)")
    }

    /// 200 one-shot timers on queues (so in the reactor's one timer heap),
    /// due 1–50 ms from now with leeways of 0–2 ms: each fires once, never
    /// before its due time.
    @Test func queueTimersFireOnceEachNeverEarly() {
        let queue = WorkQueue(label: "es.timers", kind: .concurrent)
        let early = LockedValue(0)
        let fired = Semaphore(value: 0)
        var sources: [EventSource] = []
        var generator = SplitMix(state: 18)
        for _ in 0..<200 {
            let due = MonotonicClock.now.advanced(by: .microseconds(Int64(1000 + generator.next() % 49_000)))
            let leeway = Duration.microseconds(Int64(generator.next() % 2000))
            let timer = EventSource.timer(start: .monotonic(due), interval: nil, leeway: leeway, on: .queue(queue))
            timer.setEventHandler { s in
                if MonotonicClock.now < due || s.data != 1 { early.withLock { $0 += 1 } }
                fired.signal()
            }
            timer.activate()
            sources.append(timer)
        }
        for _ in 0..<200 { #expect(fired.wait(timeout: .seconds(10)) == .completed) }
        sleepBriefly()
        #expect(!fired.tryWait(), "a one-shot timer fired twice")
        #expect(early.withLock { $0 } == 0)
        for s in sources { s.cancel() }
    }

    /// A wall-clock timer (Listing 4-1's shape): first firing at once, then
    /// every interval, each after its wall-clock due time.
    @Test func wallClockTimerKeepsItsSchedule() {
        let queue = WorkQueue(label: "es.wall")
        let start = WallClock.now
        let timer = EventSource.timer(start: .wall(start), interval: .milliseconds(5), on: .queue(queue))
        let firings = LockedValue<[(WallClock.Instant, UInt64)]>([])
        let done = Semaphore(value: 0)
        timer.setEventHandler { s in
            let n = firings.withLock { $0.append((WallClock.now, s.data)); return $0.count }
            if n == 5 { s.cancel(); done.signal() }
        }
        timer.activate()
        #expect(done.wait(timeout: .seconds(10)) == .completed)
        var total: UInt64 = 0
        for (at, data) in firings.withLock({ $0 }) {
            total += data
            #expect(at >= start.advanced(by: .milliseconds(5 * Int64(total - 1))), "fired early: \(at) for firing \(total)")
        }
    }

    /// The wall-clock path a setting of the clock takes, checked without
    /// setting it (only the opt-in `EventSourceClockChangeTests` step the
    /// clock): once a wall-clock timer is active, the process watches a
    /// `CLOCK_REALTIME` timerfd armed with `TFD_TIMER_ABSTIME |
    /// TFD_TIMER_CANCEL_ON_SET` (the kernel's "settime flags: 03" in its
    /// fdinfo), which is what turns a clock step into a wake-up.
    @Test func aWallClockTimerWatchesForSettingsOfTheClock() throws {
        let queue = WorkQueue(label: "es.wallWatch")
        let timer = EventSource.timer(start: .wall(WallClock.now + .seconds(3600)), interval: .seconds(3600), on: .queue(queue))
        timer.setEventHandler { _ in }
        timer.activate()
        defer { timer.cancel() }
        func watchesTheClock() -> Bool {
            guard let dir = opendir("/proc/self/fdinfo") else { return false }
            defer { closedir(dir) }
            while let entry = readdir(dir) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
                guard let fd = Int32(name), fd > 2 else { continue }
                let info = procFileText("/proc/self/fdinfo/\(fd)") ?? ""
                if info.contains("clockid: 0\n") && info.contains("settime flags: 03\n") { return true }
            }
            return false
        }
        let deadline = MonotonicClock.now.advanced(by: .seconds(10))
        var found = watchesTheClock()
        while !found && MonotonicClock.now < deadline {
            usleep(1_000)
            found = watchesTheClock()
        }
        #expect(found, "no CLOCK_REALTIME timerfd armed with TFD_TIMER_CANCEL_ON_SET while a wall-clock timer is active")
    }

    @Test func readSourceReportsBytesThenEndOfFileOnce() throws {
        var fds: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        let queue = WorkQueue(label: "es.read")
        let source = try EventSource.read(descriptor: fds[0], on: .queue(queue))
        let seen = LockedValue<[UInt64]>([])
        let got = Semaphore(value: 0)
        let closed = Semaphore(value: 0)
        source.setEventHandler { s in
            var buffer = [UInt8](repeating: 0, count: 4096)
            let n = read(s.handle, &buffer, buffer.count)
            seen.withLock { $0.append(s.data) }
            _ = n
            got.signal()
        }
        let reader = fds[0]
        source.setCancelHandler { _ in close(reader); closed.signal() }
        source.activate()
        let bytes: [UInt8] = Array(repeating: 7, count: 100)
        #expect(write(fds[1], bytes, 100) == 100)
        #expect(got.wait(timeout: .seconds(10)) == .completed)
        close(fds[1])
        #expect(got.wait(timeout: .seconds(10)) == .completed)
        sleepBriefly()
        #expect(seen.withLock { $0 } == [100, 0])
        source.cancel()
        #expect(closed.wait(timeout: .seconds(10)) == .completed)
    }

    @Test func regularFileAtEndFiresOnceThenGoesQuiet() throws {
        let path = "/tmp/spindle-es-\(getpid())-file"
        let fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0o600)
        defer { unlink(path) }
        #expect(fd >= 0)
        #expect(write(fd, [UInt8](repeating: 1, count: 5000), 5000) == 5000)
        #expect(lseek(fd, 0, SEEK_SET) == 0)
        let queue = WorkQueue(label: "es.file")
        let source = try EventSource.read(descriptor: fd, on: .queue(queue))
        let seen = LockedValue<[UInt64]>([])
        source.setEventHandler { s in
            var buffer = [UInt8](repeating: 0, count: 3000)
            _ = read(s.handle, &buffer, 3000)
            seen.withLock { $0.append(s.data) }
        }
        source.setCancelHandler { _ in close(fd) }
        source.activate()
        let start = MonotonicClock.now
        while MonotonicClock.now < start.advanced(by: .milliseconds(200)) { sleepBriefly() }
        source.cancel()
        #expect(seen.withLock { $0 } == [5000, 2000, 0])
    }

    /// An empty pipe's write end is writable at once, with its whole
    /// capacity. The wait is long: once in six ThreadSanitizer passes in CI
    /// the call, queued behind other tests' long items, had not run in 10 s.
    /// A lost registration or wake-up would still never call it.
    @Test func writeSourceReportsTheSpaceOfAPipe() throws {
        var fds: [Int32] = [0, 0]
        #expect(pipe(&fds) == 0)
        let queue = WorkQueue(label: "es.write")
        let source = try EventSource.write(descriptor: fds[1], on: .queue(queue))
        let space = LockedValue<UInt64>(0)
        let got = Semaphore(value: 0)
        source.setEventHandler { s in space.withLock { $0 = s.data }; s.cancel() }
        let (r, w) = (fds[0], fds[1])
        source.setCancelHandler { _ in close(r); close(w); got.signal() }
        source.activate()
        #expect(got.wait(timeout: .seconds(60)) == .completed)
        #expect(space.withLock { $0 } == 65536)
    }

    /// Queue sources are watched by an idle pool worker, not a thread of
    /// their own. Every worker of the pool (and more) blocked in items that
    /// wait for a timer's and a read source's handlers must not leave the
    /// sources unwatched: a blocking wait hands the poller to another worker.
    /// (The sources exist first, so an idle worker holds the poller when the
    /// items arrive and is woken to run them.)
    @Test func itemsBlockedOnQueueSourcesDoNotStallThePool() throws {
        var fds: [Int32] = [0, 0]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        defer { close(fds[0]); close(fds[1]) }
        let blockers = 2 * Topology.availableCPUCount + 2
        let timerFired = Semaphore(value: 0)
        let readFired = Semaphore(value: 0)
        let timer = EventSource.timer(
            start: .monotonic(MonotonicClock.now.advanced(by: .milliseconds(300))), interval: nil,
            on: .queue(WorkQueue(label: "es.blocked.timer")))
        timer.setEventHandler { _ in for _ in 0..<blockers { timerFired.signal() } }
        let reader = try EventSource.read(descriptor: fds[0], on: .queue(WorkQueue(label: "es.blocked.read")))
        let readEnd = fds[0]
        reader.setEventHandler { _ in
            var byte: UInt8 = 0
            if read(readEnd, &byte, 1) == 1 { for _ in 0..<blockers { readFired.signal() } }
        }
        timer.activate()
        reader.activate()
        let started = Semaphore(value: 0)
        let finished = WorkGroup()
        for _ in 0..<blockers {
            WorkQueue.global().async(group: finished) {
                started.signal()
                // Each waits for both sources; the handlers signal once per
                // blocker, so every one of them gets through.
                timerFired.wait()
                readFired.wait()
            }
        }
        for _ in 0..<blockers { #expect(started.wait(timeout: .seconds(10)) == .completed) }
        #expect(write(fds[1], "x", 1) == 1)
        #expect(finished.wait(timeout: .seconds(10)) == .completed, "items waiting for queue sources' handlers never finished")
        timer.cancel()
        reader.cancel()
    }

    /// A queue source's handler that computes for long (no blocking wait it
    /// could announce) runs on the worker that was waiting in the pool's
    /// poller, and every other worker is parked on its futex: the
    /// watchdog must still poll, so another source's event is handled on a
    /// free worker while the first handler computes, not after it.
    @Test func aHandlerThatComputesForLongDoesNotHoldUpOtherQueueSources() throws {
        var pairA: [Int32] = [0, 0]
        var pairB: [Int32] = [0, 0]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pairA) == 0)
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pairB) == 0)
        let fds = pairA + pairB
        defer { for fd in fds { close(fd) } }
        let bRan = LockedValue(false)
        let aFinished = Semaphore(value: 0)
        let spinning = LockedValue(MonotonicClock.Instant(nanoseconds: 0))
        let (readA, readB) = (fds[0], fds[2])
        let a = try EventSource.read(descriptor: readA, on: .queue(WorkQueue(label: "es.long.a")))
        a.setEventHandler { _ in
            var byte: UInt8 = 0
            guard read(readA, &byte, 1) == 1 else { return }
            // Compute until B's handler has run, for at most 5 s.
            let start = MonotonicClock.now
            spinning.withLock { $0 = start }
            while !bRan.withLock({ $0 }) && start.duration(to: MonotonicClock.now) < .seconds(5) {}
            aFinished.signal()
        }
        let b = try EventSource.read(descriptor: readB, on: .queue(WorkQueue(label: "es.long.b")))
        let bLatency = LockedValue<Duration?>(nil)
        b.setEventHandler { _ in
            var byte: UInt8 = 0
            guard read(readB, &byte, 1) == 1 else { return }
            let since = spinning.withLock { $0 }.duration(to: MonotonicClock.now)
            bLatency.withLock { $0 = since }
            bRan.withLock { $0 = true }
        }
        a.activate()
        b.activate()
        #expect(write(fds[1], "a", 1) == 1)
        #expect(eventually { spinning.withLock { $0.nanoseconds } != 0 }, "A's handler never started")
        usleep(50_000)  // the pool settles: A's worker computes, the others park
        #expect(write(fds[3], "b", 1) == 1)
        #expect(aFinished.wait(timeout: .seconds(10)) == .completed)
        let latency = try #require(bLatency.withLock { $0 }, "B's handler never ran")
        #expect(latency < .seconds(4), "B's handler waited \(latency) for A's handler to stop computing")
        a.cancel()
        b.cancel()
    }

    @Test func loopTargetRunsHandlersOnTheLoopThread() throws {
        let thread = try LoopThread.start()
        defer { thread.stop(); try? thread.join() }
        let source = EventSource.data(.add, on: .loop(thread.loop))
        let onLoop = LockedValue<[Bool]>([])
        let done = Semaphore(value: 0)
        source.setEventHandler { s in
            onLoop.withLock { $0.append(thread.loop.isCurrent) }
            if s.data > 0 { done.signal() }
        }
        source.activate()
        source.merge(data: 3)
        #expect(done.wait(timeout: .seconds(10)) == .completed)
        let timer = EventSource.timer(interval: nil, on: .loop(thread.loop))
        timer.setEventHandler { s in onLoop.withLock { $0.append(thread.loop.isCurrent && s.data == 1) }; done.signal() }
        timer.activate()
        #expect(done.wait(timeout: .seconds(10)) == .completed)
        #expect(onLoop.withLock { $0 } == [true, true])
        source.cancel()
        timer.cancel()
    }
}

extension EventSourceTests {
    /// A loop whose thread has exited runs nothing: merges into a source
    /// that targets it are dropped (not resubmitted without end), and the
    /// cancel handler still runs, on the cancelling thread.
    @Test func sourceOnALoopWhoseThreadExitedDropsEventsAndStillCancels() throws {
        let thread = try LoopThread.start()
        let loop = thread.loop
        thread.stop()
        try thread.join()
        let source = EventSource.data(.add, on: .loop(loop))
        let calls = LockedValue(0)
        let cancelled = LockedValue(0)
        source.setEventHandler { _ in calls.withLock { $0 += 1 } }
        source.setCancelHandler { _ in cancelled.withLock { $0 += 1 } }
        source.activate()
        for _ in 0..<100 { source.merge(data: 1) }
        source.cancel()
        #expect(calls.withLock { $0 } == 0)
        #expect(cancelled.withLock { $0 } == 1)
    }
}

extension EventSourceTests {
    @Test func eventSetsDescribeThemselvesByName() {
        #expect(EventSource.FileEvents([.write, .extend]).description == "[write, extend]")
        #expect(EventSource.ProcessEvents.exit.description == "[exit]")
        #expect(EventSourceError.processEventsNotObservable([.fork, .exec]).description.hasPrefix("process events [fork, exec] cannot be observed"))
    }
}

/// 2 ms: lets other threads run (a handler that should not run gets its chance).
func sleepBriefly() { usleep(2000) }
