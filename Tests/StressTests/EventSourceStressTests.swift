import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

// Event sources under load (issue 18's reliability items): many sources
// made, armed, fed and cancelled from several threads; a million merges; a
// signal storm from another process; a thousand children exiting at once.
// What touches the whole process (descriptor counts, signals, children)
// runs in an exit test, so that the count is this test's alone and the
// storm hits a process of its own, not the test runner. Each child process
// writes a summary to standard error, which the test prints (with any
// ThreadSanitizer report from the child, which also fails it: exit code 66).

// Sizes: the issue's counts are CI's too (10^4 sources, 10^6 merges, 10^5
// signals, 1,000 children); at full size (SPINDLE_STRESS_SIZE=full) each is
// 10× that, the children as 10 rounds of 1,000 (not 10,000 processes at
// once on a shared machine), and each exit test's hang alarm 10× longer.

/// Writes a line to standard error and to this exit test's report file,
/// which the test process prints whether or not the exit test passed (the
/// standard error of a failed one is not handed back).
private func report(_ line: String) {
    let text = line + "\n"
    _ = text.withCString { write(2, $0, strlen($0)) }
    let fd = open(reportPath(runner: getppid(), tag: reportTag), O_WRONLY | O_CREAT | O_APPEND, 0o600)
    guard fd >= 0 else { return }
    _ = text.withCString { write(fd, $0, strlen($0)) }
    close(fd)
}

/// The report file of the exit test `tag` that `runner` (the test process)
/// starts.
private func reportPath(runner: pid_t, tag: String) -> String { "/tmp/spindle-es-stress-\(runner)-\(tag).txt" }

/// The exit test this process runs (set first thing in its body).
nonisolated(unsafe) private var reportTag = "none"

/// Makes SIGALRM end this process after `seconds` (an exit test's thread
/// blocks most signals, and children inherit its mask), so that a hang
/// fails the test instead of stalling the run.
private func armHangAlarm(seconds: UInt32) {
    var alarmOnly = sigset_t()
    sigemptyset(&alarmOnly)
    sigaddset(&alarmOnly, SIGALRM)
    pthread_sigmask(SIG_UNBLOCK, &alarmOnly, nil)
    alarm(seconds)
}

/// Polls `condition` every millisecond until it holds or `seconds` pass.
private func eventually(seconds: Int, _ condition: () -> Bool) -> Bool {
    let deadline = MonotonicClock.now.advanced(by: .seconds(seconds))
    while !condition() {
        if MonotonicClock.now >= deadline { return condition() }
        usleep(1000)
    }
    return true
}

/// The bytes of a small file (a /proc entry).
private func readAll(_ path: String, limit: Int = 4096) throws -> [UInt8] {
    let fd = open(path, O_RDONLY)
    guard fd >= 0 else { return [] }
    defer { close(fd) }
    var all: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 4096)
    while all.count < limit {
        let n = read(fd, &chunk, chunk.count)
        if n <= 0 { break }
        all += chunk[0..<n]
    }
    return all
}

/// This process's open descriptors and what each is open on.
private func descriptorNames() -> [Int32: String] {
    var names: [Int32: String] = [:]
    for entry in directoryEntries("/proc/self/fd") {
        guard let fd = Int32(entry) else { continue }
        var buffer = [UInt8](repeating: 0, count: 512)
        let n = buffer.withUnsafeMutableBytes { readlink("/proc/self/fd/\(fd)", $0.baseAddress!.assumingMemoryBound(to: CChar.self), $0.count) }
        names[fd] = n > 0 ? String(decoding: buffer[0..<n], as: UTF8.self) : "?"
    }
    return names
}

/// This process's open descriptors (the directory's own, open while it is
/// read, is counted every time alike).
private func openDescriptorCount() -> Int { directoryEntries("/proc/self/fd").count }

/// This process's open pidfds (`anon_inode:[pidfd]`).
private func pidfdCount() -> Int { descriptorNames().values.filter { $0.contains("pidfd") }.count }

/// The blocked-signal mask (`SigBlk`) of each thread of this process, by
/// thread id.
private func blockedSignalsByThread() -> [String: String] {
    var masks: [String: String] = [:]
    for tid in directoryEntries("/proc/self/task") {
        // Keyed by the thread's id and start time: with pid_max at 32768
        // (this machine's), the other tests' forks and threads can bring a
        // dead thread's id back for a new thread during the storm, which is
        // not the thread the first look saw.
        guard let started = threadStartTime(tid) else { continue }
        let fd = open("/proc/self/task/\(tid)/status", O_RDONLY)
        guard fd >= 0 else { continue }
        var bytes = [UInt8](repeating: 0, count: 8192)
        let n = read(fd, &bytes, bytes.count)
        close(fd)
        guard n > 0 else { continue }
        let text = String(decoding: bytes[0..<n], as: UTF8.self)
        let name = String(decoding: (try? readAll("/proc/self/task/\(tid)/comm")) ?? [], as: UTF8.self).filter { $0 != "\n" }
        if let line = text.split(separator: "\n").first(where: { $0.hasPrefix("SigBlk:") }) {
            masks["\(tid)@\(started)"] = "\(name) \(line)"
        }
    }
    return masks
}

