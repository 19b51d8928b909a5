import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// What the receiving loop saw, per sender. Written only by the loop's
/// thread (in the port's handler), read after that thread is joined.
private final class Arrivals: @unchecked Sendable {
    // @unchecked: see above; the join orders the reads after the writes.
    var next: [Int]
    var total = 0
    var outOfOrder = 0
    var duplicates = 0
    var foreignComponents = 0
    init(senders: Int) { next = [Int](repeating: 0, count: senders) }

    /// Records message `index` of `sender`: it must be the next one expected.
    func record(sender: Int, index: Int) {
        total += 1
        if index < next[sender] {
            duplicates += 1
        } else if index > next[sender] {
            outOfOrder += 1
        }
        next[sender] = max(next[sender], index + 1)
    }
}

/// Sender and index, encoded in 8 bytes.
private func payload(_ sender: Int, _ index: Int) -> [UInt8] {
    withUnsafeBytes(of: (UInt32(sender).littleEndian, UInt32(index).littleEndian)) { Array($0) }
}

private func decode(_ bytes: [UInt8]) -> (sender: Int, index: Int) {
    let s = bytes.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 0, as: UInt32.self) }
    let i = bytes.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 4, as: UInt32.self) }
    return (Int(UInt32(littleEndian: s)), Int(UInt32(littleEndian: i)))
}

@Suite("Port stress")
struct PortStressTests {
    /// 6 senders × 20,000 messages (200,000 at full size) to one port whose queue holds 16, so
    /// senders keep waiting for room: every message arrives exactly once, in
    /// order per sender, and the port ends empty.
    @Test(arguments: availableBackends)
    func sendersTimesMessagesNoneLostNoneTwiceInOrder(kind: EventBackendKind) throws {
        let senders = 6
        let perSender = stressSize(ci: 20_000, full: 200_000)
        let arrivals = Arrivals(senders: senders)
        let port = LocalPort(capacity: 16) { m in
            guard let bytes = m.components.first?.bytes, bytes.count == 8 else {
                arrivals.foreignComponents += 1
                return
            }
            let (s, i) = decode(bytes)
            arrivals.record(sender: s, index: i)
        }
        let running = RunningLoop(kind) { loop in
            loop.add(port)
            while loop.run(mode: .default, timeout: .seconds(60)) != .stopped {}
            return .stopped
        }
        let timeouts = LockedValue(0)
        runThreads(senders) { s in
            for i in 0..<perSender {
                while true {
                    do throws(PortError) {
                        try port.send(PortEnvelope(id: UInt32(s), components: [.bytes(payload(s, i))]), timeout: .seconds(5))
                        break
                    } catch {
                        // A timeout means nothing was queued: send it again.
                        timeouts.withLock { $0 += 1 }
                    }
                }
            }
        }
        // Every send has returned; once the loop has taken the last message
        // (its handler finishes before the next pass runs the stop perform),
        // stop it.
        let deadline = MonotonicClock.now.advanced(by: .seconds(60))
        while port.queuedCount > 0 && MonotonicClock.now < deadline { usleep(1_000) }
        running.loop.perform { running.loop.stop() }
        _ = running.join()
        running.keep.invalidate()
        port.invalidate()
        #expect(arrivals.total == senders * perSender)
        #expect(arrivals.duplicates == 0)
        #expect(arrivals.outOfOrder == 0)
        #expect(arrivals.foreignComponents == 0)
        #expect(arrivals.next == [Int](repeating: perSender, count: senders))
        #expect(port.queuedCount == 0)
        // Every arrival checked against its sender's next number.
        StressReport.record(operations: senders * perSender, threads: senders, checks: arrivals.total + 6)
    }

    /// Senders racing an invalidation: every send either succeeds or throws
    /// `.invalidated` (once it has thrown, all later ones do); what arrives
    /// is, per sender, a prefix of what it sent successfully, in order and
    /// without duplicates.
    @Test(arguments: availableBackends)
    func sendsRacingInvalidationFailCleanly(kind: EventBackendKind) throws {
        // More races at full size, not more messages: the invalidation lands
        // within 20 ms, and sends after it only throw.
        let rounds = stressSize(ci: 1, full: 20)
        var operations = 0
        var checks = 0
        for _ in 0..<rounds {
            let (sends, arrived) = sendRacingOneInvalidation(kind: kind, senders: 4, perSender: 20_000)
            operations += sends
            checks += arrived + 4 + 4
        }
        // Every send's outcome checked, every arrival checked in order.
        StressReport.record(operations: operations, threads: 5, checks: operations + checks)
    }

