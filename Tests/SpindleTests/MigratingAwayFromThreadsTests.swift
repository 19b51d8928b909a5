// The techniques of the Concurrency Programming Guide's "Migrating Away from
// Threads" chapter (spec §1.9, M1-M8; with Q17, G1-G4 and SM4), each rebuilt
// with Spindle's queues and checked for what it promises: order, exclusion,
// completeness and who runs what. Nothing here asserts a duration.
#if canImport(Glibc)
import Glibc
#endif
import Spindle
import Testing
import TestSupport

/// Data that only the items of one serial queue touch: the queue is its lock.
private final class QueueOwned<Value>: @unchecked Sendable {
    // @unchecked: `value` is read and written only by items of the owning
    // serial queue (async and sync alike), which run one at a time, each
    // seeing the previous one's writes (WorkQueue's memory ordering).
    var value: Value
    init(_ value: Value) { self.value = value }
}

/// One slot per child, each written by one child and read after the wait.
private final class Slots: @unchecked Sendable {
    // @unchecked: slot i is written by child i only; the parent reads after
    // a wait (group or join) that orders every child's writes before it.
    private let storage: UnsafeMutablePointer<Int>
    let count: Int
    init(_ count: Int) {
        self.count = count
        storage = .allocate(capacity: count)
        storage.initialize(repeating: -1, count: count)
    }
    deinit { storage.deallocate() }
    subscript(i: Int) -> Int {
        get { storage[i] }
        set { storage[i] = newValue }
    }
    var all: [Int] { (0..<count).map { storage[$0] } }
}

/// A counter per index, bumped atomically: for "every index exactly once".
private final class HitCounts: @unchecked Sendable {
    // @unchecked: every access is an atomic operation on its own word.
    private let words: UnsafeMutablePointer<Int>
    let count: Int
    init(_ count: Int) {
        self.count = count
        words = .allocate(capacity: count)
        words.initialize(repeating: 0, count: count)
    }
    deinit { words.deallocate() }
    func hit(_ i: Int) { AtomicMemory.add(1, to: words + i, ordering: .relaxed) }
    var eachExactlyOnce: Bool { (0..<count).allSatisfy { AtomicMemory.load(from: words + $0, ordering: .relaxed) == 1 } }
}

private func work(_ seed: Int) -> Int { (1...200).reduce(seed) { ($0 &* 31 &+ $1) % 1_000_003 } }

@Suite("Migrating away from threads")
struct MigratingAwayFromThreadsTests {
    // MARK: M1 - a thread that runs one task

    /// A thread started for one task and joined becomes one item on a
    /// concurrent queue, waited for through its `WorkItem`: same answer, and
    /// the item runs on a worker of the queue rather than on a thread made
    /// for it.
    @Test func singleTaskThreadBecomesOneItemOnAConcurrentQueue() throws {
        let viaThread = try NativeThread.start { work(7) }.join()

        let answer = LockedValue(0)
        let ranOn = LockedValue<WorkQueue?>(nil)
        let item = WorkItem {
            answer.withLock { $0 = work(7) }
            ranOn.withLock { $0 = WorkQueue.current }
        }
        WorkQueue.global().async(item)
        #expect(item.wait(timeout: .seconds(30)) == .completed)
        #expect(answer.withLock { $0 } == viaThread)
        #expect(ranOn.withLock { $0 } === WorkQueue.global())
    }

    // MARK: M2 - worker threads

    /// Worker threads whose tasks must be synchronized become a serial
    /// queue: tasks submitted from several threads run one at a time, and
    /// each thread's tasks in the order it submitted them.
    @Test func synchronizedWorkerBecomesASerialQueue() {
        let worker = WorkQueue(label: "m2.synchronized")
        let occupancy = Occupancy()
        let log = OrderLog()
        let group = WorkGroup()
        runThreads(4) { t in
            for n in 0..<250 {
                worker.async(group: group) {
                    _ = occupancy.enter()
                    log.append(t * 1000 + n)
                    occupancy.leave()
                }
            }
        }
        #expect(group.wait(timeout: .seconds(30)) == .completed)
        #expect(occupancy.peak == 1)
        let entries = log.all
        #expect(entries.count == 1000)
        for t in 0..<4 {
            #expect(entries.filter { $0 / 1000 == t } == (0..<250).map { t * 1000 + $0 })
        }
    }

