import CShims
import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// A port name no other test (or earlier run) uses.
private func uniqueName(_ what: String) -> String {
    "test.\(getpid()).\(what).\(UInt32.random(in: 0...UInt32.max))"
}

private func bytes(_ s: String) -> PortEnvelope.Component { .bytes(Array(s.utf8)) }

private func text(_ m: PortEnvelope, _ i: Int = 0) -> String {
    guard i < m.components.count else { return "" }
    return String(decoding: m.components[i].bytes ?? [], as: UTF8.self)
}

/// A loop thread that receives on a `NamedPort`; stopped and joined by `finish`.
private final class Owner: Sendable {
    let thread: LoopThread
    let port: NamedPort
    init(_ port: NamedPort, backend: EventBackendKind? = nil) throws {
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

/// The exit status of child `pid`: its code, or 128 + the signal that ended it.
private func waitFor(_ pid: pid_t) -> Int32 {
    var status: Int32 = 0
    guard waitpid(pid, &status, 0) == pid else { return 255 }
    let signal = status & 0x7f
    return signal == 0 ? (status >> 8) & 0xff : 128 + signal
}

@Suite("NamedPort")
struct NamedPortTests {
    // MARK: In one process (the API; the names are real abstract sockets)

    @Test(arguments: availableBackends)
    func lookupSendAndRequestReply(kind: EventBackendKind) throws {
        let name = uniqueName("basic")
        let got = LockedValue<[String]>([])
        let owner = try Owner(
            NamedPort(name: name) { m in
                got.withLock { $0.append("\(m.id):\(text(m))") }
                return m.id == 2 ? PortEnvelope(id: 20, components: [bytes(text(m).uppercased())]) : nil
            }, backend: kind)
        let remote = try RemotePort.lookup(name)
        #expect(remote.name == name)
        try remote.send(PortEnvelope(id: 1, components: [bytes("one-way")]), timeout: .seconds(1))
        let reply = try remote.sendRequest(PortEnvelope(id: 2, components: [bytes("ask")]), timeout: .seconds(1), replyTimeout: .seconds(5))
        #expect(reply.id == 20)
        #expect(text(reply) == "ASK")
        // A handler that returns nil still answers a request: empty, same id.
        let empty = try remote.sendRequest(PortEnvelope(id: 3), timeout: .seconds(1), replyTimeout: .seconds(5))
        #expect(empty.id == 3 && empty.components.isEmpty)
        #expect(got.withLock { $0 } == ["1:one-way", "2:ask", "3:"])
        #expect(owner.port.connectionCount == 1)
        try owner.finish()
    }

    /// An owner that never accepts fills its listener's backlog; lookups
    /// past it wait in `connect` for room, and still give up at their
    /// timeout with `.timedOut` instead of blocking for good.
    @Test func lookupsOfAnOwnerThatNeverAcceptsTimeOut() throws {
        let name = uniqueName("backlog")
        let port = try NamedPort(name: name) { _ in nil }  // in no loop: nothing accepts
        let outcomes = LockedValue<[String]>([])
        let finished = Latch()
        // Past the 128 the listener's backlog holds.
        let lookups = 160
        let join = startThread {
            for _ in 0..<lookups {
                do throws(PortError) {
                    let remote = try RemotePort.lookup(name, timeout: .milliseconds(10))
                    remote.invalidate()
                    outcomes.withLock { $0.append("connected") }
                } catch {
                    if case .timedOut = error { outcomes.withLock { $0.append("timed out") } } else {
                        outcomes.withLock { $0.append("\(error)") }
                    }
                }
            }
            finished.countDown()
        }
        // A blocked connect would keep the thread for good: 160 × 10 ms is
        // what it should take; a minute is the give-up, after which closing
        // the name wakes a blocked connect (ECONNREFUSED).
        #expect(finished.wait(seconds: 60), "lookups blocked past their timeout")
        port.invalidate()
        join()
        #expect(outcomes.withLock { $0 } == Array(repeating: "timed out", count: lookups))
    }

    @Test func aTakenNameThrowsNameTaken() throws {
        let name = uniqueName("taken")
        let first = try NamedPort(name: name) { _ in nil }
        // The probe finds the owner: this process, as this user.
        let owner = PortOwner(uid: UInt32(geteuid()), pid: Int32(getpid()))
        let taken = #expect(throws: PortError.nameTaken(name, owner: owner)) { _ = try NamedPort(name: name) { _ in nil } }
        let text = taken.map { "\($0)" } ?? ""
        #expect(text.contains("\"\(name)\"") && text.contains("user \(getuid())") && text.contains("process \(getpid())"), "\(text)")
        #expect(!text.contains("network"), "\(text)")
        first.invalidate()
        // Invalidation gives the name back at once.
        let second = try NamedPort(name: name) { _ in nil }
        second.invalidate()
    }

    /// The probe that finds a taken name's owner is no dropped connection
    /// to that owner: it closed its own end.
    @Test(arguments: availableBackends)
    func theOwnerProbeIsNotReportedAsADrop(kind: EventBackendKind) throws {
        let name = uniqueName("probed")
        let port = try NamedPort(name: name) { m in PortEnvelope(id: m.id + 1) }
        let drops = LockedValue<[PortError]>([])
        port.onDroppedConnection { error in drops.withLock { $0.append(error) } }
        let owner = try Owner(port, backend: kind)
        for _ in 0..<20 {
            #expect(throws: PortError.self) { _ = try NamedPort(name: name) { _ in nil } }
        }
        // Accepted in order: once a later connection has had its reply,
        // every probe was accepted and greeted (or found closed) before it.
        let remote = try RemotePort.lookup(name)
        #expect(try remote.sendRequest(PortEnvelope(id: 1), timeout: .seconds(5), replyTimeout: .seconds(30)).id == 2)
        remote.invalidate()
        #expect(drops.withLock { $0 } == [])
        #expect(port.refusedConnections == 0)
        try owner.finish()
    }

    /// When the probe cannot connect (the owner's backlog is full: it is on
    /// no loop, so it accepts nothing), the name is still reported taken,
    /// with its owner unknown.
    @Test func aTakenNameWhoseOwnerCannotBeProbedSaysUnknown() throws {
        let name = uniqueName("taken-full")
        let first = try NamedPort(name: name) { _ in nil }
        let address = Array("spindle.\(geteuid()).\(name)".utf8)
        var queued: [Int32] = []
        defer {
            for fd in queued { _ = cshims_port_close(fd) }
            first.invalidate()
        }
        // Fill the backlog (128, or less if net.core.somaxconn says so).
        while queued.count < 10_000 {
            let fd = address.withUnsafeBufferPointer { cshims_port_connect($0.baseAddress, $0.count, 0) }
            if fd < 0 {
                #expect(-fd == EAGAIN, "connect failed with \(-fd) after \(queued.count) connections")
                break
            }
            queued.append(fd)
        }
        let taken = #expect(throws: PortError.nameTaken(name, owner: nil)) { _ = try NamedPort(name: name) { _ in nil } }
        let text = taken.map { "\($0)" } ?? ""
        #expect(text.contains("\"\(name)\"") && text.contains("unknown"), "\(text)")
    }

    @Test func anUnknownNameThrowsNameNotFound() {
        let name = uniqueName("nobody-here")
        let missing = #expect(throws: PortError.nameNotFound(name)) { _ = try RemotePort.lookup(name) }
        let text = missing.map { "\($0)" } ?? ""
        #expect(text.contains("\"\(name)\""), "\(text)")
        #expect(!text.contains("network") && !text.contains("refused") && !text.contains(":"), "\(text)")
    }

    /// Invalidating the owner's port: its name is gone (lookups fail) and
    /// connected senders learn it (`.peerGone`); observers run once.
    @Test(arguments: availableBackends)
    func invalidationFreesTheNameAndSendersLearnIt(kind: EventBackendKind) throws {
        let name = uniqueName("invalidate")
        let owner = try Owner(NamedPort(name: name) { _ in nil }, backend: kind)
        let told = LockedValue(0)
        owner.port.onInvalidation { _ in told.withLock { $0 += 1 } }
        let remote = try RemotePort.lookup(name)
        try remote.send(PortEnvelope(id: 1), timeout: .seconds(1))
        owner.port.invalidate()
        #expect(told.withLock { $0 } == 1)
        #expect(throws: PortError.nameNotFound(name)) { _ = try RemotePort.lookup(name) }
        #expect(throws: PortError.peerGone) { try remote.send(PortEnvelope(id: 2), timeout: .seconds(1)) }
        #expect(throws: PortError.peerGone) {
            _ = try remote.sendRequest(PortEnvelope(id: 3), timeout: .seconds(1), replyTimeout: .seconds(1))
        }
        remote.invalidate()
        #expect(throws: PortError.invalidated) { try remote.send(PortEnvelope(id: 4), timeout: .seconds(1)) }
        try owner.finish()
        #expect(told.withLock { $0 } == 1)
    }

    /// An invalidation from another thread while the loop's thread accepts,
    /// greets and answers connections closes no socket under it: each
    /// closes as the loop's call on it returns. (One closed between a
    /// connection's adoption and its greeting stopped the process: the
    /// greeting's `sendmsg` found the descriptor gone, or wrote into
    /// whatever file had taken its number.) Senders meet only the errors
    /// of an invalidated port, and only once it is invalid.
    @Test(arguments: availableBackends)
    func invalidationRacingAcceptsClosesNoSocketUnderTheLoop(kind: EventBackendKind) throws {
        for round in 0..<30 {
            let name = uniqueName("invalidate-race-\(round)")
            let owner = try Owner(NamedPort(name: name) { m in PortEnvelope(id: m.id) }, backend: kind)
            let port = owner.port
            let unexpected = try requestsRacingInvalidation(
                connect: { () throws(PortError) in try RemotePort.lookup(name, timeout: .seconds(5)) },
                isValid: { port.isValid },
                expectedOnceInvalid: { $0 == .nameNotFound(name) || $0 == .peerGone },
                invalidate: port.invalidate)
            try owner.finish()
            #expect(unexpected.isEmpty, "round \(round)")
        }
    }

    /// The receiving loop's thread exiting invalidates the port.
    @Test func theLoopThreadsExitInvalidatesThePort() throws {
        let name = uniqueName("loop-death")
        let owner = try Owner(NamedPort(name: name) { _ in nil })
        owner.thread.stop()
        try owner.thread.join()
        #expect(!owner.port.isValid)
        let missing = #expect(throws: PortError.nameNotFound(name)) { _ = try RemotePort.lookup(name) }
        let text = missing.map { "\($0)" } ?? ""
        #expect(text.contains("\"\(name)\""), "\(text)")
        #expect(!text.contains("network") && !text.contains("refused") && !text.contains(":"), "\(text)")
    }

    /// A message's `.remotePort` component arrives as a port the receiver
    /// can send on (here in one process, so a send right made from an
    /// unpublished port).
    @Test(arguments: availableBackends)
    func aSendRightInAMessageIsAUsablePort(kind: EventBackendKind) throws {
        let name = uniqueName("rights")
        let server = try Owner(
            NamedPort(name: name) { m in
                guard let back = m.components.last?.remotePort else { return nil }
                try? back.send(PortEnvelope(id: m.id + 1, components: [m.components[0]]), timeout: .seconds(1))
                back.invalidate()
                return nil
            }, backend: kind)
        let answers = LockedValue<[String]>([])
        let client = try Owner(NamedPort { m in answers.withLock { $0.append("\(m.id):\(text(m))") }; return nil }, backend: kind)
        let right = try client.port.makeSendRight()
        let remote = try RemotePort.lookup(name)
        try remote.send(PortEnvelope(id: 7, components: [bytes("via right"), .remotePort(right)]), timeout: .seconds(1))
        right.invalidate()
        let deadline = MonotonicClock.now.advanced(by: .seconds(10))
        while answers.withLock({ $0.isEmpty }) && MonotonicClock.now < deadline { usleep(1_000) }
        #expect(answers.withLock { $0 } == ["8:via right"])
        try server.finish()
        try client.finish()
    }

    /// Bytes above the inline budget travel in a sealed memfd; up to the
    /// limit they arrive intact, above it the send is refused.
    @Test func largeMessagesArriveIntactAndOversizeIsRefused() throws {
        let name = uniqueName("large")
        let sizes = LockedValue<[Int]>([])
        let sums = LockedValue<[UInt64]>([])
        let owner = try Owner(
            NamedPort(name: name) { m in
                sizes.withLock { $0.append(m.byteCount) }
                // Summed through buffer pointers: a generic reduce over the
                // joined 3 MiB took seconds in a debug build under
                // ThreadSanitizer, past the reply timeout.
                var sum: UInt64 = 0
                for bytes in m.components.compactMap(\.bytes) {
                    bytes.withUnsafeBufferPointer { for byte in $0 { sum &+= UInt64(byte) } }
                }
                sums.withLock { $0.append(sum) }
                return PortEnvelope(id: m.id)
            })
        let remote = try RemotePort.lookup(name)
        let big = [UInt8]((0..<(3 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        let small = [UInt8](repeating: 1, count: 100)
        let expectedSum = big.reduce(0) { $0 &+ UInt64($1) } &+ 100
        _ = try remote.sendRequest(PortEnvelope(id: 1, components: [.bytes(small), .bytes(big)]), timeout: .seconds(5), replyTimeout: .seconds(10))
        #expect(sizes.withLock { $0 } == [big.count + 100])
        #expect(sums.withLock { $0 } == [expectedSum])
        let tooBig = PortEnvelope(components: [.bytes([UInt8](repeating: 0, count: PortEnvelope.maximumByteCount + 1))])
        #expect(throws: PortError.messageTooLarge(byteCount: PortEnvelope.maximumByteCount + 1, limit: PortEnvelope.maximumByteCount)) {
            try remote.send(tooBig, timeout: .seconds(1))
        }
        try owner.finish()
    }

    /// Buffers of 16 KiB and more go through the sending process's
    /// shared-memory ring: every byte arrives, in order, the ring wraps
    /// around (22 MiB through a 4 MiB ring), one buffer over the ring's
    /// limit and small buffers go as before (inline, and in memfds past a
    /// record's 64 KiB), and a
    /// burst of one-way sends that fills the ring falls back to memfds
    /// without losing or reordering anything.
    @Test(arguments: availableBackends)
    func largeBuffersGoThroughTheSendersRingInOrder(kind: EventBackendKind) throws {
        let name = uniqueName("ring")
        let got = LockedValue<[(id: UInt32, sizes: [Int], hash: UInt64)]>([])
        let owner = try Owner(
            NamedPort(name: name) { m in
                let sizes = m.components.compactMap(\.bytes).map(\.count)
                got.withLock { $0.append((m.id, sizes, ringTestHash(m))) }
                return PortEnvelope(id: m.id)
            }, backend: kind)
        let remote = try RemotePort.lookup(name)
        let plan: [[Int]] = [
            [70 << 10], [300 << 10, 10], [1 << 20], [2 << 20], [(2 << 20) + 1], [900 << 10, 900 << 10],
            [1 << 20], [2 << 20], [Array(repeating: 4 << 10, count: 24)].flatMap { $0 }, [2 << 20], [1_500 << 10],
            [2 << 20], [2 << 20], [2 << 20], [700 << 10], [2 << 20], [20 << 10, 100, 16 << 10], [(16 << 10) - 1],
        ]
        var sent: [(id: UInt32, sizes: [Int], hash: UInt64)] = []
        for (i, sizes) in plan.enumerated() {
            let message = ringTestMessage(id: UInt32(i + 1), sizes: sizes)
            sent.append((message.id, sizes, ringTestHash(message)))
            // A request each: the owner has taken one before the next is placed.
            _ = try remote.sendRequest(message, timeout: .seconds(5), replyTimeout: .seconds(10))
        }
        #expect(got.withLock { $0.map(\.id) } == sent.map(\.id))
        #expect(got.withLock { $0.map(\.sizes) } == sent.map(\.sizes))
        #expect(got.withLock { $0.map(\.hash) } == sent.map(\.hash))
        // Every buffer from 16 KiB to 2 MiB; not the small ones (inline, or
        // in memfds once 64 KiB are inline) nor the one over the limit (a memfd).
        let ringed = plan.flatMap { $0 }.filter { $0 >= 16 << 10 && $0 <= 2 << 20 }.count
        #expect(owner.port.sharedMemoryBuffers == ringed)

        // One-way, back to back: the ring fills and some go in memfds.
        got.withLock { $0.removeAll() }
        sent.removeAll()
        for i in 0..<24 {
            let message = ringTestMessage(id: UInt32(100 + i), sizes: [(i % 3 + 1) * (400 << 10)])
            sent.append((message.id, [message.byteCount], ringTestHash(message)))
            try remote.send(message, timeout: .seconds(10))
        }
        _ = try remote.sendRequest(PortEnvelope(id: 999), timeout: .seconds(5), replyTimeout: .seconds(30))
        let burst = got.withLock { $0.filter { $0.id != 999 } }
        #expect(burst.map(\.id) == sent.map(\.id))
        #expect(burst.map(\.hash) == sent.map(\.hash))
        #expect(owner.port.malformedMessages == 0)
        remote.invalidate()
        try owner.finish()
    }

    /// Replies with large buffers come back through a ring the owner makes
    /// for the connection: every byte, through wrap-around (14 MiB through
    /// 4 MiB), on both backends, and the requester counts them.
    @Test(arguments: availableBackends)
    func largeRepliesComeBackThroughTheConnectionsRing(kind: EventBackendKind) throws {
        let name = uniqueName("replyring")
        let sizes: [[Int]] = [[20 << 10], [300 << 10, 5], [1 << 20], [2 << 20], [(2 << 20) + 1], [1 << 20, 700 << 10]]
        let owner = try Owner(
            NamedPort(name: name) { m in ringTestMessage(id: m.id, sizes: sizes[Int(m.id) % sizes.count]) }, backend: kind)
        let remote = try RemotePort.lookup(name)
        var expected = 0
        for id in 0..<UInt32(12) {
            let reply = try remote.sendRequest(PortEnvelope(id: id), timeout: .seconds(5), replyTimeout: .seconds(10))
            let want = ringTestMessage(id: id, sizes: sizes[Int(id) % sizes.count])
            #expect(reply.id == id)
            #expect(reply.components.compactMap(\.bytes).map(\.count) == sizes[Int(id) % sizes.count])
            #expect(ringTestHash(reply) == ringTestHash(want))
            expected += sizes[Int(id) % sizes.count].filter { $0 >= 16 << 10 && $0 <= 2 << 20 }.count
        }
        #expect(remote.sharedMemoryReplyBuffers == expected)
        #expect(owner.port.malformedMessages == 0)
        remote.invalidate()
        try owner.finish()
    }

    /// A sender cannot make the owner read outside a ring or trust one that
    /// could shrink: a buffer in a ring never introduced, a ring whose memfd
    /// is not sealed, and one introduced twice each close that connection
    /// as malformed, and only it.
    @Test func aForgedRingClosesOnlyItsConnection() throws {
        let name = uniqueName("forged")
        let drops = LockedValue<[PortError]>([])
        let namedPort = try NamedPort(name: name) { m in PortEnvelope(id: m.id) }
        namedPort.onDroppedConnection { error in drops.withLock { $0.append(error) } }
        let owner = try Owner(namedPort)
        let good = try RemotePort.lookup(name)

        func connectRaw() -> Int32 {
            let address = Array("spindle.\(geteuid()).\(name)".utf8)
            let raw = address.withUnsafeBufferPointer { cshims_port_connect($0.baseAddress, $0.count, -1) }
            var greeting = [UInt8](repeating: 0, count: 64)
            guard raw >= 0, cshims_port_poll(raw, 1, 5_000_000_000) == 1, read(raw, &greeting, 64) == 24 else { return -1 }
            return raw
        }
        func header(kind: UInt8, components: UInt32, sequence: UInt64) -> [UInt8] {
            var bytes: [UInt8] = []
            withUnsafeBytes(of: UInt32(0x504E_5053).littleEndian) { bytes += $0 }
            bytes += [kind, 0, 0, 0]
            withUnsafeBytes(of: UInt32(7).littleEndian) { bytes += $0 }
            withUnsafeBytes(of: components.littleEndian) { bytes += $0 }
            withUnsafeBytes(of: sequence.littleEndian) { bytes += $0 }
            return bytes
        }
        func closedByOwner(_ raw: Int32) -> Bool {
            var b = [UInt8](repeating: 0, count: 64)
            return cshims_port_poll(raw, 1, 5_000_000_000) == 1 && read(raw, &b, 64) == 0
        }
        func send(_ raw: Int32, _ bytes: [UInt8], fds: [Int32] = []) -> Bool {
            bytes.withUnsafeBytes { b in fds.withUnsafeBufferPointer { f in
                cshims_port_send(raw, b.baseAddress, b.count, f.baseAddress, Int32(f.count)) == b.count
            } }
        }

        // 1. A one-way message whose buffer is in ring 42, never introduced.
        let unknown = connectRaw()
        #expect(unknown >= 0)
        var record = header(kind: 0, components: 1, sequence: 0) + [3, 0, 0, 0]
        withUnsafeBytes(of: UInt32(100_000).littleEndian) { record += $0 }
        withUnsafeBytes(of: UInt64(42).littleEndian) { record += $0 }
        withUnsafeBytes(of: UInt64(0).littleEndian) { record += $0 }
        #expect(send(unknown, record))
        #expect(closedByOwner(unknown))
        close(unknown)

        // 2. A ring in a file that carries no seals (it could shrink under
        //    the owner's mapping).
        let unsealed = connectRaw()
        #expect(unsealed >= 0)
        var template = Array("/tmp/spindle-forged-ring-XXXXXX".utf8CString)
        let memfd = template.withUnsafeMutableBufferPointer { mkstemp($0.baseAddress!) }
        #expect(memfd >= 0)
        template.withUnsafeBufferPointer { _ = unlink($0.baseAddress!) }
        #expect(ftruncate(memfd, off_t(4096 + (4 << 20))) == 0)
        #expect(send(unsealed, header(kind: 5, components: 0, sequence: 9), fds: [memfd]))
        #expect(closedByOwner(unsealed))
        close(unsealed)
        close(memfd)

        // 3. A well-made ring introduced twice under one id.
        let twice = connectRaw()
        #expect(twice >= 0)
        var map: UnsafeMutableRawPointer?
        let ring = cshims_port_ring_create(4096 + (4 << 20), &map)
        #expect(ring >= 0)
        #expect(send(twice, header(kind: 5, components: 0, sequence: 11), fds: [ring]))
        #expect(send(twice, header(kind: 5, components: 0, sequence: 11), fds: [ring]))
        #expect(closedByOwner(twice))
        close(twice)
        close(ring)
        if let map { cshims_port_ring_unmap(map, 4096 + (4 << 20)) }

        // The honest sender is unharmed, and its own ring works.
        let reply = try good.sendRequest(ringTestMessage(id: 5, sizes: [1 << 20]), timeout: .seconds(5), replyTimeout: .seconds(10))
        #expect(reply.id == 5)
        #expect(owner.port.malformedMessages == 3)
        #expect(owner.port.sharedMemoryBuffers == 1)
        #expect(eventually { drops.withLock { $0.count } == 3 })
        for reason in drops.withLock({ $0 }) {
            if case .malformed = reason {} else { Issue.record("dropped for \(reason), not as malformed") }
        }
        good.invalidate()
        try owner.finish()
    }

    @Test func aLocalPortCannotCrossAProcessBoundary() throws {
        let name = uniqueName("local")
        let owner = try Owner(NamedPort(name: name) { _ in nil })
        let remote = try RemotePort.lookup(name)
        let local = LocalPort { _ in }
        #expect(throws: PortError.notTransferable("a LocalPort (a component)")) {
            try remote.send(PortEnvelope(components: [.port(local)]), timeout: .seconds(1))
        }
        #expect(throws: PortError.notTransferable("a LocalPort (the envelope's replyPort)")) {
            try remote.send(PortEnvelope(replyPort: local), timeout: .seconds(1))
        }
        local.invalidate()
        try owner.finish()
    }

    /// A receiver whose loop never reads: the socket buffer fills and the
    /// sender's timeout fires; a request nobody answers times out too.
    @Test func aReceiverThatNeverReadsTimesTheSenderOut() throws {
        let name = uniqueName("stalled")
        let release = Latch()
        let owner = try Owner(NamedPort(name: name) { m in
            if m.id == 1 { _ = release.wait(seconds: 30) }  // the loop stalls in the handler
            return nil
        })
        let remote = try RemotePort.lookup(name)
        try remote.send(PortEnvelope(id: 1), timeout: .seconds(1))
        #expect(throws: PortError.self) {
            _ = try remote.sendRequest(PortEnvelope(id: 2), timeout: .seconds(1), replyTimeout: .milliseconds(50))
        }
        var timedOut = false
        let chunk = PortEnvelope(id: 3, components: [.bytes([UInt8](repeating: 0, count: 60_000))])
        for _ in 0..<1_000 {
            do throws(PortError) {
                try remote.send(chunk, timeout: .milliseconds(20))
            } catch {
                if case .timedOut = error { timedOut = true }
                break
            }
        }
        #expect(timedOut)
        release.countDown()
        try owner.finish()
    }

