// Descriptor sources: one byte echoed over a socketpair, A→B→A, per operation.
//
// Two sides, A and B, each own one end of a socketpair(AF_UNIX, SOCK_STREAM).
// B reads each byte that arrives and sends it back; A reads the reply, counts
// it, and sends the next byte until the batch's replies are all in, then
// tells the driver (this benchmark's thread). The driver sends the batch's
// first byte from A's end and waits once for the batch, so its own hand-off
// is spread over the batch, as in loop.roundtrip. One byte is in flight at a
// time, so a send never finds the socket buffer full.
//
// - Spindle.<backend>: A and B are `LoopThread`s, each with a descriptor
//   `LoopSource` (readable) on its end; the handlers read and send.
// - DispatchSourceRead (the reference): a read source on each end, each on
//   its own serial queue, with the same handlers.
// - blocking read floor: two threads in blocking read/send, no event layer:
//   what the kernel's wake-ups alone cost.
//
// Every iteration makes its sockets and threads (or queues) before its
// measurement starts and takes them down after it stops, so each row leaves
// nothing running: sources invalidated or cancelled, loops stopped, threads
// joined, descriptors closed. Every row reports the process's CPU time per
// round trip beside the wall time (BenchSupport's cpuPerOperation, a running
// mean over the run). A batch
// that stalls is reported after 10 s (Counter.wait) and taken down all the
// same.
import Benchmark
import BenchSupport
import Dispatch
import Foundation
import Spindle

#if canImport(Glibc)
import Glibc
#endif

/// A connected socketpair(AF_UNIX, SOCK_STREAM): A's end and B's end.
final class EchoSockets: Sendable {
    let a: Int32
    let b: Int32

    /// Non-blocking for the rows whose sources read when told the end is
    /// readable; blocking for the floor's threads.
    init(nonBlocking: Bool) {
        var ends: [Int32] = [-1, -1]
        var type = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        if nonBlocking { type |= Int32(SOCK_NONBLOCK.rawValue) }
        let result = socketpair(AF_UNIX, type, 0, &ends)
        precondition(result == 0, "loop.echo: socketpair failed: errno \(errno)")
        (a, b) = (ends[0], ends[1])
    }

    /// Ends both directions: a read blocked on either end returns 0.
    func shutDown() {
        _ = shutdown(a, Int32(SHUT_RDWR))
        _ = shutdown(b, Int32(SHUT_RDWR))
    }

    /// Closes both ends; only once nothing watches or reads them any more.
    func close() {
        _ = Glibc.close(a)
        _ = Glibc.close(b)
    }
}

func echoFailure(_ message: String) {
    FileHandle.standardError.write(Data("loop.echo: \(message)\n".utf8))
}

/// What one read of a byte found.
enum EchoRead {
    /// A byte arrived.
    case byte
    /// Nothing to read yet (EAGAIN on a non-blocking end: a readiness that
    /// went stale); wait for the next one.
    case notYet
    /// End of file (the other end was shut down) or an error (reported):
    /// this side is done.
    case closed
}

/// Reads one byte from `fd`, retrying when a signal interrupts the call.
func readEchoByte(_ fd: Int32) -> EchoRead {
    var byte: UInt8 = 0
    while true {
        let n = read(fd, &byte, 1)
        if n == 1 { return .byte }
        if n == 0 { return .closed }
        let error = errno
        switch error {
        case EINTR: continue
        case EAGAIN: return .notYet  // EWOULDBLOCK is the same number on Linux
        default:
            echoFailure("read(\(fd)) failed: errno \(error)")
            return .closed
        }
    }
}

/// Sends one byte on `fd`, retrying when a signal interrupts the call.
/// MSG_NOSIGNAL: an end shut down while a stalled batch is taken down gives
/// EPIPE, not SIGPIPE. EAGAIN cannot happen with one byte in flight; like any
/// error it is reported, and the batch then stalls until the driver's 10 s
/// timeout reports it too.
func sendEchoByte(_ fd: Int32) {
    var byte: UInt8 = 0x2A
    while true {
        if send(fd, &byte, 1, Int32(MSG_NOSIGNAL)) == 1 { return }
        let error = errno
        if error == EINTR { continue }
        echoFailure("send(\(fd)) failed: errno \(error)")
        return
    }
}

/// A's count of replies still to come in the batch.
final class EchoBatch: @unchecked Sendable {
    // @unchecked: `remaining` is set before A's side starts (the driver
    // makes the batch before its threads, queues and sources exist) and then
    // touched only by A's side, one call at a time: A's loop thread, A's
    // serial queue, or A's thread.
    var remaining: Int
    let done: Counter
    init(replies: Int, done: Counter) {
        remaining = replies
        self.done = done
    }
}

/// B's side: one byte is readable; send it back.
func echoSideB(_ fd: Int32) -> EchoRead {
    let read = readEchoByte(fd)
    if read == .byte { sendEchoByte(fd) }
    return read
}

/// A's side: a reply is readable; count it, then send the next byte or,
/// after the last reply, tell the driver.
func echoSideA(_ fd: Int32, _ batch: EchoBatch) -> EchoRead {
    let read = readEchoByte(fd)
    if read == .byte {
        batch.remaining -= 1
        if batch.remaining == 0 { batch.done.bump() } else { sendEchoByte(fd) }
    }
    return read
}

/// One iteration's sockets and the two sides serving them.
protocol EchoSides: AnyObject {
    var sockets: EchoSockets { get }
    /// Stops both sides for good and closes the sockets. Blocks until no
    /// thread of this row runs any more (or, for Dispatch, until both
    /// sources' cancel handlers have run).
    func tearDown()
}