    /// Worker threads running independent tasks become a concurrent queue:
    /// every task runs exactly once, and two tasks can be running at the same
    /// time (each waits for the other to start; on a serial queue they
    /// would never meet).
    @Test func independentWorkersBecomeAConcurrentQueue() {
        let workers = WorkQueue(label: "m2.independent", kind: .concurrent)
        let hits = HitCounts(500)
        let group = WorkGroup()
        for i in 0..<500 {
            workers.async(group: group) { hits.hit(i) }
        }
        // The rendezvous on the shared concurrent queue: its overlap does not
        // depend on the number of CPUs (a waiting item lets the pool start
        // another), where a private queue's is capped at the pool's width.
        let shared = WorkQueue.global()
        let first = Semaphore(value: 0)
        let second = Semaphore(value: 0)
        let met = OrderLog()
        shared.async(group: group) {
            _ = first.signal()
            if second.wait(timeout: .seconds(30)) == .completed { met.append(1) }
        }
        shared.async(group: group) {
            _ = second.signal()
            if first.wait(timeout: .seconds(30)) == .completed { met.append(2) }
        }
        #expect(group.wait(timeout: .seconds(60)) == .completed)
        #expect(hits.eachExactlyOnce)
        #expect(met.all.sorted() == [1, 2])
    }

    // MARK: M4 - a lock-protected resource

    /// The asynchronous lock (Listing 5-1): the resource's own serial queue
    /// applies modifications in the order they arrive, and the caller never
    /// waits for one. The proof that it does not: while the queue is held
    /// by a modification that waits for the caller, the caller submits a
    /// thousand more and only then releases the first.
    @Test func asynchronousLockAppliesChangesInArrivalOrderWithoutBlocking() {
        let resourceQueue = WorkQueue(label: "m4.resource")
        let resource = QueueOwned<[Int]>([])
        let gate = Semaphore(value: 0)
        let gateOpened = LockedValue(false)
        resourceQueue.async {
            let opened = gate.wait(timeout: .seconds(30)) == .completed
            gateOpened.withLock { $0 = opened }
        }
        for i in 0..<1000 {
            resourceQueue.async { resource.value.append(i) }
        }
        // Every `async` above returned while the queue was held.
        _ = gate.signal()
        let seen = resourceQueue.sync { resource.value }
        #expect(gateOpened.withLock { $0 })
        #expect(seen == Array(0..<1000))
    }

    /// The synchronous critical section (Listing 5-2): `sync` on the
    /// resource's queue returns a value for the caller to use at once,
    /// reflecting every modification submitted before it; mixed with
    /// `async` from several threads, the queue still runs one section at a
    /// time (sync protects the resource no more and no less than async).
    @Test func synchronousCriticalSectionReturnsTheResult() {
        let resourceQueue = WorkQueue(label: "m4.critical")
        let balance = QueueOwned(0)
        let occupancy = Occupancy()
        let readings = LockedValue<[[Int]]>(Array(repeating: [], count: 4))
        runThreads(4) { t in
            for _ in 0..<200 {
                resourceQueue.async {
                    _ = occupancy.enter()
                    balance.value += 1
                    occupancy.leave()
                }
                let now = resourceQueue.sync { () -> Int in
                    _ = occupancy.enter()
                    defer { occupancy.leave() }
                    return balance.value
                }
                readings.withLock { $0[t].append(now) }
            }
        }
        #expect(resourceQueue.sync { balance.value } == 800)
        #expect(occupancy.peak == 1)
        // A thread's k-th reading comes after its own k + 1 modifications
        // (and never goes back).
        for perThread in readings.withLock({ $0 }) {
            #expect(perThread.count == 200)
            #expect(perThread.enumerated().allSatisfy { k, value in value >= k + 1 && value <= 800 })
            #expect(zip(perThread, perThread.dropFirst()).allSatisfy { $0 <= $1 })
        }
        // From one thread: a sync right after n asyncs sees all n.
        let single = WorkQueue(label: "m4.single")
        let total = QueueOwned(0)
        for n in 1...100 { single.async { total.value += n } }
        #expect(single.sync { total.value } == 5050)
    }

