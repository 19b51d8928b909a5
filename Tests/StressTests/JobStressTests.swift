import Spindle
import Testing
import TestSupport

/// A job that checks, when its work runs, that it runs for the first time
/// and that every dependency has finished; some are asynchronous and finish
/// from another worker. Its events go to a log of its own.
private final class CheckedJob: Job, @unchecked Sendable {
    // @unchecked: `checkedDependencies` is written before the job is queued
    // and only read by its work after; the rest is immutable or locked.
    let index: Int
    let runs: AtomicCounters
    let late: AtomicCounters
    let asynchronous: Bool
    var checkedDependencies: [Job] = []
    let seen = LockedValue<[Job.Event]>([])

    init(index: Int, runs: AtomicCounters, late: AtomicCounters, asynchronous: Bool) {
        self.index = index
        self.runs = runs
        self.late = late
        self.asynchronous = asynchronous
        super.init(name: "job \(index)")
    }

    override var isAsynchronous: Bool { asynchronous }

    override func main() throws {
        runs.add(index)
        for dependency in checkedDependencies where !dependency.isFinished { late.add(0) }
        if asynchronous {
            WorkQueue.global().async { self.finish() }
        }
    }
}

/// Whether `events` is a path the job state machine allows, starting ready
/// with nothing started, ending finished; and whether the work ran.
private func isValidLife(_ events: [Job.Event]) -> (valid: Bool, executed: Bool) {
    var ready = true
    var cancelled = false
    var executing = false
    var finished = false
    for event in events {
        guard !finished else { return (false, executing) }
        switch event {
        case .pending:
            guard ready, !executing, !cancelled else { return (false, executing) }
            ready = false
        case .ready:
            guard !ready, !executing else { return (false, executing) }
            ready = true
        case .cancelled:
            guard !cancelled else { return (false, executing) }
            cancelled = true
        case .executing:
            guard ready, !executing, !cancelled else { return (false, executing) }
            executing = true
        case .finished:
            guard ready || executing else { return (false, executing) }
            finished = true
        }
    }
    return (finished, executing)
}

