import Spindle
import Testing
import TestSupport

/// Misuse of jobs stops the process with a message naming the jobs; each
/// case runs in a child process (exit test).
@Suite("Job misuse")
struct JobMisuseTests {
    private func stderr(_ r: ExitTest.Result?) -> String {
        String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
    }

    @Test func dependencyCycleNamesTheJobs() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let a = Job(name: "fetch")
            let b = Job(name: "parse")
            let c = Job(name: "render")
            b.addDependency(a)
            c.addDependency(b)
            a.addDependency(c)
        }
        #expect(stderr(r).contains(
            "Job.addDependency(_:): making 'fetch' depend on 'render' closes the cycle 'fetch' -> 'render' -> 'parse' -> 'fetch'"))
    }

    @Test func dependencyOnItself() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let a = Job(name: "loner")
            a.addDependency(a)
        }
        #expect(stderr(r).contains("Job.addDependency(_:): 'loner' cannot depend on itself"))
    }

    @Test func startWhenNotReady() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let a = Job(name: "first")
            let b = Job(name: "second")
            b.addDependency(a)
            b.start()
        }
        #expect(stderr(r).contains("Job.start(): 'second' is not ready: 1 of its dependencies have not finished"))
    }

    @Test func startTwice() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let a = Job(name: "once")
            a.start()
            a.start()
        }
        #expect(stderr(r).contains("Job.start(): 'once' has already finished"))
    }

    @Test func startWhileExecuting() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            final class Slow: Job, @unchecked Sendable {
                // @unchecked: as Job's; no state of its own.
                override var isAsynchronous: Bool { true }
                override func main() throws {}
            }
            let a = Slow(name: "slow")
            a.start()
            a.start()
        }
        #expect(stderr(r).contains("Job.start(): 'slow' has already started"))
    }

    @Test func startAQueuedJob() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let queue = JobQueue(name: "q")
            queue.isSuspended = true
            let a = Job(name: "queued")
            queue.add(a)
            a.start()
        }
        #expect(stderr(r).contains("Job.start(): 'queued' is in a JobQueue"))
    }

    @Test func addToTwoQueues() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let first = JobQueue(name: "one")
            let second = JobQueue(name: "two")
            first.isSuspended = true
            let a = Job(name: "shared")
            first.add(a)
            second.add(a)
        }
        #expect(stderr(r).contains("JobQueue.add(_:): 'shared' is already in a JobQueue"))
    }

    @Test func dependencyAddedAfterStart() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let a = Job(name: "done")
            a.start()
            a.addDependency(Job(name: "late"))
        }
        #expect(stderr(r).contains("Job.addDependency(_:): 'done' has already started"))
    }

    @Test func finishOnASynchronousJob() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            Job(name: "sync").finish()
        }
        #expect(stderr(r).contains("Job.finish(throwing:): 'sync' is synchronous"))
    }

    @Test func finishTwice() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            final class Twice: Job, @unchecked Sendable {
                // @unchecked: as Job's; no state of its own.
                override var isAsynchronous: Bool { true }
                override func main() throws { finish() }
            }
            let a = Twice(name: "twice")
            a.start()
            a.finish()
        }
        #expect(stderr(r).contains("Job.finish(throwing:): 'twice' has already finished"))
    }

    @Test func closureAddedAfterStart() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let a = ClosureJob(name: "closures") {}
            a.start()
            a.addClosure {}
        }
        #expect(stderr(r).contains("ClosureJob.addClosure(_:): 'closures' has already started"))
    }

    @Test func completionHandlerSetAfterFinish() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let a = Job(name: "late-handler")
            a.start()
            a.completionHandler = {}
        }
        #expect(stderr(r).contains("Job.completionHandler: 'late-handler' has already started"))
    }

    @Test func priorityChangedAfterQueued() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let queue = JobQueue(name: "q")
            queue.isSuspended = true
            let a = Job(name: "queued")
            queue.add(a)
            a.queuePriority = .high
        }
        #expect(stderr(r).contains("Job.queuePriority: 'queued' was already queued or started"))
    }

    @Test func maxConcurrentJobCountBelowOne() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            JobQueue(name: "q").maxConcurrentJobCount = 0
        }
        #expect(stderr(r).contains("JobQueue.maxConcurrentJobCount: 0 is below 1"))
    }
}
