/// The watch of a process source: a pidfd (`pidfd_open`), which becomes
/// readable when the process exits, watched on a loop. The exit happens
/// once, so the watch leaves the loop when it fires and never re-arms. For
/// a child, the status is read with `waitid(P_PIDFD, WNOWAIT)`, which leaves
/// the child to be reaped by whoever waits for it.
///
/// The pidfd is the watch's own: closed after the cancel handler.
final class ProcessWatch: SourceWatch, @unchecked Sendable {
    // @unchecked: `loopSource` and `closed` are guarded by `lock`; the rest
    // is immutable.

    let pid: Int32
    let pidfd: Int32
    private let lock = GuardLock()
    private var loopSource: LoopSource?
    private var closed = false
    /// Set by `stop`: a later `start` (a cancel racing the activation)
    /// watches nothing.
    private var stopped = false

    init(pid: Int32, events: EventSource.ProcessEvents) throws(EventSourceError) {
        let unobservable = events.subtracting(.exit)
        guard unobservable.isEmpty else { throw .processEventsNotObservable(unobservable) }
        require(!events.isEmpty, "EventSource.process: `events` is empty; the source could never fire")
        guard pid > 0 else { throw .noSuchProcess(pid) }
        self.pid = pid
        pidfd = try EventSourceCalls.pidfdOpen(pid)
    }

    deinit {
        if !closed { EventSourceCalls.close(pidfd) }
    }

    func start(for source: EventSource, on loop: ThreadLoop, modes: [LoopMode]) {
        let made = LoopSource(
            descriptor: pidfd, failed: { _, error in source.fail(.watchFailed(error)) }
        ) { [weak self] made, _ in
            made.invalidate()
            guard let self else { return }
            if let status = EventSourceCalls.exitStatus(pidfd: self.pidfd) { source.setExitStatus(status) }
            source.or(EventSource.ProcessEvents.exit.rawValue)
        }
        let fresh: Bool = lock.withLock {
            guard !closed, !stopped, loopSource == nil else { return false }
            loopSource = made
            return true
        }
        guard fresh else { return }
        for mode in modes { loop.add(made, forMode: mode) }
    }

    func move(for source: EventSource, to loop: ThreadLoop, modes: [LoopMode]) {
        let old: LoopSource? = lock.withLock {
            defer { loopSource = nil }
            return loopSource
        }
        guard let old, old.isValid else { return } // already fired: nothing to move
        old.invalidate()
        start(for: source, on: loop, modes: modes)
    }

    func stop() {
        let old: LoopSource? = lock.withLock {
            stopped = true
            defer { loopSource = nil }
            return loopSource
        }
        old?.invalidate()
    }

    func finish() {
        let close: Bool = lock.withLock {
            defer { closed = true }
            return !closed
        }
        if close { EventSourceCalls.close(pidfd) }
    }
}
