import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Every timed call beyond the locks (those are in `ClockDeadlineTests`)
/// takes a deadline on `ContinuousClock`, `SuspendingClock` and the wall
/// clock as well as `MonotonicClock`, and a `Duration`: queues, groups,
/// items, jobs, ports, loop timers, timer sources, the async waits. (`Futex`,
/// the kernel word's own view, keeps its `MonotonicClock` deadline: a generic
/// form there would outrank the optional one inside the library.)
@Suite("Deadline forms")
struct DeadlineFormTests {
    @Test func queueAsyncAfterTakesEveryClock() {
        let queue = WorkQueue(label: "deadlines")
        let group = WorkGroup()
        let ran = LockedValue(0)
        for _ in 0..<5 { group.enter() }
        queue.async(after: ContinuousClock.now + .milliseconds(1)) { ran.withLock { $0 += 1 }; group.leave() }
        queue.async(after: SuspendingClock.now + .milliseconds(1)) { ran.withLock { $0 += 1 }; group.leave() }
        queue.async(after: WallClock.now + .milliseconds(1)) { ran.withLock { $0 += 1 }; group.leave() }
        queue.async(after: MonotonicClock.now + .milliseconds(1)) { ran.withLock { $0 += 1 }; group.leave() }
        queue.async(after: .milliseconds(1)) { ran.withLock { $0 += 1 }; group.leave() }
        #expect(group.wait(until: ContinuousClock.now + .seconds(30)) == .completed)
        #expect(ran.withLock { $0 } == 5)
    }

    @Test func delayedItemNeverRunsBeforeItsContinuousDeadline() {
        let group = WorkGroup()
        group.enter()
        let deadline = ContinuousClock.now + .milliseconds(20)
        let ranAt = LockedValue<ContinuousClock.Instant?>(nil)
        WorkQueue.global().async(after: deadline) {
            ranAt.withLock { $0 = ContinuousClock.now }
            group.leave()
        }
        #expect(group.wait(timeout: .seconds(30)) == .completed)
        let at = ranAt.withLock { $0 }
        #expect(at != nil && at! >= deadline, "ran before its deadline")
    }

    @Test func groupAndItemWaitsTimeOutOnEveryClock() {
        let group = WorkGroup()
        group.enter()
        #expect(group.wait(until: ContinuousClock.now + .milliseconds(2)) == .timedOut)
        #expect(group.wait(until: SuspendingClock.now - .seconds(1)) == .timedOut)
        #expect(group.wait(until: WallClock.now) == .timedOut)
        group.leave()
        #expect(group.wait(until: ContinuousClock.now + .seconds(30)) == .completed)

        let release = Latch()
        let item = WorkItem { release.wait() }
        WorkQueue(label: "item").async(item)
        #expect(item.wait(until: ContinuousClock.now + .milliseconds(2)) == .timedOut)
        #expect(item.wait(until: WallClock.now - .seconds(1)) == .timedOut)
        release.countDown()
        #expect(item.wait(until: SuspendingClock.now + .seconds(30)) == .completed)
    }

    @Test func jobWaitsTakeEveryClock() {
        let queue = JobQueue(name: "deadlines")
        queue.isSuspended = true
        let job = queue.add {}
        #expect(job.waitUntilFinished(until: ContinuousClock.now + .milliseconds(2)) == .timedOut)
        #expect(queue.waitUntilAllJobsAreFinished(until: SuspendingClock.now + .milliseconds(2)) == .timedOut)
        #expect(queue.waitUntilAllJobsAreFinished(until: WallClock.now) == .timedOut)
        queue.isSuspended = false
        #expect(job.waitUntilFinished(until: WallClock.now + .seconds(30)) == .completed)
        #expect(queue.waitUntilAllJobsAreFinished(until: ContinuousClock.now + .seconds(30)) == .completed)
    }

