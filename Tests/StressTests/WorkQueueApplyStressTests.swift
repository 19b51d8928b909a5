import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// One round's queues: a random forest whose roots target the default global
/// queue, each queue's target an earlier one, so every chain ends there.
private final class Forest: @unchecked Sendable {
    // @unchecked: the arrays are written in `init` only. `plain` is written
    // without atomics only where a queue's exclusion orders the writes (by
    // items on a serial queue's chain, by barriers); ThreadSanitizer reports
    // any two that overlap.
    let queues: [WorkQueue]
    let serial: [Bool]
    /// For each queue, itself then its targets up to the global queue.
    let chains: [[Int]]
    /// Atomic: [q] items running on queue q (through its chain too),
    /// [count + q] barrier of q running, [2 * count] violations.
    let words: AtomicCounters
    /// Plain: [q] written by everything running on serial queue q and by
    /// barriers on concurrent queue q; read by ordinary items on q.
    let plain: UnsafeMutablePointer<Int>
    var count: Int { queues.count }
    var violations: Int { words[2 * count] }

    init(round: Int, _ random: inout XorShift) {
        var queues: [WorkQueue] = []
        var serial: [Bool] = []
        var chains: [[Int]] = []
        let count = 3 + random.next(3)
        for k in 0..<count {
            let isSerial = random.next(3) == 0
            let parent = k == 0 || random.next(3) == 0 ? nil : random.next(k)
            let label = "stress.apply.\(round).\(k)"
            let kind: WorkQueue.Kind = isSerial ? .serial : .concurrent
            queues.append(parent.map { WorkQueue(label: label, kind: kind, target: queues[$0]) } ?? WorkQueue(label: label, kind: kind))
            serial.append(isSerial)
            chains.append([k] + (parent.map { chains[$0] } ?? []))
        }
        self.queues = queues
        self.serial = serial
        self.chains = chains
        words = AtomicCounters(2 * count + 1)
        plain = .allocate(capacity: count)
        plain.initialize(repeating: 0, count: count)
    }

    deinit { plain.deallocate() }

    private func violation() { words.add(2 * count) }

    /// Counts an item in on every queue of `chain`, checking exclusion: on a
    /// serial queue it must be alone, on a concurrent one no barrier may
    /// run. Sequentially consistent adds and loads, so of an item and a
    /// barrier that overlap at least one sees the other.
    func enter(_ chain: [Int]) {
        for q in chain {
            let now = words.add(q)
            if serial[q] {
                if now != 1 { violation() }
                plain[q] &+= 1
            } else {
                if words[count + q] != 0 { violation() }
                _ = plain[q]
            }
        }
    }

    func leave(_ chain: [Int]) {
        for q in chain.reversed() { words.add(q, -1) }
    }

    /// A barrier of concurrent queue `chain[0]`: an ordinary item on the
    /// rest of the chain, alone on its own queue.
    func enterBarrier(_ chain: [Int]) {
        let q = chain[0]
        enter(Array(chain.dropFirst()))
        if words.add(count + q) != 1 { violation() }
        if words[q] != 0 { violation() }
        plain[q] &+= 1
    }

    func leaveBarrier(_ chain: [Int]) {
        words.add(count + chain[0], -1)
        leave(Array(chain.dropFirst()))
    }

    /// Every counter back at zero.
    var isIdle: Bool { (0..<(2 * count)).allSatisfy { words[$0] == 0 } }
}

