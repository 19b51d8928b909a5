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

    /// An invalidation from another thread while the loop's thread
    /// accepts, reads and answers connections closes no socket under it:
    /// each closes as the loop's call on it returns (see the NamedPort
    /// test of the same name). Senders fail only once the port is invalid.
    @Test(arguments: availableBackends)
    func invalidationRacingAcceptsClosesNoSocketUnderTheLoop(kind: EventBackendKind) throws {
        for round in 0..<30 {
            let listener = try Listener(NetworkPort { m in PortEnvelope(id: m.id) }, backend: kind)
            let port = listener.port
            let number = port.port
            let unexpected = try requestsRacingInvalidation(
                connect: { () throws(PortError) in try RemotePort.connect(host: "127.0.0.1", port: number, timeout: .seconds(5)) },
                isValid: { port.isValid },
                invalidate: port.invalidate)
            try listener.finish()
            #expect(unexpected.isEmpty, "round \(round)")
        }
    }

    /// An oversize length, a record that does not add up, and a stream cut
    /// in the middle of a frame each close their own connection only, and
    /// each reaches the drop handler as `.malformed`; a well-behaved sender
    /// on another connection is still served, and its clean close is no
    /// drop.
    @Test func badFramesCloseOnlyTheirConnection() throws {
        let got = LockedValue<[UInt32]>([])
        let drops = LockedValue<[PortError]>([])
        let networkPort = try NetworkPort { m in got.withLock { $0.append(m.id) }; return nil }
        networkPort.onDroppedConnection { error in drops.withLock { $0.append(error) } }
        let listener = try Listener(networkPort)
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
        good.invalidate()
        #expect(eventually { listener.port.connectionCount == 0 })
        let reasons = drops.withLock { $0 }
        #expect(reasons.count == 3, "\(reasons)")
        for reason in reasons {
            guard case .malformed = reason else {
                Issue.record("dropped for \(reason), not as malformed")
                continue
            }
        }
        #expect(reasons.last == .malformed("the stream ended in the middle of a frame"))
        try listener.finish()
    }

    @Test func nothingListeningAndAnAddressInUseAreSpecificErrors() throws {
        let first = try NetworkPort { _ in nil }
        let inUse = #expect(throws: PortError.addressInUse(host: "127.0.0.1", port: first.port)) {
            _ = try NetworkPort(port: first.port) { _ in nil }
        }
        let inUseText = inUse.map { "\($0)" } ?? ""
        #expect(inUseText.contains("127.0.0.1:\(first.port)") && inUseText.contains("EADDRINUSE"), "\(inUseText)")
        #expect(!inUseText.contains("named"), "\(inUseText)")
        let freed = first.port
        first.invalidate()
        #expect(throws: PortError.connectionFailed(host: "127.0.0.1", port: freed, code: ECONNREFUSED)) {
            _ = try RemotePort.connect(host: "127.0.0.1", port: freed)
        }
        #expect(throws: PortError.self) { _ = try NetworkPort(host: "not-an-address") { _ in nil } }
    }

    /// A refused connect names the host, the port and the errno, and says
    /// nothing of named ports.
    @Test func aRefusedConnectNamesHostPortAndErrno() throws {
        // Port 1 (tcpmux) on loopback: nothing listens there on a test machine.
        let refused = #expect(throws: PortError.self) { _ = try RemotePort.connect(host: "127.0.0.1", port: 1) }
        guard let refused else { return }
        #expect(refused == .connectionFailed(host: "127.0.0.1", port: 1, code: ECONNREFUSED))
        let text = "\(refused)"
        #expect(text.contains("127.0.0.1:1"), "\(text)")
        #expect(text.contains("ECONNREFUSED"), "\(text)")
        #expect(text.contains(String(cString: strerror(ECONNREFUSED))), "\(text)")
        #expect(!text.contains("named") && !text.contains("publishes"), "\(text)")
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

// MARK: - Stalled frames

/// The bytes of a one-way Spindle frame with message id `id` and no
/// components: the length, then the 24-byte header (`PortWire`'s layout).
private func oneWayFrame(id: UInt32) -> [UInt8] {
    littleEndian(24) + littleEndian(0x504E_5053) + [0, 0, 0, 0] + littleEndian(id) + littleEndian(0) + [UInt8](repeating: 0, count: 8)
}

/// Waits, up to `deadline`, for the other end to close `fd` (a raw,
/// non-blocking connection), running `meanwhile` between short waits.
/// True once a read finds the end of the stream or a reset.
private func closedByPeer(_ fd: Int32, before deadline: MonotonicClock.Instant, meanwhile: () throws -> Void) rethrows -> Bool {
    while MonotonicClock.now < deadline {
        try meanwhile()
        guard cshims_port_poll(fd, 1, 50_000_000) == 1 else { continue }
        var byte: UInt8 = 0
        let n = read(fd, &byte, 1)
        if n == 0 || (n < 0 && errno == ECONNRESET) { return true }
    }
    return false
}

/// A Spindle request frame with message id `id`, sequence `sequence` and
/// no components.
private func requestFrame(id: UInt32, sequence: UInt64) -> [UInt8] {
    littleEndian(24) + littleEndian(0x504E_5053) + [1, 0, 0, 0] + littleEndian(id) + littleEndian(0)
        + withUnsafeBytes(of: sequence.littleEndian) { Array($0) }
}

/// Reads `count` frames from a raw connection (waiting up to 10 s for
/// each read); returns their message ids, or nil if the stream ended or
/// stalled first.
private func readFrameIDs(_ fd: Int32, count: Int) -> [UInt32]? {
    var buffered: [UInt8] = []
    var ids: [UInt32] = []
    var chunk = [UInt8](repeating: 0, count: 64 << 10)
    while ids.count < count {
        if buffered.count >= 4 {
            let length = Int(buffered.withUnsafeBytes { $0.loadUnaligned(as: UInt32.self) }.littleEndian)
            if buffered.count >= 4 + length, length >= 24 {
                ids.append(buffered.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 12, as: UInt32.self) }.littleEndian)
                buffered.removeFirst(4 + length)
                continue
            }
        }
        guard cshims_port_poll(fd, 1, 10_000_000_000) == 1 else { return nil }
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n > 0 { buffered += chunk[0..<n] } else if n == 0 || errno != EAGAIN { return nil }
    }
    return ids
}

