import CShims

/// Told when the thread it is installed on enters and leaves a blocking
/// wait. Spindle's worker pool (the Queues layer) installs one on each of its
/// workers so that a work item that waits (for a condition, a semaphore, a
/// join, a group: possibly for an item queued behind it) does not hold a
/// worker's share of the CPUs while it sleeps: the pool may start another
/// worker in its place. The blocking calls live below the Queues layer, so
/// they reach the pool only through this hook.
///
/// One per thread, in a C thread-local (`cshims_blocking_observer`), held
/// unretained: the installer keeps the observer alive while it is installed.
/// Both methods run on the blocking thread, outside any Spindle lock the
/// waiter holds internally, and must not block themselves.
class BlockingObserver {
    /// The thread is about to sleep in a blocking wait.
    func willBlock() {}
    /// The thread's blocking wait has ended.
    func didUnblock() {}

    /// Installs `observer` on the calling thread (nil removes it).
    static func install(_ observer: BlockingObserver?) {
        cshims_set_blocking_observer(observer.map { Unmanaged.passUnretained($0).toOpaque() })
    }
}

/// Runs `body`, a wait that may block for long, announced to the calling
/// thread's `BlockingObserver` if it has one. Nested regions announce once:
/// the observer is taken off the thread for the duration. Costs one
/// thread-local load on a thread without an observer.
@inline(__always)
func announcingBlocking<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
    guard let raw = cshims_blocking_observer() else { return try body() }
    let observer = Unmanaged<BlockingObserver>.fromOpaque(raw).takeUnretainedValue()
    cshims_set_blocking_observer(nil)
    observer.willBlock()
    defer {
        observer.didUnblock()
        cshims_set_blocking_observer(raw)
    }
    return try body()
}

/// Tells Spindle's worker pool that `body` will block: a read from a pipe,
/// a `ThreadLoop` run, a foreign lock or any wait Spindle cannot see. On a
/// pool worker, the pool may start another worker while `body` runs, so that
/// items queued behind this one still run (and an item waiting for a later
/// item cannot deadlock the pool). Elsewhere it only runs `body`.
///
/// Spindle's own waits (`Semaphore`, `Condition`, `ConditionVariable`,
/// `ConditionLock` waiting for a condition, `Once` waiting for another
/// thread's initializer, `SpawnedThread.join`, and the waits of `WorkQueue`,
/// `WorkGroup` and `WorkItem`) announce themselves; a contended `Lock` does
/// not, because its holder is running and a replacement would only add a
/// contender. Nesting is allowed and announces once. Returns what `body`
/// returns, rethrows what it throws. Orders nothing in memory.
public func withBlockingRegion<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
    try announcingBlocking(body)
}
