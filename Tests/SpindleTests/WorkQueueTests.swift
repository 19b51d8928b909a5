import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

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
        let submitted = MonotonicClock.now
        #expect(done.wait())
        // In deadline order, unless this thread was held up past the first
        // deadline before submitting them all (seen with the machine loaded
        // by parallel suites): items already due run in submission order.
        if submitted < start.advanced(by: .milliseconds(10)) {
            #expect(tally.all == [1, 2, 0])
        }
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

    @Test func aGroupWithMembersOutlivesItsLastReferenceAndIsFreedWhenEmpty() {
        // Members submitted with `async(group:)` hold the group unretained;
        // the group keeps itself alive while it has members.
        let gate = Spindle.Semaphore(value: 0)
        let notified = Latch()
        weak var watched: WorkGroup?
        do {
            let group = WorkGroup()
            watched = group
            for _ in 0..<4 { WorkQueue.global().async(group: group) { gate.wait() } }
            group.notify(on: .global()) { notified.countDown() }
        }
        #expect(watched != nil, "a group with members was freed while they ran")
        for _ in 0..<4 { gate.signal() }
        #expect(notified.wait())
        // The leave that empties the group releases it just after the
        // notification is submitted.
        let deadline = MonotonicClock.now.advanced(by: .seconds(30))
        while watched != nil && MonotonicClock.now < deadline { NativeThread.sleep(for: .milliseconds(1)) }
        #expect(watched == nil, "an emptied group was never freed")
        // A group entered again after emptying works as before.
        let again = WorkGroup()
        for round in 0..<3 {
            WorkQueue.global().async(group: again) {}
            #expect(again.wait(timeout: .seconds(30)) == .completed, "round \(round)")
        }
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

@Suite("WorkQueue edge cases")
struct WorkQueueEdgeTests {
    @Test func itemReleasesWhatItCapturedOnceItHasRun() {
        final class Payload: Sendable {}
        let queue = WorkQueue(label: "test.release")
        weak var watched: Payload?
        do {
            let payload = Payload()
            watched = payload
            queue.async { _ = payload }
        }
        queue.sync {}
        #expect(watched == nil)
    }

    @Test func syncFromAWorkerOntoABusySerialQueueWaitsAndRuns() {
        let busy = WorkQueue(label: "test.busy")
        let gate = Semaphore(value: 0)
        busy.async { gate.wait() }
        let result = LockedValue(0)
        let done = WorkGroup()
        // More callers than workers, each blocked in a queued `sync`: the
        // pool must start others so that the item opening the gate runs.
        for i in 0..<(WorkQueue.poolWidth + 2) {
            WorkQueue.global().async(group: done) {
                let value = busy.sync { i }
                result.withLock { $0 += value }
            }
        }
        WorkQueue.global().async { _ = gate.signal() }
        #expect(done.wait(timeout: .seconds(30)) == .completed)
        let n = WorkQueue.poolWidth + 2
        #expect(result.withLock { $0 } == n * (n - 1) / 2)
    }

    @Test func asyncAfterOnASerialQueueKeepsDeadlineOrderAndRunsAlone() {
        let queue = WorkQueue(label: "test.after.serial")
        let log = OrderLog()
        let occupancy = Occupancy()
        let group = WorkGroup()
        // The first deadline 20 ms ahead, so that a submitting thread held
        // up for a few milliseconds (the machine loaded by parallel suites)
        // still schedules them all before any is due.
        let start = MonotonicClock.now.advanced(by: .milliseconds(20))
        for i in (0..<20).reversed() {
            group.enter()
            queue.async(after: start.advanced(by: .milliseconds(i))) {
                _ = occupancy.enter()
                log.append(i)
                occupancy.leave()
                group.leave()
            }
        }
        let submitted = MonotonicClock.now
        #expect(group.wait(timeout: .seconds(30)) == .completed)
        // In deadline order, unless this thread was held up past the first
        // deadline anyway (seen once with 3 ms deadlines under a loaded
        // machine: item 3 ran before 2, 1 and 0 were submitted): items
        // already due run in submission order.
        if submitted < start {
            #expect(log.all == Array(0..<20))
        } else {
            #expect(log.all.sorted() == Array(0..<20))
        }
        #expect(occupancy.peak == 1)
    }

    @Test func barrierWorkItemRunsAloneOnAConcurrentQueue() {
        let queue = WorkQueue(label: "test.itembarrier", kind: .concurrent)
        let occupancy = Occupancy()
        let group = WorkGroup()
        for _ in 0..<50 {
            queue.async(group: group) {
                _ = occupancy.enter()
                for _ in 0..<500 { spinLoopHint() }
                occupancy.leave()
            }
        }
        let alone = LockedValue(false)
        let barrier = WorkItem(barrier: true) {
            alone.withLock { $0 = occupancy.enter() == 1 }
            occupancy.leave()
        }
        queue.async(barrier)
        #expect(barrier.wait(timeout: .seconds(30)) == .completed)
        #expect(alone.withLock { $0 })
        #expect(group.wait(timeout: .seconds(30)) == .completed)
    }

    /// In a child process, where no other test's items share the pool.
    @Test func highPriorityItemsStartBeforeQueuedDefaultOnes() async {
        await #expect(processExitsWith: .success) {
            // Keep every standard worker busy (spinning, not in a blocking
            // wait, so the pool starts no replacement), queue default items
            // then one high item: the workers, once free, look at the high
            // lane first.
            let width = WorkQueue.poolWidth
            let release = LockedValue(false)
            let held = Latch(width)
            let hold = WorkGroup()
            for _ in 0..<width {
                WorkQueue.global().async(group: hold) {
                    held.countDown()
                    while !release.withLock({ $0 }) { spinLoopHint() }
                }
            }
            guard held.wait() else { exit(2) }
            let log = OrderLog()
            let all = WorkGroup()
            for i in 0..<20 { WorkQueue.global().async(group: all) { log.append(i) } }
            WorkQueue.global(.high).async(group: all) { log.append(-1) }
            release.withLock { $0 = true }
            guard try await all.wait(timeout: .seconds(30)) == .completed,
                  try await hold.wait(timeout: .seconds(30)) == .completed
            else { exit(3) }
            // Each freed worker takes one unit first; at most one look in 61
            // starts at the default lane (so the injector is never starved).
            exit(log.all.firstIndex(of: -1)! <= width ? 0 : 4)
        }
    }

    @Test func workItemPerformedByHandRunsOnTheCallersThread() {
        let caller = NativeThread.current
        let ran = LockedValue(false)
        let item = WorkItem { ran.withLock { $0 = NativeThread.current === caller } }
        item.perform()
        #expect(ran.withLock { $0 })
        #expect(item.isFinished)
        #expect(item.wait(until: .now) == .completed)
    }

    @Test func requireCurrentPassesInsideTheQueueAndItsTarget() {
        let root = WorkQueue(label: "root")
        let child = WorkQueue(label: "child", target: root)
        child.sync {
            child.requireCurrent()
            root.requireCurrent()
            WorkQueue.global(.low).requireNotCurrent()
            WorkQueue.global().requireCurrent()  // the root's target
        }
        #expect(!child.isCurrent)
    }
}
