import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

// Sizes: `stressSize(ci:full:)`. TSan runs this suite 10–20× slower than a
// native build, and the CI budget for it under TSan is about 90 s on the
// 2-vCPU VM, so the CI sizes are the small ones; full sizes are the issue's
// (8 × 10^6 items onto one serial queue) or 10–20× CI's.

/// Raw zeroed words shared between items and the test; plain reads and writes
/// where a queue's ordering is what makes them safe (TSan checks that it
/// does), atomic ones elsewhere.
private final class Words: @unchecked Sendable {
    // @unchecked: each use says which ordering makes its accesses safe.
    let base: UnsafeMutablePointer<Int>
    let count: Int
    init(_ count: Int) {
        self.count = count
        base = .allocate(capacity: count)
        base.initialize(repeating: 0, count: count)
    }
    deinit { base.deallocate() }
    subscript(i: Int) -> UnsafeMutablePointer<Int> { base + i }
    func add(_ i: Int, _ delta: Int = 1) -> Int {
        AtomicMemory.add(delta, to: base + i, ordering: .sequentiallyConsistent)
    }
    func load(_ i: Int) -> Int { AtomicMemory.load(from: base + i, ordering: .sequentiallyConsistent) }
    func store(_ i: Int, _ v: Int) { AtomicMemory.store(v, to: base + i, ordering: .sequentiallyConsistent) }
}

/// Serialized: the last case measures the default pool's thread count, which
/// the other cases here would disturb.
@Suite("WorkQueue stress", .serialized)
struct WorkQueueStressTests {
    /// 8 producers × `perProducer` items onto one serial queue. Every item
    /// checks that it runs alone (an occupancy word) and that its producer's
    /// sequence numbers arrive in order; afterwards every item ran exactly
    /// once. Counts: 8 × 10^6 at full size (the target, ~16 s in a
    /// native debug build here), 8 × 50,000 in CI (under TSan, where an item
    /// costs ~8.6 µs against ~1.9 µs: 4 s alone; 8 × 200,000 made the TSan
    /// stress run 33 s longer on the 2-vCPU VM, this count about 10 s).
    @Test func serialQueueRunsEveryItemOnceAloneAndInProducerOrder() {
        let producers = 8
        let perProducer = stressSize(ci: 50_000, full: 1_000_000)
        // At most this many items of one producer queued at once, so that the
        // queue's ring stays small while 8 producers outrun 1 consumer.
        let window = 20_000
        let queue = WorkQueue(label: "stress.serial")
        // Plain words, touched only inside items: the serial queue's ordering
        // makes them safe. [p]: last sequence of producer p; [8]: items run;
        // [9]: order violations.
        let plain = Words(16)
        // Atomic: [0] occupancy, [1] overlaps seen, [8 + p] items of p done.
        let atomic = Words(16)
        runThreads(producers) { p in
            for seq in 1...perProducer {
                if seq % 1024 == 0 {
                    while seq - atomic.load(8 + p) > window { usleep(200) }
                }
                queue.async {
                    if atomic.add(0) != 1 { _ = atomic.add(1) }
                    if plain[p].pointee + 1 != seq { plain[9].pointee += 1 }
                    plain[p].pointee = seq
                    plain[8].pointee += 1
                    _ = atomic.add(8 + p)
                    _ = atomic.add(0, -1)
                }
            }
        }
        // Everything submitted before the sync has run when it returns, and
        // its writes are visible here.
        let (ran, outOfOrder, lasts) = queue.sync { (plain[8].pointee, plain[9].pointee, (0..<producers).map { plain[$0].pointee }) }
        #expect(ran == producers * perProducer)
        #expect(outOfOrder == 0)
        #expect(lasts == Array(repeating: perProducer, count: producers))
        #expect(atomic.load(1) == 0, "items of the serial queue overlapped")
        #expect(atomic.load(0) == 0)
        print("serial: \(producers) × \(perProducer) items (ThreadSanitizer: \(underThreadSanitizer))")
        // Every item checked its occupancy and its producer's order; plus the five totals.
        StressReport.record(operations: producers * perProducer, threads: producers, checks: 2 * producers * perProducer + 5)
    }

