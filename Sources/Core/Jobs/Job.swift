/// A unit of work with a life of its own, the guide's operation object: it
/// can wait for other jobs (dependencies, across queues), be cancelled,
/// report its state to observers, keep the error its work threw, and run a
/// completion handler. Run it on a `JobQueue` (the usual way: the queue
/// gives it a pool worker) or by hand with `start()`.
///
/// Replaces Foundation's `Operation`.
///
/// ## Two shapes of custom job
/// - **Synchronous** (the default): subclass and override `main()`. The job
///   is executing while `main()` runs and finished when it returns (or
///   throws: the error is kept in `error`). Check `isCancelled` in long
///   loops and return early.
/// - **Asynchronous**: also override `isAsynchronous` to return true.
///   `main()` then only *starts* the work (on another queue, a thread, an
///   I/O callback) and returns; the job stays executing until the work calls
///   `finish(throwing:)`. It must call it even when it sees `isCancelled`, or
///   its dependents, waiters and queue slot wait forever.
///
/// For closures instead of a subclass, see `ClosureJob`.
///
/// ## State
/// `state` is `pending`, `ready`, `executing` or `finished`; `isCancelled`
/// is a separate flag. Every change is reported to observers (`observe(_:)`,
/// `events`) exactly once, in order. A job with no unfinished dependency is
/// ready from the start. Cancelling a job that has not started makes it
/// ready at once and, when started, it finishes without running its work;
/// its dependents still run (finished includes cancelled).
///
/// ## Thread safety and memory
/// Every member may be used from any thread. The job's work (`main()`)
/// sees everything its dependencies' work wrote, and everything written
/// before the job was added to a queue or started; `waitUntilFinished()`,
/// completion handlers and dependents see everything the work wrote
/// (acquire/release through the job's internal lock and state word).
///
/// ## Misuse
/// Stops the process with a message naming the job: `start()` on a job that
/// is not ready, already started, finished or in a queue; a dependency that
/// closes a cycle (the message lists the cycle) or is added after the job
/// started; `finish(throwing:)` on a synchronous job, one not executing or
/// one already finished; changing priorities or the completion handler
/// after the job was queued or started; a thread priority outside 0...1.
open class Job: @unchecked Sendable, CustomStringConvertible {
    // @unchecked: the mutable fields below are each guarded by the lock the
    // comment beside them names: the job's own `mutex`, `JobGraph.lock` or
    // the lock of the `JobQueue` the job is in; the state word is atomic.

    /// Bits of the state word (`words[1]`). Changed only holding `mutex`,
    /// with atomic read-modify-writes (a waiter sets `waiters` without the
    /// lock); read anywhere with an acquiring load.
    enum Bit {
        static let ready: UInt32 = 1
        static let executing: UInt32 = 2
        static let finished: UInt32 = 4
        static let cancelled: UInt32 = 8
        /// `start` claimed the job's one run.
        static let started: UInt32 = 16
        /// Finished, completion handler run: what `waitUntilFinished` waits for.
        static let done: UInt32 = 32
        /// A thread sleeps on the word waiting for `done`.
        static let waiters: UInt32 = 64
        /// The job was added to a queue.
        static let queued: UInt32 = 128
    }

    /// Two words in a cache line of their own: the job's lock, the state.
    private let words: UnsafeMutablePointer<UInt32>
    @inline(__always) var mutex: PlainFutexMutex { PlainFutexMutex(word: words) }
    @inline(__always) var stateWord: UnsafeMutablePointer<UInt32> { words + 1 }

    // Guarded by `mutex`.
    private var unfinishedDependencies = 0
    private var dependents: [Job] = []
    /// Weak: the queue holds its jobs (and keeps itself alive while it has
    /// some and is not suspended); a strong reference back would keep a
    /// dropped suspended queue and its jobs alive for good.
    private weak var queueStorage: JobQueue?
    private var completion: (@Sendable () -> Void)?
    private var storedError: (any Error)?
    private var observers: [(id: Int, callback: @Sendable (Event) -> Void)] = []
    private var nextObserverID = 0
    private var undelivered: [Event] = []
    private var delivering = false
    private var nameStorage: String?
    /// What `done` still waits for once finished (see `complete`), and the
    /// queue to tell then.
    private var donePartsLeft = 0
    private var doneQueue: JobQueue?
    private var queuePriorityStorage: QueuePriority = .normal
    private var threadPriorityStorage = 0.5

