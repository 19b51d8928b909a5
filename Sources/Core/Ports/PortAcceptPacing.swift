/// What a listening port (`NamedPort`, `NetworkPort`) does when `accept`
/// fails for want of descriptors or memory (EMFILE, ENFILE, ENOBUFS,
/// ENOMEM): the connection stays in the kernel's backlog and the listener
/// stays readable, so watching it would call the handler again at once,
/// for ever (one CPU at 100%). Instead the port's listener source re-arms
/// by hand (`ThreadLoop.rearm`), and after such a failure it is left
/// unarmed and `timer` re-arms it after a back-off: 10 ms, doubling to at
/// most one second while the failures go on. The first failure of a run is
/// reported (the port tells its drop handlers), the rest are only counted;
/// an accepted connection ends the run.
final class PortAcceptPacing: @unchecked Sendable {
    // @unchecked: `backoff`, `reported` and `failures` are touched only on
    // the receiving loop's thread (the accept handler and `timer`'s), except
    // `failures`, read under `lock` by `failureCount`.

    /// Re-arms the listener; in the port's modes, due only after a failure.
    let timer: LoopTimer
    private var backoff: Duration = .zero
    private var reported = false
    private let lock = Lock()
    private var failures = 0

    /// Re-arms the listener's source (the port's loop, if it has one).
    private let rearm: @Sendable () -> Void

    /// `rearm` re-arms the listener's source; it runs on the loop's thread,
    /// from `acceptAll` and from `timer`.
    init(rearm: @escaping @Sendable () -> Void) {
        self.rearm = rearm
        // Repeating, so that it stays in the loop between runs; each firing
        // parks it in the far future until the next failure.
        timer = LoopTimer(fireAt: .distantFuture, interval: .seconds(3600)) { timer in
            timer.fireDate = .distantFuture
            rearm()
        }
    }

    /// The listener's handler (the loop's thread): accepts every connection
    /// waiting on `listener` and hands each to `take`, which returns false
    /// once the port is invalid (then nothing is re-armed). Once `accept`
    /// finds none, re-arms the listener. If it fails for want of
    /// descriptors or memory, leaves the listener unarmed until `timer`
    /// and, for the first failure of a run, tells `report` (the port's
    /// drop handlers) which call failed and why.
    func acceptAll(on listener: Int32, take: (Int32) -> Bool, report: (PortError) -> Void) {
        while true {
            switch PortSocketCalls.accept(listener) {
            case .connection(let fd):
                accepted()
                guard take(fd) else { return }
            case .none:
                rearm()
                return
            case .exhausted(let code):
                if exhausted() { report(.system(SystemCallError(call: "accept", code: code))) }
                return
            }
        }
    }

    /// Accepts failed for want of a resource: sets the timer to re-arm
    /// after the back-off, and returns whether this failure is the first of
    /// its run (the one to report).
    private func exhausted() -> Bool {
        backoff = backoff == .zero ? .milliseconds(10) : min(backoff * 2, .seconds(1))
        timer.fireDate = MonotonicClock.now.advanced(by: backoff)
        lock.withLock { failures += 1 }
        defer { reported = true }
        return !reported
    }

    /// A connection was accepted: the run of failures, if any, is over.
    private func accepted() {
        backoff = .zero
        reported = false
    }

    /// Accepts that failed for want of a resource, since the port was made.
    var failureCount: Int { lock.withLock { failures } }
}
