// Spindle's work queues beside Dispatch, the peer a user would pick instead:
// WorkQueue, WorkGroup and Semaphore beside DispatchQueue, DispatchGroup and
// DispatchSemaphore, each group's Spindle and Dispatch rows in the same run.
//
// One operation is one item (a submitted closure, one iteration of
// concurrentPerform, one link of a chain, one round trip), except skynet,
// whose operation is the whole tree. Items are empty or bump a counter that
// only the queue's own items touch, so what is measured is the queue.
//
// Almost every group has a thread that waits for another (a `sync` behind
// queued items, a group wait, a semaphore), so every group reports the
// process's CPU time per item beside the wall clock: on this 2-vCPU machine
// a row whose CPU column is about twice its time kept both cores busy,
// spinning or working.
//
// Parts of an iteration that are not the thing measured (draining what the
// enqueue-only group queued, queuing what the drain-only group drains) run
// outside package-benchmark's startMeasurement()/stopMeasurement(), and those
// groups record the CPU time of the measured part themselves
// (`RegionCPU`). Every wait that a benchmark controls has a 30 s limit and
// reports a miss on stderr instead of hanging; a wrong count is reported
// there too (benchmarks measure, tests assert).

import Benchmark
import BenchSupport
import Dispatch
import Foundation
import Spindle

#if canImport(Glibc)
import Glibc
#endif

// MARK: - Helpers

/// A count that only one serial queue's items (or one thread) touch at a
/// time, so it needs no synchronization of its own.
final class Tally: @unchecked Sendable {
    // @unchecked: written only by items of one serial queue, which run one
    // at a time with each item's writes visible to the next, and read by the
    // submitter after a `sync` on that queue.
    var value = 0
}

/// How long a benchmark waits for a queue before it reports a miss.
let patience: Duration = .seconds(30)

/// Reports a problem on stderr (a missed wait, a wrong count): the run goes
/// on, the message is in the log.
func report(_ message: String) {
    FileHandle.standardError.write(Data("Queues benchmarks: \(message)\n".utf8))
}

func waitOrReport(_ semaphore: Spindle.Semaphore, _ what: String) {
    if !semaphore.wait(timeout: patience) { report("\(what)/Spindle: no signal within \(patience)") }
}

func waitOrReport(_ semaphore: DispatchSemaphore, _ what: String) {
    if semaphore.wait(timeout: .now() + .seconds(30)) == .timedOut {
        report("\(what)/Dispatch: no signal within \(patience)")
    }
}

func waitOrReport(_ group: WorkGroup, _ what: String) {
    if group.wait(timeout: patience) == .timedOut {
        report("\(what)/Spindle: group not empty after \(patience) (count \(group.count))")
    }
}

func waitOrReport(_ group: DispatchGroup, _ what: String) {
    if group.wait(timeout: .now() + .seconds(30)) == .timedOut {
        report("\(what)/Dispatch: group not empty after \(patience)")
    }
}

func check(_ tally: Tally, expected: Int, _ what: String) {
    if tally.value != expected {
        report("\(what): counted \(tally.value) items, expected \(expected)")
    }
    tally.value = 0
}

/// The process's CPU time over the measured parts of a benchmark's
/// iterations, as a running average per operation since the first one
/// (for the reason SideBySide.swift's `measuringCPUPerOperation` gives). For
/// groups with `bodyRecordsCPU`: call `start()` right after
/// `startMeasurement()` and `stop(_:)` right before `stopMeasurement()`.
/// Another thread's CPU time reaches the process clock when it is switched
/// out or at a scheduler tick, so a worker's spinning after the measured part
/// ends is not in it.
final class RegionCPU {
    private var total: Duration = .zero
    private var operations = 0
    private var started: Duration = .zero

    func start() { started = ProcessCPUTime.now }

    func stop(_ benchmark: Benchmark) {
        total += ProcessCPUTime.now - started
        operations += benchmark.scaledIterations.count
        benchmark.recordCPUTimePerOperation(total, operations: operations)
    }
}

private final class ThreadBody {
    let body: () -> Void
    init(_ body: @escaping () -> Void) { self.body = body }
}