    // Guarded by `JobGraph.lock`.
    var dependencyList: [Job] = []
    /// Edges ever added from other jobs to this one: 0 means no job depends
    /// on it, so no new dependency of it can close a cycle.
    var dependentEdges = 0

    // Guarded by the lock of the queue the job is in: its list of jobs,
    // and its ready list (`ReadyJobs`).
    var queueNext: Job?
    var queuePrevious: Job?
    var readyNext: Job?
    var isListedReady = false

    /// A new job, ready (it has no dependencies yet), with an optional name
    /// for descriptions and misuse messages. Never blocks.
    public init(name: String? = nil) {
        words = allocateStableWords(byteCount: 8).assumingMemoryBound(to: UInt32.self)
        AtomicMemory.store(Bit.ready, to: words + 1, ordering: .relaxed)
        nameStorage = name
    }

    deinit { deallocateStableWords(UnsafeMutableRawPointer(words)) }

    // MARK: What subclasses override

    /// The job's work. The base does nothing. Runs once, on the thread that
    /// starts the job (a pool worker of the job's band for a queued job), and
    /// only if the job was not cancelled before it started. A thrown error
    /// finishes the job and is kept in `error`. For an asynchronous job,
    /// `main()` starts the work and the work calls `finish(throwing:)`.
    open func main() throws {}

    /// Whether the job reports its own completion (`finish(throwing:)`)
    /// instead of finishing when `main()` returns. The base returns false.
    /// Read once, when the job starts.
    open var isAsynchronous: Bool { false }

    // MARK: Names

    /// The name given at creation or set later, for descriptions and misuse
    /// messages. Takes the job's lock.
    public var name: String? {
        get { withMutex { nameStorage } }
        set { withMutex { nameStorage = newValue } }
    }

    /// "'name'" or "Job(0x…)": how messages name the job.
    public var description: String {
        if let name { return "'\(name)'" }
        return "\(type(of: self))(\(ObjectIdentifier(self)))"
    }

    // MARK: State

    @inline(__always) var bits: UInt32 { AtomicMemory.load(from: stateWord, ordering: .acquiring) }

    /// The state now (stale at once unless the job is finished). Never
    /// blocks; an acquiring load: a `finished` reading sees the work's writes.
    public var state: State {
        let b = bits
        if b & Bit.finished != 0 { return .finished }
        if b & Bit.executing != 0 { return .executing }
        if b & Bit.ready != 0 { return .ready }
        return .pending
    }

    /// Whether `cancel()` was called before the job finished. One atomic
    /// load: cheap enough for every loop iteration of `main()`.
    public var isCancelled: Bool { bits & Bit.cancelled != 0 }
    /// Whether the job may start now (`state == .ready`).
    public var isReady: Bool { state == .ready }
    /// Whether the job is running its work.
    public var isExecuting: Bool { state == .executing }
    /// Whether the job has finished (cancelled jobs included).
    public var isFinished: Bool { bits & Bit.finished != 0 }

    /// The error `main()` threw, or the one passed to `finish(throwing:)`
    /// (for a `ClosureJob`, the first closure's to throw); nil while the job
    /// has not finished or when it finished without one. Takes the job's lock.
    public var error: (any Error)? { withMutex { storedError } }

    // MARK: Configuration (before the job is queued or started)

    /// The order among ready jobs of one queue. Set it before adding the job
    /// to a queue: setting it later stops the process.
    public var queuePriority: QueuePriority {
        get { withMutex { queuePriorityStorage } }
        set {
            mutex.lock()
            guard bits & (Bit.queued | Bit.started) == 0 else {
                mutex.unlock()
                misuse("Job.queuePriority: \(self) was already queued or started; set its priority before adding it to a queue")
            }
            queuePriorityStorage = newValue
            mutex.unlock()
        }
    }