/// Writes all of `bytes` to a raw non-blocking connection, waiting for
/// room (10 s at most per wait); false if the peer closed it or it stayed
/// full. Never raises SIGPIPE.
private func writeFully(_ fd: Int32, _ bytes: ArraySlice<UInt8>) -> Bool {
    var sent = 0
    while sent < bytes.count {
        let rc = bytes.withUnsafeBytes { cshims_port_stream_send(fd, $0.baseAddress! + sent, $0.count - sent) }
        if rc > 0 {
            sent += rc
        } else if rc == -Int(EAGAIN) {
            guard cshims_port_poll(fd, 2, 10_000_000_000) == 1 else { return false }
        } else {
            return false
        }
    }
    return true
}

@Suite("NetworkPort memory under slow senders")
struct NetworkPortMemoryTests {
    /// A frame announcing 8 MiB whose header is garbage is closed as soon
    /// as the header is in, not after 8 MiB (nor the stall limit, off here).
    @Test(arguments: availableBackends)
    func aBadHeaderIsRefusedBeforeTheFrameArrives(kind: EventBackendKind) throws {
        let drops = LockedValue<[PortError]>([])
        let networkPort = try NetworkPort(stallLimit: nil) { _ in nil }
        networkPort.onDroppedConnection { error in drops.withLock { $0.append(error) } }
        let listener = try Listener(networkPort, backend: kind)
        let raw = rawConnection(listener.port.port)
        #expect(raw >= 0)
        #expect(writeAll(raw, littleEndian(8 << 20) + littleEndian(0xDEAD_BEEF) + [UInt8](repeating: 0, count: 20)))
        #expect(closedByPeer(raw, before: MonotonicClock.now + .seconds(10)) {})
        close(raw)
        #expect(eventually { listener.port.malformedFrames == 1 })
        #expect(eventually { drops.withLock { $0 } == [.malformed("bad magic number")] }, "\(drops.withLock { $0 })")
        try listener.finish()
    }

    /// Three slow senders each start a frame of 600 KiB; once they hold
    /// more than the port's 1 MiB limit together, the one holding the most
    /// is closed (`.partialFramesOverLimit`) and the other two finish their
    /// frames, which arrive whole.
    @Test(arguments: availableBackends)
    func partialFramesPastTheLimitDropTheLargestHolder(kind: EventBackendKind) throws {
        let drops = LockedValue<[PortError]>([])
        let got = LockedValue<[UInt32]>([])
        let networkPort = try NetworkPort(stallLimit: nil, partialFrameMemoryLimit: 1 << 20) { m in
            got.withLock { $0.append(m.id) }
            return nil
        }
        #expect(networkPort.partialFrameMemoryLimit == 1 << 20)
        networkPort.onDroppedConnection { error in drops.withLock { $0.append(error) } }
        let listener = try Listener(networkPort, backend: kind)
        let payload = 600 << 10
        // A one-way frame of id `id` with one inline buffer of `payload` bytes.
        func frame(id: UInt32) -> [UInt8] {
            let record = littleEndian(0x504E_5053) + [0, 0, 0, 0] + littleEndian(id) + littleEndian(1) + [UInt8](repeating: 0, count: 8)
                + [0, 0, 0, 0] + littleEndian(UInt32(payload)) + [UInt8](repeating: UInt8(id), count: payload)
            return littleEndian(UInt32(record.count)) + record
        }
        let (a, c, b) = (frame(id: 1), frame(id: 3), frame(id: 2))
        let rawA = rawConnection(listener.port.port), rawB = rawConnection(listener.port.port), rawC = rawConnection(listener.port.port)
        #expect(rawA >= 0 && rawB >= 0 && rawC >= 0)
        #expect(writeFully(rawA, a[0..<(300 << 10)]))
        #expect(eventually { listener.port.partialFrameBytes >= 300 << 10 })
        #expect(writeFully(rawC, c[0..<(300 << 10)]))
        #expect(eventually { listener.port.partialFrameBytes >= 600 << 10 })
        // Past 424 KiB of B's frame the three hold more than 1 MiB, and B
        // holds the most.
        // Its write may fail part way: the port closes it mid-frame.
        _ = writeFully(rawB, b[0..<(580 << 10)])
        #expect(closedByPeer(rawB, before: MonotonicClock.now + .seconds(10)) {})
        close(rawB)
        #expect(eventually { drops.withLock { $0.count } == 1 })
        if case .partialFramesOverLimit(let mine, let total, let limit)? = drops.withLock({ $0.first }) {
            #expect(limit == 1 << 20 && total > limit && mine > 300 << 10)
        } else {
            Issue.record("dropped: \(drops.withLock { $0 })")
        }
        #expect(listener.port.partialFrameBytes <= 1 << 20)
        // A, then C, finish (one at a time: together, part way, they too
        // would pass the limit); each frame arrives whole.
        #expect(writeFully(rawA, a[(300 << 10)...]))
        #expect(eventually { got.withLock { $0 } == [1] })
        #expect(writeFully(rawC, c[(300 << 10)...]))
        #expect(eventually { got.withLock { $0.sorted() } == [1, 3] })
        #expect(drops.withLock { $0.count } == 1, "\(drops.withLock { $0 })")
        close(rawA)
        close(rawC)
        try listener.finish()
    }
}

