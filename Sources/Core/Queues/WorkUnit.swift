/// One submission as queues and the pool hold it: the caller's closure and
/// at most one reference, stored by value (32 bytes), so that queuing it
/// allocates nothing beyond the closure's own context.
///
/// Why not an intrusive list: a Swift closure is two words (function and
/// context) with no room for a link, and a node or box per submission is
/// the allocation the queues promise not to make. So units live by value in
/// rings: a queue's own ring and the pool's injector under short, mostly
/// uncontended locks (`WorkRing`), and each worker's ring lock-free
/// (`StealableRing`, whose index protocol keeps a thief's 32-byte copies
/// apart from the owner's writes).
enum WorkUnit {
    /// A closure submitted with `async`.
    case closure(@Sendable () -> Void)
    /// A closure submitted with `async(group:)`: the group is left after it
    /// ran. Unretained: a group with members keeps itself alive (see
    /// `WorkGroup.enter`), so a fan-out costs no reference counting on the
    /// group object that every worker shares.
    case grouped(@Sendable () -> Void, Unmanaged<WorkGroup>)
    /// A barrier closure (private concurrent queues): runs alone.
    case barrier(@Sendable () -> Void, WorkGroup?)
    /// A `WorkItem` (which knows its own flags and group).
    case item(WorkItem)
    /// "Run some of this queue's items": how a queue's items reach its target.
    /// With the fork epoch it was scheduled in (`cshims_fork_epoch`): a
    /// drain the parent scheduled is void in a child after `fork()`, which
    /// recounts the queue's drains (see `WorkQueue.repairAfterFork`).
    case drain(WorkQueue, UInt32)
    /// A Swift concurrency job enqueued on the queue as an executor.
    case job(UnownedJob, WorkQueue)
    /// A job of Swift's global concurrent executor, once Spindle's pool is
    /// installed as that executor (`SpindleConcurrency`): it runs with the
    /// installed executor (given with it) as its task executor, not with a
    /// queue.
    case globalJob(UnownedJob, UnownedTaskExecutor)

    /// Whether the unit must run alone on its queue.
    var isBarrier: Bool {
        switch self {
        case .barrier: true
        case .item(let item): item.isBarrier
        default: false
        }
    }

    /// Runs the unit on the calling thread (inside the queue frame the caller
    /// set up) and leaves its group, if any.
    @inline(__always)
    func run() {
        switch self {
        case .closure(let body):
            body()
        case .grouped(let body, let group):
            body()
            group._withUnsafeGuaranteedRef { $0.leave() }
        case .barrier(let body, let group):
            body()
            group?.leave()
        case .item(let item):
            item.execute()
        case .drain(let queue, let epoch):
            queue.drain(scheduledIn: epoch)
        case .job(let job, let queue):
            queue.runJob(job)
        case .globalJob(let job, let executor):
            job.runSynchronously(on: executor)
        }
    }

    /// What happens to a unit that will never run (its queue went away while
    /// suspended): its group is left, so that nobody waits for it forever; a
    /// work item is marked cancelled and finishes.
    func discard() {
        switch self {
        // A job's unit holds its queue, so a queue with jobs in its ring is
        // never released: a suspended queue keeps its jobs until resumed.
        case .closure, .drain, .job, .globalJob: break
        case .grouped(_, let group): group._withUnsafeGuaranteedRef { $0.leave() }
        case .barrier(_, let group): group?.leave()
        case .item(let item): item.discardUnrun()
        }
    }
}