    /// The guide's thread priority, 0.0 (lowest) … 1.0 (highest), default
    /// 0.5: a queued job runs on the worker band it maps to (below 0.25
    /// background, below 0.5 low, below 0.75 default, else high); the
    /// completion handler runs on the same worker. A job started by hand runs
    /// at the calling thread's priority. Set it before the job is queued or
    /// started; a later change, or a value outside 0...1, stops the process.
    public var threadPriority: Double {
        get { withMutex { threadPriorityStorage } }
        set {
            require((0.0...1.0).contains(newValue), "Job.threadPriority: \(newValue) is outside 0.0...1.0")
            mutex.lock()
            guard bits & (Bit.queued | Bit.started) == 0 else {
                mutex.unlock()
                misuse("Job.threadPriority: \(self) was already queued or started; set its thread priority before that")
            }
            threadPriorityStorage = newValue
            mutex.unlock()
        }
    }

    /// The worker band of `threadPriority`.
    public var workPriority: WorkQueue.Priority { Job.workPriority(forThreadPriority: threadPriority) }

    /// Runs once after the job finished (cancelled or not), with `isFinished`
    /// already true, on the thread that finished it, before
    /// `waitUntilFinished()` returns. Do not wait for the job inside it. Set
    /// it before the job starts: setting it on an executing or finished job
    /// stops the process (Foundation accepts it and never runs it).
    public var completionHandler: (@Sendable () -> Void)? {
        get { withMutex { completion } }
        set {
            mutex.lock()
            guard bits & Bit.started == 0 else {
                mutex.unlock()
                misuse("Job.completionHandler: \(self) has already started; set the completion handler before it starts")
            }
            completion = newValue
            mutex.unlock()
        }
    }

    // MARK: Dependencies

    /// The jobs this one waits for, in the order added. Takes the graph lock.
    public var dependencies: [Job] {
        JobGraph.lock.lock()
        defer { JobGraph.lock.unlock() }
        return dependencyList
    }

    /// Makes this job wait until `job` has finished (cancelled counts as
    /// finished): it is not ready before then. Works across queues. Adding
    /// the same dependency again does nothing; one that already finished only
    /// records the edge. Never blocks beyond short internal locks.
    ///
    /// Misuse stops the process: a dependency that closes a cycle (the
    /// message lists the jobs of the cycle), including a job on itself, and a
    /// dependency added to a job that already started.
    public func addDependency(_ job: Job) {
        if job === self {
            misuse("Job.addDependency(_:): \(self) cannot depend on itself (the cycle \(self) -> \(self))")
        }
        JobGraph.lock.lock()
        if dependencyList.contains(where: { $0 === job }) {
            JobGraph.lock.unlock()
            return
        }
        if dependentEdges > 0, let path = JobGraph.path(from: job, to: self) {
            JobGraph.lock.unlock()
            let cycle = ([self] + path).map(\.description).joined(separator: " -> ")
            misuse("Job.addDependency(_:): making \(self) depend on \(job) closes the cycle \(cycle) (each depends on the next); such jobs would never run")
        }
        // Nested job locks (this job, then the dependency) happen only here,
        // under the graph lock, so no other thread nests them: no deadlock.
        mutex.lock()
        if bits & Bit.started != 0 {
            mutex.unlock()
            JobGraph.lock.unlock()
            misuse("Job.addDependency(_:): \(self) has already started; add dependencies before it starts")
        }
        job.mutex.lock()
        let dependencyDone = job.bits & Bit.finished != 0
        if !dependencyDone { job.dependents.append(self) }
        job.mutex.unlock()
        var notify = false
        if !dependencyDone {
            unfinishedDependencies += 1
            let b = bits
            if b & Bit.ready != 0 && b & Bit.cancelled == 0 {
                AtomicMemory.and(~Bit.ready, into: stateWord, ordering: .releasing)
                notify = emitLocked(.pending)
            }
        }
        mutex.unlock()
        dependencyList.append(job)
        job.dependentEdges += 1
        JobGraph.lock.unlock()
        if notify { deliverEvents() }
    }

