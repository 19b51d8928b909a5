import CShims

/// The timer of the pool poller's watchdog (see `PoolPoller`): a one-shot
/// monotonic timerfd watched on the reactor thread. Arming it is one
/// `timerfd_settime` from whichever thread left the poller unheld, with no
/// wake-up of the reactor; when it expires, the reactor asks the poller
/// whether to look again.
final class PollerWatchdog: PoolPoller.Watchdog, @unchecked Sendable {
    // @unchecked: `timer` is guarded by `lock`.

    /// Made with the first queue source, and installed in the standard
    /// pool's poller.
    static let shared: PollerWatchdog = {
        let made = PollerWatchdog()
        WorkerPool.standard.poller?.install(made)
        return made
    }()

    private let lock = GuardLock()
    private var timer = ProcessWideDescriptor()

    /// Has the reactor call `PoolPoller.watchdogFired` once, after
    /// `interval`; false if it cannot. Any thread. If the kernel refuses the
    /// timerfd (out of descriptors), the watchdog stays off for now: queue
    /// sources are still polled by the workers, only not while every one of
    /// them computes.
    func arm(after interval: Duration) -> Bool {
        // The reactor first: starting it takes the reactor's lock, which is
        // never taken inside this one.
        guard let reactor = try? EventReactor.loop() else { return false }
        let fd: Int32? = lock.withLock {
            try? timer.watch(at: .loop(reactor), Self.makeTimer) { [unowned self] in self.expired() }
        }
        guard let fd else { return false }
        return cshims_monotonic_timer_arm(fd, interval.nanosecondsSaturating) == 0
    }

    private static func makeTimer() throws(EventSourceError) -> Int32 {
        let fd = cshims_monotonic_timer_create()
        if fd < 0 { throw .systemCall(SystemCallError(call: "timerfd_create(CLOCK_MONOTONIC)", code: -fd)) }
        return fd
    }

    /// On the reactor, when the timerfd is readable.
    private func expired() {
        let fd = lock.withLock { timer.fd }
        _ = cshims_eventfd_drain(fd)
        guard let poller = WorkerPool.standard.poller, poller.watchdogFired() else { return }
        if cshims_monotonic_timer_arm(fd, PoolPoller.watchdogInterval.nanosecondsSaturating) != 0 {
            poller.watchdogDisarmed()
        }
    }

    /// In a child after `fork()`: the timerfd is the parent's too; the
    /// child's first arming makes its own.
    func childAfterFork() {
        lock.reinitializeAfterFork()
        timer.childAfterFork()
    }
}