    /// Barriers on a concurrent queue run alone: 4 submitters mix ordinary
    /// items with `asyncBarrier` and `syncBarrier`. A barrier raises a flag,
    /// then checks no ordinary item runs; an ordinary item counts itself in,
    /// then checks the flag (sequentially consistent, so of two overlapping
    /// ones at least one sees the other). Barriers also write a plain word
    /// that ordinary items read, which TSan flags if they ever overlap.
    @Test func barriersOnAConcurrentQueueExcludeEverythingElse() {
        let submitters = 4
        let rounds = stressSize(ci: 5_000, full: 100_000)
        let itemsPerRound = 8
        let queue = WorkQueue(label: "stress.barriers", kind: .concurrent)
        let group = WorkGroup()
        // [0] ordinary items running, [1] barrier flag, [2] violations,
        // [3] ordinary items run, [4] barriers run, [5] peak ordinary at once.
        let atomic = Words(8)
        let plain = Words(1)  // written by barriers only
        @Sendable func ordinary() {
            let now = atomic.add(0)
            if atomic.load(1) != 0 { _ = atomic.add(2) }
            _ = plain[0].pointee
            for _ in 0..<50 { spinLoopHint() }
            var peak = atomic.load(5)
            while now > peak {
                let r = AtomicMemory.compareExchange(expected: peak, desired: now, at: atomic[5], ordering: .relaxed)
                if r.exchanged { break }
                peak = r.original
            }
            _ = atomic.add(3)
            _ = atomic.add(0, -1)
        }
        @Sendable func barrier() {
            if atomic.add(1) != 1 { _ = atomic.add(2) }
            if atomic.load(0) != 0 { _ = atomic.add(2) }
            plain[0].pointee &+= 1
            for _ in 0..<50 { spinLoopHint() }
            if atomic.load(0) != 0 { _ = atomic.add(2) }
            _ = atomic.add(4)
            _ = atomic.add(1, -1)
        }
        runThreads(submitters) { t in
            for round in 0..<rounds {
                for _ in 0..<itemsPerRound { queue.async(group: group) { ordinary() } }
                if round % 4 == 3 {
                    queue.syncBarrier { barrier() }
                } else {
                    queue.asyncBarrier(group: group) { barrier() }
                }
            }
        }
        #expect(group.wait(timeout: .seconds(120)) == .completed)
        #expect(atomic.load(2) == 0, "a barrier overlapped another item")
        #expect(atomic.load(3) == submitters * rounds * itemsPerRound)
        #expect(atomic.load(4) == submitters * rounds)
        #expect(queue.syncBarrier { plain[0].pointee } == submitters * rounds)
        // Not a requirement, a sanity check that the queue was concurrent at all.
        print("barriers: \(submitters) × \(rounds) rounds of \(itemsPerRound) items + 1 barrier; peak ordinary items at once \(atomic.load(5)) (pool width \(Topology.availableCPUCount))")
        // Each ordinary item checked the barrier flag once, each barrier the running count twice.
        let items = submitters * rounds * (itemsPerRound + 1)
        StressReport.record(operations: items, threads: submitters, checks: submitters * rounds * (itemsPerRound + 2) + 5)
    }