    /// Stops waiting for `job`; if it was the last unfinished dependency,
    /// the job becomes ready (and a queue holding it may start it). Removing
    /// a job that is not a dependency does nothing. Never blocks beyond short
    /// internal locks.
    public func removeDependency(_ job: Job) {
        JobGraph.lock.lock()
        guard let index = dependencyList.firstIndex(where: { $0 === job }) else {
            JobGraph.lock.unlock()
            return
        }
        dependencyList.remove(at: index)
        mutex.lock()
        job.mutex.lock()
        let counted = job.dependents.firstIndex(where: { $0 === self }).map { job.dependents.remove(at: $0) } != nil
        job.mutex.unlock()
        var becameReady = false
        var notify = false
        if counted {
            unfinishedDependencies -= 1
            (becameReady, notify) = becomeReadyIfFreeLocked()
        }
        let queue = queueStorage
        mutex.unlock()
        JobGraph.lock.unlock()
        if notify { deliverEvents() }
        if becameReady, let queue { queue.jobBecameReady(self) }
    }

    /// One dependency finished.
    private func dependencyFinished() {
        mutex.lock()
        unfinishedDependencies -= 1
        let (becameReady, notify) = becomeReadyIfFreeLocked()
        let queue = queueStorage
        mutex.unlock()
        if notify { deliverEvents() }
        if becameReady, let queue { queue.jobBecameReady(self) }
    }

    /// Pending with nothing left to wait for: ready. Under `mutex`.
    private func becomeReadyIfFreeLocked() -> (becameReady: Bool, notify: Bool) {
        let b = bits
        guard unfinishedDependencies == 0, b & (Bit.ready | Bit.started) == 0 else { return (false, false) }
        AtomicMemory.or(Bit.ready, into: stateWord, ordering: .releasing)
        return (true, emitLocked(.ready))
    }

    // MARK: Cancelling

    /// Asks the job to stop. Before it starts: it becomes ready at once (its
    /// dependencies no longer hold it back) and, when started, finishes
    /// without running its work; its completion handler and dependents still
    /// run. While it runs: only `isCancelled` turns true, for the work to
    /// check. After it finished, or a second time: nothing. Never blocks
    /// beyond short internal locks; never waits for the work. A subclass
    /// that overrides it (to stop its own I/O, say) must call `super.cancel()`.
    open func cancel() {
        mutex.lock()
        let b = bits
        guard b & (Bit.cancelled | Bit.finished) == 0 else {
            mutex.unlock()
            return
        }
        AtomicMemory.or(Bit.cancelled, into: stateWord, ordering: .releasing)
        var notify = emitLocked(.cancelled)
        var becameReady = false
        if b & (Bit.ready | Bit.started) == 0 {
            AtomicMemory.or(Bit.ready, into: stateWord, ordering: .releasing)
            notify = emitLocked(.ready) || notify
            becameReady = true
        }
        let queue = queueStorage
        mutex.unlock()
        if notify { deliverEvents() }
        if becameReady, let queue { queue.jobBecameReady(self) }
    }

    // MARK: Running

    /// Runs the job on the calling thread: a synchronous job's work runs now
    /// and `start()` returns when it has finished; an asynchronous job's
    /// `main()` starts its work and `start()` returns while it is executing.
    /// A cancelled job finishes at once without running. Blocks for as long
    /// as the work runs.
    ///
    /// Misuse stops the process with a message: the job is not ready (it
    /// names how many dependencies are unfinished), was already started or
    /// finished, or is in a queue (its queue starts it).
    public func start() {
        _ = run(byQueue: false)
    }

