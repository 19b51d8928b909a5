import Spindle
import Testing
import TestSupport

/// `ThreadLoop.performAndWait(inModes:_:)`, which hands back the block's
/// value as `WorkQueue.sync` does, and the perform that only queues.
@Suite("ThreadLoop performAndWait")
struct ThreadLoopPerformAndWaitTests {
    @Test(arguments: availableBackends)
    func returnsTheValueComputedOnTheLoopsThread(kind: EventBackendKind) throws {
        let worker = try LoopThread.start(backend: kind)
        defer { worker.stop(); try? worker.join() }
        let (value, thread) = worker.loop.performAndWait { (6 * 7, NativeThread.current.id) }
        #expect(value == 42)
        #expect(thread == worker.thread.id)
    }

    @Test func rethrowsTheBlocksErrorWithItsType() throws {
        struct Refused: Error, Equatable { let code: Int }
        let worker = try LoopThread.start()
        defer { worker.stop(); try? worker.join() }
        #expect(throws: Refused(code: 7)) {
            try worker.loop.performAndWait { () throws(Refused) -> Int in throw Refused(code: 7) }
        }
    }

    @Test func aNonSendableValueAndCaptureNeedNoBox() throws {
        final class Tally { var count = 0 }
        let worker = try LoopThread.start()
        defer { worker.stop(); try? worker.join() }
        let tally = Tally()
        var local = 1
        let result = worker.loop.performAndWait { () -> Tally in
            tally.count += local
            local += 1
            return tally
        }
        #expect(result === tally)
        #expect(tally.count == 1)
        #expect(local == 2, "the caller sees what the block wrote")
    }

    @Test func onTheLoopsOwnThreadItRunsAtOnce() throws {
        let worker = try LoopThread.start()
        defer { worker.stop(); try? worker.join() }
        let nested = worker.loop.performAndWait {
            // A wait for the loop's own next pass would never end.
            worker.loop.performAndWait { worker.loop.isCurrent }
        }
        #expect(nested)
    }

    @Test func waitsForAPassInTheGivenModes() throws {
        let worker = try LoopThread.start()
        defer { worker.stop(); try? worker.join() }
        let custom = LoopMode("performAndWait.custom")
        // Only the default mode runs; `.common` includes it.
        #expect(worker.loop.performAndWait(inModes: [.default]) { 1 } == 1)
        #expect(worker.loop.performAndWait(inModes: [.default, custom]) { 2 } == 2)
    }

    @Test func theQueueingPerformDoesNotWait() throws {
        let worker = try LoopThread.start()
        defer { worker.stop(); try? worker.join() }
        let ran = Semaphore(value: 0)
        #expect(worker.loop.perform { ran.signal() })
        #expect(worker.loop.perform(inModes: [.default]) { ran.signal() })
        #expect(ran.wait(timeout: .seconds(30)) == .completed)
        #expect(ran.wait(timeout: .seconds(30)) == .completed)
    }

    @Test func aLoopWhoseThreadHasExitedStopsWithAMessage() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            blocking {
                let worker = try! LoopThread.start()
                let loop = worker.loop
                worker.stop()
                try! worker.join()
                _ = loop.performAndWait { 1 }
            }
        }
        let stderr = String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("ThreadLoop.performAndWait"))
        #expect(stderr.contains("thread has exited"))
    }
}
