import CShims
import Synchronization

/// A queue of work items, the Concurrency Programming Guide's dispatch
/// queue, on Spindle's worker pool.
///
/// Replaces Dispatch's `DispatchQueue`; <doc:ComingFromDispatchAndFoundation>
/// gives Spindle's name for each of its calls.
///
/// - A **serial** queue runs one item at a time, in the order submitted;
///   successive items may run on different threads. Distinct serial queues
///   run concurrently with each other.
/// - A **concurrent** queue starts its items in the order submitted and runs
///   as many at once as its target allows (the pool's width for the global
///   queues). Barrier items (`asyncBarrier`, `syncBarrier`) run alone: after
///   everything submitted before them, before anything submitted after.
/// - The **global** queues (`global(_:)`) are four shared concurrent queues,
///   one per `Priority`, that run items straight on the pool; they cannot be
///   suspended, retargeted or given barriers.
/// - The **main** queue (`main`) is serial and runs its items on the main
///   thread, as one custom source of `ThreadLoop.main` in its common modes:
///   a program that runs its main loop drains it; one without a loop calls
///   `WorkQueue.runMain()`.
///
/// Every queue has a target: its items run as if submitted to it (a queue
/// you create targets the global queue of its priority unless told
/// otherwise). A chain of serial queues serializes with its root, and
/// `sync` and `apply` on a queue keep its chain's exclusion as its items do:
/// they wait for a barrier, a busy serial queue or a suspension along it.
///
/// An item that can start reaches a free worker: one submitted while a
/// worker of the pool is free starts within about one thread wake-up,
/// whatever its submitter does next (keeps computing, waits for it through
/// a pipe); an item submitted from an item runs on the submitter's worker
/// next when the submitter returns first, so a chain of items stays on one
/// warm thread. Items queued behind workers that block where Spindle cannot
/// see (a plain `read()`, a foreign lock) start within about 20 ms on a
/// worker started in their place. See `WorkerPool` in the source for the
/// mechanisms.
///
/// Thread-safe: any thread may submit, suspend, resume or retarget.
/// Submission orders memory: everything the submitter wrote before `async`
/// or `sync` is visible to the item, and everything an item wrote is visible
/// to the next item of a serial queue and to a `sync` caller after it
/// returns.
///
/// Misuse stops the process with a message naming the queue: `sync`,
/// `syncBarrier` or `apply` onto a serial queue the caller is running on,
/// directly or through the target chain; `resume()`
/// more often than `suspend()`; a target that closes a cycle; barriers,
/// suspension or a target on a global queue.
///
/// Memory: `async` stores the closure in the queue's ring; it allocates
/// nothing beyond the closure's own context once the ring has grown to the
/// queue's backlog. Dropping the last reference to a suspended queue is
/// allowed (Dispatch on Linux dies of it): its pending items are released
/// without running, their groups are left, and the finalizer runs.
///
/// After `fork()`, in the child, every queue works: the global queues
/// (with the items queued in the parent), the main queue, `async(after:)`,
/// the queues made in the child and the parent's own queues, with the items
/// they held queued. The child has only the thread that forked; whatever the
/// parent's other threads were doing with a queue at that moment is lost
/// there, and the queue is made whole again the first time the child uses
/// it (or runs a drain the parent had scheduled):
/// - an item those threads were running never finishes in the child (its
///   group is never left, a `sync` caller that was waiting for it is gone),
///   and no longer counts as running: the queue starts its next items, and
///   a barrier no longer waits for it;
/// - items a serial drain of those threads had taken for its next batch
///   (up to `serialBatch`, behind the one it was running) are lost with
///   it, unrun;
/// - a `sync` call those threads had queued is dropped when the child's
///   drain reaches it, unrun (its caller, and the closure on its stack,
///   are gone); other items they queued run;
/// - a lock of the queue they held is released.
/// The forking thread's own items (a fork inside an item, or inside a
/// `sync` body) go on in the child and end as usual; what the queue holds
/// back for them (a serial queue's one slot, a barrier) stays held until
/// they do. Suspensions made in the parent stay in force.
public final class WorkQueue: @unchecked Sendable, Hashable, CustomStringConvertible {
    // @unchecked: every mutable field is guarded by `lock` (see each), and
    // the ring is only touched under it.

    /// Whether a queue runs one item at a time.
    public enum Kind: Sendable, Hashable {
        /// One item at a time, in submission order.
        case serial
        /// Items start in submission order and may run at once.
        case concurrent
    }

