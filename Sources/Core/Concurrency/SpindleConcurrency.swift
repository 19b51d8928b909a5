#if compiler(>=6.3)
// The only file of Spindle that uses the toolchain's experimental executor
// SPI; see `SpindleConcurrency` for why this entry point and not another.
@_spi(ExperimentalCustomExecutors) @_spi(ExperimentalScheduling) import _Concurrency
#endif

/// **Experimental.** Swift's global concurrent executor on Spindle's worker
/// pool, as an explicit, process-wide, one-way opt-in.
///
/// After `installAsGlobalExecutor()`, every job that Swift's runtime gives
/// its global concurrent executor runs on Spindle's pool instead of
/// Dispatch's: tasks created without an actor or an executor preference
/// (`Task {}` from nonisolated code, `Task.detached`, `async let`, task-group
/// children), the nonisolated parts of every task without an executor
/// preference, and the jobs of default actors. Timed jobs (`Task.sleep` on `ContinuousClock` or
/// `SuspendingClock`) wait in the standard pool's timer heap, the one that
/// serves `WorkQueue.async(after:)` and queue timer sources, and then run on
/// the pool.
///
/// ## Priority
/// A job runs on the pool of its priority band, as an item of the global
/// queue of the same priority would: `TaskPriority.high` and above on
/// `.high`; `.medium` (and unspecified) on `.default`; `.low`/`.utility` on
/// `.low` (workers at nice 10); `.background` and anything lower on
/// `.background` (nice 19). The band is read each time a job is enqueued,
/// so a task whose priority the runtime raised (a higher-priority task
/// awaits its value) runs its later jobs on the higher band; a job already
/// queued does not move.
///
/// ## When to call it, and what a late call does
/// Call it first thing in `main`, before any task is created. Swift keeps
/// its default executor in one variable that every global enqueue reads
/// without synchronization; replacing it while another thread enqueues a
/// job is a data race inside the runtime. Called later, at a moment when no
/// task is running or being enqueued, it works: jobs handed to Dispatch
/// before the call (including sleeps Dispatch is timing) run on Dispatch;
/// every job enqueued after it runs on Spindle.
///
/// ## Not covered
/// - The main actor's executor stays as it was (the current
///   `MainActor.executor` is handed back to the runtime unchanged): on
///   Linux, Dispatch's main queue, which `dispatchMain()` or Foundation's
///   `RunLoop.main` drains. `WorkQueue.runMain()` and `ThreadLoop.main`
///   drain Spindle's main queue, not the main actor: a program that ends in
///   them never runs main-actor work. And in `main.swift`, whose top level
///   is on the main actor, `Task {}` inherits the main actor: start pool
///   work with `Task.detached` there.
/// - `fork()`: as for the work queues (see `WorkQueue`), the child's pool
///   starts afresh; a job that was queued or timed in the parent at the
///   fork (a sleeping task) runs in both processes.
/// - Actors with a custom executor and tasks with an executor preference
///   run where those say, as before.
/// - A `Task.sleep` tolerance is ignored (the pool's timer heap submits the
///   job at the deadline). A deadline on `ContinuousClock` is converted to the
///   monotonic clock when the job is enqueued, so a suspension of the
///   machine delays it by the time suspended.
/// - A process-wide hook installed through the runtime's C hook variables
///   (swift-nio's `NIOSingletons.unsafeTryInstallSingletonPosixEventLoopGroupAsConcurrencyGlobalExecutor()`)
///   sees global jobs before the default executor does, so with it in place
///   they keep going to its event loops.
///
/// ## Entry point (unofficial; may change with the toolchain)
/// The install calls the standard library's `_createExecutors(factory:)`
/// (`@_spi(ExperimentalCustomExecutors)`) with a factory whose default
/// executor is Spindle's pool and whose main executor is the current one.
/// In Swift 6.3 on Linux the runtime's global enqueue calls that default
/// executor, and `Task.sleep` hands its timed job to it because it is a
/// `SchedulingExecutor` (`@_spi(ExperimentalScheduling)`). The runtime's
/// older C hook variables (`swift_task_enqueueGlobal_hook` and its delay
/// and deadline siblings, which swift-nio uses) were not chosen: in 6.3
/// `Task.sleep` never calls the delay or deadline hooks (it asks the
/// default executor, Dispatch's, to time the job), so with them the timed
/// jobs would stay on Dispatch; and a C hook needs the runtime's calling
/// convention declared by hand and the job pointer reinterpreted, where
/// the factory passes an ordinary `ExecutorJob` to `enqueue`. The names
/// used are Swift 6.3's (6.2 called the scheduling protocol
/// `SchedulableExecutor`); with an older toolchain the install stops the
/// process with a message.
///
/// Enqueuing stores the job by value in the pool's rings (or the delay
/// thread's heap): no allocation beyond what Swift made for the job.
public enum SpindleConcurrency {
    private static let installLock = GuardLock()
    // Guarded by `installLock`.
    nonisolated(unsafe) private static var installed = false

