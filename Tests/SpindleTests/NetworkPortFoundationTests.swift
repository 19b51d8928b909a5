import CShims
import Foundation
import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

// NetworkPort and RemotePort in `.foundationSocketPort` wire format, against
// Foundation's real SocketPort in this process. Foundation's receiver loses
// messages under 12 bytes and frames over one 32 KiB read, and traps when one
// read holds two frames, so everything sent *to* Foundation here is 12 B to
// 30 KB and goes one message at a time, each acknowledged before the next.

/// One message as received: its id and its byte buffers.
private struct Received: Equatable, CustomStringConvertible {
    let id: UInt32
    let parts: [[UInt8]]
    var description: String { "\(id): \(parts.map(\.count)) bytes" }
}

/// `count` bytes of a pattern that differs with `seed`, so that a shifted or
/// mixed-up buffer does not compare equal.
private func pattern(_ count: Int, seed: Int) -> [UInt8] {
    (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ seed &* 7 &+ ($0 >> 8)) }
}

private func bigEndian(_ v: UInt32) -> [UInt8] { withUnsafeBytes(of: v.bigEndian) { Array($0) } }

/// A Foundation `SocketPort` listening on every address, received by a
/// Foundation `RunLoop` on a Foundation `Thread` of its own. Its delegate
/// records each message and passes it to `onMessage` on that thread.
private final class FoundationReceiver: NSObject, PortDelegate, @unchecked Sendable {
    // @unchecked: `messages` and `stopped` are LockedValues; `onMessage` is
    // immutable; `number` is written before `ready` opens and read after it.
    let messages = LockedValue<[Received]>([])
    private let onMessage: @Sendable (Received) -> Void
    private let stopped = LockedValue(false)
    private let ready = Latch()
    private let done = Latch()
    private(set) var number: UInt16 = 0

    init(onMessage: @escaping @Sendable (Received) -> Void) {
        self.onMessage = onMessage
        super.init()
        Foundation.Thread { self.run() }.start()
        ready.wait()
    }

    private func run() {
        defer { done.countDown() }
        guard let port = SocketPort(tcpPort: 0) else {
            ready.countDown()
            return
        }
        port.setDelegate(self)
        RunLoop.current.add(port, forMode: .default)
        // The address is a sockaddr_in: the TCP port, in network order, at 2.
        number = port.address.withUnsafeBytes { UInt16(bigEndian: $0.loadUnaligned(fromByteOffset: 2, as: UInt16.self)) }
        ready.countDown()
        while !stopped.withLock({ $0 }) {
            _ = RunLoop.current.run(mode: .default, before: Date(timeIntervalSinceNow: 0.02))
        }
        RunLoop.current.remove(port, forMode: .default)
        port.invalidate()
    }

    func handle(_ message: PortMessage) {
        let parts = (message.components ?? []).map { ($0 as? NSData).map { [UInt8](Data(referencing: $0)) } ?? [] }
        let received = Received(id: message.msgid, parts: parts)
        messages.withLock { $0.append(received) }
        onMessage(received)
    }

    func stop() {
        stopped.withLock { $0 = true }
        #expect(done.wait(seconds: 10), "the Foundation RunLoop thread did not stop")
    }
}

/// Sends with Foundation's `SocketPort` to the port at `number` on loopback.
private func foundationSend(_ port: SocketPort, _ message: Received) -> Bool {
    let components = NSMutableArray(array: message.parts.map { NSData(bytes: $0, length: $0.count) })
    return port.send(before: Date(timeIntervalSinceNow: 5), msgid: Int(message.id), components: components, from: nil, reserved: 0)
}

/// A loop thread receiving a `NetworkPort` in Foundation's format that
/// records every message and runs `onMessage` on the loop's thread.
private final class SpindleReceiver: Sendable {
    let messages = LockedValue<[Received]>([])
    let thread: LoopThread
    let port: NetworkPort

    init(backend: EventBackendKind? = nil, onMessage: @escaping @Sendable (Received) -> Void = { _ in }) throws {
        let messages = messages
        port = try NetworkPort(wireFormat: .foundationSocketPort) { m in
            let received = Received(id: m.id, parts: m.components.map { $0.bytes ?? [] })
            messages.withLock { $0.append(received) }
            onMessage(received)
            return PortEnvelope(id: 999)  // ignored in this format: nothing goes back
        }
        thread = try LoopThread.start(backend: backend)
        thread.loop.add(port)
    }

    func finish() throws {
        port.invalidate()
        thread.stop()
        try thread.join()
    }
}

