import Spindle
import Testing
import TestSupport

/// What another thread wrote before it resumed a task is visible to the
/// task, and ThreadSanitizer sees the hand-over: plain (unsynchronized)
/// memory written on a pool worker or a loop's thread and read by the task
/// after the await. The Swift runtime tells ThreadSanitizer of a resume
/// only when the task had suspended first; a pool worker often resumes the
/// continuation before that, and then, without Spindle's own edge, the
/// ThreadSanitizer pass of `scripts/test` reported these reads as races
/// (seen in CI: `LoopThread.start` from async code, 2026-11-27). Many
/// rounds, so that both orders of resume and suspension occur.
@Suite("Async hand-overs")
struct AsyncHandOverTests {
    /// A value with plain stored properties, made on one thread and read on
    /// another.
    final class Made: @unchecked Sendable {
        // @unchecked: written before the hand-over, read after it.
        var value: Int
        var text: String
        init(_ value: Int) {
            self.value = value
            self.text = "made \(value)"
        }
    }

    @Test func anObjectMadeByAQueuesBodyIsTheTasks() async throws {
        let queue = WorkQueue(label: "hand-over")
        for round in 0..<2_000 {
            let made = try await queue.performReturning { Made(round) }
            #expect(made.value == round && made.text == "made \(round)")
        }
    }

    @Test func anObjectMadeOnALoopsThreadIsTheTasks() async throws {
        let worker = try await LoopThread.start(name: "hand-over")
        for round in 0..<2_000 {
            let made = try await worker.loop.performReturning { Made(round) }
            #expect(made.value == round && made.text == "made \(round)")
        }
        worker.stop()
        try await worker.join()
    }

    @Test func whatAGroupsItemsWroteIsSeenAfterTheAsyncWait() async throws {
        let box = UnsafeBox(0)
        for round in 1...2_000 {
            let group = WorkGroup()
            WorkQueue.global().async(group: group) { box.value = round }
            try await group.wait()
            #expect(box.value == round)
        }
    }

    @Test func whatASignallerWroteIsSeenAfterTheAsyncSemaphoreWait() async throws {
        let box = UnsafeBox(0)
        let semaphore = Semaphore(value: 0)
        for round in 1...2_000 {
            WorkQueue.global().async {
                box.value = round
                _ = semaphore.signal()
            }
            try await semaphore.wait()
            #expect(box.value == round)
        }
    }
}