    // MARK: M5 and G1-G4 - thread joins, and Listing 3-6

    /// Joining child threads one after another becomes one wait on a group
    /// of items: the same results, from a single wait.
    @Test func threadJoinsBecomeOneGroupWait() throws {
        let joined = Slots(8)
        let children = try (0..<8).map { i in try NativeThread.start { work(i) } }
        for (i, child) in children.enumerated() { joined[i] = try child.join() }

        let grouped = Slots(8)
        let group = WorkGroup()
        for i in 0..<8 {
            WorkQueue.global().async(group: group) { grouped[i] = work(i) }
        }
        group.wait()
        #expect(group.count == 0)
        #expect(grouped.all == joined.all)
    }

    /// Listing 3-6 and the two ways of watching a group (Table 3-2): items
    /// join the group as they are submitted (G1); the caller does other work,
    /// then one wait covers them all (G2, G3); a notification is submitted to
    /// the chosen queue once the group empties, and sees every member's
    /// writes (G4); an empty group completes at once both ways.
    @Test func groupWaitAndNotifyAsInListing3_6() {
        let queue = WorkQueue.global()
        let group = WorkGroup()
        let results = Slots(16)
        let release = Semaphore(value: 0)
        for i in 0..<16 {
            queue.async(group: group) {
                if i == 0 { _ = release.wait(timeout: .seconds(30)) }
                results[i] = i * i
            }
        }
        // G1: the members entered when they were submitted.
        #expect(group.count >= 1)

        let callerQueue = WorkQueue(label: "g4.caller")
        let notified = Latch()
        let seenByNotification = LockedValue<[Int]>([])
        let notifiedOn = LockedValue<WorkQueue?>(nil)
        group.notify(on: callerQueue) {
            seenByNotification.withLock { $0 = results.all }
            notifiedOn.withLock { $0 = WorkQueue.current }
            notified.countDown()
        }
        // "Do some other work while the tasks execute": member 0 is held, so
        // neither the wait nor the notification can have completed.
        #expect(group.wait(until: .now) == .timedOut)
        #expect(!notified.isOpen)
        _ = release.signal()

        #expect(group.wait(timeout: .seconds(30)) == .completed)
        #expect(results.all == (0..<16).map { $0 * $0 })
        #expect(notified.wait())
        #expect(seenByNotification.withLock { $0 } == (0..<16).map { $0 * $0 })
        #expect(notifiedOn.withLock { $0 } === callerQueue)

        let empty = WorkGroup()
        #expect(empty.wait(until: .now) == .completed)
        let emptyNotified = Latch()
        empty.notify(on: callerQueue) { emptyNotified.countDown() }
        #expect(emptyNotified.wait())
    }

    // MARK: M6 - producer and consumer