/// A thread's start time, in clock ticks after boot (field 22 of
/// /proc/self/task/TID/stat, counted after the parenthesized name, which
/// may hold spaces); nil if it has gone.
private func threadStartTime(_ tid: String) -> String? {
    guard let stat = procFileText("/proc/self/task/\(tid)/stat"), let close = stat.lastIndex(of: ")") else { return nil }
    let fields = stat[stat.index(after: close)...].split(separator: " ")
    // fields[0] is field 3 (the state): field 22 is fields[19].
    return fields.count > 19 ? String(fields[19]) : nil
}

/// The calling thread's signal mask, as the bits of signals 1...64.
private func currentSignalMask() -> UInt64 {
    var mask = sigset_t()
    pthread_sigmask(SIG_BLOCK, nil, &mask)
    var bits: UInt64 = 0
    for signal in 1...64 where sigismember(&mask, Int32(signal)) == 1 { bits |= 1 << UInt64(signal - 1) }
    return bits
}

private func clearSignalMask() {
    var none = sigset_t()
    sigemptyset(&none)
    pthread_sigmask(SIG_SETMASK, &none, nil)
}

/// Prints a child process's report, so that its summary (and any TSan
/// report) shows in the run's output.
private func show(_ tag: String, _ result: ExitTest.Result?) {
    let path = reportPath(runner: getpid(), tag: tag)
    defer { unlink(path) }
    if let result {
        print("\(tag) (ThreadSanitizer: \(underThreadSanitizer)):\n\(String(decoding: result.standardErrorContent, as: UTF8.self))")
    } else {
        let lines = String(decoding: (try? readAll(path, limit: 1 << 20)) ?? [], as: UTF8.self)
        print("\(tag) FAILED (ThreadSanitizer: \(underThreadSanitizer)); its report:\n\(lines)")
    }
}