    /// A connection that sends a malformed record is closed, and only it,
    /// and the drop handler hears of it as `.malformed`: another sender's
    /// messages still arrive, and its own close is no drop.
    @Test func aMalformedMessageClosesOnlyItsConnection() throws {
        let name = uniqueName("malformed")
        let got = LockedValue<[UInt32]>([])
        let drops = LockedValue<[PortError]>([])
        let namedPort = try NamedPort(name: name) { m in got.withLock { $0.append(m.id) }; return nil }
        namedPort.onDroppedConnection { error in drops.withLock { $0.append(error) } }
        let owner = try Owner(namedPort)
        let good = try RemotePort.lookup(name)
        // A raw connection: read the greeting, then send garbage.
        let address = Array("spindle.\(geteuid()).\(name)".utf8)
        let raw = address.withUnsafeBufferPointer { cshims_port_connect($0.baseAddress, $0.count, -1) }
        #expect(raw >= 0)
        #expect(cshims_port_poll(raw, 1, 5_000_000_000) == 1)
        var greeting = [UInt8](repeating: 0, count: 64)
        #expect(read(raw, &greeting, 64) == 24)
        var garbage = [UInt8](repeating: 0xEE, count: 40)
        #expect(write(raw, &garbage, garbage.count) == 40)
        // The owner closes it: reading gives end of file.
        #expect(cshims_port_poll(raw, 1, 5_000_000_000) == 1)
        #expect(read(raw, &greeting, 64) == 0)
        close(raw)
        try good.send(PortEnvelope(id: 5), timeout: .seconds(1))
        _ = try good.sendRequest(PortEnvelope(id: 6), timeout: .seconds(1), replyTimeout: .seconds(5))
        #expect(got.withLock { $0 } == [5, 6])
        #expect(owner.port.malformedMessages == 1)
        good.invalidate()
        #expect(eventually { owner.port.connectionCount == 0 })
        let reasons = drops.withLock { $0 }
        #expect(reasons.count == 1, "\(reasons)")
        if let reason = reasons.first, case .malformed = reason {} else { Issue.record("dropped for \(reasons), not as malformed") }
        try owner.finish()
    }

