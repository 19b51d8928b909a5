// What the event-source groups share: a futex count to wait on, a latency
// probe (the handler takes the clock, the benchmark thread records the
// difference), the places handlers run, and the process's resident memory.
import Benchmark
import BenchSupport
import Dispatch
import Foundation
import Spindle

#if canImport(Glibc)
import Glibc
#endif

/// Reports a problem on stderr (a missed event, a wrong count): the run goes
/// on, the message is in the log.
func report(_ message: String) {
    FileHandle.standardError.write(Data("EventSources benchmarks: \(message)\n".utf8))
}

/// Stops the run with a message: a wrong result must not become a number.
func failLoudly(_ message: String) -> Never {
    FileHandle.standardError.write(Data("EventSources benchmarks: FAILED: \(message)\n".utf8))
    fatalError("EventSources benchmarks: \(message)")
}

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
    /// Blocks until the count reaches `target`, at most `patience` (a
    /// benchmark must never hang: a peer that stops delivering is reported
    /// instead). Returns false if it gave up.
    @discardableResult
    func wait(for target: UInt32, patience: Duration = .seconds(10), _ what: String = "an event") -> Bool {
        let deadline = MonotonicClock.now.advanced(by: patience)
        while true {
            let v = value
            if v >= target { return true }
            if Futex(word).wait(expecting: v, until: deadline) == .timedOut {
                report("\(what) did not arrive within \(patience)")
                return false
            }
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds (the clock a child process can read too).
@inline(__always)
func monotonicNanoseconds() -> Int64 { MonotonicClock.now.nanoseconds }

/// One event at a time: the benchmark thread takes the clock and causes the
/// event; the handler takes the clock when it starts and bumps `fired`; the
/// benchmark records the difference as the row's time (timePerOperation).
final class LatencyProbe: @unchecked Sendable {
    // @unchecked: `handlerStart` is written by the handler before it bumps
    // `fired` (releasing) and read by the benchmark thread after it saw the
    // bump (acquiring).
    let fired = Counter()
    var handlerStart: Int64 = 0
    /// Whatever must stay alive for the events to keep arriving.
    var keepAlive: [AnyObject] = []

    /// Called first thing in the handler.
    @inline(__always)
    func handlerStarted() {
        handlerStart = monotonicNanoseconds()
        fired.bump()
    }

    /// Causes one event with `trigger` and records from just before it to
    /// the handler's start. A missed event is reported and recorded as the
    /// time waited, so it shows in the row's maximum instead of vanishing.
    func measure(_ benchmark: Benchmark, _ what: String, patience: Duration = .seconds(2), trigger: () -> Void) {
        let next = fired.value + 1
        let start = monotonicNanoseconds()
        trigger()
        if !fired.wait(for: next, patience: patience, what) {
            benchmark.recordTimePerOperation(elapsed: patience, operations: 1)
            return
        }
        benchmark.recordTimePerOperation(elapsed: .nanoseconds(handlerStart - start), operations: 1)
    }
}

/// Where a Spindle row's handlers run.
enum Place: CaseIterable {
    case queue
    case loop

    var rowName: String {
        switch self {
        case .queue: "Spindle.WorkQueue"
        case .loop: "Spindle.ThreadLoop"
        }
    }

    /// A new serial `WorkQueue`, or a `LoopThread`'s loop (default mode)
    /// that `threads` keeps until `stopAll` ends it.
    func makeTarget(_ label: String, _ threads: LoopThreads) -> EventSource.Target {
        switch self {
        case .queue:
            return .queue(WorkQueue(label: label))
        case .loop:
            return .loop(threads.start(), modes: [.default])
        }
    }
}

/// Loop threads started for one iteration (or one process), stopped and
/// joined together.
final class LoopThreads {
    private var threads: [LoopThread] = []

    func start() -> ThreadLoop {
        do {
            let thread = try LoopThread.start()
            threads.append(thread)
            return thread.loop
        } catch {
            failLoudly("cannot start a loop thread: \(error)")
        }
    }

    /// Stops and joins every thread started here. Call only once no source
    /// targets their loops any more (cancel handlers have run).
    func stopAll() {
        for thread in threads { thread.stop() }
        for thread in threads {
            do { try thread.join() } catch { report("a loop thread's body threw: \(error)") }
        }
        threads.removeAll()
    }
}

/// The process's resident memory in bytes (`/proc/self/statm`).
func residentBytes() -> Int {
    guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
    let fields = text.split(separator: " ")
    guard fields.count > 1, let pages = Int(fields[1]) else { return 0 }
    return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
}

/// Ignores `signal` (so that a delivery nobody observes does nothing) and
/// returns the disposition it replaced, to restore with `restoreSignal`.
func ignoreSignal(_ signal: Int32) -> sigaction {
    var ignore = sigaction()
    ignore.__sigaction_handler.sa_handler = SIG_IGN
    sigemptyset(&ignore.sa_mask)
    var old = sigaction()
    precondition(sigaction(signal, &ignore, &old) == 0, "sigaction(\(signal)) failed: errno \(errno)")
    return old
}

func restoreSignal(_ signal: Int32, _ old: sigaction) {
    var old = old
    _ = sigaction(signal, &old, nil)
}

extension Duration {
    var nanosecondsValue: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}