@Suite("NetworkPort out of descriptors")
struct NetworkPortDescriptorExhaustionTests {
    /// In a child process: with every descriptor taken, a waiting connection
    /// makes `accept` fail with EMFILE; the port does not spin on its
    /// readable listener (a few paced retries, not a busy loop), reports it
    /// once, and accepts the connection once descriptors are free again.
    @Test func outOfDescriptorsTheListenerBacksOffAndRecoversOnEpoll() async {
        await #expect(processExitsWith: .success) {
            exit(acceptOutOfDescriptors(.epoll))
        }
    }

    @Test(.enabled(if: availableBackends.contains(.ioUring), "io_uring is refused here"))
    func outOfDescriptorsTheListenerBacksOffAndRecoversOnIoUring() async {
        await #expect(processExitsWith: .success) {
            exit(acceptOutOfDescriptors(.ioUring))
        }
    }
}

private func acceptOutOfDescriptors(_ kind: EventBackendKind) -> Int32 {
    let reports = LockedValue<[PortError]>([])
    guard let port = try? NetworkPort({ m in PortEnvelope(id: m.id + 1) }), let listener = try? Listener(port, backend: kind) else { return 1 }
    port.onDroppedConnection { error in reports.withLock { $0.append(error) } }
    // Take every descriptor but one, which the client's socket takes.
    var fillers: [Int32] = []
    while true {
        let fd = dup(0)
        if fd < 0 { break }
        fillers.append(fd)
    }
    guard errno == EMFILE, let spare = fillers.popLast() else { return 2 }
    close(spare)
    // TCP completes the handshake without the owner's accept.
    guard let remote = try? RemotePort.connect(host: "127.0.0.1", port: port.port) else { return 3 }
    // A spinning listener would fail accept hundreds of thousands of times
    // meanwhile; the back-off tries a handful (10, 20, 40 ... ms).
    usleep(300_000)
    let failures = port.exhaustedAccepts
    guard failures >= 1 else { return 4 }
    guard failures < 50 else { return 5 }
    guard reports.withLock({ $0 }) == [.system(SystemCallError(call: "accept", code: EMFILE))] else { return 6 }
    guard port.connectionCount == 0 else { return 7 }
    for fd in fillers { close(fd) }
    guard let reply = try? remote.sendRequest(PortEnvelope(id: 4), timeout: .seconds(5), replyTimeout: .seconds(10)), reply.id == 5 else {
        return 8
    }
    guard port.connectionCount == 1, reports.withLock({ $0.count }) == 1 else { return 9 }
    remote.invalidate()
    guard (try? listener.finish()) != nil else { return 10 }
    return 0
}

@Suite("NetworkPort slow requesters")
struct NetworkPortSlowRequesterTests {
    /// A requester that sends 64 requests for 256 KiB replies and never
    /// reads does not hold up the loop: another sender's requests are
    /// answered meanwhile, and once a MiB of replies waits for the
    /// non-reader its connection is closed and reported as
    /// `.replyBacklogExceeded`; the other sender goes on.
    @Test(arguments: availableBackends)
    func aRequesterThatDoesNotReadIsClosedAndHoldsUpNobody(kind: EventBackendKind) throws {
        let drops = LockedValue<[PortError]>([])
        let big = [UInt8](repeating: 0x5A, count: 256 << 10)
        let networkPort = try NetworkPort(replyBacklogLimit: 1 << 20) { m in
            m.id >= 1_000_000 ? PortEnvelope(id: m.id, components: [.bytes(big)]) : PortEnvelope(id: m.id + 1)
        }
        #expect(networkPort.replyBacklogLimit == 1 << 20)
        networkPort.onDroppedConnection { error in drops.withLock { $0.append(error) } }
        let listener = try Listener(networkPort, backend: kind)
        let good = try RemotePort.connect(host: "127.0.0.1", port: listener.port.port)
        var nextID: UInt32 = 0
        func exchange() throws {
            nextID += 2
            let reply = try good.sendRequest(PortEnvelope(id: nextID), timeout: .seconds(5), replyTimeout: .seconds(10))
            #expect(reply.id == nextID + 1)
        }
        try exchange()
        let hog = rawConnection(listener.port.port)
        #expect(hog >= 0)
        let requests = (0..<64).flatMap { requestFrame(id: 1_000_000 + UInt32($0), sequence: UInt64($0 + 1)) }
        #expect(writeAll(hog, requests))
        // Without the queue each blocked reply held the loop for a second,
        // and the connection was dropped for a timed-out send instead.
        let deadline = MonotonicClock.now + .seconds(20)
        while drops.withLock({ $0.isEmpty }) && MonotonicClock.now < deadline {
            try exchange()
            usleep(10_000)
        }
        close(hog)
        #expect(drops.withLock { $0.count } == 1)
        let reasons = drops.withLock { $0 }
        if case .replyBacklogExceeded(let bytes, let limit)? = reasons.first {
            #expect(limit == 1 << 20 && bytes > limit)
        } else {
            Issue.record("dropped for \(reasons)")
        }
        #expect(listener.port.malformedFrames == 0)
        try exchange()
        good.invalidate()
        try listener.finish()
    }