    /// Claims the job's run and runs it. A queue's claim fails quietly
    /// (returns false) when the job is no longer ready (a dependency was
    /// added after it was listed as ready) or another run claimed it.
    func run(byQueue: Bool) -> Bool {
        mutex.lock()
        let b = bits
        if !byQueue {
            var problem: String?
            if b & Bit.queued != 0 {
                problem = "is in a JobQueue, which starts it; do not start a queued job by hand"
            } else if b & Bit.finished != 0 {
                problem = "has already finished"
            } else if b & Bit.started != 0 {
                problem = "has already started"
            } else if b & Bit.ready == 0 {
                problem = "is not ready: \(unfinishedDependencies) of its dependencies have not finished"
            }
            if let problem {
                mutex.unlock()
                misuse("Job.start(): \(self) \(problem)")
            }
        } else if b & (Bit.ready | Bit.started) != Bit.ready {
            mutex.unlock()
            return false
        }
        if b & Bit.cancelled != 0 {
            // Straight to finished: the work never runs.
            AtomicMemory.or(Bit.started, into: stateWord, ordering: .relaxed)
            mutex.unlock()
            _ = complete(error: nil)
            return true
        }
        AtomicMemory.or(Bit.started | Bit.executing, into: stateWord, ordering: .releasing)
        let notify = emitLocked(.executing)
        mutex.unlock()
        if notify { deliverEvents() }
        let asynchronous = isAsynchronous
        do {
            try main()
            if !asynchronous { _ = complete(error: nil) }
        } catch {
            _ = complete(error: error)
        }
        return true
    }

    /// Ends an asynchronous job: it becomes finished (with `error`, if
    /// given), its dependents may start, its completion handler runs (on the
    /// calling thread, before this returns) and its waiters return. Call it
    /// exactly once, from any thread, even when the work stopped early
    /// because it saw `isCancelled`.
    ///
    /// Misuse stops the process: the job is synchronous (it finishes when
    /// `main()` returns), has not started, or has already finished.
    public func finish(throwing error: (any Error)? = nil) {
        let b = bits
        require(isAsynchronous, "Job.finish(throwing:): \(self) is synchronous; it finishes when main() returns")
        require(b & Bit.started != 0, "Job.finish(throwing:): \(self) has not started")
        if !complete(error: error) {
            misuse("Job.finish(throwing:): \(self) has already finished; an asynchronous job finishes once")
        }
    }

    /// Executing (or started and cancelled) to finished; false if it already
    /// was finished. Then releases dependents, the queue slot, the completion
    /// handler and the waiters, in that order.
    private func complete(error: (any Error)?) -> Bool {
        mutex.lock()
        var b = bits
        if b & Bit.finished != 0 {
            mutex.unlock()
            return false
        }
        if let error, storedError == nil { storedError = error }
        // Executing off and finished on in one step, so no reader sees both
        // (or neither).
        while true {
            let r = AtomicMemory.compareExchange(
                expected: b, desired: (b & ~Bit.executing) | Bit.finished, at: stateWord, ordering: .acquiringAndReleasing)
            if r.exchanged { break }
            b = r.original
        }
        // With observers, `done` waits for two things: this path's end, and
        // the delivery of `finished` (by this thread or by one delivering
        // the job's events now), so waiters return after observers heard it.
        let observed = !observers.isEmpty
        let notify = emitLocked(.finished)
        if observed {
            donePartsLeft = 2
            doneQueue = queueStorage
        }
        let released = dependents
        dependents = []
        let queue = queueStorage
        queueStorage = nil
        let handler = completion
        completion = nil
        mutex.unlock()
        if notify { deliverEvents() }
        for dependent in released { dependent.dependencyFinished() }
        queue?.jobFinished(self)
        handler?()
        if observed { donePartArrived() } else { markDone(queue) }
        return true
    }

    /// One of the two things `done` waits for in an observed job has
    /// happened; the second one marks it done.
    private func donePartArrived() {
        mutex.lock()
        donePartsLeft -= 1
        let last = donePartsLeft == 0
        let queue = last ? doneQueue : nil
        if last { doneQueue = nil }
        mutex.unlock()
        if last { markDone(queue) }
    }

