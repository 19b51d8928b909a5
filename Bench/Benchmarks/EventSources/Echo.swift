// Read sources: one byte echoed over a socketpair, A→B→A, per operation.
//
// A and B each own one end of a socketpair(AF_UNIX, SOCK_STREAM), each with
// a read source on its end. B's handler reads the byte and sends it back;
// A's handler reads the reply, counts it and sends the next byte until the
// batch's replies are all in, then tells the driver (this benchmark's
// thread). The driver sends the first byte and waits once for the batch,
// so its own hand-off is spread over the batch (as the RunLoop group's
// loop.echo does). One byte is in flight at a time.
//
// - Spindle.WorkQueue: `EventSource.read` on each end, handlers on a serial
//   WorkQueue per side; the descriptors are watched by the reactor thread.
// - Spindle.ThreadLoop: the same sources targeting a LoopThread per side;
//   each loop watches its own descriptor, no other thread is involved.
// - DispatchSourceRead (the reference): DispatchSource.makeReadSource on
//   each end, each on its own serial DispatchQueue, the same handlers.
//
// Every iteration makes its sockets, queues or threads, and sources before
// its measurement starts, and cancels, waits for the cancel handlers,
// closes and joins after it stops. Every row reports the process's CPU
// time per round trip beside the wall time (cpuPerOperation, a running mean
// over the run; it includes set-up and tear-down, the same for every row).
import Benchmark
import BenchSupport
import Dispatch
import Foundation
import Spindle

#if canImport(Glibc)
import Glibc
#endif

/// A connected non-blocking socketpair(AF_UNIX, SOCK_STREAM).
final class EchoSockets: Sendable {
    let a: Int32
    let b: Int32

    init() {
        var ends: [Int32] = [-1, -1]
        let type = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue)
        let result = socketpair(AF_UNIX, type, 0, &ends)
        precondition(result == 0, "sources.echo: socketpair failed: errno \(errno)")
        (a, b) = (ends[0], ends[1])
    }

    func close() {
        _ = Glibc.close(a)
        _ = Glibc.close(b)
    }
}

/// Reads one byte; false if there was none (a stale readiness, or the end).
func readEchoByte(_ fd: Int32) -> Bool {
    var byte: UInt8 = 0
    while true {
        let n = read(fd, &byte, 1)
        if n == 1 { return true }
        if n < 0 && errno == EINTR { continue }
        if n < 0 && errno != EAGAIN { report("sources.echo: read(\(fd)) failed: errno \(errno)") }
        return false
    }
}

/// Sends one byte. MSG_NOSIGNAL: a peer gone gives EPIPE, not SIGPIPE.
func sendEchoByte(_ fd: Int32) {
    var byte: UInt8 = 0x2A
    while true {
        if send(fd, &byte, 1, Int32(MSG_NOSIGNAL)) == 1 { return }
        if errno == EINTR { continue }
        report("sources.echo: send(\(fd)) failed: errno \(errno)")
        return
    }
}

/// A's count of replies still to come.
final class EchoBatch: @unchecked Sendable {
    // @unchecked: set before the sources exist, then touched only by A's
    // handler, whose calls never overlap.
    var remaining: Int
    let done = Counter()
    init(replies: Int) { remaining = replies }
}

func echoSideB(_ fd: Int32) {
    if readEchoByte(fd) { sendEchoByte(fd) }
}

func echoSideA(_ fd: Int32, _ batch: EchoBatch) {
    if readEchoByte(fd) {
        batch.remaining -= 1
        if batch.remaining == 0 { batch.done.bump() } else { sendEchoByte(fd) }
    }
}

/// One iteration's sockets and the sources serving them.
protocol EchoSides: AnyObject {
    var sockets: EchoSockets { get }
    /// Cancels both sources, waits for their cancel handlers, closes the
    /// sockets and stops any thread the row started.
    func tearDown()
}

final class SpindleEchoSides: EchoSides {
    let sockets = EchoSockets()
    let threads = LoopThreads()
    let sourceA: EventSource
    let sourceB: EventSource
    let cancelled = Counter()

    init(_ place: Place, _ batch: EchoBatch) {
        let (fdA, fdB) = (sockets.a, sockets.b)
        do {
            sourceA = try EventSource.read(descriptor: fdA, on: place.makeTarget("bench.sources.echo.a", threads))
            sourceB = try EventSource.read(descriptor: fdB, on: place.makeTarget("bench.sources.echo.b", threads))
        } catch {
            failLoudly("sources.echo: cannot make a read source: \(error)")
        }
        let cancelled = self.cancelled
        sourceA.setEventHandler { _ in echoSideA(fdA, batch) }
        sourceB.setEventHandler { _ in echoSideB(fdB) }
        sourceA.setCancelHandler { _ in cancelled.bump() }
        sourceB.setCancelHandler { _ in cancelled.bump() }
        sourceA.activate()
        sourceB.activate()
    }

    func tearDown() {
        sourceA.cancel()
        sourceB.cancel()
        if cancelled.wait(for: 2, "Spindle's cancel handlers") {
            sockets.close()
        } else {
            report("sources.echo: Spindle's sources were not cancelled within 10 s; sockets left open")
        }
        threads.stopAll()
    }
}

final class DispatchEchoSides: EchoSides {
    let sockets = EchoSockets()
    let sourceA: DispatchSourceRead
    let sourceB: DispatchSourceRead
    let cancelled = Counter()

    init(_ batch: EchoBatch) {
        let (fdA, fdB) = (sockets.a, sockets.b)
        sourceA = DispatchSource.makeReadSource(fileDescriptor: fdA, queue: DispatchQueue(label: "bench.sources.echo.a"))
        sourceB = DispatchSource.makeReadSource(fileDescriptor: fdB, queue: DispatchQueue(label: "bench.sources.echo.b"))
        let cancelled = self.cancelled
        sourceA.setEventHandler { echoSideA(fdA, batch) }
        sourceB.setEventHandler { echoSideB(fdB) }
        sourceA.setCancelHandler { cancelled.bump() }
        sourceB.setCancelHandler { cancelled.bump() }
        sourceA.resume()
        sourceB.resume()
    }

    func tearDown() {
        sourceA.cancel()
        sourceB.cancel()
        if cancelled.wait(for: 2, "Dispatch's cancel handlers") {
            sockets.close()
        } else {
            report("sources.echo: Dispatch's sources were not cancelled within 10 s; sockets left open")
        }
    }
}

func measureEcho(_ benchmark: Benchmark, _ makeSides: (EchoBatch) -> any EchoSides) {
    let batch = EchoBatch(replies: benchmark.scaledIterations.count)
    let sides = makeSides(batch)
    benchmark.startMeasurement()
    sendEchoByte(sides.sockets.a)
    batch.done.wait(for: 1, "the echo batch's last reply")
    benchmark.stopMeasurement()
    sides.tearDown()
}

func echoBenchmarks() {
    let settings = RunSettings(
        scalingFactor: .kilo, maxDuration: .seconds(2), maxIterations: 20, warmupIterations: 2,
        reportedMetrics: [.cpuPerOperation])
    var rows: [Implementation] = Place.allCases.map { place in
        Implementation(place.rowName, isReference: false) { benchmark in
            measureEcho(benchmark) { SpindleEchoSides(place, $0) }
        }
    }
    rows.append(.reference("DispatchSourceRead") { benchmark in
        measureEcho(benchmark) { DispatchEchoSides($0) }
    })
    sideBySide(group: "sources.echo socketpair", settings: settings, implementations: rows)
}