    /// The producer/consumer pair on a mutex, a condition and a predicate
    /// loop becomes the producer submitting each piece of work: to a serial
    /// queue when order matters (consumed in production order, as the
    /// condition-based consumer does), to a concurrent queue when it does not
    /// (each consumed exactly once).
    @Test func producerSubmitsItemsInsteadOfSignallingAConsumer() throws {
        // The thread version, for comparison: one consumer thread waiting on
        // a condition for a predicate.
        let condition = Condition()
        let pending = QueueOwnedByCondition()
        let consumer = try NativeThread.start { () -> [Int] in
            var consumed: [Int] = []
            while consumed.count < 100 {
                condition.lock()
                while pending.items.isEmpty { condition.wait() }
                let batch = pending.items
                pending.items.removeAll()
                condition.unlock()
                consumed += batch
            }
            return consumed
        }
        for n in 0..<100 {
            condition.lock()
            pending.items.append(n)
            condition.signal()
            condition.unlock()
        }
        let byThread = try consumer.join()

        // Order matters: a serial queue.
        let ordered = WorkQueue(label: "m6.ordered")
        let consumed = QueueOwned<[Int]>([])
        for n in 0..<100 {
            ordered.async { consumed.value.append(n) }
        }
        #expect(ordered.sync { consumed.value } == byThread)

        // Order does not matter: a concurrent queue.
        let unordered = WorkQueue(label: "m6.unordered", kind: .concurrent)
        let hits = HitCounts(1000)
        let group = WorkGroup()
        runThreads(2) { producer in
            for n in stride(from: producer, to: 1000, by: 2) {
                unordered.async(group: group) { hits.hit(n) }
            }
        }
        #expect(group.wait(timeout: .seconds(30)) == .completed)
        #expect(hits.eachExactlyOnce)
    }

    // MARK: M7, SM4 - a semaphore regulating a finite resource

    /// The guide's finite-resource example: N permits, 100 tasks, each of
    /// which waits, opens a descriptor, works, closes it and signals. At most
    /// N of the tasks' descriptors are ever open at once, every task runs,
    /// and every descriptor is closed at the end.
    @Test(arguments: [1, 3])
    func semaphoreBoundsOpenDescriptors(permits: Int) {
        let descriptors = Semaphore(value: permits)
        let inUse = Occupancy()
        let opened = LockedValue(0)
        let failures = LockedValue(0)
        let group = WorkGroup()
        for _ in 0..<100 {
            WorkQueue.global().async(group: group) {
                guard descriptors.wait(timeout: .seconds(30)) == .completed else {
                    failures.withLock { $0 += 1 }
                    return
                }
                let fd = Glibc.open("/dev/null", O_RDONLY | O_CLOEXEC)
                if fd >= 0 {
                    _ = inUse.enter()
                    opened.withLock { $0 += 1 }
                    var byte: UInt8 = 0
                    _ = read(fd, &byte, 1)  // the "work": /dev/null reads end at once
                    inUse.leave()
                    close(fd)
                } else {
                    failures.withLock { $0 += 1 }
                }
                _ = descriptors.signal()
            }
        }
        #expect(group.wait(timeout: .seconds(60)) == .completed)
        #expect(failures.withLock { $0 } == 0)
        #expect(opened.withLock { $0 } == 100)
        #expect(inUse.peak >= 1 && inUse.peak <= permits)
        #expect(inUse.enter() == 1)  // none left open
        inUse.leave()
        #expect(descriptors.value == permits)
    }

    // MARK: M8 - run-loop code

    /// A thread with a run loop and a source per kind of work becomes one
    /// serial queue, made in one line: a new kind of work is just another
    /// item, a timer is a delayed item, and everything runs on that queue,
    /// one item at a time, in submission order.
    @Test func runLoopThreadBecomesOneSerialQueue() {
        let loopQueue = WorkQueue(label: "m8.loop")
        let occupancy = Occupancy()
        let log = LockedValue<[String]>([])
        let onQueue = LockedValue(true)
        let done = Latch()
        @Sendable func record(_ entry: String) {
            _ = occupancy.enter()
            if WorkQueue.current !== loopQueue { onQueue.withLock { $0 = false } }
            log.withLock { $0.append(entry) }
            occupancy.leave()
        }
        for n in 0..<50 {
            loopQueue.async { record("message \(n)") }  // what a custom source delivered
            loopQueue.async { record("reading \(n)") }  // a second kind of work
        }
        let deadline = MonotonicClock.now.advanced(by: .milliseconds(5))
        loopQueue.async(after: deadline) {  // what a timer fired
            record(MonotonicClock.now >= deadline ? "timer" : "timer early")
            done.countDown()
        }
        #expect(done.wait())
        let entries = log.withLock { $0 }
        #expect(Array(entries.prefix(100)) == (0..<50).flatMap { ["message \($0)", "reading \($0)"] })
        #expect(entries.last == "timer")
        #expect(onQueue.withLock { $0 })
        #expect(occupancy.peak == 1)
    }