    /// One round of `sendsRacingInvalidationFailCleanly`; returns the sends
    /// made and the messages that arrived.
    private func sendRacingOneInvalidation(kind: EventBackendKind, senders: Int, perSender: Int) -> (sends: Int, arrived: Int) {
        let arrivals = Arrivals(senders: senders)
        let port = LocalPort(capacity: 8) { m in
            let (s, i) = decode(m.components[0].bytes!)
            arrivals.record(sender: s, index: i)
        }
        let running = RunningLoop(kind) { loop in
            loop.add(port)
            while loop.run(mode: .default, timeout: .seconds(60)) != .stopped {}
            return .stopped
        }
        let accepted = LockedValue([Int](repeating: 0, count: senders))
        let badOutcomes = LockedValue(0)
        runThreads(senders + 1) { s in
            if s == senders {
                usleep(UInt32.random(in: 1_000..<20_000))
                port.invalidate()
                return
            }
            var failed = false
            for i in 0..<perSender {
                do throws(PortError) {
                    try port.send(PortEnvelope(components: [.bytes(payload(s, i))]), timeout: .seconds(10))
                    if failed { badOutcomes.withLock { $0 += 1 } }  // a send after a refusal succeeded
                    accepted.withLock { $0[s] += 1 }
                } catch {
                    if error != .invalidated { badOutcomes.withLock { $0 += 1 } }
                    failed = true
                }
            }
        }
        running.loop.perform { running.loop.stop() }
        _ = running.join()
        running.keep.invalidate()
        #expect(!port.isValid)
        #expect(badOutcomes.withLock { $0 } == 0)
        #expect(arrivals.duplicates == 0)
        #expect(arrivals.outOfOrder == 0)
        let sent = accepted.withLock { $0 }
        for s in 0..<senders { #expect(arrivals.next[s] <= sent[s]) }
        return (senders * perSender, arrivals.total)
    }

    /// Two loops bouncing one message 20,000 times (400,000 at full size), each answering on the
    /// reply port the other put in: the count comes back exact.
    @Test(arguments: availableBackends)
    func pingPongBetweenTwoLoopsOnReplyPorts(kind: EventBackendKind) throws {
        let rounds: UInt32 = stressSize(ci: 20_000, full: 400_000)
        let finished = Latch()
        let ponger = try LoopThread.start(backend: kind)
        let pongPort = LocalPort { m in
            try! m.replyPort!.send(PortEnvelope(id: m.id, replyPort: m.receivePort), timeout: .seconds(10))
        }
        ponger.loop.add(pongPort)
        let last = LockedValue<UInt32>(0)
        let pinger = try LoopThread.start(backend: kind)
        let pingPort = LocalPort { m in
            last.withLock { $0 = m.id }
            if m.id == rounds {
                finished.countDown()
                return
            }
            try! m.replyPort!.send(PortEnvelope(id: m.id + 1, replyPort: m.receivePort), timeout: .seconds(10))
        }
        pinger.loop.add(pingPort)
        try pongPort.send(PortEnvelope(id: 1, replyPort: pingPort), timeout: .seconds(10))
        // Progress, not speed: a lost wake-up stops the bouncing, while a
        // slow machine (the full size under ThreadSanitizer beside the other
        // stress tests managed about 2,000 rounds a second) only takes
        // longer. So the wait fails when 30 s pass without a bounce.
        var seen: UInt32 = 0
        while !finished.wait(seconds: 30) {
            let now = last.withLock { $0 }
            if now == seen {
                Issue.record("\(kind): no bounce in 30 s, stuck at round \(now) of \(rounds)")
                break
            }
            seen = now
        }
        #expect(last.withLock { $0 } == rounds)
        ponger.stop()
        pinger.stop()
        try ponger.join()
        try pinger.join()
        #expect(!pongPort.isValid && !pingPort.isValid)
        // Each bounce's number is checked by the exact final count.
        StressReport.record(operations: Int(rounds), threads: 2, checks: 3)
    }
}