@Suite("Job stress")
struct JobStressTests {
    /// Random dependency graphs of 10^4 jobs over three queues (random
    /// queue and thread priorities, random widths), added by three threads
    /// while two others cancel random jobs and one suspends, resumes and
    /// resizes the queues. Every job finishes; every job whose work ran ran
    /// it exactly once, after all its dependencies had finished; no work ran
    /// for a job cancelled before it started; every job's observed events
    /// are a path of the state machine, each once, ending in finished.
    @Test(arguments: [1, 2])
    func randomGraphsOverThreeQueues(seed: Int) {
        // The 10^4 jobs (CI's too); 10^5 at full size, with the
        // cancellations and suspensions scaled alike.
        let count = stressSize(ci: 10_000, full: 100_000)
        let scale = count / 10_000
        let runs = AtomicCounters(count)
        let late = AtomicCounters(1)
        var random = XorShift(seed: seed)
        let queues = (0..<3).map { JobQueue(name: "stress \($0)") }
        for queue in queues { queue.maxConcurrentJobCount = 1 + random.next(4) }
        let threadPriorities: [Double] = [0.5, 0.5, 0.5, 0.9, 0.9, 0.3, 0.1]
        var jobs: [CheckedJob] = []
        var home: [Int] = []
        jobs.reserveCapacity(count)
        for i in 0..<count {
            let job = CheckedJob(index: i, runs: runs, late: late, asynchronous: random.next(10) == 0)
            job.observe { [seen = job.seen] event in seen.withLock { $0.append(event) } }
            job.queuePriority = Job.QueuePriority.allCases[random.next(5)]
            job.threadPriority = threadPriorities[random.next(threadPriorities.count)]
            if i > 0 {
                for _ in 0..<random.next(4) {
                    job.addDependency(jobs[i - 1 - random.next(min(i, 200))])
                }
                if random.next(20) == 0, let first = job.dependencies.first {
                    job.removeDependency(first)
                }
            }
            jobs.append(job)
            home.append(random.next(3))
        }
        // Edges added to jobs that others already depend on: the cycle
        // check walks the graph for these (lower numbers never depend on
        // higher ones, so none closes a cycle).
        for _ in 0..<100 {
            let later = 1 + random.next(count - 1)
            jobs[later].addDependency(jobs[random.next(later)])
        }
        for job in jobs { job.checkedDependencies = job.dependencies }

        let shared = Unchecked((jobs, queues, home))
        runThreads(6) { thread in
            let (jobs, queues, home) = shared.value
            var random = XorShift(seed: seed * 100 + thread)
            switch thread {
            case 0, 1, 2:
                var i = thread
                while i < count {
                    queues[home[i]].add(jobs[i])
                    i += 3
                }
            case 3, 4:
                for _ in 0..<(400 * scale) {
                    let i = random.next(count)
                    jobs[i].cancel()
                    if random.next(8) == 0 { _ = NativeThread.sleep(for: .microseconds(100)) }
                }
            default:
                for round in 0..<(60 * scale) {
                    let queue = queues[random.next(3)]
                    queue.isSuspended = true
                    if round % 5 == 0 { queue.maxConcurrentJobCount = 1 + random.next(4) }
                    _ = NativeThread.sleep(for: .microseconds(200))
                    queue.isSuspended = false
                }
                for queue in queues { queue.isSuspended = false }
            }
        }
        for queue in queues { queue.waitUntilAllJobsAreFinished() }

        #expect(jobs.allSatisfy { $0.isFinished })
        #expect(late[0] == 0, "work ran before a dependency finished")
        // A queue's wait returns only after every job's observers have been
        // handed `finished`, even when another thread was delivering.
        let unheard = jobs.filter { $0.seen.withLock { $0.last != .finished } }.count
        #expect(unheard == 0, "jobs whose observers had not heard finished when the wait returned")
        var badLives = 0
        var badRuns = 0
        var cancelledRuns = 0
        var executedJobs = 0
        var cancelledJobs = 0
        for job in jobs {
            let events = job.seen.withLock { $0 }
            let (valid, executed) = isValidLife(events)
            if !valid { badLives += 1 }
            if executed { executedJobs += 1 }
            if job.isCancelled { cancelledJobs += 1 }
            if runs[job.index] != (executed ? 1 : 0) { badRuns += 1 }
            if let c = events.firstIndex(of: .cancelled), let e = events.firstIndex(of: .executing), c < e {
                cancelledRuns += 1
            }
            if job.isCancelled && !executed { #expect(runs[job.index] == 0) }
        }
        #expect(badLives == 0, "event orders the state machine does not allow")
        #expect(badRuns == 0, "work that ran other than exactly once for a job that executed")
        #expect(cancelledRuns == 0)
        // The run exercised both paths.
        #expect(executedJobs > count / 2 && cancelledJobs > 0, "\(executedJobs) executed, \(cancelledJobs) cancelled")
        #expect(queues.allSatisfy { $0.jobCount == 0 })
        // Each job: finished, heard finished, a legal life, and run the right number of times.
        StressReport.record(operations: count, threads: 6, checks: 4 * count + 6)
    }

    /// Four threads add dependencies among the same 400 jobs at once (each
    /// lower-numbered job on a higher-numbered one, so the union is acyclic
    /// and every check must pass), then one queue runs them all: every job
    /// finishes, after the jobs it depends on.
    @Test func concurrentEdgesAreAllHonoured() {
        // Rounds of fresh jobs, not more jobs per round: each added edge
        // walks the graph for a cycle, so denser graphs cost more than linearly.
        let rounds = stressSize(ci: 1, full: 20)
        var edges = 0
        for _ in 0..<rounds { edges += addEdgesConcurrentlyThenRun(count: 400) }
        // Each job checked finished, each edge checked in order.
        StressReport.record(operations: rounds * 4 * 1_000, threads: 4, checks: rounds * 400 + edges)
    }

    /// One round of `concurrentEdgesAreAllHonoured`; returns the edges checked.
    private func addEdgesConcurrentlyThenRun(count: Int) -> Int {
        let order = OrderLog()
        let jobs = (0..<count).map { i in ClosureJob(name: "n\(i)") { order.append(i) } }
        let shared = Unchecked(jobs)
        runThreads(4) { thread in
            let jobs = shared.value
            var random = XorShift(seed: 7 + thread)
            for _ in 0..<1_000 {
                let a = random.next(count)
                let b = random.next(count)
                guard a != b else { continue }
                jobs[min(a, b)].addDependency(jobs[max(a, b)])
            }
        }
        let queue = JobQueue(name: "edges")
        queue.add(jobs)
        queue.waitUntilAllJobsAreFinished()
        #expect(jobs.allSatisfy { $0.isFinished })
        var position = [Int](repeating: 0, count: count)
        for (p, i) in order.all.enumerated() { position[i] = p }
        var violations = 0
        var edges = 0
        for job in jobs {
            let i = Int(job.name!.dropFirst())!
            for dependency in job.dependencies {
                let d = Int(dependency.name!.dropFirst())!
                if position[d] > position[i] { violations += 1 }
                edges += 1
            }
        }
        #expect(violations == 0)
        return edges
    }
}
