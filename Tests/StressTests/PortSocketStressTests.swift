import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// Per-sender order as the receiving loop saw it. Written only on the
/// loop's thread, read after that thread is joined.
private final class Order: @unchecked Sendable {
    // @unchecked: see above; the join orders the reads after the writes.
    var next: [Int]
    var faults = 0
    var total = 0
    init(_ senders: Int) { next = [Int](repeating: 0, count: senders) }
    func record(_ bytes: [UInt8]?) {
        guard let bytes, bytes.count == 8 else {
            faults += 1
            return
        }
        let s = Int(bytes.withUnsafeBytes { $0.loadUnaligned(as: UInt32.self) })
        let i = Int(bytes.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 4, as: UInt32.self) })
        guard s < next.count, i == next[s] else {
            faults += 1
            return
        }
        next[s] = i + 1
        total += 1
    }
}

private func numbered(_ sender: Int, _ index: Int) -> PortEnvelope {
    PortEnvelope(id: 1, components: [.bytes(withUnsafeBytes(of: (UInt32(sender), UInt32(index))) { Array($0) })])
}

@Suite("Port stress over sockets")
struct PortSocketStressTests {
    /// A NamedPort in one process, under ThreadSanitizer: 4 threads each
    /// with a send right of its own send 5,000 numbered messages (10^5 at
    /// full size, the count per sender); 2 more
    /// share one looked-up RemotePort for requests (one at a time on it,
    /// each answered with its own number) and one-way sends. All arrive once,
    /// in order per sender; every reply matches its request.
    @Test(arguments: availableBackends)
    func namedPortManySendersAndSharedRequests(kind: EventBackendKind) throws {
        let senders = 4
        let perSender = stressSize(ci: 5_000, full: 100_000)
        let order = Order(senders + 2)
        let name = "stress.\(getpid()).\(kind)"
        let port = try NamedPort(name: name) { m in
            if m.id == 2 { return PortEnvelope(id: 2, components: m.components) }
            order.record(m.components.first?.bytes)
            return nil
        }
        let thread = try LoopThread.start(backend: kind)
        thread.loop.add(port)
        let shared = try RemotePort.lookup(name)
        let mismatches = LockedValue(0)
        let failures = LockedValue(0)
        runThreads(senders + 2) { t in
            if t < senders {
                guard let right = try? port.makeSendRight() else {
                    failures.withLock { $0 += 1 }
                    return
                }
                for i in 0..<perSender where (try? right.send(numbered(t, i), timeout: .seconds(30))) == nil {
                    failures.withLock { $0 += 1 }
                }
                right.invalidate()
            } else {
                for i in 0..<500 {
                    let ask = PortEnvelope(id: 2, components: [.bytes([UInt8(t), UInt8(i & 0xff)])])
                    guard let reply = try? shared.sendRequest(ask, timeout: .seconds(30), replyTimeout: .seconds(30)) else {
                        failures.withLock { $0 += 1 }
                        continue
                    }
                    if reply.components.first?.bytes != [UInt8(t), UInt8(i & 0xff)] { mismatches.withLock { $0 += 1 } }
                    if (try? shared.send(numbered(t, i), timeout: .seconds(30))) == nil { failures.withLock { $0 += 1 } }
                }
            }
        }
        // Every send has returned; wait (on the loop's thread, which alone
        // touches `order`) until the loop has taken them all.
        let expected = senders * perSender + 2 * 500
        let deadline = MonotonicClock.now.advanced(by: .seconds(60))
        var done = false
        while !done && MonotonicClock.now < deadline {
            let seen = LockedValue(0)
            thread.loop.perform(waitUntilDone: true) { seen.withLock { $0 = order.total + order.faults } }
            done = seen.withLock { $0 } >= expected
            if !done { usleep(1_000) }
        }
        shared.invalidate()
        port.invalidate()
        thread.stop()
        try thread.join()
        #expect(failures.withLock { $0 } == 0)
        #expect(mismatches.withLock { $0 } == 0)
        #expect(order.faults == 0)
        #expect(order.total == expected)
        #expect(order.next == [Int](repeating: perSender, count: senders) + [500, 500])
        // Every message checked in order on arrival, every reply checked against its request.
        StressReport.record(operations: expected + 2 * 500, threads: senders + 2, checks: expected + 2 * 500 + 5)
    }

    /// A NetworkPort under ThreadSanitizer: 3 threads share one RemotePort
    /// (frames from several threads must not interleave on the stream) and 2
    /// have their own; every message arrives once, in order per sender, and
    /// no frame is malformed.
    @Test(arguments: availableBackends)
    func networkPortSharedAndOwnConnections(kind: EventBackendKind) throws {
        let senders = 5
        let perSender = stressSize(ci: 3_000, full: 60_000)
        let order = Order(senders)
        let port = try NetworkPort { m in
            if m.id == 2 { return PortEnvelope(id: 2) }
            order.record(m.components.first?.bytes)
            return nil
        }
        let thread = try LoopThread.start(backend: kind)
        thread.loop.add(port)
        let shared = try RemotePort.connect(host: "127.0.0.1", port: port.port)
        let failures = LockedValue(0)
        runThreads(senders) { t in
            let remote = t < 3 ? shared : (try? RemotePort.connect(host: "127.0.0.1", port: port.port))
            guard let remote else {
                failures.withLock { $0 += 1 }
                return
            }
            for i in 0..<perSender where (try? remote.send(numbered(t, i), timeout: .seconds(30))) == nil {
                failures.withLock { $0 += 1 }
            }
            // Answered after every earlier message on its connection.
            if (try? remote.sendRequest(PortEnvelope(id: 2), timeout: .seconds(30), replyTimeout: .seconds(60))) == nil {
                failures.withLock { $0 += 1 }
            }
            if t >= 3 { remote.invalidate() }
        }
        shared.invalidate()
        let malformed = port.malformedFrames
        port.invalidate()
        thread.stop()
        try thread.join()
        #expect(failures.withLock { $0 } == 0)
        #expect(malformed == 0)
        #expect(order.faults == 0)
        #expect(order.next == [Int](repeating: perSender, count: senders))
        // Every message checked in order on arrival.
        StressReport.record(operations: senders * (perSender + 1), threads: senders, checks: senders * perSender + 4)
    }
}
