/// The thread that watches kernel events for sources whose handlers run on
/// work queues: a `ThreadLoop` on a thread of its own ("spindle.events"),
/// started on first use and running for the rest of the process. An event
/// backend is driven only by its own loop's thread, and pool workers come
/// and go, so the watches live here; a handler call is submitted to the
/// source's queue from this thread. Signals and file-system watches, which
/// are process-wide, are watched here for every source.
///
/// What runs on this thread is short: merging an event into its source and
/// submitting a call. No user code runs here. The notice that the system
/// time was set, which wall-clock timers need, is watched here too.
///
/// It sleeps in epoll rather than io_uring: a handler's worker re-arms its
/// descriptor's one-shot watch with `epoll_ctl` directly, while io_uring
/// would need this thread woken to submit the re-arm (a third wake-up per
/// event: measured 74–83 µs per socketpair echo round trip with epoll's
/// direct re-arm not yet in place, 190–370 µs on io_uring).
enum EventReactor {
    private static let lock = GuardLock()
    nonisolated(unsafe) private static var thread: LoopThread?

    /// The reactor's loop, starting its thread if needed. Stops the process
    /// with a message if the thread cannot start (the process is out of
    /// threads or memory): no source can work without it.
    static var loop: ThreadLoop {
        lock.lock()
        defer { lock.unlock() }
        if let thread { return thread.loop }
        do {
            // epoll, not io_uring: a worker that re-arms a watch after its
            // handler can then tell the kernel itself (`epoll_ctl` from any
            // thread) instead of waking this thread to submit for it.
            let started = try LoopThread.start(NativeThread.Attributes(name: "spindle.events"), backend: .epoll)
            // Workers re-arm its watches while it waits: it stays in
            // epoll_wait, where each re-arm reaches it with no wake-up.
            started.loop.registry.waitsInKernelWhileRegistered = true
            ForkHandlers.install()
            thread = started
            return started.loop
        } catch {
            misuse("EventSource: cannot start the reactor thread \"spindle.events\": \(error)")
        }
    }

    /// In a child after `fork()`: the reactor's thread is the parent's; the
    /// child's next source starts its own. The parent's loop object is left
    /// alone (its teardown would act on the parent's kernel objects).
    static func childAfterFork() {
        lock.reinitializeAfterFork()
        if let thread { _ = Unmanaged.passRetained(thread) }
        thread = nil
        SignalWatch.Registry.shared.childAfterFork()
        FileSystemWatch.Registry.shared.childAfterFork()
        TimerQueue.shared.childAfterFork()
        TimerWatch.WallClockRegistry.shared.childAfterFork()
    }
}