    /// A requester that sends 12 requests for 256 KiB replies at once and
    /// only then reads gets all 3 MiB, in order: what its socket did not
    /// take waited on the connection (under the default 4 MiB limit).
    @Test(arguments: availableBackends)
    func repliesQueuedForASlowReaderAllArriveInOrder(kind: EventBackendKind) throws {
        let big = [UInt8](repeating: 0x33, count: 256 << 10)
        let drops = LockedValue<[PortError]>([])
        let networkPort = try NetworkPort { m in PortEnvelope(id: m.id, components: [.bytes(big)]) }
        networkPort.onDroppedConnection { error in drops.withLock { $0.append(error) } }
        let listener = try Listener(networkPort, backend: kind)
        let slow = rawConnection(listener.port.port)
        #expect(slow >= 0)
        #expect(writeAll(slow, (0..<12).flatMap { requestFrame(id: 500 + UInt32($0), sequence: UInt64($0 + 1)) }))
        usleep(100_000)  // let the replies pile up; the test holds whatever the timing
        #expect(readFrameIDs(slow, count: 12) == (0..<12).map { 500 + UInt32($0) })
        close(slow)
        #expect(drops.withLock { $0 }.isEmpty)
        try listener.finish()
    }
}

@Suite("NetworkPort stalled frames")
struct NetworkPortStallTests {
    /// A sender that announces a 16 MiB frame, sends ten bytes of it and
    /// falls silent is closed once `stallLimit` has passed (not before) and
    /// counted in `stalledFrames`, not `malformedFrames`; a well-behaved
    /// sender exchanges requests before, during and after.
    @Test(arguments: availableBackends)
    func aStalledPartialFrameClosesOnlyItsConnection(kind: EventBackendKind) throws {
        let limit = Duration.milliseconds(200)
        let drops = LockedValue<[PortError]>([])
        let networkPort = try NetworkPort(stallLimit: limit) { m in PortEnvelope(id: m.id + 1) }
        networkPort.onDroppedConnection { error in drops.withLock { $0.append(error) } }
        let listener = try Listener(networkPort, backend: kind)
        #expect(listener.port.stallLimit == limit)
        let good = try RemotePort.connect(host: "127.0.0.1", port: listener.port.port)
        var nextID: UInt32 = 0
        func exchange() throws {
            nextID += 2
            let reply = try good.sendRequest(PortEnvelope(id: nextID), timeout: .seconds(5), replyTimeout: .seconds(10))
            #expect(reply.id == nextID + 1)
        }
        try exchange()

        let stalled = rawConnection(listener.port.port)
        #expect(stalled >= 0)
        let sent = MonotonicClock.now
        #expect(writeAll(stalled, littleEndian(16 << 20) + [UInt8](repeating: 7, count: 10)))
        let closed = try closedByPeer(stalled, before: sent + .seconds(10), meanwhile: exchange)
        #expect(closed)
        #expect(MonotonicClock.now - sent >= limit)
        close(stalled)
        #expect(eventually { listener.port.stalledFrames == 1 && listener.port.connectionCount == 1 })
        #expect(listener.port.malformedFrames == 0)
        // The handler runs on the loop's thread after the count moved and
        // the socket closed, so it may still be on its way here.
        #expect(eventually { drops.withLock { $0 } == [.frameStalled(after: limit)] }, "\(drops.withLock { $0 })")

        try exchange()
        good.invalidate()
        try listener.finish()
    }

    /// Connections that hold no partial frame are never closed for it,
    /// however long they stay silent: one that sent whole frames, one that
    /// sent nothing. Both still work after several limits.
    @Test(arguments: availableBackends)
    func aConnectionIdleBetweenFramesIsKept(kind: EventBackendKind) throws {
        let got = LockedValue<[UInt32]>([])
        let listener = try Listener(
            NetworkPort(stallLimit: .milliseconds(100)) { m in got.withLock { $0.append(m.id) }; return nil }, backend: kind)
        let remote = try RemotePort.connect(host: "127.0.0.1", port: listener.port.port)
        _ = try remote.sendRequest(PortEnvelope(id: 1), timeout: .seconds(5), replyTimeout: .seconds(10))
        let silent = rawConnection(listener.port.port)
        #expect(silent >= 0)
        #expect(eventually { listener.port.connectionCount == 2 })

        usleep(800_000)  // eight limits
        #expect(listener.port.connectionCount == 2)
        #expect(listener.port.stalledFrames == 0)
        _ = try remote.sendRequest(PortEnvelope(id: 2), timeout: .seconds(5), replyTimeout: .seconds(10))
        #expect(writeAll(silent, oneWayFrame(id: 3)))
        #expect(eventually { got.withLock { $0 } == [1, 2, 3] })
        #expect(listener.port.stalledFrames == 0)
        close(silent)
        remote.invalidate()
        try listener.finish()
    }

