// Custom add sources: 10^6 merges of 1 from 2 threads (500,000 each) into
// one source whose handler sums the data it is given. One iteration is the
// whole batch, timed by the iteration itself from the threads' start until
// the handler has seen all 10^6 (timePerOperation: wall time per merge),
// with the process's CPU time per merge beside it. The handler's sum must be
// exactly 10^6: anything else stops the run. Spindle's `EventSource.data(.add)`
// with its handler on a serial WorkQueue or on a ThreadLoop, beside
// DispatchSource.makeUserDataAddSource + add(data:) on a serial DispatchQueue
// (the reference). The handler-call counts (how many merges coalesced) are
// printed on stderr.
import Benchmark
import BenchSupport
import Dispatch
import Foundation
import Spindle

let mergesPerIteration = 1_000_000
let mergingThreads = 2

/// The handler's running totals.
final class MergeTally: @unchecked Sendable {
    // @unchecked: written only by the source's handler, whose calls never
    // overlap and follow one another in memory order (serial target), and
    // read by the benchmark thread after `done` (acquiring).
    var sum: UInt64 = 0
    var calls = 0
    let done = Counter()

    func handled(_ data: UInt64) {
        sum &+= data
        calls += 1
        if sum >= UInt64(mergesPerIteration) { done.bump() }
    }
}

/// Runs `merge` `mergesPerIteration / mergingThreads` times on each of
/// `mergingThreads` new threads and joins them.
func mergeFromThreads(_ merge: @escaping @Sendable () -> Void) {
    let perThread = mergesPerIteration / mergingThreads
    var threads: [SpawnedThread<Void>] = []
    for _ in 0..<mergingThreads {
        do {
            threads.append(try NativeThread.start { for _ in 0..<perThread { merge() } })
        } catch {
            failLoudly("sources.data.add: cannot start a merging thread: \(error)")
        }
    }
    for thread in threads {
        do { try thread.join() } catch { failLoudly("sources.data.add: a merging thread threw: \(error)") }
    }
}

/// Times one batch: the merges, then the wait for the handler to have seen
/// them all; checks the sum; records time and CPU per merge. `cpu` keeps the
/// running totals across iterations (see SideBySide's note on the process
/// clock).
final class MergeTimer {
    private var cpu: Duration = .zero
    private var operations = 0

    func measure(_ benchmark: Benchmark, _ name: String, _ tally: MergeTally, _ merges: () -> Void) {
        let cpuStart = ProcessCPUTime.now
        let begin = ContinuousClock.now
        merges()
        if !tally.done.wait(for: 1, patience: .seconds(30), "\(name)'s handler sum") {
            failLoudly("sources.data.add/\(name): handler sum \(tally.sum) after 30 s, expected \(mergesPerIteration)")
        }
        let elapsed = ContinuousClock.now - begin
        cpu += ProcessCPUTime.now - cpuStart
        operations += mergesPerIteration
        if tally.sum != UInt64(mergesPerIteration) {
            failLoudly("sources.data.add/\(name): handler data summed to \(tally.sum), expected \(mergesPerIteration) exactly")
        }
        report("sources.data.add/\(name): 10^6 merges arrived exactly, in \(tally.calls) handler calls")
        benchmark.recordTimePerOperation(elapsed: elapsed, operations: mergesPerIteration)
        benchmark.recordCPUTimePerOperation(cpu, operations: operations)
        // The harness times only what follows: its own clock would see a
        // 10^6-merge iteration as one operation.
        benchmark.startMeasurement()
    }
}

func spindleMerges(_ place: Place) -> (Benchmark) -> Void {
    let timer = MergeTimer()
    return { benchmark in
        let threads = LoopThreads()
        let tally = MergeTally()
        let cancelled = Counter()
        let source = EventSource.data(.add, on: place.makeTarget("bench.sources.data", threads))
        source.setEventHandler { source in tally.handled(source.data) }
        source.setCancelHandler { _ in cancelled.bump() }
        source.activate()
        timer.measure(benchmark, place.rowName, tally) {
            mergeFromThreads { source.merge(data: 1) }
        }
        source.cancel()
        cancelled.wait(for: 1, "the data source's cancel handler")
        threads.stopAll()
    }
}

func dispatchMerges() -> (Benchmark) -> Void {
    let timer = MergeTimer()
    return { benchmark in
        let tally = MergeTally()
        let cancelled = Counter()
        let box = DispatchAddSource(DispatchSource.makeUserDataAddSource(queue: DispatchQueue(label: "bench.sources.data")))
        // The handler reads the data through the source (as Dispatch's
        // handlers do); the cycle ends when the cancel releases the handler.
        box.source.setEventHandler { tally.handled(UInt64(box.source.data)) }
        box.source.setCancelHandler { cancelled.bump() }
        box.source.resume()
        timer.measure(benchmark, "DispatchSourceUserDataAdd", tally) {
            mergeFromThreads { box.source.add(data: 1) }
        }
        box.source.cancel()
        cancelled.wait(for: 1, "the Dispatch source's cancel handler")
    }
}

/// Dispatch's add source, to hand to the merging threads.
final class DispatchAddSource: @unchecked Sendable {
    // @unchecked: Dispatch documents its sources as thread-safe (any thread
    // may `add(data:)`); the protocol is not marked Sendable.
    let source: any DispatchSourceUserDataAdd
    init(_ source: any DispatchSourceUserDataAdd) { self.source = source }
}

func dataAddBenchmarks() {
    let settings = RunSettings(
        scalingFactor: .one, maxDuration: .seconds(2), maxIterations: 30, warmupIterations: 1,
        reportedMetrics: [.timePerOperation, .cpuPerOperation], bodyRecordsCPU: true,
        operationsPerIteration: mergesPerIteration)
    var rows: [Implementation] = Place.allCases.map { place in
        Implementation(place.rowName, isReference: false, body: spindleMerges(place))
    }
    rows.append(.reference("DispatchSourceUserDataAdd", body: dispatchMerges()))
    sideBySide(group: "sources.data.add 1000000 merges 2 threads", settings: settings, implementations: rows)
}
