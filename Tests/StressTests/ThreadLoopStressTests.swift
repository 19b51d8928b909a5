import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif


/// Per-sender sequence numbers recorded by the loop thread only.
private final class Received: @unchecked Sendable {
    // @unchecked: written only on the loop thread, read after it is joined.
    var lastSeen: [Int]
    var count = 0
    var outOfOrder = 0
    init(senders: Int) { lastSeen = [Int](repeating: -1, count: senders) }
}

/// Starts a loop thread, hands its loop to `body` (whose threads send to
/// it), then stops the loop once everything they sent has run.
private func withRunningLoop(
    _ kind: EventBackendKind, _ body: @escaping @Sendable (ThreadLoop) -> Void
) {
    let running = RunningLoop(kind) { loop in
        while loop.run(mode: .default, timeout: .seconds(60)) != .stopped {}
        return .stopped
    }
    let loop = running.loop!
    body(loop)
    loop.perform { loop.stop() }
    _ = running.join()
    running.keep.invalidate()
}

@Suite("ThreadLoop stress")
struct ThreadLoopStressTests {
    /// 4 threads × 250,000 performs onto one loop (the count, and
    /// CI's; 2,500,000 each at full size): each runs exactly once, in order
    /// per sender.
    @Test(arguments: availableBackends)
    func performsRunOnceInOrderPerSender(kind: EventBackendKind) {
        let senders = 4
        let perSender = stressSize(ci: 250_000, full: 2_500_000)
        let received = Received(senders: senders)
        withRunningLoop(kind) { loop in
            runThreads(senders) { s in
                for i in 0..<perSender {
                    loop.perform {
                        if received.lastSeen[s] != i - 1 { received.outOfOrder += 1 }
                        received.lastSeen[s] = i
                        received.count += 1
                    }
                }
            }
        }
        #expect(received.count == senders * perSender)
        #expect(received.outOfOrder == 0)
        #expect(received.lastSeen.allSatisfy { $0 == perSender - 1 })
        // Every perform checked its sender's order.
        StressReport.record(operations: senders * perSender, threads: senders + 1, checks: senders * perSender + 3)
    }

    /// 1,000 timers (10,000 at full size) with random dates fire in date order, none lost, none
    /// twice; a second thread invalidates some while the loop may be firing
    /// them, which must be safe (an invalidated timer fires at most once,
    /// before its invalidation).
    @Test(arguments: availableBackends)
    func thousandTimersFireInDateOrder(kind: EventBackendKind) {
        let count = stressSize(ci: 1_000, full: 10_000)
        let checked = LockedValue(0)
        onLoopThread(kind) { loop in
            var rng = SystemRandomNumberGenerator()
            let base = MonotonicClock.now.advanced(by: .milliseconds(20))
            let firings = LockedValue<[(Int, MonotonicClock.Instant)]>([])
            var timers: [LoopTimer] = []
            for i in 0..<count {
                let date = base.advanced(by: .microseconds(Int64.random(in: 0..<200_000, using: &rng)))
                let t = LoopTimer(fireAt: date) { t in firings.withLock { $0.append((i, t.fireDate)) } }
                timers.append(t)
                loop.add(t, forMode: .default)
            }
            // Another thread invalidates every tenth timer at some point.
            let victims = stride(from: 0, to: count, by: 10).map { Unchecked(timers[$0]) }
            let killer = startThread {
                for v in victims {
                    usleep(UInt32.random(in: 0..<400))
                    v.value.invalidate()
                }
            }
            while loop.run(mode: .default, timeout: .seconds(10)) != .finished {}
            killer()
            let fired = firings.withLock { $0 }
            let ids = fired.map(\.0)
            #expect(Set(ids).count == ids.count, "a timer fired twice")
            let survivors = Set(0..<count).subtracting(stride(from: 0, to: count, by: 10))
            #expect(survivors.isSubset(of: Set(ids)), "a timer that was never invalidated did not fire")
            let dates = fired.map(\.1)
            #expect(zip(dates, dates.dropFirst()).allSatisfy { $0 <= $1 }, "timers fired out of date order")
            checked.withLock { $0 = ids.count }
        }
        // Each firing checked once-only and in date order, each survivor checked fired.
        let firings = checked.withLock { $0 }
        StressReport.record(operations: count, threads: 2, checks: 2 * firings + (count - count / 10))
    }

    /// Sources and timers added and removed from other threads while the
    /// loop runs: the loop keeps working and ends with nothing registered.
    @Test(arguments: availableBackends)
    func concurrentAddRemove(kind: EventBackendKind) {
        let perThread = stressSize(ci: 2_000, full: 40_000)
        let fired = EventLog()
        withRunningLoop(kind) { loop in
            runThreads(3) { t in
                for i in 0..<perThread {
                    let source = LoopSource { _ in }
                    loop.add(source, forMode: i % 2 == 0 ? .default : .common)
                    source.signal()
                    let timer = LoopTimer(after: .microseconds(Int64(i % 50))) { _ in }
                    loop.add(timer, forMode: .default)
                    if i % 3 == 0 { timer.invalidate() }
                    source.invalidate()
                }
                fired.append("\(t)")
            }
        }
        #expect(fired.all.count == 3)
        // Adds and removes (a source and a timer each round); the one check is that every thread got through.
        StressReport.record(operations: 3 * perThread * 2, threads: 4, checks: 1)
    }

