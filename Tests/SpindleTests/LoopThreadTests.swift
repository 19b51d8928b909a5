import Spindle
import Testing
import TestSupport

/// An error a loop thread's body throws, to check that it reaches `join`.
private struct BodyFailed: Error, Equatable {}

@Suite("LoopThread")
struct LoopThreadTests {
    @Test(arguments: availableBackends)
    func runsItsLoopOnItsOwnThreadUntilStopped(kind: EventBackendKind) throws {
        let worker = try LoopThread.start(backend: kind)
        #expect(worker.loop.backendKind == kind)
        #expect(!worker.loop.isCurrent)
        let ranOn = LockedValue<Int32?>(nil)
        // The loop sleeps (nothing to do) and the perform wakes it.
        #expect(worker.loop.perform(waitUntilDone: true) { ranOn.withLock { $0 = NativeThread.current.id } })
        #expect(ranOn.withLock { $0 } == worker.thread.id)
        worker.stop()
        try worker.join()
    }

    @Test func stopBeforeTheLoopRunsStillEndsIt() throws {
        let worker = try LoopThread.start()
        worker.stop()
        worker.stop()
        try worker.join()
    }

    @Test func threadAttributesApply() throws {
        let worker = try LoopThread.start(NativeThread.Attributes(name: "loop-worker"))
        let name = LockedValue<String?>(nil)
        worker.loop.perform(waitUntilDone: true) { name.withLock { $0 = NativeThread.current.name } }
        #expect(name.withLock { $0 } == "loop-worker")
        #expect(worker.description.hasPrefix("LoopThread("))
        worker.stop()
        try worker.join()
    }

    /// A start that fails says why in `NativeThreadError` (typed: the catch
    /// below compares without a cast), and leaves no thread behind.
    @Test func aFailedStartThrowsItsTypedReason() {
        do {
            _ = try LoopThread.start(NativeThread.Attributes(name: "a-name-of-16-byt"))
            Issue.record("a 16-byte name started a loop thread")
        } catch {
            #expect(error == .nameTooLong(bytes: 16, limit: 15))
        }
    }

    /// The guide's Listing 2-3: a job that runs its loop for one pass
    /// between chunks of work, stopped by a perform from another thread.
    @Test func aBodyOfItsOwnPollsTheLoop() throws {
        let exitNow = LockedValue(false)
        let chunks = LockedValue(0)
        let worker = try LoopThread.start { loop in
            while !exitNow.withLock({ $0 }) {
                chunks.withLock { $0 += 1 }
                loop.run(mode: .default, timeout: .zero)
            }
        }
        worker.loop.perform { exitNow.withLock { $0 = true } }
        try worker.join()
        #expect(chunks.withLock { $0 } >= 1)
        #expect(exitNow.withLock { $0 })
    }

    @Test func anErrorFromTheBodyReachesJoin() throws {
        let worker = try LoopThread.start { _ in throw BodyFailed() }
        #expect(throws: BodyFailed()) { try worker.join() }
    }

    @Test func aDetachedLoopThreadIsRefused() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            _ = blocking { try? LoopThread.start(NativeThread.Attributes(isDetached: true)) }
        }
        let message = String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
        #expect(message.contains("LoopThread.start: `attributes.isDetached` is true"))
    }
}