    @Test func aBadNameIsMisuse() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = try? NamedPort(name: "") { _ in nil }
        }
        let empty = String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
        #expect(empty.contains("NamedPort.init: the port name is empty"))
        let long = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = blocking { try? RemotePort.lookup(String(repeating: "x", count: 200)) }
        }
        let message = String(decoding: long?.standardErrorContent ?? [], as: UTF8.self)
        #expect(message.contains("RemotePort.lookup: the port name is 200 bytes"))
    }

    /// More descriptors than one message can carry across processes is a
    /// specific error, and nothing is sent.
    @Test func tooManyDescriptorsInOneMessageIsRefused() throws {
        let name = uniqueName("fds")
        let owner = try Owner(NamedPort(name: name) { _ in nil })
        let remote = try RemotePort.lookup(name)
        let unpublished = NamedPort { _ in nil }
        let right = try unpublished.makeSendRight()
        let many = PortEnvelope(components: Array(repeating: .remotePort(right), count: 254))
        #expect(throws: PortError.tooManyComponents(count: 254, limit: 253)) { try remote.send(many, timeout: .seconds(1)) }
        right.invalidate()
        unpublished.invalidate()
        try owner.finish()
    }

    // MARK: Across processes (fork inside an exit test, so the test runner's threads are not forked)

    /// The guide's named-port check-in across processes, plus one-way
    /// order, request/reply and a send right that crosses the boundary: the
    /// child looks the launcher's name up, checks in with its own port's
    /// send right, sends 1,000 numbered messages and a request; the launcher
    /// answers on the child's port.
    @Test func checkInAndTrafficBetweenTwoProcesses() async {
        await #expect(processExitsWith: .success) {
            exit(twoProcessCheckIn())
        }
    }

    /// The owner process dies: the name disappears (lookup: `.nameNotFound`)
    /// and a connected sender learns it (`.peerGone`).
    @Test func theOwnersDeathFreesTheNameAndSendersLearnIt() async {
        await #expect(processExitsWith: .success) {
            exit(ownerDies())
        }
    }

    /// 8 processes × 100,000 messages to one named port: none lost, none
    /// duplicated, in order per sender.
    @Test func eightProcessesTimes100kMessages() async {
        await #expect(processExitsWith: .success) {
            exit(manySenders(processes: 8, messages: 100_000))
        }
    }

    /// A child forked after its parent used a port's ring sends through a
    /// ring of its own, not into its parent's: both processes' large
    /// messages arrive intact, all through rings.
    @Test func aForkedChildSendsThroughARingOfItsOwn() async {
        await #expect(processExitsWith: .success) {
            exit(ringAcrossFork())
        }
    }

    /// A parent and the child it forked make requests on one inherited
    /// `RemotePort` at the same time: the child's first request makes a
    /// connection of its own, and each process gets its own replies only.
    @Test func aParentAndItsForkedChildGetOnlyTheirOwnReplies() async {
        await #expect(processExitsWith: .success) {
            exit(repliesAcrossFork())
        }
    }

    /// A send right with no name to reconnect by (made by `makeSendRight()`,
    /// or received in a message), used in a child after `fork()`, throws
    /// `.inheritedAcrossFork` and sends nothing; the parent's connection
    /// goes on.
    @Test func anInheritedSendRightWithoutANameIsRefusedInTheChild() async {
        await #expect(processExitsWith: .success) {
            exit(unnamedRightAcrossFork())
        }
    }

    /// A pre-fork server: 70 children (past the 64 rings one connection
    /// may carry) send buffers of 20 KiB and more, one way and as requests,
    /// on the port their parent looked up before forking. Nothing is lost,
    /// the parent's connection survives, and once the children have exited
    /// the owner has unmapped their rings.
    @Test func seventyForkedChildrenSendLargeBuffersOnAnInheritedPort() async {
        await #expect(processExitsWith: .success) {
            exit(preForkServerSenders())
        }
    }

    /// As root: a process of user `nobody` is refused by a port that admits
    /// only its own user (`.accessDenied`), and admitted by one opened to any
    /// user; a `nobody` process squatting on root's name is detected
    /// (`.foreignOwner`).
    @Test(.enabled(if: geteuid() == 0, "needs root to run a child process as nobody"))
    func aForeignUserIsRefusedAndASquatterDetected() async {
        await #expect(processExitsWith: .success) {
            exit(foreignUser())
        }
    }
}

