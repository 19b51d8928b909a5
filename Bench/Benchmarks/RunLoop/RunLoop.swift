// Run loops: a cross-thread perform round trip and timer lateness, Spindle's
// ThreadLoop on each event backend beside Foundation's RunLoop and Dispatch.
//
// Round trip (time per A→B→A): Spindle runs two loop threads, A performs onto
// B, B performs back onto A, A's loop handles the reply. Foundation's
// RunLoop.perform does not wake a sleeping loop on Linux, so its row uses the
// fastest hand-off that works there: adding a Timer that fires now to B's
// RunLoop; B's handler answers through a semaphore rather than A's RunLoop,
// which favours the peer. The driver (this benchmark's thread) asks A for a
// batch of round trips and waits for the batch once, so its own hand-off is
// spread over the batch.
//
// Lateness (time from a repeating 1 ms timer's scheduled date to its
// handler): each handler reads the clock and records how far it is behind
// its place on the schedule; the benchmark reports that as the row's time
// (the timePerOperation metric), so median, p99 and max are the lateness.
import Benchmark
import BenchSupport
import Dispatch
import Foundation
import Spindle

#if canImport(Glibc)
import Glibc
#endif

/// A futex-backed count the benchmark thread waits on.
final class Counter: @unchecked Sendable {
    // @unchecked: the word is only accessed atomically.
    let word = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)
    init() { word.initialize(to: 0) }
    deinit { word.deallocate() }
    var value: UInt32 { AtomicMemory.load(from: word, ordering: .acquiring) }
    func bump() {
        AtomicMemory.increment(word, ordering: .releasing)
        Futex(word).wakeAll()
    }
    /// Blocks until the count reaches `target`, at most 10 s (a benchmark
    /// must never hang: a peer that stops delivering is reported instead).
    /// Returns false if it gave up.
    @discardableResult
    func wait(for target: UInt32) -> Bool {
        let deadline = MonotonicClock.now.advanced(by: .seconds(10))
        while true {
            let v = value
            if v >= target { return true }
            if Futex(word).wait(expecting: v, until: deadline) == .timedOut {
                FileHandle.standardError.write(Data("RunLoop benchmarks: an event did not arrive within 10 s\n".utf8))
                return false
            }
        }
    }
}

/// Starts a thread that makes its loop (of `kind`), hands it over and runs it forever.
func startLoopThread(_ kind: EventBackendKind) -> ThreadLoop {
    final class Slot: @unchecked Sendable {
        // @unchecked: written once before `ready.bump()`, read after.
        var loop: ThreadLoop?
        let ready = Counter()
    }
    let slot = Slot()
    let thread = Thread {
        let loop = try! ThreadLoop.current(backend: kind)
        loop.add(LoopSource { _ in })  // keeps the mode from being empty
        slot.loop = loop
        slot.ready.bump()
        loop.run()
    }
    thread.start()
    slot.ready.wait(for: 1)
    return slot.loop!
}

/// Two loops of one backend for the round trip.
final class LoopPair: @unchecked Sendable {
    // @unchecked: only ThreadLoop's thread-safe API crosses threads.
    let a: ThreadLoop
    let b: ThreadLoop
    let done = Counter()
    init(_ kind: EventBackendKind) {
        a = startLoopThread(kind)
        b = startLoopThread(kind)
    }

    /// Runs `count` A→B→A round trips on A and waits for them.
    func roundTrips(_ count: Int) {
        let target = done.value + 1
        let (a, b, done) = (self.a, self.b, self.done)
        a.perform {
            for _ in 0..<count {
                // Written and read on A only, but the performs' closures are
                // `sending`; the lock is uncontended (a few ns beside the
                // round trip) and replaces the heap box a captured var was.
                let answered = LockedValue(false)
                b.perform { a.perform { answered.withLock { $0 = true } } }
                while !answered.withLock({ $0 }) {
                    a.run(mode: .default, timeout: .seconds(10), returnAfterSourceHandled: true)
                }
            }
            done.bump()
        }
        done.wait(for: target)
    }
}

