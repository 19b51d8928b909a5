/// A job made of one or more closures, the guide's block operation: when it
/// runs, its closures run concurrently (the first on the job's own thread,
/// the others on pool workers of the job's band), and the job finishes when
/// the last has returned, like a join. (Foundation's `BlockOperation` on
/// Linux runs them one after another on one thread.) There is no order among
/// the closures; for an order, use dependencies between jobs or a serial
/// `WorkQueue`.
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
    // @unchecked: `closures` is guarded by `closureLock`; the rest as `Job`.

    private let closureLock = GuardLock()
    private var closures: [@Sendable () throws -> Void]

    /// A job running `body` (more may be added with `addClosure(_:)`).
    public init(name: String? = nil, _ body: @escaping @Sendable () throws -> Void) {
        closures = [body]
        super.init(name: name)
    }

    /// A job running each of `bodies` concurrently (none: it does nothing).
    public init(name: String? = nil, _ bodies: [@Sendable () throws -> Void]) {
        closures = bodies
        super.init(name: name)
    }

    /// Adds a closure to run with the others. Never blocks. Stops the process
    /// if the job has started or finished.
    public func addClosure(_ body: @escaping @Sendable () throws -> Void) {
        closureLock.lock()
        guard bits & Bit.started == 0 else {
            closureLock.unlock()
            misuse("ClosureJob.addClosure(_:): \(self) has already started; closures are added before it starts")
        }
        closures.append(body)
        closureLock.unlock()
    }

    /// The closures, in the order added. Takes a short lock.
    public var closureCount: Int {
        closureLock.lock()
        defer { closureLock.unlock() }
        return closures.count
    }

    /// Runs the closures concurrently and returns when all have; rethrows
    /// the first error thrown. Blocks (a blocking region on a pool worker)
    /// while other workers run the rest.
    public override func main() throws {
        closureLock.lock()
        let all = closures
        closureLock.unlock()
        guard all.count > 1 else {
            try all.first?()
            return
        }
        let firstError = LockedValue<(any Error)?>(nil)
        let group = WorkGroup()
        let queue = WorkQueue.global(frozenWorkPriority)
        for body in all.dropFirst() {
            queue.async(group: group) {
                do { try body() } catch { firstError.withLock { if $0 == nil { $0 = error } } }
            }
        }
        do { try all[0]() } catch { firstError.withLock { if $0 == nil { $0 = error } } }
        group.wait()
        if let error = firstError.withLock({ $0 }) { throw error }
    }
}