    @Test func localPortSendWaitsForRoomUntilADeadlineOnAnyClock() throws {
        // Not scheduled in a loop: nothing drains it, so the second message
        // finds the queue full.
        let port = LocalPort(capacity: 1) { _ in }
        defer { port.invalidate() }
        try port.send(PortEnvelope(id: 1), before: ContinuousClock.now + .seconds(1))
        #expect(throws: PortError.self) { try port.send(PortEnvelope(id: 2), before: ContinuousClock.now + .milliseconds(2)) }
        #expect(throws: PortError.self) { try port.send(PortEnvelope(id: 2), before: WallClock.now - .seconds(1)) }
        #expect(port.queuedCount == 1)
    }

    @Test func remotePortLookupTakesADeadline() {
        #expect(throws: PortError.self) {
            _ = try RemotePort.lookup("spindle-deadline-forms-nobody-\(getpid())", before: ContinuousClock.now + .seconds(1))
        }
    }

    @Test func loopTimerFiresAtAContinuousClockDeadline() throws {
        let worker = try LoopThread.start()
        defer { worker.stop(); try? worker.join() }
        let fired = Semaphore(value: 0)
        let deadline = ContinuousClock.now + .milliseconds(2)
        let timer = LoopTimer(fireAt: deadline) { _ in fired.signal() }
        #expect(timer.fireDate > MonotonicClock.now - .seconds(1))
        worker.loop.add(timer)
        #expect(fired.wait(timeout: .seconds(30)) == .completed)
        #expect(ContinuousClock.now >= deadline)
    }

    @Test func timerSourceStartsOnAnyClock() {
        let exact = MonotonicClock.Instant(nanoseconds: 123_456)
        #expect(EventSource.TimerStart.at(exact) == .monotonic(exact))
        let before = MonotonicClock.now
        guard case .monotonic(let start) = EventSource.TimerStart.at(ContinuousClock.now + .seconds(10)) else {
            Issue.record("a ContinuousClock start is not a monotonic start")
            return
        }
        #expect(start >= before + .seconds(10))
        guard case .monotonic(let later) = EventSource.TimerStart.after(.seconds(10)) else {
            Issue.record("`.after` is not a monotonic start")
            return
        }
        #expect(later >= before + .seconds(10))
    }

    @Test func asyncWaitsTakeEveryClock() async throws {
        let group = WorkGroup()
        group.enter()
        #expect(try await group.wait(until: ContinuousClock.now + .milliseconds(2)) == .timedOut)
        group.leave()
        #expect(try await group.wait(until: WallClock.now + .seconds(30)) == .completed)

        let item = WorkItem {}
        WorkQueue.global().async(item)
        #expect(try await item.wait(until: SuspendingClock.now + .seconds(30)) == .completed)

        let jobs = JobQueue(name: "async deadlines")
        jobs.isSuspended = true
        jobs.add {}
        #expect(try await jobs.waitUntilAllJobsAreFinished(until: ContinuousClock.now + .milliseconds(2)) == .timedOut)
        #expect(try await jobs.waitUntilAllJobsAreFinished(timeout: .milliseconds(1)) == .timedOut)
        jobs.isSuspended = false
        try await jobs.waitUntilAllJobsAreFinished()
        #expect(try await jobs.waitUntilAllJobsAreFinished(until: ContinuousClock.now) == .completed)

        let lock = AsyncLock()
        #expect(try await lock.lock(until: ContinuousClock.now + .seconds(1)))
        let again = try await lock.lock(until: SuspendingClock.now + .milliseconds(2))
        #expect(!again, "held: the deadline passes")
        lock.unlock()
    }

    @Test func performReturningRunsOnTheQueueAndReturnsTheValue() async throws {
        let queue = WorkQueue(label: "perform-returning")
        let value = try await queue.performReturning { 6 * 7 }
        #expect(value == 42)
        struct Failure: Error {}
        await #expect(throws: Failure.self) { try await queue.performReturning { throw Failure() } }
    }

    @Test func distributedLockTakesAContinuousClockDeadline() throws {
        let path = "/tmp/spindle-deadline-forms-\(getpid()).lock"
        let a = DistributedLock(path: path)
        let b = DistributedLock(path: path)
        #expect(try a.lock(before: ContinuousClock.now + .seconds(1)))
        #expect(try !b.lock(before: ContinuousClock.now + .milliseconds(2)))
        try a.unlock()
    }
}
