import Spindle
import Testing
import TestSupport

/// The guide's custom job of Listing 2-3: an initializer that stores the
/// input, `main()` that works on it and keeps the result on the job.
private final class SumJob: Job, @unchecked Sendable {
    // @unchecked: `result` is written by `main()` and read after the job
    // finished (the job's state word orders the two).
    let input: [Int]
    var result = 0
    init(_ input: [Int]) {
        self.input = input
        super.init(name: "sum")
    }
    override func main() throws {
        result = input.reduce(0, +)
    }
}

/// Listing 2-4: a loop that checks `isCancelled` every iteration.
private final class CountingJob: Job, @unchecked Sendable {
    // @unchecked: `iterations` is written only by `main()` and read after
    // the job finished; `started` is a semaphore.
    let started = Semaphore(value: 0)
    var iterations = 0
    let limit: Int
    init(limit: Int) {
        self.limit = limit
        super.init(name: "counting")
    }
    override func main() throws {
        var done = false
        while !isCancelled && !done {
            iterations += 1
            if iterations == 1 { _ = started.signal() }
            if iterations == limit { done = true }
            if iterations % 64 == 0 { _ = NativeThread.sleep(for: .microseconds(50)) }
        }
    }
}

/// Listings 2-5 to 2-7: an asynchronous job whose `main()` starts the work
/// on a work queue and returns; the work reports completion itself.
private final class FetchJob: Job, @unchecked Sendable {
    // @unchecked: `value` is written by the work before `finish` and read
    // after the job finished; `mainReturned` is read only by the thread that
    // called `start()`, after it returned; `release` is a semaphore.
    let release = Semaphore(value: 0)
    var value = 0
    var mainReturned = false
    override var isAsynchronous: Bool { true }
    override func main() throws {
        WorkQueue.global().async { [self] in
            release.wait()
            if !isCancelled { value = 42 }
            finish()
        }
        mainReturned = true
    }
}

private struct Broken: Error, Equatable { let code: Int }

private final class ThrowingJob: Job, @unchecked Sendable {
    // @unchecked: as Job's; no state of its own.
    override func main() throws { throw Broken(code: 7) }
}

/// Records every event an observer sees.
private final class EventRecorder: Sendable {
    private let log = LockedValue<[Job.Event]>([])
    func attach(to job: Job) { job.observe { event in self.log.withLock { $0.append(event) } } }
    var events: [Job.Event] { log.withLock { $0 } }
}

@Suite("Job")
struct JobTests {
    @Test func simpleJobRunsOnTheCallingThreadWhenStartedByHand() {
        let job = SumJob([1, 2, 3, 4])
        let recorder = EventRecorder()
        recorder.attach(to: job)
        #expect(job.state == .ready)
        #expect(job.isReady && !job.isExecuting && !job.isFinished && !job.isCancelled)
        let caller = NativeThread.current
        let ranHere = LockedValue(false)
        job.completionHandler = { ranHere.withLock { $0 = NativeThread.current === caller } }
        job.start()
        #expect(job.state == .finished)
        #expect(job.result == 10)
        #expect(job.error == nil)
        #expect(ranHere.withLock { $0 })
        #expect(recorder.events == [.executing, .finished])
        #expect(job.description == "'sum'")
    }

    @Test func jobRespondsToCancellationWhileRunning() {
        let job = CountingJob(limit: Int.max)
        let queue = JobQueue(name: "cancel")
        queue.add(job)
        job.started.wait()
        job.cancel()
        job.waitUntilFinished()
        #expect(job.isCancelled && job.isFinished)
        #expect(job.iterations > 0 && job.iterations < Int.max)
    }

    @Test func jobCancelledBeforeStartFinishesWithoutRunning() {
        let job = SumJob([1])
        let recorder = EventRecorder()
        recorder.attach(to: job)
        let completions = LockedValue(0)
        job.completionHandler = { completions.withLock { $0 += 1 } }
        job.cancel()
        job.cancel()
        #expect(job.state == .ready && job.isCancelled)
        job.start()
        #expect(job.isFinished)
        #expect(job.result == 0)
        #expect(completions.withLock { $0 } == 1)
        #expect(recorder.events == [.cancelled, .finished])
    }