    /// A sender whose frame trickles in, four bytes at a time, with gaps
    /// well inside the limit, is not closed, though the whole frame takes
    /// longer than the limit: the limit is on silence. The gaps are a
    /// quarter of the limit so that a late wake-up of this thread on a
    /// loaded machine does not make a real stall.
    @Test(arguments: availableBackends)
    func aSlowSenderThatKeepsSendingIsKept(kind: EventBackendKind) throws {
        let limit = Duration.milliseconds(800)
        let got = LockedValue<[UInt32]>([])
        let listener = try Listener(
            NetworkPort(stallLimit: limit) { m in got.withLock { $0.append(m.id) }; return nil }, backend: kind)
        let slow = rawConnection(listener.port.port)
        #expect(slow >= 0)
        let frame = oneWayFrame(id: 9)
        let started = MonotonicClock.now
        for piece in stride(from: 0, to: frame.count, by: 4) {
            if piece > 0 { usleep(200_000) }
            #expect(writeAll(slow, Array(frame[piece..<min(piece + 4, frame.count)])))
        }
        #expect(MonotonicClock.now - started > limit)
        #expect(eventually { got.withLock { $0 } == [9] })
        #expect(listener.port.stalledFrames == 0)
        #expect(listener.port.connectionCount == 1)
        close(slow)
        try listener.finish()
    }

    /// Bytes that reach the kernel while the port's handler keeps the loop
    /// busy past the limit are not silence: the sender whose frame they
    /// complete is kept, though the port read nothing from it for longer
    /// than the limit.
    @Test(arguments: availableBackends)
    func bytesThatCameWhileTheLoopWasBusyAreNotAStall(kind: EventBackendKind) throws {
        let got = LockedValue<[UInt32]>([])
        let listener = try Listener(
            NetworkPort(stallLimit: .milliseconds(200)) { m in
                if m.id == 1 { usleep(1_500_000) }  // busy for over seven limits
                got.withLock { $0.append(m.id) }
                return nil
            }, backend: kind)
        let partial = rawConnection(listener.port.port)
        let frame = oneWayFrame(id: 9)
        #expect(writeAll(partial, Array(frame[..<10])))
        usleep(50_000)
        let busy = try RemotePort.connect(host: "127.0.0.1", port: listener.port.port)
        try busy.send(PortEnvelope(id: 1), timeout: .seconds(5))
        usleep(300_000)
        #expect(writeAll(partial, Array(frame[10...])))
        #expect(eventually { got.withLock { $0 } == [1, 9] })
        #expect(listener.port.stalledFrames == 0)
        close(partial)
        busy.invalidate()
        try listener.finish()
    }

    /// Without a limit, a stalled partial frame is kept.
    @Test func noLimitKeepsAStalledFrame() throws {
        let listener = try Listener(NetworkPort(stallLimit: nil) { _ in nil })
        #expect(listener.port.stallLimit == nil)
        let stalled = rawConnection(listener.port.port)
        #expect(writeAll(stalled, littleEndian(100) + [1, 2, 3]))
        #expect(eventually { listener.port.connectionCount == 1 })
        let closed = closedByPeer(stalled, before: .now + .milliseconds(500), meanwhile: {})
        #expect(!closed)
        #expect(listener.port.connectionCount == 1)
        close(stalled)
        try listener.finish()
    }

    @Test func aLimitOfZeroIsMisuse() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = try? NetworkPort(stallLimit: .zero) { _ in nil }
        }
        let stderr = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("NetworkPort.init: `stallLimit` is 0"))
    }
}

// MARK: - Two hosts on one machine

/// Whether this process may make network namespaces (root, and a sandbox
/// that allows them).
private func canMakeNetworkNamespaces() -> Bool {
    guard geteuid() == 0 else { return false }
    let probe = "spindle-probe-\(getpid())"
    return system("ip netns add \(probe) >/dev/null 2>&1 && ip netns del \(probe) >/dev/null 2>&1") == 0
}

@Suite("NetworkPort across fork")
struct NetworkPortForkTests {
    /// A parent and the child it forked make requests on one inherited TCP
    /// `RemotePort` at the same time: the child connects again on its first
    /// request, and each gets only its own replies.
    @Test func aParentAndItsForkedChildGetOnlyTheirOwnReplies() async {
        await #expect(processExitsWith: .success) {
            exit(tcpRepliesAcrossFork())
        }
    }
}

/// Requests `count` echoes tagged `tag`; true if every reply carried this
/// process's own request back.
private func tcpEchoes(_ remote: RemotePort, tag: String, count: Int) -> Bool {
    for i in 0..<count {
        let sent = Array("\(tag)-\(i)".utf8)
        guard let reply = try? remote.sendRequest(
            PortEnvelope(id: UInt32(i), components: [.bytes(sent)]), timeout: .seconds(5), replyTimeout: .seconds(10)),
            reply.id == UInt32(i), reply.components.first?.bytes == sent
        else { return false }
    }
    return true
}

