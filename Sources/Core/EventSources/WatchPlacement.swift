/// Where the kernel watch of an event source lives, and so which thread
/// waits for it. `EventSource` decides it from the source's target and kind
/// (`EventSource.placement(for:)`); each `SourceWatch` reads it in
/// `start` and `move`. Reading it starts nothing: only a watch that is
/// placed on the reactor asks for the reactor's loop (`EventReactor.loop()`),
/// and that may throw.
///
/// | placement | who waits | for |
/// |---|---|---|
/// | `loop` | the loop's own thread, in its backend, during passes in `modes` | every kind on a loop (see below) |
/// | `pool` | an idle worker of the standard pool, in its poller | every kind on a work queue |
/// | `reactor` | the reactor thread ("spindle.events") | every kind on a work queue if the standard pool has no poller |
///
/// Signal and file-system sources on a loop wait for a descriptor the
/// loop's sources of that kind share (an eventfd the signal observer
/// writes, an inotify instance). Their registries give each loop its own,
/// up to a bound (`SignalWatch.Registry`, `FileSystemWatch.LoopRegistries`);
/// the sources of loops beyond it wait on the reactor, which hands each
/// call to the source's loop.
enum WatchPlacement: Sendable {
    /// A loop's own backend, in these modes.
    case loop(ThreadLoop, modes: [LoopMode])
    /// The pool's poller.
    case pool(PoolPoller)
    /// The reactor thread's loop (in its default mode).
    case reactor

    /// Whether `self` and `other` name the same place (a move between them
    /// changes nothing).
    func isSame(as other: WatchPlacement) -> Bool {
        switch (self, other) {
        case (.loop(let a, let am), .loop(let b, let bm)): a === b && am == bm
        case (.pool(let a), .pool(let b)): a === b
        case (.reactor, .reactor): true
        default: false
        }
    }

    /// The loop and modes a loop-based watch uses here: the loop's own, or
    /// the reactor's (started on first use, which may throw); nil for the
    /// pool.
    func loopAndModes() throws(EventSourceError) -> (ThreadLoop, [LoopMode])? {
        switch self {
        case .loop(let loop, let modes): (loop, modes)
        case .pool: nil
        case .reactor: (try EventReactor.loop(), [.default])
        }
    }
}
