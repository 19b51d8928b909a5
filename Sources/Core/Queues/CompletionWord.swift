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
    func wait(until deadline: MonotonicClock.Instant, isDone: (UInt32) -> Bool) -> WaitResult {
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

/// Closures to submit to queues once something is done, behind a short lock
/// whose word lives in the owner's block of stable words (beside its
/// completion word), and with the first closure kept inline: a group or
/// item that gets one notification allocates nothing here beyond this
/// object (a skynet tree makes 111,111 groups, each notified once).
final class PendingNotifications: @unchecked Sendable {
    // @unchecked: `first` and `more` are guarded by `lock`.
    private let lock: PlainFutexMutex
    private var first: (WorkQueue, @Sendable () -> Void)?
    private var more: [(WorkQueue, @Sendable () -> Void)] = []

    /// `lockWord`: a zeroed word in the owner's stable words, which outlive
    /// this object.
    init(lockWord: UnsafeMutablePointer<UInt32>) {
        lock = PlainFutexMutex(word: lockWord)
    }

    /// Submits `body` to `queue` now if `isDone()` (checked under the lock),
    /// else keeps it for `fire()`.
    func add(_ body: @escaping @Sendable () -> Void, on queue: WorkQueue, isDone: () -> Bool) {
        lock.lock()
        if isDone() {
            lock.unlock()
            queue.async(body)
            return
        }
        if first == nil { first = (queue, body) } else { more.append((queue, body)) }
        lock.unlock()
    }

    /// Submits every closure kept so far, in the order added. Call after
    /// making `isDone()` true: a closure added meanwhile either sees it done
    /// or is taken here.
    func fire() {
        lock.lock()
        let head = first.take()
        let rest = more
        more = []
        lock.unlock()
        if let (queue, body) = head { queue.async(body) }
        for (queue, body) in rest { queue.async(body) }
    }
}
