// 10^4 repeating 5 µs timers whose calls cannot start (their serial queue is
// suspended), beside one more 5 µs timer on a running queue. A pending
// timer should cost nothing (disarmed until its call runs, counting what it
// missed, as libdispatch does), so the process's CPU time per second should
// stay near idle and the running timer should keep its rate. The row's time
// (timePerOperation) is the process's CPU time over 1 s with all of them
// armed; the running timer's calls per second and the idle baseline are
// printed on stderr, one line per iteration ("sources.timer.pending/<row>:
// ..."). Spindle's EventSource timers on WorkQueues beside Dispatch's timer
// sources on DispatchQueues (the reference).
import Benchmark
import BenchSupport
import Dispatch
import Foundation
import Spindle

let pendingTimers = 10_000

/// One iteration: makes the pending timers and the running one (`make`
/// returns their teardown and the running timer's call counter), measures
/// 1 s, tears down.
func measurePendingTimers(
    _ benchmark: Benchmark, _ name: String, _ make: () -> (calls: Counter, cancel: () -> Void)
) {
    let baselineStart = ProcessCPUTime.now
    usleep(500_000)
    let baseline = (ProcessCPUTime.now - baselineStart) * 2
    let (calls, cancel) = make()
    usleep(200_000)  // the first firings: every pending timer fires once
    let callsBefore = calls.value
    let wallStart = MonotonicClock.now
    let cpuStart = ProcessCPUTime.now
    usleep(1_000_000)
    let cpu = ProcessCPUTime.now - cpuStart
    let wall = wallStart.duration(to: MonotonicClock.now)
    let rate = Double(calls.value &- callsBefore) / (Double(wall.nanosecondsValue) / 1e9)
    cancel()
    report(
        "sources.timer.pending/\(name): pending=\(pendingTimers) cpuMicrosecondsPerSecond=\(cpu.nanosecondsValue / 1000) "
            + "baselineCpuMicrosecondsPerSecond=\(baseline.nanosecondsValue / 1000) "
            + "runningTimerCallsPerSecond=\(Int(rate.rounded()))")
    benchmark.recordTimePerOperation(elapsed: cpu, operations: 1)
    benchmark.startMeasurement()
}

func spindlePendingTimers(_ benchmark: Benchmark) {
    measurePendingTimers(benchmark, "Spindle.WorkQueue") {
        let suspended = WorkQueue(label: "bench.sources.pending")
        suspended.suspend()
        var sources: [EventSource] = []
        sources.reserveCapacity(pendingTimers + 1)
        for _ in 0..<pendingTimers {
            let timer = EventSource.timer(
                start: .monotonic(MonotonicClock.now), interval: .microseconds(5), leeway: .zero, on: .queue(suspended))
            timer.setEventHandler { _ in }
            timer.activate()
            sources.append(timer)
        }
        let calls = Counter()
        let running = EventSource.timer(
            start: .monotonic(MonotonicClock.now), interval: .microseconds(5), leeway: .zero,
            on: .queue(WorkQueue(label: "bench.sources.running")))
        running.setEventHandler { _ in calls.bump() }
        running.activate()
        sources.append(running)
        return (calls, {
            for source in sources { source.cancel() }
            suspended.resume()
        })
    }
}

func dispatchPendingTimers(_ benchmark: Benchmark) {
    measurePendingTimers(benchmark, "DispatchSource") {
        let suspended = DispatchQueue(label: "bench.sources.pending")
        suspended.suspend()
        var sources: [any DispatchSourceTimer] = []
        sources.reserveCapacity(pendingTimers + 1)
        for _ in 0..<pendingTimers {
            let timer = DispatchSource.makeTimerSource(queue: suspended)
            timer.schedule(deadline: .now(), repeating: .microseconds(5), leeway: .nanoseconds(0))
            timer.setEventHandler {}
            timer.resume()
            sources.append(timer)
        }
        let calls = Counter()
        let running = DispatchSource.makeTimerSource(queue: DispatchQueue(label: "bench.sources.running"))
        running.schedule(deadline: .now(), repeating: .microseconds(5), leeway: .nanoseconds(0))
        running.setEventHandler { calls.bump() }
        running.resume()
        sources.append(running)
        return (calls, {
            for source in sources { source.cancel() }
            suspended.resume()
        })
    }
}

func pendingTimerBenchmarks() {
    let settings = RunSettings(
        scalingFactor: .one, maxDuration: .seconds(1), maxIterations: 3, warmupIterations: 0,
        reportedMetrics: [.timePerOperation])
    sideBySide(
        group: "sources.timer 10000 pending behind suspended queue", settings: settings,
        implementations: [
            Implementation("Spindle.WorkQueue", isReference: false, body: spindlePendingTimers),
            .reference("DispatchSource", body: dispatchPendingTimers),
        ])
}
