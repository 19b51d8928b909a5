/// The watch of a process source: a pidfd (`pidfd_open`), which becomes
/// readable when the process exits, watched on a loop. The exit happens
/// once, so the watch leaves the loop when it fires and never re-arms. For
/// a child, the status is read with `waitid(P_PIDFD, WNOWAIT)`, which leaves
/// the child to be reaped by whoever waits for it.
///
/// The pidfd is the watch's own, and it is closed once nothing uses it:
/// `users` counts the watch's own hold (given up by `finish`, after the
/// cancel handler) and each exit report in progress (the loop's thread,
/// which for a queue target is the reactor's, reads the status while the
/// cancel call may be running on a worker). Whoever drops the count to 0
/// closes, so a report never reads a descriptor that was closed (or,
/// worse, one whose number was given to another file meanwhile).
final class ProcessWatch: SourceWatch, @unchecked Sendable {
    // @unchecked: `loopSource`, `users`, `stopped` and `finished` are guarded by
    // `lock`; the rest is immutable.

    let pid: Int32
    let pidfd: Int32
    private let lock = GuardLock()
    private var loopSource: LoopSource?
    /// Holders of the pidfd: 1 for the watch itself until `finish`, plus
    /// one per exit report running; 0 once closed.
    private var users = 1
    /// Set by `stop`: a later `start` (a cancel racing the activation)
    /// watches nothing.
    private var stopped = false
    /// Set by `finish`: the watch's own hold is given up.
    private var finished = false

    init(pid: Int32, events: EventSource.ProcessEvents) throws(EventSourceError) {
        let unobservable = events.subtracting(.exit)
        guard unobservable.isEmpty else { throw .processEventsNotObservable(unobservable) }
        require(!events.isEmpty, "EventSource.process: `events` is empty; the source could never fire")
        guard pid > 0 else { throw .noSuchProcess(pid) }
        self.pid = pid
        pidfd = try EventSourceCalls.pidfdOpen(pid)
    }

    deinit {
        // Nothing else can hold it now: a report holds the watch strongly.
        if users > 0 { EventSourceCalls.close(pidfd) }
    }

    /// Takes a hold on the pidfd; false if it is closed (or closing).
    private func retainDescriptor() -> Bool {
        lock.withLock {
            guard users > 0 else { return false }
            users += 1
            return true
        }
    }

    /// Gives a hold up; the last one closes the pidfd.
    private func releaseDescriptor() {
        let last: Bool = lock.withLock {
            users -= 1
            return users == 0
        }
        if last { EventSourceCalls.close(pidfd) }
    }

    func start(for source: EventSource, at placement: WatchPlacement) {
        let loop: ThreadLoop, modes: [LoopMode]
        do throws(EventSourceError) {
            // On a queue target the reactor's loop watches the pidfd.
            if let found = try placement.loopAndModes() {
                (loop, modes) = found
            } else {
                (loop, modes) = (try EventReactor.loop(), [.default])
            }
        } catch {
            source.fail(error)
            return
        }
        let made = LoopSource(
            descriptor: pidfd, failed: { _, error in source.fail(.watchFailed(error)) }
        ) { [weak self] made, _ in
            made.invalidate()
            // A cancel may be running its cancel call on a worker meanwhile:
            // the hold keeps the pidfd open until the status is read.
            guard let self, self.retainDescriptor() else { return }
            defer { self.releaseDescriptor() }
            if let status = EventSourceCalls.exitStatus(pidfd: self.pidfd) { source.setExitStatus(status) }
            source.or(EventSource.ProcessEvents.exit.rawValue)
        }
        let fresh: Bool = lock.withLock {
            guard users > 0, !stopped, loopSource == nil else { return false }
            loopSource = made
            return true
        }
        guard fresh else { return }
        for mode in modes { loop.add(made, forMode: mode) }
    }

    func move(for source: EventSource, to placement: WatchPlacement) {
        let old: LoopSource? = lock.withLock {
            defer { loopSource = nil }
            return loopSource
        }
        guard let old, old.isValid else { return } // already fired: nothing to move
        old.invalidate()
        start(for: source, at: placement)
    }

    func stop() {
        let old: LoopSource? = lock.withLock {
            stopped = true
            defer { loopSource = nil }
            return loopSource
        }
        old?.invalidate()
    }

    /// Gives up the watch's own hold (once): the pidfd closes now, or when
    /// an exit report still reading it ends.
    func finish() {
        let owned: Bool = lock.withLock {
            defer { finished = true }
            return !finished
        }
        if owned { releaseDescriptor() }
    }
}
