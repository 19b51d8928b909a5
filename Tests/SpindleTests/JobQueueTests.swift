import Spindle
import Testing
import TestSupport

/// A job that appends its number to a log when it runs.
private final class LoggingJob: Job, @unchecked Sendable {
    // @unchecked: as Job's; its own fields are immutable (the log locks).
    let number: Int
    let log: OrderLog
    init(_ number: Int, _ log: OrderLog) {
        self.number = number
        self.log = log
        super.init(name: "job \(number)")
    }
    override func main() throws { log.append(number) }
}

/// A job that runs until someone opens its gate, and says when it started.
private final class GatedJob: Job, @unchecked Sendable {
    // @unchecked: as Job's; its own fields are semaphores.
    let started = Semaphore(value: 0)
    let gate = Semaphore(value: 0)
    override func main() throws {
        _ = started.signal()
        gate.wait()
    }
}

@Suite("JobQueue")
struct JobQueueTests {
    @Test func addedJobsAllRunOnceAndWaitingSeesTheirWork() {
        let queue = JobQueue(name: "simple")
        #expect(queue.maxConcurrentJobCount == Topology.availableCPUCount)
        let log = OrderLog()
        let jobs = (0..<200).map { LoggingJob($0, log) }
        for job in jobs { queue.add(job) }
        queue.add { log.append(1_000) }
        queue.waitUntilAllJobsAreFinished()
        #expect(log.all.sorted() == Array(0..<200) + [1_000])
        #expect(jobs.allSatisfy { $0.isFinished })
        #expect(queue.jobCount == 0 && queue.jobs.isEmpty)
    }

    @Test func addManyWaitingUntilFinished() {
        let queue = JobQueue(name: "many")
        let log = OrderLog()
        let jobs = (0..<50).map { LoggingJob($0, log) }
        queue.add(jobs, waitUntilFinished: true)
        #expect(jobs.allSatisfy { $0.isFinished })
        #expect(log.count == 50)
    }

    @Test func dependenciesAcrossTwoQueues() {
        let first = JobQueue(name: "first")
        let second = JobQueue(name: "second")
        let log = OrderLog()
        // 0 (first) <- 1 (second) <- 2 (first) <- 3 (second), added in reverse.
        let chain = (0..<4).map { LoggingJob($0, log) }
        for i in 1..<4 { chain[i].addDependency(chain[i - 1]) }
        for i in stride(from: 3, through: 0, by: -1) {
            (i % 2 == 0 ? first : second).add(chain[i])
        }
        chain[3].waitUntilFinished()
        #expect(log.all == [0, 1, 2, 3])
    }

    @Test func cancelledDependencyStillReleasesItsDependents() {
        let queue = JobQueue(name: "cancelled-dependency")
        queue.isSuspended = true
        let log = OrderLog()
        let dependency = LoggingJob(0, log)
        let dependent = LoggingJob(1, log)
        dependent.addDependency(dependency)
        queue.add([dependency, dependent])
        dependency.cancel()
        queue.isSuspended = false
        queue.waitUntilAllJobsAreFinished()
        #expect(log.all == [1])
        #expect(dependency.isFinished && dependency.isCancelled)
        #expect(dependent.isFinished && !dependent.isCancelled)
    }

    @Test func cancellingAPendingJobMakesItReady() {
        let blocker = GatedJob(name: "blocker")
        let job = LoggingJob(1, OrderLog())
        job.addDependency(blocker)
        #expect(job.state == .pending)
        job.cancel()
        #expect(job.state == .ready)
        let queue = JobQueue(name: "cancel-pending")
        queue.add(job)
        job.waitUntilFinished()
        #expect(job.log.count == 0)
        #expect(!blocker.isFinished)
    }

    @Test func serialQueueRunsOneAtATimeByPriorityThenFirstAdded() {
        let queue = JobQueue(name: "serial")
        queue.maxConcurrentJobCount = 1
        queue.isSuspended = true
        let log = OrderLog()
        let occupancy = Occupancy()
        let priorities: [Job.QueuePriority] = [.low, .veryHigh, .normal, .veryLow, .high, .normal, .veryHigh]
        var jobs: [Job] = []
        for (i, priority) in priorities.enumerated() {
            let job = ClosureJob {
                #expect(occupancy.enter() == 1)
                log.append(i)
                occupancy.leave()
            }
            job.queuePriority = priority
            jobs.append(job)
        }
        queue.add(jobs)
        #expect(queue.jobs.count == jobs.count)
        #expect(zip(queue.jobs, jobs).allSatisfy { $0 === $1 })
        queue.isSuspended = false
        queue.waitUntilAllJobsAreFinished()
        #expect(log.all == [1, 6, 4, 2, 5, 0, 3])
        #expect(occupancy.peak == 1)
    }