/// Runs `body(i)` for `i` in `0..<count` on `count` new pthreads and joins
/// them: the same plain threads for every implementation.
func runOnThreads(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) {
    var threads: [pthread_t] = []
    threads.reserveCapacity(count)
    for i in 0..<count {
        var thread = pthread_t()
        let box = Unmanaged.passRetained(ThreadBody { body(i) }).toOpaque()
        let rc = pthread_create(&thread, nil, { raw in
            Unmanaged<ThreadBody>.fromOpaque(raw!).takeRetainedValue().body()
            return nil
        }, box)
        precondition(rc == 0, "pthread_create failed: \(rc)")
        threads.append(thread)
    }
    for thread in threads { pthread_join(thread, nil) }
}

// MARK: - Chained async (each item submits the next)

func spindleChain(_ left: Int, on queue: WorkQueue, _ done: Spindle.Semaphore) {
    queue.async {
        if left == 0 { done.signal() } else { spindleChain(left - 1, on: queue, done) }
    }
}

func dispatchChain(_ left: Int, on queue: DispatchQueue, _ done: DispatchSemaphore) {
    queue.async {
        if left == 0 { done.signal() } else { dispatchChain(left - 1, on: queue, done) }
    }
}

// MARK: - Skynet

// A tree of 10^6 leaves, fan-out 10 (1,111,111 tasks in all). Every node is
// one async item on the default global queue. A leaf stores its number in
// its parent's slot and leaves the parent's group; an inner node submits its
// ten children into a group of its own and asks to be notified when the
// group is empty; the notification sums the ten slots into the node's own
// slot in its parent and leaves the parent's group. Nothing blocks a worker.
// The root's notification signals the benchmark thread. The sum of the
// leaves' numbers is checked: 0 + 1 + ... + (10^6 - 1).

/// Ten result slots of one inner node, filled by its children (each its own
/// slot) and read by the node's notification after the group is empty.
final class Slots: @unchecked Sendable {
    // @unchecked: each slot has one writer, which writes before leaving the
    // group; the one reader reads after the group's notification, which the
    // group orders after every leave.
    let values = UnsafeMutablePointer<Int>.allocate(capacity: 10)
    deinit { values.deallocate() }
}

let skynetLeaves = 1_000_000
let skynetSum = skynetLeaves * (skynetLeaves - 1) / 2

func spindleSkynet(number: Int, size: Int, into parent: Slots, slot: Int, of parentGroup: WorkGroup) {
    parentGroup.enter()
    WorkQueue.global().async {
        if size == 1 {
            parent.values[slot] = number
            parentGroup.leave()
            return
        }
        let group = WorkGroup()
        let slots = Slots()
        let childSize = size / 10
        for i in 0..<10 {
            spindleSkynet(number: number + i * childSize, size: childSize, into: slots, slot: i, of: group)
        }
        group.notify(on: WorkQueue.global()) {
            var sum = 0
            for i in 0..<10 { sum += slots.values[i] }
            parent.values[slot] = sum
            parentGroup.leave()
        }
    }
}

func dispatchSkynet(number: Int, size: Int, into parent: Slots, slot: Int, of parentGroup: DispatchGroup) {
    parentGroup.enter()
    DispatchQueue.global().async {
        if size == 1 {
            parent.values[slot] = number
            parentGroup.leave()
            return
        }
        let group = DispatchGroup()
        let slots = Slots()
        let childSize = size / 10
        for i in 0..<10 {
            dispatchSkynet(number: number + i * childSize, size: childSize, into: slots, slot: i, of: group)
        }
        group.notify(queue: DispatchQueue.global()) {
            var sum = 0
            for i in 0..<10 { sum += slots.values[i] }
            parent.values[slot] = sum
            parentGroup.leave()
        }
    }
}

// MARK: - Nested submission to start elsewhere

/// One probe of group 13: the submitter's stamp, the submitted item's stamp
/// and its start flag, written by items and read by the benchmark thread
/// after the submitter's signal (which orders them).
final class NestedStart: @unchecked Sendable {
    // @unchecked: `submitted` and `started` are written by the two items
    // before the submitter signals the benchmark thread, which reads them
    // after its wait; `startedFlag` is atomic.
    var submitted: Int64 = 0
    var started: Int64 = 0
    let startedFlag = UnsafeMutablePointer<Int>.allocate(capacity: 1)

    init() { startedFlag.initialize(to: 0) }
    deinit { startedFlag.deallocate() }

    /// The submitted item: its start time, then the flag.
    @inline(__always)
    func start() {
        started = nanosecondsNow()
        AtomicMemory.store(1, to: startedFlag, ordering: .releasing)
    }

