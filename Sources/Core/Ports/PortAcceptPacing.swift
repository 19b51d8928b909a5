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

    /// `resume` re-arms the listener's source; it runs on the loop's thread.
    init(resume: @escaping @Sendable () -> Void) {
        // Repeating, so that it stays in the loop between runs; each firing
        // parks it in the far future until the next failure.
        timer = LoopTimer(fireAt: .distantFuture, interval: .seconds(3600)) { timer in
            timer.fireDate = .distantFuture
            resume()
        }
    }

    /// Accepts failed for want of a resource: sets the timer to re-arm
    /// after the back-off, and returns whether this failure is the first of
    /// its run (the one to report).
    func exhausted() -> Bool {
        backoff = backoff == .zero ? .milliseconds(10) : min(backoff * 2, .seconds(1))
        timer.fireDate = MonotonicClock.now.advanced(by: backoff)
        lock.withLock { failures += 1 }
        defer { reported = true }
        return !reported
    }

    /// A connection was accepted: the run of failures, if any, is over.
    func accepted() {
        backoff = .zero
        reported = false
    }

    /// Accepts that failed for want of a resource, since the port was made.
    var failureCount: Int { lock.withLock { failures } }
}
