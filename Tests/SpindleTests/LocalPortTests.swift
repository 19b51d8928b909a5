import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// Runs `loop` (the caller's own) in `mode` until `done()` holds or
/// `limit` passes; returns whether `done()` held.
@discardableResult
private func run(
    _ loop: ThreadLoop, mode: LoopMode = .default, limit: Duration = .seconds(10), until done: () -> Bool
) -> Bool {
    let deadline = MonotonicClock.now.advanced(by: limit)
    while !done() {
        if MonotonicClock.now >= deadline { return false }
        loop.run(mode: mode, timeout: .milliseconds(100), returnAfterSourceHandled: true)
    }
    return true
}

private func text(_ message: PortEnvelope, _ index: Int = 0) -> String {
    String(decoding: message.components[index].bytes ?? [], as: UTF8.self)
}

/// The guide's message identifiers for the check-in example.
private let checkIn: UInt32 = 100
private let request: UInt32 = 1
private let answer: UInt32 = 2
private let exitNow: UInt32 = 3

@Suite("LocalPort")
struct LocalPortTests {
    /// The guide's launcher/worker check-in over in-process ports (Listings
    /// 3-12 to 3-15), rebuilt: the launcher adds its port to its loop and
    /// hands the same object to the worker; the worker adds a port of its own
    /// to its loop and checks in with a message (id 100, sent with a
    /// deadline of now) whose reply port is its port; the launcher takes that
    /// port from the message and uses it for later requests, which the
    /// worker answers on the launcher's port. The worker runs its loop until
    /// told to exit, and its thread's exit invalidates its port.
    @Test(arguments: availableBackends)
    func launcherAndWorkerCheckIn(kind: EventBackendKind) throws {
        let workerPorts = LockedValue<[LocalPort]>([])
        let answers = LockedValue<[String]>([])
        let arrivedOn = LockedValue<[ObjectIdentifier]>([])
        // Launcher: this test's thread, with a loop of its own.
        try onLoopThreadThrowing(kind) { loop in
            let launcherPort = LocalPort { message in
                if let receivedOn = message.receivePort { arrivedOn.withLock { $0.append(ObjectIdentifier(receivedOn)) } }
                switch message.id {
                case checkIn:
                    // The worker's communications port, kept for later sends.
                    if let port = message.replyPort { workerPorts.withLock { $0.append(port) } }
                case answer:
                    answers.withLock { $0.append(text(message)) }
                default:
                    Issue.record("launcher: unexpected message \(message.id)")
                }
            }
            loop.add(launcherPort, forMode: .default)

            // Worker: gets the launcher's port object itself.
            let worker = try LoopThread.start(backend: kind) { workerLoop in
                let remotePort = launcherPort
                let shouldExit = LockedValue(false)
                let myPort = LocalPort { message in
                    switch message.id {
                    case request:
                        let reply = PortEnvelope(id: answer, components: [.bytes(Array(text(message).uppercased().utf8))])
                        try? message.replyPort?.send(reply, timeout: .seconds(1))
                    case exitNow:
                        shouldExit.withLock { $0 = true }
                    default:
                        Issue.record("worker: unexpected message \(message.id)")
                    }
                }
                workerLoop.add(myPort, forMode: .default)
                // Check in: no components, the worker's port as reply port,
                // a deadline of now.
                try remotePort.send(PortEnvelope(id: checkIn, replyPort: myPort), timeout: .zero)
                while !shouldExit.withLock({ $0 }) {
                    if workerLoop.run(mode: .default, timeout: .seconds(10), returnAfterSourceHandled: true) == .stopped { break }
                }
            }

            // The launcher keeps running its loop while it waits for the check-in.
            #expect(run(loop) { workerPorts.withLock { !$0.isEmpty } })
            let workerPort = try #require(workerPorts.withLock { $0.first })
            #expect(workerPort !== launcherPort)
            #expect(arrivedOn.withLock { $0 } == [ObjectIdentifier(launcherPort)])

            for word in ["hello", "ports"] {
                let ask = PortEnvelope(id: request, components: [.bytes(Array(word.utf8))], replyPort: launcherPort)
                try workerPort.send(ask, timeout: .seconds(1))
            }
            #expect(run(loop) { answers.withLock { $0.count } == 2 })
            #expect(answers.withLock { $0 } == ["HELLO", "PORTS"])

            let invalidated = Latch()
            workerPort.onInvalidation { _ in invalidated.countDown() }
            try workerPort.send(PortEnvelope(id: exitNow), timeout: .seconds(1))
            try worker.join()
            // The worker's thread is gone: its port went with its loop.
            #expect(invalidated.wait(seconds: 5))
            #expect(!workerPort.isValid)
            #expect(throws: PortError.invalidated) { try workerPort.send(PortEnvelope(id: request), timeout: .zero) }
            launcherPort.invalidate()
        }
    }