    /// Additions racing invalidation and removal on other threads: an add
    /// either lands before the invalidation, which then takes the item out,
    /// or finds it invalid and adds nothing. Nothing is left behind: once
    /// the keep-alive source goes, the running loop's default mode is empty
    /// and its run returns `.finished`.
    @Test(arguments: availableBackends)
    func invalidationRacingAddLeavesNothing(kind: EventBackendKind) {
        let count = stressSize(ci: 5_000, full: 100_000)
        let sources = (0..<count).map { _ in LoopSource { _ in } }
        let timers = (0..<count).map { _ in LoopTimer(after: .seconds(60)) { _ in } }
        let running = RunningLoop(kind) { loop in
            var result = LoopRunResult.timedOut
            let deadline = MonotonicClock.now.advanced(by: .seconds(60))
            while result != .finished && MonotonicClock.now < deadline {
                result = loop.run(mode: .default, timeout: .seconds(1))
            }
            return result
        }
        let loop = running.loop!
        runThreads(3) { role in
            for i in 0..<count {
                switch role {
                case 0:
                    loop.add(sources[i], forMode: i % 2 == 0 ? .default : .common)
                    loop.add(timers[i], forMode: i % 3 == 0 ? .common : .default)
                    sources[i].signal()
                case 1:
                    sources[i].invalidate()
                    timers[i].invalidate()
                default:
                    loop.remove(sources[i], forMode: .default)
                    loop.remove(timers[i], forMode: .common)
                }
            }
        }
        running.keep.invalidate()
        #expect(running.join() == .finished)
        #expect(sources.allSatisfy { !$0.isValid } && timers.allSatisfy { !$0.isValid })
        // Each source and timer checked invalid, and the loop checked empty.
        StressReport.record(operations: 3 * 2 * count, threads: 4, checks: 2 * count + 1)
    }
}

/// What the descriptor-churn stress test counts, from any thread.
private final class ChurnTally: Sendable {
    let fired = LockedValue(0)
    let failures = LockedValue<[String]>([])
    let timeouts = LockedValue(0)
}

@Suite("Event registry stress")
struct EventRegistryStressTests {
    /// Three threads churn descriptor sources on one running loop: each
    /// round makes a socket pair, adds a reader (and, every other round, a
    /// writer on the same socket and a reader held in a mode the loop never
    /// runs), writes a byte, waits for the reader's handler, invalidates
    /// everything from the client thread and closes the sockets, so the
    /// numbers are reused at once by the other threads. Every round's
    /// reader fires, no source fails, no event is lost, and once the
    /// loop's thread has exited the registry holds nothing.
    @Test(arguments: availableBackends)
    func descriptorChurnLosesNothing(kind: EventBackendKind) {
        let clients = 3
        // The 3 × 1,500 (CI's too); 10× at full size.
        let rounds = stressSize(ci: 1_500, full: 15_000)
        let tally = ChurnTally()
        let registry = LockedValue<EventRegistry?>(nil)
        withRunningLoop(kind) { loop in
            registry.withLock { $0 = loop.registry }
            runThreads(clients) { _ in
                for round in 0..<rounds {
                    var pair: [Int32] = [0, 0]
                    guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else {
                        tally.failures.withLock { $0.append("socketpair: errno \(errno)") }
                        return
                    }
                    let (mine, peer) = (pair[0], pair[1])
                    let done = Semaphore(value: 0)
                    let reader = LoopSource(
                        descriptor: mine,
                        failed: { _, error in tally.failures.withLock { $0.append("reader: \(error)") } }
                    ) { _, readiness in
                        var b: UInt8 = 0
                        if readiness.contains(.readable) && read(mine, &b, 1) == 1 {
                            tally.fired.withLock { $0 += 1 }
                            done.signal()
                        }
                    }
                    var extras: [LoopSource] = []
                    if round % 2 == 0 {
                        extras.append(LoopSource(
                            descriptor: mine, interest: .writable,
                            failed: { _, error in tally.failures.withLock { $0.append("writer: \(error)") } }
                        ) { _, _ in })
                        extras.append(LoopSource(
                            descriptor: mine,
                            failed: { _, error in tally.failures.withLock { $0.append("held: \(error)") } }
                        ) { _, _ in })
                        loop.add(extras[0])
                        loop.add(extras[1], forMode: "never run")
                    }
                    loop.add(reader)
                    var b: UInt8 = UInt8(truncatingIfNeeded: round)
                    _ = write(peer, &b, 1)
                    if done.wait(timeout: .seconds(20)) == .timedOut { tally.timeouts.withLock { $0 += 1 } }
                    reader.invalidate()
                    for e in extras { e.invalidate() }
                    close(mine)
                    close(peer)
                }
            }
        }
        #expect(tally.fired.withLock { $0 } == clients * rounds)
        #expect(tally.timeouts.withLock { $0 } == 0)
        #expect(tally.failures.withLock { $0 }.isEmpty)
        let counts = registry.withLock { $0 }!.counts
        #expect(counts.registrations == 0 && counts.descriptors == 0, "left in the registry: \(counts)")
        // Every round's reader checked it fired within its deadline.
        StressReport.record(operations: clients * rounds, threads: clients + 1, checks: clients * rounds + 4)
    }
}