// MARK: - Ring helpers

/// A message of byte buffers of `sizes`, each filled from `id` and its index
/// (a word at a time: debug builds are slow per byte).
private func ringTestMessage(id: UInt32, sizes: [Int]) -> PortEnvelope {
    PortEnvelope(id: id, components: sizes.enumerated().map { i, size in
        var state = UInt64(id) &* 0x9E37_79B9_7F4A_7C15 &+ UInt64(i)
        return .bytes([UInt8](unsafeUninitializedCapacity: size) { buffer, initialized in
            let raw = UnsafeMutableRawBufferPointer(buffer)
            var j = 0
            while j < size {
                state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
                withUnsafeBytes(of: state) { word in
                    let n = min(8, size - j)
                    raw.baseAddress!.advanced(by: j).copyMemory(from: word.baseAddress!, byteCount: n)
                }
                j += 8
            }
            initialized = size
        })
    })
}

/// A hash of every buffer, in order, with their lengths (a word at a time).
private func ringTestHash(_ m: PortEnvelope) -> UInt64 {
    var hash: UInt64 = 0xCBF2_9CE4_8422_2325
    for b in m.components.compactMap(\.bytes) {
        b.withUnsafeBytes { raw in
            var j = 0
            while j + 8 <= raw.count {
                hash = (hash ^ raw.loadUnaligned(fromByteOffset: j, as: UInt64.self)) &* 0x100_0000_01B3
                j += 8
            }
            while j < raw.count {
                hash = (hash ^ UInt64(raw[j])) &* 0x100_0000_01B3
                j += 1
            }
        }
        hash = (hash ^ UInt64(b.count)) &* 0x100_0000_01B3
    }
    return hash
}

// MARK: - Process bodies (return 0 when every check passed, else the failed check's number)

private let nobody: uid_t = 65534

/// Forks a child that waits for `go()` before it runs `body` (as user
/// `nobody` if asked) and exits with its result. The parent forks before it
/// starts any thread of its own: a child forked while another thread holds
/// a lock (the runtime's, malloc's, a loop's) may wait for it forever.
private func forkGated(asNobody: Bool = false, _ body: () -> Int32) -> (pid: pid_t, go: () -> Void) {
    var gate: [Int32] = [0, 0]
    guard pipe(&gate) == 0 else { return (-1, {}) }
    let child = fork()
    if child == 0 {
        armHangAlarm(seconds: 240)  // a hang fails the test instead of stalling it
        close(gate[1])
        if asNobody {
            guard setgid(nobody) == 0, setuid(nobody) == 0 else { _exit(99) }
        }
        var b: UInt8 = 0
        guard read(gate[0], &b, 1) == 1 else { _exit(98) }
        _exit(body())
    }
    close(gate[0])
    let writeEnd = gate[1]
    return (child, {
        var b: UInt8 = 1
        _ = write(writeEnd, &b, 1)
        close(writeEnd)
    })
}