    @Test func asynchronousJobStaysExecutingUntilItFinishes() {
        let job = FetchJob(name: "fetch")
        let recorder = EventRecorder()
        recorder.attach(to: job)
        job.start()
        // start() returned with the work still waiting for `release`.
        #expect(job.mainReturned)
        #expect(job.state == .executing)
        #expect(job.isExecuting && !job.isFinished)
        _ = job.release.signal()
        job.waitUntilFinished()
        #expect(job.state == .finished && !job.isExecuting)
        #expect(job.value == 42)
        #expect(recorder.events == [.executing, .finished])
    }

    @Test func cancelledAsynchronousJobStillReportsFinished() {
        let job = FetchJob()
        let dependent = SumJob([5])
        dependent.addDependency(job)
        let queue = JobQueue(name: "async-cancel")
        queue.add([job, dependent])
        job.cancel()
        _ = job.release.signal()
        queue.waitUntilAllJobsAreFinished()
        #expect(job.isFinished && job.value == 0)
        #expect(dependent.isFinished && dependent.result == 5)
    }

    @Test func thrownErrorIsKeptAndReadable() {
        let job = ThrowingJob()
        #expect(job.error == nil)
        job.start()
        #expect(job.isFinished)
        #expect(job.error as? Broken == Broken(code: 7))

        let closures = ClosureJob { throw Broken(code: 3) }
        let queue = JobQueue(name: "errors")
        queue.add(closures)
        closures.waitUntilFinished()
        #expect(closures.error as? Broken == Broken(code: 3))
    }

    @Test func asynchronousJobFinishesWithAnError() {
        final class Failing: Job, @unchecked Sendable {
            // @unchecked: as Job's; no state of its own.
            override var isAsynchronous: Bool { true }
            override func main() throws {
                WorkQueue.global().async { self.finish(throwing: Broken(code: 9)) }
            }
        }
        let job = Failing()
        job.start()
        job.waitUntilFinished()
        #expect(job.error as? Broken == Broken(code: 9))
    }

    @Test func closureJobRunsItsClosuresConcurrently() {
        // Each closure waits for the other: only concurrent closures finish
        // (Foundation's BlockOperation on Linux runs them one after another).
        let a = Semaphore(value: 0)
        let b = Semaphore(value: 0)
        let met = LockedValue(0)
        let job = ClosureJob(name: "pair") {
            _ = a.signal()
            if b.wait(timeout: .seconds(20)) == .completed { met.withLock { $0 += 1 } }
        }
        job.addClosure {
            _ = b.signal()
            if a.wait(timeout: .seconds(20)) == .completed { met.withLock { $0 += 1 } }
        }
        #expect(job.closureCount == 2)
        job.start()
        #expect(job.isFinished)
        #expect(met.withLock { $0 } == 2)
    }

    @Test func closureJobFinishesAfterAllItsClosures() {
        let count = LockedValue(0)
        let job = ClosureJob((0..<16).map { _ in { @Sendable in
            _ = NativeThread.sleep(for: .milliseconds(1))
            count.withLock { $0 += 1 }
        } })
        let queue = JobQueue(name: "closures")
        queue.add(job)
        job.waitUntilFinished()
        #expect(count.withLock { $0 } == 16)
    }

    @Test func observersSeeEveryTransitionInOrder() {
        let dependency = SumJob([1])
        let job = SumJob([2])
        let first = EventRecorder()
        let second = EventRecorder()
        first.attach(to: job)
        job.addDependency(dependency)
        second.attach(to: job)
        #expect(job.state == .pending && !job.isReady)
        #expect(job.dependencies.count == 1 && job.dependencies[0] === dependency)
        dependency.start()
        #expect(job.state == .ready)
        job.cancel()
        job.start()
        #expect(first.events == [.pending, .ready, .cancelled, .finished])
        #expect(second.events == [.ready, .cancelled, .finished])
    }

    @Test func removedObserverHearsNothingMore() {
        let job = SumJob([1])
        let seen = LockedValue(0)
        let id = job.observe { _ in seen.withLock { $0 += 1 } }
        job.removeObserver(id)
        job.start()
        #expect(seen.withLock { $0 } == 0)
    }

