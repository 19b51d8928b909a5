/// The watch of a process source: a pidfd (`pidfd_open`), which becomes
/// readable when the process exits, watched where the source's calls run:
/// in the target loop's own backend, or, for a work-queue target, in the
/// pool's poller (the worker that sees the exit runs the call). The exit
/// happens once, so the watch ends when it fires and never re-arms. For a
/// child, the status is read with `waitid(P_PIDFD, WNOWAIT)`, which leaves
/// the child to be reaped by whoever waits for it.
///
/// The pidfd is the watch's own, and it is closed once nothing uses it:
/// `users` counts the watch's own hold (given up by `finish`, after the
/// cancel handler) and each exit report in progress (the loop's thread, or
/// the poller's holder, reads the status while the cancel call may be
/// running on a worker). Whoever drops the count to 0 closes, so a report
/// never reads a descriptor that was closed (or, worse, one whose number
/// was given to another file meanwhile). The kernel watch itself is ended
/// (`stop`) before the watch's hold is given up, so no backend watches a
/// closed pidfd.
final class ProcessWatch: SourceWatch, @unchecked Sendable {
    // @unchecked: `place`, `fired`, `users`, `stopped` and `finished` are
    // guarded by `lock`; the rest is immutable.

    let pid: Int32
    let pidfd: Int32
    private let lock = GuardLock()
    /// Where the kernel watch is, until it fires or stops.
    private var place: Place?
    private enum Place {
        case loop(LoopSource)
        case pool(PoolPoller, PoolPoller.State, token: UInt64)
    }
    /// The exit was reported: nothing is left to watch or move.
    private var fired = false
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
        do throws(EventSourceError) {
            if case .pool(let poller) = placement {
                try startInPool(poller, for: source)
            } else if let (loop, modes) = try placement.loopAndModes() {
                startOnLoop(loop, modes: modes, for: source)
            }
        } catch {
            source.fail(error)
        }
    }

    /// The pidfd is readable: the process exited. Reads its status (for a
    /// child) and reports the exit, once.
    private func exited(for source: EventSource) {
        let first: Bool = lock.withLock {
            defer { fired = true }
            return !fired
        }
        // A cancel may be running its cancel call on a worker meanwhile:
        // the hold keeps the pidfd open until the status is read.
        guard first, retainDescriptor() else { return }
        defer { releaseDescriptor() }
        if let status = EventSourceCalls.exitStatus(pidfd: pidfd) { source.setExitStatus(status) }
        source.or(EventSource.ProcessEvents.exit.rawValue)
    }

    private func startOnLoop(_ loop: ThreadLoop, modes: [LoopMode], for source: EventSource) {
        let made = LoopSource(
            descriptor: pidfd, failed: { _, error in source.fail(.watchFailed(error)) }
        ) { [weak self] made, _ in
            made.invalidate()
            guard let self else { return }
            self.lock.withLock {
                if case .loop(let current) = self.place, current === made { self.place = nil }
            }
            self.exited(for: source)
        }
        let fresh: Bool = lock.withLock {
            guard users > 0, !stopped, !fired, place == nil else { return false }
            place = .loop(made)
            return true
        }
        guard fresh else { return }
        for mode in modes { loop.add(made, forMode: mode) }
    }

    /// Registered under the lock, so that a report that comes at once finds
    /// `place` set and ends the registration.
    private func startInPool(_ poller: PoolPoller, for source: EventSource) throws(EventSourceError) {
        let failure: DescriptorWatchError? = lock.withLock {
            guard users > 0, !stopped, !fired, place == nil else { return nil }
            do throws(DescriptorWatchError) {
                let (state, token) = try poller.register(pidfd, for: .readable) { [weak self] event in
                    guard let self else { return }
                    // One-shot: the registration ends here, so the poller
                    // stops counting it as something to wait for.
                    let ended: Place? = self.lock.withLock {
                        guard case .pool(_, _, let current) = self.place, current == event.token else { return nil }
                        defer { self.place = nil }
                        return self.place
                    }
                    Self.leave(ended)
                    if let failure = event.failure {
                        source.fail(.watchFailed(failure))
                    } else {
                        self.exited(for: source)
                    }
                }
                place = .pool(poller, state, token: token)
                return nil
            } catch {
                return error
            }
        }
        if let failure { throw .watchFailed(failure) }
    }

    /// Ends a kernel watch (`stop`, `move`, or the exit report).
    private static func leave(_ place: Place?) {
        switch place {
        case .loop(let loopSource): loopSource.invalidate()
        case .pool(let poller, let state, let token): poller.deregister(token, in: state)
        case nil: break
        }
    }

    func move(for source: EventSource, to placement: WatchPlacement) {
        let old: Place? = lock.withLock {
            defer { place = nil }
            return place
        }
        guard let old else { return } // already fired (or stopped): nothing to move
        Self.leave(old)
        start(for: source, at: placement)
    }

    var placementName: String? {
        switch lock.withLock({ place }) {
        case .loop: "loop"
        case .pool: "pool"
        case nil: nil
        }
    }

    func stop() {
        let old: Place? = lock.withLock {
            stopped = true
            defer { place = nil }
            return place
        }
        Self.leave(old)
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