private func twoProcessCheckIn() -> Int32 {
    let name = uniqueName("launcher")
    let order = LockedValue<[Int]>([])
    let checkedIn = LockedValue<RemotePort?>(nil)
    let requests = LockedValue(0)
    let worker = forkGated { checkInWorker(launcherName: name) }
    guard worker.pid > 0 else { return 2 }
    guard let launcher = try? Owner(
        NamedPort(name: name) { m in
            switch m.id {
            case 100:  // check-in: the worker's send right
                checkedIn.withLock { $0 = m.components.first?.remotePort }
                try? m.components.first?.remotePort?.send(PortEnvelope(id: 101, components: [bytes("welcome")]), timeout: .seconds(5))
            case 1:
                let i = m.components[0].bytes!.withUnsafeBytes { $0.loadUnaligned(as: UInt32.self) }
                order.withLock { $0.append(Int(i)) }
            case 2:
                requests.withLock { $0 += 1 }
                return PortEnvelope(id: 2, components: [bytes(text(m).uppercased())])
            default: break
            }
            return nil
        })
    else { return 1 }
    worker.go()
    let status = waitFor(worker.pid)
    guard status == 0 else { return 10 + min(status, 100) }
    guard order.withLock({ $0 }) == Array(0..<1_000) else { return 3 }
    guard requests.withLock({ $0 }) == 1 else { return 4 }
    guard checkedIn.withLock({ $0 }) != nil else { return 5 }
    guard (try? launcher.finish()) != nil else { return 6 }
    return 0
}

/// The worker (child) side: returns 0 on success.
private func checkInWorker(launcherName: String) -> Int32 {
    guard let launcher = try? RemotePort.lookup(launcherName) else { return 1 }
    let welcomed = Latch()
    guard let mine = try? Owner(NamedPort { m in
        if m.id == 101 && text(m) == "welcome" { welcomed.countDown() }
        return nil
    }) else { return 2 }
    guard let right = try? mine.port.makeSendRight() else { return 3 }
    guard (try? launcher.send(PortEnvelope(id: 100, components: [.remotePort(right)]), timeout: .milliseconds(100))) != nil else { return 4 }
    right.invalidate()
    guard welcomed.wait(seconds: 30) else { return 5 }
    for i in 0..<1_000 {
        let m = PortEnvelope(id: 1, components: [.bytes(withUnsafeBytes(of: UInt32(i)) { Array($0) })])
        guard (try? launcher.send(m, timeout: .seconds(5))) != nil else { return 6 }
    }
    guard let reply = try? launcher.sendRequest(PortEnvelope(id: 2, components: [bytes("hello")]), timeout: .seconds(5), replyTimeout: .seconds(10)),
        text(reply) == "HELLO"
    else { return 7 }
    guard (try? mine.finish()) != nil else { return 8 }
    return 0
}

private func ownerDies() -> Int32 {
    let name = uniqueName("mortal")
    var ready: [Int32] = [0, 0]
    guard pipe(&ready) == 0 else { return 1 }
    let child = fork()
    if child == 0 {
        armHangAlarm(seconds: 60)
        guard let owner = try? Owner(NamedPort(name: name) { m in PortEnvelope(id: m.id) }) else { _exit(1) }
        var b: UInt8 = 1
        _ = write(ready[1], &b, 1)
        while true { pause() }  // killed by the parent
        _ = owner
    }
    guard child > 0 else { return 2 }
    var b: UInt8 = 0
    guard read(ready[0], &b, 1) == 1 else { return 3 }
    guard let remote = try? RemotePort.lookup(name) else { return 4 }
    guard (try? remote.sendRequest(PortEnvelope(id: 9), timeout: .seconds(5), replyTimeout: .seconds(10)))?.id == 9 else { return 5 }
    kill(child, SIGKILL)
    guard waitFor(child) == 128 + SIGKILL else { return 6 }
    // The kernel releases the dead owner's sockets at once, or (when its
    // loop polled them with io_uring) once the ring is torn down: until
    // then a send may still be buffered. Within 10 s it must fail.
    let deadline = MonotonicClock.now.advanced(by: .seconds(10))
    var learned = false
    while !learned && MonotonicClock.now < deadline {
        do throws(PortError) {
            try remote.send(PortEnvelope(id: 10), timeout: .seconds(1))
            usleep(1_000)
        } catch {
            guard error == .peerGone else { return 8 }
            learned = true
        }
    }
    guard learned else { return 7 }
    // The name goes with the listening socket, on the same schedule.
    var gone = false
    while !gone && MonotonicClock.now < deadline {
        do throws(PortError) {
            _ = try RemotePort.lookup(name, timeout: .seconds(1))
            return 9
        } catch {
            switch error {
            case .nameNotFound(name): gone = true
            case .timedOut: continue
            default: return 10
            }
        }
    }
    return gone ? 0 : 11
}

private func manySenders(processes: Int, messages: Int) -> Int32 {
    let name = uniqueName("many")
    // Per sender: the next index expected, and faults seen. Loop thread only.
    let next = LockedValue([Int](repeating: 0, count: processes))
    let faults = LockedValue(0)
    var children: [(pid: pid_t, go: () -> Void)] = []
    for s in 0..<processes {
        let child = forkGated {
            guard let remote = try? RemotePort.lookup(name, timeout: .seconds(30)) else { return 1 }
            for i in 0..<messages {
                let m = PortEnvelope(id: 1, components: [.bytes(withUnsafeBytes(of: (UInt32(s), UInt32(i))) { Array($0) })])
                guard (try? remote.send(m, timeout: .seconds(30))) != nil else { return 2 }
            }
            // A last request: its reply means every message before it was handled.
            let end = PortEnvelope(id: 2, components: [.bytes(withUnsafeBytes(of: (UInt32(s), UInt32(messages))) { Array($0) })])
            guard (try? remote.sendRequest(end, timeout: .seconds(30), replyTimeout: .seconds(60))) != nil else { return 3 }
            return 0
        }
        guard child.pid > 0 else { return 2 }
        children.append(child)
    }
    guard let owner = try? Owner(
        NamedPort(name: name) { m in
            let b = m.components[0].bytes!
            let (s, i) = b.withUnsafeBytes { (Int($0.loadUnaligned(as: UInt32.self)), Int($0.loadUnaligned(fromByteOffset: 4, as: UInt32.self))) }
            next.withLock {
                if $0[s] != i { faults.withLock { $0 += 1 } }
                $0[s] = max($0[s], i + 1)
            }
            return m.id == 2 ? PortEnvelope(id: 2) : nil
        })
    else { return 1 }
    for child in children { child.go() }
    for child in children where waitFor(child.pid) != 0 { return 3 }
    guard faults.withLock({ $0 }) == 0 else { return 4 }
    guard next.withLock({ $0 }) == [Int](repeating: messages + 1, count: processes) else { return 5 }
    guard (try? owner.finish()) != nil else { return 6 }
    return 0
}

private func foreignUser() -> Int32 {
    // 1. Default access: nobody is refused.
    let name = uniqueName("private")
    let refused = forkGated(asNobody: true) {
        do throws(PortError) {
            _ = try RemotePort.lookup(name, owner: 0)
            return 1
        } catch {
            return error == .accessDenied(name) ? 0 : 2
        }
    }
    let open = uniqueName("open")
    let admitted = forkGated(asNobody: true) {
        guard let remote = try? RemotePort.lookup(open, owner: 0),
            let reply = try? remote.sendRequest(PortEnvelope(id: 1), timeout: .seconds(5), replyTimeout: .seconds(10)),
            reply.id == 2
        else { return 1 }
        return 0
    }
    guard refused.pid > 0, admitted.pid > 0 else { return 97 }
    guard let owner = try? Owner(NamedPort(name: name) { _ in nil }) else { return 1 }
    refused.go()
    var status = waitFor(refused.pid)
    guard status == 0 else { return 10 + status }
    guard owner.port.refusedConnections == 1 else { return 3 }
    guard (try? owner.finish()) != nil else { return 4 }

    // 2. Opened to any user: nobody gets in and is answered.
    guard let openOwner = try? Owner(NamedPort(name: open, access: .anyUser) { m in PortEnvelope(id: m.id + 1) }) else { return 5 }
    admitted.go()
    status = waitFor(admitted.pid)
    guard status == 0 else { return 20 + status }
    guard (try? openOwner.finish()) != nil else { return 6 }

    // 3. A squatter: nobody publishes under root's name; root's lookup
    // sees the holder is not root and sends nothing.
    let squatted = uniqueName("squatted")
    var ready: [Int32] = [0, 0]
    guard pipe(&ready) == 0 else { return 7 }
    let squatter = fork()
    if squatter == 0 {
        armHangAlarm(seconds: 60)
        guard setgid(nobody) == 0, setuid(nobody) == 0 else { _exit(1) }
        let address = Array("spindle.0.\(squatted)".utf8)
        let fd = address.withUnsafeBufferPointer { cshims_port_listen($0.baseAddress, $0.count, 8) }
        guard fd >= 0 else { _exit(2) }
        var b: UInt8 = 1
        _ = write(ready[1], &b, 1)
        while true { pause() }
    }
    var b: UInt8 = 0
    guard squatter > 0, read(ready[0], &b, 1) == 1 else { return 8 }
    var result: Int32 = 0
    do throws(PortError) {
        _ = try RemotePort.lookup(squatted)
        result = 9
    } catch {
        if error != .foreignOwner(name: squatted, uid: nobody) { result = 30 }
    }
    kill(squatter, SIGKILL)
    _ = waitFor(squatter)
    return result
}