    /// The guide's priorities of the global queues (with the background band
    /// later systems added). High and default share one band of workers
    /// (high items start first); low runs on workers at nice 10, background
    /// at nice 19.
    public enum Priority: Int, Sendable, Hashable, CaseIterable, CustomStringConvertible {
        case background, low, `default`, high

        public var description: String {
            switch self {
            case .background: "background"
            case .low: "low"
            case .default: "default"
            case .high: "high"
            }
        }

        var pool: WorkerPool {
            switch self {
            case .high, .default: .standard
            case .low: .low
            case .background: .background
            }
        }

        var lane: Int { self == .high ? WorkerPool.highLane : WorkerPool.defaultLane }
    }

    /// The label given at creation, for debuggers, logs and descriptions.
    public let label: String
    /// Serial or concurrent.
    public let kind: Kind
    /// The pool a global queue's items go to straight away; nil otherwise.
    /// Unretained: the pools are process-wide and never released. A submit
    /// reaches it through `_withUnsafeGuaranteedRef`, which costs no
    /// reference counting on an object every submitter on every worker
    /// shares (an `unowned(unsafe)` field is still retained and released
    /// around each use: measured in the chain's profile).
    let globalPoolRef: Unmanaged<WorkerPool>?
    /// `globalPoolRef`, retained; for paths that are not per item.
    var globalPool: WorkerPool? { globalPoolRef?.takeUnretainedValue() }
    /// A global queue's priority (and so its injector lane).
    let globalPriority: Priority?
    /// Whether this is the main queue.
    let isMain: Bool
    /// How many items may run at once: 1 for serial queues.
    let width: Int

    let lock = GuardLock()
    /// Items not yet started. Guarded by `lock`.
    let entries = WorkRing()
    /// Items running now (a running barrier counts in `barrierActive`
    /// instead). Guarded by `lock`.
    var running = 0
    /// Drains of this queue scheduled on its target or running. Guarded by `lock`.
    var drainers = 0
    /// Guarded by `lock`.
    var suspendCount = 0
    /// 1 while `suspendCount > 0`: written under `lock`, read without it by a
    /// serial drain between the items of a batch. The next word of its line
    /// is `forkEpochWord`.
    let suspendedFlag: UnsafeMutablePointer<UInt32> = allocateStableWords(byteCount: 8).assumingMemoryBound(to: UInt32.self)
    /// The fork epoch (`cshims_fork_epoch`) of the process the queue's
    /// counts and lock belong to: set at creation, and in a child after
    /// `fork()` by the first thread that takes the queue's lock there
    /// (`repairAfterFork`), which recounts them first. `ForkEpochRepair.repairing`
    /// while it does. Atomic; compared before every hold of `lock`.
    var forkEpochWord: UnsafeMutablePointer<UInt32> { suspendedFlag + 1 }
    /// What the forking thread held of this queue at the fork (see
    /// `QueueFrame.Holding`), valid when `forkHeldEpoch` is the child's
    /// epoch: written only by the child's fork handler (the child has one
    /// thread then), read by `repairAfterFork`.
    var forkHeldEpoch: UInt32 = 0
    var forkHeldSlots = 0
    var forkHeldDrains = 0
    /// A barrier item is running. Guarded by `lock`.
    var barrierActive = false
    /// nil only for the global and main queues. Guarded by `lock`.
    var targetQueue: WorkQueue?
    /// Guarded by `lock`.
    var contextValue: (any Sendable)?
    /// Guarded by `lock`.
    var finalizer: (@Sendable (any Sendable) -> Void)?
    /// Guarded by `lock`.
    var specifics: [ObjectIdentifier: any Sendable] = [:]

    /// How many items a drain runs before it lets its worker go (requeueing
    /// itself behind whatever else the target has), so one busy queue cannot
    /// hold a worker while other queues wait.
    static let drainBudget = 128

    /// A new queue whose items run on the global queue of `priority`.
    public convenience init(label: String, kind: Kind = .serial, priority: Priority = .default) {
        self.init(label: label, kind: kind, target: WorkQueue.global(priority))
    }

