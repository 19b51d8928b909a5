/// Runs jobs on Spindle's worker pool, the guide's operation queue: each job
/// starts once it is ready (its dependencies finished), highest queue
/// priority first among the ready ones (first added first within a level),
/// at most `maxConcurrentJobCount` at a time, on a worker of the job's
/// thread-priority band.
///
/// Replaces Foundation's `OperationQueue`.
///
/// - `maxConcurrentJobCount = 1` runs one job at a time, but in readiness
///   and priority order, not strictly in the order added: use dependencies
///   for a strict order.
/// - An asynchronous job holds its slot until it calls `finish(throwing:)`.
/// - Suspending stops new jobs from starting; running ones go on.
/// - A job, once added, leaves only by finishing: cancel it (or
///   `cancelAll()`) to make it finish without running.
/// - Every `JobQueue` runs on the same pool, so more queues do not mean more
///   jobs at once than the pool has workers.
/// - A queue that is not suspended keeps itself alive while it has jobs: a
///   queue nobody holds still runs them all. A suspended one does not (no
///   one could resume it): when its last reference goes, every job of it
///   that has not started finishes cancelled, without running (as if
///   `cancel()` had been called and the queue had reached it), on the
///   thread that dropped that reference: the jobs' dependents (in other
///   queues too), completion handlers, observers and waiters are released,
///   and the queue lets go of its jobs. A job that was running goes on and
///   finishes on its own.
///
/// Thread-safe: any thread may add, cancel, suspend or wait. Memory:
/// everything written before `add` is visible to the job's work; everything
/// the work wrote is visible after `waitUntilAllJobsAreFinished()` returns.
///
/// Misuse stops the process with a message: adding a job that is already in
/// a queue, started or finished; `maxConcurrentJobCount` below 1.
public final class JobQueue: @unchecked Sendable, CustomStringConvertible {
    // @unchecked: every mutable field is guarded by `lock`, and so are the
    // `queueNext`/`queuePrevious` links of the jobs in the queue (`deinit`
    // touches them without it: nobody else can reach the queue then).

    /// The name given at creation, for descriptions.
    public let name: String

    private let lock = GuardLock()
    /// Entered when a job is added, left when it finished and its completion
    /// handler ran: what `waitUntilAllJobsAreFinished()` waits on.
    let unfinished = WorkGroup()

    // Guarded by `lock`.
    private var ready = ReadyJobs()
    private var running = 0
    private var limit: Int
    private var suspended = false
    private var first: Job?
    private var last: Job?
    private var count = 0
    /// The queue itself while it has jobs and is not suspended (see
    /// `keepAliveChangeLocked`); nil otherwise. Jobs refer to their queue
    /// weakly, so this is what keeps a queue nobody holds running.
    private var keepAlive: JobQueue?

    /// A new queue, not suspended, running at most
    /// `Topology.availableCPUCount` jobs at once.
    public init(name: String = "JobQueue") {
        self.name = name
        limit = Topology.availableCPUCount
    }

    deinit {
        // Only a queue that was suspended (or empty) gets here: otherwise
        // `keepAlive` holds it. Every job still listed has entered
        // `unfinished` and will not leave it through `jobDone` (its weak
        // reference to the queue reads nil now), so it is left here.
        var orphans: [Job] = []
        orphans.reserveCapacity(count)
        var node = first
        while let job = node {
            node = job.queueNext
            job.queueNext = nil
            job.queuePrevious = nil
            job.readyNext = nil
            job.isListedReady = false
            orphans.append(job)
        }
        first = nil
        last = nil
        ready = ReadyJobs()
        for job in orphans {
            job.queueWentAway()
            unfinished.leave()
        }
    }

    /// "JobQueue('name')".
    public var description: String { "JobQueue('\(name)')" }

    // MARK: Adding

