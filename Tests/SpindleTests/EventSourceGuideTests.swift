// The concurrency guide's event-source examples (its listings 4-1 to 4-6,
// and its sections on canceling, suspending and changing the target) as
// tests, each once with handlers on a `WorkQueue` and once on a `ThreadLoop`
// running on a thread of its own. Written from the guide's descriptions, in
// Spindle's terms; what signals and processes do to the whole process runs
// in exit tests, so that the test runner is not disturbed.
#if canImport(Glibc)
import Glibc
#endif
import Spindle
import Testing
import TestSupport

/// Where a test's handlers run.
enum HandlerPlaceKind: String, Sendable, CaseIterable, CustomTestStringConvertible {
    case queue, loop
    var testDescription: String { rawValue }
}

/// A target for handlers: a serial `WorkQueue`, or a `ThreadLoop` on a
/// `LoopThread` of its own (stopped and joined by `close()`).
final class HandlerPlace: Sendable {
    let target: EventSource.Target
    let queue: WorkQueue?
    let thread: LoopThread?

    init(_ kind: HandlerPlaceKind, label: String) throws {
        switch kind {
        case .queue:
            let queue = WorkQueue(label: label)
            self.queue = queue
            thread = nil
            target = .queue(queue)
        case .loop:
            let thread = try LoopThread.start(NativeThread.Attributes(name: "es.test-loop"))
            self.thread = thread
            queue = nil
            target = .loop(thread.loop)
        }
    }

    /// Whether the caller runs on this place (an item of the queue, or on
    /// the loop's thread).
    var isCurrent: Bool {
        if let queue { return queue.isCurrent }
        return thread?.loop.isCurrent ?? false
    }

    func close() {
        guard let thread else { return }
        thread.stop()
        try? thread.join()
    }
}

/// Polls `condition` every millisecond until it holds (true) or `seconds`
/// pass (false).
func eventually(seconds: Int = 10, _ condition: () -> Bool) -> Bool {
    let deadline = MonotonicClock.now.advanced(by: .seconds(seconds))
    while !condition() {
        if MonotonicClock.now >= deadline { return condition() }
        usleep(1000)
    }
    return true
}

/// A path for a scratch file of this process.
func scratchPath(_ name: String) -> String { "/tmp/spindle-es-\(getpid())-\(name)" }

/// Writes `bytes` to a new file at `path` (mode 0600).
func writeFile(_ path: String, _ bytes: [UInt8]) -> Bool {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    guard fd >= 0 else { return false }
    defer { close(fd) }
    return bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) } == bytes.count
}

/// The whole content of the file at `path`.
func readFile(_ path: String) -> [UInt8]? {
    let fd = open(path, O_RDONLY)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var all: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = read(fd, &chunk, chunk.count)
        if n < 0 { return nil }
        if n == 0 { return all }
        all += chunk[0..<n]
    }
}

/// The path descriptor `fd` is open on (`/proc/self/fd`), as the kernel
/// names it now.
func pathOfDescriptor(_ fd: Int32) -> String {
    var buffer = [UInt8](repeating: 0, count: 4096)
    let n = buffer.withUnsafeMutableBytes { readlink("/proc/self/fd/\(fd)", $0.baseAddress!.assumingMemoryBound(to: CChar.self), $0.count) }
    return n > 0 ? String(decoding: buffer[0..<n], as: UTF8.self) : ""
}

/// A deterministic byte pattern.
func pattern(_ count: Int, seed: UInt8 = 7) -> [UInt8] {
    (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ Int(seed) &+ ($0 >> 8)) }
}

/// Clears the calling thread's signal mask. An exit test's thread blocks
/// most signals, and threads it starts inherit its mask: a test of signals
/// unblocks them first, so that a signal raised here is delivered here and
/// one sent by another process finds a thread to take it.
func unblockAllSignals() {
    var none = sigset_t()
    sigemptyset(&none)
    pthread_sigmask(SIG_SETMASK, &none, nil)
}

@Suite("EventSource: the guide's examples")
struct EventSourceGuideTests {
    // MARK: Listing 4-1: a timer

