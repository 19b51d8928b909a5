import CShims
import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// A loop thread that receives on a `NetworkPort`.
private final class Listener: Sendable {
    let thread: LoopThread
    let port: NetworkPort
    init(_ port: NetworkPort, backend: EventBackendKind? = nil) throws {
        thread = try LoopThread.start(backend: backend)
        self.port = port
        thread.loop.add(port)
    }
    func finish() throws {
        port.invalidate()
        thread.stop()
        try thread.join()
    }
}

/// A raw TCP connection to `port` on loopback, for writing bytes that no
/// `RemotePort` would.
private func rawConnection(_ port: UInt16) -> Int32 {
    cshims_port_tcp_connect("127.0.0.1", port, 5_000_000_000)
}

private func writeAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
    bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) } == bytes.count
}

/// Waits (up to 10 s) until `condition` holds.
private func eventually(_ condition: () -> Bool) -> Bool {
    let deadline = MonotonicClock.now.advanced(by: .seconds(10))
    while !condition() {
        if MonotonicClock.now >= deadline { return false }
        usleep(1_000)
    }
    return true
}

private func littleEndian(_ v: UInt32) -> [UInt8] { withUnsafeBytes(of: v.littleEndian) { Array($0) } }

@Suite("NetworkPort")
struct NetworkPortTests {
    /// Over loopback: one-way messages (a burst of 200 messages under 12
    /// bytes, which Foundation's SocketPort drops) arrive in order, a
    /// request gets its reply, and a 3 MiB message arrives whole.
    @Test(arguments: availableBackends)
    func messagesRequestsAndLargeFramesOverLoopback(kind: EventBackendKind) throws {
        let got = LockedValue<[UInt32]>([])
        let sizes = LockedValue<[Int]>([])
        let listener = try Listener(
            NetworkPort { m in
                got.withLock { $0.append(m.id) }
                sizes.withLock { $0.append(m.byteCount) }
                return m.id == 1_000 ? PortEnvelope(id: 1_001, components: m.components) : nil
            }, backend: kind)
        #expect(listener.port.port != 0)
        let remote = try RemotePort.connect(host: "127.0.0.1", port: listener.port.port)
        #expect(remote.name == "127.0.0.1:\(listener.port.port)")
        for i in 0..<200 {
            try remote.send(PortEnvelope(id: UInt32(i), components: [.bytes([UInt8(i & 0xff)])]), timeout: .seconds(5))
        }
        let big = [UInt8]((0..<(3 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        let reply = try remote.sendRequest(PortEnvelope(id: 1_000, components: [.bytes(big)]), timeout: .seconds(10), replyTimeout: .seconds(20))
        #expect(reply.id == 1_001)
        #expect(reply.components.first?.bytes == big)
        #expect(got.withLock { $0 } == Array(0..<200) + [1_000])
        #expect(sizes.withLock { $0.last } == big.count)
        remote.invalidate()
        try listener.finish()
    }

    /// An oversize length, a record that does not add up, and a stream cut
    /// in the middle of a frame each close their own connection only; a
    /// well-behaved sender on another connection is still served.
    @Test func badFramesCloseOnlyTheirConnection() throws {
        let got = LockedValue<[UInt32]>([])
        let listener = try Listener(NetworkPort { m in got.withLock { $0.append(m.id) }; return nil })
        let port = listener.port.port
        let good = try RemotePort.connect(host: "127.0.0.1", port: port)
        try good.send(PortEnvelope(id: 1), timeout: .seconds(5))

        // 1. A length over the limit.
        let oversize = rawConnection(port)
        #expect(oversize >= 0)
        #expect(writeAll(oversize, littleEndian(UInt32.max)))
        #expect(eventually { listener.port.malformedFrames == 1 })
        var byte: UInt8 = 0
        #expect(read(oversize, &byte, 1) <= 0)  // closed by the port
        close(oversize)

        // 2. A frame of the right length whose record is garbage.
        let garbage = rawConnection(port)
        #expect(writeAll(garbage, littleEndian(40) + [UInt8](repeating: 0xEE, count: 40)))
        #expect(eventually { listener.port.malformedFrames == 2 })
        close(garbage)

        // 3. Half a frame, then the end of the stream.
        let truncated = rawConnection(port)
        #expect(writeAll(truncated, littleEndian(100) + [UInt8](repeating: 0, count: 10)))
        usleep(20_000)
        close(truncated)
        #expect(eventually { listener.port.malformedFrames == 3 })

        try good.send(PortEnvelope(id: 2), timeout: .seconds(5))
        _ = try good.sendRequest(PortEnvelope(id: 3), timeout: .seconds(5), replyTimeout: .seconds(10))
        #expect(got.withLock { $0 } == [1, 2, 3])
        try listener.finish()
    }

    @Test func nothingListeningAndAnAddressInUseAreSpecificErrors() throws {
        let first = try NetworkPort { _ in nil }
        #expect(throws: PortError.nameTaken("127.0.0.1:\(first.port)")) {
            _ = try NetworkPort(port: first.port) { _ in nil }
        }
        let freed = first.port
        first.invalidate()
        #expect(throws: PortError.nameNotFound("127.0.0.1:\(freed)")) {
            _ = try RemotePort.connect(host: "127.0.0.1", port: freed)
        }
        #expect(throws: PortError.self) { _ = try NetworkPort(host: "not-an-address") { _ in nil } }
    }

    /// Ports do not travel between hosts; invalidating the listener ends
    /// its connections, and the sender learns it.
    @Test func portsDoNotTravelAndInvalidationReachesTheSender() throws {
        let listener = try Listener(NetworkPort { _ in nil })
        let remote = try RemotePort.connect(host: "127.0.0.1", port: listener.port.port)
        let unpublished = NamedPort { _ in nil }
        let right = try unpublished.makeSendRight()
        #expect(throws: PortError.notTransferable("a RemotePort (to another host)")) {
            try remote.send(PortEnvelope(components: [.remotePort(right)]), timeout: .seconds(1))
        }
        right.invalidate()
        unpublished.invalidate()
        _ = try remote.sendRequest(PortEnvelope(id: 5), timeout: .seconds(5), replyTimeout: .seconds(10))
        #expect(listener.port.connectionCount == 1)
        let told = LockedValue(0)
        listener.port.onInvalidation { _ in told.withLock { $0 += 1 } }
        listener.port.invalidate()
        #expect(told.withLock { $0 } == 1)
        #expect(throws: PortError.peerGone) {
            _ = try remote.sendRequest(PortEnvelope(id: 6), timeout: .seconds(5), replyTimeout: .seconds(10))
        }
        try listener.finish()
    }
}
