import Spindle
import Testing
import TestSupport
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Misuse of queues, groups and work items stops the process with a message
/// naming what went wrong; each case runs in a child process (exit test). A
/// case that should wait in an item blocks its submitter on a latch with a
/// timeout, so a missing check fails the test (the child exits 0) instead of
/// hanging it.
@Suite("WorkQueue misuse")
struct WorkQueueMisuseTests {
    private func stderr(_ r: ExitTest.Result?) -> String {
        String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
    }

    @Test func syncOntoTheSerialQueueTheCallerRunsOn() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let queue = WorkQueue(label: "misuse.serial")
            queue.async { queue.sync {} }
            Latch().wait(seconds: 30)
        }
        #expect(stderr(r).contains(
            "WorkQueue.sync(_:) onto 'misuse.serial' from an item running on 'misuse.serial': the queue would wait for the caller, which waits for the queue; this deadlock is refused"))
    }

    @Test func syncOntoAQueueWhoseTargetChainReachesTheCallersSerialQueue() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let root = WorkQueue(label: "misuse.root")
            let middle = WorkQueue(label: "misuse.middle", kind: .concurrent, target: root)
            let leaf = WorkQueue(label: "misuse.leaf", target: middle)
            root.async { leaf.sync {} }
            Latch().wait(seconds: 30)
        }
        #expect(stderr(r).contains(
            "WorkQueue.sync(_:) onto 'misuse.leaf' through its target chain ('misuse.root') from an item running on 'misuse.root'"))
    }

    @Test func syncBarrierOntoTheConcurrentQueueTheCallerRunsOn() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let queue = WorkQueue(label: "misuse.concurrent", kind: .concurrent)
            queue.async { queue.syncBarrier {} }
            Latch().wait(seconds: 30)
        }
        #expect(stderr(r).contains(
            "WorkQueue.syncBarrier(_:) onto 'misuse.concurrent' from an item running on 'misuse.concurrent'"))
    }

    /// `apply` on a serial queue is one `sync` item, so the message names
    /// `sync(_:)`; what matters is that it names the queue and the deadlock.
    @Test func applyOnTheSerialQueueTheCallerRunsOn() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let queue = WorkQueue(label: "misuse.apply")
            queue.async { queue.apply(iterations: 4) { _ in } }
            Latch().wait(seconds: 30)
        }
        #expect(stderr(r).contains("onto 'misuse.apply' from an item running on 'misuse.apply'"))
        #expect(stderr(r).contains("this deadlock is refused"))
    }

    /// A concurrent queue whose chain reaches the serial queue the caller
    /// runs on: `apply` holds that chain as `sync` does, so it would wait for
    /// the caller.
    @Test func applyOntoAConcurrentQueueWhoseChainReachesTheCallersSerialQueue() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let root = WorkQueue(label: "misuse.applyRoot")
            let leaf = WorkQueue(label: "misuse.applyLeaf", kind: .concurrent, target: root)
            root.async { leaf.apply(iterations: 4) { _ in } }
            Latch().wait(seconds: 30)
        }
        #expect(stderr(r).contains(
            "WorkQueue.apply(iterations:) onto 'misuse.applyLeaf' through its target chain ('misuse.applyRoot') from an item running on 'misuse.applyRoot'"))
    }

    /// Needs a program's own main thread, which an exit test's child does
    /// not give its body (Swift Testing parks it in `dispatch_main()` and
    /// runs the body on a dispatch worker): so the misuse runs in
    /// `MisuseProbe`, a small executable built beside the tests, started as
    /// a child process with nothing else on its main thread.
    @Test func syncOntoTheMainQueueFromTheMainThread() throws {
        let text = try runMisuseProbe("sync-main-from-main")
        #expect(text.contains(
            "WorkQueue.sync(_:) onto 'spindle.main' on the main thread: the main queue runs its items on this thread, which would wait for itself forever"),
            "the probe's standard error: \(text)")
    }

    /// A queue of one's own that targets the main queue, `sync` on the main
    /// thread outside any item: its item could only run on this thread.
    @Test func syncOntoAQueueTargetingTheMainQueueFromTheMainThread() throws {
        let text = try runMisuseProbe("sync-main-chain-from-main")
        #expect(text.contains(
            "WorkQueue.sync(_:) onto 'probe.onMain' on the main thread: the main queue (the target of 'probe.onMain') runs its items on this thread"),
            "the probe's standard error: \(text)")
    }

    @Test func applyOntoAQueueTargetingTheMainQueueFromTheMainThread() throws {
        let text = try runMisuseProbe("apply-main-chain-from-main")
        #expect(text.contains(
            "WorkQueue.apply(iterations:) onto 'probe.onMain' on the main thread: the main queue (the target of 'probe.onMain')"),
            "the probe's standard error: \(text)")
    }

    /// A barrier on a concurrent queue runs alone: `sync` onto a queue that
    /// targets it would queue an item there that cannot start until the
    /// barrier returns.
    @Test func syncFromABarrierOntoAQueueTargetingItsQueue() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let shared = WorkQueue(label: "misuse.shared", kind: .concurrent)
            let child = WorkQueue(label: "misuse.child", target: shared)
            shared.asyncBarrier { child.sync {} }
            Latch().wait(seconds: 30)
        }
        #expect(stderr(r).contains(
            "WorkQueue.sync(_:) onto 'misuse.child' through its target chain ('misuse.shared') from a barrier running on 'misuse.shared'"))
    }

    @Test func applyFromABarrierOntoAQueueTargetingItsQueue() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let shared = WorkQueue(label: "misuse.shared", kind: .concurrent)
            let child = WorkQueue(label: "misuse.child", kind: .concurrent, target: shared)
            shared.asyncBarrier { child.apply(iterations: 8) { _ in } }
            Latch().wait(seconds: 30)
        }
        #expect(stderr(r).contains(
            "WorkQueue.apply(iterations:) onto 'misuse.child' through its target chain ('misuse.shared') from a barrier running on 'misuse.shared'"))
    }

    /// Not a barrier: an ordinary item of the concurrent queue may `sync`
    /// onto a queue that targets it (the item runs beside the caller).
    @Test func syncFromAnOrdinaryItemOntoAQueueTargetingItsQueueRuns() {
        let shared = WorkQueue(label: "misuse.shared", kind: .concurrent)
        let child = WorkQueue(label: "misuse.child", target: shared)
        let ran = LockedValue(false)
        shared.sync { child.sync { ran.withLock { $0 = true } } }
        #expect(ran.withLock { $0 })
    }

    /// Runs `MisuseProbe` with `argument` as a child process; expects it to
    /// stop, and returns its standard error.
    private func runMisuseProbe(_ argument: String) throws -> String {
        let probe = try misuseProbe()
        let child = Process()
        child.executableURL = probe
        child.arguments = [argument]
        // Without the runtime's backtracer: the message is all the test
        // reads. Two probes crashing at once under ThreadSanitizer left
        // their backtracers blocked on a socket read for good, orphaned,
        // each holding a socket inherited from the test process and this
        // pipe's write end, so the read below never ended (seen with
        // `swift test` run by hand; scripts/test turns the backtracer off
        // for the whole run).
        child.environment = ProcessInfo.processInfo.environment.merging(["SWIFT_BACKTRACE": "enable=no"]) { $1 }
        let errors = Pipe()
        child.standardError = errors
        child.standardOutput = FileHandle.nullDevice
        try child.run()
        let text = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        child.waitUntilExit()
        #expect(child.terminationReason == .uncaughtSignal || child.terminationStatus != 0, "the probe returned: \(text)")
        return text
    }

    /// The `MisuseProbe` executable of this build: `swift build
    /// --build-tests` and `swift test` build it into the directory of the
    /// test runner.
    private func misuseProbe() throws -> URL {
        let runner = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        var directory = runner.deletingLastPathComponent()
        // The runner may be inside a bundle directory (`….xctest/…`).
        for _ in 0..<3 {
            let candidate = directory.appendingPathComponent("MisuseProbe")
            if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate }
            directory = directory.deletingLastPathComponent()
        }
        Issue.record("MisuseProbe is not built beside the test runner \(runner.path); build it with `swift build --build-tests`")
        throw CancellationError()
    }

    @Test func resumeMoreOftenThanSuspend() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let queue = WorkQueue(label: "misuse.resume")
            queue.suspend()
            queue.resume()
            queue.resume()
        }
        #expect(stderr(r).contains(
            "WorkQueue.resume(): 'misuse.resume' is not suspended; resume() was called more times than suspend()"))
    }

    @Test func groupLeaveWithoutEnter() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let group = WorkGroup()
            group.enter()
            group.leave()
            group.leave()
        }
        #expect(stderr(r).contains("WorkGroup.leave(): the group is empty; leave() was called more times than enter()"))
    }

    @Test func setTargetClosingACycle() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let a = WorkQueue(label: "misuse.a")
            let b = WorkQueue(label: "misuse.b", target: a)
            a.setTarget(b)
        }
        #expect(stderr(r).contains("WorkQueue.setTarget(_:): the target chain 'misuse.a' -> 'misuse.b' -> 'misuse.a' is a cycle"))
    }

    @Test func setTargetToItself() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let a = WorkQueue(label: "misuse.self", kind: .concurrent)
            a.setTarget(a)
        }
        #expect(stderr(r).contains("WorkQueue.setTarget(_:): the target chain 'misuse.self' -> 'misuse.self' is a cycle"))
    }

    /// The main queue has no target either. (Found while writing these: the
    /// message reads "is a the main queue".)
    @Test func setTargetOfTheMainQueue() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            WorkQueue.main.setTarget(.global())
        }
        #expect(stderr(r).contains(
            "WorkQueue.setTarget(_:): 'spindle.main' is the main queue; only queues you create have a target"))
    }

    @Test func asyncBarrierOnAGlobalQueue() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            WorkQueue.global().asyncBarrier {}
        }
        #expect(stderr(r).contains(
            "WorkQueue.asyncBarrier(_:): 'spindle.global.default' is a global queue, which other code shares; barriers need a concurrent queue of your own"))
    }

    @Test func suspendOfAGlobalQueue() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            WorkQueue.global(.high).suspend()
        }
        #expect(stderr(r).contains(
            "WorkQueue.suspend(): 'spindle.global.high' is a global queue, which other code shares; suspend a queue of your own"))
    }

    @Test func setTargetOfAGlobalQueue() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            WorkQueue.global(.low).setTarget(WorkQueue(label: "misuse.any"))
        }
        #expect(stderr(r).contains(
            "WorkQueue.setTarget(_:): 'spindle.global.low' is a global queue; only queues you create have a target"))
    }

    @Test func workItemSubmittedTwice() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let item = WorkItem {}
            let queue = WorkQueue(label: "misuse.item")
            queue.async(item)
            try! await item.wait()  // never cancelled
            queue.async(item)
            Latch().wait(seconds: 30)
        }
        #expect(stderr(r).contains(
            "WorkQueue.async(_:): this WorkItem was already submitted or performed; a work item runs at most once"))
    }
}