    /// A timer on the wall clock starting now (the listing's form): its
    /// first firing is immediate (a one-hour interval, so a late first
    /// firing would miss the 10-s wait by far), and a 20 ms timer then keeps
    /// its schedule: at each call, the firings counted so far were all due
    /// (start + (n - 1) × interval ≤ now: never early), every call runs on
    /// the target, and `data` counts at least one firing.
    @Test(arguments: HandlerPlaceKind.allCases)
    func listing41WallClockTimerFiresAtOnceThenOnSchedule(_ kind: HandlerPlaceKind) throws {
        let place = try HandlerPlace(kind, label: "guide.timer")
        defer { place.close() }

        let hourly = EventSource.timer(start: .wall(WallClock.now), interval: .seconds(3600), leeway: .seconds(1), on: place.target)
        let firstData = LockedValue<[UInt64]>([])
        let fired = Semaphore(value: 0)
        let hourlyCancelled = Semaphore(value: 0)
        hourly.setEventHandler { s in
            firstData.withLock { $0.append(s.data) }
            fired.signal()
        }
        hourly.setCancelHandler { _ in hourlyCancelled.signal() }
        hourly.activate()
        #expect(fired.wait(timeout: .seconds(10)) == .completed, "a timer that starts now fires at once")
        hourly.cancel()
        #expect(hourlyCancelled.wait(timeout: .seconds(10)) == .completed)
        #expect(firstData.withLock { $0 } == [1])

        let interval = Duration.milliseconds(20)
        let start = WallClock.now
        let ticker = EventSource.timer(start: .wall(start), interval: interval, leeway: .milliseconds(2), on: place.target)
        let calls = LockedValue<[(at: WallClock.Instant, data: UInt64, onTarget: Bool)]>([])
        let enough = Semaphore(value: 0)
        let cancelled = Semaphore(value: 0)
        ticker.setEventHandler { s in
            let now = WallClock.now
            let onTarget = place.isCurrent
            let (before, after) = calls.withLock { calls in
                let before = calls.reduce(0) { $0 + $1.data }
                calls.append((now, s.data, onTarget))
                return (before, before + s.data)
            }
            if before < 10 && after >= 10 { enough.signal() }
        }
        ticker.setCancelHandler { _ in cancelled.signal() }
        ticker.activate()
        #expect(enough.wait(timeout: .seconds(10)) == .completed, "10 firings of a 20 ms timer")
        ticker.cancel()
        #expect(cancelled.wait(timeout: .seconds(10)) == .completed)
        var firings: UInt64 = 0
        for call in calls.withLock({ $0 }) {
            #expect(call.data >= 1)
            #expect(call.onTarget)
            firings += call.data
            let due = start.advanced(by: interval * Int(firings - 1))
            #expect(call.at >= due, "firing \(firings) ran at \(call.at), before it was due at \(due)")
        }
    }

    // MARK: Listing 4-2: reading from a descriptor

    /// The listing's reader of a file: the descriptor is made non-blocking,
    /// each call reads `data + 1` bytes and hands them on, the source
    /// cancels itself when a read finds the end, and the cancel handler
    /// closes the descriptor. The file's 20,000 bytes arrive whole, the
    /// estimates are the bytes left (then 0 at the end), and the cancel
    /// handler runs once, on the target, after the last call.
    @Test(arguments: HandlerPlaceKind.allCases)
    func listing42ReadsAFileAndClosesItInTheCancelHandler(_ kind: HandlerPlaceKind) throws {
        let place = try HandlerPlace(kind, label: "guide.read")
        defer { place.close() }
        let path = scratchPath("read-\(kind)")
        let content = pattern(20_000)
        #expect(writeFile(path, content))
        defer { unlink(path) }
        let fd = open(path, O_RDONLY)
        try #require(fd >= 0)
        #expect(fcntl(fd, F_SETFL, O_NONBLOCK) == 0)

        let reader = ListingReader()
        let source = try EventSource.read(descriptor: fd, on: place.target)
        source.setEventHandler { s in reader.readOnce(s, onTarget: place.isCurrent) }
        source.setCancelHandler { s in reader.finish(s, onTarget: place.isCurrent) }
        source.activate()
        #expect(reader.closed.wait(timeout: .seconds(10)) == .completed)
        let outcome = reader.outcome
        #expect(outcome.bytes == content)
        #expect(outcome.estimates == [20_000, 0])
        #expect(outcome.closeResults == [0], "the cancel handler ran once and closed the descriptor")
        #expect(outcome.offTarget == 0)
        #expect(outcome.callsAfterCancelHandler == 0)
    }

    /// The same reader on a non-blocking pipe that a writer fills in 40
    /// pieces and then closes: the bytes arrive whole and in order, the
    /// source cancels itself at the end of the stream, and the cancel
    /// handler closes the read end.
    @Test(arguments: HandlerPlaceKind.allCases)
    func listing42ReadsAPipeUntilItsWriterCloses(_ kind: HandlerPlaceKind) throws {
        let place = try HandlerPlace(kind, label: "guide.read-pipe")
        defer { place.close() }
        var fds: [Int32] = [0, 0]
        try #require(pipe(&fds) == 0)
        let (readEnd, writeEnd) = (fds[0], fds[1])
        #expect(fcntl(readEnd, F_SETFL, O_NONBLOCK) == 0)
        let content = pattern(40 * 1500, seed: 3)

        let reader = ListingReader()
        let source = try EventSource.read(descriptor: readEnd, on: place.target)
        source.setEventHandler { s in reader.readOnce(s, onTarget: place.isCurrent) }
        source.setCancelHandler { s in reader.finish(s, onTarget: place.isCurrent) }
        source.activate()
        let join = startThread {
            for piece in 0..<40 {
                let written = content[(piece * 1500)..<((piece + 1) * 1500)].withUnsafeBytes { write(writeEnd, $0.baseAddress, $0.count) }
                precondition(written == 1500)
                usleep(500)
            }
            close(writeEnd)
        }
        join()
        #expect(reader.closed.wait(timeout: .seconds(10)) == .completed)
        let outcome = reader.outcome
        #expect(outcome.bytes == content)
        #expect(outcome.estimates.last == 0)
        #expect(outcome.estimates.dropLast().allSatisfy { $0 > 0 })
        #expect(outcome.closeResults == [0])
        #expect(outcome.offTarget == 0)
        #expect(outcome.callsAfterCancelHandler == 0)
    }