    /// Sets `done`, wakes the waiters and tells the queue.
    private func markDone(_ queue: JobQueue?) {
        // Releasing: pairs with `waitUntilFinished`'s acquiring load.
        let before = AtomicMemory.orOriginal(Bit.done, into: stateWord, ordering: .acquiringAndReleasing)
        if before & Bit.waiters != 0 { _ = Futex(stateWord).wakeAll() }
        queue?.jobDone(self)
    }

    // MARK: Waiting

    /// Blocks until the job has finished and its completion handler has
    /// run. A blocking region on a pool worker (the pool may start another
    /// worker meanwhile). Acquiring: sees everything the work wrote. Waiting
    /// for a job from inside its own work never returns.
    @available(*, noasync, message: "blocks the thread; in async code use `await waitUntilFinished()`")
    public func waitUntilFinished() {
        _ = waitUntilFinished(until: .distantFuture)
    }

    /// As `waitUntilFinished()`, giving up at `deadline` (on the monotonic
    /// clock): `.completed` if the job finished, `.timedOut` otherwise. A
    /// deadline already past only checks.
    @available(*, noasync, message: "blocks the thread; in async code use `await waitUntilFinished()`")
    public func waitUntilFinished(until deadline: MonotonicClock.Instant) -> WaitResult {
        if bits & Bit.done != 0 { return .completed }
        return announcingBlocking {
            while true {
                let b = AtomicMemory.load(from: stateWord, ordering: .acquiring)
                if b & Bit.done != 0 { return .completed }
                if !deadline.isDistantFuture && MonotonicClock.now >= deadline { return .timedOut }
                if b & Bit.waiters == 0 {
                    let r = AtomicMemory.compareExchange(
                        expected: b, desired: b | Bit.waiters, at: stateWord, ordering: .relaxed)
                    if !r.exchanged { continue }
                }
                _ = Futex(stateWord).wait(expecting: b | Bit.waiters, until: deadline)
            }
        }
    }

    /// As `waitUntilFinished()`, giving up after `timeout`.
    @available(*, noasync, message: "blocks the thread; in async code use `await waitUntilFinished()`")
    public func waitUntilFinished(timeout: Duration) -> WaitResult {
        waitUntilFinished(until: MonotonicClock.now.advanced(by: timeout))
    }

    // MARK: Observation

    /// Calls `callback` with every change of the job from now on (see
    /// `Event`), exactly once each, in order, and never two calls at once:
    /// on the thread that made the change, or on another thread changing the
    /// same job at that moment (which then delivers both, in order). The
    /// callback must not block for long and must not wait for the job.
    /// After `finished` the observer is dropped. `waitUntilFinished()` (and
    /// a queue's wait) return only after observers have been handed
    /// `finished`. Returns a number for
    /// `removeObserver(_:)`. Takes the job's lock.
    @discardableResult
    public func observe(_ callback: @escaping @Sendable (Event) -> Void) -> Int {
        mutex.lock()
        defer { mutex.unlock() }
        nextObserverID += 1
        observers.append((nextObserverID, callback))
        return nextObserverID
    }

    /// Stops calls to the observer `id` (a delivery already under way may
    /// still reach it once). Unknown numbers are ignored.
    public func removeObserver(_ id: Int) {
        mutex.lock()
        observers.removeAll { $0.id == id }
        mutex.unlock()
    }

    /// The job's changes from now on, as an asynchronous sequence that ends
    /// after `finished` (at once if the job already finished): the same
    /// events, in the same order, as `observe(_:)`. Buffers without bound.
    public var events: AsyncStream<Event> {
        let (stream, continuation) = AsyncStream.makeStream(of: Event.self)
        mutex.lock()
        guard bits & Bit.finished == 0 else {
            mutex.unlock()
            continuation.finish()
            return stream
        }
        nextObserverID += 1
        let id = nextObserverID
        observers.append((id, { event in
            continuation.yield(event)
            if event == .finished { continuation.finish() }
        }))
        mutex.unlock()
        continuation.onTermination = { [weak self] _ in self?.removeObserver(id) }
        return stream
    }