/// Foundation: B is a RunLoop thread; A adds a Timer that fires now to it.
final class FoundationPair: @unchecked Sendable {
    // @unchecked: `runLoop` is written before `ready` and only read after.
    var runLoop: RunLoop!
    let ready = DispatchSemaphore(value: 0)
    init() {
        let thread = Thread { [self] in
            runLoop = RunLoop.current
            runLoop.add(Timer(timeInterval: 1e9, repeats: true) { _ in }, forMode: .default)
            ready.signal()
            while true { _ = RunLoop.current.run(mode: .default, before: .distantFuture) }
        }
        thread.start()
        ready.wait()
    }
    /// Hand-offs Foundation lost (its loop did not wake for the new timer
    /// within a second); reported on stderr at exit, never waited out.
    nonisolated(unsafe) static var lost = 0

    func roundTrip() {
        // A semaphore per hand-off (~50 ns, noise beside a ~20 µs hand-off),
        // so a timer that fires after its wait gave up satisfies nobody.
        let reply = DispatchSemaphore(value: 0)
        runLoop.add(Timer(timeInterval: 0, repeats: false) { _ in reply.signal() }, forMode: .default)
        if reply.wait(timeout: .now() + .seconds(1)) == .timedOut {
            FoundationPair.lost += 1
            FileHandle.standardError.write(
                Data("loop.roundtrip: Foundation's RunLoop missed a timer hand-off (\(FoundationPair.lost) so far)\n".utf8))
        }
    }
}

/// Dispatch: a serial queue answering through a semaphore.
final class DispatchPair: @unchecked Sendable {
    let queue = DispatchQueue(label: "bench.roundtrip")
    let reply = DispatchSemaphore(value: 0)
    func roundTrip() {
        let reply = self.reply
        queue.async { reply.signal() }
        reply.wait()
    }
}

nonisolated(unsafe) var pairs: [EventBackendKind: LoopPair] = [:]
nonisolated(unsafe) var foundationPair: FoundationPair?
// nonisolated(unsafe): created lazily on the benchmark thread, which runs
// the benchmarks one after another.

/// Repeating 1 ms timers: each implementation records its firings; the
/// benchmark thread measures from each scheduled date to the firing.
final class TimerProbe: @unchecked Sendable {
    // @unchecked: `start` is written before the timer starts; `fired` is a
    // Counter; `lateness` is written by the handler before it bumps `fired`
    // (releasing) and read by the benchmark thread after (acquiring).
    let fired = Counter()
    /// The last firing's lateness in nanoseconds, taken in the handler.
    var lateness: Int64 = 0
    var start = MonotonicClock.now
    /// Whatever must stay alive for the timer to keep firing.
    var keepAlive: AnyObject?
    let period: Duration = .milliseconds(1)

    func scheduled(_ k: UInt32) -> MonotonicClock.Instant {
        start.advanced(by: period * Int(k))
    }

    /// Called by the timer's handler: records how late this firing is
    /// against its place on the schedule, then counts it.
    /// A firing that misses whole periods is collapsed into one (by every
    /// implementation here), so lateness is measured against the latest
    /// point of the schedule at or before now: whole missed periods are not
    /// counted, the rest is.
    func handlerFired() {
        let sinceStart = start.duration(to: MonotonicClock.now).nanosecondsValue
        lateness = sinceStart < 0 ? 0 : sinceStart % period.nanosecondsValue
        fired.bump()
    }

    /// One sample: the lateness of the next firing, measured in its handler
    /// (so the benchmark thread's own wake-up is not part of it).
    func measure(_ benchmark: Benchmark) {
        let k = fired.value + 1
        fired.wait(for: k)
        benchmark.recordTimePerOperation(elapsed: .nanoseconds(lateness), operations: 1)
    }
}