    // MARK: Listing 4-3: writing to a descriptor

    /// The listing as its text describes it: a new file, mode 0600 (no
    /// set-user-id or set-group-id bits), opened non-blocking; the write
    /// source's first call finds space (`data` ≥ 1), writes the data and
    /// cancels; the cancel handler closes. The file holds the data; the
    /// event handler ran once.
    @Test(arguments: HandlerPlaceKind.allCases)
    func listing43WritesAFileThenCancels(_ kind: HandlerPlaceKind) throws {
        let place = try HandlerPlace(kind, label: "guide.write")
        defer { place.close() }
        let path = scratchPath("write-\(kind)")
        unlink(path)
        defer { unlink(path) }
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK, 0o600)
        try #require(fd >= 0)
        var info = stat()
        #expect(fstat(fd, &info) == 0)
        #expect(info.st_mode & 0o7777 == 0o600)
        #expect(fcntl(fd, F_GETFL) & O_NONBLOCK != 0)

        let payload = pattern(64 * 1024, seed: 11)
        let calls = LockedValue<[(data: UInt64, written: Int, onTarget: Bool)]>([])
        let closed = LockedValue<[Int32]>([])
        let done = Semaphore(value: 0)
        let source = try EventSource.write(descriptor: fd, on: place.target)
        source.setEventHandler { s in
            let written = payload.withUnsafeBytes { write(s.handle, $0.baseAddress, $0.count) }
            calls.withLock { $0.append((s.data, written, place.isCurrent)) }
            s.cancel()
        }
        source.setCancelHandler { s in
            closed.withLock { $0.append(close(s.handle)) }
            done.signal()
        }
        source.activate()
        #expect(done.wait(timeout: .seconds(10)) == .completed)
        let seen = calls.withLock { $0 }
        #expect(seen.count == 1)
        #expect(seen.first.map { $0.data >= 1 && $0.written == payload.count && $0.onTarget } == true)
        #expect(closed.withLock { $0 } == [0])
        #expect(readFile(path) == payload)
    }

    /// The write side of a pipe, non-blocking, with 1 MiB to send (16 times
    /// the pipe's capacity): each call writes at most the space reported in
    /// `data` (never 0, never more than the 64 KiB capacity), the source
    /// calls again as the reader drains the pipe, cancels when all is written, and
    /// the cancel handler closes the write end, which ends the reader's
    /// stream. The reader gets every byte in order.
    @Test(arguments: HandlerPlaceKind.allCases)
    func listing43WritesAPipeAsSpaceFreesUp(_ kind: HandlerPlaceKind) throws {
        let place = try HandlerPlace(kind, label: "guide.write-pipe")
        defer { place.close() }
        var fds: [Int32] = [0, 0]
        try #require(pipe(&fds) == 0)
        let (readEnd, writeEnd) = (fds[0], fds[1])
        #expect(fcntl(writeEnd, F_SETFL, O_NONBLOCK) == 0)
        let payload = pattern(1 << 20, seed: 5)
        let sent = LockedValue(0)
        let calls = LockedValue((count: 0, badData: 0, offTarget: 0))
        let source = try EventSource.write(descriptor: writeEnd, on: place.target)
        source.setEventHandler { s in
            calls.withLock {
                $0.count += 1
                if s.data == 0 || s.data > 65536 { $0.badData += 1 }
                if !place.isCurrent { $0.offTarget += 1 }
            }
            // One write of at most the space the source reported (which a
            // pipe's capacity bounds), so every pipe-full takes a call.
            var offset = sent.withLock { $0 }
            let n = payload[offset...].withUnsafeBytes { write(s.handle, $0.baseAddress, min($0.count, Int(s.data))) }
            if n > 0 { offset += n }  // else EAGAIN: the reader had not drained yet; the source calls again
            sent.withLock { $0 = offset }
            if offset == payload.count { s.cancel() }
        }
        source.setCancelHandler { s in close(s.handle) }
        let received = LockedValue<[UInt8]>([])
        let join = startThread {
            var chunk = [UInt8](repeating: 0, count: 8192)
            while true {
                let n = read(readEnd, &chunk, chunk.count)
                if n <= 0 { break }
                received.withLock { $0 += chunk[0..<n] }
            }
            close(readEnd)
        }
        source.activate()
        join()
        #expect(received.withLock { $0 } == payload)
        let seen = calls.withLock { $0 }
        #expect(seen.count >= 16, "1 MiB written at most 64 KiB a call")
        #expect(seen.badData == 0)
        #expect(seen.offTarget == 0)
    }

    // MARK: Listing 4-4: a file's renames and deletion

    /// The listing's watcher of a file's name: the source keeps the name it
    /// last knew (the listing's context), and each call hands the old name
    /// and the descriptor on; the cancel handler frees the name and closes
    /// the descriptor. Two renames are each reported with the old name and
    /// the new one (the source follows the file, not the name), then the
    /// deletion of its last name, with the descriptor still open.
    @Test(arguments: HandlerPlaceKind.allCases)
    func listing44FollowsAFileThroughRenamesToItsDeletion(_ kind: HandlerPlaceKind) throws {
        let place = try HandlerPlace(kind, label: "guide.vnode")
        defer { place.close() }
        let names = (0..<3).map { scratchPath("vnode-\(kind)-\($0)") }
        #expect(writeFile(names[0], [1, 2, 3]))
        defer { for name in names { unlink(name) } }
        let fd = open(names[0], O_RDONLY)
        try #require(fd >= 0)

        let context = LockedValue<String?>(names[0])
        let reports = LockedValue<[(events: EventSource.FileEvents, old: String, now: String)]>([])
        let reported = Semaphore(value: 0)
        let closed = LockedValue<[Int32]>([])
        let finished = Semaphore(value: 0)
        let source = try EventSource.fileSystemObject(descriptor: fd, events: [.rename, .delete], on: place.target)
        source.setEventHandler { s in
            let now = pathOfDescriptor(s.handle)
            let old = context.withLock { name in
                defer { name = now }
                return name ?? "?"
            }
            reports.withLock { $0.append((s.fileEvents, old, place.isCurrent ? now : "off target")) }
            reported.signal()
        }
        source.setCancelHandler { s in
            context.withLock { $0 = nil }
            closed.withLock { $0.append(close(s.handle)) }
            finished.signal()
        }
        #expect(source.handle == fd)
        #expect(source.mask == EventSource.FileEvents([.rename, .delete]).rawValue)
        source.activate()

        #expect(rename(names[0], names[1]) == 0)
        #expect(reported.wait(timeout: .seconds(10)) == .completed)
        #expect(rename(names[1], names[2]) == 0)
        #expect(reported.wait(timeout: .seconds(10)) == .completed)
        #expect(unlink(names[2]) == 0)
        #expect(reported.wait(timeout: .seconds(10)) == .completed)
        source.cancel()
        #expect(finished.wait(timeout: .seconds(10)) == .completed)

        let seen = reports.withLock { $0 }
        try #require(seen.count == 3, "\(seen)")
        #expect(seen[0].events == .rename)
        #expect(seen[0].old == names[0] && seen[0].now == names[1])
        #expect(seen[1].events == .rename)
        #expect(seen[1].old == names[1] && seen[1].now == names[2])
        #expect(seen[2].events == .delete)
        #expect(seen[2].now.hasSuffix("(deleted)"))
        #expect(context.withLock { $0 } == nil)
        #expect(closed.withLock { $0 } == [0])
    }

    // MARK: Listing 4-5: SIGHUP to reload

    /// The listing in a process of its own: SIGHUP set to be ignored first,
    /// then a source that "reloads" on each SIGHUP; three deliveries are
    /// three reloads (data sums to 3), handled on the target, after which
    /// the source is cancelled, SIGHUP is ignored again as before, and one
    /// more SIGHUP leaves the process running.
    @Test func listing45ReloadsOnSIGHUPOnAQueue() async {
        await #expect(processExitsWith: .success) {
            unblockAllSignals()
            exit(sighupReload(.queue))
        }
    }

    @Test func listing45ReloadsOnSIGHUPOnALoop() async {
        await #expect(processExitsWith: .success) {
            unblockAllSignals()
            exit(sighupReload(.loop))
        }
    }

    // MARK: Listing 4-6: a child watching its parent's exit

    /// The listing in processes of their own: a parent forks a child, which
    /// makes a self-owned process source on its parent (it keeps no
    /// reference) and says it is ready; the parent then exits. The child's
    /// handler sets its exit flag and cancels the source; the source is
    /// then freed. The child reports through a pipe to the test process,
    /// its grandparent.
    @Test func listing46ChildSeesItsParentExitOnAQueue() async {
        await #expect(processExitsWith: .success) {
            exit(parentDeath(.queue))
        }
    }

    @Test func listing46ChildSeesItsParentExitOnALoop() async {
        await #expect(processExitsWith: .success) {
            exit(parentDeath(.loop))
        }
    }

    // MARK: Canceling, then dropping

    /// Cancel, then drop the only reference (the guide's cancel-and-release):
    /// the cancel handler still runs, once, and closes the descriptor; the
    /// source is then freed; the event handler ran for the bytes sent before
    /// and never after the cancel handler.
    @Test(arguments: HandlerPlaceKind.allCases)
    func cancelThenDropRunsTheCancelHandlerAndFreesTheSource(_ kind: HandlerPlaceKind) throws {
        let place = try HandlerPlace(kind, label: "guide.cancel-drop")
        defer { place.close() }
        var fds: [Int32] = [0, 0]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        let (mine, peer) = (fds[0], fds[1])
        defer { close(peer) }
        let log = EventLog()
        let gotData = Semaphore(value: 0)
        let finished = Semaphore(value: 0)
        weak var weakSource: EventSource?
        do {
            let source = try EventSource.read(descriptor: mine, on: place.target)
            source.setEventHandler { s in
                var buffer = [UInt8](repeating: 0, count: 64)
                let n = read(s.handle, &buffer, buffer.count)
                log.append("event \(n)")
                gotData.signal()
            }
            source.setCancelHandler { s in
                log.append("cancel \(close(s.handle))")
                finished.signal()
            }
            source.activate()
            weakSource = source
            #expect(write(peer, "abc", 3) == 3)
            #expect(gotData.wait(timeout: .seconds(10)) == .completed)
            source.cancel()
        }
        #expect(finished.wait(timeout: .seconds(10)) == .completed)
        #expect(eventually { weakSource == nil }, "a cancelled source is freed after its cancel handler")
        sleepBriefly()
        #expect(log.all == ["event 3", "cancel 0"])
    }

    // MARK: Suspending and resuming

    /// Events while suspended arrive as one call after the matching resume
    /// (two suspensions need two resumes): 100 merges from 4 threads become
    /// one call with data 100; a file renamed three times while its source
    /// is suspended gives one call, with the last name.
    @Test(arguments: HandlerPlaceKind.allCases)
    func suspendedSourcesCoalesceIntoOneCall(_ kind: HandlerPlaceKind) throws {
        let place = try HandlerPlace(kind, label: "guide.suspend")
        defer { place.close() }

        let adder = EventSource.data(.add, on: place.target)
        let calls = LockedValue<[UInt64]>([])
        let called = Semaphore(value: 0)
        adder.setEventHandler { s in calls.withLock { $0.append(s.data) }; called.signal() }
        adder.activate()
        adder.suspend()
        adder.suspend()
        runThreads(4) { _ in for _ in 0..<25 { adder.merge(data: 1) } }
        adder.resume()
        sleepBriefly()
        #expect(calls.withLock { $0 }.isEmpty, "still suspended once")
        adder.resume()
        #expect(called.wait(timeout: .seconds(10)) == .completed)
        sleepBriefly()
        #expect(calls.withLock { $0 } == [100])
        adder.cancel()

        // The rename watch, and a second watch on another file whose event,
        // caused after the renames, shows that the reactor has read them.
        let names = (0..<4).map { scratchPath("suspend-\(kind)-\($0)") }
        let marker = scratchPath("suspend-\(kind)-marker")
        #expect(writeFile(names[0], [1]))
        #expect(writeFile(marker, [1]))
        defer { for name in names + [marker] { unlink(name) } }
        let fd = open(names[0], O_RDONLY)
        let markerFD = open(marker, O_RDONLY)
        try #require(fd >= 0 && markerFD >= 0)
        let renames = LockedValue<[(EventSource.FileEvents, String)]>([])
        let renamed = Semaphore(value: 0)
        let watcher = try EventSource.fileSystemObject(descriptor: fd, events: .rename, on: place.target)
        watcher.setEventHandler { s in
            renames.withLock { $0.append((s.fileEvents, pathOfDescriptor(s.handle))) }
            renamed.signal()
        }
        watcher.setCancelHandler { s in close(s.handle) }
        let markerSeen = Semaphore(value: 0)
        let markerWatch = try EventSource.fileSystemObject(descriptor: markerFD, events: .attributes, on: place.target)
        markerWatch.setEventHandler { _ in markerSeen.signal() }
        markerWatch.setCancelHandler { s in close(s.handle) }
        watcher.activate()
        markerWatch.activate()
        watcher.suspend()
        for i in 1..<4 { #expect(rename(names[i - 1], names[i]) == 0) }
        #expect(chmod(marker, 0o400) == 0)
        #expect(markerSeen.wait(timeout: .seconds(10)) == .completed)
        #expect(renames.withLock { $0 }.isEmpty)
        watcher.resume()
        #expect(renamed.wait(timeout: .seconds(10)) == .completed)
        sleepBriefly()
        let seen = renames.withLock { $0 }
        #expect(seen.count == 1)
        #expect(seen.first?.0 == .rename)
        #expect(seen.first?.1 == names[3])
        watcher.cancel()
        markerWatch.cancel()
    }

    // MARK: Changing the target

    /// The target changes at any time (E18): a call already queued on the
    /// old queue runs there; events after the change run on the new target.
    /// A data source and a read source (whose kernel watch moves with it)
    /// go from a first place to a second of the same kind, then to the
    /// other kind.
    @Test(arguments: HandlerPlaceKind.allCases)
    func changingTheTargetMovesLaterEvents(_ kind: HandlerPlaceKind) throws {
        let first = try HandlerPlace(kind, label: "guide.target-1")
        let second = try HandlerPlace(kind, label: "guide.target-2")
        let other = try HandlerPlace(kind == .queue ? .loop : .queue, label: "guide.target-3")
        defer { first.close(); second.close(); other.close() }
        let places = [first, second, other]
        @Sendable func where_() -> Int { places.firstIndex { $0.isCurrent } ?? -1 }

        var fds: [Int32] = [0, 0]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        let (mine, peer) = (fds[0], fds[1])
        defer { close(peer) }
        let reader = try EventSource.read(descriptor: mine, on: first.target)
        let adder = EventSource.data(.add, on: first.target)
        let ranOn = LockedValue<[String]>([])
        let ran = Semaphore(value: 0)
        reader.setEventHandler { s in
            var byte: UInt8 = 0
            _ = read(s.handle, &byte, 1)
            ranOn.withLock { $0.append("read \(where_())") }
            ran.signal()
        }
        reader.setCancelHandler { s in close(s.handle) }
        adder.setEventHandler { s in
            ranOn.withLock { $0.append("data \(where_()) \(s.data)") }
            ran.signal()
        }
        reader.activate()
        adder.activate()
        for step in 0..<3 {
            if step > 0 {
                reader.setTarget(places[step].target)
                adder.setTarget(places[step].target)
            }
            #expect(write(peer, "x", 1) == 1)
            #expect(ran.wait(timeout: .seconds(10)) == .completed)
            adder.merge(data: UInt64(step + 1))
            #expect(ran.wait(timeout: .seconds(10)) == .completed)
        }
        #expect(ranOn.withLock { $0 } == ["read 0", "data 0 1", "read 1", "data 1 2", "read 2", "data 2 3"])

        // A call queued on a blocked queue before the change runs there. A
        // fresh source, so that no earlier call is still finishing (a merge
        // during a call is submitted when that call ends, to the target of
        // that moment: E18 lets it run on either).
        if kind == .queue, let blocked = first.queue {
            let late = EventSource.data(.add, on: first.target)
            late.setEventHandler { s in
                ranOn.withLock { $0.append("data \(where_()) \(s.data)") }
                ran.signal()
            }
            late.activate()
            let release = Semaphore(value: 0)
            blocked.async { _ = release.wait(timeout: .seconds(10)) }
            late.merge(data: 10)           // queued behind the blocking item
            late.setTarget(second.target)
            release.signal()
            #expect(ran.wait(timeout: .seconds(10)) == .completed)
            // The first call has ended once its queue runs the next item.
            blocked.sync {}
            late.merge(data: 20)
            #expect(ran.wait(timeout: .seconds(10)) == .completed)
            #expect(ranOn.withLock { Array($0.suffix(2)) } == ["data 0 10", "data 1 20"])
            late.cancel()
        }
        reader.cancel()
        adder.cancel()
    }

    // MARK: Registration handler

    /// The registration handler (E17) runs once, on the target, when the
    /// source is activated, and before the first event handler call, even
    /// with events merged before activation; activating or resuming again
    /// does not run it again. A timer that fires at once shows the same
    /// order.
    @Test(arguments: HandlerPlaceKind.allCases)
    func registrationHandlerRunsOnceBeforeTheFirstEvent(_ kind: HandlerPlaceKind) throws {
        let place = try HandlerPlace(kind, label: "guide.registration")
        defer { place.close() }
        let log = EventLog()
        let ran = Semaphore(value: 0)
        let adder = EventSource.data(.add, on: place.target)
        adder.setRegistrationHandler { _ in log.append("registration \(place.isCurrent)"); ran.signal() }
        adder.setEventHandler { s in log.append("event \(s.data)"); ran.signal() }
        adder.merge(data: 2)
        adder.merge(data: 3)
        adder.activate()
        adder.activate()
        #expect(ran.wait(timeout: .seconds(10)) == .completed)
        #expect(ran.wait(timeout: .seconds(10)) == .completed)
        adder.suspend()
        adder.resume()
        adder.merge(data: 1)
        #expect(ran.wait(timeout: .seconds(10)) == .completed)
        sleepBriefly()
        #expect(log.all == ["registration true", "event 5", "event 1"])
        adder.cancel()

        let timerLog = EventLog()
        let timer = EventSource.timer(interval: nil, on: place.target)
        timer.setRegistrationHandler { _ in timerLog.append("registration") }
        timer.setEventHandler { s in timerLog.append("event \(s.data)"); ran.signal() }
        timer.resume()  // resume of an inactive source activates it
        #expect(ran.wait(timeout: .seconds(10)) == .completed)
        sleepBriefly()
        #expect(timerLog.all == ["registration", "event 1"])
        timer.cancel()
    }

    // MARK: A dropped active source

    /// An active source keeps itself alive when its creator drops it (E20):
    /// a repeating timer whose only reference is gone keeps firing until its
    /// own handler cancels it at the fifth firing; then its cancel handler
    /// runs and it is freed. A read source dropped the same way receives
    /// what its peer sends, and cancels itself at the end of the stream.
    @Test(arguments: HandlerPlaceKind.allCases)
    func aDroppedActiveSourceKeepsWorkingUntilCancelled(_ kind: HandlerPlaceKind) throws {
        let place = try HandlerPlace(kind, label: "guide.dropped")
        defer { place.close() }
        let firings = LockedValue<UInt64>(0)
        let finished = Semaphore(value: 0)
        weak var weakTimer: EventSource?
        do {
            let timer = EventSource.timer(interval: .milliseconds(2), on: place.target)
            timer.setEventHandler { s in
                let total = firings.withLock { $0 += s.data; return $0 }
                if total >= 5 { s.cancel() }
            }
            timer.setCancelHandler { _ in finished.signal() }
            timer.activate()
            weakTimer = timer
        }
        #expect(finished.wait(timeout: .seconds(10)) == .completed)
        #expect(firings.withLock { $0 } >= 5)
        #expect(eventually { weakTimer == nil })

        var fds: [Int32] = [0, 0]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        let (mine, peer) = (fds[0], fds[1])
        let received = LockedValue(0)
        weak var weakReader: EventSource?
        do {
            let reader = try EventSource.read(descriptor: mine, on: place.target)
            reader.setEventHandler { s in
                var buffer = [UInt8](repeating: 0, count: 256)
                let n = read(s.handle, &buffer, buffer.count)
                if n > 0 { received.withLock { $0 += n } }
                if n == 0 { s.cancel() }
            }
            reader.setCancelHandler { s in close(s.handle); finished.signal() }
            reader.activate()
            weakReader = reader
        }
        for _ in 0..<10 {
            #expect(write(peer, [UInt8](repeating: 9, count: 100), 100) == 100)
            usleep(1000)
        }
        close(peer)
        #expect(finished.wait(timeout: .seconds(10)) == .completed)
        #expect(received.withLock { $0 } == 1000)
        #expect(eventually { weakReader == nil })
    }

    // MARK: Cancelling a suspended source

    /// The cancel handler of a suspended source runs without a resume
    /// (E14, where Dispatch waits for one), so a suspended, cancelled,
    /// dropped source still closes its descriptor; the events held by the
    /// suspension are never delivered. Likewise for a source never
    /// activated.
    @Test(arguments: HandlerPlaceKind.allCases)
    func cancelHandlerRunsForASuspendedSource(_ kind: HandlerPlaceKind) throws {
        let place = try HandlerPlace(kind, label: "guide.suspended-cancel")
        defer { place.close() }
        var fds: [Int32] = [0, 0]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        let (mine, peer) = (fds[0], fds[1])
        defer { close(peer) }
        let log = EventLog()
        let finished = Semaphore(value: 0)
        weak var weakSource: EventSource?
        do {
            let source = try EventSource.read(descriptor: mine, on: place.target)
            source.setEventHandler { _ in log.append("event") }
            source.setCancelHandler { s in log.append("cancel \(close(s.handle)) on target \(place.isCurrent)"); finished.signal() }
            source.activate()
            source.suspend()
            #expect(write(peer, "held", 4) == 4)
            sleepBriefly()
            source.cancel()
            weakSource = source
        }
        #expect(finished.wait(timeout: .seconds(10)) == .completed)
        #expect(eventually { weakSource == nil })
        sleepBriefly()
        #expect(log.all == ["cancel 0 on target true"])

        weak var weakNever: EventSource?
        do {
            let never = EventSource.data(.add, on: place.target)
            never.setEventHandler { _ in log.append("never: event") }
            never.setCancelHandler { _ in log.append("never: cancel"); finished.signal() }
            never.merge(data: 1)
            never.cancel()
            #expect(finished.wait(timeout: .seconds(10)) == .completed)
            never.activate()  // after cancel: runs nothing, holds nothing
            weakNever = never
        }
        sleepBriefly()
        #expect(log.all == ["cancel 0 on target true", "never: cancel"])
        #expect(eventually { weakNever == nil }, "activating a cancelled source must not keep it alive")
    }
}

