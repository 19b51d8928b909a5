/// A unit submitted with `WorkQueue.async(after:)` (or a job the global
/// executor holds until an instant), waiting for its deadline in the pool
/// poller's timer heap (`TimerQueue.shared`), beside the timer sources on
/// work queues: one heap, one deadline, waited for by the idle worker that
/// holds the poller (or, while every worker computes, polled by the
/// watchdog). When the deadline comes, the thread that found it submits the
/// unit to its queue.
///
/// It is its own heap slot: a delayed `WorkItem` that is cancelled takes
/// its entry out of the heap at once (`cancel`), and the item is finished
/// then rather than at its deadline. Delayed submissions survive `fork()`
/// (see `TimerQueue.childAfterFork`).
final class DelayedSubmission: TimerQueue.DelayedSlot, @unchecked Sendable {
    // @unchecked: immutable but for the slot's index, which the heap's lock
    // guards.

    private let queue: WorkQueue
    private let unit: WorkUnit

    private init(_ unit: WorkUnit, on queue: WorkQueue) {
        self.queue = queue
        self.unit = unit
    }

    /// Holds `unit` for `queue` until `deadline`, then submits it (at once if
    /// the deadline has passed, from the next poll of the heap). Never
    /// blocks beyond the heap's lock. A `WorkItem` records the entry, for its
    /// `cancel`.
    /// Stops the process, naming `api`, when the kernel refuses the poller
    /// its epoll instance (out of descriptors).
    static func schedule(
        _ unit: WorkUnit, on queue: WorkQueue, at deadline: MonotonicClock.Instant, api: StaticString
    ) {
        let made = DelayedSubmission(unit, on: queue)
        // Recorded first: a `cancel` from now on takes the entry out, or
        // finds it not yet in the heap and leaves the item to be skipped
        // when it runs.
        if case .item(let item) = unit { item.noteDelayed(made) }
        do throws(SystemCallError) {
            try TimerQueue.shared.schedule(made, due: deadline.nanoseconds, latest: deadline.nanoseconds)
        } catch {
            misuse("\(api): the pool's poller cannot wait for the deadline: \(error)")
        }
    }

    /// Takes the entry out of the heap if it has not fired: true if so (the
    /// unit will never be submitted).
    func cancel() -> Bool {
        TimerQueue.shared.remove(self)
    }

    /// The deadline came (on the poller's holder, or the watchdog's thread).
    override func fire() {
        // An item forgets this entry (the reference it kept for `cancel`).
        if case .item(let item) = unit { _ = item.takeDelayed() }
        queue.submit(unit)
    }

    /// How many delayed submissions wait in the heap.
    static var pendingCount: Int { TimerQueue.shared.delayedCount }
}
