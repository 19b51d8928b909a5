/// Work queues as Swift concurrency executors.
///
/// - A **serial** queue is a `SerialExecutor`: an actor whose
///   `unownedExecutor` is the queue's runs its jobs on the queue, one at a
///   time, in order, interleaved with the queue's other items; the isolation
///   checks (`checkIsolated`, `isIsolatingCurrentContext`) say whether the
///   calling code runs on the queue, so `assumeIsolated` works inside its
///   items and stops the process elsewhere.
/// - Every queue is a `TaskExecutor`: `Task(executorPreference:)` and
///   `withTaskExecutorPreference` with `WorkQueue.global()` run a task's
///   nonisolated code on Spindle's worker pool.
///
/// Enqueuing a job stores it by value in the queue's ring (or the pool's):
/// no allocation beyond what Swift made for the job. A job enqueued from an
/// item of its own queue's pool goes to the submitting worker's ring (no
/// thread hop while that worker is free).
extension WorkQueue: SerialExecutor, TaskExecutor {
    /// Queues `job`. Never blocks. Stops the process when a concurrent queue
    /// is used as an actor's serial executor (it would run the actor's jobs
    /// at once); as a task executor any queue serves.
    public func enqueue(_ job: consuming ExecutorJob) {
        submit(.job(UnownedJob(job), self))
    }

    /// The queue as an actor's executor. Stops the process for a concurrent
    /// queue, which cannot keep an actor's jobs one at a time.
    public func asUnownedSerialExecutor() -> UnownedSerialExecutor {
        require(
            kind == .serial,
            "WorkQueue.asUnownedSerialExecutor(): '\(label)' is concurrent; only a serial queue can be an actor's executor (use a concurrent queue as a TaskExecutor)")
        return UnownedSerialExecutor(ordinary: self)
    }

    /// Stops the process with a message naming the queue unless the calling
    /// code runs on it (Swift calls this for `assumeIsolated` and isolation
    /// checks).
    public func checkIsolated() {
        if !isCurrent {
            let running = QueueFrame.innermost.map { "'\($0.label)'" } ?? "no queue"
            misuse("WorkQueue.checkIsolated(): code isolated to '\(label)' runs on \(running)")
        }
    }

    /// Whether the calling code runs on this queue (an item of it, or of a
    /// queue whose target chain reaches it).
    public func isIsolatingCurrentContext() -> Bool? {
        isCurrent
    }

    /// Runs a job taken from the ring: isolated to this queue when it is
    /// serial, with this queue as its task executor either way.
    func runJob(_ job: UnownedJob) {
        if kind == .serial {
            job.runSynchronously(
                isolatedTo: UnownedSerialExecutor(ordinary: self), taskExecutor: asUnownedTaskExecutor())
        } else {
            job.runSynchronously(on: asUnownedTaskExecutor())
        }
    }
}