/// Listing 4-2's event and cancel handlers, recording what they saw.
final class ListingReader: Sendable {
    struct Outcome: Sendable {
        var bytes: [UInt8] = []
        var estimates: [UInt64] = []
        var closeResults: [Int32] = []
        var offTarget = 0
        var callsAfterCancelHandler = 0
    }

    private let state = LockedValue(Outcome())
    let closed = Semaphore(value: 0)

    var outcome: Outcome { state.withLock { $0 } }

    func readOnce(_ source: EventSource, onTarget: Bool) {
        let estimated = Int(source.data) + 1
        var buffer = [UInt8](repeating: 0, count: estimated)
        let actual = read(source.handle, &buffer, estimated)
        let failed = actual < 0 && errno != EAGAIN
        state.withLock {
            if !$0.closeResults.isEmpty { $0.callsAfterCancelHandler += 1 }
            if !onTarget { $0.offTarget += 1 }
            $0.estimates.append(source.data)
            if actual > 0 { $0.bytes += buffer[0..<actual] }
        }
        if actual == 0 || failed { source.cancel() }  // the end: done
    }

    func finish(_ source: EventSource, onTarget: Bool) {
        let result = close(source.handle)
        state.withLock {
            $0.closeResults.append(result)
            if !onTarget { $0.offTarget += 1 }
        }
        closed.signal()
    }
}

