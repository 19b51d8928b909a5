// Kernel-event latency, one event per iteration; the row's time
// (timePerOperation) is from the event to the start of its handler, so the
// row's median and p99 are the latency's.
//
// - sources.signal: from just before kill(getpid(), SIGUSR2) to the
//   handler. Spindle's signal source (its observer chains to the program's
//   disposition, here SIG_IGN, and writes an eventfd that the pool's poller,
//   or the loop itself, waits for) on a WorkQueue and on a ThreadLoop,
//   beside DispatchSource.makeSignalSource (the reference). Dispatch
//   replaces the disposition with its own handler, which blocks the signal
//   in the thread that takes it and raises it again for its signalfd;
//   SIGUSR2 is set to SIG_IGN before its source is made, and each benchmark
//   runs in a process of its own, so neither row sees the other's handler.
// - sources.process exit: a child made with fork() waits on a pipe for
//   "go", writes CLOCK_MONOTONIC to a second pipe and calls _exit(0); the
//   latency is from that timestamp to the handler. Spindle's process source
//   (a pidfd) on a WorkQueue and on a ThreadLoop, beside a thread blocked in
//   waitpid() for that child (the reference: what a program does without an
//   event layer; Dispatch on Linux has no process source). "go" is sent
//   once the source's registration handler has run (or the waiting thread
//   has started) and 0.5 ms more have passed, so the watch is in place.
// - sources.vnode write: from just before a 1-byte pwrite() to a watched
//   file to the handler. Spindle's file-system object source (inotify: the
//   pool's instance, waited for in its poller, for the WorkQueue; the loop's
//   own, in its backend, for the ThreadLoop), beside a thread blocked
//   in read() on an inotify descriptor of its own that watches the same file
//   for IN_MODIFY (the reference: the floor; Dispatch on Linux has no vnode
//   source).
import Benchmark
import BenchSupport
import Dispatch
import Foundation
import Spindle

#if canImport(Glibc)
import Glibc
#endif

/// One latency probe per process (package-benchmark runs each benchmark in a
/// process of its own), made on the first iteration.
nonisolated(unsafe) var latencyProbe: LatencyProbe?
// nonisolated(unsafe): the benchmark's iterations run one after another.

func probe(_ make: () -> LatencyProbe) -> LatencyProbe {
    if let p = latencyProbe { return p }
    let p = make()
    latencyProbe = p
    return p
}

/// One event per iteration, its latency recorded as the row's time; the
/// process's CPU time per event beside it (a running mean over the run,
/// the benchmark thread's own wait and trigger included, the same for
/// every row of a group).
func latencySettings() -> RunSettings {
    RunSettings(
        scalingFactor: .one, maxDuration: .seconds(2), maxIterations: 1_000, warmupIterations: 20,
        reportedMetrics: [.timePerOperation, .cpuPerOperation])
}

// MARK: - Signals

let benchSignal = SIGUSR2

func spindleSignalProbe(_ place: Place) -> LatencyProbe {
    let p = LatencyProbe()
    let threads = LoopThreads()
    _ = ignoreSignal(benchSignal)
    let source: EventSource
    do {
        source = try EventSource.signal(benchSignal, on: place.makeTarget("bench.sources.signal", threads))
    } catch {
        failLoudly("sources.signal: cannot make a signal source: \(error)")
    }
    source.setEventHandler { _ in p.handlerStarted() }
    source.activate()
    p.keepAlive = [source, threads]
    return p
}

func dispatchSignalProbe() -> LatencyProbe {
    let p = LatencyProbe()
    // Dispatch's own handler replaces this; with SIG_IGN underneath, a
    // delivery Dispatch does not take is ignored rather than fatal.
    _ = ignoreSignal(benchSignal)
    let source = DispatchSource.makeSignalSource(signal: benchSignal, queue: DispatchQueue(label: "bench.sources.signal"))
    source.setEventHandler { p.handlerStarted() }
    source.resume()
    p.keepAlive = [source as AnyObject]
    return p
}

func sendSignal() { _ = kill(getpid(), benchSignal) }

func signalBenchmarks() {
    var rows: [Implementation] = Place.allCases.map { place in
        Implementation(place.rowName, isReference: false) { benchmark in
            probe { spindleSignalProbe(place) }.measure(benchmark, "a SIGUSR2 handler call", trigger: sendSignal)
        }
    }
    rows.append(.reference("DispatchSourceSignal") { benchmark in
        probe(dispatchSignalProbe).measure(benchmark, "a SIGUSR2 handler call", trigger: sendSignal)
    })
    sideBySide(group: "sources.signal kill to handler", settings: latencySettings(), implementations: rows)
}

