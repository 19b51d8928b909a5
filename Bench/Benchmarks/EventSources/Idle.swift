// Idle cost: 10^4 active sources that never fire, a third each of data add
// sources (never merged into), timers due in an hour (repeating hourly) and
// read sources on idle socketpairs (nothing is ever written). One
// iteration makes them, lets them settle for 0.2 s (and halfway through), takes the process's
// resident memory before, halfway and after (memory per source = RSS delta
// / 10^4, and each half's own, which a flat cost makes equal;
// socket buffers are kernel memory and not in it), then measures the
// process's CPU time over 1 s of idleness, and cancels and closes
// everything. The row's time (timePerOperation) is that CPU time in the
// 1 s window (the whole process: the reactor, loop and pool threads, and
// Dispatch's); the memory, and the CPU time of 1 s before the sources were
// made (what the process uses idle without them), are printed on stderr as
// "sources.idle/<row>: ...", one line per iteration. Spindle on a WorkQueue
// and on a ThreadLoop, beside the same sources in Dispatch (the reference).
import Benchmark
import BenchSupport
import Dispatch
import Foundation
import Spindle

#if canImport(Glibc)
import Glibc
#endif

let idleSources = 10_000

/// The kind of the `i`th idle source: data, timer, read, in turn.
enum IdleKind {
    case data, timer, read
    init(_ i: Int) { self = [.data, .timer, .read][i % 3] }
}

/// One iteration of the idle measurement around `make` (which makes and
/// activates the sources and returns how to cancel them and wait for their
/// cancel handlers).
func measureIdle(
    _ benchmark: Benchmark, _ name: String,
    _ make: (_ sockets: [EchoSockets], _ halfway: () -> Void) -> () -> Void
) {
    let readCount = (0..<idleSources).filter { if case .read = IdleKind($0) { true } else { false } }.count
    let sockets = (0..<readCount).map { _ in EchoSockets() }
    usleep(100_000)
    // The process's own idle CPU (the harness, the threads already
    // started), to tell the sources' share from it.
    let baselineSwitches = ThreadSwitches.now()
    let baselineStart = ProcessCPUTime.now
    usleep(1_000_000)
    let baseline = ProcessCPUTime.now - baselineStart
    let baselineWakes = ThreadSwitches.now().since(baselineSwitches)
    let before = residentBytes()
    var middle = 0
    let cancel = make(sockets) {
        usleep(200_000)  // as after the second half
        middle = residentBytes()
    }
    usleep(200_000)
    let after = residentBytes()
    let switches = ThreadSwitches.now()
    let cpuStart = ProcessCPUTime.now
    usleep(1_000_000)
    let cpu = ProcessCPUTime.now - cpuStart
    let wakes = ThreadSwitches.now().since(switches)
    cancel()
    for pair in sockets { pair.close() }
    let perSource = Double(after - before) / Double(idleSources)
    // Each half's own cost per source: flat memory makes them equal.
    let half = Double(idleSources / 2)
    let firstHalf = Int((Double(middle - before) / half).rounded())
    let secondHalf = Int((Double(after - middle) / half).rounded())
    // One line per iteration, in the run's log (scripts/bench's stderr).
    report(
        "sources.idle/\(name): sources=\(idleSources) rssDeltaKiB=\((after - before) / 1024) "
            + "bytesPerSource=\(Int(perSource.rounded())) firstHalf=\(firstHalf) secondHalf=\(secondHalf) "
            + "cpuMicrosecondsPerSecond=\(cpu.nanosecondsValue / 1000) "
            + "baselineCpuMicrosecondsPerSecond=\(baseline.nanosecondsValue / 1000) "
            + "switchesPerSecond={\(wakes)} baselineSwitchesPerSecond={\(baselineWakes)}")
    benchmark.recordTimePerOperation(elapsed: cpu, operations: 1)
    // The harness times only what follows: its own clock would see the
    // whole iteration (over 2 s).
    benchmark.startMeasurement()
}

/// Context switches per thread of the process (voluntary and not, from
/// /proc/self/task/*/status), by thread name: who woke up, and how often.
struct ThreadSwitches {
    var byThread: [String: Int] = [:]

    static func now() -> ThreadSwitches {
        var result = ThreadSwitches()
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
        for task in tasks {
            let base = "/proc/self/task/\(task)/"
            guard let status = try? String(contentsOfFile: base + "status", encoding: .utf8) else { continue }
            let name = ((try? String(contentsOfFile: base + "comm", encoding: .utf8)) ?? "?")
                .trimmingCharacters(in: .whitespacesAndNewlines)
            var count = 0
            for line in status.split(separator: "\n") where line.contains("ctxt_switches:") {
                count += Int(line.split(separator: ":").last!.trimmingCharacters(in: .whitespaces)) ?? 0
            }
            result.byThread["\(name)#\(task)"] = count
        }
        return result
    }