/// Listing 4-5 in an exit test's process: 0 when it behaved, else the
/// number of the failed check.
private func sighupReload(_ kind: HandlerPlaceKind) -> Int32 {
    armHangAlarm(seconds: 60)
    signal(SIGHUP, SIG_IGN)
    guard let place = try? HandlerPlace(kind, label: "guide.sighup") else { return 2 }
    defer { place.close() }
    let reloads = LockedValue((count: UInt64(0), handles: Set<Int32>(), offTarget: 0))
    let cancelled = Semaphore(value: 0)
    guard let source = try? EventSource.signal(SIGHUP, on: place.target) else { return 3 }
    source.setEventHandler { s in
        reloads.withLock {
            $0.count += s.data
            $0.handles.insert(s.handle)
            if !place.isCurrent { $0.offTarget += 1 }
        }
    }
    source.setCancelHandler { _ in cancelled.signal() }
    source.activate()
    raise(SIGHUP)
    guard eventually({ reloads.withLock { $0.count } == 1 }) else { return 4 }
    raise(SIGHUP)
    raise(SIGHUP)
    guard eventually({ reloads.withLock { $0.count } == 3 }) else { return 5 }
    source.cancel()
    guard cancelled.wait(timeout: .seconds(10)) == .completed else { return 6 }
    let seen = reloads.withLock { $0 }
    guard seen.handles == [SIGHUP], seen.offTarget == 0 else { return 7 }
    var now = sigaction()
    sigaction(SIGHUP, nil, &now)
    guard now.sa_flags & SA_SIGINFO == 0,
        unsafeBitCast(now.__sigaction_handler.sa_handler, to: Int.self) == unsafeBitCast(SIG_IGN, to: Int.self)
    else { return 8 }
    raise(SIGHUP)  // ignored, as before the source
    usleep(10_000)
    guard reloads.withLock({ $0.count }) == 3 else { return 9 }
    return 0
}