@Suite("WorkQueue apply stress", .serialized)
struct WorkQueueApplyStressTests {
    /// Rounds of random queue forests (serial and concurrent queues, chains
    /// up to five deep); three threads mix `apply` (with and without a
    /// stride, from an item of the same queue and from a pool worker),
    /// `async`, `sync`,
    /// `asyncBarrier`, `syncBarrier` and short suspensions on random queues.
    /// Every item and iteration counts itself in on each queue of its chain
    /// (an occupancy word per queue): never two on a serial queue, nothing
    /// during a barrier of a concurrent one. Afterwards every iteration and
    /// item ran exactly once and every word is back at zero.
    @Test func applyOnRandomChainsKeepsSerialQueuesAndBarriersExclusive() {
        // CI's 40 rounds (about 10× slower under TSan than natively); 800 at full size.
        let rounds = stressSize(ci: 40, full: 800)
        var operations = 0
        let threads = 3
        let opsPerThread = 60
        var seeder = XorShift(seed: 0x5EED_A991)
        var shapes = 0
        for round in 0..<rounds {
            let forest = Forest(round: round, &seeder)
            if forest.chains.contains(where: { $0.count > 1 && $0.contains(where: { forest.serial[$0] }) && !forest.serial[$0[0]] }) {
                shapes += 1
            }
            let group = WorkGroup()
            // [0] iterations expected, [1] iterations run, [2] items expected, [3] items run.
            let tally = AtomicCounters(4)
            let seed = seeder.next(1 << 30)
            runThreads(threads) { t in
                var random = XorShift(seed: seed &+ t)
                for _ in 0..<opsPerThread {
                    let q = random.next(forest.count)
                    let queue = forest.queues[q]
                    let chain = forest.chains[q]
                    switch random.next(20) {
                    case 0..<7:
                        let n = 1 + random.next(48)
                        let stride = random.next(2) == 0 ? nil : 1 + random.next(8)
                        tally.add(0, n)
                        queue.apply(iterations: n, stride: stride) { _ in
                            forest.enter(chain)
                            for _ in 0..<20 { spinLoopHint() }
                            tally.add(1)
                            forest.leave(chain)
                        }
                    case 7..<11:
                        tally.add(2)
                        queue.async(group: group) {
                            forest.enter(chain)
                            for _ in 0..<20 { spinLoopHint() }
                            tally.add(3)
                            forest.leave(chain)
                        }
                    case 11..<13 where !forest.serial[q]:
                        // An item of the queue that applies on it: `apply`
                        // runs at once there, as `sync` does.
                        let n = 1 + random.next(24)
                        tally.add(0, n)
                        queue.async(group: group) {
                            queue.apply(iterations: n) { _ in
                                forest.enter(chain)
                                tally.add(1)
                                forest.leave(chain)
                            }
                        }
                    case 13..<15 where !forest.serial[q]:
                        tally.add(2)
                        queue.asyncBarrier(group: group) {
                            forest.enterBarrier(chain)
                            for _ in 0..<20 { spinLoopHint() }
                            tally.add(3)
                            forest.leaveBarrier(chain)
                        }
                    case 15 where !forest.serial[q]:
                        tally.add(2)
                        queue.syncBarrier {
                            forest.enterBarrier(chain)
                            tally.add(3)
                            forest.leaveBarrier(chain)
                        }
                    case 16 where random.next(2) == 0:
                        // From a pool worker, which blocks in a blocking region.
                        let n = 1 + random.next(48)
                        tally.add(0, n)
                        WorkQueue.global().async(group: group) {
                            queue.apply(iterations: n) { _ in
                                forest.enter(chain)
                                tally.add(1)
                                forest.leave(chain)
                            }
                        }
                    case 16:
                        tally.add(2)
                        queue.sync {
                            forest.enter(chain)
                            tally.add(3)
                            forest.leave(chain)
                        }
                    case 17:
                        // A short suspension: applies on the chain wait it out.
                        queue.suspend()
                        tally.add(2)
                        queue.async(group: group) {
                            forest.enter(chain)
                            tally.add(3)
                            forest.leave(chain)
                        }
                        usleep(UInt32(random.next(100)))
                        queue.resume()
                    default:
                        tally.add(2)
                        queue.async(group: group) {
                            forest.enter(chain)
                            tally.add(3)
                            forest.leave(chain)
                        }
                    }
                }
            }
            #expect(group.wait(timeout: .seconds(120)) == .completed, "round \(round)")
            #expect(tally[1] == tally[0], "round \(round): iterations")
            #expect(tally[3] == tally[2], "round \(round): items")
            #expect(forest.violations == 0, "round \(round): \(forest.violations) exclusion violations, chains \(forest.chains), serial \(forest.serial)")
            #expect(forest.isIdle, "round \(round)")
            operations += tally[1] + tally[3]
            if forest.violations != 0 { break }
        }
        // The shape the issue names must have come up: a concurrent queue
        // whose chain reaches a serial queue.
        #expect(shapes > 0)
        print("apply stress: \(rounds) rounds, \(shapes) with a concurrent queue over a serial one (ThreadSanitizer: \(underThreadSanitizer))")
        // Every iteration and item checked the occupancy words of its whole chain; five checks per round.
        StressReport.record(operations: operations, threads: threads, checks: operations + 5 * rounds + 1)
    }
}
