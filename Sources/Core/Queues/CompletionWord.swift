/// The waiting and notification shared by `WorkGroup` and `WorkItem`: a
/// futex word whose owner decides when it means "done", a "someone sleeps"
/// bit in it so the finisher makes a system call only when needed, and the
/// closures to submit once done.
struct CompletionWaiters {
    let word: UnsafeMutablePointer<UInt32>
    let waitersBit: UInt32

    /// Blocks (a blocking region on a pool worker) until `isDone` holds for
    /// the word or `deadline` passes. Acquiring: sees what the finisher wrote
    /// before its releasing update of the word.
    func wait(until deadline: MonotonicClock.Instant, isDone: (UInt32) -> Bool) -> WorkWaitResult {
        if isDone(AtomicMemory.load(from: word, ordering: .acquiring)) { return .completed }
        return announcingBlocking {
            while true {
                let state = AtomicMemory.load(from: word, ordering: .acquiring)
                if isDone(state) { return .completed }
                if !deadline.isDistantFuture && MonotonicClock.now >= deadline { return .timedOut }
                if state & waitersBit == 0 {
                    let r = AtomicMemory.compareExchange(
                        expected: state, desired: state | waitersBit, at: word, ordering: .relaxed)
                    if !r.exchanged { continue }
                }
                _ = Futex(word).wait(expecting: state | waitersBit, until: deadline)
            }
        }
    }
}

/// Closures to submit to queues once something is done, behind a short lock.
final class PendingNotifications: @unchecked Sendable {
    // @unchecked: `entries` is guarded by `lock`.
    private let lock = GuardLock()
    private var entries: [(WorkQueue, @Sendable () -> Void)] = []

    /// Submits `body` to `queue` now if `isDone()` (checked under the lock),
    /// else keeps it for `fire()`.
    func add(_ body: @escaping @Sendable () -> Void, on queue: WorkQueue, isDone: () -> Bool) {
        lock.lock()
        if isDone() {
            lock.unlock()
            queue.async(body)
            return
        }
        entries.append((queue, body))
        lock.unlock()
    }

    /// Submits every closure kept so far. Call after making `isDone()` true:
    /// a closure added meanwhile either sees it done or is taken here.
    func fire() {
        lock.lock()
        let due = entries
        entries = []
        lock.unlock()
        for (queue, body) in due { queue.async(body) }
    }
}