/// Listing 4-6 in an exit test's process P: P forks M, M forks C; C
/// watches M with a self-owned source and says so on `ready`; M exits; C's
/// handler sets its flag and cancels; C writes its result (0 when all held)
/// on `result`, which P reads. 0 when all held, else the failed check.
private func parentDeath(_ kind: HandlerPlaceKind) -> Int32 {
    var ready: [Int32] = [0, 0]
    var result: [Int32] = [0, 0]
    guard pipe(&ready) == 0, pipe(&result) == 0 else { return 2 }
    let middle = fork()
    if middle == 0 {
        let child = fork()
        if child == 0 {
            armHangAlarm(seconds: 60)
            close(ready[0])
            close(result[0])
            var outcome = UInt8(truncatingIfNeeded: watchParent(kind, ready: ready[1]))
            _ = write(result[1], &outcome, 1)
            _exit(0)
        }
        close(ready[1])
        var byte: UInt8 = 0
        _ = read(ready[0], &byte, 1)   // C watches: now exit
        _exit(child > 0 ? 0 : 1)
    }
    guard middle > 0 else { return 3 }
    close(ready[0])
    close(ready[1])
    close(result[1])
    var status: Int32 = 0
    guard waitpid(middle, &status, 0) == middle, status == 0 else { return 4 }
    var poller = pollfd(fd: result[0], events: Int16(POLLIN), revents: 0)
    guard poll(&poller, 1, 30_000) == 1 else { return 5 }
    var outcome: UInt8 = 255
    guard read(result[0], &outcome, 1) == 1 else { return 6 }
    return Int32(outcome)
}