/// The owner runs in a child of its own, so that this process starts no
/// thread before it forks the second sender.
private func ringAcrossFork() -> Int32 {
    let name = uniqueName("ringfork")
    let owner = forkGated {
        guard let port = try? NamedPort(name: name, { m in
            let hash = ringTestHash(m)
            return PortEnvelope(id: m.id, components: [.bytes(withUnsafeBytes(of: hash) { Array($0) })])
        }), let thread = try? LoopThread.start() else { return 20 }
        thread.loop.add(port)
        // Once the parent's connection (the child's is a copy of it) has
        // come and gone, report how many buffers came through rings.
        var connected = false
        while true {
            let count = port.connectionCount
            if count > 0 { connected = true } else if connected { break }
            usleep(1_000)
        }
        let count = Int32(port.sharedMemoryBuffers)
        port.invalidate()
        thread.stop()
        return count
    }
    guard owner.pid > 0 else { return 2 }
    owner.go()
    var found: RemotePort?
    let deadline = MonotonicClock.now.advanced(by: .seconds(10))
    while found == nil && MonotonicClock.now < deadline {
        found = try? RemotePort.lookup(name)
        if found == nil { usleep(2_000) }
    }
    guard let remote = found else { return 3 }
    func exchange(_ id: UInt32, _ size: Int) -> Bool {
        let message = ringTestMessage(id: id, sizes: [size])
        guard let reply = try? remote.sendRequest(message, timeout: .seconds(5), replyTimeout: .seconds(10)),
              let bytes = reply.components.first?.bytes, bytes.count == 8
        else { return false }
        return bytes.withUnsafeBytes { $0.load(as: UInt64.self) } == ringTestHash(message)
    }
    guard exchange(1, 300 << 10) else { return 4 }
    let child = fork()
    if child == 0 {
        armHangAlarm(seconds: 60)
        _exit(exchange(2, 500 << 10) ? 0 : 5)
    }
    guard child > 0 else { return 6 }
    var status: Int32 = 0
    guard waitpid(child, &status, 0) == child, status == 0 else { return 7 }
    guard exchange(3, 1 << 20) else { return 8 }
    remote.invalidate()
    // The owner exits with its count of buffers taken out of rings: one
    // from this process's ring twice, one from the child's.
    let code = waitFor(owner.pid)
    return code == 3 ? 0 : 100 + code
}

// MARK: - Ports across fork (each process keeps its own connection)

/// Forks the owner of a named port `name` (a loop thread in a child of its
/// own, so that the calling process starts no thread before it forks its
/// senders); the owner exits once the connections have come and gone,
/// with `exitCode()`. Returns the owner's pid and the caller's looked-up
/// port, or nil.
private func forkOwner(
    _ name: String, handler: @escaping @Sendable (PortEnvelope) -> PortEnvelope?, exitCode: @escaping () -> Int32 = { 0 }
) -> (pid: pid_t, remote: RemotePort)? {
    let owner = forkGated {
        guard let port = try? NamedPort(name: name, handler), let thread = try? LoopThread.start() else { return 20 }
        thread.loop.add(port)
        var connected = false
        while true {
            let count = port.connectionCount
            if count > 0 { connected = true } else if connected { break }
            usleep(1_000)
        }
        port.invalidate()
        thread.stop()
        return exitCode()
    }
    guard owner.pid > 0 else { return nil }
    owner.go()
    let deadline = MonotonicClock.now.advanced(by: .seconds(10))
    while MonotonicClock.now < deadline {
        if let found = try? RemotePort.lookup(name) { return (owner.pid, found) }
        usleep(2_000)
    }
    return nil
}

/// Requests `count` echoes tagged `tag` on `remote`; true if every reply
/// carried this process's own request back.
private func echoes(_ remote: RemotePort, tag: String, count: Int) -> Bool {
    for i in 0..<count {
        let sent = "\(tag)-\(i)"
        guard let reply = try? remote.sendRequest(
            PortEnvelope(id: UInt32(i), components: [bytes(sent)]), timeout: .seconds(5), replyTimeout: .seconds(10)),
            reply.id == UInt32(i), text(reply) == sent
        else { return false }
    }
    return true
}

private func repliesAcrossFork() -> Int32 {
    let name = uniqueName("replyfork")
    guard let (ownerPID, remote) = forkOwner(name, handler: { m in PortEnvelope(id: m.id, components: m.components) }) else { return 2 }
    guard echoes(remote, tag: "before", count: 3) else { return 3 }
    let child = fork()
    if child == 0 {
        armHangAlarm(seconds: 60)
        _exit(echoes(remote, tag: "child", count: 300) ? 0 : 4)
    }
    guard child > 0 else { return 5 }
    let parentOK = echoes(remote, tag: "parent", count: 300)
    let childStatus = waitFor(child)
    guard parentOK else { return 6 }
    guard childStatus == 0 else { return 10 + min(childStatus, 100) }
    guard echoes(remote, tag: "after", count: 3) else { return 7 }
    remote.invalidate()
    let code = waitFor(ownerPID)
    return code == 0 ? 0 : 150 + min(code, 100)
}

private func unnamedRightAcrossFork() -> Int32 {
    // Unpublished and in no loop: messages wait in the socket, which is
    // enough to see whose sends arrive.
    let port = NamedPort { _ in nil }
    guard let right = try? port.makeSendRight() else { return 2 }
    guard (try? right.send(PortEnvelope(id: 1), timeout: .seconds(1))) != nil else { return 3 }
    let child = fork()
    if child == 0 {
        armHangAlarm(seconds: 60)
        do throws(PortError) {
            try right.send(PortEnvelope(id: 2), timeout: .seconds(1))
            _exit(4)
        } catch {
            guard error == .inheritedAcrossFork(nil) else { _exit(5) }
        }
        do throws(PortError) {
            _ = try right.sendRequest(PortEnvelope(id: 3), timeout: .seconds(1), replyTimeout: .seconds(1))
            _exit(6)
        } catch {
            guard error == .inheritedAcrossFork(nil) else { _exit(7) }
        }
        // Its own copy closes; the parent's connection stays.
        right.invalidate()
        _exit(0)
    }
    guard child > 0 else { return 8 }
    let status = waitFor(child)
    guard status == 0 else { return 10 + min(status, 100) }
    guard (try? right.send(PortEnvelope(id: 4), timeout: .seconds(1))) != nil else { return 9 }
    guard port.connectionCount == 1 else { return 120 }
    port.invalidate()
    return 0
}

/// The shared-memory rings mapped in this process (`/proc/self/maps`).
private func mappedPortRings() -> Int {
    let fd = open("/proc/self/maps", O_RDONLY)
    guard fd >= 0 else { return -1 }
    defer { close(fd) }
    var text: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 64 << 10)
    while true {
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard n > 0 else { break }
        text += chunk[0..<n]
    }
    return String(decoding: text, as: UTF8.self).split(separator: "\n").filter { $0.contains("spindle.port.ring") }.count
}