    /// A new queue whose items run as if submitted to `target`. A
    /// concurrent queue whose chain reaches a serial queue (or the main
    /// queue) runs one item at a time, as its root does.
    public init(label: String, kind: Kind = .serial, target: WorkQueue) {
        self.label = label
        self.kind = kind
        globalPoolRef = nil
        globalPriority = nil
        isMain = false
        // A concurrent queue does not bound its own concurrency below the
        // pool's: its items may wait for each other (1,000 waiters and their
        // signallers on one queue), and only the pool's blocking
        // compensation can run them all. The pool's width bounds what runs.
        width = kind == .serial ? 1 : target.effectivePool.maximumThreads
        targetQueue = target
        AtomicMemory.store(cshims_fork_epoch(), to: forkEpochWord, ordering: .relaxed)
    }

    private init(global priority: Priority) {
        label = "spindle.global.\(priority)"
        kind = .concurrent
        globalPoolRef = Unmanaged.passUnretained(priority.pool)
        globalPriority = priority
        isMain = false
        width = priority.pool.maximumThreads
        AtomicMemory.store(cshims_fork_epoch(), to: forkEpochWord, ordering: .relaxed)
    }

    private init(mainQueue: Void) {
        label = "spindle.main"
        kind = .serial
        globalPoolRef = nil
        globalPriority = nil
        isMain = true
        width = 1
        AtomicMemory.store(cshims_fork_epoch(), to: forkEpochWord, ordering: .relaxed)
    }

    deinit {
        defer { deallocateStableWords(UnsafeMutableRawPointer(suspendedFlag)) }
        // Only a suspended queue can go with items left (a scheduled drain
        // holds its queue): they never run, and their groups are left.
        for unit in entries.removeAll() { unit.discard() }
        if let context = contextValue, let finalizer {
            WorkQueue.global().async { finalizer(context) }
        }
    }

    // MARK: The shared queues

    /// Immortal (`makeImmortal`): every submitter retains them.
    private static let globals: [WorkQueue] = Priority.allCases.map { makeImmortal(WorkQueue(global: $0)) }

    /// The shared concurrent queue of `priority`. Always the same object.
    public static func global(_ priority: Priority = .default) -> WorkQueue {
        globals[priority.rawValue]
    }

    /// The serial queue whose items run on the main thread, drained by
    /// `ThreadLoop.main` in its common modes (one custom source there, added
    /// the first time an item is queued) or by `runMain()`.
    /// Immortal, as the global queues.
    public static let main = makeImmortal(WorkQueue(mainQueue: ()))

    /// Runs the main thread's loop forever, so that the main queue's items
    /// (and every other source of the main loop) run: the guide's "drain the
    /// main queue" call for programs without a run loop of their own. Never
    /// returns. Stops the process if called on another thread.
    public static func runMain() -> Never {
        require(NativeThread.isMainThread, "WorkQueue.runMain(): call it on the main thread, whose loop drains the main queue")
        MainQueueDrain.install()
        while true { ThreadLoop.main.run() }
    }

    /// The queue whose item the calling thread is running (the innermost, for
    /// an item of a queue drained through its target), or nil outside any
    /// item. For diagnostics and identity checks, not for synchronization.
    public static var current: WorkQueue? { QueueFrame.innermost }

    /// Whether the calling thread is running an item of this queue, or of a
    /// queue whose target chain reaches it. For the main queue, also true on
    /// the main thread outside any item.
    public var isCurrent: Bool {
        if QueueFrame.contains(self) { return true }
        if isMain { return NativeThread.isMainThread }
        return false
    }

    /// Stops the process with a message naming this queue unless the calling
    /// code runs on it (`isCurrent`).
    public func requireCurrent(file: StaticString = #fileID, line: UInt = #line) {
        if !isCurrent {
            let running = QueueFrame.innermost.map { "'\($0.label)'" } ?? "no queue"
            misuse("WorkQueue.requireCurrent(): expected to run on '\(label)', but the caller runs on \(running)", file: file, line: line)
        }
    }

    /// Stops the process with a message naming this queue if the calling
    /// code runs on it.
    public func requireNotCurrent(file: StaticString = #fileID, line: UInt = #line) {
        if isCurrent {
            misuse("WorkQueue.requireNotCurrent(): the caller runs on '\(label)'", file: file, line: line)
        }
    }

    // MARK: Pool diagnostics (tests and benchmarks)

    /// Worker threads alive now in the pool that runs `priority`'s global
    /// queue (parked ones included).
    package static func workerThreadCount(for priority: Priority) -> Int {
        priority.pool.threadCountNow
    }

    /// Workers of that pool holding a permit now (running or searching).
    package static func activeWorkerCount(for priority: Priority) -> Int {
        priority.pool.activeCount
    }