/// C's part of `parentDeath`: 0 when its flag was set by the source, the
/// source cancelled itself and was freed; else the failed check (20 up).
private func watchParent(_ kind: HandlerPlaceKind, ready: Int32) -> Int32 {
    let parent = getppid()
    guard let place = try? HandlerPlace(kind, label: "guide.parent") else { return 20 }
    let exitFlag = LockedValue(false)
    let flagged = Semaphore(value: 0)
    let cancelled = Semaphore(value: 0)
    let seen = LockedValue((data: UInt64(0), status: EventSource.ExitStatus?.none, handle: Int32(0)))
    weak var weakSource: EventSource?
    do {
        guard let source = try? EventSource.process(parent, events: .exit, on: place.target) else { return 21 }
        source.setEventHandler { s in
            seen.withLock { $0 = (s.data, s.exitStatus, s.handle) }
            exitFlag.withLock { $0 = true }
            s.cancel()
            flagged.signal()
        }
        source.setCancelHandler { _ in cancelled.signal() }
        source.activate()
        weakSource = source
    }
    guard getppid() == parent else { return 22 }  // M waits for `ready`
    var byte: UInt8 = 1
    guard write(ready, &byte, 1) == 1 else { return 23 }
    guard flagged.wait(timeout: .seconds(10)) == .completed else { return 24 }
    guard cancelled.wait(timeout: .seconds(10)) == .completed else { return 25 }
    guard exitFlag.withLock({ $0 }) else { return 26 }
    let (data, status, handle) = seen.withLock { $0 }
    guard data == EventSource.ProcessEvents.exit.rawValue, handle == parent else { return 27 }
    guard status == nil else { return 28 }  // M is not C's child: no status
    guard eventually({ weakSource == nil }) else { return 29 }
    place.close()
    return 0
}
