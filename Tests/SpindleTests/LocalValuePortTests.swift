import Spindle
import Testing
import TestSupport

/// `LocalValuePort`: a `Sendable` value, not bytes, between threads of one
/// process, delivered on the receiving loop in order.
@Suite("LocalValuePort")
struct LocalValuePortTests {
    struct Reading: Sendable, Equatable {
        let sensor: String
        let celsius: Double
    }

    @Test(arguments: availableBackends)
    func valuesArriveOnTheLoopInOrder(kind: EventBackendKind) throws {
        let worker = try LoopThread.start(backend: kind)
        defer { worker.stop(); try? worker.join() }
        let received = LockedValue<[Reading]>([])
        let onLoop = LockedValue(true)
        let done = Semaphore(value: 0)
        let port = LocalValuePort<Reading> { reading in
            if !worker.loop.isCurrent { onLoop.withLock { $0 = false } }
            received.withLock { $0.append(reading) }
            if reading.sensor == "last" { done.signal() }
        }
        port.schedule(in: worker.loop)
        for i in 0..<100 { try port.send(Reading(sensor: "s\(i)", celsius: Double(i)), timeout: .seconds(30)) }
        try port.send(Reading(sensor: "last", celsius: -1), before: ContinuousClock.now + .seconds(30))
        #expect(done.wait(timeout: .seconds(30)) == .completed)
        let all = received.withLock { $0 }
        #expect(all.count == 101)
        #expect(all.prefix(100).map(\.celsius) == (0..<100).map(Double.init))
        #expect(onLoop.withLock { $0 })
        #expect(port.waitingCount == 0)
        port.invalidate()
    }

    @Test func aFullPortTimesOutAndKeepsNothingOfTheFailedSend() {
        // Not in a loop: nothing drains it.
        let port = LocalValuePort<[Int]>(capacity: 2) { _ in }
        defer { port.invalidate() }
        #expect(throws: Never.self) { try port.send([1], timeout: .zero) }
        #expect(throws: Never.self) { try port.send([2], timeout: .zero) }
        #expect(throws: PortError.self) { try port.send([3], timeout: .milliseconds(2)) }
        #expect(port.waitingCount == 2)
        #expect(port.port.queuedCount == 2)
    }

    @Test func anInvalidatedPortRefusesAndDropsWhatWaits() {
        let port = LocalValuePort<String> { _ in }
        #expect(throws: Never.self) { try port.send("kept until invalidated", timeout: .zero) }
        port.invalidate()
        #expect(port.waitingCount == 0)
        #expect(!port.port.isValid)
        #expect(throws: PortError.self) { try port.send("late", timeout: .zero) }
    }

    @Test func aValueCanCarryAReplyPortOfItsOwnType() throws {
        let worker = try LoopThread.start()
        defer { worker.stop(); try? worker.join() }
        struct Ask: Sendable { let n: Int; let reply: LocalValuePort<Int> }
        let asks = LocalValuePort<Ask> { ask in try? ask.reply.send(ask.n * 2, timeout: .seconds(30)) }
        asks.schedule(in: worker.loop)
        let answer = LockedValue<Int?>(nil)
        let replied = Semaphore(value: 0)
        let replies = LocalValuePort<Int> { n in answer.withLock { $0 = n }; replied.signal() }
        replies.schedule(in: worker.loop)
        try asks.send(Ask(n: 21, reply: replies), timeout: .seconds(30))
        #expect(replied.wait(timeout: .seconds(30)) == .completed)
        #expect(answer.withLock { $0 } == 42)
        asks.invalidate()
        replies.invalidate()
    }
}
