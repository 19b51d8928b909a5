// The standard pool's poller without a thread of its own: a program that
// uses only queues and queue sources runs no reactor thread, and an event
// that comes while every worker computes is still taken from the kernel
// (the pool's monitor polls when nobody holds the poller).
#if canImport(Glibc)
import Glibc
#endif
import Spindle
import Testing
import TestSupport

@Suite("Event driver: the pool's poller", .serialized)
struct PoolPollerTests {
    /// In a process of its own: read, timer, signal, process and
    /// file-system sources on work queues each deliver an event, and the
    /// process never had a thread named "spindle.events" (the reactor).
    @Test func aQueueOnlyProgramRunsNoReactorThread() async {
        await #expect(processExitsWith: .success) {
            unblockAllSignals()
            armHangAlarm(seconds: 60)
            exit(queueSourcesWithoutTheReactor())
        }
    }

    /// Every worker of the standard pool computes (one item per permit,
    /// none of them blocking), and a read source's descriptor becomes
    /// readable: the items keep computing until the event has been taken
    /// from the kernel (merged into its source, its call queued) by a poll
    /// made while nobody held the poller, and the handler runs once they
    /// stop. With no such poll the items would compute until their 30 s
    /// safety bound and the check fails (seen with the monitor's poll taken
    /// out). Which thread polled is not checked: in a run beside other
    /// tests, a worker beyond the width (back from a blocking wait) may
    /// poll first, and may run the handler before any item saw the event
    /// pending; a handler that ran while the items computed proves the
    /// event taken too (without it, one run in about 100 beside the fork
    /// and delay suites failed).
    @Test func anEventWhileEveryWorkerComputesIsTakenFromTheKernel() throws {
        var pair: [Int32] = [0, 0]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
        defer { close(pair[0]); close(pair[1]) }
        let readEnd = pair[0]
        let handled = Semaphore(value: 0)
        let release = LockedValue(false)
        let handledWhileComputing = LockedValue(false)
        let source = try EventSource.read(descriptor: readEnd, on: .queue(WorkQueue(label: "poller.busy")))
        source.setEventHandler { _ in
            var byte: UInt8 = 0
            guard read(readEnd, &byte, 1) == 1 else { return }
            if !release.withLock({ $0 }) { handledWhileComputing.withLock { $0 = true } }
            handled.signal()
        }
        source.activate()
        defer { source.cancel() }

        let width = WorkQueue.poolWidth
        let started = Latch(width)
        let pendingSeen = LockedValue(0)
        let group = WorkGroup()
        let queue = WorkQueue.global()
        for _ in 0..<width {
            queue.async(group: group) {
                started.countDown()
                // Compute (no blocking wait the pool could see) until the
                // event has been merged into the source, or for 30 s.
                let start = MonotonicClock.now
                while !source.hasPendingEvent && !release.withLock({ $0 })
                    && !handledWhileComputing.withLock({ $0 })
                    && start.duration(to: MonotonicClock.now) < .seconds(30)
                {}
                if source.hasPendingEvent { pendingSeen.withLock { $0 += 1 } }
            }
        }
        #expect(started.wait(), "not every worker started computing")
        #expect(write(pair[1], "x", 1) == 1)
        // One item seeing it is enough: the others may have stopped for it.
        let taken = eventually(seconds: 40) {
            pendingSeen.withLock { $0 } > 0 || handledWhileComputing.withLock { $0 }
        }
        release.withLock { $0 = true }
        #expect(group.wait(timeout: .seconds(60)) == .completed)
        #expect(taken, "the event was not taken from the kernel while every worker computed")
        #expect(handled.wait(timeout: .seconds(10)) == .completed, "the handler never ran")
    }

    /// One worker computes in a source's handler until another source's
    /// handler has run: the worker that held the poller handed it on before
    /// it ran the first handler (the eager hand-off), so the second event
    /// is served by a free worker meanwhile, without the monitor's poll.
    @Test func theHolderHandsThePollerOnBeforeItRunsWhatItFound() throws {
        try #require(WorkQueue.poolWidth >= 2, "needs a free worker beside the computing one")
        var pairA: [Int32] = [0, 0]
        var pairB: [Int32] = [0, 0]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pairA) == 0)
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pairB) == 0)
        let fds = pairA + pairB
        defer { for fd in fds { close(fd) } }
        let (readA, readB) = (fds[0], fds[2])
        let bRan = LockedValue(false)
        let aComputing = Semaphore(value: 0)
        let aFinished = LockedValue<Bool?>(nil)
        let aDone = Semaphore(value: 0)
        let a = try EventSource.read(descriptor: readA, on: .queue(WorkQueue(label: "poller.handoff.a")))
        a.setEventHandler { _ in
            var byte: UInt8 = 0
            guard read(readA, &byte, 1) == 1 else { return }
            aComputing.signal()
            let start = MonotonicClock.now
            while !bRan.withLock({ $0 }) && start.duration(to: MonotonicClock.now) < .seconds(30) {}
            aFinished.withLock { $0 = bRan.withLock { $0 } }
            aDone.signal()
        }
        let b = try EventSource.read(descriptor: readB, on: .queue(WorkQueue(label: "poller.handoff.b")))
        b.setEventHandler { _ in
            var byte: UInt8 = 0
            if read(readB, &byte, 1) == 1 { bRan.withLock { $0 = true } }
        }
        a.activate()
        b.activate()
        defer { a.cancel(); b.cancel() }
        #expect(write(fds[1], "a", 1) == 1)
        #expect(aComputing.wait(timeout: .seconds(10)) == .completed, "A's handler never started")
        #expect(write(fds[3], "b", 1) == 1)
        #expect(aDone.wait(timeout: .seconds(60)) == .completed)
        #expect(aFinished.withLock { $0 } == true, "B's handler did not run while A's computed")
    }
}

