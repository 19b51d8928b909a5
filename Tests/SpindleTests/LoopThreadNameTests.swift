import Spindle
import Testing
import TestSupport

/// `LoopThread.start(name:)`, and the name of a loop thread started without
/// one: never the name Linux copies from the creating thread.
@Suite("LoopThread names")
struct LoopThreadNameTests {
    /// The kernel name of `worker`'s thread, read on that thread.
    private func kernelName(_ worker: LoopThread) -> String? {
        worker.loop.performAndWait { NativeThread.current.name }
    }

    @Test func startNameNamesTheThread() throws {
        let worker = try LoopThread.start(name: "ticker")
        #expect(kernelName(worker) == "ticker")
        #expect(worker.thread.name == "ticker")
        worker.stop()
        try worker.join()
    }

    @Test func startNameTakesThePlaceOfTheAttributesName() throws {
        let worker = try LoopThread.start(NativeThread.Attributes(name: "from-attrs"), name: "from-start")
        #expect(kernelName(worker) == "from-start")
        worker.stop()
        try worker.join()
    }

    @Test func unnamedLoopThreadDoesNotInheritItsCreatorsName() throws {
        // The creator is a thread of our own, with a name of its own, so that
        // the inherited name could not be the default by chance.
        let seen = LockedValue<String?>(nil)
        let creator = try NativeThread.start(NativeThread.Attributes(name: "creator-xyz")) { () throws -> Void in
            #expect(NativeThread.current.name == "creator-xyz")
            let worker = try LoopThread.start()
            seen.withLock { $0 = kernelName(worker) }
            worker.stop()
            try worker.join()
        }
        try creator.join()
        #expect(seen.withLock { $0 } == LoopThread.defaultName)
        #expect(LoopThread.defaultName == "LoopThread")
    }

    @Test func aNameOverFifteenBytesIsRefused() {
        #expect(throws: NativeThreadError.self) {
            _ = try LoopThread.start(name: "a-name-much-too-long-for-linux")
        }
    }

    @Test func asyncStartAndJoin() async throws {
        let worker = try await LoopThread.start(name: "async-loop")
        let name = try await worker.loop.performReturning { NativeThread.current.name }
        #expect(name == "async-loop")
        worker.stop()
        try await worker.join()
    }
}
