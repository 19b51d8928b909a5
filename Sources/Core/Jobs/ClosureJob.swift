/// A job made of one or more closures, the guide's block operation
/// (Foundation's `BlockOperation`): when it runs, its closures run
/// concurrently (the first on the job's own thread, the others on pool workers
/// of the job's band), and the job finishes when the last has returned, like a
/// join. (Foundation's `BlockOperation` on Linux runs them one after another
/// on one thread.) There is no order among the closures; for an order, use
/// dependencies between jobs or a serial `WorkQueue`.
///
/// A closure that throws does not stop the others; the job keeps the first
/// error thrown (by time) in `error`. Closures that should stop early on
/// cancellation check the job's `isCancelled` through a reference they
/// capture themselves.
///
/// Thread-safe; memory as `Job` (everything every closure wrote is visible
/// after the job finished). Misuse: `addClosure(_:)` after the job started
/// stops the process (Foundation's message is the same in spirit).
public final class ClosureJob: Job, @unchecked Sendable {
    // @unchecked: `first` and `more` are guarded by the job's own lock
    // (`mutex`), under which `start` also marks the job started; the rest as
    // `Job`.

    /// The first closure, kept apart so that a one-closure job (the common
    /// case) allocates no array.
    private var first: (@Sendable () throws -> Void)?
    private var more: [@Sendable () throws -> Void] = []

    /// A job running `body` (more may be added with `addClosure(_:)`).
    public init(name: String? = nil, _ body: @escaping @Sendable () throws -> Void) {
        first = body
        super.init(name: name)
    }

    /// A job running each of `bodies` concurrently (none: it does nothing).
    public init(name: String? = nil, _ bodies: [@Sendable () throws -> Void]) {
        first = bodies.first
        more = Array(bodies.dropFirst())
        super.init(name: name)
    }

    /// Adds a closure to run with the others. Never blocks. Stops the process
    /// if the job has started or finished.
    public func addClosure(_ body: @escaping @Sendable () throws -> Void) {
        mutex.lock()
        guard bits & Bit.started == 0 else {
            mutex.unlock()
            misuse("ClosureJob.addClosure(_:): \(self) has already started; closures are added before it starts")
        }
        if first == nil { first = body } else { more.append(body) }
        mutex.unlock()
    }

    /// How many closures the job runs. Takes the job's lock.
    public var closureCount: Int {
        mutex.lock()
        defer { mutex.unlock() }
        return (first == nil ? 0 : 1) + more.count
    }

    /// Runs the closures concurrently and returns when all have; rethrows
    /// the first error thrown. Blocks (a blocking region on a pool worker)
    /// while other workers run the rest.
    public override func main() throws {
        mutex.lock()
        let head = first
        let rest = more
        mutex.unlock()
        guard let head else { return }
        if rest.isEmpty { return try head() }
        let firstError = LockedValue<(any Error)?>(nil)
        let group = WorkGroup()
        let queue = WorkQueue.global(frozenWorkPriority)
        for body in rest {
            queue.async(group: group) {
                do { try body() } catch { firstError.withLock { if $0 == nil { $0 = error } } }
            }
        }
        do { try head() } catch { firstError.withLock { if $0 == nil { $0 = error } } }
        group.wait()
        if let error = firstError.withLock({ $0 }) { throw error }
    }
}
