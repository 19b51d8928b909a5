import Synchronization

/// A unit of work you keep a handle on: submit it to a queue (or run it
/// with `perform()`), cancel it before it starts, wait for it, or have a
/// closure submitted when it is done. The guide's block object with
/// Dispatch's cancellation and notification.
///
/// Replaces Dispatch's `DispatchWorkItem`.
///
/// A work item runs at most once: submitting or performing it a second time
/// stops the process with a message. One cancelled before it starts never
/// runs its closure; it is done when its queue reaches it (or at once, if it
/// was never submitted), and its notifications still run. Cancelling a
/// running item only sets `isCancelled`, which the closure may check.
///
/// Thread-safe. Memory: what the closure wrote is visible after `wait`
/// returns and to notification closures.
public final class WorkItem: @unchecked Sendable {
    // @unchecked: `state` is atomic; `notifications` synchronizes itself;
    // the rest is immutable.

    private enum State {
        static let submitted: UInt32 = 1
        static let started: UInt32 = 2
        static let finished: UInt32 = 4
        static let cancelled: UInt32 = 8
        static let waiters: UInt32 = 16
    }

    private let body: @Sendable () -> Void
    /// Whether the item runs as a barrier on a concurrent queue.
    public let isBarrier: Bool
    /// The state word, then the notifications' lock word, in one line.
    private let state: UnsafeMutablePointer<UInt32>
    private let notifications: PendingNotifications
    /// While the item waits for its deadline (`WorkQueue.async(after:_:)`
    /// of an item): its retained `DelayedSubmission`, so that `cancel` can
    /// take it out of the timer heap; else 0.
    private let delayed = Atomic<UInt>(0)

    /// A work item running `body`; with `barrier`, it runs alone on a
    /// concurrent queue (see `WorkQueue.asyncBarrier`).
    public init(barrier: Bool = false, _ body: @escaping @Sendable () -> Void) {
        self.body = body
        isBarrier = barrier
        state = allocateStableWords(byteCount: 8).assumingMemoryBound(to: UInt32.self)
        notifications = PendingNotifications(lockWord: state + 1)
    }

    deinit { deallocateStableWords(UnsafeMutableRawPointer(state)) }

    /// Whether `cancel()` was called.
    public var isCancelled: Bool { AtomicMemory.load(from: state, ordering: .relaxed) & State.cancelled != 0 }

    /// Whether the item has run (or was skipped, cancelled).
    public var isFinished: Bool { AtomicMemory.load(from: state, ordering: .acquiring) & State.finished != 0 }

    /// Cancels the item: if it has not started, its closure never runs. Never
    /// blocks. An item cancelled before it was ever submitted, or while it
    /// waits for the deadline of `WorkQueue.async(after:_:)`, is finished at
    /// once (waiters return, notifications run), and in the second case
    /// leaves the pending timers at once too.
    public func cancel() {
        let before = AtomicMemory.orOriginal(State.cancelled, into: state, ordering: .acquiringAndReleasing)
        if before & State.cancelled != 0 { return }
        if before & State.submitted == 0 {
            finish()
        } else if let submission = takeDelayed(), submission.cancel() {
            // Out of the heap before it fired: it never reaches its queue.
            finish()
        }
    }

    /// Records the item's pending delayed submission (before it is in the
    /// heap).
    func noteDelayed(_ submission: DelayedSubmission) {
        delayed.store(UInt(bitPattern: Unmanaged.passRetained(submission).toOpaque()), ordering: .releasing)
    }

    /// Forgets the pending delayed submission (it fired, or is cancelled
    /// now): returns it if it was still recorded.
    func takeDelayed() -> DelayedSubmission? {
        let raw = delayed.exchange(0, ordering: .acquiringAndReleasing)
        guard raw != 0, let pointer = UnsafeRawPointer(bitPattern: raw) else { return nil }
        return Unmanaged<DelayedSubmission>.fromOpaque(pointer).takeRetainedValue()
    }

    /// Runs the item on the calling thread now. Stops the process if it was
    /// already submitted or performed. A cancelled item does not run.
    public func perform() {
        markSubmitted("WorkItem.perform()", to: nil)
        execute()
    }

    /// Claims the item's one run, or stops the process.
    func markSubmitted(_ api: String, to queue: WorkQueue?) {
        let before = AtomicMemory.orOriginal(State.submitted, into: state, ordering: .relaxed)
        if before & State.submitted != 0 {
            misuse("\(api): this WorkItem was already submitted or performed; a work item runs at most once")
        }
    }

    /// Runs the closure unless cancelled, then finishes.
    func execute() {
        let before = AtomicMemory.orOriginal(State.started, into: state, ordering: .acquiring)
        if before & State.cancelled == 0 { body() }
        finish()
    }

    /// The item's queue went away while suspended: it will never run.
    func discardUnrun() {
        _ = AtomicMemory.orOriginal(State.cancelled, into: state, ordering: .relaxed)
        finish()
    }

    private func finish() {
        // Releasing: pairs with the waiters' acquiring loads.
        let before = AtomicMemory.orOriginal(State.finished, into: state, ordering: .acquiringAndReleasing)
        if before & State.waiters != 0 { Futex(state).wakeAll() }
        notifications.fire()
    }

    /// Blocks until the item has finished. A blocking region on a pool worker.
    @available(*, noasync, message: "blocks the thread; in async code use `await wait()`")
    public func wait() {
        _ = wait(until: .distantFuture)
    }

    /// Blocks until the item has finished or `deadline` passes.
    @available(*, noasync, message: "blocks the thread; in async code use `await wait()`")
    public func wait(until deadline: MonotonicClock.Instant) -> WaitResult {
        CompletionWaiters(word: state, waitersBit: State.waiters).wait(until: deadline) {
            $0 & State.finished != 0
        }
    }

    /// Blocks until the item has finished or `timeout` has passed.
    @available(*, noasync, message: "blocks the thread; in async code use `await wait()`")
    public func wait(timeout: Duration) -> WaitResult {
        wait(until: MonotonicClock.now.advanced(by: timeout))
    }

    /// Submits `body` to `queue` once the item has finished (at once if it
    /// has). Never blocks.
    public func notify(on queue: WorkQueue, _ body: @escaping @Sendable () -> Void) {
        notifications.add(body, on: queue) { isFinished }
    }
}