    @Test func eventSequenceDeliversTransitionsInOrderAndEnds() async {
        let dependency = SumJob([1])
        let job = FetchJob(name: "stream")
        job.addDependency(dependency)
        let stream = job.events
        let queue = JobQueue(name: "stream")
        queue.add([job, dependency])
        job.cancel()
        _ = job.release.signal()
        var seen: [Job.Event] = []
        for await event in stream { seen.append(event) }
        // Cancelled before or after it became ready or started: each order
        // the state machine allows, never a repeat, always finished last.
        let allowed: [[Job.Event]] = [
            [.cancelled, .ready, .finished],
            [.ready, .cancelled, .finished],
            [.ready, .executing, .cancelled, .finished],
        ]
        #expect(allowed.contains(seen), "\(seen)")
        var empty: [Job.Event] = []
        for await event in job.events { empty.append(event) }
        #expect(empty.isEmpty)
    }

    @Test func removingTheLastDependencyMakesAJobReady() {
        let a = SumJob([1])
        let b = SumJob([2])
        let job = SumJob([3])
        job.addDependency(a)
        job.addDependency(b)
        job.addDependency(a)
        #expect(job.dependencies.count == 2)
        job.removeDependency(a)
        #expect(job.state == .pending)
        job.removeDependency(b)
        #expect(job.state == .ready)
        job.removeDependency(b)
        job.start()
        #expect(job.result == 3)
    }

    @Test func dependencyOnAFinishedJobDoesNotHoldBack() {
        let done = SumJob([1])
        done.start()
        let job = SumJob([2])
        job.addDependency(done)
        #expect(job.isReady)
        #expect(job.dependencies.count == 1)
    }

    @Test func completionHandlerRunsOnceWithTheJobFinished() {
        let queue = JobQueue(name: "completion")
        let job = SumJob([4, 5])
        let sawFinished = LockedValue<[Bool]>([])
        job.completionHandler = { [job] in sawFinished.withLock { $0.append(job.isFinished && job.result == 9) } }
        queue.add(job)
        job.waitUntilFinished()
        #expect(sawFinished.withLock { $0 } == [true])
        #expect(job.completionHandler == nil)
    }

    @Test func threadPriorityChoosesTheWorkerBand() {
        let queue = JobQueue(name: "bands")
        let seen = LockedValue<[Int: WorkQueue.Priority]>([:])
        let values: [Double] = [0.0, 0.3, 0.5, 0.9]
        var jobs: [Job] = []
        for (i, value) in values.enumerated() {
            let job = ClosureJob {
                let band = WorkQueue.Priority.allCases.first { WorkQueue.current === WorkQueue.global($0) }
                seen.withLock { $0[i] = band }
            }
            job.threadPriority = value
            jobs.append(job)
        }
        #expect(jobs.map(\.workPriority) == [.background, .low, .default, .high])
        queue.add(jobs, waitUntilFinished: true)
        #expect(seen.withLock { $0 } == [0: .background, 1: .low, 2: .default, 3: .high])
    }

    /// Listing 2-9 rebuilt: run a job by hand only if it is ready and not
    /// cancelled, a synchronous one on a thread of its own; otherwise retry
    /// later from a loop timer until it is ready or cancelled.
    @Test func manualExecutionRetriesFromATimerUntilReady() {
        let dependency = SumJob([1])
        let job = SumJob([20, 22])
        job.addDependency(dependency)
        @Sendable func perform(_ job: Job) -> Bool {
            guard job.isReady && !job.isCancelled else { return false }
            if job.isAsynchronous {
                job.start()
            } else {
                let join = startThread { job.start() }
                join()
            }
            return true
        }
        let ran = LockedValue(false)
        let attempts = LockedValue(0)
        let loopThread = RunningLoop(.epoll) { loop in
            let timer = LoopTimer(after: .milliseconds(2), interval: .milliseconds(2)) { timer in
                attempts.withLock { $0 += 1 }
                if perform(job) {
                    ran.withLock { $0 = true }
                    timer.invalidate()
                    loop.stop()
                } else if job.isCancelled {
                    timer.invalidate()
                    loop.stop()
                }
            }
            loop.add(timer)
            return loop.run(mode: .default, timeout: .seconds(30))
        }
        _ = NativeThread.sleep(for: .milliseconds(10))
        dependency.start()
        _ = loopThread.join()
        #expect(ran.withLock { $0 })
        #expect(job.result == 42)
        #expect(attempts.withLock { $0 } >= 1)
    }
}