// MARK: - Process exit

/// A child that exits on "go" and says when, through two pipes.
struct ExitingChild {
    let pid: pid_t
    let go: Int32
    let stamp: Int32

    /// Forks the child. In the child only system calls run (the parent has
    /// other threads, whose locks the child must not touch): wait for one
    /// byte, read CLOCK_MONOTONIC, write it, _exit(0).
    static func fork() -> ExitingChild {
        var goPipe: [Int32] = [-1, -1]
        var stampPipe: [Int32] = [-1, -1]
        guard pipe(&goPipe) == 0, pipe(&stampPipe) == 0 else {
            failLoudly("sources.process: pipe failed: errno \(errno)")
        }
        let (goRead, goWrite, stampRead, stampWrite) = (goPipe[0], goPipe[1], stampPipe[0], stampPipe[1])
        let pid = Glibc.fork()
        if pid == 0 {
            var byte: UInt8 = 0
            while read(goRead, &byte, 1) < 0 && errno == EINTR {}
            var time = timespec()
            clock_gettime(CLOCK_MONOTONIC, &time)
            var nanoseconds = Int64(time.tv_sec) * 1_000_000_000 + Int64(time.tv_nsec)
            _ = write(stampWrite, &nanoseconds, 8)
            _exit(0)
        }
        guard pid > 0 else { failLoudly("sources.process: fork failed: errno \(errno)") }
        close(goRead)
        close(stampWrite)
        return ExitingChild(pid: pid, go: goWrite, stamp: stampRead)
    }

    /// Lets the child exit.
    func release() {
        var byte: UInt8 = 1
        _ = write(go, &byte, 1)
    }

    /// The child's CLOCK_MONOTONIC reading just before its _exit (blocks
    /// until it has written it).
    func exitStamp() -> Int64 {
        var nanoseconds: Int64 = 0
        let n = read(stamp, &nanoseconds, 8)
        if n != 8 { failLoudly("sources.process: the child's timestamp: read returned \(n), errno \(errno)") }
        return nanoseconds
    }

    /// Reaps the child (if nobody has) and closes the pipes.
    func finish(reap: Bool) {
        if reap {
            var status: Int32 = 0
            while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        }
        close(go)
        close(stamp)
    }
}

/// One exit per iteration: the child's own timestamp to the handler's start.
func measureExit(_ benchmark: Benchmark, _ probe: LatencyProbe, child: ExitingChild) {
    let next = probe.fired.value + 1
    child.release()
    let stamp = child.exitStamp()
    if !probe.fired.wait(for: next, patience: .seconds(5), "a process-exit notification") {
        benchmark.recordTimePerOperation(elapsed: .seconds(5), operations: 1)
        return
    }
    benchmark.recordTimePerOperation(elapsed: .nanoseconds(probe.handlerStart - stamp), operations: 1)
}

/// The loop thread of the ThreadLoop row, kept for the process's life.
nonisolated(unsafe) var processLoop: ThreadLoop?
// nonisolated(unsafe): the benchmark's iterations run one after another.

func spindleExit(_ place: Place) -> (Benchmark) -> Void {
    { benchmark in
        let p = probe { LatencyProbe() }
        let child = ExitingChild.fork()
        let registered = Counter()
        let cancelled = Counter()
        // A queue per iteration; one loop thread for all of them.
        let target: EventSource.Target
        switch place {
        case .queue:
            target = .queue(WorkQueue(label: "bench.sources.process"))
        case .loop:
            let loop = processLoop ?? {
                let threads = LoopThreads()
                p.keepAlive = [threads]
                let l = threads.start()
                processLoop = l
                return l
            }()
            target = .loop(loop, modes: [.default])
        }
        let source: EventSource
        do {
            source = try EventSource.process(child.pid, on: target)
        } catch {
            failLoudly("sources.process: cannot make a process source: \(error)")
        }
        source.setRegistrationHandler { _ in registered.bump() }
        source.setEventHandler { _ in p.handlerStarted() }
        source.setCancelHandler { _ in cancelled.bump() }
        source.activate()
        registered.wait(for: 1, "the process source's registration")
        usleep(500)
        measureExit(benchmark, p, child: child)
        source.cancel()
        cancelled.wait(for: 1, "the process source's cancel handler")
        child.finish(reap: true)
    }
}