    /// Random mixes from several threads of async, sync, barriers, balanced
    /// suspend/resume, target changes (targets only among the global queues
    /// and one root serial queue, so no cycle can form), group enter/leave
    /// and work-item cancellation. Afterwards: every item not cancelled ran
    /// exactly once, every cancelled one at most once, every serial queue ran
    /// one item at a time and each thread's items in order, groups drained.
    @Test func randomMixesKeepExactCounts() {
        let threads = 4
        // 10× CI's at full size, not 20×: every work item is kept to the end.
        let operations = stressSize(ci: 50_000, full: 500_000)
        let root = WorkQueue(label: "stress.mix.root")
        let globals: [WorkQueue] = [.global(.default), .global(.high), .global(.low), .global(.background)]
        // 0, 1: serial; 2, 3: concurrent; all retargetable.
        let queues: [WorkQueue] = [
            WorkQueue(label: "stress.mix.s0"), WorkQueue(label: "stress.mix.s1", target: root),
            WorkQueue(label: "stress.mix.c0", kind: .concurrent), WorkQueue(label: "stress.mix.c1", kind: .concurrent, target: root),
        ]
        let all = queues + [root]  // index 4: the root (serial)
        let isSerial = [true, true, false, false, true]
        let targets = globals + [root]
        let group = WorkGroup()
        // One slot per possible item: how many times it ran.
        let hits = Words(threads * operations)
        // Expected: 1 must run, 0 must not, 2 may or may not (cancelled after submission).
        let expected = Words(threads * operations)
        // Per serial queue: occupancy (atomic); per (thread, queue): last
        // sequence seen (plain, guarded by the serial queue).
        let occupancy = Words(all.count)
        let lastSeen = Words(threads * all.count)
        let violations = Words(2)  // [0] overlap on a serial queue, [1] out of order
        let items = LockedValue<[WorkItem]>([])
        let seeds = (0..<threads).map { _ in UInt64.random(in: 0...UInt64.max) }
        runThreads(threads) { t in
            var rng = SplitMix(state: seeds[t])
            var myItems: [WorkItem] = []
            var cancelLater: [WorkItem] = []
            // q: the queue the item runs on, -1 for the global queue.
            func body(_ id: Int, _ q: Int, _ seq: Int) -> @Sendable () -> Void {
                let serial = q >= 0 && isSerial[q]
                return {
                    if serial && occupancy.add(q) != 1 { _ = violations.add(0) }
                    if serial {
                        let slot = lastSeen[t * all.count + q]
                        if slot.pointee >= seq { _ = violations.add(1) }
                        slot.pointee = seq
                    }
                    _ = hits.add(id)
                    if serial { _ = occupancy.add(q, -1) }
                }
            }
            var op = 0
            var seq = 0
            func next() -> (id: Int, seq: Int) {
                defer { op += 1; seq += 1 }
                return (t * operations + op, seq + 1)
            }
            func submitAsync(_ q: Int) {
                let (id, s) = next()
                expected[id].pointee = 1
                switch rng.next() % 3 {
                case 0: all[q].async(body(id, q, s))
                case 1: all[q].async(group: group, body(id, q, s))
                default:
                    group.enter()
                    let run = body(id, q, s)
                    all[q].async { run(); group.leave() }
                }
            }
            while op < operations {
                let q = Int(rng.next() % UInt64(all.count))
                switch rng.next() % 100 {
                case 0..<40:
                    submitAsync(q)
                case 40..<52:
                    let (id, s) = next()
                    expected[id].pointee = 1
                    all[q].sync(body(id, q, s))
                case 52..<60:
                    let (id, s) = next()
                    expected[id].pointee = 1
                    if rng.next() % 2 == 0 {
                        all[q].asyncBarrier(group: group, body(id, q, s))
                    } else {
                        all[q].syncBarrier(body(id, q, s))
                    }
                case 60..<68:
                    // Balanced, and nothing that waits while the queue is held:
                    // a sync behind our own suspension would wait forever.
                    all[q].suspend()
                    for _ in 0..<Int(rng.next() % 4) where op < operations { submitAsync(q) }
                    all[q].resume()
                case 68..<74:
                    if q < queues.count {
                        queues[q].setTarget(targets[Int(rng.next() % UInt64(targets.count))])
                    }
                case 74..<87:
                    let (id, s) = next()
                    let item = WorkItem(barrier: rng.next() % 4 == 0, body(id, q, s))
                    switch rng.next() % 3 {
                    case 0:
                        // Cancelled before submission: never runs.
                        item.cancel()
                        expected[id].pointee = 0
                        all[q].async(item)
                    case 1:
                        // Cancelled at some point after submission: may run once.
                        expected[id].pointee = 2
                        all[q].async(item)
                        if rng.next() % 2 == 0 { item.cancel() } else { cancelLater.append(item) }
                    default:
                        expected[id].pointee = 1
                        all[q].async(item)
                    }
                    myItems.append(item)
                default:
                    // A group member that is neither a queue's item nor left at once.
                    group.enter()
                    let (id, s) = next()
                    expected[id].pointee = 1
                    let run = body(id, -1, s)
                    WorkQueue.global().async {
                        run()
                        group.leave()
                    }
                }
            }
            // Cancel the rest of those, while they may still be queued.
            for item in cancelLater { item.cancel() }
            items.withLock { $0.append(contentsOf: myItems) }
        }
        // Drain: a barrier (sync on a serial queue) waits for everything
        // submitted before it; the root last, as the others' drains reach it.
        for queue in all { queue.syncBarrier {} }
        #expect(group.wait(timeout: .seconds(120)) == .completed)
        #expect(group.count == 0)
        let workItems = items.withLock { $0 }
        for item in workItems {
            #expect(item.wait(timeout: .seconds(120)) == .completed)
        }
        #expect(workItems.allSatisfy { $0.isFinished })
        var wrong: [String] = []
        for id in 0..<(threads * operations) {
            let h = hits.load(id)
            switch expected[id].pointee {
            case 1 where h != 1, 0 where h != 0, 2 where h > 1:
                wrong.append("item \(id): expected \(expected[id].pointee), ran \(h)×")
            default: break
            }
        }
        #expect(wrong.isEmpty, "seeds \(seeds): \(wrong.prefix(10))")
        #expect(violations.load(0) == 0, "seeds \(seeds): a serial queue ran two items at once")
        #expect(violations.load(1) == 0, "seeds \(seeds): a serial queue reordered one thread's items")
        for q in all.indices { #expect(!all[q].isSuspended) }
        print("mix: \(threads) threads × \(operations) operations, \(workItems.count) work items kept (ThreadSanitizer: \(underThreadSanitizer))")
        // Every item's run count checked against what was expected of it, every kept work item waited for.
        StressReport.record(operations: threads * operations, threads: threads, checks: threads * operations + workItems.count + 5)
    }

    /// The workers' local rings under every path at once: items on the
    /// global queue fan out 600 children each (more than a ring's first 256
    /// slots, so rings grow while thieves copy out of them), other workers
    /// steal, every 7th child announces a blocking
    /// region (the worker flushes its next-unit slot to the front of its
    /// ring while thieves may be copying), and every child submits one
    /// continuation (the next-unit slot). Then bursts of 200 children into
    /// an idle pool (no lock on the way) and chains that flush
    /// their slot while others steal. Submitters write each child's input
    /// with a plain store before `async`, and the child reads it and writes
    /// its own plain output word, which the test reads after the group's
    /// wait: TSan flags a ring hand-off that does not order them (checked:
    /// with the ring's `tail` store and the thief's load made relaxed, the
    /// burst phase reports races). Afterwards every child, continuation and
    /// link ran exactly once.
    @Test func localRingsGrowAndAreStolenWithoutLosingAnItem() {
        let parents = stressSize(ci: 60, full: 1_200)
        let fanOut = 600
        let children = parents * fanOut
        let input = Words(children)
        let output = Words(children)
        let continuations = Words(children)
        let group = WorkGroup()
        for p in 0..<parents {
            WorkQueue.global().async(group: group) {
                for c in 0..<fanOut {
                    let i = p * fanOut + c
                    input[i].pointee = i + 1
                    WorkQueue.global().async(group: group) {
                        if i % 7 == 0 { withBlockingRegion {} }
                        output[i].pointee += input[i].pointee
                        WorkQueue.global().async(group: group) { _ = continuations.add(i) }
                    }
                }
            }
        }
        #expect(group.wait(timeout: .seconds(120)) == .completed)
        var wrong: [Int] = []
        for i in 0..<children where output[i].pointee != i + 1 || continuations.load(i) != 1 {
            wrong.append(i)
        }
        #expect(wrong.isEmpty, "\(wrong.count) children ran other than once, first \(wrong.prefix(10))")

        // Bursts into an empty pool: one item pushes 200 children into its
        // ring (no growth, and no lock anywhere on the way) while the other
        // workers, idle at the start of each round, wake and steal from it.
        let rounds = stressSize(ci: 100, full: 2_000)
        let burst = 200
        let burstInput = Words(rounds * burst)
        let burstOutput = Words(rounds * burst)
        for r in 0..<rounds {
            let round = WorkGroup()
            WorkQueue.global().async(group: round) {
                for c in 0..<burst {
                    let i = r * burst + c
                    burstInput[i].pointee = i + 1
                    WorkQueue.global().async(group: round) { burstOutput[i].pointee += burstInput[i].pointee }
                }
            }
            #expect(round.wait(timeout: .seconds(60)) == .completed)
        }
        let missed = (0..<rounds * burst).filter { burstOutput[$0].pointee != $0 + 1 }
        #expect(missed.isEmpty, "\(missed.count) burst children ran other than once, first \(missed.prefix(10))")

        // Chains whose links each submit the next (into the next-unit slot,
        // the ring being empty) and then announce a blocking region, which
        // flushes the slot to the front of the ring while the other workers
        // steal from it. Each chain's plain count is ordered link to link
        // by the hand-off alone.
        // 4 × 5 = 20× CI's links at full size.
        let chains = stressSize(ci: 16, full: 64)
        let length = stressSize(ci: 500, full: 2_500)
        let links = Words(chains)
        let chainGroup = WorkGroup()
        @Sendable func link(_ c: Int, _ left: Int) {
            links[c].pointee += 1
            if left > 1 { WorkQueue.global().async(group: chainGroup) { link(c, left - 1) } }
            withBlockingRegion {}
        }
        for c in 0..<chains { WorkQueue.global().async(group: chainGroup) { link(c, length) } }
        #expect(chainGroup.wait(timeout: .seconds(120)) == .completed)
        let short = (0..<chains).filter { links[$0].pointee != length }
        #expect(short.isEmpty, "chains \(short.prefix(10)) ran \(short.prefix(10).map { links[$0].pointee }) links of \(length)")
        print("local rings: \(parents) × \(fanOut) children (ThreadSanitizer: \(underThreadSanitizer))")
        // Each child (with its continuation), burst child and chain checked.
        StressReport.record(
            operations: 2 * children + rounds * burst + chains * length, threads: WorkQueue.poolWidth,
            checks: children + rounds * burst + chains + rounds + 4)
    }

    /// 1,000 items each wait on their own semaphore, which an item queued
    /// after all of them signals: all complete only if the pool grows past
    /// its width (within `compensationLimit`). When the extra workers have
    /// been idle for their 2 s, they exit and the pool is back to its width
    /// (polled for up to 20 s). The count, in CI (under TSan) too;
    /// at full size, 5 rounds of it.
    @Test func itemsBlockedOnLaterItemsGrowThePoolWhichThenShrinks() {
        let rounds = stressSize(ci: 1, full: 5)
        for _ in 0..<rounds { growThePoolAndLetItShrink(count: 1_000) }
        // Each round: every item completed (the group), the growth bounds, the shrink.
        StressReport.record(operations: rounds * 2_000, threads: 1_000, checks: rounds * 5)
    }

    /// One round of `itemsBlockedOnLaterItemsGrowThePoolWhichThenShrinks`.
    private func growThePoolAndLetItShrink(count: Int) {
        let width = WorkQueue.poolWidth
        #expect(WorkQueue.compensationLimit >= count, "the limit cannot cover this test")
        let semaphores = (0..<count).map { _ in Semaphore(value: 0) }
        let group = WorkGroup()
        let peak = Words(1)
        for s in semaphores {
            WorkQueue.global().async(group: group) {
                let now = WorkQueue.workerThreadCount(for: .default)
                var seen = peak.load(0)
                while now > seen {
                    let r = AtomicMemory.compareExchange(expected: seen, desired: now, at: peak[0], ordering: .relaxed)
                    if r.exchanged { break }
                    seen = r.original
                }
                s.wait()
            }
        }
        for s in semaphores { WorkQueue.global().async(group: group) { _ = s.signal() } }
        #expect(group.wait(timeout: .seconds(120)) == .completed)
        let grown = max(peak.load(0), WorkQueue.workerThreadCount(for: .default))
        #expect(grown > width)
        #expect(grown <= width + WorkQueue.compensationLimit)
        let deadline = MonotonicClock.now.advanced(by: .seconds(20))
        var threadsNow = WorkQueue.workerThreadCount(for: .default)
        while threadsNow > width && MonotonicClock.now < deadline {
            NativeThread.sleep(for: .milliseconds(100))
            threadsNow = WorkQueue.workerThreadCount(for: .default)
        }
        #expect(threadsNow <= width, "the pool grew to \(grown) and is still \(threadsNow) after 20 s idle")
        print("blocking growth: pool grew to \(grown) workers (width \(width)), back to \(threadsNow)")
    }
}
