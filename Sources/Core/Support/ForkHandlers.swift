import CShims
#if canImport(Glibc)
import Glibc
#endif

/// What Spindle does around `fork()`, installed once with `pthread_atfork`
/// the first time a thread record or a run loop is made.
///
/// After `fork()` the child has one thread, a copy of the one that forked,
/// with that thread's thread-specific values: its run loop (whose epoll
/// instance or io_uring ring is shared with the parent, so using it would
/// take the parent's events, change what the parent watches, or, on
/// io_uring, cancel the parent's polls when the child exits) and its thread
/// record (with the parent's thread id). The child handler drops both from
/// the thread's slots without touching them, so the child's first
/// `ThreadLoop.current` makes a new loop and its first `NativeThread.current`
/// a new record; the child's thread is the child's main thread (its id is
/// the child's pid), and the main loop starts afresh. The parent's objects
/// are left alone in the child's memory (never released: their teardown
/// would act on the parent's kernel objects); in the parent nothing changes.
///
/// Queues the parent's other threads were using are repaired lazily, the
/// first time the child takes their lock (`WorkQueue.repairAfterFork`): the
/// child handler advances the fork epoch their state is checked against,
/// and notes what the forking thread itself holds of the queues whose items
/// it runs.
///
/// The child handler takes no lock: a lock of Spindle's that a thread of the
/// parent held at the fork is replaced, not waited for. It allocates only
/// that lock (glibc's malloc is usable in the child of a multithreaded
/// process). Nor may it make type metadata or look up a conformance: those
/// take the Swift runtime's locks, which a parent thread may have held at
/// the fork and nobody releases in the child. So `prepare` makes, in the
/// parent, what the child handler would (the lazy globals, and the generic
/// code of `WorkerPool.childAfterFork` run on nothing). The same limit
/// holds for any Swift code the child runs later, which Spindle cannot
/// lift.
enum ForkHandlers {
    /// Installs the handlers; later calls do nothing.
    static func install() { _ = installed }

    private static let installed: Void = {
        let rc = pthread_atfork({ ForkHandlers.prepare() }, nil, { ForkHandlers.child() })
        if rc != 0 { misuse("pthread_atfork failed: \(errnoDescription(rc))") }
    }()

    private static func prepare() {
        // Made now, in the parent, so that the child never runs an
        // initializer: a lazy global's initializer allocates, takes the
        // once-lock and may instantiate type metadata under the Swift
        // runtime's lock, which another thread of the parent may hold at the
        // fork and which nobody would ever release in the child (a child
        // forked during such a hold hung in `WorkerPool.childAfterForkAll`,
        // found by the 1,000-children event-source stress test).
        _ = NativeThread.main
        _ = WorkerPool.standard
        _ = WorkerPool.low
        _ = WorkerPool.background
        _ = WorkQueue.main
        _ = DelayedWork.shared
        _ = SignalWatch.Registry.observers
        _ = SignalWatch.Registry.pool
        _ = SignalWatch.Registry.reactor
        _ = FileSystemWatch.Registry.pool
        _ = FileSystemWatch.Registry.reactor
        _ = TimerQueue.shared
        _ = TimerWatch.WallClockRegistry.shared
        _ = LockNames.table
        WorkerPool.prepareForFork()
        // The walk the child makes, made here first for the same reason
        // (epoch 0 records nothing).
        QueueFrame.noteHoldingsAfterFork(epoch: 0)
    }

    private static func child() {
        // First: everything below, and every queue from now on, is of the
        // child's epoch (see `WorkQueue.repairAfterFork`).
        let epoch = UInt32(cshims_advance_fork_epoch())
        LockNames.childAfterFork()
        LoopRegistry.childAfterFork()
        NativeThread.childAfterFork()
        WorkerPool.childAfterForkAll()
        WorkQueue.main.childAfterFork()
        QueueFrame.noteHoldingsAfterFork(epoch: epoch)
        DelayedWork.shared.childAfterFork()
        EventReactor.childAfterFork()
    }
}
