import Spindle
import Testing
import TestSupport

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

    /// Needs the main thread in the child process. Swift Testing's child
    /// parks its main thread in `dispatch_main()` (it has exited from
    /// libdispatch's point of view), and runs the exit test's body and the
    /// main actor on a dispatch worker; so when the main actor is not on the
    /// main thread the child exits 77 and the test is cancelled (skipped)
    /// with that reason, rather than asserting something it cannot reach.
    @Test func syncOntoTheMainQueueFromTheMainThread() async throws {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let onMain = await MainActor.run { NativeThread.isMainThread }
            if !onMain { exit(77) }
            await MainActor.run { WorkQueue.main.sync {} }
        }
        if case .exitCode(77)? = r?.exitStatus {
            try Test.cancel("the exit test's child runs no code on its main thread (the main actor runs on a dispatch worker there), so sync onto WorkQueue.main from the main thread cannot be reached")
        }
        #expect(stderr(r).contains(
            "WorkQueue.sync(_:) onto 'spindle.main' on the main thread: the main queue runs its items on this thread, which would wait for itself forever"))
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