    /// Makes Spindle's worker pool Swift's global concurrent executor for
    /// the rest of the process (see `SpindleConcurrency` for what moves,
    /// what does not, and when to call it). Never blocks (beyond a short
    /// internal lock). Jobs the calling thread enqueues after the call go
    /// to the pool.
    ///
    /// Stops the process with a message when called a second time, when the
    /// program already replaced the default executor itself (a
    /// `DefaultExecutorFactory` of its own), or with a toolchain older than
    /// Swift 6.3.
    public static func installAsGlobalExecutor(file: StaticString = #fileID, line: UInt = #line) {
        #if compiler(>=6.3)
        installLock.lock()
        defer { installLock.unlock() }
        if installed {
            misuse("SpindleConcurrency.installAsGlobalExecutor(): Spindle's pool is already Swift's global executor; install it once, before creating any task", file: file, line: line)
        }
        let current = Task.defaultExecutor
        if current !== PlatformExecutorFactory.defaultExecutor {
            misuse("SpindleConcurrency.installAsGlobalExecutor(): Swift's default executor is already \(type(of: current)), not the platform's; Spindle does not replace an executor the program chose", file: file, line: line)
        }
        PoolExecutorFactory.keptMainExecutor = MainActor.executor
        _createExecutors(factory: PoolExecutorFactory.self)
        installed = true
        #else
        misuse("SpindleConcurrency.installAsGlobalExecutor(): needs Swift 6.3 or later (the standard library's executor factory)", file: file, line: line)
        #endif
    }

    /// Whether `installAsGlobalExecutor()` has run in this process. Takes a
    /// short internal lock.
    public static var isInstalledAsGlobalExecutor: Bool {
        installLock.lock()
        defer { installLock.unlock() }
        return installed
    }
}

#if compiler(>=6.3)
/// The factory handed to the runtime: Spindle's pool as the default
/// executor, the main executor as it was.
private enum PoolExecutorFactory: ExecutorFactory {
    // Written once, under `SpindleConcurrency.installLock`, before the
    // runtime can read it (inside `_createExecutors`).
    nonisolated(unsafe) static var keptMainExecutor: (any MainExecutor)?

    static var mainExecutor: any MainExecutor { keptMainExecutor! }
    static var defaultExecutor: any TaskExecutor { PoolGlobalExecutor.shared }
}

/// Swift's global executor on Spindle's pool: it keeps no state of its own
/// (the pools, the global queues and the timer heap are Spindle's), so
/// one shared instance serves the whole process.
final class PoolGlobalExecutor: TaskExecutor, SchedulingExecutor, CustomStringConvertible {
    static let shared = PoolGlobalExecutor()

    private init() {}

    var description: String { "Spindle's worker pool (global executor)" }

    /// Queues `job` on the pool of its priority band. Never blocks (beyond
    /// the ring's short lock). The job runs with this executor as its task
    /// executor (`WorkUnit.globalJob` carries it): the runtime treats that
    /// as "no preference" (it compares a task's missing preference with the
    /// default executor), so a hop to nonisolated code runs on without a
    /// detour through the queue.
    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        Self.queue(for: job).submit(.globalJob(job, asUnownedTaskExecutor()))
    }

    /// Holds `job` in the standard pool's timer heap until `instant`, then queues it
    /// as `enqueue(_:)` does. `tolerance` is ignored. Stops the process for
    /// a clock whose instants Spindle cannot place on the monotonic clock.
    func enqueue<C: Clock>(_ job: consuming ExecutorJob, at instant: C.Instant, tolerance: C.Duration?, clock: C) {
        let job = UnownedJob(job)
        let deadline = Self.monotonicDeadline(instant, clock: clock)
        DelayedSubmission.schedule(
            .globalJob(job, asUnownedTaskExecutor()), on: Self.queue(for: job), at: deadline,
            api: "Spindle's global executor (enqueue(_:at:))")
    }

    /// Holds `job` for `delay` on `clock`; see `enqueue(_:at:tolerance:clock:)`.
    func enqueue<C: Clock>(_ job: consuming ExecutorJob, after delay: C.Duration, tolerance: C.Duration?, clock: C) {
        enqueue(job, at: clock.now.advanced(by: delay), tolerance: tolerance, clock: clock)
    }

    /// The global queue of `job`'s priority band (see `SpindleConcurrency`).
    private static func queue(for job: UnownedJob) -> WorkQueue {
        let raw = job.priority.rawValue
        let priority: WorkQueue.Priority =
            if raw >= TaskPriority.high.rawValue { .high }
            else if raw >= TaskPriority.medium.rawValue || raw == 0 { .default }
            else if raw >= TaskPriority.low.rawValue { .low }
            else { .background }
        return WorkQueue.global(priority)
    }

    private static func monotonicDeadline<C: Clock>(_ instant: C.Instant, clock: C) -> MonotonicClock.Instant {
        if let instant = instant as? any MonotonicClockConvertible {
            return instant.monotonicInstant
        }
        if let delay = clock.now.duration(to: instant) as? Duration {
            return MonotonicClock.now.advanced(by: delay)
        }
        misuse("Swift's global executor (Spindle's pool): cannot time a job on \(clock), whose durations are not Swift.Duration")
    }
}
#endif
