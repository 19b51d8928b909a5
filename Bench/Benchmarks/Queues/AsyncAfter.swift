// `async(after:)` lateness under a busy pool: while every worker of the pool
// computes (one chain per worker of ~100 µs items, each submitting the next
// to the global queue), a 1 ms `async(after:)` on the global queue, whose
// closure reads the clock: the row's time (timePerOperation) is how far
// after its deadline it started, one per iteration; the process's CPU time
// per iteration (both workers' computing included, so about twice the
// iteration's wall time) beside it. Spindle's WorkQueue beside
// DispatchQueue.asyncAfter under the same load (the reference), each in its
// own process.
#if canImport(Glibc)
import Benchmark
import BenchSupport
import Dispatch
import Foundation
import Spindle

/// The busy load (one chain per CPU: the pool is as wide as the machine)
/// and the probe of one process.
final class AfterProbe: @unchecked Sendable {
    // @unchecked: `lateness` is written by the closure before it signals
    // the semaphore and read by the benchmark thread after.
    var lateness: Int64 = 0
    let done = DispatchSemaphore(value: 0)
    /// How many chains computed an item (to see the load runs).
    let spins = UnsafeMutablePointer<Int>.allocate(capacity: 1)

    init() { spins.initialize(to: 0) }

    /// ~100 µs of arithmetic the optimizer keeps.
    @inline(never)
    static func compute(_ seed: Int) -> Int {
        let end = MonotonicClock.now.nanoseconds + 100_000
        var x = seed
        while MonotonicClock.now.nanoseconds < end { for i in 0..<64 { x = x &* 6364136223846793005 &+ i } }
        return x
    }
}

nonisolated(unsafe) var afterProbe: AfterProbe?
// nonisolated(unsafe): made on the first iteration; iterations are serial.

private func spindleChain(_ probe: AfterProbe, _ seed: Int) {
    WorkQueue.global().async {
        AtomicMemory.add(1, to: probe.spins, ordering: .relaxed)
        spindleChain(probe, AfterProbe.compute(seed))
    }
}

private func dispatchChain(_ probe: AfterProbe, _ seed: Int) {
    DispatchQueue.global().async {
        AtomicMemory.add(1, to: probe.spins, ordering: .relaxed)
        dispatchChain(probe, AfterProbe.compute(seed))
    }
}

private func busyProbe(_ chain: (AfterProbe, Int) -> Void) -> AfterProbe {
    if let afterProbe { return afterProbe }
    let probe = AfterProbe()
    for i in 0..<ProcessInfo.processInfo.activeProcessorCount { chain(probe, i) }
    usleep(50_000)
    afterProbe = probe
    return probe
}

private func recordLateness(_ benchmark: Benchmark, _ probe: AfterProbe, _ group: String) {
    if probe.done.wait(timeout: .now() + 30) == .timedOut {
        report("\(group): a 1 ms delayed closure did not run in 30 s")
        benchmark.recordTimePerOperation(elapsed: .seconds(30), operations: 1)
        return
    }
    benchmark.recordTimePerOperation(elapsed: .nanoseconds(max(0, probe.lateness)), operations: 1)
}

func asyncAfterBenchmarks() {
    let settings = RunSettings(
        scalingFactor: .one, maxDuration: .seconds(2), maxIterations: 500, warmupIterations: 10,
        reportedMetrics: [.timePerOperation, .cpuPerOperation])
    let group = "queue.asyncAfter lateness 1ms busy pool"
    sideBySide(
        group: group, settings: settings,
        spindle: { benchmark in
            let probe = busyProbe(spindleChain)
            let deadline = MonotonicClock.now.advanced(by: .milliseconds(1))
            WorkQueue.global().async(after: deadline) {
                probe.lateness = MonotonicClock.now.nanoseconds - deadline.nanoseconds
                probe.done.signal()
            }
            recordLateness(benchmark, probe, group)
        },
        peers: [
            .reference("Dispatch") { benchmark in
                let probe = busyProbe(dispatchChain)
                // Dispatch's deadline is taken just after this one (tens of
                // nanoseconds later): its lateness is, if anything, overstated.
                let deadline = MonotonicClock.now.advanced(by: .milliseconds(1))
                DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(1)) {
                    probe.lateness = MonotonicClock.now.nanoseconds - deadline.nanoseconds
                    probe.done.signal()
                }
                recordLateness(benchmark, probe, group)
            },
        ])
}
#endif