private func preForkServerSenders() -> Int32 {
    let name = uniqueName("prefork")
    let children = 70
    let oneWaySize = 24 << 10
    let goodOneWay = LockedValue(0)
    let badOneWay = LockedValue(0)
    let handler: @Sendable (PortEnvelope) -> PortEnvelope? = { m in
        switch m.id {
        case 999:  // the parent's question: one-way buffers that arrived intact, rings mapped
            let counts = [UInt32(goodOneWay.withLock { $0 }), UInt32(badOneWay.withLock { $0 }), UInt32(mappedPortRings())]
            return PortEnvelope(id: 999, components: [.bytes(counts.withUnsafeBytes { Array($0) })])
        case 5_000...:
            let intact = ringTestHash(m) == ringTestHash(ringTestMessage(id: m.id, sizes: [oneWaySize]))
            (intact ? goodOneWay : badOneWay).withLock { $0 += 1 }
            return nil
        default:  // a request: the hash of its buffers
            let hash = ringTestHash(m)
            return PortEnvelope(id: m.id, components: [.bytes(withUnsafeBytes(of: hash) { Array($0) })])
        }
    }
    guard let (ownerPID, remote) = forkOwner(name, handler: handler) else { return 2 }
    func exchange(_ id: UInt32, _ size: Int) -> Bool {
        let message = ringTestMessage(id: id, sizes: [size])
        guard let reply = try? remote.sendRequest(message, timeout: .seconds(10), replyTimeout: .seconds(30)),
              let bytes = reply.components.first?.bytes, bytes.count == 8
        else { return false }
        return bytes.withUnsafeBytes { $0.load(as: UInt64.self) } == ringTestHash(message)
    }
    // The parent's own ring exists before the fork, as in a server that
    // used the port while starting up.
    guard exchange(1, 20 << 10) else { return 3 }
    var pids: [pid_t] = []
    for i in 0..<children {
        let child = fork()
        if child == 0 {
            armHangAlarm(seconds: 120)
            for k in 0..<2 {
                let id = UInt32(5_000 + 2 * i + k)
                guard (try? remote.send(ringTestMessage(id: id, sizes: [oneWaySize]), timeout: .seconds(10))) != nil else { _exit(4) }
            }
            _exit(exchange(UInt32(1_000 + i), 16 << 10) ? 0 : 5)
        }
        guard child > 0 else { return 6 }
        pids.append(child)
    }
    var failed: Int32 = 0
    for pid in pids {
        let status = waitFor(pid)
        if status != 0 && failed == 0 { failed = status }
    }
    guard failed == 0 else { return 10 + min(failed, 100) }
    // The parent's connection is whole: its requests still go through.
    guard exchange(2, 1 << 20) else { return 7 }
    // Every one-way buffer arrived intact; the children's rings go as
    // their connections close (the owner's loop sees each close on its own
    // pass): only the parent's stays.
    var last: [UInt32] = []
    let deadline = MonotonicClock.now.advanced(by: .seconds(20))
    while MonotonicClock.now < deadline {
        guard let reply = try? remote.sendRequest(PortEnvelope(id: 999), timeout: .seconds(5), replyTimeout: .seconds(10)),
              let b = reply.components.first?.bytes, b.count == 12
        else { return 8 }
        last = b.withUnsafeBytes { Array($0.bindMemory(to: UInt32.self)) }
        if last == [UInt32(2 * children), 0, 1] { break }
        usleep(10_000)
    }
    guard last.count == 3 else { return 9 }
    guard last[0] == UInt32(2 * children) else { return 60 + Int32(min(last[0], 29)) }
    guard last[1] == 0 else { return 90 }
    guard last[2] == 1 else { return 100 + Int32(min(last[2], 49)) }
    remote.invalidate()
    let code = waitFor(ownerPID)
    return code == 0 ? 0 : 150 + min(code, 100)
}

@Suite("RemotePort request deadlines")
struct RemotePortRequestDeadlineTests {
    /// `sendRequest(_:before:)` takes one deadline for the whole exchange,
    /// on any clock: a reply in time comes back; a handler that holds the
    /// reply past the deadline gives `.replyTimedOut`, and so does a
    /// deadline already passed (one look, no wait); the late reply is
    /// skipped by the next request, whose reply is its own.
    @Test(arguments: availableBackends)
    func aRequestTakesOneDeadlineOnAnyClock(kind: EventBackendKind) throws {
        let name = uniqueName("request-deadline")
        let held = Semaphore(value: 0)
        let owner = try Owner(
            NamedPort(name: name) { m in
                if m.id >= 100 { held.wait() }
                return PortEnvelope(id: m.id + 1)
            }, backend: kind)
        let remote = try RemotePort.lookup(name)
        #expect(try remote.sendRequest(PortEnvelope(id: 1), before: ContinuousClock.now + .seconds(10)).id == 2)
        #expect(try remote.sendRequest(PortEnvelope(id: 3), before: SuspendingClock.now + .seconds(10)).id == 4)
        #expect(try remote.sendRequest(PortEnvelope(id: 5), before: MonotonicClock.now + .seconds(10)).id == 6)
        do {
            _ = try remote.sendRequest(PortEnvelope(id: 100), before: ContinuousClock.now + .milliseconds(50))
            Issue.record("a reply came from a handler that waits for a signal")
        } catch {
            guard case .replyTimedOut(let waited) = error else { throw error }
            #expect(waited <= .milliseconds(50) && waited >= .zero)
        }
        _ = held.signal()
        // A deadline already passed: the request is sent (its socket has
        // room), the reply is looked for once, and it cannot be there yet.
        do {
            _ = try remote.sendRequest(PortEnvelope(id: 200), before: ContinuousClock.now - .seconds(1))
            Issue.record("a reply came without waiting for a handler that waits for a signal")
        } catch {
            #expect(error == .replyTimedOut(after: .zero))
        }
        _ = held.signal()
        // The two late replies (101, 201) are skipped.
        #expect(try remote.sendRequest(PortEnvelope(id: 7), before: ContinuousClock.now + .seconds(10)).id == 8)
        remote.invalidate()
        try owner.finish()
    }
}

@Suite("RemotePort across fork while in use")
struct RemotePortForkWhileInUseTests {
    /// Two threads hammer ports (requests on a looked-up `RemotePort`, and
    /// on a send right with no name) and two more read their state without
    /// pause while the main thread forks 150 times.
    /// Every child uses both inherited ports at once: the looked-up one
    /// makes a connection of its own and gets its own reply, the unnamed
    /// one throws `.inheritedAcrossFork`; and every child exits promptly,
    /// even one forked while a hammering thread held a port's state lock
    /// (the child frees it instead of waiting for a thread it does not
    /// have).
    @Test func childrenForkedWhileThreadsUseAPortUseItAndExit() async {
        await #expect(processExitsWith: .success) {
            exit(forkWhileHammering(children: 150))
        }
    }
}

private func forkWhileHammering(children: Int) -> Int32 {
    let name = uniqueName("forkhammer")
    guard let (ownerPID, remote) = forkOwner(name, handler: { m in PortEnvelope(id: m.id, components: m.components) }) else { return 2 }
    let local = NamedPort { m in PortEnvelope(id: m.id + 1) }
    guard let loop = try? LoopThread.start() else { return 3 }
    loop.loop.add(local)
    guard let right = try? local.makeSendRight() else { return 4 }
    let stop = LockedValue(false)
    let failures = LockedValue(0)
    let hammers = [
        try? NativeThread.start {
            var i: UInt32 = 0
            while !stop.withLock({ $0 }) {
                i &+= 1
                let reply = try? remote.sendRequest(PortEnvelope(id: i, components: [bytes("p\(i)")]), timeout: .seconds(5), replyTimeout: .seconds(10))
                if reply?.id != i || !remote.isValid { failures.withLock { $0 += 1 } }
            }
        },
        try? NativeThread.start {
            var i: UInt32 = 0
            while !stop.withLock({ $0 }) {
                i &+= 2
                let reply = try? right.sendRequest(PortEnvelope(id: i), timeout: .seconds(5), replyTimeout: .seconds(10))
                if reply?.id != i + 1 { failures.withLock { $0 += 1 } }
            }
        },
    ]
    // Two more that only read the ports' state, in tight loops: the
    // state locks are held a good part of the time, so many forks find
    // one held.
    let readers = [remote, right].map { port in
        try? NativeThread.start {
            var valid = 0
            while !stop.withLock({ $0 }) { if port.isValid { valid += 1 } }
            return valid
        }
    }
    guard hammers.allSatisfy({ $0 != nil }), readers.allSatisfy({ $0 != nil }) else { return 5 }
    var code: Int32 = 0
    for n in 0..<children {
        let child = fork()
        if child == 0 {
            armHangAlarm(seconds: 20)
            // Both at once, as the parent's threads were.
            let mine = "child-\(n)"
            guard let reply = try? remote.sendRequest(
                PortEnvelope(id: 7, components: [bytes(mine)]), timeout: .seconds(5), replyTimeout: .seconds(10)),
                reply.id == 7, text(reply) == mine
            else { _exit(6) }
            do throws(PortError) {
                _ = try right.sendRequest(PortEnvelope(id: 8), timeout: .seconds(1), replyTimeout: .seconds(1))
                _exit(7)
            } catch {
                guard error == .inheritedAcrossFork(nil) else { _exit(8) }
            }
            guard remote.isValid, right.isValid else { _exit(9) }
            _exit(0)
        }
        guard child > 0 else {
            code = 10
            break
        }
        let status = waitFor(child)
        if status != 0 {
            // 128 + SIGALRM (142): the child hung.
            code = 100 + min(status, 150)
            break
        }
    }
    stop.withLock { $0 = true }
    for h in hammers { try? h?.join() }
    for r in readers { _ = try? r?.join() }
    if code == 0 && failures.withLock({ $0 }) != 0 { code = 11 }
    remote.invalidate()
    right.invalidate()
    local.invalidate()
    loop.stop()
    try? loop.join()
    let ownerCode = waitFor(ownerPID)
    if code == 0 && ownerCode != 0 { code = 12 }
    return code
}

