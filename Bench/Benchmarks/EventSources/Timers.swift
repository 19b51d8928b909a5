// Timer lateness: a repeating 1 ms timer with no leeway; each handler reads
// the clock and records how far it is behind its place on the schedule
// (Spindle's and Dispatch's against the firing their data counts up to, so
// a call a whole period late shows as such; Foundation's, which has no
// count, modulo the period, as the RunLoop group does). The
// row's time (timePerOperation) is that lateness, one firing per iteration,
// so the row's median and p99 are the lateness's. Spindle's `EventSource`
// timer on a serial WorkQueue (the timer lives on the reactor thread, which
// submits the handler call to the pool) and on a ThreadLoop (the timer lives
// in the loop itself), beside DispatchSource.makeTimerSource (the reference)
// and Foundation's Timer on a RunLoop thread, as the RunLoop group measures
// them. The process's CPU time per firing (a running mean over the run, the
// benchmark thread's wake-up for each firing included) is beside it.
import Benchmark
import BenchSupport
import Dispatch
import Foundation
import Spindle

/// A repeating 1 ms timer's firings; the handler records each one's
/// lateness against the schedule start + n × 1 ms.
final class TimerProbe: @unchecked Sendable {
    // @unchecked: `start` is written before the timer starts; `lateness` is
    // written by the handler before it bumps `fired` (releasing) and read by
    // the benchmark thread after (acquiring).
    let fired = Counter()
    var lateness: Int64 = 0
    var start = MonotonicClock.now
    var keepAlive: [AnyObject] = []
    let period: Duration = .milliseconds(1)

    func scheduled(_ k: Int) -> MonotonicClock.Instant { start.advanced(by: period * k) }

    /// Firings counted so far (the sum of the handler calls' data).
    /// Written only by the handler, whose calls never overlap.
    var firings = 0

    /// Called by the handler of a source that counts its firings (`data`:
    /// how many periods this call stands for). Lateness is taken against
    /// the schedule's point of the last firing counted, so a call that
    /// comes a whole period late (or more) counts all of it.
    func handlerFired(count: UInt64) {
        firings += Int(count)
        let late = scheduled(firings).duration(to: MonotonicClock.now).nanosecondsValue
        lateness = max(0, late)
        fired.bump()
    }

    /// Called by the handler of a Foundation `Timer`, which does not say how
    /// many periods a call stands for: lateness is taken against the latest
    /// point of the schedule at or before now, so whole missed periods are
    /// not counted (the RunLoop group's measure).
    func handlerFired() {
        let sinceStart = start.duration(to: MonotonicClock.now).nanosecondsValue
        lateness = sinceStart < 0 ? 0 : sinceStart % period.nanosecondsValue
        fired.bump()
    }

    /// One sample: the lateness of the next firing, taken in its handler.
    func measure(_ benchmark: Benchmark) {
        let k = fired.value + 1
        if !fired.wait(for: k, patience: .seconds(2), "a timer firing") {
            benchmark.recordTimePerOperation(elapsed: .seconds(2), operations: 1)
            return
        }
        benchmark.recordTimePerOperation(elapsed: .nanoseconds(lateness), operations: 1)
    }
}

func spindleTimerProbe(_ place: Place) -> TimerProbe {
    let probe = TimerProbe()
    let threads = LoopThreads()  // kept for the process's life
    let target = place.makeTarget("bench.sources.timer", threads)
    probe.start = MonotonicClock.now.advanced(by: .milliseconds(2))
    let timer = EventSource.timer(
        start: .monotonic(probe.scheduled(1)), interval: probe.period, leeway: .zero, on: target)
    timer.setEventHandler { source in probe.handlerFired(count: source.data) }
    timer.activate()
    probe.keepAlive = [timer, threads]
    probe.fired.wait(for: 1)
    return probe
}

func dispatchTimerProbe() -> TimerProbe {
    let probe = TimerProbe()
    let source = DispatchSource.makeTimerSource(queue: DispatchQueue(label: "bench.sources.timer"))
    probe.start = MonotonicClock.now.advanced(by: .milliseconds(2))
    source.schedule(deadline: .now() + .milliseconds(3), repeating: .milliseconds(1), leeway: .nanoseconds(0))
    // The handler reads the count through the source (as Dispatch's handlers
    // do); the cycle does not matter, the source lives for the process.
    source.setEventHandler { probe.handlerFired(count: UInt64(source.data)) }
    source.resume()
    probe.keepAlive = [source as AnyObject]
    probe.fired.wait(for: 1)
    return probe
}

func foundationTimerProbe() -> TimerProbe {
    let probe = TimerProbe()
    let thread = Thread {
        // Foundation schedules on the wall clock: take both clocks together.
        probe.start = MonotonicClock.now.advanced(by: .milliseconds(2))
        let first = Date(timeIntervalSinceNow: 0.003)
        let timer = Timer(fire: first, interval: 0.001, repeats: true) { _ in probe.handlerFired() }
        RunLoop.current.add(timer, forMode: .default)
        while true { _ = RunLoop.current.run(mode: .default, before: .distantFuture) }
    }
    thread.start()
    probe.fired.wait(for: 1)
    return probe
}

/// One probe per process (package-benchmark runs each benchmark in a
/// process of its own), made on the first iteration.
nonisolated(unsafe) var timerProbe: TimerProbe?
// nonisolated(unsafe): the benchmark's iterations run one after another.

func measureTimer(_ benchmark: Benchmark, _ make: () -> TimerProbe) {
    let probe = timerProbe ?? { let p = make(); timerProbe = p; return p }()
    probe.measure(benchmark)
}

func timerBenchmarks() {
    let settings = RunSettings(
        scalingFactor: .one, maxDuration: .seconds(2), maxIterations: 1_000, warmupIterations: 20,
        reportedMetrics: [.timePerOperation, .cpuPerOperation])
    var rows: [Implementation] = Place.allCases.map { place in
        Implementation(place.rowName, isReference: false) { benchmark in
            measureTimer(benchmark) { spindleTimerProbe(place) }
        }
    }
    rows.append(.reference("DispatchSourceTimer") { benchmark in measureTimer(benchmark, dispatchTimerProbe) })
    rows.append(.peer("Foundation.Timer") { benchmark in measureTimer(benchmark, foundationTimerProbe) })
    sideBySide(group: "sources.timer.lateness 1ms leeway 0", settings: settings, implementations: rows)
}