    /// Queues `event` for the observers (if any). Under `mutex`. Returns
    /// whether someone must call `deliverEvents()` after unlocking.
    private func emitLocked(_ event: Event) -> Bool {
        guard !observers.isEmpty else { return false }
        undelivered.append(event)
        return !delivering
    }

    /// Delivers queued events in order; one thread at a time delivers (a
    /// thread that finds another delivering leaves its events to it).
    private func deliverEvents() {
        mutex.lock()
        guard !delivering else {
            mutex.unlock()
            return
        }
        delivering = true
        while !undelivered.isEmpty {
            let batch = undelivered
            undelivered = []
            let targets = observers
            mutex.unlock()
            for event in batch {
                for observer in targets { observer.callback(event) }
            }
            mutex.lock()
            if batch.last == .finished {
                observers = []
                mutex.unlock()
                donePartArrived()
                mutex.lock()
            }
        }
        delivering = false
        mutex.unlock()
    }

    // MARK: Queue hand-off

    /// Marks the job as added to `queue` (under the queue's lock): stops the
    /// process if it is in a queue already, started or finished. Returns
    /// whether it is ready now.
    func enterQueueLocked(_ queue: JobQueue, api: String) -> Bool {
        mutex.lock()
        let b = bits
        var problem: String?
        if b & Bit.queued != 0 {
            problem = "is already in a JobQueue; a job is added to one queue, once"
        } else if b & Bit.finished != 0 {
            problem = "has already finished"
        } else if b & Bit.started != 0 {
            problem = "has already started"
        }
        if let problem {
            mutex.unlock()
            misuse("JobQueue.\(api): \(self) \(problem)")
        }
        AtomicMemory.or(Bit.queued, into: stateWord, ordering: .relaxed)
        queueStorage = queue
        mutex.unlock()
        return b & Bit.ready != 0
    }

    /// The job's queue went away (dropped while suspended) with the job in
    /// it. A job that has not started finishes now, cancelled, without
    /// running: its dependents, completion handler, observers and waiters
    /// are released as for any cancelled job, on the calling thread. A job
    /// that started goes on and finishes on its own. Called by
    /// `JobQueue.deinit`, once per job, after the job left the queue's
    /// lists.
    func queueWentAway() {
        mutex.lock()
        queueStorage = nil
        let b = bits
        guard b & (Bit.started | Bit.finished) == 0 else {
            mutex.unlock()
            return
        }
        var notify = false
        if b & Bit.cancelled == 0 {
            AtomicMemory.or(Bit.cancelled, into: stateWord, ordering: .releasing)
            notify = emitLocked(.cancelled)
        }
        if b & Bit.ready == 0 {
            AtomicMemory.or(Bit.ready, into: stateWord, ordering: .releasing)
            notify = emitLocked(.ready) || notify
        }
        // Claims the job's one run, as `run(byQueue:)` does for a cancelled
        // job: nothing can start it after this.
        AtomicMemory.or(Bit.started, into: stateWord, ordering: .relaxed)
        mutex.unlock()
        if notify { deliverEvents() }
        _ = complete(error: nil)
    }

    /// Whether a queue could start the job now (a hint read without the lock).
    var isStartableHint: Bool { bits & (Bit.ready | Bit.started) == Bit.ready }

    /// The lane of the queue's ready list, read by the queue without the
    /// job's lock: the priority is frozen once the job is queued.
    var frozenQueueLane: Int { queuePriorityStorage.lane }
    /// The band the job runs on, frozen once it is queued.
    var frozenWorkPriority: WorkQueue.Priority { Job.workPriority(forThreadPriority: threadPriorityStorage) }

    @inline(__always)
    private func withMutex<T>(_ body: () -> T) -> T {
        mutex.lock()
        defer { mutex.unlock() }
        return body()
    }
}