    /// Adds `job`: it starts once it is ready and a slot is free. Never
    /// blocks beyond short internal locks. Stops the process if the job is
    /// already in a queue, has started or has finished.
    public func add(_ job: Job) {
        lock.lock()
        insertLocked(job, api: "add(_:)")
        let next = takeStartableLocked()
        let released = keepAliveChangeLocked()
        lock.unlock()
        withExtendedLifetime(released) {}
        if let next { launch(next) }
    }

    /// Adds every job of `jobs` (in order), then, with `waitUntilFinished`,
    /// blocks until all of them have finished (a blocking region on a pool
    /// worker). Misuse as `add(_:)`. Without the wait, `add(_:)` with the
    /// array does the same and can be called from async code.
    @available(*, noasync, message: "blocks the thread when waitUntilFinished is true; in async code add them with `add(_:)` and `try await` each job's `waitUntilFinished()`")
    public func add(_ jobs: [Job], waitUntilFinished: Bool) {
        addAll(jobs)
        if waitUntilFinished {
            for job in jobs { job.waitUntilFinished() }
        }
    }

    /// Adds every job of `jobs`, in order, as `add(_:)` adds one. Never
    /// blocks beyond a short internal lock; misuse as `add(_:)`.
    public func add(_ jobs: [Job]) {
        addAll(jobs)
    }

    private func addAll(_ jobs: [Job]) {
        lock.lock()
        for job in jobs { insertLocked(job, api: "add(_:waitUntilFinished:)") }
        var starting: [Job] = []
        while let next = takeStartableLocked() { starting.append(next) }
        let released = keepAliveChangeLocked()
        lock.unlock()
        withExtendedLifetime(released) {}
        for job in starting { launch(job) }
    }

    /// Adds a `ClosureJob` running `body` and returns it. Never blocks.
    @discardableResult
    public func add(_ body: @escaping @Sendable () throws -> Void) -> ClosureJob {
        let job = ClosureJob(body)
        add(job)
        return job
    }

    private func insertLocked(_ job: Job, api: String) {
        let isReady = job.enterQueueLocked(self, api: api)
        job.queuePrevious = last
        if let last { last.queueNext = job } else { first = job }
        last = job
        count += 1
        unfinished.enter()
        if isReady { ready.append(job) }
    }

    // MARK: Running

    /// The best ready job if it may start now (counted as running), else nil.
    private func takeStartableLocked() -> Job? {
        guard !suspended, running < limit, let job = ready.popStartable() else { return nil }
        running += 1
        return job
    }

    /// Takes or drops the queue's reference to itself, so that it is held
    /// exactly while it has jobs and is not suspended. Under `lock`; returns
    /// a reference the caller lets go of after unlocking (never the last:
    /// the caller holds the queue too).
    private func keepAliveChangeLocked() -> JobQueue? {
        if count > 0 && !suspended {
            if keepAlive == nil { keepAlive = self }
            return nil
        }
        defer { keepAlive = nil }
        return keepAlive
    }

    /// Hands `job` to a worker of its band.
    private func launch(_ job: Job) {
        WorkQueue.global(job.frozenWorkPriority).async { [self] in
            if !job.run(byQueue: true) { slotReturned() }
        }
    }

    /// A job of this queue became ready (a dependency finished or was
    /// removed, or it was cancelled while pending).
    func jobBecameReady(_ job: Job) {
        lock.lock()
        ready.append(job)
        let next = takeStartableLocked()
        lock.unlock()
        if let next { launch(next) }
    }

    /// A launched job turned out not to be startable: its slot is free.
    private func slotReturned() {
        lock.lock()
        running -= 1
        let next = takeStartableLocked()
        lock.unlock()
        if let next { launch(next) }
    }

    /// A job of this queue finished: its slot is free and it leaves the list.
    func jobFinished(_ job: Job) {
        lock.lock()
        running -= 1
        let previous = job.queuePrevious
        let next = job.queueNext
        if let previous { previous.queueNext = next } else { first = next }
        if let next { next.queuePrevious = previous } else { last = previous }
        job.queuePrevious = nil
        job.queueNext = nil
        count -= 1
        let start = takeStartableLocked()
        let released = keepAliveChangeLocked()
        lock.unlock()
        withExtendedLifetime(released) {}
        if let start { launch(start) }
    }