@Suite("EventSource stress")
struct EventSourceStressTests {
    /// 10,000 sources (a third each: add-data sources, repeating timers of
    /// 0.2–1 ms on the monotonic or the wall clock, read sources on
    /// socketpairs) made by 4 threads on 6 targets (2 serial queues, a
    /// concurrent queue, the global queue, 2 loops), activated (or resumed,
    /// or never), suspended and resumed, fed (merges, bytes) and cancelled,
    /// by their maker, by another thread, or by their own handler, while
    /// their events arrive. Afterwards: every cancel handler ran exactly
    /// once; no event handler ran after its source's cancel handler, or at
    /// the same time as another call of the same source, or on a closed
    /// descriptor; the process has exactly the descriptors it had before
    /// (the read sources' cancel handlers close their socketpairs; the
    /// reactor and the loops made theirs before the count). Same count
    /// under TSan.
    @Test func tenThousandSourcesChurnWithoutLeaksOrLateHandlers() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
            armHangAlarm(seconds: stressSize(ci: 300, full: 3_000))
            reportTag = "churn"
            exit(churnSources(total: stressSize(ci: 10_000, full: 100_000)))
        }
        show("churn", result)
    }

    /// 2 threads × 500,000 merges of 1–3 (seeded) into one add source whose
    /// handler runs on a concurrent queue and sums into plain words (never
    /// two calls at once: TSan checks the hand-over from call to call): the
    /// sum is exact, and there are at least 1 and at most 10^6 calls.
    @Test func millionMergesFromTwoThreadsSumExactly() {
        let perThread = stressSize(ci: 500_000, full: 5_000_000)
        var expected: UInt64 = 0
        for t in 0..<2 {
            var rng = XorShift(seed: 77 + t)
            for _ in 0..<perThread { expected += UInt64(1 + rng.next(3)) }
        }
        let queue = WorkQueue(label: "stress.merges", kind: .concurrent)
        let source = EventSource.data(.add, on: .queue(queue))
        let plain = UnsafeBox((calls: 0, sum: UInt64(0)))  // only the handler and, after it, the cancel handler
        let total = expected
        let reached = Semaphore(value: 0)
        let final = LockedValue((calls: 0, sum: UInt64(0)))
        let finished = Semaphore(value: 0)
        source.setEventHandler { s in
            plain.value.calls += 1
            plain.value.sum += s.data
            if plain.value.sum == total { reached.signal() }
        }
        source.setCancelHandler { _ in
            final.withLock { $0 = plain.value }
            finished.signal()
        }
        source.activate()
        runThreads(2) { t in
            var rng = XorShift(seed: 77 + t)
            for _ in 0..<perThread { source.merge(data: UInt64(1 + rng.next(3))) }
        }
        #expect(reached.wait(timeout: .seconds(60)) == .completed)
        source.cancel()
        #expect(finished.wait(timeout: .seconds(10)) == .completed)
        let (calls, sum) = final.withLock { $0 }
        #expect(sum == expected)
        #expect(calls >= 1 && calls <= 2 * perThread)
        print("merges: \(2 * perThread) merges, \(calls) calls (ThreadSanitizer: \(underThreadSanitizer))")
        // Each handler call's sum checked against the total it must reach.
        StressReport.record(operations: 2 * perThread, threads: 2, checks: calls + 4)
    }

    /// A signal storm from another process: a child sends its parent (the
    /// exit test's process) 10^5 real-time signals, then 10^5 SIGUSR1.
    /// Real-time signals queue, so the sum of the source's data is exactly
    /// what was sent (under TSan, whose runtime holds one pending delivery
    /// per signal and thread and drops the rest before any handler runs,
    /// the sum is only bounded: ≥ 1 and ≤ sent); SIGUSR1 merges in the
    /// kernel while pending, so its sum is ≥ 1 and ≤ sent. No thread's
    /// signal mask changed (every thread alive before and after, and a
    /// thread made for the purpose).
    @Test func signalStormFromAnotherProcessIsCounted() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
            armHangAlarm(seconds: stressSize(ci: 300, full: 3_000))
            reportTag = "storm"
            exit(signalStorm(count: stressSize(ci: 100_000, full: 1_000_000)))
        }
        show("storm", result)
    }

    /// 1,000 children (a fork each) wait on one pipe and, when its write
    /// end closes, all exit at once with status i % 256; a process source
    /// on each (on 2 queues and a loop) reports its exit once, with that
    /// status; the handler cancels its source. Afterwards `waitpid` reaps
    /// each child with the same status (the sources did not), and the
    /// sources' pidfds are all closed. Scaled down, with the reason
    /// printed, if RLIMIT_NPROC or RLIMIT_NOFILE cannot take 1,000.
    ///
    /// A forked child once hung inside `fork()`, in Spindle's child
    /// handler: `WorkerPool.childAfterForkAll` made type metadata (an array
    /// literal) under the Swift runtime's lock, which another thread of the
    /// parent may hold at the fork (about once in 10 runs of this suite).
    /// The layers' prepare handlers (`ForkHandlers`) now make everything the handler touches
    /// before the fork, and the handler allocates no metadata. A child that
    /// never returns from `fork()` is diagnosed in the report (wait channel,
    /// stack) and fails the test.
    @Test func thousandChildrenExitingAtOnceAreEachReportedOnce() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
            let rounds = stressSize(ci: 1, full: 10)
            armHangAlarm(seconds: 300 * UInt32(rounds))
            reportTag = "children"
            for _ in 0..<rounds {
                let status = childrenExit(count: 1000)
                if status != 0 { exit(status) }
            }
            exit(0)
        }
        show("children", result)
    }
}

// MARK: 10,000 sources

/// What the churn's handlers record, per source index.
private final class ChurnRecord: Sendable {
    let cancelRuns: AtomicCounters
    let cancelDone: AtomicCounters
    let running: AtomicCounters
    /// [0] event calls after the cancel handler, [1] event calls, [2] reads
    /// on a closed descriptor, [3] calls overlapping another of the same
    /// source, [4] cancel handlers overlapping an event call.
    let totals = AtomicCounters(8)

    init(_ count: Int) {
        cancelRuns = AtomicCounters(count)
        cancelDone = AtomicCounters(count)
        running = AtomicCounters(count)
    }

    func event(_ index: Int, reading fd: Int32?) {
        if cancelDone[index] != 0 { totals.add(0) }
        if running.add(index) != 1 { totals.add(3) }
        totals.add(1)
        if let fd {
            var buffer = [UInt8](repeating: 0, count: 64)
            if read(fd, &buffer, buffer.count) < 0 && errno == EBADF { totals.add(2) }
        }
        running.add(index, -1)
    }

    func cancelled(_ index: Int) {
        if running[index] != 0 { totals.add(4) }
        cancelDone.add(index)
        cancelRuns.add(index)
    }
}