    @Test func readinessComesBeforePriority() {
        let queue = JobQueue(name: "readiness")
        queue.maxConcurrentJobCount = 1
        let log = OrderLog()
        let gate = GatedJob(name: "gate")
        let other = JobQueue(name: "other")
        let high = LoggingJob(1, log)
        high.queuePriority = .veryHigh
        high.addDependency(gate)
        let low = LoggingJob(2, log)
        low.queuePriority = .veryLow
        queue.isSuspended = true
        queue.add([high, low])
        queue.isSuspended = false
        low.waitUntilFinished()
        #expect(log.all == [2])
        other.add(gate)
        _ = gate.gate.signal()
        queue.waitUntilAllJobsAreFinished()
        #expect(log.all == [2, 1])
    }

    @Test func removingADependencyStartsAQueuedJob() {
        let queue = JobQueue(name: "remove-dependency")
        let never = LoggingJob(0, OrderLog())
        let log = OrderLog()
        let job = LoggingJob(1, log)
        job.addDependency(never)
        queue.add(job)
        _ = NativeThread.sleep(for: .milliseconds(5))
        #expect(job.state == .pending && log.count == 0)
        job.removeDependency(never)
        job.waitUntilFinished()
        #expect(log.all == [1])
        #expect(job.dependencies.isEmpty)
    }

    @Test func waitsWithADeadlineTimeOutWhileJobsAreHeld() {
        let queue = JobQueue(name: "deadline")
        queue.isSuspended = true
        let job = LoggingJob(1, OrderLog())
        queue.add(job)
        #expect(job.waitUntilFinished(timeout: .milliseconds(5)) == .timedOut)
        #expect(queue.waitUntilAllJobsAreFinished(until: .now) == .timedOut)
        queue.isSuspended = false
        #expect(job.waitUntilFinished(timeout: .seconds(30)) == .completed)
        #expect(queue.waitUntilAllJobsAreFinished(timeout: .seconds(30)) == .completed)
    }

    @Test func maxConcurrentJobCountBoundsRunningJobs() {
        let queue = JobQueue(name: "bounded")
        queue.maxConcurrentJobCount = 3
        let occupancy = Occupancy()
        for _ in 0..<60 {
            queue.add {
                _ = occupancy.enter()
                _ = NativeThread.sleep(for: .microseconds(200))
                occupancy.leave()
            }
        }
        queue.waitUntilAllJobsAreFinished()
        #expect(occupancy.peak <= 3)
    }

    @Test func suspendingHoldsBackNewJobsButNotRunningOnes() {
        let queue = JobQueue(name: "suspend")
        queue.maxConcurrentJobCount = 1
        let running = GatedJob(name: "running")
        queue.add(running)
        running.started.wait()
        queue.isSuspended = true
        #expect(queue.isSuspended)
        let log = OrderLog()
        let later = (0..<5).map { LoggingJob($0, log) }
        queue.add(later)
        _ = running.gate.signal()
        running.waitUntilFinished()
        // The running job finished while suspended; nothing new started.
        _ = NativeThread.sleep(for: .milliseconds(20))
        #expect(log.count == 0)
        #expect(later.allSatisfy { $0.state == .ready })
        #expect(queue.jobCount == 5)
        queue.isSuspended = false
        queue.waitUntilAllJobsAreFinished()
        #expect(log.all == [0, 1, 2, 3, 4])
    }

    @Test func cancelAllSkipsQueuedJobsAndTellsRunningOnes() {
        let queue = JobQueue(name: "cancel-all")
        queue.maxConcurrentJobCount = 1
        let running = GatedJob(name: "running")
        queue.add(running)
        running.started.wait()
        let log = OrderLog()
        let queued = (0..<10).map { LoggingJob($0, log) }
        queue.add(queued)
        queue.cancelAll()
        #expect(running.isCancelled && running.isExecuting)
        _ = running.gate.signal()
        queue.waitUntilAllJobsAreFinished()
        #expect(log.count == 0)
        #expect(queued.allSatisfy { $0.isFinished && $0.isCancelled })
        // Jobs added after cancelAll run.
        let fresh = LoggingJob(99, log)
        queue.add(fresh)
        fresh.waitUntilFinished()
        #expect(log.all == [99])
    }

    @Test func waitingForAllIncludesJobsAddedMeanwhile() {
        let queue = JobQueue(name: "meanwhile")
        let log = OrderLog()
        let first = ClosureJob {
            _ = NativeThread.sleep(for: .milliseconds(5))
            queue.add { log.append(2) }
            log.append(1)
        }
        queue.add(first)
        queue.waitUntilAllJobsAreFinished()
        #expect(log.all.sorted() == [1, 2])
    }