private func tcpRepliesAcrossFork() -> Int32 {
    // Made here, received by a child of its own: this process starts no
    // thread before it forks, and never accepts on its copy of the listener.
    guard let port = try? NetworkPort({ m in PortEnvelope(id: m.id, components: m.components) }) else { return 1 }
    let go = Step()
    let owner = forkWaiting(for: go) {
        guard let thread = try? LoopThread.start() else { return 20 }
        thread.loop.add(port)
        while true { pause() }
    }
    guard owner > 0 else { return 2 }
    defer {
        kill(owner, SIGKILL)
        var status: Int32 = 0
        _ = waitpid(owner, &status, 0)
    }
    go.signal()
    guard let remote = try? RemotePort.connect(host: "127.0.0.1", port: port.port) else { return 3 }
    guard tcpEchoes(remote, tag: "before", count: 3) else { return 4 }
    let child = fork()
    if child == 0 {
        alarm(60)
        _exit(tcpEchoes(remote, tag: "child", count: 300) ? 0 : 5)
    }
    guard child > 0 else { return 6 }
    let parentOK = tcpEchoes(remote, tag: "parent", count: 300)
    var status: Int32 = 0
    guard waitpid(child, &status, 0) == child else { return 7 }
    guard parentOK else { return 8 }
    guard status == 0 else { return 10 + min((status >> 8) & 0xff, 100) }
    guard tcpEchoes(remote, tag: "after", count: 3) else { return 9 }
    remote.invalidate()
    return 0
}

@Suite("NetworkPort between two hosts")
struct NetworkPortHostsTests {
    /// Two network namespaces joined by a veth pair, a NetworkPort in one
    /// and its sender in the other (each a process of its own): 1,000
    /// messages arrive in order; with the link taken down a request times
    /// out (`.replyTimedOut`) and the sender survives; with the link back up
    /// the same connection carries on and nothing was lost.
    @Test(.enabled(if: canMakeNetworkNamespaces(), "needs root and network namespaces (ip netns)"))
    func twoHostsOverAVethPairWithTheLinkTakenDown() async {
        await #expect(processExitsWith: .success) {
            exit(twoHosts())
        }
    }
}

/// One byte over a pipe, each way: how the processes of the test step together.
private struct Step {
    let readEnd: Int32
    let writeEnd: Int32
    init() {
        var fds: [Int32] = [0, 0]
        _ = pipe(&fds)
        (readEnd, writeEnd) = (fds[0], fds[1])
    }
    func signal() {
        var b: UInt8 = 1
        _ = write(writeEnd, &b, 1)
    }
    func wait() -> Bool {
        var b: UInt8 = 0
        return read(readEnd, &b, 1) == 1
    }
}

/// Forks a child that runs `body` once `go` is signalled; the parent forks
/// before it starts any thread.
private func forkWaiting(for go: Step, _ body: () -> Int32) -> pid_t {
    let child = fork()
    if child == 0 {
        alarm(120)  // a hang fails the test instead of stalling it
        guard go.wait() else { _exit(98) }
        _exit(body())
    }
    return child
}

private func sh(_ command: String) -> Bool { system(command + " >/dev/null 2>&1") == 0 }

private func twoHosts() -> Int32 {
    let tag = getpid() % 100_000
    let (hostA, hostB) = ("spindleA\(tag)", "spindleB\(tag)")
    let (linkA, linkB) = ("spva\(tag)", "spvb\(tag)")
    let serverGo = Step(), serverReady = Step()
    let clientGo = Step(), sent = Step(), linkDown = Step(), timedOut = Step(), linkUp = Step()

    let server = forkWaiting(for: serverGo) {
        guard cshims_port_enter_network_namespace("/var/run/netns/\(hostA)") == 0 else { return 1 }
        let next = LockedValue(0)
        let faults = LockedValue(0)
        guard let port = try? NetworkPort(host: "10.77.0.1", port: 7777, { m in
            if m.id == 2 { return PortEnvelope(id: 2, components: [.bytes(withUnsafeBytes(of: UInt32(next.withLock { $0 })) { Array($0) })]) }
            let i = Int(m.components[0].bytes!.withUnsafeBytes { $0.loadUnaligned(as: UInt32.self) })
            next.withLock {
                if $0 != i { faults.withLock { $0 += 1 } }
                $0 = i + 1
            }
            return nil
        }), let thread = try? LoopThread.start() else { return 2 }
        thread.loop.add(port)
        serverReady.signal()
        while true { pause() }
    }
    let client = forkWaiting(for: clientGo) {
        guard cshims_port_enter_network_namespace("/var/run/netns/\(hostB)") == 0 else { return 1 }
        guard let remote = try? RemotePort.connect(host: "10.77.0.1", port: 7777, timeout: .seconds(10)) else { return 2 }
        for i in 0..<1_000 {
            let m = PortEnvelope(id: 1, components: [.bytes(withUnsafeBytes(of: UInt32(i)) { Array($0) })])
            guard (try? remote.send(m, timeout: .seconds(10))) != nil else { return 3 }
        }
        func handled() -> UInt32? {
            guard let reply = try? remote.sendRequest(PortEnvelope(id: 2), timeout: .seconds(10), replyTimeout: .seconds(20)) else { return nil }
            return reply.components.first?.bytes?.withUnsafeBytes { $0.loadUnaligned(as: UInt32.self) }
        }
        guard handled() == 1_000 else { return 4 }
        sent.signal()
        guard linkDown.wait() else { return 5 }
        do throws(PortError) {
            _ = try remote.sendRequest(PortEnvelope(id: 2), timeout: .seconds(1), replyTimeout: .milliseconds(500))
            return 6
        } catch {
            guard case .replyTimedOut = error else { return 7 }
        }
        timedOut.signal()
        guard linkUp.wait() else { return 8 }
        // The same connection carries on once the link is back.
        guard handled() == 1_000 else { return 9 }
        return 0
    }
    guard server > 0, client > 0 else { return 20 }

    var clientReaped = false
    defer {
        kill(server, SIGKILL)
        var status: Int32 = 0
        waitpid(server, &status, 0)
        if !clientReaped {
            kill(client, SIGKILL)
            waitpid(client, &status, 0)
        }
        _ = sh("ip netns del \(hostA)")
        _ = sh("ip netns del \(hostB)")
    }
    guard sh("ip netns add \(hostA)"), sh("ip netns add \(hostB)"),
        sh("ip link add \(linkA) type veth peer name \(linkB)"),
        sh("ip link set \(linkA) netns \(hostA)"), sh("ip link set \(linkB) netns \(hostB)"),
        sh("ip -n \(hostA) addr add 10.77.0.1/24 dev \(linkA)"), sh("ip -n \(hostB) addr add 10.77.0.2/24 dev \(linkB)"),
        sh("ip -n \(hostA) link set lo up"), sh("ip -n \(hostB) link set lo up"),
        sh("ip -n \(hostA) link set \(linkA) up"), sh("ip -n \(hostB) link set \(linkB) up")
    else { return 21 }
    serverGo.signal()
    guard serverReady.wait() else { return 22 }
    clientGo.signal()
    guard sent.wait() else { return 23 }
    guard sh("ip -n \(hostB) link set \(linkB) down") else { return 24 }
    linkDown.signal()
    guard timedOut.wait() else { return 25 }
    guard sh("ip -n \(hostB) link set \(linkB) up") else { return 26 }
    linkUp.signal()
    var status: Int32 = 0
    guard waitpid(client, &status, 0) == client else { return 27 }
    clientReaped = true
    let code = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
    return code == 0 ? 0 : 30 + code
}