/// The exit-test body of the churn: 0, or the failed check.
private func churnSources(total: Int) -> Int32 {
    let started = MonotonicClock.now
    guard let loops = try? [LoopThread.start(), LoopThread.start()] else { return 2 }
    let targets: [EventSource.Target] = [
        .queue(WorkQueue(label: "churn.serial-1")), .queue(WorkQueue(label: "churn.serial-2")),
        .queue(WorkQueue(label: "churn.concurrent", kind: .concurrent)), .queue(WorkQueue.global()),
        .loop(loops[0].loop), .loop(loops[1].loop),
    ]
    // Warm-up: the reactor and each loop make their descriptors on first use
    // (a wall-clock timer: the reactor's clock-change timerfd too).
    for target in targets {
        var fds: [Int32] = [0, 0]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0 else { return 3 }
        let done = Semaphore(value: 0)
        guard let warm = try? EventSource.read(descriptor: fds[0], on: target) else { return 4 }
        let pair = (fds[0], fds[1])
        warm.setCancelHandler { _ in close(pair.0); close(pair.1); done.signal() }
        warm.activate()
        let timer = EventSource.timer(start: .wall(WallClock.now), interval: .milliseconds(1), on: target)
        timer.setCancelHandler { _ in done.signal() }
        timer.activate()
        warm.cancel()
        timer.cancel()
        guard done.wait(timeout: .seconds(10)) == .completed, done.wait(timeout: .seconds(10)) == .completed else { return 5 }
    }
    let before = openDescriptorCount()
    let namesBefore = descriptorNames()

    let record = ChurnRecord(total)
    let handOff = LockedValue<[EventSource]>([])  // sources any thread may cancel
    let threads = 4
    let perThread = total / threads
    runThreads(threads) { t in
        var rng = XorShift(seed: 1800 + t)
        var live: [EventSource] = []
        for n in 0..<perThread {
            let index = t * perThread + n
            let target = targets[rng.next(targets.count)]
            let source: EventSource
            var peer: Int32 = -1
            switch rng.next(3) {
            case 0:
                source = EventSource.data(.add, on: target)
                source.setEventHandler { _ in record.event(index, reading: nil) }
                source.setCancelHandler { _ in record.cancelled(index) }
            case 1:
                let start: EventSource.TimerStart = rng.next(2) == 0 ? .now : .wall(WallClock.now)
                source = EventSource.timer(start: start, interval: .microseconds(200 + rng.next(800)), on: target)
                source.setEventHandler { _ in record.event(index, reading: nil) }
                source.setCancelHandler { _ in record.cancelled(index) }
            default:
                var fds: [Int32] = [0, 0]
                precondition(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0, &fds) == 0)
                let pair = (fds[0], fds[1])
                peer = pair.1
                source = try! EventSource.read(descriptor: pair.0, on: target)
                source.setEventHandler { s in record.event(index, reading: s.handle) }
                source.setCancelHandler { _ in
                    record.cancelled(index)
                    close(pair.0)
                    close(pair.1)
                }
            }
            let selfCancelling = rng.next(8) == 0
            if selfCancelling {
                // The handler cancels its own source at its first call.
                source.setEventHandler { s in
                    record.event(index, reading: s.kind == .read ? s.handle : nil)
                    s.cancel()
                }
            }
            switch rng.next(10) {
            case 0: break                      // never activated
            case 1: source.resume()            // resume of an inactive source activates it
            default: source.activate()
            }
            if rng.next(4) == 0 {
                source.suspend()
                if case .data = source.kind { source.merge(data: 1) }
                source.resume()
            }
            for _ in 0..<rng.next(4) {
                switch source.kind {
                case .data: source.merge(data: UInt64(1 + rng.next(5)))
                case .read: _ = write(peer, "e", 1)  // the peer: closed only by the cancel handler
                default: break
                }
            }
            switch rng.next(4) {
            case 0: source.cancel()                         // at once, by its maker
            case 1: handOff.withLock { $0.append(source) }  // by whichever thread comes next
            default: live.append(source)                    // later, by its maker
            }
            if live.count > 24 { live.remove(at: rng.next(live.count)).cancel() }
            if rng.next(3) == 0, let other = handOff.withLock({ $0.popLast() }) { other.cancel() }
        }
        for source in live { source.cancel() }
    }
    for source in handOff.withLock({ $0 }) { source.cancel() }
    handOff.withLock { $0.removeAll() }

    let allCancelled = eventually(seconds: 120) { (0..<total).allSatisfy { record.cancelRuns[$0] >= 1 } }
    usleep(50_000)  // an event call that ran late would count now
    let twice = (0..<total).filter { record.cancelRuns[$0] != 1 }
    let descriptorsBack = eventually(seconds: 10) { openDescriptorCount() == before }
    let after = openDescriptorCount()
    if !descriptorsBack {
        let namesAfter = descriptorNames()
        let gained = namesAfter.filter { namesBefore[$0.key] != $0.value }
        let lost = namesBefore.filter { namesAfter[$0.key] != $0.value }
        report("descriptors gained: \(gained.sorted { $0.key < $1.key }); lost: \(lost.sorted { $0.key < $1.key })")
    }
    report("""
        sources: \(total), event calls \(record.totals[1]), after cancel \(record.totals[0]), \
        on a closed descriptor \(record.totals[2]), overlapping \(record.totals[3]), \
        cancel during a call \(record.totals[4]), cancel handlers not exactly once \(twice.count), \
        descriptors \(before) before, \(after) after, \(MonotonicClock.now.duration(to: started) * -1) elapsed
        """)
    // Each source's cancel handler checked once, each event call checked
    // against its cancel, its descriptor and overlap; the descriptor count.
    StressReport.record(
        operations: total + record.totals[1], threads: threads, checks: total + record.totals[1] + 1,
        test: "tenThousandSourcesChurnWithoutLeaksOrLateHandlers()")
    for loop in loops {
        loop.stop()
        try? loop.join()
    }
    guard allCancelled else { return 10 }
    guard twice.isEmpty else { return 11 }
    guard record.totals[0] == 0 else { return 12 }
    guard record.totals[2] == 0 else { return 13 }
    guard record.totals[3] == 0, record.totals[4] == 0 else { return 14 }
    guard descriptorsBack else { return 15 }
    guard record.totals[1] > 0 else { return 16 }
    return 0
}

