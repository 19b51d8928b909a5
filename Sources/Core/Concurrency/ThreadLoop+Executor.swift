/// A run loop as an actor's executor, the way the main actor is bound to the
/// main thread: an actor whose `unownedExecutor` is a loop's runs its jobs
/// on the loop's thread, in order, as performs in the loop's common modes.
/// The isolation checks say whether the calling code runs on that thread, so
/// `assumeIsolated` works there and stops the process elsewhere.
///
/// Jobs are kept by value in an array the loop swaps out per pass: no
/// allocation beyond Swift's once it has grown. Jobs still queued when the
/// loop's thread exits run on it then. A job enqueued after the thread has
/// exited can never run; enqueuing it stops the process with a message
/// rather than leaving its task suspended forever.
extension ThreadLoop: SerialExecutor {
    /// Queues `job` to run on the loop's thread; wakes the loop if it sleeps.
    /// Never blocks.
    public func enqueue(_ job: consuming ExecutorJob) {
        if !enqueueJob(UnownedJob(job)) {
            misuse("ThreadLoop.enqueue(_:): \(self)'s thread has exited; a job sent to it would never run")
        }
    }

    /// The loop as an actor's executor.
    public func asUnownedSerialExecutor() -> UnownedSerialExecutor {
        UnownedSerialExecutor(ordinary: self)
    }

    /// Stops the process with a message unless called on the loop's thread.
    public func checkIsolated() {
        if !isCurrent { misuse("ThreadLoop.checkIsolated(): code isolated to \(self) runs on another thread") }
    }

    /// Whether the calling code runs on the loop's thread.
    public func isIsolatingCurrentContext() -> Bool? {
        isCurrent
    }
}