@Suite("NetworkPort in Foundation's SocketPort format")
struct NetworkPortFoundationTests {
    /// Spindle sends to a real Foundation `SocketPort` (ids across the
    /// range, 12 B to 30 KB, one or two buffers); Foundation's delegate
    /// acknowledges each by sending its id and byte count back to a Spindle
    /// `NetworkPort` in the same format, and only then goes the next one.
    /// Both sides' records are compared exactly.
    @Test(arguments: availableBackends)
    func spindleSendsToFoundationsSocketPort(kind: EventBackendKind) throws {
        let acks = try SpindleReceiver(backend: kind)
        let ackNumber = acks.port.port
        let foundation = FoundationReceiver { m in
            // Runs on Foundation's RunLoop thread. The acknowledgement is 4
            // bytes: Foundation's receiver would drop it; Spindle's must not.
            let back = SocketPort(remoteWithTCPPort: ackNumber, host: "127.0.0.1")!
            let count = UInt32(m.parts.reduce(0) { $0 + $1.count })
            _ = foundationSend(back, Received(id: m.id, parts: [bigEndian(count)]))
        }
        #expect(foundation.number != 0)
        let sent: [Received] = [
            Received(id: 0, parts: [pattern(12, seed: 1)]),
            Received(id: 1, parts: [pattern(13, seed: 2)]),
            Received(id: 100, parts: [pattern(1_000, seed: 3)]),
            Received(id: 7, parts: [pattern(20, seed: 4), pattern(30, seed: 5)]),
            Received(id: 0xFFFF_FFFF, parts: [pattern(4_096, seed: 6)]),
            Received(id: 0x8000_0000, parts: [pattern(16_384, seed: 7)]),
            Received(id: 42, parts: [pattern(30_000, seed: 8)]),
        ]
        let remote = try RemotePort.connect(host: "127.0.0.1", port: foundation.number, wireFormat: .foundationSocketPort)
        #expect(remote.wireFormat == .foundationSocketPort)
        for (i, m) in sent.enumerated() {
            try remote.send(PortEnvelope(id: m.id, components: m.parts.map { .bytes($0) }), timeout: .seconds(5))
            let acknowledged = eventually { acks.messages.withLock { $0.count } == i + 1 }
            #expect(acknowledged, "no acknowledgement of message \(i) (\(m)) from Foundation")
            if !acknowledged { break }
        }
        #expect(foundation.messages.withLock { $0 } == sent)
        let expectedAcks = sent.map { m in Received(id: m.id, parts: [bigEndian(UInt32(m.parts.reduce(0) { $0 + $1.count }))]) }
        #expect(acks.messages.withLock { $0 } == expectedAcks)
        #expect(acks.port.malformedFrames == 0)
        remote.invalidate()
        foundation.stop()
        try acks.finish()
    }

    /// Foundation's `SocketPort.send(before:msgid:components:from:reserved:)`
    /// sends to a Spindle `NetworkPort` in Foundation's format: sizes
    /// Foundation's own receiver loses (none, 0, 1 and 11 bytes, 40 KB,
    /// 200 KB) arrive whole. Spindle acknowledges each with a message of
    /// 16 bytes to a Foundation `SocketPort` (which Foundation receives),
    /// and the next goes only then.
    @Test(arguments: availableBackends)
    func foundationsSocketPortSendsToSpindle(kind: EventBackendKind) throws {
        let acknowledger = LockedValue<RemotePort?>(nil)
        let spindle = try SpindleReceiver(backend: kind) { m in
            let count = UInt32(m.parts.reduce(0) { $0 + $1.count })
            let ack = PortEnvelope(id: m.id &+ 1, components: [.bytes(bigEndian(m.id) + bigEndian(count) + pattern(8, seed: 9))])
            #expect(throws: Never.self) { try acknowledger.withLock { $0 }?.send(ack, timeout: .seconds(5)) }
        }
        let foundation = FoundationReceiver { _ in }
        #expect(foundation.number != 0)
        acknowledger.withLock {
            $0 = try? RemotePort.connect(host: "127.0.0.1", port: foundation.number, wireFormat: .foundationSocketPort)
        }
        #expect(acknowledger.withLock { $0 } != nil)
        let sent: [Received] = [
            Received(id: 5, parts: []),
            Received(id: 6, parts: [[]]),
            Received(id: 7, parts: [[0xAB]]),
            Received(id: 8, parts: [pattern(11, seed: 1)]),
            Received(id: 9, parts: [pattern(12, seed: 2)]),
            Received(id: 0xFFFF_FFFE, parts: [pattern(3, seed: 3), pattern(4_000, seed: 4), []]),
            Received(id: 11, parts: [pattern(40_000, seed: 5)]),
            Received(id: 12, parts: [pattern(200_000, seed: 6)]),
        ]
        let toSpindle = SocketPort(remoteWithTCPPort: spindle.port.port, host: "127.0.0.1")!
        for (i, m) in sent.enumerated() {
            #expect(foundationSend(toSpindle, m), "Foundation's send of message \(i) failed")
            let acknowledged = eventually { foundation.messages.withLock { $0.count } == i + 1 }
            #expect(acknowledged, "no acknowledgement of message \(i) (\(m)) from Spindle")
            if !acknowledged { break }
        }
        #expect(spindle.messages.withLock { $0 } == sent)
        let expectedAcks = sent.map { m in
            Received(id: m.id &+ 1, parts: [bigEndian(m.id) + bigEndian(UInt32(m.parts.reduce(0) { $0 + $1.count })) + pattern(8, seed: 9)])
        }
        #expect(foundation.messages.withLock { $0 } == expectedAcks)
        #expect(spindle.port.malformedFrames == 0)
        toSpindle.invalidate()
        acknowledger.withLock { $0?.invalidate() }
        foundation.stop()
        try spindle.finish()
    }