func waitpidExit(_ benchmark: Benchmark) {
    let p = probe { LatencyProbe() }
    let child = ExitingChild.fork()
    let pid = child.pid
    let started = Counter()
    let waiter: SpawnedThread<Void>
    do {
        waiter = try NativeThread.start {
            started.bump()
            var status: Int32 = 0
            while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
            p.handlerStarted()
        }
    } catch {
        failLoudly("sources.process: cannot start the waitpid thread: \(error)")
    }
    started.wait(for: 1, "the waitpid thread's start")
    usleep(500)
    measureExit(benchmark, p, child: child)
    do { try waiter.join() } catch { report("sources.process: the waitpid thread threw: \(error)") }
    child.finish(reap: false)
}

func processBenchmarks() {
    var settings = latencySettings()
    settings.maxIterations = 300
    settings.warmupIterations = 5
    var rows: [Implementation] = Place.allCases.map { place in
        Implementation(place.rowName, isReference: false, body: spindleExit(place))
    }
    rows.append(.reference("waitpid thread", body: waitpidExit))
    sideBySide(group: "sources.process exit to handler", settings: settings, implementations: rows)
}

// MARK: - File-system object (vnode)

/// A scratch file for the process, removed at exit.
final class WatchedFile: @unchecked Sendable {
    // @unchecked: immutable after init.
    let path: String
    let fd: Int32

    init() {
        path = NSTemporaryDirectory() + "spindle-bench-vnode-\(getpid())"
        fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { failLoudly("sources.vnode: cannot create \(path): errno \(errno)") }
        let path = self.path
        onExit { unlink(path) }
        touch()
    }

    /// Writes one byte at offset 0: a modification, never an extension
    /// after the first.
    func touch() {
        var byte: UInt8 = 0x2A
        if pwrite(fd, &byte, 1, 0) != 1 { report("sources.vnode: pwrite failed: errno \(errno)") }
    }
}

/// `atexit` for a closure (package-benchmark's processes end by `exit`).
func onExit(_ body: @escaping () -> Void) {
    exitBodies.append(body)
    if exitBodies.count == 1 { atexit { for body in exitBodies { body() } } }
}

nonisolated(unsafe) var exitBodies: [() -> Void] = []
// nonisolated(unsafe): appended on the benchmark thread, read at exit.

func spindleVnodeProbe(_ place: Place, _ file: WatchedFile) -> LatencyProbe {
    let p = LatencyProbe()
    let threads = LoopThreads()
    let source: EventSource
    do {
        source = try EventSource.fileSystemObject(
            descriptor: file.fd, events: .write, on: place.makeTarget("bench.sources.vnode", threads))
    } catch {
        failLoudly("sources.vnode: cannot make a file-system object source: \(error)")
    }
    source.setEventHandler { _ in p.handlerStarted() }
    source.activate()
    p.keepAlive = [source, threads, file]
    return p
}

func inotifyThreadProbe(_ file: WatchedFile) -> LatencyProbe {
    let p = LatencyProbe()
    let inotify = inotify_init1(Int32(IN_CLOEXEC))
    guard inotify >= 0, inotify_add_watch(inotify, file.path, UInt32(IN_MODIFY)) >= 0 else {
        failLoudly("sources.vnode: inotify failed: errno \(errno)")
    }
    // Runs for the rest of the process: blocked in read() between events.
    do {
        _ = try NativeThread.detach(NativeThread.Attributes(name: "bench.inotify")) {
            let buffer = UnsafeMutableRawPointer.allocate(byteCount: 4096, alignment: 8)
            while true {
                let n = read(inotify, buffer, 4096)
                if n > 0 { p.handlerStarted() } else if n < 0 && errno != EINTR { return }
            }
        }
    } catch {
        failLoudly("sources.vnode: cannot start the inotify thread: \(error)")
    }
    p.keepAlive = [file]
    return p
}

func vnodeBenchmarks() {
    var rows: [Implementation] = Place.allCases.map { place in
        Implementation(place.rowName, isReference: false) { benchmark in
            let p = probe {
                let file = WatchedFile()
                return spindleVnodeProbe(place, file)
            }
            let file = p.keepAlive.compactMap { $0 as? WatchedFile }.first!
            p.measure(benchmark, "a file-write handler call", trigger: file.touch)
        }
    }
    rows.append(.reference("inotify read thread") { benchmark in
        let p = probe { inotifyThreadProbe(WatchedFile()) }
        let file = p.keepAlive.compactMap { $0 as? WatchedFile }.first!
        p.measure(benchmark, "an inotify event", trigger: file.touch)
    })
    sideBySide(group: "sources.vnode write to handler", settings: latencySettings(), implementations: rows)
}
