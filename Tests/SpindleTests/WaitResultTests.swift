import Spindle
import Testing
import TestSupport

/// One result for every timed wait: `WaitResult`, from the semaphore, the
/// conditions, the queues and the jobs alike; and the deprecated `Bool`
/// forms, still chosen (only) where a `Bool` is required.
@Suite("WaitResult")
struct WaitResultTests {
    @Test func everyTimedWaitReturnsWaitResult() {
        let semaphore = Semaphore(value: 0)
        let condition = Condition()
        let variable = ConditionVariable()
        let lock = Lock()
        let group = WorkGroup()
        group.enter()
        let jobs = JobQueue(name: "wait-result")
        jobs.isSuspended = true
        let job = jobs.add {}

        // Each `let` takes the enum form: no `Bool` is asked for.
        let results: [WaitResult] = [
            semaphore.wait(timeout: .milliseconds(1)),
            semaphore.wait(until: MonotonicClock.now),
            semaphore.wait(until: ContinuousClock.now),
            condition.withLock { condition.wait(timeout: .milliseconds(1)) },
            condition.withLock { condition.wait(until: SuspendingClock.now) },
            lock.withLock { variable.wait(releasing: lock, timeout: .milliseconds(1)) },
            lock.withLock { variable.wait(releasing: lock, until: WallClock.now) },
            group.wait(timeout: .milliseconds(1)),
            job.waitUntilFinished(timeout: .milliseconds(1)),
            jobs.waitUntilAllJobsAreFinished(timeout: .milliseconds(1)),
        ]
        #expect(results.allSatisfy { $0 == .timedOut })

        semaphore.signal()
        let took = semaphore.wait(timeout: .seconds(30))
        #expect(took == .completed)
        group.leave()
        #expect(group.wait(until: ContinuousClock.now + .seconds(30)) == .completed)
        jobs.isSuspended = false
        #expect(job.waitUntilFinished(timeout: .seconds(30)) == .completed)
    }

    @Test func conditionWaitCompletesWhenSignalled() {
        let condition = Condition()
        let ready = LockedValue(false)
        let join = startThread {
            condition.withLock {
                ready.withLock { $0 = true }
                condition.signal()
            }
        }
        let outcome: WaitResult = condition.withLock {
            var last = WaitResult.completed
            while !ready.withLock({ $0 }) {
                last = condition.wait(timeout: .seconds(30))
                if last == .timedOut { break }
            }
            return last
        }
        join()
        #expect(outcome == .completed)
    }

    @available(*, deprecated)
    @Test func theFormerNameIsTheSameType() {
        #expect(WorkWaitResult.self == WaitResult.self)
    }

    /// Deprecated itself, so that its calls of the deprecated forms do not
    /// warn: the point is that they still compile and answer as before.
    @available(*, deprecated)
    @Test func boolFormsRemainForBoolContexts() {
        let semaphore = Semaphore(value: 1)
        if semaphore.wait(timeout: .zero) {} else { Issue.record("a resource was available") }
        #expect(!semaphore.wait(timeout: .milliseconds(1)), "none left")
        semaphore.signal()
        let took: Bool = semaphore.wait(until: ContinuousClock.now + .seconds(30))
        #expect(took)
        let condition = Condition()
        condition.lock()
        #expect(!condition.wait(timeout: .milliseconds(1)))
        guard !condition.wait(until: MonotonicClock.now) else { Issue.record("no signal came"); return }
        condition.unlock()
        let variable = ConditionVariable()
        let lock = Lock()
        lock.lock()
        #expect(!variable.wait(releasing: lock, timeout: .milliseconds(1)))
        #expect(!variable.wait(releasing: lock, until: SuspendingClock.now))
        lock.unlock()
    }
}