    /// A bad magic number, a length over the limit, a component that runs
    /// past its frame, a port component and a stream cut mid-frame each
    /// close their own connection only: Foundation's sender and a Spindle
    /// sender on other connections are still served.
    @Test func malformedFoundationFramesCloseOnlyTheirConnection() throws {
        let spindle = try SpindleReceiver()
        let number = spindle.port.port
        let foundation = SocketPort(remoteWithTCPPort: number, host: "127.0.0.1")!
        #expect(foundationSend(foundation, Received(id: 1, parts: [[1, 2, 3]])))
        #expect(eventually { spindle.messages.withLock { $0.count } == 1 })

        let magic = bigEndian(0xD0CF_50C0)
        let signature: [UInt8] = [2, 1, 6, 16, 16, 2, UInt8(number >> 8), UInt8(number & 0xff), 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]
        func frame(_ body: [UInt8]) -> [UInt8] { magic + bigEndian(UInt32(12 + body.count)) + bigEndian(3) + body }
        let bad: [(String, [UInt8])] = [
            ("bad magic", bigEndian(0xDEAD_BEEF) + bigEndian(40) + [UInt8](repeating: 0, count: 32)),
            ("length over the limit", magic + bigEndian(UInt32.max)),
            ("component past the end", frame(signature + bigEndian(1) + bigEndian(100) + [1, 2, 3])),
            ("port component", frame(signature + bigEndian(2) + bigEndian(20) + signature)),
            ("unknown component type", frame(signature + bigEndian(9) + bigEndian(0))),
        ]
        for (i, (what, bytes)) in bad.enumerated() {
            let fd = cshims_port_tcp_connect("127.0.0.1", number, 5_000_000_000)
            #expect(fd >= 0)
            #expect(bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) } == bytes.count)
            #expect(eventually { spindle.port.malformedFrames == i + 1 }, "\(what) was not refused")
            var byte: UInt8 = 0
            #expect(read(fd, &byte, 1) <= 0, "\(what): the connection stayed open")
            close(fd)
        }
        // Half a frame, then the end of the stream.
        let truncated = cshims_port_tcp_connect("127.0.0.1", number, 5_000_000_000)
        let half = magic + bigEndian(100) + [UInt8](repeating: 0, count: 10)
        #expect(half.withUnsafeBytes { write(truncated, $0.baseAddress, $0.count) } == half.count)
        usleep(20_000)
        close(truncated)
        #expect(eventually { spindle.port.malformedFrames == bad.count + 1 })

        #expect(foundationSend(foundation, Received(id: 2, parts: [[4, 5]])))
        let remote = try RemotePort.connect(host: "127.0.0.1", port: number, wireFormat: .foundationSocketPort)
        try remote.send(PortEnvelope(id: 3, components: [.bytes([6])]), timeout: .seconds(5))
        #expect(eventually { spindle.messages.withLock { $0.count } == 3 })
        #expect(spindle.messages.withLock { $0 } == [Received(id: 1, parts: [[1, 2, 3]]), Received(id: 2, parts: [[4, 5]]), Received(id: 3, parts: [[6]])])
        foundation.invalidate()
        remote.invalidate()
        try spindle.finish()
    }