func spindleTimerProbe(_ kind: EventBackendKind) -> TimerProbe {
    let probe = TimerProbe()
    let loop = startLoopThread(kind)
    probe.start = MonotonicClock.now.advanced(by: .milliseconds(2))
    loop.perform {
        let timer = LoopTimer(fireAt: probe.scheduled(1), interval: probe.period) { _ in probe.handlerFired() }
        ThreadLoop.current.add(timer, forMode: .default)
    }
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

func dispatchTimerProbe() -> TimerProbe {
    let probe = TimerProbe()
    let source = DispatchSource.makeTimerSource(queue: DispatchQueue(label: "bench.timer"))
    probe.start = MonotonicClock.now.advanced(by: .milliseconds(2))
    source.schedule(deadline: .now() + .milliseconds(3), repeating: .milliseconds(1), leeway: .nanoseconds(0))
    source.setEventHandler { probe.handlerFired() }
    source.resume()
    probe.keepAlive = source as AnyObject
    probe.fired.wait(for: 1)
    return probe
}

nonisolated(unsafe) var timerProbes: [String: TimerProbe] = [:]

func timerProbe(_ name: String, _ make: () -> TimerProbe) -> TimerProbe {
    if let p = timerProbes[name] { return p }
    let p = make()
    timerProbes[name] = p
    return p
}

let benchmarks: @Sendable () -> Void = {
    let backends: [EventBackendKind] = EventBackends.ioUringRefusal == nil ? [.ioUring, .epoll] : [.epoll]
    // One thread waits for another in every round trip: CPU time per round
    // trip beside the wall clock, for every implementation.
    let roundTripSettings = RunSettings(
        scalingFactor: .kilo, maxDuration: .seconds(2), maxIterations: 20, warmupIterations: 2,
        reportedMetrics: [.cpuPerOperation])

    var roundTrip: [Implementation] = backends.map { kind in
        Implementation(kind == .ioUring ? "Spindle.iouring" : "Spindle.epoll", isReference: false) { benchmark in
            let pair = pairs[kind] ?? { let p = LoopPair(kind); pairs[kind] = p; return p }()
            pair.roundTrips(benchmark.scaledIterations.count)
        }
    }
    roundTrip.append(.reference("Foundation.RunLoop timer handoff") { benchmark in
        let pair = foundationPair ?? { let p = FoundationPair(); foundationPair = p; return p }()
        for _ in benchmark.scaledIterations { pair.roundTrip() }
    })
    roundTrip.append(.peer("DispatchQueue.async") { benchmark in
        let pair = DispatchPair()
        for _ in benchmark.scaledIterations { pair.roundTrip() }
    })
    sideBySide(group: "loop.roundtrip", settings: roundTripSettings, implementations: roundTrip)

    // CPU per firing beside the lateness: the process's, the benchmark
    // thread's wake-up for each firing included (the same for every row),
    // so a loop that buys punctuality by spinning shows what it pays.
    let latenessSettings = RunSettings(
        scalingFactor: .one, maxDuration: .seconds(2), maxIterations: 1_000, warmupIterations: 20,
        reportedMetrics: [.timePerOperation, .cpuPerOperation])
    var lateness: [Implementation] = backends.map { kind in
        let name = kind == .ioUring ? "Spindle.iouring" : "Spindle.epoll"
        return Implementation(name, isReference: false) { benchmark in
            timerProbe(name) { spindleTimerProbe(kind) }.measure(benchmark)
        }
    }
    lateness.append(.reference("Foundation.Timer") { benchmark in
        timerProbe("Foundation.Timer", foundationTimerProbe).measure(benchmark)
    })
    lateness.append(.peer("DispatchSourceTimer") { benchmark in
        timerProbe("DispatchSourceTimer", dispatchTimerProbe).measure(benchmark)
    })
    sideBySide(group: "loop.timer.lateness 1ms", settings: latenessSettings, implementations: lateness)
    addRemoveBenchmarks()
    echoBenchmarks(backends)
}

extension Duration {
    var nanosecondsValue: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}

/// Adding and removing a source and a timer, on the loop's own thread.
/// package-benchmark may run a benchmark on any thread of the concurrency
/// pool, so each run takes the loop of the thread it runs on: a loop taken
/// once at registration would, on another thread, measure cross-thread
/// additions (with a wake-up each) instead.
let addRemoveBenchmarks: @Sendable () -> Void = {
    let settings = RunSettings(scalingFactor: .kilo, maxDuration: .seconds(1), maxIterations: 200, warmupIterations: 5,
                               extraMetrics: [], reportedMetrics: [.mallocCount])
    sideBySide(
        group: "loop.add-remove source and timer", settings: settings,
        spindle: { benchmark in
            let loop = ThreadLoop.current
            for _ in benchmark.scaledIterations {
                let source = LoopSource { _ in }
                loop.add(source, forMode: .default)
                let timer = LoopTimer(after: .seconds(60)) { _ in }
                loop.add(timer, forMode: .default)
                loop.remove(source, forMode: .default)
                timer.invalidate()
            }
        },
        peers: [
            .reference("Foundation.RunLoop timer") { benchmark in
                let runLoop = RunLoop.current
                for _ in benchmark.scaledIterations {
                    let timer = Timer(timeInterval: 60, repeats: false) { _ in }
                    runLoop.add(timer, forMode: .default)
                    timer.invalidate()
                }
            },
        ])
}