    // MARK: Loop code - apply, with and without striding

    /// A `for` loop over independent iterations becomes `apply`; with the
    /// guide's striding (Listing 5-4, stride 137) written by hand and with
    /// `apply`'s own `stride:`, every index is visited exactly once,
    /// remainder included, and `apply` returns only when all have run.
    @Test func loopBecomesApplyWithStriding() {
        let count = 10_000  // 72 strides of 137, and 136 left over
        let stride = 137
        #expect(count % stride != 0)

        let plain = HitCounts(count)
        WorkQueue.global().apply(iterations: count) { plain.hit($0) }
        #expect(plain.eachExactlyOnce)

        // Listing 5-4 by hand: count / stride blocks of `stride` iterations,
        // the remainder inline.
        let byHand = HitCounts(count)
        WorkQueue.global().apply(iterations: count / stride) { block in
            let start = block * stride
            for j in start..<start + stride { byHand.hit(j) }
        }
        for i in (count - count % stride)..<count { byHand.hit(i) }
        #expect(byHand.eachExactlyOnce)

        // The same through apply's option, on a private concurrent queue.
        let strided = HitCounts(count)
        WorkQueue(label: "apply.strided", kind: .concurrent).apply(iterations: count, stride: stride) { strided.hit($0) }
        #expect(strided.eachExactlyOnce)

        // Loop results, gathered per index, match the sequential loop.
        let results = Slots(1000)
        WorkQueue.global().apply(iterations: 1000) { results[$0] = work($0) }
        #expect(results.all == (0..<1000).map(work))
    }

    // MARK: Q17 - the completion pattern

    /// Listing 3-4: a task runs on a global queue, then submits its result
    /// closure to a queue the caller chose. The closure runs on that queue
    /// with the result, even when the caller has let go of the queue: the
    /// task's strong capture keeps it alive until the closure is submitted.
    @Test func completionClosureRunsOnTheCallersQueue() {
        func average(_ data: [Int], replyOn queue: WorkQueue, _ completion: @escaping @Sendable (Int) -> Void) {
            WorkQueue.global().async {
                let result = data.reduce(0, +) / max(data.count, 1)
                queue.async { completion(result) }
            }
        }

        let replies = WorkQueue(label: "q17.replies")
        let answer = LockedValue<(Int, String?)?>(nil)
        let done = Latch()
        average([2, 4, 6, 8], replyOn: replies) { avg in
            answer.withLock { $0 = (avg, WorkQueue.current?.label) }
            done.countDown()
        }
        #expect(done.wait())
        #expect(answer.withLock { $0?.0 } == 5)
        #expect(answer.withLock { $0?.1 } == "q17.replies")

        // The caller drops its reference at once.
        let droppedDone = Latch()
        let droppedAnswer = LockedValue<(Int, String?)?>(nil)
        do {
            let transient = WorkQueue(label: "q17.transient")
            average(Array(1...99), replyOn: transient) { avg in
                droppedAnswer.withLock { $0 = (avg, WorkQueue.current?.label) }
                droppedDone.countDown()
            }
        }
        #expect(droppedDone.wait())
        #expect(droppedAnswer.withLock { $0?.0 } == 50)
        #expect(droppedAnswer.withLock { $0?.1 } == "q17.transient")
    }
}

/// The producer/consumer buffer of the thread version, guarded by the
/// test's `Condition`.
private final class QueueOwnedByCondition: @unchecked Sendable {
    // @unchecked: `items` is only touched with the condition's lock held.
    var items: [Int] = []
}