// MARK: - Large frames, in pieces and interleaved

/// A one-way Spindle frame with message id `id` whose components are
/// `components`, every byte inline.
private func oneWayFrame(id: UInt32, components: [[UInt8]]) -> [UInt8] {
    var record = littleEndian(0x504E_5053) + [0, 0, 0, 0] + littleEndian(id) + littleEndian(UInt32(components.count))
        + [UInt8](repeating: 0, count: 8)
    for c in components { record += [0, 0, 0, 0] + littleEndian(UInt32(c.count)) }
    for c in components { record += c }
    return littleEndian(UInt32(record.count)) + record
}

/// `count` bytes that differ with `seed` and with their position.
private func largeFrameBytes(_ count: Int, seed: UInt8) -> [UInt8] {
    (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 8) ^ seed }
}

@Suite("NetworkPort large frames")
struct NetworkPortLargeFrameTests {
    /// Two raw senders cut their frames into pieces and take turns: one
    /// writes its frames' first 300 bytes one byte at a time (the header
    /// and component table arrive byte by byte, and the start of the
    /// buffers read straight into), the rest in pieces of 1 to 5,000
    /// bytes; the other writes whole frames between those pieces.
    /// Meanwhile a `RemotePort` sends messages of 64 KiB to 3 MiB (several
    /// components, some empty), and small ones. Every message arrives
    /// whole, in its connection's order, with its bytes.
    @Test(arguments: availableBackends)
    func framesInPiecesAndLargeFramesInterleaveBetweenConnections(kind: EventBackendKind) throws {
        let got = LockedValue<[UInt32: [[[UInt8]]]]>([:])
        let listener = try Listener(
            NetworkPort(stallLimit: nil) { m in
                let buffers = m.components.map { c -> [UInt8] in
                    if case .bytes(let b) = c { return b }
                    return []
                }
                // The id's high byte names the sender.
                got.withLock { $0[m.id >> 24, default: []].append(buffers) }
                return m.id & 0xFF == 0xFF ? PortEnvelope(id: m.id) : nil
            }, backend: kind)
        // Sender 1 (raw, in pieces) and sender 2 (raw, whole frames).
        let slowMessages: [[[UInt8]]] = [
            [largeFrameBytes(100 << 10, seed: 1)],
            [[], largeFrameBytes(40 << 10, seed: 2), [7], [], largeFrameBytes(70 << 10, seed: 3)],
            [largeFrameBytes(20, seed: 4)],
            [largeFrameBytes(1 << 20, seed: 5), largeFrameBytes(3, seed: 6)],
        ]
        let wholeMessages: [[[UInt8]]] = (0..<8).map { i in [largeFrameBytes((i + 1) * (48 << 10) + i, seed: UInt8(16 + i))] }
        let slow = rawConnection(listener.port.port), whole = rawConnection(listener.port.port)
        #expect(slow >= 0 && whole >= 0)
        var slowBytes: [UInt8] = []
        for (i, m) in slowMessages.enumerated() { slowBytes += oneWayFrame(id: 1 << 24 | UInt32(i), components: m) }
        let wholeFrames = wholeMessages.enumerated().map { oneWayFrame(id: 2 << 24 | UInt32($0.offset), components: $0.element) }
        // Sender 3: a RemotePort on a thread of its own.
        let remoteMessages: [[[UInt8]]] = [
            [largeFrameBytes(64 << 10, seed: 40)],
            [largeFrameBytes(5, seed: 41)],
            [largeFrameBytes(3 << 20, seed: 42), [], largeFrameBytes(1, seed: 43)],
            [largeFrameBytes(256 << 10, seed: 44), largeFrameBytes(256 << 10, seed: 45)],
            [largeFrameBytes(16 << 10, seed: 46)],
        ]
        let port = listener.port.port
        let remoteDone = LockedValue<Result<Void, PortError>?>(nil)
        let joinRemote = startThread {
            let result: Result<Void, PortError>
            do throws(PortError) {
                let remote = try RemotePort.connect(host: "127.0.0.1", port: port)
                for (i, m) in remoteMessages.enumerated() {
                    try remote.send(PortEnvelope(id: 3 << 24 | UInt32(i), components: m.map { .bytes($0) }), timeout: .seconds(30))
                }
                // A request whose reply needs a read of a large frame's
                // neighbours first: every message before it was handled.
                _ = try remote.sendRequest(PortEnvelope(id: 3 << 24 | 0xFF), timeout: .seconds(30), replyTimeout: .seconds(30))
                result = .success(())
            } catch {
                result = .failure(error)
            }
            remoteDone.withLock { $0 = result }
        }
        // Interleave: pieces of the slow stream, a whole frame now and then.
        var generator = SystemRandomNumberGenerator()
        var offset = 0
        var nextWhole = 0
        var pieces = 0
        while offset < slowBytes.count {
            // The first 300 bytes of each frame one at a time; here, simply
            // the first 300 of the stream and of every 64 KiB after.
            let piece = offset % (64 << 10) < 300 ? 1 : Int.random(in: 1...5_000, using: &generator)
            let end = min(slowBytes.count, offset + piece)
            #expect(writeFully(slow, slowBytes[offset..<end]))
            offset = end
            pieces += 1
            if pieces % 60 == 0 && nextWhole < wholeFrames.count {
                #expect(writeFully(whole, wholeFrames[nextWhole][...]))
                nextWhole += 1
            }
        }
        while nextWhole < wholeFrames.count {
            #expect(writeFully(whole, wholeFrames[nextWhole][...]))
            nextWhole += 1
        }
        #expect(eventually { remoteDone.withLock { $0 } != nil })
        joinRemote()
        if case .failure(let error)? = remoteDone.withLock({ $0 }) { Issue.record("the RemotePort sender failed: \(error)") }
        #expect(eventually { got.withLock { ($0[1]?.count ?? 0, $0[2]?.count ?? 0) } == (slowMessages.count, wholeMessages.count) })
        let received = got.withLock { $0 }
        #expect(received[1] == slowMessages)
        #expect(received[2] == wholeMessages)
        #expect(received[3].map { Array($0.dropLast()) } == remoteMessages)
        #expect(received[3]?.last == [])
        #expect(listener.port.malformedFrames == 0)
        #expect(listener.port.partialFrameBytes == 0)
        close(slow)
        close(whole)
        try listener.finish()
    }