    /// Several senders: each sender's messages arrive in its order, each
    /// message once, one per handler call.
    ///
    /// 6,000 messages through a 64-message queue take each sender through
    /// about 90 waits for room. Under ThreadSanitizer beside the other
    /// suites on two cores that has taken over 10 s (once in CI), so the
    /// limits are long: they catch a loop that stops delivering (a lost
    /// signal never ends), not a slow machine. A failure says how far it got.
    @Test(arguments: availableBackends)
    func messagesArriveOncePerCallInSendOrderPerSender(kind: EventBackendKind) throws {
        let senders = 3
        let perSender = 2_000
        let limit = Duration.seconds(120)
        try onLoopThreadThrowing(kind) { loop in
            let seen = LockedValue<[[Int]]>(Array(repeating: [], count: senders))
            let inHandler = LockedValue(0)
            let overlapped = LockedValue(false)
            let port = LocalPort(capacity: 64) { message in
                if inHandler.withLock({ $0 += 1; return $0 }) != 1 { overlapped.withLock { $0 = true } }
                let bytes = message.components[0].bytes!
                let sender = Int(bytes[0])
                let index = Int(bytes[1]) << 8 | Int(bytes[2])
                seen.withLock { $0[sender].append(index) }
                inHandler.withLock { $0 -= 1 }
            }
            loop.add(port)
            let sendFailures = LockedValue<[String]>([])
            let join = startThread {
                runThreads(senders) { s in
                    for i in 0..<perSender {
                        let m = PortEnvelope(id: UInt32(s), components: [.bytes([UInt8(s), UInt8(i >> 8), UInt8(i & 0xff)])])
                        do throws(PortError) {
                            try port.send(m, timeout: limit)
                        } catch {
                            sendFailures.withLock { $0.append("sender \(s), message \(i): \(error)") }
                            return
                        }
                    }
                }
            }
            let delivered = { seen.withLock { $0.map(\.count).reduce(0, +) } }
            let start = MonotonicClock.now
            let done = run(loop, limit: limit) { delivered() == senders * perSender }
            let took = MonotonicClock.now - start
            // Senders still waiting for room would wait out their limit:
            // invalidating the port ends their sends.
            if !done { port.invalidate() }
            join()
            #expect(
                done,
                "\(delivered()) of \(senders * perSender) messages delivered in \(took); failed sends: \(sendFailures.withLock { $0 })")
            guard done else { return }
            #expect(seen.withLock { $0 } == Array(repeating: Array(0..<perSender), count: senders))
            #expect(!overlapped.withLock { $0 })
            port.invalidate()
        }
    }

    /// A handled message counts as a handled source: a run that returns
    /// after one source returns after one message.
    @Test func aRunReturningAfterOneSourceTakesOneMessage() throws {
        try onLoopThreadThrowing(.epoll) { loop in
            let count = LockedValue(0)
            let port = LocalPort { _ in count.withLock { $0 += 1 } }
            loop.add(port)
            for _ in 0..<3 { try port.send(PortEnvelope(), timeout: .zero) }
            #expect(port.queuedCount == 3)
            #expect(loop.run(mode: .default, timeout: .seconds(5), returnAfterSourceHandled: true) == .handledSource)
            #expect(count.withLock { $0 } == 1)
            #expect(loop.run(mode: .default, timeout: .seconds(5), returnAfterSourceHandled: true) == .handledSource)
            #expect(loop.run(mode: .default, timeout: .seconds(5), returnAfterSourceHandled: true) == .handledSource)
            #expect(count.withLock { $0 } == 3)
            #expect(port.queuedCount == 0)
            port.invalidate()
        }
    }

    /// A message sent while the loop runs a mode the port is not in waits for
    /// a pass in one of the port's modes.
    @Test(arguments: availableBackends)
    func aMessageWaitsForAPassInOneOfThePortsModes(kind: EventBackendKind) throws {
        let portMode = LoopMode("ports.test")
        try onLoopThreadThrowing(kind) { loop in
            let got = LockedValue<[UInt32]>([])
            let port = LocalPort { m in got.withLock { $0.append(m.id) } }
            loop.add(port, forMode: portMode)
            #expect(loop.contains(port, inMode: portMode))
            #expect(!loop.contains(port, inMode: .default))
            let keep = LoopSource { _ in }
            loop.add(keep)
            try port.send(PortEnvelope(id: 9), timeout: .zero)
            loop.run(mode: .default, timeout: .milliseconds(20))
            #expect(got.withLock { $0 }.isEmpty)
            #expect(run(loop, mode: portMode) { !got.withLock { $0 }.isEmpty })
            #expect(got.withLock { $0 } == [9])
            // Removed from its mode: messages stay queued until it is back.
            loop.remove(port, forMode: portMode)
            try port.send(PortEnvelope(id: 10), timeout: .zero)
            loop.add(port, forMode: .default)
            #expect(run(loop) { got.withLock { $0 }.count == 2 })
            #expect(got.withLock { $0 } == [9, 10])
            keep.invalidate()
            port.invalidate()
        }
    }

    /// Byte buffers pass by reference: the receiver sees the sender's storage.
    @Test func bytesPassByReferenceWithoutACopy() throws {
        try onLoopThreadThrowing(.epoll) { loop in
            let received = LockedValue<[UInt8]?>(nil)
            let port = LocalPort { m in received.withLock { $0 = m.components[0].bytes } }
            loop.add(port)
            let payload = [UInt8](repeating: 7, count: 1 << 20)
            let sent = payload.withUnsafeBufferPointer { UInt(bitPattern: $0.baseAddress) }
            try port.send(PortEnvelope(components: [.bytes(payload)]), timeout: .zero)
            #expect(run(loop) { received.withLock { $0 } != nil })
            let got = received.withLock { $0 }!
            #expect(got.withUnsafeBufferPointer { UInt(bitPattern: $0.baseAddress) } == sent)
            port.invalidate()
        }
    }

    /// A port inside a message is one the receiver can answer on, across
    /// threads.
    @Test(arguments: availableBackends)
    func aPortInAMessageIsOneTheReceiverCanReplyOn(kind: EventBackendKind) throws {
        let echo = try LoopThread.start(backend: kind)
        let server = LocalPort { m in
            guard case .port(let back)? = m.components.last else { return }
            try? back.send(PortEnvelope(id: m.id + 1, components: [m.components[0]]), timeout: .seconds(1))
        }
        echo.loop.add(server)
        try onLoopThreadThrowing(kind) { loop in
            let replies = LockedValue<[(UInt32, String)]>([])
            let mine = LocalPort { m in replies.withLock { $0.append((m.id, text(m))) } }
            loop.add(mine)
            try server.send(PortEnvelope(id: 41, components: [.bytes(Array("ping".utf8)), .port(mine)]), timeout: .seconds(1))
            #expect(run(loop) { replies.withLock { !$0.isEmpty } })
            #expect(replies.withLock { $0.map(\.0) } == [42])
            #expect(replies.withLock { $0.map(\.1) } == ["ping"])
            mine.invalidate()
        }
        echo.stop()
        try echo.join()
        #expect(!server.isValid)
    }

    /// A full queue makes a send wait at most its timeout, then throw; with
    /// a zero timeout it throws at once. Nothing is queued by a failed send.
    @Test func aFullQueueTimesTheSendOut() throws {
        let port = LocalPort(capacity: 2) { _ in }
        try port.send(PortEnvelope(id: 1), timeout: .zero)
        try port.send(PortEnvelope(id: 2), timeout: .zero)
        let start = MonotonicClock.now
        do {
            try port.send(PortEnvelope(id: 3), timeout: .milliseconds(30))
            Issue.record("a send to a full queue succeeded")
        } catch {
            guard case .timedOut(let waited) = error else {
                Issue.record("expected .timedOut, got \(error)")
                return
            }
            #expect(waited >= .milliseconds(30))
        }
        #expect(MonotonicClock.now - start >= .milliseconds(30))
        #expect(throws: PortError.self) { try port.send(PortEnvelope(id: 4), timeout: .zero) }
        #expect(port.queuedCount == 2)
        port.invalidate()
    }

    /// A handler that sends to its own port once the queue is full is
    /// refused at once with `.fullQueueOnItsOwnLoop` (only its own thread
    /// could make room), and so is any other send from the receiving loop's
    /// thread; what fit is delivered, and the loop goes on.
    @Test(arguments: availableBackends)
    func aSendToItsOwnFullPortFromItsLoopIsRefused(kind: EventBackendKind) throws {
        try onLoopThreadThrowing(kind) { loop in
            let outcomes = LockedValue<[String]>([])
            let delivered = LockedValue<[UInt32]>([])
            let port = LocalPort(capacity: 2) { m in
                delivered.withLock { $0.append(m.id) }
                guard m.id == 1, let me = m.receivePort else { return }
                for id: UInt32 in 10...12 {
                    do throws(PortError) {
                        // Without the refusal this would hold the loop for
                        // the whole 5 s, then time out.
                        try me.send(PortEnvelope(id: id), timeout: .seconds(5))
                        outcomes.withLock { $0.append("\(id) queued") }
                    } catch {
                        outcomes.withLock { $0.append("\(id) \(error == .fullQueueOnItsOwnLoop(capacity: 2) ? "refused" : "\(error)")") }
                    }
                }
            }
            loop.add(port)
            try port.send(PortEnvelope(id: 1), timeout: .zero)
            #expect(run(loop) { delivered.withLock { $0.count == 3 } })
            #expect(outcomes.withLock { $0 } == ["10 queued", "11 queued", "12 refused"])
            #expect(delivered.withLock { $0 } == [1, 10, 11])
            // Outside a handler, on the loop's thread, too.
            try port.send(PortEnvelope(id: 20), timeout: .zero)
            try port.send(PortEnvelope(id: 21), timeout: .zero)
            #expect(throws: PortError.fullQueueOnItsOwnLoop(capacity: 2)) {
                try port.send(PortEnvelope(id: 22), timeout: .seconds(5))
            }
            // Another thread waits as before, and times out.
            let other = LockedValue<PortError?>(nil)
            let join = startThread {
                do throws(PortError) { try port.send(PortEnvelope(id: 23), timeout: .milliseconds(20)) } catch { other.withLock { $0 = error } }
            }
            join()
            if case .timedOut? = other.withLock({ $0 }) {} else { Issue.record("another thread's send: \(String(describing: other.withLock { $0 }))") }
            port.invalidate()
        }
    }

    /// A sender waiting on a full queue goes on as soon as the loop takes a
    /// message.
    @Test(arguments: availableBackends)
    func aWaitingSenderGoesOnWhenTheLoopTakesAMessage(kind: EventBackendKind) throws {
        try onLoopThreadThrowing(kind) { loop in
            let got = LockedValue<[UInt32]>([])
            let port = LocalPort(capacity: 1) { m in got.withLock { $0.append(m.id) } }
            try port.send(PortEnvelope(id: 1), timeout: .zero)
            let sent = Latch()
            let join = startThread {
                try! port.send(PortEnvelope(id: 2), timeout: .seconds(30))
                sent.countDown()
            }
            usleep(20_000)
            #expect(port.queuedCount == 1)
            loop.add(port)
            #expect(run(loop) { got.withLock { $0 }.count == 2 })
            #expect(sent.wait(seconds: 5))
            join()
            #expect(got.withLock { $0 } == [1, 2])
            port.invalidate()
        }
    }

    /// Over either limit, a send throws a specific error before queuing.
    @Test func anEnvelopeOverTheLimitsIsRefused() throws {
        let port = LocalPort { _ in }
        let tooBig = PortEnvelope(components: [
            .bytes([UInt8](repeating: 0, count: PortEnvelope.maximumByteCount)), .bytes([1]),
        ])
        #expect(throws: PortError.messageTooLarge(byteCount: PortEnvelope.maximumByteCount + 1, limit: PortEnvelope.maximumByteCount)) {
            try port.send(tooBig, timeout: .zero)
        }
        let tooMany = PortEnvelope(components: Array(repeating: .bytes([]), count: PortEnvelope.maximumComponentCount + 1))
        #expect(throws: PortError.tooManyComponents(count: PortEnvelope.maximumComponentCount + 1, limit: PortEnvelope.maximumComponentCount)) {
            try port.send(tooMany, timeout: .zero)
        }
        #expect(port.queuedCount == 0)
        // Exactly at the limits is fine.
        try port.send(PortEnvelope(components: [.bytes([UInt8](repeating: 0, count: PortEnvelope.maximumByteCount))]), timeout: .zero)
        try port.send(PortEnvelope(components: Array(repeating: .bytes([]), count: PortEnvelope.maximumComponentCount)), timeout: .zero)
        #expect(port.queuedCount == 2)
        #expect(PortError.messageTooLarge(byteCount: 5, limit: 4).description.contains("over the limit of 4"))
        port.invalidate()
    }

    /// Invalidation: the port leaves its loop, queued messages are dropped,
    /// a waiting sender and later sends throw `.invalidated`, observers run
    /// once (a late one at once).
    @Test(arguments: availableBackends)
    func invalidationStopsThePortAndTellsWhoAsked(kind: EventBackendKind) throws {
        try onLoopThreadThrowing(kind) { loop in
            let delivered = LockedValue(0)
            let port = LocalPort(capacity: 1) { _ in delivered.withLock { $0 += 1 } }
            loop.add(port, forMode: .default)
            let told = LockedValue(0)
            port.onInvalidation { p in
                #expect(p === port)
                told.withLock { $0 += 1 }
            }
            try port.send(PortEnvelope(id: 1), timeout: .zero)
            let failed = LockedValue<PortError?>(nil)
            let waiting = Latch()
            let join = startThread {
                waiting.countDown()
                do throws(PortError) {
                    try port.send(PortEnvelope(id: 2), timeout: .seconds(30))
                } catch {
                    failed.withLock { $0 = error }
                }
            }
            waiting.wait()
            // Give the sender time to block on the full queue (either way it
            // must fail: before or while it waits).
            usleep(20_000)
            port.invalidate()
            join()
            #expect(failed.withLock { $0 } == .invalidated)
            #expect(told.withLock { $0 } == 1)
            #expect(!port.isValid)
            #expect(!loop.contains(port, inMode: .default))
            #expect(port.queuedCount == 0)
            #expect(throws: PortError.invalidated) { try port.send(PortEnvelope(), timeout: .seconds(1)) }
            loop.run(mode: .default, timeout: .zero)
            #expect(delivered.withLock { $0 } == 0)
            port.invalidate()
            #expect(told.withLock { $0 } == 1)
            port.onInvalidation { _ in told.withLock { $0 += 1 } }
            #expect(told.withLock { $0 } == 2)
            // An invalidated port is not added again.
            loop.add(port)
            #expect(!loop.contains(port, inMode: .default))
        }
    }

    /// The death of the receiving loop's thread invalidates the port, on
    /// that thread, and a port added to a dead loop is invalidated at once.
    @Test(arguments: availableBackends)
    func theLoopThreadsExitInvalidatesThePort(kind: EventBackendKind) throws {
        let worker = try LoopThread.start(backend: kind)
        let port = LocalPort { _ in }
        worker.loop.add(port)
        let toldOn = LockedValue<Int32?>(nil)
        port.onInvalidation { _ in toldOn.withLock { $0 = NativeThread.current.id } }
        try port.send(PortEnvelope(), timeout: .zero)
        worker.stop()
        try worker.join()
        #expect(!port.isValid)
        #expect(toldOn.withLock { $0 } == worker.thread.id)
        #expect(throws: PortError.invalidated) { try port.send(PortEnvelope(), timeout: .zero) }

        let late = LocalPort { _ in }
        worker.loop.add(late)
        #expect(!late.isValid)
    }

    /// The loop keeps a port it holds alive; removed from its last mode, the
    /// port goes when its last holder lets go.
    @Test func theLoopKeepsItsPortAlive() throws {
        try onLoopThreadThrowing(.epoll) { loop in
            weak var weakPort: LocalPort?
            let got = LockedValue(0)
            do {
                let port = LocalPort { _ in got.withLock { $0 += 1 } }
                loop.add(port, forMode: .default)
                loop.add(port, forMode: LoopMode("second"))
                weakPort = port
            }
            let port = try #require(weakPort)
            try port.send(PortEnvelope(), timeout: .zero)
            #expect(run(loop) { got.withLock { $0 } == 1 })
            loop.remove(port, forMode: .default)
            #expect(weakPort != nil)
            loop.remove(port, forMode: LoopMode("second"))
            _ = consume port
            #expect(weakPort == nil)
        }
    }

    @Test func addingThePortToASecondLoopIsMisuse() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let port = LocalPort { _ in }
            let a = try blocking { try LoopThread.start() }
            let b = try blocking { try LoopThread.start() }
            a.loop.add(port)
            b.loop.add(port)
        }
        let message = String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
        #expect(message.contains("a port is received by one loop"))
    }
}

/// Runs `body` on a new thread whose loop uses `kind`, joins it, and
/// rethrows what it threw.
private func onLoopThreadThrowing(_ kind: EventBackendKind, _ body: @escaping @Sendable (ThreadLoop) throws -> Void) throws {
    let failure = LockedValue<(any Error)?>(nil)
    onLoopThread(kind) { loop in
        do { try body(loop) } catch { failure.withLock { $0 = error } }
    }
    if let error = failure.withLock({ $0 }) { throw error }
}
