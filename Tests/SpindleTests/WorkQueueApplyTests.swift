import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// `apply` on a concurrent queue of one's own keeps the queue's exclusion:
/// a serial queue on its target chain, a barrier on the queue or its chain,
/// and suspension hold it as they hold `sync`. (Nothing here depends on the
/// event backend: no loop is involved.)
///
/// Cases that show an iteration must *not* run yet let the buggy shape a
/// short while to show itself (20 ms) and then check that nothing ran; they
/// assert no timing. Every wait for the apply itself is bounded, so a hang
/// fails the case instead of the run.
@Suite("WorkQueue apply")
struct WorkQueueApplyTests {
    /// Target chains of a concurrent queue that reach a serial queue: the
    /// shapes of libdispatch's `dispatch_concur` on which its apply must run
    /// one iteration at a time.
    enum SerialChain: String, CaseIterable, CustomTestStringConvertible {
        case serial = "concurrent -> serial"
        case concurrentSerial = "concurrent -> concurrent -> serial"
        case serialConcurrent = "concurrent -> serial -> concurrent"
        case serialSerial = "concurrent -> serial -> serial"

        var testDescription: String { rawValue }

        /// The queue to apply on and the serial queue of its chain that a
        /// test occupies (the one nearest the root).
        func make() -> (queue: WorkQueue, serial: WorkQueue) {
            switch self {
            case .serial:
                let s = WorkQueue(label: "apply.serial")
                return (WorkQueue(label: "apply.q", kind: .concurrent, target: s), s)
            case .concurrentSerial:
                let s = WorkQueue(label: "apply.serial")
                let c = WorkQueue(label: "apply.middle", kind: .concurrent, target: s)
                return (WorkQueue(label: "apply.q", kind: .concurrent, target: c), s)
            case .serialConcurrent:
                let c = WorkQueue(label: "apply.root", kind: .concurrent)
                let s = WorkQueue(label: "apply.serial", target: c)
                return (WorkQueue(label: "apply.q", kind: .concurrent, target: s), s)
            case .serialSerial:
                let s = WorkQueue(label: "apply.serial")
                let m = WorkQueue(label: "apply.middle", target: s)
                return (WorkQueue(label: "apply.q", kind: .concurrent, target: m), s)
            }
        }
    }

    /// Runs `apply` on a thread of its own; the returned latch opens when it
    /// has returned.
    private func applyOnAThread(_ queue: WorkQueue, iterations: Int, stride: Int? = nil, _ body: @escaping @Sendable (Int) -> Void) -> (finished: Latch, join: () -> Void) {
        let finished = Latch()
        let box = Unchecked(queue)
        let join = startThread {
            box.value.apply(iterations: iterations, stride: stride, body)
            finished.countDown()
        }
        return (finished, join)
    }

    @Test(arguments: SerialChain.allCases)
    func applyWaitsWhileASerialQueueOnItsChainRunsAnItem(_ chain: SerialChain) {
        let (queue, serial) = chain.make()
        let occupancy = Occupancy()
        let rootStarted = Latch()
        let gate = Latch()
        let ran = AtomicCounters(2)  // [0] iterations run, [1] overlaps
        serial.async {
            _ = occupancy.enter()
            rootStarted.countDown()
            gate.wait()
            occupancy.leave()
        }
        #expect(rootStarted.wait())
        let n = 32
        let (finished, join) = applyOnAThread(queue, iterations: n) { _ in
            if occupancy.enter() != 1 { ran.add(1) }
            ran.add(0)
            occupancy.leave()
        }
        NativeThread.sleep(for: .milliseconds(20))
        #expect(ran[0] == 0, "\(ran[0]) iterations ran while the serial queue ran its own item")
        gate.countDown()
        #expect(finished.wait(), "apply did not return after the serial queue's item finished")
        join()
        #expect(ran[0] == n)
        #expect(ran[1] == 0)
        #expect(occupancy.peak == 1)
    }

    @Test(arguments: SerialChain.allCases)
    func applyRunsOneIterationAtATimeWhereTheChainAllowsOne(_ chain: SerialChain) {
        let (queue, serial) = chain.make()
        let occupancy = Occupancy()
        let counts = AtomicCounters(3)  // [0] iterations, [1] root items, [2] overlaps
        let group = WorkGroup()
        // The serial queue's own items arrive while the apply runs.
        let feeder = startThread {
            for _ in 0..<200 {
                serial.async(group: group) {
                    if occupancy.enter() != 1 { counts.add(2) }
                    for _ in 0..<200 { spinLoopHint() }
                    counts.add(1)
                    occupancy.leave()
                }
            }
        }
        let n = 400
        queue.apply(iterations: n) { _ in
            if occupancy.enter() != 1 { counts.add(2) }
            for _ in 0..<500 { spinLoopHint() }
            counts.add(0)
            occupancy.leave()
        }
        feeder()
        #expect(group.wait(timeout: .seconds(30)) == .completed)
        #expect(counts[0] == n)
        #expect(counts[1] == 200)
        #expect(counts[2] == 0, "an iteration ran beside another item of the serial queue")
        #expect(occupancy.peak == 1)
    }

