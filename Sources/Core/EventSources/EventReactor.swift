#if canImport(Glibc)
import Glibc
#endif

/// The event driver's fallback thread ("spindle.events"): a `ThreadLoop`
/// on a thread of its own, started on first use and running for the rest
/// of the process. It waits for what neither a loop nor the pool's poller
/// does: the signal and file-system sources of loops beyond those that
/// wait for them themselves (`SignalWatch.Registry`,
/// `FileSystemWatch.LoopRegistries`), and the clock-set notice of
/// wall-clock timers. Sources on work queues are not here: an idle pool worker waits
/// for them in the poller and runs their calls itself, and while every
/// worker computes the pool's monitor polls it (`PoolPoller`); a program
/// that uses only queues and queue sources (and no wall-clock timer) never
/// starts this thread. See "The event driver" in the
/// documentation for where each kind of watch lives.
///
/// What runs on this thread is short: merging an event into its source and
/// submitting a call. No user code runs here.
///
/// It sleeps in epoll rather than io_uring, as the pool's poller does: a
/// watch re-armed by another thread reaches an `epoll_wait` with no wake-up,
/// where io_uring would need its owner woken to submit the re-arm.
enum EventReactor {
    private static let lock = GuardLock()
    nonisolated(unsafe) private static var thread: LoopThread?

    /// The reactor's loop, starting its thread if needed. Throws
    /// `.systemCall` when the thread or its epoll instance cannot be made
    /// (the process is out of threads, memory or descriptors); the source
    /// that asked then fails with that error, and a later source tries
    /// again.
    static func loop() throws(EventSourceError) -> ThreadLoop {
        lock.lock()
        defer { lock.unlock() }
        if let thread { return thread.loop }
        let started: LoopThread
        do throws(NativeThreadError) {
            // epoll, not io_uring: a worker that re-arms a watch after its
            // handler can then tell the kernel itself (`epoll_ctl` from any
            // thread) instead of waking this thread to submit for it.
            started = try LoopThread.start(NativeThread.Attributes(name: "spindle.events"), backend: .epoll)
        } catch {
            if case .systemCall(let refusal) = error { throw .systemCall(refusal) }
            throw .systemCall(SystemCallError(call: "starting the reactor thread \"spindle.events\" (\(error))", code: EAGAIN))
        }
        // Workers re-arm its watches while it waits: it stays in
        // epoll_wait, where each re-arm reaches it with no wake-up.
        started.loop.registry.waitsInKernelWhileRegistered = true
        thread = started
        return started.loop
    }

    /// The reactor's loop if its thread has started (nothing is started).
    static func existingLoop() -> ThreadLoop? {
        lock.withLock { thread?.loop }
    }

    /// The event sources' fork handlers (`ForkHandlers`), registered with
    /// the first event source. In the parent: `prepareForFork`. In the
    /// child: `childAfterFork`.
    static let forkHandlersRegistered: Void = {
        ForkHandlers.register(
            .eventSources,
            prepare: { EventReactor.prepareForFork() },
            child: { _ in EventReactor.childAfterFork() })
    }()

    /// In the parent, before `fork()`: makes every registry the child
    /// handler resets, and the type metadata and conformances of the event
    /// sources' code (this file's, the watches', `ProcessWideDescriptor`'s),
    /// which the child handler and the child's first sources run: a build
    /// without specialization makes them on first use, under Swift runtime
    /// locks that another parent thread may hold at the fork
    /// (`ForkHandlers.makeMetadata`; `scripts/check-fork-metadata` checks
    /// that none is missing).
    static func prepareForFork() {
        _ = SignalWatch.Registry.observers
        _ = SignalWatch.Registry.pool
        SignalWatch.Registry.loops.prepareForFork()
        _ = FileSystemWatch.Registry.pool
        _ = FileSystemWatch.Registry.reactor
        FileSystemWatch.Registry.loops.prepareForFork()
        _ = TimerQueue.shared
        _ = TimerWatch.WallClockRegistry.shared
        SignalWatch.prepareForFork()
        FileSystemWatch.prepareForFork()
        TimerWatch.prepareForFork()
        ForkHandlers.makeMetadata(ThreadLoop?.self)
        ForkHandlers.makeConformance(error: EventSourceError.self)
        ForkHandlers.makeConformance(described: NativeThreadError.self)
        ForkHandlers.makeConformance(equatable: DescriptorWatchError.self)
    }

    /// In a child after `fork()`: the reactor's thread is the parent's; the
    /// child's next source starts its own. The parent's loop object is left
    /// alone (its teardown would act on the parent's kernel objects).
    static func childAfterFork() {
        lock.reinitializeAfterFork()
        if let thread { _ = Unmanaged.passRetained(thread) }
        thread = nil
        SignalWatch.Registry.pool.childAfterFork()
        SignalWatch.Registry.loops.childAfterFork()
        SignalWatch.Registry.observers.childAfterFork()
        FileSystemWatch.Registry.pool.childAfterFork()
        FileSystemWatch.Registry.reactor.childAfterFork()
        FileSystemWatch.Registry.loops.childAfterFork()
        // The timer heap: the queues' stage (`WorkerPool`), since
        // `async(after:)` uses it without any event source.
        TimerWatch.WallClockRegistry.shared.childAfterFork()
    }
}