/// Spindle: a LoopThread per side, a readable descriptor source on each end.
final class SpindleEchoSides: EchoSides {
    let sockets = EchoSockets(nonBlocking: true)
    let a: LoopThread
    let b: LoopThread
    let sourceA: LoopSource
    let sourceB: LoopSource

    init(_ kind: EventBackendKind, _ batch: EchoBatch) throws {
        let (fdA, fdB) = (sockets.a, sockets.b)
        // One `failed` callback per source: each is handed over (`sending`).
        func failed(_ side: String) -> (LoopSource, DescriptorWatchError) -> Void {
            { _, error in echoFailure("\(side)'s descriptor source failed: \(error)") }
        }
        sourceA = LoopSource(descriptor: fdA, interest: .readable, failed: failed("A")) { source, _ in
            if echoSideA(fdA, batch) == .closed { source.invalidate() }
        }
        sourceB = LoopSource(descriptor: fdB, interest: .readable, failed: failed("B")) { source, _ in
            if echoSideB(fdB) == .closed { source.invalidate() }
        }
        a = try LoopThread.start(backend: kind)
        b = try LoopThread.start(backend: kind)
        a.loop.add(sourceA)
        b.loop.add(sourceB)
    }

    func tearDown() {
        sourceA.invalidate()
        sourceB.invalidate()
        a.stop()
        b.stop()
        do {
            try a.join()
            try b.join()
        } catch {
            echoFailure("a loop thread's body threw: \(error)")
        }
        sockets.close()
    }
}

/// Dispatch: a read source per end, each on its own serial queue.
final class DispatchEchoSides: EchoSides {
    let sockets = EchoSockets(nonBlocking: true)
    let sourceA: DispatchSourceRead
    let sourceB: DispatchSourceRead
    let cancelled = Counter()

    init(_ batch: EchoBatch) {
        let (fdA, fdB) = (sockets.a, sockets.b)
        sourceA = DispatchSource.makeReadSource(fileDescriptor: fdA, queue: DispatchQueue(label: "bench.echo.a"))
        sourceB = DispatchSource.makeReadSource(fileDescriptor: fdB, queue: DispatchQueue(label: "bench.echo.b"))
        let (sourceA, sourceB, cancelled) = (self.sourceA, self.sourceB, self.cancelled)
        sourceA.setEventHandler {
            if echoSideA(fdA, batch) == .closed { sourceA.cancel() }
        }
        sourceB.setEventHandler {
            if echoSideB(fdB) == .closed { sourceB.cancel() }
        }
        sourceA.setCancelHandler { cancelled.bump() }
        sourceB.setCancelHandler { cancelled.bump() }
        sourceA.resume()
        sourceB.resume()
    }

    func tearDown() {
        sourceA.cancel()
        sourceB.cancel()
        // A source's cancel handler runs after its event handler has
        // returned for good: then its descriptor may be closed.
        if cancelled.wait(for: 2) {
            sockets.close()
        } else {
            echoFailure("a Dispatch source was not cancelled within 10 s; its sockets are left open")
        }
    }
}

/// The floor: a thread per side in blocking read/send.
final class BlockingEchoSides: EchoSides {
    let sockets = EchoSockets(nonBlocking: false)
    let a: SpawnedThread<Void>
    let b: SpawnedThread<Void>

    init(_ batch: EchoBatch) throws {
        let (fdA, fdB) = (sockets.a, sockets.b)
        b = try NativeThread.start {
            while echoSideB(fdB) != .closed {}
        }
        a = try NativeThread.start {
            while batch.remaining > 0 {
                if echoSideA(fdA, batch) == .closed { return }
            }
        }
    }

    func tearDown() {
        // B waits in read for a byte that will not come (and A too, if the
        // batch stalled): end of file wakes them.
        sockets.shutDown()
        do {
            try a.join()
            try b.join()
        } catch {
            echoFailure("an echo thread threw: \(error)")
        }
        sockets.close()
    }
}

/// One measured iteration: makes the sides (not measured), sends the first
/// byte from A's end and waits for the batch's last reply, then takes the
/// sides down (not measured). Records the process's CPU time per round trip.
func measureEcho(_ benchmark: Benchmark, _ makeSides: (EchoBatch) throws -> any EchoSides) {
    let replies = benchmark.scaledIterations.count
    let batch = EchoBatch(replies: replies, done: Counter())
    let sides: any EchoSides
    do {
        sides = try makeSides(batch)
    } catch {
        fatalError("loop.echo: cannot start the sides: \(error)")
    }
    benchmark.startMeasurement()
    sendEchoByte(sides.sockets.a)
    batch.done.wait(for: 1)
    benchmark.stopMeasurement()
    sides.tearDown()
    // CPU time per round trip is measured by sideBySide over the whole run
    // (the group declares cpuPerOperation), partner threads included; it
    // also counts each iteration's set-up and tear-down (two threads or
    // queues and a socketpair per 1,000 round trips, well under 1%).
}

let echoBenchmarks: @Sendable ([EventBackendKind]) -> Void = { backends in
    let settings = RunSettings(
        scalingFactor: .kilo, maxDuration: .seconds(2), maxIterations: 20, warmupIterations: 2,
        reportedMetrics: [.cpuPerOperation])
    var echo: [Implementation] = backends.map { kind in
        Implementation(kind == .ioUring ? "Spindle.iouring" : "Spindle.epoll", isReference: false) { benchmark in
            measureEcho(benchmark) { try SpindleEchoSides(kind, $0) }
        }
    }
    echo.append(.reference("DispatchSourceRead") { benchmark in
        measureEcho(benchmark) { DispatchEchoSides($0) }
    })
    echo.append(.peer("blocking read floor") { benchmark in
        measureEcho(benchmark) { try BlockingEchoSides($0) }
    })
    sideBySide(group: "loop.echo socketpair", settings: settings, implementations: echo)
}