    /// The bytes Spindle puts on the wire, read by a plain TCP listener:
    /// Foundation's header, the destination's signature and one component
    /// per buffer, all big-endian.
    @Test func spindleWritesFoundationsLayout() throws {
        var bound: UInt16 = 0
        let listener = cshims_port_tcp_listen("127.0.0.1", 0, 4, &bound)
        #expect(listener >= 0)
        defer { close(listener) }
        let remote = try RemotePort.connect(host: "127.0.0.1", port: bound, wireFormat: .foundationSocketPort)
        defer { remote.invalidate() }
        try remote.send(PortEnvelope(id: 0x0102_0304, components: [.bytes([0xAA, 0xBB]), .bytes([])]), timeout: .seconds(5))
        var connection: Int32 = -1
        #expect(eventually {
            connection = cshims_port_accept(listener)
            return connection >= 0
        })
        defer { close(connection) }
        let expected: [UInt8] =
            [0xD0, 0xCF, 0x50, 0xC0, 0, 0, 0, 50, 1, 2, 3, 4]
            + [2, 1, 6, 16, 16, 2, UInt8(bound >> 8), UInt8(bound & 0xff), 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]
            + [0, 0, 0, 1, 0, 0, 0, 2, 0xAA, 0xBB]
            + [0, 0, 0, 1, 0, 0, 0, 0]
        var got: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 256)
        #expect(eventually {
            let n = read(connection, &chunk, chunk.count)
            if n > 0 { got += chunk[0..<n] }
            return got.count >= expected.count
        })
        #expect(got == expected)
    }

    /// Spindle to Spindle in Foundation's format has none of Foundation's
    /// faults: a burst of 200 messages under 12 bytes, an empty message, and
    /// 40 KB and 3 MiB messages arrive whole and in order. What the format
    /// cannot carry is a specific error, with nothing sent.
    @Test(arguments: availableBackends)
    func spindleToSpindleHasNoneOfFoundationsLimits(kind: EventBackendKind) throws {
        let spindle = try SpindleReceiver(backend: kind)
        let remote = try RemotePort.connect(host: "127.0.0.1", port: spindle.port.port, wireFormat: .foundationSocketPort)
        var sent: [Received] = (0..<200).map { Received(id: UInt32($0), parts: [[UInt8($0 & 0xff)]]) }
        sent += [Received(id: 500, parts: []), Received(id: 501, parts: [pattern(40_000, seed: 1)]), Received(id: 502, parts: [pattern(3 << 20, seed: 2)])]
        for m in sent {
            try remote.send(PortEnvelope(id: m.id, components: m.parts.map { .bytes($0) }), timeout: .seconds(10))
        }
        #expect(eventually { spindle.messages.withLock { $0.count } == sent.count })
        #expect(spindle.messages.withLock { $0 } == sent)

        let local = LocalPort { _ in }
        #expect(throws: PortError.unsupportedByFoundationWireFormat("a port component")) {
            try remote.send(PortEnvelope(components: [.bytes([1]), .port(local)]), timeout: .seconds(1))
        }
        #expect(throws: PortError.unsupportedByFoundationWireFormat("a reply port")) {
            try remote.send(PortEnvelope(id: 1, replyPort: local), timeout: .seconds(1))
        }
        let request = #expect(throws: PortError.self) {
            _ = try remote.sendRequest(PortEnvelope(id: 1), timeout: .seconds(1), replyTimeout: .seconds(1))
        }
        if case .unsupportedByFoundationWireFormat = request {} else { Issue.record("a request threw \(String(describing: request))") }
        #expect(throws: PortError.messageTooLarge(byteCount: PortEnvelope.maximumByteCount + 1, limit: PortEnvelope.maximumByteCount)) {
            try remote.send(PortEnvelope(components: [.bytes([UInt8](repeating: 0, count: PortEnvelope.maximumByteCount + 1))]), timeout: .seconds(1))
        }
        // Nothing of those reached the port, and the connection is still good.
        try remote.send(PortEnvelope(id: 600, components: [.bytes([9])]), timeout: .seconds(5))
        #expect(eventually { spindle.messages.withLock { $0.count } == sent.count + 1 })
        #expect(spindle.messages.withLock { $0.last } == Received(id: 600, parts: [[9]]))
        #expect(spindle.port.malformedFrames == 0)
        local.invalidate()
        remote.invalidate()
        try spindle.finish()
    }
}