    /// A finished job's completion handler has run.
    func jobDone(_ job: Job) {
        unfinished.leave()
    }

    // MARK: Control

    /// How many jobs may run at once (1 makes the queue run one at a time).
    /// Raising it starts waiting ready jobs at once; lowering it lets running
    /// jobs finish. Stops the process for a value below 1.
    public var maxConcurrentJobCount: Int {
        get {
            lock.lock()
            defer { lock.unlock() }
            return limit
        }
        set {
            require(newValue >= 1, "JobQueue.maxConcurrentJobCount: \(newValue) is below 1")
            lock.lock()
            limit = newValue
            var starting: [Job] = []
            while let next = takeStartableLocked() { starting.append(next) }
            lock.unlock()
            for job in starting { launch(job) }
        }
    }

    /// Whether the queue holds back jobs that have not started. Setting it
    /// true lets running jobs go on and starts no new ones; false starts
    /// the ready ones. Not counted: one `false` undoes any number of `true`.
    /// Never blocks beyond a short internal lock. A suspended queue is not
    /// kept alive by its jobs: dropped, it finishes the ones that have not
    /// started, cancelled (see the type's notes).
    public var isSuspended: Bool {
        get {
            lock.lock()
            defer { lock.unlock() }
            return suspended
        }
        set {
            lock.lock()
            suspended = newValue
            var starting: [Job] = []
            while let next = takeStartableLocked() { starting.append(next) }
            let released = keepAliveChangeLocked()
            lock.unlock()
            withExtendedLifetime(released) {}
            for job in starting { launch(job) }
        }
    }

    /// The jobs in the queue now (not finished), in the order added. A
    /// snapshot, stale at once.
    public var jobs: [Job] {
        lock.lock()
        defer { lock.unlock() }
        var all: [Job] = []
        all.reserveCapacity(count)
        var node = first
        while let job = node {
            all.append(job)
            node = job.queueNext
        }
        return all
    }

    /// How many jobs are in the queue now (stale at once).
    public var jobCount: Int {
        lock.lock()
        defer { lock.unlock() }
        return count
    }

    /// Cancels every job in the queue now: those not started finish without
    /// running when the queue reaches them; running ones see `isCancelled`.
    /// Jobs added later are not affected. Never blocks beyond short locks.
    public func cancelAll() {
        for job in jobs { job.cancel() }
    }

    /// Blocks until every job in the queue has finished and run its
    /// completion handler, including jobs other threads add meanwhile. A
    /// blocking region on a pool worker. Acquiring: sees everything the jobs
    /// wrote. On a suspended queue with unstarted jobs it waits until someone
    /// resumes it.
    @available(*, noasync, message: "blocks the thread; in async code use `try await waitUntilAllJobsAreFinished()`")
    public func waitUntilAllJobsAreFinished() {
        unfinished.wait()
    }

    /// As `waitUntilAllJobsAreFinished()`, giving up at `deadline` (on the
    /// monotonic clock): `.completed` if the queue emptied, `.timedOut`
    /// otherwise.
    @available(*, noasync, message: "blocks the thread; in async code use `try await waitUntilAllJobsAreFinished()`")
    public func waitUntilAllJobsAreFinished(until deadline: MonotonicClock.Instant) -> WaitResult {
        unfinished.wait(until: deadline)
    }

    /// As `waitUntilAllJobsAreFinished()`, giving up after `timeout`.
    @available(*, noasync, message: "blocks the thread; in async code use `try await waitUntilAllJobsAreFinished()`")
    public func waitUntilAllJobsAreFinished(timeout: Duration) -> WaitResult {
        unfinished.wait(timeout: timeout)
    }
}