// MARK: Signal storm

/// Sends `count` of `signal` to `target`, retrying while the kernel's queue
/// of pending real-time signals is full; returns how many were sent. Only
/// async-signal-safe calls: it runs in a forked child.
private func sendSignals(_ signal: Int32, count: Int, to target: pid_t) -> Int {
    var sent = 0
    var refusals = 0
    while sent < count {
        if kill(target, signal) == 0 {
            sent += 1
        } else if errno == EAGAIN && refusals < 1_000_000 {
            refusals += 1
            usleep(50)
        } else {
            break
        }
    }
    return sent
}

/// The exit-test body of the storm: 0, or the failed check.
private func signalStorm(count: Int) -> Int32 {
    clearSignalMask()  // the exit test's thread blocks most signals; its threads would inherit that
    // glibc's first real-time signal (SIGRTMIN, a macro Swift does not
    // import) is 34: 32 and 33 are its own.
    let realTime: Int32 = 34 + 5
    signal(realTime, SIG_IGN)
    signal(SIGUSR1, SIG_IGN)
    let bystanderMasks = LockedValue<[UInt64]>([])
    let bystanderGo = Latch()
    let joinBystander = startThread {
        bystanderMasks.withLock { $0.append(currentSignalMask()) }
        bystanderGo.wait(seconds: 300)
        bystanderMasks.withLock { $0.append(currentSignalMask()) }
    }
    let loop = try? LoopThread.start()
    guard let loop else { return 2 }
    let queue = WorkQueue(label: "storm.rt")
    let sums = LockedValue((rt: UInt64(0), rtCalls: 0, usr1: UInt64(0), usr1Calls: 0))
    guard let rtSource = try? EventSource.signal(realTime, on: .queue(queue)),
        let usr1Source = try? EventSource.signal(SIGUSR1, on: .loop(loop.loop))
    else { return 3 }
    rtSource.setEventHandler { s in sums.withLock { $0.rt += s.data; $0.rtCalls += 1 } }
    usr1Source.setEventHandler { s in sums.withLock { $0.usr1 += s.data; $0.usr1Calls += 1 } }
    let mainMaskBefore = currentSignalMask()
    rtSource.activate()
    usr1Source.activate()
    // Threads of the test library and Dispatch set their own masks as they
    // start: only the threads whose masks held still for 100 ms count.
    let firstLook = blockedSignalsByThread()
    usleep(100_000)
    let threadMasksBefore = blockedSignalsByThread().filter { firstLook[$0.key] == $0.value }

    var go: [Int32] = [0, 0]
    var counts: [Int32] = [0, 0]
    guard pipe(&go) == 0, pipe(&counts) == 0 else { return 4 }
    let parent = getpid()
    let sender = fork()
    if sender == 0 {
        armHangAlarm(seconds: 120)
        close(go[1])
        close(counts[0])
        var byte: UInt8 = 0
        _ = read(go[0], &byte, 1)
        var sent = [sendSignals(realTime, count: count, to: parent), 0]
        sent[1] = sendSignals(SIGUSR1, count: count, to: parent)
        _ = sent.withUnsafeBytes { write(counts[1], $0.baseAddress, $0.count) }
        _exit(0)
    }
    guard sender > 0 else { return 5 }
    close(go[0])
    close(counts[1])
    var byte: UInt8 = 1
    guard write(go[1], &byte, 1) == 1 else { return 6 }
    var status: Int32 = 0
    guard waitpid(sender, &status, 0) == sender, status == 0 else { return 7 }
    var sent = [0, 0]
    guard sent.withUnsafeMutableBytes({ read(counts[0], $0.baseAddress, $0.count) }) == 2 * MemoryLayout<Int>.size else { return 8 }

    let exact = !underThreadSanitizer
    let rtArrived = eventually(seconds: 60) { exact ? sums.withLock { $0.rt } == UInt64(sent[0]) : sums.withLock { $0.rt } >= 1 }
    let usr1Arrived = eventually(seconds: 60) { sums.withLock { $0.usr1 } >= 1 }
    usleep(100_000)
    let final = sums.withLock { $0 }
    let threadMasksAfter = blockedSignalsByThread()
    let mainMaskAfter = currentSignalMask()
    bystanderGo.countDown()
    joinBystander()
    let bystander = bystanderMasks.withLock { $0 }
    let changed = threadMasksBefore.filter { tid, mask in threadMasksAfter[tid].map { $0 != mask } ?? false }
    report("""
        real-time signal \(realTime): sent \(sent[0]), sum \(final.rt) in \(final.rtCalls) calls \
        (\(exact ? "exact" : "bounded: ThreadSanitizer drops repeated pending deliveries")); \
        SIGUSR1: sent \(sent[1]), sum \(final.usr1) in \(final.usr1Calls) calls; \
        threads compared \(threadMasksBefore.keys.filter { threadMasksAfter[$0] != nil }.count), masks changed \(changed.map { "\($0.key) \($0.value) -> \(threadMasksAfter[$0.key] ?? "")" })
        """)
    rtSource.cancel()
    usr1Source.cancel()
    loop.stop()
    try? loop.join()
    // The sums, and each thread's signal mask before and after.
    StressReport.record(
        operations: sent[0] + sent[1], threads: 2, checks: 6 + threadMasksBefore.count,
        test: "signalStormFromAnotherProcessIsCounted()")
    guard sent[0] == count, sent[1] == count else { return 10 }
    guard rtArrived, final.rt <= UInt64(sent[0]), final.rt >= 1 else { return 11 }
    guard !exact || final.rt == UInt64(sent[0]) else { return 12 }
    guard usr1Arrived, final.usr1 >= 1, final.usr1 <= UInt64(sent[1]) else { return 13 }
    guard mainMaskBefore == mainMaskAfter, mainMaskAfter == 0 else { return 14 }
    guard bystander.count == 2, bystander[0] == bystander[1] else { return 15 }
    guard changed.isEmpty else { return 16 }
    return 0
}