    /// The switches since `earlier`, of threads that switched at all, as
    /// "name#tid:count" joined by commas.
    func since(_ earlier: ThreadSwitches) -> String {
        byThread.compactMap { thread, count -> String? in
            let delta = count - (earlier.byThread[thread] ?? 0)
            return delta > 0 ? "\(thread):\(delta)" : nil
        }.sorted().joined(separator: ",")
    }
}

/// Makes one source of each kind and cancels it, so that what starts on
/// first use (the reactor thread, the pool, Dispatch's manager) is running
/// before the baseline.
func warmUpSpindle(_ target: EventSource.Target) {
    let pair = EchoSockets()
    let cancelled = Counter()
    var made: [EventSource] = [
        EventSource.data(.add, on: target),
        EventSource.timer(start: .monotonic(MonotonicClock.now.advanced(by: .seconds(3600))), interval: .seconds(3600), on: target),
    ]
    if let read = try? EventSource.read(descriptor: pair.a, on: target) { made.append(read) }
    for source in made {
        source.setCancelHandler { _ in cancelled.bump() }
        source.activate()
    }
    for source in made { source.cancel() }
    cancelled.wait(for: UInt32(made.count), "the warm-up sources' cancel handlers")
    pair.close()
}

func spindleIdle(_ place: Place) -> (Benchmark) -> Void {
    { benchmark in
        let threads = LoopThreads()
        let target = place.makeTarget("bench.sources.idle", threads)
        warmUpSpindle(target)
        measureIdle(benchmark, place.rowName) { sockets, halfway in
            let cancelled = Counter()
            let far = MonotonicClock.now.advanced(by: .seconds(3600))
            var sources: [EventSource] = []
            sources.reserveCapacity(idleSources)
            var nextSocket = 0
            for i in 0..<idleSources {
                if i == idleSources / 2 { halfway() }
                let source: EventSource
                switch IdleKind(i) {
                case .data:
                    source = EventSource.data(.add, on: target)
                case .timer:
                    source = EventSource.timer(start: .monotonic(far), interval: .seconds(3600), on: target)
                case .read:
                    do {
                        source = try EventSource.read(descriptor: sockets[nextSocket].a, on: target)
                    } catch {
                        failLoudly("sources.idle: cannot make a read source: \(error)")
                    }
                    nextSocket += 1
                }
                source.setEventHandler { _ in report("sources.idle: an idle source fired") }
                source.setCancelHandler { _ in cancelled.bump() }
                source.activate()
                sources.append(source)
            }
            return {
                for source in sources { source.cancel() }
                cancelled.wait(for: UInt32(idleSources), patience: .seconds(30), "the idle sources' cancel handlers")
                threads.stopAll()
            }
        }
    }
}

func dispatchIdle(_ benchmark: Benchmark) {
    let queue = DispatchQueue(label: "bench.sources.idle")
    // Warm-up, as for Spindle.
    do {
        let cancelled = DispatchSemaphore(value: 0)
        let timer = DispatchSource.makeTimerSource(queue: queue)
        timer.schedule(deadline: .now() + .seconds(3600), repeating: .seconds(3600))
        timer.setCancelHandler { cancelled.signal() }
        timer.resume()
        timer.cancel()
        cancelled.wait()
    }
    measureIdle(benchmark, "DispatchSource") { sockets, halfway in
        let cancelled = Counter()
        var sources: [any DispatchSourceProtocol] = []
        sources.reserveCapacity(idleSources)
        var nextSocket = 0
        for i in 0..<idleSources {
            if i == idleSources / 2 { halfway() }
            let source: any DispatchSourceProtocol
            switch IdleKind(i) {
            case .data:
                source = DispatchSource.makeUserDataAddSource(queue: queue)
            case .timer:
                let timer = DispatchSource.makeTimerSource(queue: queue)
                timer.schedule(deadline: .now() + .seconds(3600), repeating: .seconds(3600))
                source = timer
            case .read:
                source = DispatchSource.makeReadSource(fileDescriptor: sockets[nextSocket].a, queue: queue)
                nextSocket += 1
            }
            source.setEventHandler { report("sources.idle: an idle Dispatch source fired") }
            source.setCancelHandler { cancelled.bump() }
            source.resume()
            sources.append(source)
        }
        return {
            for source in sources { source.cancel() }
            cancelled.wait(for: UInt32(idleSources), patience: .seconds(30), "the idle Dispatch sources' cancel handlers")
        }
    }
}

func idleBenchmarks() {
    let settings = RunSettings(
        scalingFactor: .one, maxDuration: .seconds(1), maxIterations: 2, warmupIterations: 0,
        reportedMetrics: [.timePerOperation])
    var rows: [Implementation] = Place.allCases.map { place in
        Implementation(place.rowName, isReference: false, body: spindleIdle(place))
    }
    rows.append(.reference("DispatchSource", body: dispatchIdle))
    sideBySide(group: "sources.idle 10000 sources CPU in 1s", settings: settings, implementations: rows)
}
