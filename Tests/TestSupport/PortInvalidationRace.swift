import Spindle

#if canImport(Glibc)
import Glibc
#endif

/// Three threads open a `RemotePort` to a listening port (`connect`) and
/// make a request on it, over and over; once a few were answered (or after
/// 10 s without, which is reported), at a random moment within 2 ms,
/// `invalidate` invalidates the port from this thread. Returns what went
/// wrong: a wrong reply, any error while the port was still valid
/// (`isValid`), or, once it is not, an error `expectedOnceInvalid` does not
/// accept. Each sender stops at its first error after the invalidation.
public func requestsRacingInvalidation(
    connect: @escaping @Sendable () throws(PortError) -> RemotePort,
    isValid: @escaping @Sendable () -> Bool,
    expectedOnceInvalid: @escaping @Sendable (PortError) -> Bool = { _ in true },
    invalidate: () -> Void
) throws -> [String] {
    let stop = LockedValue(false)
    let unexpected = LockedValue<[String]>([])
    let answered = LockedValue(0)
    let senders = try (0..<3).map { _ in
        try NativeThread.start {
            while !stop.withLock({ $0 }) {
                do throws(PortError) {
                    let remote = try connect()
                    let reply = try remote.sendRequest(PortEnvelope(id: 7), timeout: .seconds(5), replyTimeout: .seconds(5))
                    remote.invalidate()
                    if reply.id == 7 { answered.withLock { $0 += 1 } } else { unexpected.withLock { $0.append("reply \(reply.id)") } }
                } catch {
                    // An invalidation sets the port invalid before it closes
                    // anything: an error it caused finds it invalid.
                    let valid = isValid()
                    if valid || !expectedOnceInvalid(error) {
                        unexpected.withLock { $0.append("\(error) (port valid: \(valid))") }
                    }
                    if !valid { return }
                }
            }
        }
    }
    let patience = MonotonicClock.now.advanced(by: .seconds(10))
    while answered.withLock({ $0 }) < 3 {
        if MonotonicClock.now >= patience {
            unexpected.withLock { $0.append("fewer than 3 requests answered in 10 s") }
            break
        }
        usleep(100)
    }
    usleep(UInt32.random(in: 0...2000))
    invalidate()
    stop.withLock { $0 = true }
    for sender in senders { try sender.join() }
    return unexpected.withLock { $0 }
}
