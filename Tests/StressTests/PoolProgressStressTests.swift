import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// Counters shared by the items of one run, all atomic.
private final class Tally: @unchecked Sendable {
    // @unchecked: every word is read and written through atomics.
    private let words = UnsafeMutablePointer<Int>.allocate(capacity: 8)
    init() { words.initialize(repeating: 0, count: 8) }
    deinit { words.deallocate() }

    /// Items running now (between their first and last statement).
    static let running = 0
    /// Items submitted and not started.
    static let pending = 1
    /// Submissions made while a worker was free for them (checked).
    static let checked = 2
    /// Checked submissions whose item did not start while its submitter
    /// computed (within `patience`).
    static let missed = 3
    /// Items that ran.
    static let ran = 4
    /// Most items seen running at once.
    static let peak = 5

    @discardableResult
    func add(_ i: Int, _ delta: Int = 1) -> Int { AtomicMemory.add(delta, to: words + i, ordering: .sequentiallyConsistent) }
    func load(_ i: Int) -> Int { AtomicMemory.load(from: words + i, ordering: .sequentiallyConsistent) }

    func notePeak(_ now: Int) {
        var seen = load(Self.peak)
        while now > seen {
            let (swapped, found) = AtomicMemory.compareExchange(expected: seen, desired: now, at: words + Self.peak, ordering: .relaxed)
            if swapped { return }
            seen = found
        }
    }
}

/// A start flag per submitted item.
private final class StartFlag: @unchecked Sendable {
    // @unchecked: the word is atomic.
    private let word = UnsafeMutablePointer<Int>.allocate(capacity: 1)
    init() { word.initialize(to: 0) }
    deinit { word.deallocate() }
    func set() { AtomicMemory.store(1, to: word, ordering: .releasing) }
    var isSet: Bool { AtomicMemory.load(from: word, ordering: .acquiring) != 0 }
}

/// How long a checked submission may wait for its start while its
/// submitter computes. Far beyond any wake-up (under TSan, on a loaded
/// 2-vCPU machine, a wake-up is well under 10 ms); the defect this guards
/// against made the wait last until the submitter returned, which here is
/// never before `patience`.
private let patience: Duration = .seconds(5)

/// One node of a tree: it submits `fanout` children one at a time; after
/// each, if a worker was free for the child when it was submitted (fewer
/// items running or waiting to start than the pool has workers), it
/// computes until the child has started, counting a miss after `patience`;
/// otherwise it computes for a short seeded while. Leaves compute briefly.
private func node(depth: Int, maxDepth: Int, fanout: Int, seed: UInt64, width: Int, tally: Tally, group: WorkGroup, flag: StartFlag) {
    tally.add(Tally.pending, -1)
    let running = tally.add(Tally.running)
    tally.notePeak(running)
    flag.set()
    var rng = SplitMix(seed)
    if depth < maxDepth {
        for c in 0..<fanout {
            let child = StartFlag()
            let childSeed = rng.next()
            // The child counts as pending before it can start; whether a
            // worker is free for it is judged with it counted.
            let pending = tally.add(Tally.pending)
            let free = tally.load(Tally.running) + pending <= width
            WorkQueue.global().async(group: group) {
                node(depth: depth + 1, maxDepth: maxDepth, fanout: fanout, seed: childSeed, width: width, tally: tally, group: group, flag: child)
            }
            if free {
                tally.add(Tally.checked)
                let deadline = MonotonicClock.now.advanced(by: patience)
                while !child.isSet {
                    if MonotonicClock.now >= deadline {
                        tally.add(Tally.missed)
                        break
                    }
                    spinLoopHint()
                }
            } else {
                compute(microseconds: Int(rng.next() % 50) + c)
            }
        }
    } else {
        compute(microseconds: Int(rng.next() % 50))
    }
    tally.add(Tally.ran)
    tally.add(Tally.running, -1)
}

/// Spins for about `microseconds` (no system call: an item that computes).
private func compute(microseconds: Int) {
    let end = MonotonicClock.now.advanced(by: .microseconds(microseconds))
    while MonotonicClock.now < end { spinLoopHint() }
}

/// A seeded generator (SplitMix64), so that a failing run can be replayed.
private struct SplitMix {
    var state: UInt64
    init(_ seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Runs the trees; prints the counts; returns the exit status.
private func runNestedSubmissions() -> Int32 {
    let width = WorkQueue.poolWidth
    // CI's 40 trees (TSan); 800 at full size.
    let rounds = stressSize(ci: 40, full: 800)
    let maxDepth = 4
    let fanout = 3
    let tally = Tally()
    let seed = UInt64(truncatingIfNeeded: MonotonicClock.now.nanoseconds)
    var rng = SplitMix(seed)
    for _ in 0..<rounds {
        let group = WorkGroup()
        tally.add(Tally.pending)
        let rootSeed = rng.next()
        let flag = StartFlag()
        WorkQueue.global().async(group: group) {
            node(depth: 0, maxDepth: maxDepth, fanout: fanout, seed: rootSeed, width: width, tally: tally, group: group, flag: flag)
        }
        guard group.wait(timeout: .seconds(60)) == .completed else {
            print("NESTED: a tree did not finish within 60 s (seed \(seed))")
            return 2
        }
    }
    let perTree = (0...maxDepth).reduce(0) { total, level in total + Int(pow(Double(fanout), Double(level))) }
    let ran = tally.load(Tally.ran)
    let checked = tally.load(Tally.checked)
    let missed = tally.load(Tally.missed)
    print("NESTED: seed \(seed), \(rounds) trees of depth \(maxDepth) and fan-out \(fanout), \(ran) items (expected \(rounds * perTree)), \(checked) submissions made while a worker was free, \(missed) of them not started while the submitter computed; at most \(tally.load(Tally.peak)) running at once (width \(width)); pending and running at rest: \(tally.load(Tally.pending)), \(tally.load(Tally.running))")
    let ok = ran == rounds * perTree && missed == 0 && checked > 0
        && tally.load(Tally.pending) == 0 && tally.load(Tally.running) == 0
    // Recorded here, in the child that ran it: each submission made while a
    // worker was free is one check, and the five totals above.
    StressReport.record(
        operations: ran, threads: width, checks: checked + 5,
        test: "nestedSubmissionsFromComputingItemsStartWhileAWorkerIsFree()")
    return ok ? 0 : 1
}

/// Nested submissions from items that compute: every submission made while
/// a worker was free for it starts while its submitter still computes (the
/// defect: it sat in the submitter's private slot until the submitter
/// returned). Runs in a child process, so that no other test's items occupy
/// the pool and "a worker was free" is what the counts say.
@Suite("Pool progress stress")
struct PoolProgressStressTests {
    @Test func nestedSubmissionsFromComputingItemsStartWhileAWorkerIsFree() async {
        let r = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            exit(runNestedSubmissions())
        }
        print(String(decoding: r?.standardOutputContent ?? [], as: UTF8.self))
    }
}
