import Spindle
import Testing
import TestSupport

@Suite("WorkQueue")
struct WorkQueueTests {
    @Test func serialQueueRunsItemsOneAtATimeInOrder() {
        let queue = WorkQueue(label: "test.serial")
        let tally = OrderLog()
        let occupancy = Occupancy()
        let done = Latch()
        for i in 0..<1000 {
            queue.async {
                #expect(occupancy.enter() == 1)
                tally.append(i)
                occupancy.leave()
                if i == 999 { done.countDown() }
            }
        }
        #expect(done.wait())
        #expect(tally.all == Array(0..<1000))
        #expect(occupancy.peak == 1)
    }

    @Test func syncReturnsTheValueAndRethrows() throws {
        struct Oops: Error {}
        let queue = WorkQueue(label: "test.sync")
        #expect(queue.sync { 42 } == 42)
        #expect(throws: Oops.self) { try queue.sync { () throws(Oops) -> Int in throw Oops() } }
        // Behind queued items: the slow path.
        let tally = OrderLog()
        for i in 0..<100 { queue.async { tally.append(i) } }
        let seen = queue.sync { tally.count }
        #expect(seen == 100)
    }

    @Test func syncOnAnIdleQueueRunsOnTheCallersThread() {
        let queue = WorkQueue(label: "test.idle")
        let caller = NativeThread.current
        let ran = queue.sync { NativeThread.current === caller && WorkQueue.current === queue }
        #expect(ran)
    }

    @Test func concurrentQueueRunsItemsAtOnceAndBarriersAlone() {
        let queue = WorkQueue(label: "test.concurrent", kind: .concurrent)
        let occupancy = Occupancy()
        let inBarrier = Occupancy()
        let group = WorkGroup()
        for round in 0..<20 {
            for _ in 0..<20 {
                queue.async(group: group) {
                    _ = occupancy.enter()
                    #expect(inBarrier.peak == 0 || true)
                    for _ in 0..<1000 { spinLoopHint() }
                    occupancy.leave()
                }
            }
            queue.asyncBarrier(group: group) {
                #expect(occupancy.enter() == 1, "barrier \(round) ran beside another item")
                occupancy.leave()
            }
        }
        #expect(group.wait(timeout: .seconds(30)) == .completed)
        #expect(queue.syncBarrier { 7 } == 7)
    }

    @Test func globalQueuesRunItemsAndReportThemselvesCurrent() {
        let group = WorkGroup()
        let tally = OrderLog()
        for priority in WorkQueue.Priority.allCases {
            let queue = WorkQueue.global(priority)
            queue.async(group: group) {
                if WorkQueue.current === queue { tally.append(priority.rawValue) }
            }
        }
        #expect(group.wait(timeout: .seconds(30)) == .completed)
        #expect(tally.all.sorted() == [0, 1, 2, 3])
        #expect(WorkQueue.current == nil)
    }

    @Test func suspendHoldsItemsUntilResume() {
        let queue = WorkQueue(label: "test.suspend")
        let tally = OrderLog()
        queue.suspend()
        queue.suspend()
        for i in 0..<10 { queue.async { tally.append(i) } }
        NativeThread.sleep(for: .milliseconds(20))
        #expect(tally.count == 0)
        queue.resume()
        NativeThread.sleep(for: .milliseconds(20))
        #expect(tally.count == 0)
        queue.resume()
        queue.sync {}
        #expect(tally.all == Array(0..<10))
    }

    @Test func targetChainSerializesWithItsRoot() {
        let root = WorkQueue(label: "test.root")
        let children = (0..<4).map { WorkQueue(label: "test.child\($0)", kind: .concurrent, target: root) }
        let occupancy = Occupancy()
        let group = WorkGroup()
        for child in children {
            for _ in 0..<50 {
                child.async(group: group) {
                    #expect(occupancy.enter() == 1)
                    occupancy.leave()
                }
            }
        }
        #expect(group.wait(timeout: .seconds(30)) == .completed)
        #expect(occupancy.peak == 1)
        #expect(children[0].sync { root.isCurrent && children[0].isCurrent && !children[1].isCurrent })
    }