    /// A barrier running on the queue itself, or on a concurrent queue of its
    /// chain.
    @Test(arguments: [false, true])
    func applyWaitsForARunningBarrier(onTarget: Bool) {
        let target = WorkQueue(label: "apply.target", kind: .concurrent)
        let queue = WorkQueue(label: "apply.q", kind: .concurrent, target: target)
        let barrierQueue = onTarget ? target : queue
        let inBarrier = AtomicCounters(1)
        let counts = AtomicCounters(2)  // [0] iterations, [1] run during the barrier
        let started = Latch()
        let gate = Latch()
        barrierQueue.asyncBarrier {
            inBarrier.add(0)
            started.countDown()
            gate.wait()
            inBarrier.add(0, -1)
        }
        #expect(started.wait())
        let n = 64
        let (finished, join) = applyOnAThread(queue, iterations: n) { _ in
            if inBarrier[0] != 0 { counts.add(1) }
            counts.add(0)
        }
        NativeThread.sleep(for: .milliseconds(20))
        #expect(counts[0] == 0, "\(counts[0]) iterations ran during the barrier")
        gate.countDown()
        #expect(finished.wait(), "apply did not return after the barrier")
        join()
        #expect(counts[0] == n)
        #expect(counts[1] == 0)
    }

    /// A barrier submitted while iterations run waits for all of them: each
    /// iteration holds its share of the queue. The iterations wait for a
    /// gate that opens a while after the barrier went in.
    @Test(arguments: [1, 64])
    func aBarrierSubmittedDuringApplyWaitsForItsIterations(_ n: Int) {
        let queue = WorkQueue(label: "apply.q", kind: .concurrent)
        let words = AtomicCounters(4)  // [0] iterations running, [1] barrier running, [2] violations, [3] iterations
        let firstStarted = Latch()
        let gate = Latch()
        let barrierDone = Latch()
        let (finished, join) = applyOnAThread(queue, iterations: n) { _ in
            words.add(0)
            if words[1] != 0 { words.add(2) }
            firstStarted.countDown()
            gate.wait()
            words.add(3)
            words.add(0, -1)
        }
        #expect(firstStarted.wait())
        queue.asyncBarrier {
            words.add(1)
            if words[0] != 0 { words.add(2) }
            if words[3] != n { words.add(2) }
            words.add(1, -1)
            barrierDone.countDown()
        }
        NativeThread.sleep(for: .milliseconds(20))
        #expect(!barrierDone.isOpen, "the barrier ran while iterations were running")
        gate.countDown()
        #expect(finished.wait())
        join()
        #expect(barrierDone.wait())
        #expect(words[3] == n)
        #expect(words[2] == 0)
    }

    /// A suspended queue (or one whose target is suspended) starts nothing,
    /// and `apply` on it waits for `resume()`, as `sync` does.
    @Test(arguments: [false, true])
    func applyOnASuspendedQueueWaitsForResume(suspendTarget: Bool) {
        let target = WorkQueue(label: "apply.target", kind: .concurrent)
        let queue = WorkQueue(label: "apply.q", kind: .concurrent, target: target)
        let suspended = suspendTarget ? target : queue
        suspended.suspend()
        let counts = AtomicCounters(1)
        let n = 64
        let (finished, join) = applyOnAThread(queue, iterations: n) { _ in counts.add(0) }
        NativeThread.sleep(for: .milliseconds(20))
        #expect(counts[0] == 0, "\(counts[0]) iterations ran on a suspended queue")
        #expect(!finished.isOpen)
        suspended.resume()
        #expect(finished.wait(), "apply did not return after resume()")
        join()
        #expect(counts[0] == n)
    }

    /// A chain of concurrent queues keeps apply's parallelism: two
    /// iterations meet (each waits, bounded, for the other), and every
    /// iteration runs inside the queue and its chain.
    @Test func applyOnAConcurrentChainRunsIterationsAtOnceInsideTheQueue() throws {
        try #require(WorkQueue.poolWidth >= 2, "one worker: apply runs on the caller alone")
        let target = WorkQueue(label: "apply.target", kind: .concurrent)
        let queue = WorkQueue(label: "apply.q", kind: .concurrent, target: target)
        let arrived = AtomicCounters(3)  // [0] arrivals, [1] met, [2] outside the queue
        queue.apply(iterations: 2, stride: 1) { _ in
            if WorkQueue.current !== queue || !target.isCurrent { arrived.add(2) }
            arrived.add(0)
            let deadline = MonotonicClock.now.advanced(by: .seconds(10))
            while arrived[0] < 2 && MonotonicClock.now < deadline { NativeThread.sleep(for: .microseconds(100)) }
            if arrived[0] == 2 { arrived.add(1) }
        }
        #expect(arrived[1] == 2, "the two iterations never ran at once")
        #expect(arrived[2] == 0)
        // And with a remainder past the strided chunks, every index once.
        let hits = AtomicCounters(1001)
        queue.apply(iterations: 1001, stride: 10) { i in
            if WorkQueue.current !== queue { hits.add(1000) }
            hits.add(i)
        }
        #expect((0..<1000).allSatisfy { hits[$0] == 1 } && hits[1000] == 1)
    }

    /// From an item of the queue (and from its barrier) `apply` runs at once,
    /// as a `sync` would; a barrier's apply still runs alone.
    @Test func applyFromAnItemOrABarrierOfTheQueueRuns() {
        let queue = WorkQueue(label: "apply.q", kind: .concurrent)
        let counts = AtomicCounters(3)  // [0] from the item, [1] from the barrier, [2] ordinary during the barrier
        let inBarrier = AtomicCounters(1)
        let group = WorkGroup()
        queue.async(group: group) {
            queue.apply(iterations: 100) { _ in counts.add(0) }
        }
        queue.asyncBarrier(group: group) {
            inBarrier.add(0)
            queue.apply(iterations: 100) { _ in counts.add(1) }
            inBarrier.add(0, -1)
        }
        for _ in 0..<20 {
            queue.async(group: group) { if inBarrier[0] != 0 { counts.add(2) } }
        }
        #expect(group.wait(timeout: .seconds(30)) == .completed)
        #expect(counts[0] == 100 && counts[1] == 100)
        #expect(counts[2] == 0)
    }
}