    @Test func asynchronousJobHoldsItsSlotUntilItFinishes() {
        final class Later: Job, @unchecked Sendable {
            // @unchecked: as Job's; its own fields are semaphores.
            let release = Semaphore(value: 0)
            let started = Semaphore(value: 0)
            override var isAsynchronous: Bool { true }
            override func main() throws {
                _ = started.signal()
                WorkQueue.global().async { [self] in
                    release.wait()
                    finish()
                }
            }
        }
        let queue = JobQueue(name: "async-slot")
        queue.maxConcurrentJobCount = 1
        let job = Later()
        let log = OrderLog()
        let next = LoggingJob(1, log)
        queue.add(job)
        queue.add(next)
        job.started.wait()
        _ = NativeThread.sleep(for: .milliseconds(20))
        #expect(job.isExecuting)
        #expect(log.count == 0)
        _ = job.release.signal()
        queue.waitUntilAllJobsAreFinished()
        #expect(log.all == [1])
    }

    @Test func waitingInsideAJobDoesNotStallThePool() {
        // Jobs that wait for later jobs, more of them than the pool has
        // workers: the waits are blocking regions, so the pool compensates.
        let queue = JobQueue(name: "waiters")
        queue.maxConcurrentJobCount = 64
        let count = Topology.availableCPUCount * 4
        let targets = (0..<count).map { _ in GatedJob() }
        var waiters: [Job] = []
        for target in targets {
            waiters.append(ClosureJob { target.waitUntilFinished() })
        }
        queue.add(waiters)
        queue.add(targets)
        for target in targets { _ = target.gate.signal() }
        queue.waitUntilAllJobsAreFinished()
        #expect(waiters.allSatisfy { $0.isFinished })
    }

    @Test func droppingASuspendedQueueFinishesItsUnrunJobsAndFreesThem() {
        // A suspended queue nobody holds can never be resumed: its jobs that
        // never ran finish cancelled, without running, when it goes, so that
        // a dependent in another queue and its waiter are released, and the
        // jobs are freed (as a dropped suspended WorkQueue frees its items).
        let other = JobQueue(name: "other")
        let ran = OrderLog()
        let cancelledAtCompletion = OrderLog()
        weak var watchedQueue: JobQueue?
        weak var first: Job?
        weak var second: Job?
        weak var watchedDependent: Job?
        do {
            let dependent = ClosureJob(name: "dependent") { ran.append(3) }
            watchedDependent = dependent
            do {
                let queue = JobQueue(name: "dropped")
                watchedQueue = queue
                queue.isSuspended = true
                let a = ClosureJob(name: "a") { ran.append(1) }
                let b = ClosureJob(name: "b") { ran.append(2) }
                b.addDependency(a)
                for (number, job) in [(1, a), (2, b)] {
                    job.completionHandler = { [unowned job] in
                        if job.isCancelled { cancelledAtCompletion.append(number) }
                    }
                }
                queue.add([a, b])
                dependent.addDependency(b)
                other.add(dependent)
                first = a
                second = b
            }
            // The waiter on the dependent is released.
            #expect(dependent.waitUntilFinished(timeout: .seconds(30)) == .completed)
            #expect(!dependent.isCancelled)
        }
        #expect(other.waitUntilAllJobsAreFinished(timeout: .seconds(30)) == .completed)
        #expect(watchedQueue == nil, "a dropped suspended JobQueue was kept alive")
        // The dependent's worker lets go of it just after its waiters return.
        let deadline = MonotonicClock.now.advanced(by: .seconds(30))
        while (first != nil || second != nil || watchedDependent != nil) && MonotonicClock.now < deadline {
            NativeThread.sleep(for: .milliseconds(1))
        }
        #expect(first == nil && second == nil, "the jobs of a dropped suspended JobQueue were never freed")
        #expect(watchedDependent == nil)
        #expect(ran.all == [3], "only the dependent's work runs")
        #expect(cancelledAtCompletion.all.sorted() == [1, 2])
    }

    @Test func droppingARunningQueueLetsItsJobsRun() {
        // Not suspended: a queue nobody holds keeps itself alive while it
        // has jobs, which run (and wait for their dependencies) as usual.
        let log = OrderLog()
        let blocker = ClosureJob(name: "blocker") {}
        let late = ClosureJob(name: "late") { log.append(1) }
        weak var watchedQueue: JobQueue?
        do {
            let queue = JobQueue(name: "dropped.running")
            watchedQueue = queue
            late.addDependency(blocker)
            queue.add(late)
        }
        #expect(watchedQueue != nil, "a queue with unfinished jobs was freed")
        blocker.start()
        #expect(late.waitUntilFinished(timeout: .seconds(30)) == .completed)
        #expect(log.all == [1])
        #expect(!late.isCancelled)
    }
}