    /// The submitter, after it submitted: computes (spins, no system call)
    /// until the submitted item has started, 10 s at most.
    func computeUntilStarted() {
        let limit = nanosecondsNow() + 10_000_000_000
        while AtomicMemory.load(from: startedFlag, ordering: .acquiring) == 0 {
            if nanosecondsNow() > limit {
                report("nested submit: the submitted item did not start within 10 s while its submitter computed")
                started = nanosecondsNow()
                return
            }
            spinLoopHint()
        }
    }

    /// Records the latency of the last probe and rearms.
    func record(_ benchmark: Benchmark) {
        benchmark.recordTimePerOperation(elapsed: .nanoseconds(started - submitted), operations: 1)
        AtomicMemory.store(0, to: startedFlag, ordering: .relaxed)
    }
}

@inline(__always)
func nanosecondsNow() -> Int64 { MonotonicClock.now.nanoseconds }

// MARK: - Registration

let benchmarks: @Sendable () -> Void = {
    asyncAfterBenchmarks()
    // 1,000 items per measured iteration (microseconds to a few ms each).
    let kiloItems = RunSettings(
        scalingFactor: .kilo, maxDuration: .milliseconds(500), maxIterations: 2_000, warmupIterations: 5,
        reportedMetrics: [.cpuPerOperation])
    // 10^6 items per measured iteration (tens to hundreds of ms each).
    let megaItems = RunSettings(
        scalingFactor: .mega, maxDuration: .milliseconds(1_500), maxIterations: 15, warmupIterations: 1,
        reportedMetrics: [.cpuPerOperation])

    // MARK: 1. serial async ×1000, then one sync

    do {
        let queue = WorkQueue(label: "bench.serial.async-sync")
        let tally = Tally()
        let dispatch = DispatchQueue(label: "bench.serial.async-sync")
        let dispatchTally = Tally()
        let group = "queue.serial async+sync"
        sideBySide(
            group: group, settings: kiloItems,
            spindle: { benchmark in
                for _ in benchmark.scaledIterations { queue.async { tally.value &+= 1 } }
                queue.sync {}
                check(tally, expected: benchmark.scaledIterations.count, "\(group)/Spindle")
            },
            peers: [
                .reference("Dispatch") { benchmark in
                    for _ in benchmark.scaledIterations { dispatch.async { dispatchTally.value &+= 1 } }
                    dispatch.sync {}
                    check(dispatchTally, expected: benchmark.scaledIterations.count, "\(group)/Dispatch")
                },
            ])
    }

    // MARK: 2. enqueue only (onto a suspended serial queue)

    do {
        // Measured: the asyncs onto a suspended queue. Not measured: the
        // suspend before, the resume and the drain (a sync) after.
        let settings = RunSettings(
            scalingFactor: .kilo, maxDuration: .milliseconds(500), maxIterations: 2_000, warmupIterations: 5,
            reportedMetrics: [.cpuPerOperation], bodyRecordsCPU: true)
        let queue = WorkQueue(label: "bench.serial.enqueue")
        let tally = Tally()
        let cpu = RegionCPU()
        let dispatch = DispatchQueue(label: "bench.serial.enqueue")
        let dispatchTally = Tally()
        let dispatchCPU = RegionCPU()
        let group = "queue.serial enqueue suspended"
        sideBySide(
            group: group, settings: settings,
            spindle: { benchmark in
                queue.suspend()
                benchmark.startMeasurement()
                cpu.start()
                for _ in benchmark.scaledIterations { queue.async { tally.value &+= 1 } }
                cpu.stop(benchmark)
                benchmark.stopMeasurement()
                queue.resume()
                queue.sync {}
                check(tally, expected: benchmark.scaledIterations.count, "\(group)/Spindle")
            },
            peers: [
                .reference("Dispatch") { benchmark in
                    dispatch.suspend()
                    benchmark.startMeasurement()
                    dispatchCPU.start()
                    for _ in benchmark.scaledIterations { dispatch.async { dispatchTally.value &+= 1 } }
                    dispatchCPU.stop(benchmark)
                    benchmark.stopMeasurement()
                    dispatch.resume()
                    dispatch.sync {}
                    check(dispatchTally, expected: benchmark.scaledIterations.count, "\(group)/Dispatch")
                },
            ])
    }

    // MARK: 3. drain only (10^6 items queued while suspended)

    do {
        // Not measured: suspending and queuing 10^6 items. Measured: resume
        // until a sync behind them returns (a worker's wake-up and the
        // caller's, spread over 10^6 items).
        let settings = RunSettings(
            scalingFactor: .mega, maxDuration: .milliseconds(1_500), maxIterations: 10, warmupIterations: 1,
            reportedMetrics: [.cpuPerOperation], bodyRecordsCPU: true)
        let queue = WorkQueue(label: "bench.serial.drain")
        let tally = Tally()
        let cpu = RegionCPU()
        let dispatch = DispatchQueue(label: "bench.serial.drain")
        let dispatchTally = Tally()
        let dispatchCPU = RegionCPU()
        let group = "queue.serial drain 1000000 items"
        sideBySide(
            group: group, settings: settings,
            spindle: { benchmark in
                queue.suspend()
                for _ in benchmark.scaledIterations { queue.async { tally.value &+= 1 } }
                benchmark.startMeasurement()
                cpu.start()
                queue.resume()
                queue.sync {}
                cpu.stop(benchmark)
                benchmark.stopMeasurement()
                check(tally, expected: benchmark.scaledIterations.count, "\(group)/Spindle")
            },
            peers: [
                .reference("Dispatch") { benchmark in
                    dispatch.suspend()
                    for _ in benchmark.scaledIterations { dispatch.async { dispatchTally.value &+= 1 } }
                    benchmark.startMeasurement()
                    dispatchCPU.start()
                    dispatch.resume()
                    dispatch.sync {}
                    dispatchCPU.stop(benchmark)
                    benchmark.stopMeasurement()
                    check(dispatchTally, expected: benchmark.scaledIterations.count, "\(group)/Dispatch")
                },
            ])
    }

    // MARK: 4. sync on an idle serial queue

    do {
        let queue = WorkQueue(label: "bench.serial.sync")
        let dispatch = DispatchQueue(label: "bench.serial.sync")
        sideBySide(
            group: "queue.serial sync idle", settings: kiloItems,
            spindle: { benchmark in
                for _ in benchmark.scaledIterations { queue.sync {} }
            },
            peers: [
                .reference("Dispatch") { benchmark in
                    for _ in benchmark.scaledIterations { dispatch.sync {} }
                },
            ])
    }

    // MARK: 5. barrier sync on an idle private concurrent queue

    do {
        let queue = WorkQueue(label: "bench.concurrent.barrier", kind: .concurrent)
        let dispatch = DispatchQueue(label: "bench.concurrent.barrier", attributes: .concurrent)
        sideBySide(
            group: "queue.concurrent syncBarrier idle", settings: kiloItems,
            spindle: { benchmark in
                for _ in benchmark.scaledIterations { queue.syncBarrier {} }
            },
            peers: [
                .reference("Dispatch") { benchmark in
                    for _ in benchmark.scaledIterations { dispatch.sync(flags: .barrier) {} }
                },
            ])
    }

    // MARK: 6. concurrentPerform, 10^6 trivial iterations

    sideBySide(
        group: "queue.concurrentPerform 1000000 iterations", settings: megaItems,
        spindle: { benchmark in
            WorkQueue.concurrentPerform(iterations: benchmark.scaledIterations.count) { i in blackHole(i) }
        },
        peers: [
            .reference("Dispatch") { benchmark in
                DispatchQueue.concurrentPerform(iterations: benchmark.scaledIterations.count) { i in blackHole(i) }
            },
        ])

    // MARK: 7. ping-pong through two serial queues and a semaphore

    do {
        // One round trip: the benchmark thread submits to A, A's item
        // submits to B, B's item signals the semaphore the benchmark thread
        // waits on. Three hand-offs, each to a thread that may be asleep.
        let a = WorkQueue(label: "bench.pingpong.a")
        let b = WorkQueue(label: "bench.pingpong.b")
        let done = Spindle.Semaphore(value: 0)
        let dispatchA = DispatchQueue(label: "bench.pingpong.a")
        let dispatchB = DispatchQueue(label: "bench.pingpong.b")
        let dispatchDone = DispatchSemaphore(value: 0)
        let group = "queue.pingpong 2 serial queues and a semaphore"
        sideBySide(
            group: group, settings: kiloItems,
            spindle: { benchmark in
                for _ in benchmark.scaledIterations {
                    a.async { b.async { done.signal() } }
                    waitOrReport(done, group)
                }
            },
            peers: [
                .reference("Dispatch") { benchmark in
                    for _ in benchmark.scaledIterations {
                        dispatchA.async { dispatchB.async { dispatchDone.signal() } }
                        waitOrReport(dispatchDone, group)
                    }
                },
            ])
    }

    // MARK: 8. chained global async

    do {
        let done = Spindle.Semaphore(value: 0)
        let dispatchDone = DispatchSemaphore(value: 0)
        // One chain of 10^6 links per iteration: a chain started from this
        // thread wakes a parked worker, and its end wakes this thread (on
        // this VM 20-50 us each while a vCPU idles); spread over 1,000-link
        // chains those two wake-ups were most of a link's time, for both.
        let group = "queue.global async chain"
        sideBySide(
            group: group, settings: megaItems,
            spindle: { benchmark in
                spindleChain(benchmark.scaledIterations.count - 1, on: .global(), done)
                waitOrReport(done, group)
            },
            peers: [
                .reference("Dispatch") { benchmark in
                    dispatchChain(benchmark.scaledIterations.count - 1, on: .global(), dispatchDone)
                    waitOrReport(dispatchDone, group)
                },
            ])
    }

    // MARK: 9. global async(group:) ×10^6, then wait

    do {
        let group = "queue.global async group 1000000 items"
        sideBySide(
            group: group, settings: megaItems,
            spindle: { benchmark in
                let members = WorkGroup()
                let queue = WorkQueue.global()
                for _ in benchmark.scaledIterations { queue.async(group: members) {} }
                waitOrReport(members, group)
            },
            peers: [
                .reference("Dispatch") { benchmark in
                    let members = DispatchGroup()
                    let queue = DispatchQueue.global()
                    for _ in benchmark.scaledIterations { queue.async(group: members) {} }
                    waitOrReport(members, group)
                },
            ])
    }

    // MARK: 10. skynet

    do {
        // About 1 s per tree here. package-benchmark records an iteration's
        // throughput as 10^9 / its nanoseconds rounded to an integer, so an
        // iteration of 2 s or more has none, and the JMH export drops a row
        // with no throughput at all: if the only measured iteration takes
        // over `maxDuration`, or every one takes 2 s or more, the row is
        // missing from the table ("Throughput metric must be present" on
        // stderr). A 5 s budget leaves room for several iterations even when
        // the first is slow.
        let group = "queue.skynet 1000000 leaves fan-out 10"
        let settings = RunSettings(
            scalingFactor: .one, maxDuration: .seconds(5), maxIterations: 8, warmupIterations: 1,
            reportedMetrics: [.cpuPerOperation])
        sideBySide(
            group: group, settings: settings,
            spindle: { _ in
                let root = Slots()
                let members = WorkGroup()
                spindleSkynet(number: 0, size: skynetLeaves, into: root, slot: 0, of: members)
                waitOrReport(members, group)
                if root.values[0] != skynetSum { report("\(group)/Spindle: sum \(root.values[0]), expected \(skynetSum)") }
            },
            peers: [
                .reference("Dispatch") { _ in
                    let root = Slots()
                    let members = DispatchGroup()
                    dispatchSkynet(number: 0, size: skynetLeaves, into: root, slot: 0, of: members)
                    waitOrReport(members, group)
                    if root.values[0] != skynetSum { report("\(group)/Dispatch: sum \(root.values[0]), expected \(skynetSum)") }
                },
            ])
    }

    // MARK: 11. allocations per submitted closure

    do {
        // The same iteration as group 1 (1,000 asyncs, one sync), counting
        // mallocs instead of timing: a closure that captures a reference and
        // an Int (its context is one allocation of its own; a closure that
        // captures a single reference uses it as its context and allocates
        // nothing), and one that captures nothing (no context: what remains
        // is the queue's).
        let settings = RunSettings(
            scalingFactor: .kilo, maxDuration: .milliseconds(300), maxIterations: 200, warmupIterations: 5,
            reportedMetrics: [.mallocCount, .mallocBytes])
        let queue = WorkQueue(label: "bench.serial.mallocs")
        let tally = Tally()
        let dispatch = DispatchQueue(label: "bench.serial.mallocs")
        let dispatchTally = Tally()
        sideBySide(
            group: "queue.serial async mallocs capturing", settings: settings,
            spindle: { benchmark in
                for i in benchmark.scaledIterations { queue.async { tally.value &+= i } }
                queue.sync {}
                tally.value = 0
            },
            peers: [
                .reference("Dispatch") { benchmark in
                    for i in benchmark.scaledIterations { dispatch.async { dispatchTally.value &+= i } }
                    dispatch.sync {}
                    dispatchTally.value = 0
                },
            ])
        sideBySide(
            group: "queue.serial async mallocs non-capturing", settings: settings,
            spindle: { benchmark in
                for _ in benchmark.scaledIterations { queue.async {} }
                queue.sync {}
            },
            peers: [
                .reference("Dispatch") { benchmark in
                    for _ in benchmark.scaledIterations { dispatch.async {} }
                    dispatch.sync {}
                },
            ])
    }

    // MARK: 12. many producers onto one serial queue

    for producers in [2, 4, 8, 16] {
        // 10^6 items per iteration, split evenly over `producers` new
        // threads (joined), then one sync behind them. Thread start and
        // join, about 0.5 ms for 16, are under 1 ns per item.
        let queue = WorkQueue(label: "bench.serial.producers")
        let tally = Tally()
        let dispatch = DispatchQueue(label: "bench.serial.producers")
        let dispatchTally = Tally()
        let group = "queue.serial async \(producers) producers"
        sideBySide(
            group: group, settings: megaItems,
            spindle: { benchmark in
                let each = benchmark.scaledIterations.count / producers
                runOnThreads(producers) { _ in
                    for _ in 0..<each { queue.async { tally.value &+= 1 } }
                }
                queue.sync {}
                check(tally, expected: each * producers, "\(group)/Spindle")
            },
            peers: [
                .reference("Dispatch") { benchmark in
                    let each = benchmark.scaledIterations.count / producers
                    runOnThreads(producers) { _ in
                        for _ in 0..<each { dispatch.async { dispatchTally.value &+= 1 } }
                    }
                    dispatch.sync {}
                    check(dispatchTally, expected: each * producers, "\(group)/Dispatch")
                },
            ])
    }

    // MARK: 13. a submission from a computing item, to its start elsewhere

    do {
        // From an item's submission (made while it runs) to the submitted
        // item's start, while the submitter keeps computing until then: the
        // submitted item can only start on another worker, which idles
        // (parked since the previous probe) when the submission is made.
        // The row's time is that latency (one probe per iteration); the
        // CPU column counts the submitter's spin too, alike for every row.
        // Spindle's pool as the global queue and as the task executor of
        // `async let`, beside Dispatch's global queue (the reference).
        // `async let` on Swift's default executor has no row: package-
        // benchmark calls a body from its async runner, which the body
        // blocks for the iteration, and beside that the default executor
        // never started the child while its parent computed on this 2-CPU
        // machine (every iteration of such a row ran into the 10 s limit,
        // on 2026-11-27).
        let group = "queue.nested submit to start elsewhere"
        let settings = RunSettings(
            scalingFactor: .one, maxDuration: .seconds(2), maxIterations: 1_000, warmupIterations: 20,
            reportedMetrics: [.timePerOperation, .cpuPerOperation])
        let probe = NestedStart()
        let done = Spindle.Semaphore(value: 0)
        let dispatchDone = DispatchSemaphore(value: 0)
        @Sendable func stampedChild() async { probe.start() }
        sideBySide(
            group: group, settings: settings,
            implementations: [
                Implementation("Spindle", isReference: false) { benchmark in
                    WorkQueue.global().async {
                        probe.submitted = nanosecondsNow()
                        WorkQueue.global().async { probe.start() }
                        probe.computeUntilStarted()
                        _ = done.signal()
                    }
                    waitOrReport(done, group)
                    probe.record(benchmark)
                },
                Implementation("Spindle async let", isReference: false) { benchmark in
                    Task(executorPreference: WorkQueue.global()) {
                        probe.submitted = nanosecondsNow()
                        async let child: Void = stampedChild()
                        probe.computeUntilStarted()
                        await child
                        _ = done.signal()
                    }
                    waitOrReport(done, group)
                    probe.record(benchmark)
                },
                .reference("Dispatch") { benchmark in
                    DispatchQueue.global().async {
                        probe.submitted = nanosecondsNow()
                        DispatchQueue.global().async { probe.start() }
                        probe.computeUntilStarted()
                        dispatchDone.signal()
                    }
                    waitOrReport(dispatchDone, group)
                    probe.record(benchmark)
                },
            ])
    }
}