    /// A receiver that stops reading: the sender's socket fills, its writes
    /// go in part and then wait (EAGAIN) for room, part way through a
    /// message's buffers; once the receiver reads again, every message
    /// arrives whole and in order. 24 messages of 1 MiB and a bit, with
    /// two buffers each, are more than loopback's socket buffers hold.
    @Test(arguments: availableBackends)
    func partialWritesThatWaitForRoomDeliverWholeMessages(kind: EventBackendKind) throws {
        let gate = Semaphore(value: 0)
        let got = LockedValue<[(UInt32, [UInt8], [UInt8])]>([])
        let listener = try Listener(
            NetworkPort(stallLimit: nil) { m in
                if m.id == 0 { gate.wait() }  // holds up the port's loop: nothing is read
                if case .bytes(let a)? = m.components.first, case .bytes(let b)? = m.components.last {
                    got.withLock { $0.append((m.id, a, b)) }
                }
                return nil
            }, backend: kind)
        let remote = try RemotePort.connect(host: "127.0.0.1", port: listener.port.port)
        let messages = (0..<24).map { i in (largeFrameBytes((1 << 20) + i * 4_099, seed: UInt8(i)), largeFrameBytes(33 << 10, seed: UInt8(100 + i))) }
        let sent = LockedValue(0)
        let failure = LockedValue<PortError?>(nil)
        let joinSender = startThread {
            for (i, m) in messages.enumerated() {
                do throws(PortError) {
                    try remote.send(PortEnvelope(id: UInt32(i), components: [.bytes(m.0), .bytes(m.1)]), timeout: .seconds(60))
                } catch {
                    failure.withLock { $0 = error }
                    return
                }
                sent.withLock { $0 += 1 }
            }
        }
        // The first message is taken whole (its handler then holds up the
        // loop); the rest fill the socket buffers and wait for room.
        #expect(eventually { sent.withLock { $0 } >= 1 })
        _ = gate.signal()
        #expect(eventually { got.withLock { $0.count } == messages.count })
        joinSender()
        #expect(failure.withLock { $0 } == nil)
        let received = got.withLock { $0 }
        #expect(received.map(\.0) == (0..<UInt32(messages.count)).map { $0 })
        #expect(received.map(\.1) == messages.map(\.0))
        #expect(received.map(\.2) == messages.map(\.1))
        try listener.finish()
    }
}