/// The names of this process's threads now.
private func currentThreadNames() -> [String] {
    guard let dir = opendir("/proc/self/task") else { return [] }
    defer { closedir(dir) }
    var names: [String] = []
    while let entry = readdir(dir) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix(while: { $0 != 0 }), as: UTF8.self) }
        guard Int32(name) != nil, let comm = procFileText("/proc/self/task/\(name)/comm") else { continue }
        names.append(comm.filter { $0 != "\n" })
    }
    return names
}

/// `aQueueOnlyProgramRunsNoReactorThread` in its own process: 0, or the
/// number of the check that failed (20 and up: sources that never called).
private func queueSourcesWithoutTheReactor() -> Int32 {
    let queue = WorkQueue(label: "poller.queueOnly")
    // Which sources have called their handlers (the read source's calls
    // repeat while its byte is unread: each source is counted once).
    let fired = LockedValue(Set<Int>())
    var sources: [EventSource] = []
    func watch(_ source: EventSource) {
        let index = sources.count
        source.setEventHandler { _ in fired.withLock { _ = $0.insert(index) } }
        source.activate()
        sources.append(source)
    }
    // A readable socket.
    var pair: [Int32] = [0, 0]
    guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0 else { return 1 }
    guard let read = try? EventSource.read(descriptor: pair[0], on: .queue(queue)) else { return 2 }
    watch(read)
    // A monotonic timer.
    watch(EventSource.timer(start: .monotonic(MonotonicClock.now.advanced(by: .milliseconds(1))), interval: nil, on: .queue(queue)))
    // A signal (ignored, as the guide has it, so that only the source sees it).
    signal(SIGUSR2, SIG_IGN)
    guard let signal = try? EventSource.signal(SIGUSR2, on: .queue(queue)) else { return 3 }
    watch(signal)
    // A child's exit.
    let child = fork()
    if child == 0 { _exit(0) }
    guard child > 0, let process = try? EventSource.process(child, on: .queue(queue)) else { return 4 }
    watch(process)
    // A file written.
    var path = Array("/tmp/spindle-poller-XXXXXX".utf8CString)
    let file = mkstemp(&path)
    guard file >= 0 else { return 5 }
    unlink(path)
    guard let written = try? EventSource.fileSystemObject(descriptor: file, events: .write, on: .queue(queue)) else { return 6 }
    watch(written)

    guard write(pair[1], "x", 1) == 1 else { return 7 }
    guard kill(getpid(), SIGUSR2) == 0 else { return 8 }
    guard write(file, "x", 1) == 1 else { return 9 }
    guard eventually(seconds: 20, { fired.withLock { $0.count } == sources.count }) else {
        // A child stuck in the fork handlers would keep the exit test's
        // pipes open, and the run would wait for it forever.
        kill(child, SIGKILL)
        // 20 + which sources never called (1 read, 2 timer, 4 signal,
        // 8 process, 16 file).
        let missing = (0..<sources.count).reduce(0) { mask, i in fired.withLock { $0.contains(i) } ? mask : mask | 1 << i }
        return Int32(20 + missing)
    }
    var status: Int32 = 0
    guard waitpid(child, &status, 0) == child else { return 13 }
    if currentThreadNames().contains("spindle.events") { return 11 }
    // The pool and its monitor did run.
    if !currentThreadNames().contains(where: { $0.hasPrefix("spindle.std") }) { return 12 }
    for source in sources { source.cancel() }
    return 0
}