/// Connects to `name` as a bare socket, waits for the port's greeting and
/// returns the descriptor (-1 on failure): a requester that reads only when
/// the test says so.
private func rawRequester(_ name: String) -> Int32 {
    let address = Array("spindle.\(geteuid()).\(name)".utf8)
    let raw = address.withUnsafeBufferPointer { cshims_port_connect($0.baseAddress, $0.count, -1) }
    var greeting = [UInt8](repeating: 0, count: 64)
    guard raw >= 0, cshims_port_poll(raw, 1, 5_000_000_000) == 1, read(raw, &greeting, 64) == 24 else { return -1 }
    return raw
}

/// A request record with no components, as `RemotePort` encodes one.
private func rawRequest(id: UInt32, sequence: UInt64) -> [UInt8] {
    var bytes: [UInt8] = []
    withUnsafeBytes(of: UInt32(0x504E_5053).littleEndian) { bytes += $0 }
    bytes += [1, 0, 0, 0]
    withUnsafeBytes(of: id.littleEndian) { bytes += $0 }
    withUnsafeBytes(of: UInt32(0).littleEndian) { bytes += $0 }
    withUnsafeBytes(of: sequence.littleEndian) { bytes += $0 }
    return bytes
}

/// Sends each record on `raw`, waiting for room (at most 5 s each); false
/// once one cannot go (the port closed the connection, say).
private func sendRecords(_ raw: Int32, _ records: [[UInt8]]) -> Bool {
    for record in records {
        let deadline = MonotonicClock.now + .seconds(5)
        while true {
            let rc = record.withUnsafeBytes { cshims_port_send(raw, $0.baseAddress, $0.count, nil, 0) }
            if rc == record.count { break }
            guard rc == -Int(EAGAIN), MonotonicClock.now < deadline else { return false }
            _ = cshims_port_poll(raw, 2, 100_000_000)
        }
    }
    return true
}

/// Reads `count` reply records from `raw` and returns their ids in order
/// (fewer if the connection ends or nothing comes for 10 s).
private func readReplyIDs(_ raw: Int32, count: Int) -> [UInt32] {
    var ids: [UInt32] = []
    var buffer = [UInt8](repeating: 0, count: 128 << 10)
    while ids.count < count, cshims_port_poll(raw, 1, 10_000_000_000) == 1 {
        let n = read(raw, &buffer, buffer.count)
        guard n >= 24, buffer[4] == 2 else { break }
        ids.append(buffer.withUnsafeBytes { UInt32(littleEndian: $0.loadUnaligned(fromByteOffset: 8, as: UInt32.self)) })
    }
    return ids
}

@Suite("NamedPort slow requesters")
struct NamedPortSlowRequesterTests {
    /// Ten requesters ask for 8 KiB replies, up to 300 each (more than a
    /// socket buffer and the bound hold), and never read.
    /// The loop is not held up: a timer on the same loop keeps firing and
    /// a requester that reads gets each of its replies, in order, within
    /// a reply timeout far below what the ten would have cost when a reply
    /// waited on the loop's thread (a second each). Once 64 KiB of replies
    /// wait for a non-reader, its connection is closed and reported as
    /// `.replyBacklogExceeded`, ten times; the reader's connection goes on.
    @Test(arguments: availableBackends)
    func requestersThatDoNotReadAreClosedAndHoldUpNobody(kind: EventBackendKind) throws {
        let name = uniqueName("slowrequesters")
        let drops = LockedValue<[PortError]>([])
        let big = [UInt8](repeating: 0x5A, count: 8 << 10)
        let namedPort = try NamedPort(name: name, replyBacklogLimit: 64 << 10) { m in
            m.id >= 1_000_000 ? PortEnvelope(id: m.id, components: [.bytes(big)]) : PortEnvelope(id: m.id + 1)
        }
        #expect(namedPort.replyBacklogLimit == 64 << 10)
        namedPort.onDroppedConnection { error in drops.withLock { $0.append(error) } }
        let owner = try Owner(namedPort, backend: kind)
        let ticks = LockedValue(0)
        let timer = LoopTimer(fireAt: MonotonicClock.now, interval: .milliseconds(2)) { _ in ticks.withLock { $0 += 1 } }
        owner.thread.loop.add(timer)
        let reader = try RemotePort.lookup(name)
        var nextID: UInt32 = 0
        func exchange() throws {
            nextID += 2
            let reply = try reader.sendRequest(PortEnvelope(id: nextID), timeout: .seconds(5), replyTimeout: .seconds(3))
            #expect(reply.id == nextID + 1)
        }
        try exchange()
        let hogs = (0..<10).map { _ in rawRequester(name) }
        #expect(hogs.allSatisfy { $0 >= 0 })
        for (h, hog) in hogs.enumerated() {
            // A hog the port closed before it sent them all is fine.
            _ = sendRecords(hog, (0..<300).map { rawRequest(id: 1_000_000 + UInt32(h * 1000 + $0), sequence: UInt64($0 + 1)) })
        }
        let ticksAtStart = ticks.withLock { $0 }
        let deadline = MonotonicClock.now + .seconds(30)
        while drops.withLock({ $0.count }) < 10 && MonotonicClock.now < deadline {
            try exchange()
            usleep(5_000)
        }
        // The timer went on firing while the ten waited on the loop.
        let tickDeadline = MonotonicClock.now + .seconds(10)
        while ticks.withLock({ $0 }) <= ticksAtStart + 5 && MonotonicClock.now < tickDeadline { usleep(1_000) }
        #expect(ticks.withLock { $0 } > ticksAtStart + 5)
        let reasons = drops.withLock { $0 }
        #expect(reasons.count == 10)
        for reason in reasons {
            guard case .replyBacklogExceeded(let bytes, let limit) = reason else {
                Issue.record("dropped for \(reason)")
                continue
            }
            #expect(limit == 64 << 10 && bytes > limit)
        }
        for hog in hogs {
            // Each hog's connection was closed by the port: its end reads
            // the replies the socket held, then the end.
            var buffer = [UInt8](repeating: 0, count: 128 << 10)
            var ended = false
            while cshims_port_poll(hog, 1, 5_000_000_000) == 1 {
                if read(hog, &buffer, buffer.count) <= 0 {
                    ended = true
                    break
                }
            }
            #expect(ended)
            close(hog)
        }
        #expect(namedPort.connectionCount == 1)
        try exchange()
        owner.thread.loop.remove(timer)
        reader.invalidate()
        try owner.finish()
    }

    /// A requester that sends 60 requests for 8 KiB replies at once and
    /// only then reads gets all of them, in order: what its socket did not
    /// take waited on the connection (under the default 4 MiB limit).
    @Test(arguments: availableBackends)
    func repliesQueuedForASlowReaderAllArriveInOrder(kind: EventBackendKind) throws {
        let name = uniqueName("slowreader")
        let big = [UInt8](repeating: 0x33, count: 8 << 10)
        let drops = LockedValue<[PortError]>([])
        let namedPort = try NamedPort(name: name) { m in PortEnvelope(id: m.id, components: [.bytes(big)]) }
        namedPort.onDroppedConnection { error in drops.withLock { $0.append(error) } }
        let owner = try Owner(namedPort, backend: kind)
        let slow = rawRequester(name)
        #expect(slow >= 0)
        #expect(sendRecords(slow, (0..<60).map { rawRequest(id: 500 + UInt32($0), sequence: UInt64($0 + 1)) }))
        usleep(100_000)  // let the replies pile up; the test holds whatever the timing
        #expect(readReplyIDs(slow, count: 60) == (0..<60).map { 500 + UInt32($0) })
        close(slow)
        #expect(drops.withLock { $0 }.isEmpty)
        try owner.finish()
    }
}