// MARK: 1,000 children

/// What the children's exit test reports when the only thing wrong was
/// children stuck inside `fork()` (the known defect).
private let forkHangMarker = "stuck inside fork()"

/// The exit-test body of the children's exits: 0, or the failed check.
private func childrenExit(count requested: Int) -> Int32 {
    var count = requested
    var processes = rlimit()
    getrlimit(Int32(__RLIMIT_NPROC.rawValue), &processes)
    let processRoom = processes.rlim_cur == rlim_t.max ? Int.max : Int(processes.rlim_cur) - 200
    if processRoom < count {
        count = max(processRoom, 10)
        report("RLIMIT_NPROC is \(processes.rlim_cur): \(count) children instead of \(requested)")
    }
    var files = rlimit()
    getrlimit(Int32(RLIMIT_NOFILE.rawValue), &files)
    if files.rlim_cur < files.rlim_max {
        files.rlim_cur = files.rlim_max
        setrlimit(Int32(RLIMIT_NOFILE.rawValue), &files)
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &files)
    }
    let fileRoom = files.rlim_cur == rlim_t.max ? Int.max : Int(files.rlim_cur) - 256
    if fileRoom < count {
        count = max(fileRoom, 10)
        report("RLIMIT_NOFILE is \(files.rlim_cur): \(count) children instead of \(requested)")
    }

    guard let loop = try? LoopThread.start() else { return 2 }
    let targets: [EventSource.Target] = [
        .queue(WorkQueue(label: "children.serial")), .queue(WorkQueue(label: "children.concurrent", kind: .concurrent)),
        .loop(loop.loop),
    ]
    // Warm-up, so that the count below excludes the reactor's descriptors.
    let warmDone = Semaphore(value: 0)
    for target in targets {
        let warm = EventSource.data(.add, on: target)
        warm.setCancelHandler { _ in warmDone.signal() }
        warm.activate()
        warm.cancel()
        guard warmDone.wait(timeout: .seconds(10)) == .completed else { return 3 }
    }
    // (A process source on a queue waits in the pool's poller: this makes
    // its epoll instance. The reactor thread may start later, for the
    // poller's watchdog, which is why the pidfds are counted apart below.)
    guard let reactorWarm = try? EventSource.process(getpid(), on: targets[0]) else { return 3 }
    reactorWarm.setCancelHandler { _ in warmDone.signal() }
    reactorWarm.activate()
    reactorWarm.cancel()
    guard warmDone.wait(timeout: .seconds(10)) == .completed else { return 3 }

    var go: [Int32] = [0, 0]
    var started: [Int32] = [0, 0]  // each child writes its index here as soon as fork() returns in it
    guard pipe(&go) == 0, pipe(&started) == 0 else { return 4 }
    _ = fcntl(started[0], F_SETFL, O_NONBLOCK)
    var pids: [pid_t] = []
    pids.reserveCapacity(count)
    let forkStart = MonotonicClock.now
    for i in 0..<count {
        let child = fork()
        if child == 0 {
            var me = UInt16(i)
            _ = write(started[1], &me, 2)
            armHangAlarm(seconds: 120)  // a child stuck for any reason ends anyway
            close(go[1])
            var byte: UInt8 = 0
            _ = read(go[0], &byte, 1)  // one byte each, all written at once by the parent
            _exit(Int32(i % 256))
        }
        guard child > 0 else {
            report("fork failed after \(i) children: errno \(errno)")
            close(go[1])
            for pid in pids { waitpid(pid, nil, 0) }
            return 5
        }
        pids.append(child)
    }
    close(go[0])
    close(started[1])
    let forked = MonotonicClock.now
    let before = openDescriptorCount() - 2  // less go[1] and started[0], which close below
    let pidfdsBefore = pidfdCount()

    let calls = AtomicCounters(count)
    let cancels = AtomicCounters(count)
    let statuses = LockedValue<[EventSource.ExitStatus?]>(Array(repeating: nil, count: count))
    let wrongData = AtomicCounters(1)
    var sources: [EventSource] = []
    sources.reserveCapacity(count)
    for (i, pid) in pids.enumerated() {
        guard let source = try? EventSource.process(pid, on: targets[i % targets.count]) else {
            report("process source for child \(i) (\(pid)) refused")
            close(go[1])
            return 6
        }
        source.setEventHandler { s in
            calls.add(i)
            if s.data != EventSource.ProcessEvents.exit.rawValue || s.handle != pid { wrongData.add(0) }
            let status = s.exitStatus
            statuses.withLock { $0[i] = status }
            s.cancel()
        }
        source.setCancelHandler { _ in cancels.add(i) }
        source.activate()
        sources.append(source)
    }
    let during = openDescriptorCount()
    let pidfdsDuring = pidfdCount()
    sources.removeAll()  // active sources keep themselves
    // Every child exits now: a byte each (not the end of file, which a
    // child that had not yet closed its copy of the write end would hold
    // back for all).
    let release = [UInt8](repeating: 1, count: count)
    var written = 0
    while written < count {
        let n = release[written...].withUnsafeBytes { write(go[1], $0.baseAddress, $0.count) }
        guard n > 0 else { break }
        written += n
    }
    close(go[1])
    let allReported = eventually(seconds: 60) { (0..<count).allSatisfy { cancels[$0] >= 1 } }
    usleep(50_000)
    let reported = (0..<count).filter { calls[$0] == 1 }.count
    let seen = statuses.withLock { $0 }
    let wrongStatus = (0..<count).filter { seen[$0] != .exited(Int32($0 % 256)) }
    var reapedRight = 0
    var unreaped = Set(pids.indices)
    let reapDeadline = MonotonicClock.now.advanced(by: .seconds(20))
    while !unreaped.isEmpty && MonotonicClock.now < reapDeadline {
        for i in unreaped {
            var status: Int32 = 0
            let rc = waitpid(pids[i], &status, WNOHANG)
            guard rc == pids[i] else { continue }
            unreaped.remove(i)
            if status & 0x7f == 0, (status >> 8) & 0xff == Int32(i % 256) { reapedRight += 1 }
        }
        if !unreaped.isEmpty { usleep(1000) }
    }
    var startedChildren = Set<Int>()
    var index: UInt16 = 0
    while read(started[0], &index, 2) == 2 { startedChildren.insert(Int(index)) }
    close(started[0])
    let stuckInFork = unreaped.filter { !startedChildren.contains($0) }
    for i in unreaped {
        // Say where a stuck child is, then end it, so that no orphan keeps
        // the exit test's output open.
        let wchan = (try? String(decoding: readAll("/proc/\(pids[i])/wchan"), as: UTF8.self)) ?? "?"
        let call = (try? String(decoding: readAll("/proc/\(pids[i])/syscall"), as: UTF8.self)) ?? "?"
        report("child \(i) (\(pids[i])) has not exited: waiting in \(wchan), system call \(call)")
        // Which mappings the system call's first argument and the program
        // counter (its last field) fall in.
        let fields = call.split(whereSeparator: { $0 == " " || $0 == "\n" }).compactMap { UInt(String($0).dropFirst(2), radix: 16) }
        let maps = String(decoding: (try? readAll("/proc/\(pids[i])/maps", limit: 1 << 20)) ?? [], as: UTF8.self)
        for address in [fields.dropFirst().first, fields.last].compactMap({ $0 }) {
            var previous: Substring = ""
            for line in maps.split(separator: "\n") {
                let range = line.split(separator: " ")[0].split(separator: "-").compactMap { UInt($0, radix: 16) }
                if range.count == 2, address >= range[0], address < range[1] {
                    report("  0x\(String(address, radix: 16)): \(line) (after \(previous))")
                }
                previous = line
            }
        }
        // Return addresses on its stack (words that point into code), for
        // `addr2line`: the calls that led to the wait.
        if fields.count >= 2 {
            let sp = fields[fields.count - 2]
            let mem = open("/proc/\(pids[i])/mem", O_RDONLY)
            var words = [UInt](repeating: 0, count: 1024)
            let n = words.withUnsafeMutableBytes { pread(mem, $0.baseAddress, $0.count, off_t(Int(bitPattern: sp))) }
            close(mem)
            var code: [(UInt, UInt, String)] = []
            for line in maps.split(separator: "\n") where line.contains("r-xp") {
                let parts = line.split(separator: " ", omittingEmptySubsequences: true)
                let range = parts[0].split(separator: "-").compactMap { UInt($0, radix: 16) }
                let offset = UInt(parts[2], radix: 16) ?? 0
                if range.count == 2 { code.append((range[0], range[1], "\(parts.last ?? "?") +\(offset)")) }
            }
            var frames: [String] = []
            for word in words.prefix(max(0, n / 8)) {
                if let hit = code.first(where: { word >= $0.0 && word < $0.1 }) {
                    frames.append("\(hit.2.split(separator: "/").last ?? "?") 0x\(String(word - hit.0, radix: 16))")
                }
            }
            report("  stack: \(frames.prefix(24).joined(separator: ", "))")
        }
        kill(pids[i], SIGKILL)
        waitpid(pids[i], nil, 0)
    }
    // Every pidfd is closed; other descriptors may have come meanwhile (the
    // reactor thread and its watchdog timer, started when the pool's poller
    // was first left unheld while it watched the sources).
    let descriptorsBack = eventually(seconds: 10) { pidfdCount() == pidfdsBefore }
    report("""
        children: \(count), reported once \(reported), wrong status \(wrongStatus.count), \
        reaped with their status \(reapedRight), released \(written), descriptors \(before) before the sources, \(during) with them, \
        \(openDescriptorCount()) after; pidfds \(pidfdsBefore) before, \(pidfdsDuring) with the sources, \(pidfdCount()) after; \
        forking took \(forkStart.duration(to: forked))
        """)
    // Each child's report, status and reaping checked; one line per round.
    StressReport.record(
        operations: count, threads: count, checks: 3 * count + 1,
        test: "thousandChildrenExitingAtOnceAreEachReportedOnce()")
    loop.stop()
    try? loop.join()
    if !stuckInFork.isEmpty && stuckInFork.count == unreaped.count && reported + stuckInFork.count == count
        && reapedRight + stuckInFork.count == count && wrongData[0] == 0 && written == count
    {
        report("\(forkHangMarker): children \(stuckInFork.sorted()) never returned from fork(); everything else held")
        return 20
    }
    guard allReported else { return 10 }
    guard reported == count, (0..<count).allSatisfy({ cancels[$0] == 1 }) else { return 11 }
    guard wrongStatus.isEmpty, wrongData[0] == 0 else { return 12 }
    guard written == count, reapedRight == count else { return 13 }
    guard descriptorsBack, pidfdsDuring == pidfdsBefore + count, during >= before + 2 + count else { return 14 }
    return 0
}