    /// Looks the standard pool's monitor has taken (see `PoolMonitor`): it
    /// takes one every 10 ms while a worker runs, none while all are parked.
    package static var poolMonitorLooks: Int { WorkerPool.standard.monitor.looks }

    /// How many workers each pool keeps: `Topology.availableCPUCount`.
    package static var poolWidth: Int { WorkerPool.standard.width }

    /// How many workers beyond the width a pool may start while others block.
    package static var compensationLimit: Int { WorkerPool.compensationLimit }

    // MARK: Identity

    public static func == (lhs: WorkQueue, rhs: WorkQueue) -> Bool { lhs === rhs }
    public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }

    /// "WorkQueue(label, serial)".
    public var description: String {
        if let globalPriority { return "WorkQueue(global \(globalPriority))" }
        if isMain { return "WorkQueue(main)" }
        return "WorkQueue(\(label), \(kind == .serial ? "serial" : "concurrent"))"
    }

    /// The queue's target (nil for the global and main queues). Takes the
    /// queue's lock.
    public var target: WorkQueue? {
        lockQueue()
        defer { lock.unlock() }
        return targetQueue
    }

    /// The pool the queue's items finally run on (the main queue's: the
    /// standard pool's width, for concurrency bounds).
    var effectivePool: WorkerPool {
        if let globalPool { return globalPool }
        if isMain { return .standard }
        return target!.effectivePool
    }

    /// Whether this queue runs its items itself (not straight on the pool).
    var isGlobal: Bool { globalPoolRef != nil }

    // MARK: Submitting

    /// Submits `body` and returns at once. Never blocks (beyond a short
    /// internal lock). The closure runs once, on a pool worker (the main
    /// thread for the main queue), after the queue's earlier items started
    /// (serial: finished). Items handle their own errors.
    public func async(_ body: consuming @escaping @Sendable () -> Void) {
        submit(.closure(consume body))
    }

    /// Submits `body` as a member of `group`: the group is entered now and
    /// left when `body` has returned. Never blocks.
    public func async(group: WorkGroup, _ body: consuming @escaping @Sendable () -> Void) {
        group.enter()
        submit(.grouped(consume body, .passUnretained(group)))
    }

    /// Submits a work item. Never blocks. A work item runs once: submitting
    /// it a second time stops the process.
    public func async(_ item: WorkItem) {
        item.markSubmitted("WorkQueue.async(_:)", to: self)
        if item.isBarrier { requireBarrierAllowed("async(_:) of a barrier WorkItem") }
        submit(.item(item))
    }

    /// Submits a barrier: it starts after every item submitted before it has
    /// finished, runs alone, and finishes before any item submitted after it
    /// starts. On a serial queue it is an ordinary item. Stops the process on
    /// a global queue (a shared queue cannot be stopped for one client).
    public func asyncBarrier(group: WorkGroup? = nil, _ body: @escaping @Sendable () -> Void) {
        requireBarrierAllowed("asyncBarrier(_:)")
        group?.enter()
        submit(.barrier(body, group))
    }

    /// Submits `body` when `deadline` (on the monotonic clock) has passed:
    /// never earlier. Never blocks. The deadline waits in the standard
    /// pool's timer heap, beside the timer sources on work queues: an idle
    /// worker sleeps until the earliest deadline and submits what is due
    /// (while every worker computes, the pool's watchdog looks every 10 ms
    /// at most). A suspended queue runs `body` after it resumes.
    public func async(after deadline: MonotonicClock.Instant, _ body: @escaping @Sendable () -> Void) {
        DelayedSubmission.schedule(.closure(body), on: self, at: deadline, api: "WorkQueue.async(after:_:)")
    }

    /// Submits `body` after `delay`; see `async(after:_:)` with a deadline.
    public func async(after delay: Duration, _ body: @escaping @Sendable () -> Void) {
        async(after: MonotonicClock.now.advanced(by: delay), body)
    }

    /// Submits `item` when `deadline` (on the monotonic clock) has passed:
    /// never earlier. Never blocks. Cancelling the item before its deadline
    /// takes it out of the pending timers at once and finishes it then
    /// (waiters return, notifications run); cancelled after its deadline,
    /// it is skipped when its turn on the queue comes. A work item runs
    /// once: submitting it a second time stops the process.
    public func async(after deadline: MonotonicClock.Instant, _ item: WorkItem) {
        item.markSubmitted("WorkQueue.async(after:_:)", to: self)
        if item.isBarrier { requireBarrierAllowed("async(after:_:) of a barrier WorkItem") }
        DelayedSubmission.schedule(.item(item), on: self, at: deadline, api: "WorkQueue.async(after:_:)")
    }

    /// Submits `item` after `delay`; see `async(after:_:)` with a deadline
    /// and a work item.
    public func async(after delay: Duration, _ item: WorkItem) {
        async(after: MonotonicClock.now.advanced(by: delay), item)
    }

    /// How many submissions of `async(after:)` (and jobs the global executor
    /// holds until an instant) wait for their deadline, in every queue: a
    /// package diagnostic.
    package static var pendingDelayedSubmissions: Int { DelayedSubmission.pendingCount }

    /// Where a unit goes: straight to the pool for a global queue, into the
    /// queue's ring otherwise.
    @inline(__always)
    /// `shared`: the unit must be visible to other workers at once (never
    /// the submitting worker's private next-unit slot), because the
    /// submitter goes on working and the unit is meant to run beside it.
    func submit(_ unit: consuming WorkUnit, shared: Bool = false) {
        Perturbation.point(.queueSubmit)
        if let pool = globalPoolRef {
            var unit: WorkUnit? = consume unit
            let lane = globalPriority.unsafelyUnwrapped.lane
            pool._withUnsafeGuaranteedRef { $0.submit(unit.take().unsafelyUnwrapped, lane: lane, shared: shared) }
        } else {
            enqueue(unit)
        }
    }

    /// Appends to the ring and schedules a drain if the unit can start now.
    @inline(__always)
    func enqueue(_ unit: consuming WorkUnit) {
        lockQueue()
        entries.pushBack(unit)
        guard claimDrainerLocked() else {
            lock.unlock()
            return
        }
        let target = targetQueue
        lock.unlock()
        // A serial queue's drain may wait in the submitting worker's slot (a
        // continuation); a concurrent queue's runs beside the submitter.
        scheduleDrain(on: target, shared: width > 1)
    }

    /// Counts one more drain if the front item could start now and a drain
    /// slot is free. Under `lock`.
    @inline(__always)
    func claimDrainerLocked() -> Bool {
        guard suspendCount == 0, !barrierActive, drainers < width, !entries.isEmpty else { return false }
        if entries.frontIsBarrier ? running > 0 : running >= width { return false }
        drainers += 1
        return true
    }

    /// Hands one drain of this queue to its target (or, for the main queue,
    /// to the main loop).
    func scheduleDrain(on target: WorkQueue?, shared: Bool = true) {
        if let target {
            target.submit(.drain(self, cshims_fork_epoch()), shared: shared)
        } else {
            MainQueueDrain.signal()
        }
    }

    func requireBarrierAllowed(_ api: String) {
        if isGlobal {
            misuse("WorkQueue.\(api): '\(label)' is a global queue, which other code shares; barriers need a concurrent queue of your own")
        }
    }

    // MARK: Draining

    /// Runs items of this queue on the calling worker until none can start,
    /// or `drainBudget` ran (then requeues itself on the target). Called for
    /// a `.drain` unit, once per claimed drain slot. A unit scheduled in
    /// another fork epoch (by the parent, before the fork) holds no slot in
    /// this process (`repairAfterFork` recounted them): it only makes sure
    /// the queue was repaired, which schedules drains of its own.
    func drain(scheduledIn epoch: UInt32) {
        guard epoch == cshims_fork_epoch() else {
            if !ForkEpochRepair.isCurrent(forkEpochWord) { repairAfterFork() }
            return
        }
        QueueFrame.with(self, holding: .drain) { drainLoop(budget: Self.drainBudget) }
    }

    /// One pass of the main loop over the main queue: the items present when
    /// the pass began, so the loop's other sources interleave with a long
    /// backlog.
    func drainMainPass() {
        lockQueue()
        let budget = entries.count
        let claimed = drainers > 0
        lock.unlock()
        guard claimed else { return }
        QueueFrame.with(self) { drainLoop(budget: max(budget, 1)) }
    }

    private func drainLoop(budget: Int) {
        if width == 1 { return drainSerial(budget: budget) }
        var budget = budget
        lockQueue()
        while true {
            guard suspendCount == 0, !barrierActive, !entries.isEmpty else { break }
            let barrier = entries.frontIsBarrier
            if barrier {
                guard running == 0 else { break }
                barrierActive = true
            } else {
                guard running < width else { break }
                running += 1
            }
            let unit = entries.popFront()!
            // A concurrent queue starts another drain for the next item.
            let more = width > 1 && claimDrainerLocked()
            let target = targetQueue
            lock.unlock()
            if more { scheduleDrain(on: target) }
            Perturbation.point(.workerPick)
            unit.run()
            lockQueue()
            if barrier { barrierActive = false } else { running -= 1 }
            budget -= 1
            if budget == 0 {
                if suspendCount == 0 && !entries.isEmpty {
                    // Keep the slot; let the worker (or the main loop's
                    // other sources) go first.
                    let target = targetQueue
                    lock.unlock()
                    scheduleDrain(on: target)
                    return
                }
                break
            }
        }
        finishDrainLocked()
    }

    /// How many items a serial drain takes out of the ring per hold of the
    /// lock: fewer trips through the lock that producers share, which is
    /// what a producer and the draining worker contend on.
    static let serialBatch = 32

    /// A serial queue's drain: batches of up to `serialBatch` items taken
    /// under one hold of the lock and run in order. Suspension still takes
    /// effect between items: a `suspend()` seen before an item (through
    /// `suspendedFlag`) puts the rest of the batch back at the front.
    private func drainSerial(budget: Int) {
        withUnsafeTemporaryAllocation(of: WorkUnit.self, capacity: Self.serialBatch) { buffer in
            let batch = buffer.baseAddress!
            var budget = budget
            lockQueue()
            while suspendCount == 0, running == 0, !entries.isEmpty {
                let taken = entries.popFront(into: batch, limit: min(Self.serialBatch, budget))
                running = 1
                lock.unlock()
                var ran = 0
                while ran < taken && AtomicMemory.load(from: suspendedFlag, ordering: .relaxed) == 0 {
                    Perturbation.point(.workerPick)
                    (batch + ran).move().run()
                    ran += 1
                }
                lockQueue()
                var index = taken
                while index > ran {
                    index -= 1
                    entries.pushFront((batch + index).move())
                }
                running = 0
                budget -= ran
                if budget <= 0 && suspendCount == 0 && !entries.isEmpty {
                    // Keep the slot; let the worker (or the main loop's other
                    // sources) go first.
                    let target = targetQueue
                    lock.unlock()
                    scheduleDrain(on: target)
                    return
                }
                if budget <= 0 { break }
            }
            finishDrainLocked()
        }
    }

    /// Ends a drain (called with `lock` held; releases it): gives back its
    /// slot and schedules the drains that can start now (after a barrier, or
    /// when a `sync` caller's claim kept this drain from running).
    private func finishDrainLocked() {
        drainers -= 1
        var extra = 0
        while claimDrainerLocked() { extra += 1 }
        let target = targetQueue
        lock.unlock()
        for _ in 0..<extra { scheduleDrain(on: target) }
    }

    // MARK: Suspension

    /// Stops the queue from starting items until a matching `resume()`:
    /// counted, so every `suspend` needs its own `resume`. An item running
    /// now is not interrupted; the next one waits. Never blocks. Stops the
    /// process on a global queue.
    public func suspend() {
        require(!isGlobal, "WorkQueue.suspend(): '\(label)' is a global queue, which other code shares; suspend a queue of your own")
        lockQueue()
        suspendCount += 1
        AtomicMemory.store(1, to: suspendedFlag, ordering: .relaxed)
        lock.unlock()
    }

    /// Undoes one `suspend()`; when the count reaches zero the queue starts
    /// items again. Never blocks. Stops the process when the queue is not
    /// suspended (more resumes than suspends), or is a global queue.
    public func resume() {
        require(!isGlobal, "WorkQueue.resume(): '\(label)' is a global queue; it is never suspended")
        lockQueue()
        guard suspendCount > 0 else {
            lock.unlock()
            misuse("WorkQueue.resume(): '\(label)' is not suspended; resume() was called more times than suspend()")
        }
        suspendCount -= 1
        if suspendCount == 0 { AtomicMemory.store(0, to: suspendedFlag, ordering: .relaxed) }
        var extra = 0
        while claimDrainerLocked() { extra += 1 }
        let target = targetQueue
        lock.unlock()
        for _ in 0..<extra { scheduleDrain(on: target) }
    }

    /// Whether the queue is suspended now (stale at once).
    public var isSuspended: Bool {
        lockQueue()
        defer { lock.unlock() }
        return suspendCount > 0
    }

    // MARK: Target

    /// Guards target changes as a whole, so that two threads cannot close a
    /// cycle between them.
    private static let targetLock = GuardLock()

    /// Makes the queue's items run as if submitted to `target` from now on
    /// (a drain already scheduled finishes where it is). Stops the process if
    /// `target` is this queue or reaches it through its own targets, or if
    /// this is a global or the main queue.
    public func setTarget(_ target: WorkQueue) {
        require(!isGlobal && !isMain, "WorkQueue.setTarget(_:): '\(label)' is \(isMain ? "the main" : "a global") queue; only queues you create have a target")
        Self.targetLock.lock()
        defer { Self.targetLock.unlock() }
        var chain: [String] = [label]
        var next: WorkQueue? = target
        while let queue = next {
            chain.append(queue.label)
            if queue === self {
                misuse("WorkQueue.setTarget(_:): the target chain \(chain.map { "'\($0)'" }.joined(separator: " -> ")) is a cycle")
            }
            next = queue.target
        }
        lockQueue()
        targetQueue = target
        lock.unlock()
    }


    // MARK: Fork

    /// The main queue in a child after `fork()`: its lock is released (a
    /// parent thread may have held it), and items queued before the fork
    /// get a pass of the child's main loop when it runs.
    /// (The main queue is repaired here, not by `repairAfterFork`.)
    func childAfterFork() {
        AtomicMemory.store(cshims_fork_epoch(), to: forkEpochWord, ordering: .relaxed)
        lock.reinitializeAfterFork()
        // The forking thread itself may be inside a main-queue item: then
        // its pass goes on in the child and ends as usual.
        guard !QueueFrame.contains(self) else { return }
        drainers = 0
        running = 0
        barrierActive = false
        if claimDrainerLocked() { MainQueueDrain.signal() }
    }

    /// In the parent, before a fork: makes the generic types and looks up
    /// the conformances that a child's workers use when they drain a queue,
    /// repair it, run a work item or a group's wait and notify (this file,
    /// `WorkQueue+Sync`, `WorkRing`, `QueueFrame`, `CompletionWord`,
    /// `WorkGroup`, `WorkItem`), which a parent that never took those paths
    /// has not made yet (see `ForkHandlers.makeMetadata`;
    /// `scripts/check-fork-metadata` keeps the list whole).
    static func prepareForFork() {
        typealias Notification = (WorkQueue, @Sendable () -> Void)
        ForkHandlers.makeMetadata(
            WorkUnit?.self, WorkQueue?.self, WorkQueue.Priority?.self, (any Sendable).self, (any Sendable)?.self,
            [ObjectIdentifier: any Sendable].self, (ObjectIdentifier, any Sendable).self,
            [WorkUnit].self, IndexingIterator<[WorkUnit]>.self, [WorkQueue.Priority].self,
            [WorkQueue].self, IndexingIterator<[WorkQueue]>.self, [String].self,
            Notification.self, Notification?.self, [Notification].self, IndexingIterator<[Notification]>.self)
        ForkHandlers.makeMetadata(ofNoncopyable: Atomic<UInt>.self)
        ForkHandlers.makeConformance(equatable: WorkQueue.self)
        ForkHandlers.makeConformance(hashable: WorkQueue.self)
        ForkHandlers.makeConformance(equatable: Kind.self)
        ForkHandlers.makeConformance(hashable: Kind.self)
        ForkHandlers.makeConformance(equatable: Priority.self)
        ForkHandlers.makeConformance(rawRepresentable: Priority.self)
        ForkHandlers.makeConformance(described: Priority.self)
        ForkHandlers.makeConformance(equatable: QueueFrame.Holding.self)
        ForkHandlers.makeConformance(rawRepresentable: QueueFrame.Holding.self)
        ForkHandlers.makeConformance(collection: [WorkUnit].self)
        ForkHandlers.makeConformance(collection: [Priority].self)
        ForkHandlers.makeConformance(collection: [WorkQueue].self)
        ForkHandlers.makeConformance(collection: [Notification].self)
        ForkHandlers.makeConformance(collection: [String].self)
        ForkHandlers.makeConformance(bidirectional: [String].self)
    }

    /// Takes `lock`, first repairing the queue if its state is the parent's
    /// (a child after `fork()`). Every hold of a queue's lock starts here:
    /// one relaxed load and compare beyond the lock itself.
    @inline(__always)
    func lockQueue() {
        if !ForkEpochRepair.isCurrent(forkEpochWord) { repairAfterFork() }
        lock.lock()
    }

    /// In a child after `fork()`, the first time the queue's lock is wanted:
    /// makes the counts the parent's threads left true of this process.
    /// Those threads are gone, and so are their holdings: a lock they held,
    /// the running slots (or barrier) of their items, and their drains. The
    /// forking thread's own holdings stay (`noteForkingThreadHolding`). Every
    /// drain the parent scheduled is void (`drain(scheduledIn:)`), so the
    /// drains are recounted from the forking thread's alone, and new ones
    /// are scheduled for the items that can start now.
    ///
    /// One thread repairs, the others sleep until it has
    /// (`ForkEpochRepair`). Nobody in the child can have taken the lock
    /// before (every hold starts in `lockQueue`), so replacing it steals it
    /// from no one.
    @inline(never)
    func repairAfterFork() {
        guard ForkEpochRepair.claim(forkEpochWord) else { return }
        let epoch = cshims_fork_epoch()
        lock.reinitializeAfterFork()
        lock.lock()
        let held = forkHeldEpoch == epoch
        let slots = held ? forkHeldSlots : 0
        // A barrier runs alone, so one the queue has running with the
        // forking thread inside it is that thread's.
        if barrierActive && slots > 0 {
            running = slots - 1
        } else {
            barrierActive = false
            running = slots
        }
        drainers = held ? forkHeldDrains : 0
        var extra = 0
        while claimDrainerLocked() { extra += 1 }
        let target = targetQueue
        lock.unlock()
        ForkEpochRepair.finish(forkEpochWord)
        for _ in 0..<extra { scheduleDrain(on: target) }
    }

    /// In a child just forked (from `QueueFrame.noteHoldingsAfterFork`, on
    /// the child's one thread): the forking thread runs an item of this
    /// queue and holds a running slot (or the barrier) for it, and with
    /// `drain` a drain slot. Plain stores: nothing else runs yet. Epoch 0
    /// (the parent, before the fork) records nothing.
    func noteForkingThreadHolding(drain: Bool, epoch: UInt32) {
        guard epoch != 0, !isMain, !isGlobal else { return }
        if forkHeldEpoch != epoch {
            forkHeldEpoch = epoch
            forkHeldSlots = 0
            forkHeldDrains = 0
        }
        forkHeldSlots += 1
        if drain { forkHeldDrains += 1 }
    }

    // MARK: Context

    /// The queue's one context value, for items that share data (the guide's
    /// queue context). Spindle never reads it. Takes the queue's lock.
    /// Stops the process when set on a global queue (shared by everyone).
    public var context: (any Sendable)? {
        get {
            lockQueue()
            defer { lock.unlock() }
            return contextValue
        }
        set {
            require(!isGlobal, "WorkQueue.context: '\(label)' is a global queue, which other code shares; give your own queue a context")
            lockQueue()
            contextValue = newValue
            lock.unlock()
        }
    }

    /// Sets the function that runs once after the queue is gone (its last
    /// reference dropped and its pending items run), with the context, on
    /// the default global queue, and only if the context is not nil then.
    public func setFinalizer(_ finalizer: (@Sendable (any Sendable) -> Void)?) {
        require(!isGlobal, "WorkQueue.setFinalizer(_:): '\(label)' is a global queue, which never goes away")
        lockQueue()
        self.finalizer = finalizer
        lock.unlock()
    }

    /// Associates `value` with `key` on this queue (nil removes it). Any
    /// thread; takes the queue's lock.
    public func setSpecific<Value: Sendable>(_ value: Value?, for key: WorkQueueKey<Value>) {
        lockQueue()
        specifics[ObjectIdentifier(key)] = value
        lock.unlock()
    }

    /// The value for `key` set on this queue, or nil.
    public func specific<Value: Sendable>(for key: WorkQueueKey<Value>) -> Value? {
        lockQueue()
        defer { lock.unlock() }
        return specifics[ObjectIdentifier(key)] as? Value
    }

    /// The value for `key` of the queue the calling code runs on, or of the
    /// first queue along its target chain that has one; nil outside items.
    public static func currentSpecific<Value: Sendable>(for key: WorkQueueKey<Value>) -> Value? {
        for queue in QueueFrame.all {
            if let value = queue.specific(for: key) { return value }
        }
        return nil
    }
}

/// A key for values stored on queues (`WorkQueue.setSpecific(_:for:)`),
/// compared by identity. Replaces Dispatch's `DispatchSpecificKey`.
public final class WorkQueueKey<Value: Sendable>: Sendable {
    /// A new key, distinct from every other. Never blocks.
    public init() {}
}