    @Test func applyVisitsEveryIndexOnce() {
        let n = 100_003
        let hits = UnsafeMutablePointer<Int>.allocate(capacity: n)
        hits.initialize(repeating: 0, count: n)
        defer { hits.deallocate() }
        let address = Int(bitPattern: hits)
        WorkQueue.concurrentPerform(iterations: n) { i in
            let p = UnsafeMutablePointer<Int>(bitPattern: address)!
            AtomicMemory.add(1, to: p + i, ordering: .relaxed)
        }
        #expect((0..<n).allSatisfy { hits[$0] == 1 })
        // The guide's striding, with a remainder.
        hits.update(repeating: 0, count: n)
        WorkQueue(label: "c", kind: .concurrent).apply(iterations: n, stride: 137) { i in
            let p = UnsafeMutablePointer<Int>(bitPattern: address)!
            AtomicMemory.add(1, to: p + i, ordering: .relaxed)
        }
        #expect((0..<n).allSatisfy { hits[$0] == 1 })
        // A serial queue runs them in order.
        let tally = OrderLog()
        WorkQueue(label: "s").apply(iterations: 100) { tally.append($0) }
        #expect(tally.all == Array(0..<100))
    }

    @Test func asyncAfterNeverRunsEarly() {
        let queue = WorkQueue(label: "test.after")
        let start = MonotonicClock.now
        let done = Latch(3)
        let tally = OrderLog()
        for (i, ms) in [30, 10, 20].enumerated() {
            let deadline = start.advanced(by: .milliseconds(ms))
            queue.async(after: deadline) {
                #expect(MonotonicClock.now >= deadline)
                tally.append(i)
                done.countDown()
            }
        }
        #expect(done.wait())
        #expect(tally.all == [1, 2, 0])
    }

    @Test func groupWaitsNotifiesAndTimesOut() {
        let group = WorkGroup()
        #expect(group.wait(until: .now) == .completed)
        group.enter()
        #expect(group.wait(timeout: .milliseconds(5)) == .timedOut)
        let notified = Latch()
        group.notify(on: .global()) { notified.countDown() }
        #expect(!notified.isOpen)
        WorkQueue.global().async { group.leave() }
        #expect(group.wait(timeout: .seconds(30)) == .completed)
        #expect(notified.wait())
    }

    @Test func workItemsCancelWaitAndNotify() {
        let queue = WorkQueue(label: "test.items")
        queue.suspend()
        let ran = OrderLog()
        let cancelled = WorkItem { ran.append(1) }
        let kept = WorkItem { ran.append(2) }
        queue.async(cancelled)
        queue.async(kept)
        cancelled.cancel()
        let notified = Latch()
        cancelled.notify(on: .global()) { notified.countDown() }
        queue.resume()
        #expect(kept.wait(timeout: .seconds(30)) == .completed)
        #expect(cancelled.wait(timeout: .seconds(30)) == .completed)
        #expect(notified.wait())
        #expect(ran.all == [2])
        #expect(cancelled.isCancelled && cancelled.isFinished)
    }

    @Test func itemsWaitingForLaterItemsDoNotDeadlockThePool() {
        // More waiters than workers: each waits on a semaphore that a later
        // item signals. Without blocking compensation this would hang.
        let count = Topology.availableCPUCount * 4 + 8
        let semaphores = (0..<count).map { _ in Semaphore(value: 0) }
        let group = WorkGroup()
        for s in semaphores { WorkQueue.global().async(group: group) { s.wait() } }
        for s in semaphores { WorkQueue.global().async(group: group) { _ = s.signal() } }
        #expect(group.wait(timeout: .seconds(60)) == .completed)
    }

    @Test func contextFinalizerRunsAfterTheLastReference() {
        let finalized = Latch()
        let seen = OrderLog()
        do {
            let queue = WorkQueue(label: "test.final")
            queue.context = 17
            queue.setFinalizer { context in
                seen.append(context as! Int)
                finalized.countDown()
            }
            for i in 0..<10 { queue.async { seen.append(i) } }
        }
        #expect(finalized.wait())
        #expect(seen.all == Array(0..<10) + [17])
    }

    @Test func specificValuesFollowTheTargetChain() {
        let key = WorkQueueKey<String>()
        let root = WorkQueue(label: "root")
        root.setSpecific("root value", for: key)
        let child = WorkQueue(label: "child", target: root)
        #expect(child.sync { WorkQueue.currentSpecific(for: key) } == "root value")
        #expect(WorkQueue.currentSpecific(for: key) == nil)
    }
}
